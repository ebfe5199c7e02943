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
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract import records
from gpuflight.producer.contract.abi import EVENT_DTYPE
from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.decode.codepaths import top_functions
from gpuflight.producer.decode.enrich import Enricher
from gpuflight.producer.decode.sinks import EventSink, Guarded
from gpuflight.producer.discover import procmaps
from gpuflight.producer.http import abi as hr
from gpuflight.producer.http.probes import HttpProbes
from gpuflight.producer.nvml import UtilizationFeed, UtilReport
from gpuflight.producer.probe.holdguard import hold_key
from gpuflight.producer.probe.preflight import ensure_tracefs
from gpuflight.producer.probe.probes import DropCounts, LoaderEvent, Probes
from gpuflight.producer.settings import CaptureSettings

if TYPE_CHECKING:
    from gpuflight.producer.decode.pycapture import PythonStacks
    from gpuflight.producer.http.requesttrack import RequestTracker

log = logging.getLogger(__name__)

#: With the HTTP capture, events of the last this-many ns wait a turn: an HTTP record committed
#: before a drain can still be behind one that another CPU (a descheduled vCPU) has reserved and
#: not yet committed, and the ring's reader stops there.
HTTP_SETTLE_NS = 100_000_000

#: Events handed to the sinks per batch: big enough to amortise the per-batch
#: cost, small enough to keep memory flat.
BATCH_EVENTS = 65536


#: How often a long capture (the node agent) writes what it learned of new library files.
VERDICTS_SAVE_INTERVAL_S = 60.0

#: Node-wide: what is kept of a process (its allocations' sizes, graphs, kernel names and maps,
#: its identity in the Kafka sink) is dropped this long after a rescan found it gone: its last
#: events have been drained, enriched, named and handed to the sinks by then (each step drains
#: the ring; the Kafka sink sends a process's pending events before it forgets it).
FORGET_EXITED_AFTER_S = 5.0


@dataclass
class CaptureStats:
    events: int = 0
    batches: int = 0
    rescans: int = 0
    held_released: int = 0
    #: How long the holds lasted (from the probe's stop to our SIGCONT), in all and the longest.
    held_ns_total: int = 0
    held_ns_max: int = 0
    #: Holds at a walked process's exit (code paths: its new stacks read), not counted above.
    held_at_exit: int = 0
    held_at_exit_ns: int = 0
    #: HTTP requests answered (with the HTTP capture on).
    requests: int = 0
    #: Events the kernel counted under overload instead of recording them (in aggregates
    #: handed to the sinks: in every count all the same).
    aggregated: int = 0


class Capture:
    def __init__(
        self,
        settings: CaptureSettings,
        sinks: Sequence[EventSink],
        enricher: Enricher | None = None,
    ) -> None:
        if (settings.follow_forks or settings.watch_exec or settings.http_on_listen) and \
                not ensure_tracefs():
            settings = replace(settings, follow_forks=False, watch_exec=False,
                               http_at_listen=False)
        self.settings = settings
        #: Each sink guarded: one that fails is switched off, and the others go on.
        self.sinks = [Guarded(s, getattr(s, "name", type(s).__name__)) for s in sinks]
        #: Called with each pid seen mapping a probed runtime, while it is alive
        #: (identity is read then: a short-lived process may be gone at publish time).
        self.process_observers: list[Callable[[int], None]] = []
        self._observed: set[int] = set()
        #: Called with the pids of processes gone (node-wide), FORGET_EXITED_AFTER_S after a
        #: rescan found them gone: sinks drop what they keep of them.
        self.exit_observers: list[Callable[[set[int]], None]] = []
        #: Node-wide: processes something is kept of (scanned, or seen in events or name
        #: records), and those gone, with when a rescan found them gone.
        self._known: set[int] = set()
        self._gone_since: dict[int, float] = {}
        self.enricher = enricher or Enricher()
        #: What each library file defines, kept across runs (settings.verdict_cache_dir).
        self.verdicts = procmaps.open_verdict_store(settings.verdict_cache_dir)
        # Code paths: PyTorch's autograd engine is probed; with holds (trace), where a
        # process exits too.
        hooks = frozenset() if settings.stack_period is None else frozenset(
            ("autograd", "exit") if settings.hold_on_load and settings.filter_pids
            else ("autograd",))
        self._classifier = procmaps.Classifier(store=self.verdicts, hooks=hooks)
        self._scanned: set[int] = set()
        #: pid → the text ranges of probed CUDA files registered for it (probes.set_text_ranges).
        self._text: dict[int, frozenset[tuple[int, int]]] = {}
        #: Processes whose maps and `__handle` statics kernel naming is to read once no
        #: process is held (_remember_maps).
        self._maps_due: set[int] = set()
        self._loader_covered: set[int] = set()
        #: Loader notifications the kernel counted lost, as the last rescan read them.
        self._loader_lost = 0
        #: Node-wide: the probed (or skipped) files each live process maps, and since when a
        #: file has been mapped by none (settings.detach_unmapped_after_s).
        self._keys_by_pid: dict[int, frozenset[procmaps.LibraryKey]] = {}
        self._unmapped_since: dict[procmaps.LibraryKey, float] = {}
        self._next_rescan = 0.0
        #: Enriched events made after the last HTTP drain, waiting for the next (requests).
        self._held: npt.NDArray[np.void] = np.zeros(0, dtype=EVENT_DTYPE)
        self._finished = False
        self.stats = CaptureStats()
        self.probes = Probes(settings)
        self.probes.set_wall_offset(self.enricher.clock_offset_ns)
        if self.probes.quiet_loads:  # before any process in scope can dlopen
            self.probes.add_quiet(self.verdicts.quiet_files())
        self._check_permitted()
        if settings.pids is not None:
            self.probes.add_to_scope(settings.pids)
        #: Code paths: the Python stacks of sampled calls (settings.stack_period).
        self.stacks: PythonStacks | None = None
        self._paths_by_route = False
        if settings.stack_period is not None:
            from gpuflight.producer.decode.pycapture import PythonStacks

            self.stacks = PythonStacks(self.probes, settings.proc_root, settings.stack_depth,
                                       self.enricher.clock_offset_ns, self.enricher.kernels)
            # Published paths are per (stack, route): each batch's routes are read.
            self._paths_by_route = any(sink.takes_paths() for sink in self.sinks)
            if self._paths_by_route:
                self.stacks.samples.publish()
        #: The HTTP capture and the attribution of events to requests (settings.http).
        self.http_probes: HttpProbes | None = None
        self.requests: RequestTracker | None = None
        #: The processes to watch for HTTP once the capture is up (settings.http_on_listen).
        self._http_wanted: set[int] = set()
        self._http_tried = False
        #: NVML's per-process utilisation for request cost and top (trace and the producer
        #: set it wherever NVML runs): read on the sampler's own thread, taken here each turn
        #: (its windows would pile up in the sampler otherwise); read once more at the end.
        self.utilization: UtilizationFeed | None = None
        #: Called with each take of NVML's per-process windows (with `utilization`).
        self.utilization_observers: list[Callable[[UtilReport], None]] = []
        if settings.http:
            # From the start, so that what is made before a lazy HTTP capture is up (no request
            # can be in flight then) is counted as work outside requests.
            from gpuflight.producer.http.requesttrack import (
                RequestTracker,  # --http only: ~8 ms to import
            )

            self.requests = RequestTracker(self.enricher.clock_offset_ns,
                                           host_salt=socket.gethostname().encode())
            if self.stacks is not None:  # each request names its costliest code paths
                self.stacks.samples.per_request = True
            if not settings.http_on_listen:
                self._start_http()

    def _start_http(self) -> None:
        """Compile and attach the HTTP capture (once; a failure is a warning)."""
        if self._http_tried:
            return
        self._http_tried = True
        try:
            self.http_probes = HttpProbes(self.settings)
        except SetupError as exc:
            log.warning("HTTP requests are not captured: %s", exc)
            self.requests = None
            return
        self.http_probes.watch(self._http_wanted)
        self._http_wanted.clear()

    def _check_permitted(self) -> None:
        """Attach our own dynamic loader first. It is probed anyway (a traced command is a
        copy of us until it execs; node-wide we are one of the processes), and a kernel that
        refuses uprobes to us says so here, in one line, rather than file after file."""
        loader = procmaps.loader_of(Path("/proc"), os.getpid(), cache=self._classifier)
        if loader is not None:
            self.probes.check_permitted(loader)
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
        self._scan(pids)
        self._remember_maps()

    def _scan(self, pids: Iterable[int]) -> None:
        """scan, but what kernel naming reads of the processes is left due (_remember_maps):
        while a process is held, only what its probes need is done."""
        pids = set(pids)
        if not pids:
            return
        snapshot = procmaps.scan(self.settings.proc_root, pids=pids, cache=self._classifier)
        self.stats.rescans += 1
        quiet = self._classifier.take_quiet()
        if quiet and self.probes.quiet_loads:
            self.probes.add_quiet(quiet)
        for library in snapshot.libraries.values():
            self.probes.attach(library)
        attached = self.probes.attached
        for pid, keys in snapshot.libraries_by_pid.items():
            if self.stacks is not None:
                # On every scan until its CPython is found: a shared libpython is mapped by
                # the loader after the exec that a traced command is first scanned at.
                self.stacks.observe(pid)
            self._scanned.add(pid)
            self._known.add(pid)
            self._keys_by_pid[pid] = keys
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
            # Requests: trace's (or --pid's) processes all; node-wide, those that map a
            # CUDA runtime.
            if self.settings.filter_pids or "runtime" in kinds or "driver" in kinds:
                self.watch_http([pid])

    def watch_http(self, pids: Iterable[int]) -> None:
        """Capture the HTTP requests these processes serve (when the HTTP capture is on, or
        from when it is set up)."""
        if self.http_probes is not None:
            self.http_probes.watch(pids)
        elif self.settings.http and not self._http_tried:
            self._http_wanted.update(pids)

    def _register_text(
        self, pid: int, keys: Iterable[procmaps.LibraryKey], snapshot: procmaps.Snapshot
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
            # makes hundreds, and the names it will need are recorded by then). Its maps and
            # the files it maps are kept now, while it may be held: let go, a short process
            # can exit before _remember_maps reads it (the `__handle` statics wait for that).
            self.enricher.kernels.keep_maps(pid)
            self._maps_due.add(pid)
            self.probes.set_text_ranges(pid, ranges)
            self._text[pid] = ranges

    def _remember_maps(self) -> None:
        """Read the due processes' maps and `__handle` statics for kernel naming."""
        due, self._maps_due = self._maps_due, set()
        for pid in sorted(due):
            self.enricher.kernels.remember_maps(pid)

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
        self._http_wanted &= live
        for gone in self._keys_by_pid.keys() - live:
            del self._keys_by_pid[gone]
        if self.http_probes is not None and self.requests is not None:
            for gone in self.http_probes.watched - live:
                self.http_probes.unwatch(gone)
                self.requests.forget_pid(gone)
        lost = self._loader_notes_lost()
        if lost:
            # A process is rescanned when its loader says it mapped something: a lost
            # notification would leave what it mapped then unprobed until its next dlopen.
            log.warning("%d loader notification(s) lost (their ring was full): every process "
                        "is scanned again", lost)
            self._loader_covered.clear()
        todo = (live - self._scanned) | (live - self._loader_covered)
        self.scan(todo)
        self._forget_exited(live)
        self._detach_unmapped()
        self.verdicts.save_if_dirty(min_interval_s=VERDICTS_SAVE_INTERVAL_S)

    def _loader_notes_lost(self) -> int:
        """Loader notifications lost since the last call (0 where that cannot be read)."""
        try:
            lost = self.probes.loader_drops()
        except (OSError, KeyError) as exc:
            log.debug("the loader's drops cannot be read: %s", exc)
            return 0
        new, self._loader_lost = lost - self._loader_lost, lost
        return max(0, new)

    def _forget_exited(self, live: set[int]) -> None:
        """Node-wide, after a rescan: drop what is kept of the processes gone for
        FORGET_EXITED_AFTER_S (a pid live again by then is kept: another process has it).
        Under trace (a scope) everything is kept to the end, for the summary."""
        if self.settings.filter_pids:
            return
        now = time.monotonic()
        for pid in self._known - live:
            self._gone_since.setdefault(pid, now)
        self._known &= live
        due = {pid for pid, since in self._gone_since.items()
               if now - since >= FORGET_EXITED_AFTER_S}
        if not due:
            return
        for pid in due:
            del self._gone_since[pid]
        due -= live
        if not due:
            return
        self.enricher.forget(due)
        if self.stacks is not None:
            self.stacks.forget(due)
        for observer in self.exit_observers:
            observer(due)
        log.debug("forgot %d exited process(es)", len(due))

    def _detach_unmapped(self) -> None:
        """Node-wide, after a rescan (every live process scanned): detach the files no process
        has mapped for settings.detach_unmapped_after_s. Under trace (a scope) the files go at
        the end, with the command."""
        after = self.settings.detach_unmapped_after_s
        if self.settings.filter_pids or after < 0:
            return
        mapped: set[procmaps.LibraryKey] = set()
        for keys in self._keys_by_pid.values():
            mapped |= keys
        now = time.monotonic()
        known = self.probes.attached.keys() | self.probes.failed.keys()
        for key in self._unmapped_since.keys() - known:
            del self._unmapped_since[key]
        for key in known:
            if key in mapped:
                self._unmapped_since.pop(key, None)
            elif now - self._unmapped_since.setdefault(key, now) >= after:
                del self._unmapped_since[key]
                self.probes.forget_file(key)

    # -- the loop ----------------------------------------------------------

    def start(self, initial_scan: bool = True) -> None:
        if initial_scan:
            self.rescan()
        self._next_rescan = time.monotonic() + self.settings.rescan_interval_s

    def step(self, timeout_s: float | None = None) -> None:
        """Handle loader notifications, rescan when due, drain the ring. SetupError if a
        BPF program loading in the background failed (Probes.check_loaded)."""
        self.probes.check_loaded()
        timeout = self.settings.poll_interval_s if timeout_s is None else timeout_s
        notes = self.probes.poll_loader(timeout)
        if notes:
            if any(n.listen for n in notes):
                self._start_http()  # before the process can accept anything
            self._scan({n.pid for n in notes if not n.exiting})
            if self.stacks is not None and any(n.exiting for n in notes):
                # Held at its exit: the code objects of every stack sent so far are read
                # before it goes on to free them.
                self.stacks.settle()
            for note in notes:
                if note.held:
                    self._release(note)
            # Once they run again: the first read of libtorch_cuda.so's 24,000 `__handle`
            # statics (~0.1 s of CPU, more under load) held the dlopen of libcuda.so.1 that
            # a CUDA runtime makes at its first call for 0.5 s. The process runs its
            # constructors and first calls meanwhile; the probes, attached, record its own
            # registrations, and its launches are named after this read in any case.
            self._remember_maps()
        now = time.monotonic()
        if now >= self._next_rescan:
            self.rescan()
            self._next_rescan = now + self.settings.rescan_interval_s
        self.drain()
        for sink in self.sinks:
            sink.tick()

    def _release(self, note: LoaderEvent) -> None:
        """Continue a process the probe held, then forget the hold (the `holds` map: what a
        watchdog continues should we die holding it, producer/probe/holdguard.py)."""
        pid = note.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            held = max(0, time.monotonic_ns() - note.ts_ns) if note.ts_ns else 0
            if note.exiting:  # code paths: its new stacks read
                self.stats.held_at_exit += 1
                self.stats.held_at_exit_ns += held
                log.debug("process %d held at its exit %.1f ms", pid, held / 1e6)
            else:
                self.stats.held_released += 1
                if note.ts_ns:
                    self.stats.held_ns_total += held
                    self.stats.held_ns_max = max(self.stats.held_ns_max, held)
                    log.debug("process %d held %.1f ms", pid, held / 1e6)
        holds = self.probes.holds
        if holds is not None:
            try:
                holds.delete(hold_key(pid, note.reason, note.ts_ns))
            except OSError as exc:  # kept: a watchdog would continue a running process
                log.debug("the hold of process %d is not forgotten: %s", pid, exc)

    def _hold_no_more(self) -> None:
        """Take every process out of scope, so that none is held while the probes go (in the
        background, for a while after we return), then release what was held meanwhile.
        Never raises."""
        try:
            self.probes.clear_scope()
            for note in self.probes.poll_loader(0):
                if note.held:
                    self._release(note)
        except Exception as exc:
            log.debug("taking the processes out of scope failed: %s", exc)

    def drain(self, until_empty: bool = False) -> int:
        """Take what the ring holds now. A batch short of BATCH_EVENTS means the reader
        has caught up: it stops there rather than chasing the producing threads event by
        event (tiny batches at full per-batch cost), and sleeps until the next poll.
        `until_empty` (at shutdown) drains until a read finds nothing."""
        total = 0
        requests = self.requests
        cut = np.iinfo(np.int64).max
        if requests is not None and self.http_probes is not None:
            # Before the CUDA ring: every request read before `cut` is known once this drain
            # is parsed (HTTP_SETTLE_NS); a call made after it may be for a request not read
            # yet, and waits (`_held`) for a later turn's HTTP records.
            cut = time.monotonic_ns() - HTTP_SETTLE_NS + self.enricher.clock_offset_ns
            requests.feed(self.http_probes.drain())
        if self.utilization is not None:  # taken each turn, used or not: never piled up
            self._take_utilization(requests, self.utilization)
        while True:
            drained = self.probes.drain_events(BATCH_EVENTS, everything=until_empty)
            # After the events: each launch drained was committed after its name.
            names = self.probes.drain_names()
            self.enricher.kernels.add(names)
            if not self.settings.filter_pids:
                if len(drained):
                    self._known.update(np.unique(drained["pid"]).tolist())
                if len(names):
                    self._known.update(np.unique(names["pid"]).tolist())
            if len(drained) == 0 and len(self._held) == 0:
                break
            self.enricher.enrich(drained)
            events = self._hold_back(drained, cut) if requests is not None else drained
            if len(events):
                total += self._hand_on(events)
                self.stats.batches += 1
            if len(drained) == 0 or (len(drained) < BATCH_EVENTS and not until_empty):
                break
        self._hand_on_aggregates(until_empty)
        if self.stacks is not None:  # after the events: the walks of the calls just read
            self.stacks.drain()
            self._hand_on_paths(self.stacks)
        self.stats.events += total
        if requests is not None:
            requests.settle()
            self._hand_on_requests(requests, cut)
        return total

    def _hand_on(self, events: npt.NDArray[np.void]) -> int:
        """Enriched events, held back until their requests are known: attributed, to the code
        paths (per route) and the sinks."""
        requests = self.requests
        attribution = requests.attribute(events) if requests is not None else None
        if self.stacks is not None:
            wanted = self._paths_by_route or self.stacks.samples.per_request
            calls = (requests.call_shares(events, attribution)
                     if requests is not None and attribution is not None and wanted else None)
            self.stacks.add_events(events, calls)
        for sink in self.sinks:
            sink.write(events, attribution)
        return len(events)

    def _hand_on_aggregates(self, everything: bool) -> None:
        """What the kernel counted under overload instead of recording (bpf/cudart.bpf.c,
        "overload"), enriched, to the sinks that count or write it. Their events came before
        this drain's: the kernel's generations lag one drain. `everything`: at the end."""
        aggregates = self.probes.drain_aggregates(everything)
        if len(aggregates) == 0:
            return
        self.enricher.enrich_aggregates(aggregates)
        if not self.settings.filter_pids:
            self._known.update(np.unique(aggregates["pid"]).tolist())
        self.stats.aggregated += int(aggregates["count"].sum())
        for sink in self.sinks:
            sink.write_aggregates(aggregates)

    def _take_utilization(self, requests: RequestTracker | None, feed: UtilizationFeed) -> None:
        """NVML's per-process windows since the last take: to the requests' GPU time and to
        whoever else observes them (the node agent's top feed)."""
        try:
            report = feed.take()
        except Exception as exc:  # NVML is an extra: requests go on with queued time
            log.warning("NVML utilisation not read (%s): GPU time is queued time", exc)
            return
        if requests is not None:
            covered = min(report.covered_ns.values()) if report.covered_ns else 0
            requests.feed_utilization(report.windows, covered)
        for observer in self.utilization_observers:
            observer(report)

    def _hold_back(self, events: npt.NDArray[np.void], cut: int) -> npt.NDArray[np.void]:
        """The held events and these, made before `cut`; the rest are held."""
        if len(self._held):
            events = records.join([self._held, events])
        ready, self._held = records.split(events, events["ts_ns"].astype(np.int64) >= cut)
        return ready

    def _hand_on_paths(self, stacks: PythonStacks) -> None:
        for pid, paths in stacks.take_paths().items():
            for sink in self.sinks:
                sink.write_paths(pid, paths)

    def _hand_on_requests(self, requests: RequestTracker, before_ns: int | None = None) -> None:
        samples = self.stacks.samples if self.stacks is not None else None
        for pid, (taken, unattributed) in requests.take_answered(before_ns).items():
            self.stats.requests += len(taken)
            answered = taken
            if samples is not None and samples.per_request:  # with their code paths
                answered = [replace(a, record=replace(a.record, code_paths=top_functions(
                    samples.take_request_paths(a.request.request_id)))) for a in taken]
            for sink in self.sinks:
                sink.write_requests(pid, answered, unattributed)

    def drops(self) -> DropCounts:
        return self.probes.drops()

    def http_drops(self) -> tuple[int, int]:
        """(HTTP records lost in the kernel, connections not followed): 0s without the
        HTTP capture."""
        if self.http_probes is None:
            return 0, 0
        lost = self.http_probes.drops()
        return lost[hr.DROP_RING], lost[hr.DROP_CONNS]

    def _close_http(self, http: HttpProbes) -> None:
        try:
            lost = http.drops()
            if lost[hr.DROP_RING] or lost[hr.DROP_CONNS]:
                log.warning("HTTP capture: %d record(s) lost (ring full), %d connection(s) "
                            "not tracked (table full): their requests are incomplete",
                            lost[hr.DROP_RING], lost[hr.DROP_CONNS])
            http.close()
        except Exception as exc:
            log.warning("closing the HTTP capture failed (%s)", exc)

    def failed_sinks(self) -> list[Guarded]:
        """The outputs that failed (and were switched off), with why and what they lost."""
        return [s for s in self.sinks if s.failure is not None]

    def finish(self) -> None:
        """At shutdown, before the last counts are read: what the ring holds, the events held
        back for their requests, and the requests still open (ended as incomplete: their
        connections outlived the capture). A second call finds nothing more."""
        self.drain(until_empty=True)
        if self.requests is not None:
            self.drain(until_empty=True)  # a last HTTP drain for the events held back
            if len(self._held):
                held, self._held = self._held, self._held[:0]
                self.stats.events += self._hand_on(held)
        if self.stacks is not None:  # every busy span ends: its calls' paths are priced
            self.stacks.finish()
            self._hand_on_paths(self.stacks)
        if self.requests is None:
            return
        if not self._finished:
            self._finished = True
            if self.utilization is not None:  # NVML's word on the last batches, if it has it
                try:
                    self.utilization.last()
                except Exception as exc:
                    log.warning("the last NVML sample failed (%s)", exc)
                self._take_utilization(self.requests, self.utilization)
            self.requests.close()
            self.requests.settle(force=True)
            self._hand_on_requests(self.requests)

    def close(self) -> DropCounts:
        """Final drain; returns the drop counts; closes sinks and probes."""
        # A loader notification may still hold a process: release it first.
        for note in self.probes.poll_loader(0):
            if note.held:
                self._release(note)
        try:
            self.finish()
        finally:  # what the sinks hold reaches their files even when the last drain fails
            for sink in self.sinks:
                sink.close()
        self.verdicts.save_if_dirty()  # never raises: a failed save is one log line
        drops = self.probes.drops()
        if self.http_probes is not None:
            self._close_http(self.http_probes)
        if self.settings.hold_on_load:  # after the last drain: no event of it is lost
            self._hold_no_more()
        if self.stacks is not None:
            self.stacks.close()
        try:
            self.probes.close()
        except Exception as exc:  # the kernel releases them when this process exits
            log.warning("detaching the probes failed (%s): they go when gpuflight exits", exc)
            log.debug("the detach failure", exc_info=exc)
        return drops
