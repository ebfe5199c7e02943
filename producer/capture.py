"""The capture loop: discover → probe → drain, shared by `trace` and `producer`.

Library files are attached once each. Processes are rescanned when the loader
probe says their link map changed (start-up, dlopen, exec), when they are new,
and, for processes whose loader we could not probe, on every rescan tick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from producer import discover
from producer.decode import Enricher
from producer.environment import ensure_tracefs
from producer.probes import DropCounts, Probes
from producer.settings import CaptureSettings
from producer.sinks import EventSink, Guarded

log = logging.getLogger(__name__)

#: Events handed to the sinks per batch: big enough to amortise the per-batch
#: cost, small enough to keep memory flat.
BATCH_EVENTS = 65536


@dataclass
class CaptureStats:
    events: int = 0
    batches: int = 0
    rescans: int = 0
    held_released: int = 0


class Capture:
    def __init__(
        self,
        settings: CaptureSettings,
        sinks: Sequence[EventSink],
        enricher: Enricher | None = None,
    ) -> None:
        if (settings.follow_forks or settings.watch_exec) and not ensure_tracefs():
            settings = replace(settings, follow_forks=False, watch_exec=False)
        self.settings = settings
        #: Each sink guarded: one that fails is switched off, and the others go on.
        self.sinks = [Guarded(s, getattr(s, "name", type(s).__name__)) for s in sinks]
        #: Called with each pid seen mapping a probed runtime, while it is alive
        #: (identity is read then: a short-lived process may be gone at publish time).
        self.process_observers: list[Callable[[int], None]] = []
        self._observed: set[int] = set()
        self.enricher = enricher or Enricher()
        self._classifier = discover.Classifier()
        self._scanned: set[int] = set()
        #: pid → the text ranges of probed CUDA files registered for it (probes.set_text_ranges).
        self._text: dict[int, frozenset[tuple[int, int]]] = {}
        self._loader_covered: set[int] = set()
        self._next_rescan = 0.0
        self.stats = CaptureStats()
        self.probes = Probes(settings)
        self._check_permitted()
        if settings.pids is not None:
            self.probes.add_to_scope(settings.pids)

    def _check_permitted(self) -> None:
        """Attach our own dynamic loader first. It is probed anyway (a traced command is a
        copy of us until it execs; node-wide we are one of the processes), and a kernel that
        refuses uprobes to us says so here, in one line, rather than file after file."""
        own = discover.scan_pid(Path("/proc"), os.getpid(), cache=self._classifier)
        for library in own.libraries.values():
            if library.kind == "loader":
                self.probes.check_permitted(library)
                return
        log.debug("no dynamic loader of our own to try a probe on")

    # -- discovery ---------------------------------------------------------

    def _candidate_pids(self) -> set[int] | None:
        """Processes this capture cares about (None: all of them)."""
        if not self.settings.filter_pids:
            return None
        return self.probes.scope()

    def _live_pids(self) -> set[int]:
        root = self.settings.proc_root
        with contextlib.suppress(OSError):
            return {int(n) for n in os.listdir(root) if n.isdigit()}
        return set()

    def scan(self, pids: Iterable[int]) -> None:
        pids = set(pids)
        if not pids:
            return
        snapshot = discover.scan(self.settings.proc_root, pids=pids, cache=self._classifier)
        self.stats.rescans += 1
        for library in snapshot.libraries.values():
            self.probes.attach(library)
        attached = self.probes.attached
        for pid, keys in snapshot.libraries_by_pid.items():
            self._scanned.add(pid)
            kinds = {attached[k].library.kind for k in keys if k in attached}
            self._register_text(pid, keys, snapshot)
            # A process whose loader is not probed (kernel threads, static programs)
            # is looked at again on every rescan tick instead.
            if "loader" in kinds:
                self._loader_covered.add(pid)
            if "runtime" in kinds and pid not in self._observed:
                self._observed.add(pid)
                for observer in self.process_observers:
                    observer(pid)

    def _register_text(
        self, pid: int, keys: Iterable[discover.LibraryKey], snapshot: discover.Snapshot
    ) -> None:
        """Tell the driver probes where `pid`'s probed runtime and driver code lies."""
        attached = self.probes.attached
        ranges = frozenset(
            snapshot.text_ranges[(pid, key)]
            for key in keys
            if key in attached
            and attached[key].library.kind in ("runtime", "driver")
            and (pid, key) in snapshot.text_ranges
        )
        if ranges and self._text.get(pid) != ranges:
            # Launch handles are named from these later, maybe after the process exits. Read
            # when the process maps a CUDA file, not on every dlopen after (a PyTorch start-up
            # makes hundreds, and the names it will need are recorded by then).
            self.enricher.kernels.remember_maps(pid)
            self.probes.set_text_ranges(pid, ranges)
            self._text[pid] = ranges

    def rescan(self) -> None:
        live = self._live_pids()
        wanted = self._candidate_pids()
        if wanted is not None:
            live &= wanted
        self._scanned &= live
        for gone in set(self._text) - live:
            self.probes.forget_pid(gone)
            del self._text[gone]
        self._loader_covered &= live
        self._observed &= live
        todo = (live - self._scanned) | (live - self._loader_covered)
        self.scan(todo)

    # -- the loop ----------------------------------------------------------

    def start(self, initial_scan: bool = True) -> None:
        if initial_scan:
            self.rescan()
        self._next_rescan = time.monotonic() + self.settings.rescan_interval_s

    def step(self, timeout_s: float | None = None) -> None:
        """Handle loader notifications, rescan when due, drain the ring."""
        timeout = self.settings.poll_interval_s if timeout_s is None else timeout_s
        notes = self.probes.poll_loader(timeout)
        if notes:
            self.scan({n.pid for n in notes})
            for note in notes:
                if note.held:
                    self._release(note.pid)
        now = time.monotonic()
        if now >= self._next_rescan:
            self.rescan()
            self._next_rescan = now + self.settings.rescan_interval_s
        self.drain()
        for sink in self.sinks:
            sink.tick()

    def _release(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            self.stats.held_released += 1

    def drain(self, until_empty: bool = False) -> int:
        """Take what the ring holds now. A batch short of BATCH_EVENTS means the reader
        has caught up: it stops there rather than chasing the producing threads event by
        event (tiny batches at full per-batch cost), and sleeps until the next poll.
        `until_empty` (at shutdown) drains until a read finds nothing."""
        total = 0
        while True:
            events = self.probes.ring.drain(BATCH_EVENTS)
            # After the events: each launch drained was committed after its name.
            self.enricher.kernels.add(self.probes.drain_names())
            if len(events) == 0:
                break
            self.enricher.enrich(events)
            for sink in self.sinks:
                sink.write(events)
            total += len(events)
            self.stats.batches += 1
            if len(events) < BATCH_EVENTS and not until_empty:
                break
        self.stats.events += total
        return total

    def drops(self) -> DropCounts:
        return self.probes.drops()

    def failed_sinks(self) -> list[Guarded]:
        """The outputs that failed (and were switched off), with why and what they lost."""
        return [s for s in self.sinks if s.failure is not None]

    def close(self) -> DropCounts:
        """Final drain; returns the drop counts; closes sinks and probes."""
        # A loader notification may still hold a process: release it first.
        for note in self.probes.poll_loader(0):
            if note.held:
                self._release(note.pid)
        self.drain(until_empty=True)
        drops = self.probes.drops()
        for sink in self.sinks:
            sink.close()
        try:
            self.probes.close()
        except Exception as exc:  # the kernel releases them when this process exits
            log.warning("detaching the probes failed (%s): they go when gpuflight exits", exc)
            log.debug("the detach failure", exc_info=exc)
        return drops
