"""Load the BPF program, attach it to library files, and read what it reports.

The only module that imports bcc, and only to compile: bcc turns bpf/cudart.bpf.c into an
image (producer/bpfimage.py), kept in the cache folder so that the next start skips the ~1 s
compile; producer/bpfload.py loads the image and reads its maps. The uprobes are attached
here, a BPF uprobe_multi link each (UprobeLinks: why not bcc's attach_uprobe, and why not the
uprobe PMU where the kernel has those links, is told there). Attachment is once per library
file (inode): a uprobe on a file covers every process that maps it, now or later.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import resource
import select
import struct
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from producer import attachplan, bpfimage, bpfload
from producer.attachplan import LOADER_SYMBOL
from producer.bpfsource import bundle
from producer.discover import DRIVER_SYMBOLS, RUNTIME_SYMBOLS, LibraryFile
from producer.errors import AttachError, SetupError
from producer.records import (
    AGG_KEY_DTYPE,
    AGG_STATE_DTYPE,
    AGG_VALUE_DTYPE,
    AGGREGATE_DTYPE,
    AGGREGATED,
    COOKIE_STEPPED,
    DROP_EVENTS,
    DROP_LOADER,
    DROP_NAMES,
    DROP_SLOTS,
    EVENT_DTYPE,
    FILE_ID_DTYPE,
    FORWARDED,
    LOADER_EVENT_DTYPE,
    LOADER_LISTEN,
    MAX_RUNTIME_RANGES,
    NAME_EVENT_DTYPE,
    PROBES,
    QUIET_LOADS,
    SETTLED_DTYPE,
    STEPPED,
    TEXT_RANGES_DTYPE,
    Probe,
)
from producer.ringbuf import RingBufferReader
from producer.settings import CaptureSettings

log = logging.getLogger(__name__)

#: Process name of the detached helper that releases probes after a capture.
RELEASER_NAME = "gpuflight-rel"


@dataclass(frozen=True)
class LoaderEvent:
    pid: int
    held: bool
    #: CLOCK_MONOTONIC (time.monotonic_ns) when the probe saw the change (and held the process).
    ts_ns: int = 0
    #: A first listen(2) (records.LOADER_LISTEN), not a change of what the process maps.
    listen: bool = False


@dataclass(frozen=True)
class DropCounts:
    events: int
    loader: int
    by_pid: dict[int, int] = field(default_factory=dict)
    names: int = 0
    #: Not lost: driver calls a probed runtime made for an operation recorded once already.
    forwarded: int = 0
    #: Not lost: dlopens in scope that mapped only quiet files, let through unheld.
    quiet_loads: int = 0
    #: Not lost: events the kernel counted in its aggregates instead of recording them (under
    #: overload: bpf/cudart.bpf.c); they are in every count all the same.
    aggregated: int = 0
    #: Not lost: calls in scope whose probe the kernel single-stepped (AttachedFile.stepped;
    #: counted only where the kernel has attach cookies, Linux 5.15+).
    stepped: int = 0


# What each kind of library file is probed for: its API functions and name functions.
_PROBED = attachplan.PROBED
_PROBE_ROWS: dict[str, Probe] = {p.name: p for p in PROBES}
#: The kinds of file whose loss costs the user CUDA calls (a loader's costs only timeliness).
CUDA_KINDS = frozenset({"runtime", "driver"})


@dataclass
class AttachedFile:
    library: LibraryFile
    probes: int
    functions: frozenset[str]
    #: Functions the file defines that could not be probed (the kernel refused that one
    #: function, e.g. its first instruction), with why: the others are probed all the same.
    unprobed: dict[str, str] = field(default_factory=dict)
    #: The functions probed at an instruction the kernel single-steps (attachplan.Plan.stepped:
    #: ~15 us a call on a VM, where an emulated one costs ~0.4).
    stepped: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SkippedFile:
    """A library file that is not probed at all, and why."""

    library: LibraryFile
    reason: str
    errno: int | None = None


_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
#: struct gf_http_conn_key (bpf/http.h): pid, fd.
_CONN_KEY = struct.Struct("<Ii")
_ONE_BYTE = b"\x01"
#: The tally's maps (bpf/cudart.bpf.c: BPF_TABLE_PINNED), pinned in settings.tally_dir.
TALLY_PINNED = ("committed", "settled")
#: Maps only the CUDA API programs use (this process reads them once those may have run, or
#: waits for them): made with those programs, on the loader thread, while the command starts
#: (~20 ms of the kernel's: the rings' 48 MiB and the tables' entries are allocated up front).
LATER_MAPS = frozenset({"events", "names", "inflight", "ctx_device", "runtime_text",
                        "aggregates", "ring_share"})


class Probes:
    """One compiled BPF program and the library files it is attached to."""

    def __init__(self, settings: CaptureSettings) -> None:
        self._settings = settings
        source = settings.bpf_dir / "cudart.bpf.c"
        if not source.is_file():
            raise SetupError(f"BPF source {source} is missing (set GPUFLIGHT_BPF_DIR)")
        grow_fd_table()  # before this starts any thread
        self._uprobes: Uprobes = UprobeLinks()
        image = program_image(source, settings.cflags(), settings.verdict_cache_dir,
                              lambda: _kernel_cflags(settings))
        pinned = ({name: settings.tally_dir / name for name in TALLY_PINNED}
                  if settings.tally_dir is not None else {})
        self._bpf = bpfload.LoadedObject(image, pinned, later=LATER_MAPS)
        self._program_type: int = bpfload.BPF_PROG_TYPE_KPROBE
        #: Whether CUDA programs may still be loading in the background (_load_programs).
        self._loading = False
        self._load_programs()
        self.attached: dict[tuple[int, int], AttachedFile] = {}
        self.failed: dict[tuple[int, int], SkippedFile] = {}
        #: The fds that hold each attached file's probes (closing them detaches).
        self._links: dict[tuple[int, int], list[int]] = {}
        maps = self._bpf.maps
        self._loader_ring = RingBufferReader(maps["loader_events"].fd,
                                             maps["loader_events"].spec.max_entries,
                                             LOADER_EVENT_DTYPE)
        #: The name records' ring (LATER_MAPS): its reader is made once the loader thread
        #: has made the map, by the names thread (or drain_names, whichever comes first).
        self._names_ring: RingBufferReader | None = None
        #: The events ring's (LATER_MAPS), made at its first use (`ring`).
        self._events_ring: RingBufferReader | None = None
        # Loader notifications wake the capture loop at once (a process is held).
        self._wake = select.epoll()
        self._wake.register(self._loader_ring.fileno(), select.EPOLLIN)
        # Name records come in bursts: PyTorch registers ~25,000 kernels in ~25 ms at import,
        # 13.6 MB of records (the ring holds 16 MiB: GF_NAMES_PAGES), faster than the capture
        # loop turns them into names. A thread of their own moves them out of the ring as
        # they come (numpy copies; the GIL lets it in every 5 ms at worst), so that the ring
        # is empty again for the next burst; drain_names takes what it moved.
        self._names_lock = threading.Lock()
        self._names_moved: list[npt.NDArray[np.void]] = []
        self._names_stop = threading.Event()
        self._names_wake = select.epoll()
        self._names_kick = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # close() wakes it
        self._names_wake.register(self._names_kick, select.EPOLLIN)
        self._names_thread: threading.Thread | None = threading.Thread(
            target=self._move_names, name="gf-names", daemon=True)
        self._names_thread.start()
        #: The files the kernel lets a dlopen map unheld (None: the filter is off).
        self._quiet = maps.get("quiet_files")
        self._quiet_known: set[bytes] = set()
        self._scope = maps["scope_pids"]
        #: The overload aggregates (drain_aggregates): the generation the kernel counts into,
        #: what the AGGREGATED counter said at the last drain, and whether the generation it
        #: left then is still to be read.
        self._agg_state = np.zeros(1, dtype=AGG_STATE_DTYPE)
        self._agg_counted = 0
        self._agg_unread = False

    def drain_events(self, max_events: int | None = None) -> npt.NDArray[np.void]:
        """The events committed so far (EVENT_DTYPE, up to `max_events`), oldest first. None
        before the loader thread has made the ring: no CUDA program can have run then."""
        if self._events_ring is None and not self._bpf.made("events"):
            return np.empty(0, dtype=EVENT_DTYPE)
        return self.ring.drain(max_events)

    def set_wall_offset(self, offset_ns: int) -> None:
        """What turns the kernel's CLOCK_MONOTONIC into the wall clock of the events (the
        enricher's): the kernel's aggregates are by slots of that wall clock, so that each lies
        in one stream window."""
        self._agg_state["wall_offset_ns"] = offset_ns
        self._write_agg_state()

    def _write_agg_state(self) -> None:
        self._bpf.map("agg_state").update(_U32.pack(0), self._agg_state.tobytes())

    def drain_aggregates(self, everything: bool = False) -> npt.NDArray[np.void]:
        """What the kernel counted in its `aggregates` table and no drain has taken yet
        (AGGREGATE_DTYPE, in the kernel's clock): the entries of the generation it stopped
        counting into at the drain before (their events all came before that drain's, and no
        probe is adding to them any more), taken out of the table; then, if it has counted
        since, it is moved on to the other generation. `everything` (at the end, when nothing
        counts any more): every entry, whichever generation."""
        if not self._bpf.made("aggregates"):
            return np.zeros(0, dtype=AGGREGATE_DTYPE)
        counters = self._bpf.map("drops").lookup_percpu(_U32.pack(AGGREGATED))
        counted = sum(_U64.unpack(v)[0] for v in counters)
        out = np.zeros(0, dtype=AGGREGATE_DTYPE)
        if self._agg_unread or everything:
            left = None if everything else int(self._agg_state["gen"][0]) ^ 1
            out = self._take_aggregates(left)
            self._agg_unread = False
        if counted != self._agg_counted:
            self._agg_counted = counted
            if not everything:
                self._agg_state["gen"] ^= 1
                self._write_agg_state()
                self._agg_unread = True
        return out

    def _take_aggregates(self, gen: int | None) -> npt.NDArray[np.void]:
        """The entries of `aggregates` of generation `gen` (None: all), deleted."""
        table = self._bpf.map("aggregates")
        at = AGG_KEY_DTYPE.fields["gen"][1]  # type: ignore[index]
        keys: list[bytes] = []
        values: list[bytes] = []
        for key in table:
            if gen is not None and int.from_bytes(key[at:at + 4], "little") != gen:
                continue
            value = table.lookup(key)
            table.delete(key)
            if value is not None:
                keys.append(key)
                values.append(value)
        k = np.frombuffer(b"".join(keys), dtype=AGG_KEY_DTYPE)
        v = np.frombuffer(b"".join(values), dtype=AGG_VALUE_DTYPE)
        out = np.zeros(len(keys), dtype=AGGREGATE_DTYPE)
        for name in ("pid", "api", "type", "flags", "device", "handle", "dim"):
            out[name] = k[name]
        for name in ("count", "bytes", "duration_ns", "last_ts_ns"):
            out[name] = v[name]
        out["ts_ns"] = v["first_ts_ns"]
        return out

    @property
    def ring(self) -> RingBufferReader:
        """The events ring's reader; the first use waits for the loader thread to have made
        the ring (LATER_MAPS; SetupError if it could not)."""
        if self._events_ring is None:
            events = self._bpf.map("events")
            self._events_ring = RingBufferReader(events.fd, self._settings.ringbuf_bytes)
        return self._events_ring

    def _load_programs(self) -> None:
        """Load (the kernel verifies) what a traced command needs from its first instruction
        now: the tracepoint programs (bpfload, as it opens the image) and the loader's.
        The CUDA API programs, ~0.1 ms of the kernel's each, ~70 of them, and the maps only
        they use (LATER_MAPS) are needed only when a runtime or driver file is first attached
        (a PyTorch start-up maps one tens of ms in at the earliest): they are made on a
        thread of their own meanwhile, so that the command starts without waiting for them.
        An attach that needs one still loading waits for it (so do the rings' readers); one
        that failed is a SetupError, as it was when all loaded here: raised by the first
        attach that needs it, or by `check_loaded` (each turn of the capture loop) if no
        attach comes first, never a probe missing unsaid."""
        try:
            self._program("on_loader_change")
        except Exception as exc:
            raise SetupError(f"the BPF program did not load: {exc}") from exc
        cookies = self._settings.attach_cookies
        programs: dict[str, None] = {}  # the runtime's first: a runtime file comes first
        for kind in ("runtime", "driver"):
            for name in sorted(_PROBED[kind]):
                row = _PROBE_ROWS[name]
                programs[row.program("entry", cookies)] = None
                if row.returns:
                    programs[row.program("return", cookies)] = None
        self._loading = True
        self._bpf.load_in_background(list(programs), self._program_type,
                                     self._uprobes.attach_type, threads=_loader_threads())

    def check_loaded(self) -> None:
        """Without waiting: SetupError if a program loading in the background failed (the
        capture cannot go on without it)."""
        if not self._loading:
            return
        done, failure = self._bpf.background_failure()
        if failure is not None:
            raise SetupError(f"the BPF program did not load: {failure}") from failure
        self._loading = not done

    def wait_loaded(self) -> None:
        """Wait for the programs loading in the background; SetupError if one failed."""
        try:
            self._bpf.wait_loaded()
        except Exception as exc:
            raise SetupError(f"the BPF program did not load: {exc}") from exc
        self._loading = False

    # -- attaching --------------------------------------------------------

    def attach(self, library: LibraryFile) -> AttachedFile | None:
        """Attach to a library file once; a file that fails is logged once and skipped.

        A function the kernel refuses to probe costs that function only (logged once with the
        file, kept in `unprobed`); a failure that concerns the whole file (it is gone, out of
        reach, or this process is out of file descriptors) detaches what was attached to it
        and skips the file: a file is either probed or listed in `failed`, never half done
        unsaid."""
        if library.key in self.attached:
            return self.attached[library.key]
        if library.key in self.failed:
            return None
        attached = self._attach_file(library)
        if attached is None and library.key in self.failed:
            log.warning("skipping %s: %s", library.path, self.failed[library.key].reason)
        return attached

    def _attach_file(self, library: LibraryFile) -> AttachedFile | None:
        """Attach to a file not tried before; a failure is kept in `failed`, not logged."""
        fds: list[int] = []
        try:
            # Planned and attached through the descriptor discovery checked (/proc/self/fd/N),
            # never through a path: its directories may be swapped between two uses of it.
            with library.reading() as path:
                if library.kind == "loader":
                    attached = self._attach_loader(library, path, fds)
                else:
                    attached = self._attach_runtime(library, path, fds)
        except SetupError:  # a program did not load: nothing of the file stays attached
            self._detach(fds)
            raise
        except AttachError as exc:
            self._detach(fds)
            self.failed[library.key] = SkippedFile(library, str(exc), exc.errno)
            return None
        except OSError as exc:
            self._detach(fds)
            # Not open any more (a LibraryFile made without its file, whose path has gone):
            # nothing is known about the file itself. Not remembered: the next process that
            # maps it is the way in.
            log.debug("%s went away before it was probed (%s); tried again through the"
                      " next process that maps it", library.host_path, exc)
            return None
        self.attached[library.key] = attached
        self._links[library.key] = fds
        if attached.unprobed:
            log.warning(
                "%s: %d function(s) could not be probed (%s); the file's other %d probes are "
                "attached", library.path, len(attached.unprobed),
                "; ".join(f"{name}: {why}" for name, why in sorted(attached.unprobed.items())),
                attached.probes,
            )
        log.debug("attached %d probes to %s (%s)", attached.probes, library.path, library.kind)
        return attached

    def check_permitted(self, library: LibraryFile) -> None:
        """Attach `library` (this process's own dynamic loader) before any other file: a
        kernel that refuses uprobes to this process (not root, capabilities missing) ends the
        command in one line here, rather than skipping every file it would meet."""
        if library.key in self.attached or library.key in self.failed:
            return
        if self._attach_file(library) is not None:
            return
        skipped = self.failed.get(library.key)
        if skipped is None:  # gone before it was tried: nothing said of the kernel
            return
        if skipped.errno in (errno.EPERM, errno.EACCES):
            raise SetupError(
                f"the kernel refused to attach a uprobe ({os.strerror(skipped.errno)}): "
                "gpuflight needs root, or CAP_SYS_ADMIN (the kernel's uprobe PMU asks for it "
                "before Linux 6.6; CAP_PERFMON is not enough) with CAP_BPF, CAP_PERFMON, "
                "CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH"
            )
        log.warning("skipping %s: %s", library.path, skipped.reason)

    def _program(self, name: str) -> int:
        """The fd of the loaded BPF program `name` (each is loaded once), loaded for the
        way UprobeLinks attaches it; waits for one still loading in the background.
        SetupError if it did not load: not a function's or a file's failure, the capture's."""
        started = time.monotonic()
        try:
            return self._bpf.program(name, self._program_type, self._uprobes.attach_type)
        except Exception as exc:
            raise SetupError(f"the BPF program did not load: {exc}") from exc
        finally:
            waited = time.monotonic() - started
            if waited > 0.001:  # still loading on the loader thread (or loaded just now)
                log.debug("waited %.1f ms for %s to load", waited * 1000, name)

    def _attach_function(self, path: str, name: str, offset: int, fds: list[int],
                         stepped: bool = False) -> int:
        """The entry probe of `name` at file `offset` of the file open at `path`, and its
        return probe where one is needed: both or neither (at one offset: the kernel takes
        the return address at %rsp there, which the plan's moves leave as at the entry).
        `stepped`: the instruction there is single-stepped (its calls are counted, where
        cookies are). Returns how many probes; raises OSError."""
        row = _PROBE_ROWS[name]
        cookies = self._settings.attach_cookies
        cookie = (row.cookie | (COOKIE_STEPPED if stepped else 0)) if cookies else 0
        entry = self._uprobes.attach(self._program(row.program("entry", cookies)),
                                     path, offset, retprobe=False, cookie=cookie)
        if not row.returns:
            fds.append(entry)
            return 1
        try:
            ret = self._uprobes.attach(self._program(row.program("return", cookies)),
                                       path, offset, retprobe=True, cookie=cookie)
        except BaseException:
            self._detach([entry])
            raise
        fds += (entry, ret)
        return 2

    def _attach_runtime(self, library: LibraryFile, path: str, fds: list[int]) -> AttachedFile:
        """A runtime or driver file (open at `path`): its API functions and its name
        functions."""
        plan = _plan(library, path)
        offsets = dict(plan.offsets)
        if library.probe_only is not None:  # a runtime linked into the file: what it calls
            offsets = {n: o for n, o in offsets.items() if n in library.probe_only}
        functions = frozenset(offsets)
        if not functions & (RUNTIME_SYMBOLS | DRIVER_SYMBOLS):
            raise AttachError(f"defines none of the CUDA {library.kind} functions we probe")
        probes = 0
        unprobed: dict[str, str] = {}
        first_errno: int | None = None
        claimed: dict[int, str] = {}
        for name in sorted(functions):
            offset = offsets[name]
            if offset is None:
                unprobed[name] = "its address is outside the file's loaded segments"
                continue
            # Two names of one function (an alias) would fire two probes per call.
            if offset in claimed:
                log.debug("%s: %s is %s, probed once", library.path, name, claimed[offset])
                continue
            claimed[offset] = name
            try:
                probes += self._attach_function(path, name, offset, fds, name in plan.stepped)
            except OSError as exc:
                if exc.errno in FILE_ERRNOS:
                    raise AttachError(f"cannot attach to {name}: {_reason(exc)}",
                                      exc.errno) from exc
                first_errno = first_errno if first_errno is not None else exc.errno
                unprobed[name] = _reason(exc)
        if not probes:
            some = "; ".join(f"{n}: {why}" for n, why in sorted(unprobed.items())[:3])
            raise AttachError(f"none of its functions could be probed ({some})", first_errno)
        # Counted once per function probed: an alias probed through another name is not.
        stepped = plan.stepped & (set(claimed.values()) - unprobed.keys())
        return AttachedFile(library, probes, functions - unprobed.keys(), unprobed,
                            frozenset(stepped))

    def _attach_loader(self, library: LibraryFile, path: str, fds: list[int]) -> AttachedFile:
        plan = _plan(library, path)
        offset = plan.offset(LOADER_SYMBOL)
        if offset is None:
            raise AttachError(f"defines no {LOADER_SYMBOL} to probe")
        # The program reads the loader's r_state through the cookie (bpf/cudart.bpf.c).
        try:
            fds.append(self._uprobes.attach(self._program("on_loader_change"),
                                            path, offset, retprobe=False,
                                            cookie=plan.cookie))
        except OSError as exc:
            raise AttachError(f"cannot attach to {LOADER_SYMBOL}: {_reason(exc)}",
                              exc.errno) from exc
        return AttachedFile(library, 1, frozenset({LOADER_SYMBOL}))

    def _detach(self, fds: Iterable[int]) -> int:
        """Close each fd (each detaches one probe); a failure is logged, and the rest go on.
        Returns how many failed."""
        failures = 0
        first = ""
        for fd in fds:
            try:
                self._uprobes.detach(fd)
            except OSError as exc:
                failures += 1
                first = first or _reason(exc)
        if failures:
            log.warning("%d probe(s) could not be detached (%s): the kernel releases them when "
                        "gpuflight exits", failures, first)
        return failures

    def forget_file(self, key: tuple[int, int]) -> None:
        """Detach a file (and forget a skipped one): no process maps it any more. Its probes
        are released on a thread of their own, many at a time (each waits for a grace
        period), so that the capture loop goes on meanwhile; a file mapped again later is
        attached again."""
        self.failed.pop(key, None)
        attached = self.attached.pop(key, None)
        fds = self._links.pop(key, [])
        if attached is not None:
            log.debug("detaching %s: no process maps it any more", attached.library.path)
        if fds:
            threading.Thread(target=self._detach_at_once, args=(fds,), name="gf-detach",
                             daemon=True).start()

    def _detach_at_once(self, fds: list[int]) -> None:
        failed = _together(fds, lambda fd: self._detach([fd]) == 0)
        if failed:
            log.debug("%d probe(s) of a file no process maps could not be detached", failed)

    def skipped_cuda(self) -> list[SkippedFile]:
        """The CUDA runtime and driver files that are not probed at all."""
        return [s for s in self.failed.values() if s.library.kind in CUDA_KINDS]

    def runtime_files(self) -> int:
        """How many runtime library files are probed."""
        return sum(1 for a in self.attached.values() if a.library.kind == "runtime")

    def driver_files(self) -> int:
        """How many driver library files are probed."""
        return sum(1 for a in self.attached.values() if a.library.kind == "driver")

    def set_text_ranges(self, pid: int, ranges: Iterable[tuple[int, int]]) -> None:
        """The text of the probed runtime and driver files `pid` maps: driver calls made
        from there are a runtime's (or the driver's own) and are not recorded again."""
        spans = sorted(set(ranges))[:MAX_RUNTIME_RANGES]
        if len(spans) < len(set(ranges)):
            log.warning("pid %d maps more than %d CUDA files: driver calls from the rest "
                        "may be counted twice", pid, MAX_RUNTIME_RANGES)
        value = np.zeros(1, dtype=TEXT_RANGES_DTYPE)
        for i, (start, end) in enumerate(spans):
            value["start"][0][i] = start
            value["end"][0][i] = end
        self._bpf.map("runtime_text").update(_U32.pack(pid), value.tobytes())

    def forget_pid(self, pid: int) -> None:
        self._bpf.map("runtime_text").delete(_U32.pack(pid))

    # -- scope ------------------------------------------------------------

    def add_to_scope(self, pids: Iterable[int]) -> None:
        for pid in pids:
            self._scope.update(_U32.pack(pid), _ONE_BYTE)

    def scope(self) -> set[int]:
        return {_U32.unpack(k)[0] for k in self._scope}

    def clear_scope(self) -> None:
        """No process is in scope any more: the probes record nothing and hold no one.
        Cleared until a pass finds nothing: a fork in flight as its parent left the scope
        may add its child meanwhile."""
        for _ in range(8):
            if not self._scope.keys():
                return
            self._scope.clear()

    @property
    def holds(self) -> bpfload.BpfMap | None:
        """The holds not yet over, each by its notification (bpf/cudart.bpf.c `holds`), where
        processes are held (trace); None elsewhere. producer/holdguard.py reads it."""
        return self._bpf.maps.get("holds")

    @property
    def scope_map(self) -> bpfload.BpfMap:
        """`scope_pids`, the processes in scope: the holds' watchdog empties it when the tracer
        dies (producer/holdguard.py)."""
        return self._scope

    # -- reading ----------------------------------------------------------

    def poll_loader(self, timeout_s: float) -> list[LoaderEvent]:
        """Wait up to timeout_s for loader notifications (they wake us at once)."""
        if timeout_s > 0 and not self._loader_ring.pending_bytes():
            with contextlib.suppress(InterruptedError):
                self._wake.poll(timeout_s)
        raw = self._loader_ring.drain()
        return [LoaderEvent(int(r["pid"]), bool(r["held"]), int(r["ts_ns"]),
                            int(r["reason"]) == LOADER_LISTEN) for r in raw]

    def drain_names(self) -> npt.NDArray[np.void]:
        """Every name record committed so far (NAME_EVENT_DTYPE), oldest first.

        Drain the events ring first, then this: a launch is committed after the name
        record of its handle, so every launch drained has its name here."""
        if self._names_ring is None and self._bpf.made("names"):
            self._open_names()  # the names thread has not yet: launches may be named there
        self._take_names()
        with self._names_lock:
            moved, self._names_moved = self._names_moved, []
        if not moved:
            return np.empty(0, dtype=NAME_EVENT_DTYPE)
        return moved[0] if len(moved) == 1 else np.concatenate(moved)

    def _open_names(self) -> None:
        """Make the name ring's reader (either thread, once), waiting for the loader thread
        to have made the ring. SetupError if it could not."""
        names = self._bpf.map("names")
        with self._names_lock:
            if self._names_stop.is_set() or self._names_ring is not None:
                return
            ring = RingBufferReader(names.fd, names.spec.max_entries, NAME_EVENT_DTYPE)
            self._names_wake.register(ring.fileno(), select.EPOLLIN)
            self._names_ring = ring

    def _take_names(self) -> None:
        """Move what the name ring holds out of it (either thread)."""
        with self._names_lock:
            if self._names_stop.is_set() or self._names_ring is None:
                return
            batch = self._names_ring.drain()
            if len(batch):
                self._names_moved.append(batch)

    def _move_names(self) -> None:
        """The name records' thread: waits for the ring, then for records, moves them out,
        until close."""
        try:
            self._open_names()
        except Exception as exc:  # not made (check_loaded says so), or closed meanwhile
            log.debug("the name records' thread ends: %s", exc)
            return
        while not self._names_stop.is_set():
            try:
                self._names_wake.poll(1.0)
                self._take_names()
            except (OSError, ValueError):  # closed under us: close() is under way
                return

    @property
    def quiet_loads(self) -> bool:
        """Whether the kernel lets through, unheld, dlopens of the files `add_quiet` names."""
        return self._quiet is not None

    def add_quiet(self, files: Iterable[tuple[int, int, int, int]]) -> int:
        """Files (st_dev, st_ino, st_size, st_ctime_ns as stat gives them) that define nothing
        we probe: a dlopen that maps only such files goes on unheld (bpf/cudart.bpf.c,
        GF_QUIET_LOADS). Those not told before are added in one system call; how many were. A
        full map (E2BIG) is no error: the files it could not take are held, as every file was
        before."""
        if self._quiet is None:
            return 0
        # The kernel's dev_t is MAJOR << 20 | MINOR (stat's packs them otherwise).
        ids = np.array([((os.major(dev) << 20) | os.minor(dev), ino, size, ctime_ns)
                        for dev, ino, size, ctime_ns in files], dtype=FILE_ID_DTYPE)
        raw, step = ids.tobytes(), FILE_ID_DTYPE.itemsize
        keys = list(dict.fromkeys(
            key for key in (raw[i:i + step] for i in range(0, len(raw), step))
            if key not in self._quiet_known))
        if not keys:
            return 0
        try:
            added = self._quiet.update_many(b"".join(keys), _ONE_BYTE * len(keys))
        except OSError as exc:
            log.debug("the quiet files could not be told to the kernel: %s", exc)
            return 0
        self._quiet_known.update(keys[:added])
        if added < len(keys):
            log.debug("the quiet files map is full: %d file(s) are held at each dlopen",
                      len(keys) - added)
        return added

    def loader_drops(self) -> int:
        """Loader notifications lost so far (their ring full): one per-CPU lookup, cheap
        enough for every rescan."""
        table = self._bpf.map("drops")
        return sum(_U64.unpack(v)[0] for v in table.lookup_percpu(_U32.pack(DROP_LOADER)))

    def drops(self) -> DropCounts:
        table = self._bpf.map("drops")
        totals = [sum(_U64.unpack(v)[0] for v in table.lookup_percpu(_U32.pack(slot)))
                  for slot in range(DROP_SLOTS)]
        by_pid = {_U32.unpack(k)[0]: _U64.unpack(v)[0]
                  for k, v in self._bpf.map("drops_by_pid").items()}
        return DropCounts(
            events=totals[DROP_EVENTS],
            loader=totals[DROP_LOADER],
            by_pid=by_pid,
            names=totals[DROP_NAMES],
            forwarded=totals[FORWARDED],
            quiet_loads=totals[QUIET_LOADS],
            aggregated=totals[AGGREGATED],
            stepped=totals[STEPPED],
        )

    # -- the tally (producer/tally.py): node agent with Kafka only ----------------------

    def tally_committed(self) -> dict[int, int]:
        """Events committed per pid so far (empty without a tally)."""
        if self._settings.tally_dir is None:
            return {}
        return {_U32.unpack(k)[0]: _U64.unpack(v)[0]
                for k, v in self._bpf.map("committed").items()}

    def settle(self, pid: int, delivered: int, dropped: int) -> None:
        """Say what became of a pid's events: `delivered` acknowledged by Kafka, `dropped`
        counted lost in an acknowledged metrics record (totals). Never raises (logged)."""
        if self._settings.tally_dir is None:
            return
        try:
            self._bpf.map("settled").update(_U32.pack(pid), _U64.pack(delivered)
                                            + _U64.pack(dropped))
        except OSError as exc:  # the map full: the pid's events would count lost if killed
            log.debug("tally: cannot settle pid %d: %s", pid, exc)

    def freeze_tally(self) -> None:
        """Stop counting: the agent is stopping, and reads nothing committed after this."""
        if self._settings.tally_dir is not None:
            self._bpf.map("tally_frozen").update(_U32.pack(0), _U32.pack(1))

    def forget_tally(self, pids: Iterable[int]) -> None:
        """Drop finished pids (every event settled) from the tally, making room."""
        if self._settings.tally_dir is None:
            return
        pids = list(pids)
        for name in TALLY_PINNED:
            table = self._bpf.map(name)
            for pid in pids:
                table.delete(_U32.pack(pid))

    def close(self, background: bool = True) -> None:
        """Detach everything; never raises (a failure to detach is logged: the kernel
        releases whatever this process still holds when it exits). Releasing a uprobe
        costs the kernel ~0.1 s (it waits for a grace period), one probe after another:
        with `background`, a detached grandchild that inherited the probes releases them,
        and we return at once."""
        self._bpf.stop_loading()  # nothing loads while the releaser is forked
        with self._names_lock:
            self._names_stop.set()
        if self._names_thread is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(self._names_kick, 1)
            self._names_thread.join(timeout=5)
            with contextlib.suppress(OSError):
                os.close(self._names_kick)
        for ring in (self._events_ring, self._loader_ring, self._names_ring):
            if ring is None:
                continue
            try:
                ring.close()
            except Exception as exc:
                log.warning("closing a ring buffer failed: %s", exc)
        for wake in (self._wake, self._names_wake):
            with contextlib.suppress(OSError):
                wake.close()
        fds = [fd for group in self._links.values() for fd in group]
        self._links.clear()

        def release() -> None:
            self._detach(fds)
            try:
                self._close_program()
            except Exception as exc:  # its tracepoints, maps and programs
                log.warning("the BPF program failed to close (%s): the kernel releases what "
                            "is left when gpuflight exits", exc)
                log.debug("the close failure", exc_info=exc)

        if background:
            _release_in_background(release)
        else:
            release()


    def _close_program(self) -> None:
        """The program's own: its tracepoints, maps and programs."""
        failed = self._bpf.close()
        if failed:
            log.warning("%d of the BPF program's fds could not be closed: the kernel releases "
                        "them when gpuflight exits", failed)


def _plan(library: LibraryFile, path: str) -> attachplan.Plan:
    """Where to attach in `library` (open at `path`): the plan discover found (kept across
    runs with the file's verdict), else read from the file now (a LibraryFile made without
    one)."""
    plan = library.plan
    if plan is not None and plan.kind == library.kind:
        return plan
    try:
        size = os.stat(path).st_size
    except OSError:
        return attachplan.Plan(library.kind, ())
    return attachplan.read_plan(path, library.kind, size, library.probe_only)


# ---- the program: compiled by bcc, or read from the cache ------------------------------------


def _kernel_cflags(settings: CaptureSettings) -> list[str]:
    """What the program reads of the running kernel's structs, from its BTF: the offsets of
    the quiet-load filter's fd → file walk (without them the filter is compiled out: every
    dlopen is held), and where a task keeps its pid (without it, forks are followed on a
    tracepoint perf event instead of the raw tracepoint, whose release costs the kernel
    more)."""
    if not (settings.quiet_loads_on or settings.follow_forks):
        return []
    from producer.btf import Btf, BtfError, file_offsets, task_pid_cflags

    try:
        btf = Btf.from_file()
    except (BtfError, OSError) as exc:
        log.info("the kernel's BTF cannot be read (%s): every dlopen is held, and forks are "
                 "followed on a tracepoint perf event", exc)
        return []
    flags: list[str] = []
    if settings.quiet_loads_on:
        try:
            flags += file_offsets(btf).cflags()
        except BtfError as exc:
            log.info("every dlopen is held: the kernel's file structs are unknown (%s)", exc)
    if settings.follow_forks:
        try:
            flags += task_pid_cflags(btf)
        except BtfError as exc:
            log.info("forks are followed on a tracepoint perf event: %s", exc)
    return flags


def program_image(
    source: Path,
    cflags: list[str],
    cache_dir: Path | None,
    kernel_cflags: Callable[[], list[str]] | None = None,
) -> bpfimage.Image:
    """The compiled `source` (with `cflags`): from the image cache in `cache_dir` where one
    was kept for exactly this source, these cflags, this bcc and this kernel, else compiled
    by bcc (~1 s) and kept there.

    The tally's bpffs folder (GF_TALLY_DIR) names only where two maps are pinned, which the
    loader is told apart (Probes): it is no part of the key, so that each agent (a folder of
    its own) finds the image of the one before. `kernel_cflags` are read from the running
    kernel (struct offsets from its BTF, ~60 ms): asked for only when the program is
    compiled, and no part of the key either, which names the kernel (release, build, BTF)
    they follow from."""
    text = bundle(source)
    key = bpfimage.image_key(
        text, [flag for flag in cflags if not flag.startswith("-DGF_TALLY_DIR=")],
        bpfimage.environment_parts(_bcc_library(), _kernel_headers()))
    cache = bpfimage.ImageCache(cache_dir)
    image = cache.load(key)
    if image is not None:
        log.debug("compiled BPF program read from %s", cache.path(key))
        return image
    image = compile_image(text, [*cflags, *(kernel_cflags() if kernel_cflags else [])])
    if cache.save(key, image):
        log.debug("compiled BPF program kept in %s", cache.path(key))
    return image


def compile_image(text: str, cflags: list[str]) -> bpfimage.Image:
    """bcc compiles `text`; the image of what it would load. The maps bcc creates meanwhile
    are freed (those it pins stay pinned), and nothing is attached."""
    try:
        from bcc import BPF, libbcc  # the one bcc import
    except ImportError as exc:
        raise SetupError(
            f"bcc cannot be imported ({exc}): apt-get install python3-bpfcc"
        ) from exc

    class CompileOnly(BPF):  # type: ignore[misc]
        def _trace_autoload(self) -> None:
            """bcc attaches tracepoint__ functions as it loads: the loader does (bpfload)."""

    try:
        compiled = CompileOnly(text=text.encode(), cflags=cflags)
    except Exception as exc:
        raise SetupError(f"the BPF program did not compile: {exc}") from exc
    atexit.unregister(compiled.cleanup)
    lib = libbcc.lib
    lib.bpf_num_tables.restype = ctypes.c_size_t
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.bpf_table_fd_id.restype = ctypes.c_int
    lib.bpf_table_fd_id.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    module = compiled.module
    try:
        maps: list[bpfimage.MapSpec] = []
        map_of_fd: dict[int, int] = {}
        for i in range(lib.bpf_num_tables(module)):
            fd = int(lib.bpf_table_fd_id(module, i))
            map_of_fd[fd] = len(maps)
            maps.append(bpfload.map_spec(fd, lib.bpf_table_name(module, i).decode()))
        programs = []
        for i in range(lib.bpf_num_functions(module)):
            name = lib.bpf_function_name(module, i)
            insns = ctypes.string_at(lib.bpf_function_start(module, name),
                                     lib.bpf_function_size(module, name))
            programs.append(bpfimage.ProgramSpec(name.decode(), insns,
                                                 bpfimage.relocations(insns, map_of_fd)))
        return bpfimage.Image(lib.bpf_module_license(module).decode(),
                              int(lib.bpf_module_kern_version(module)),
                              tuple(maps), tuple(programs))
    except (OSError, ValueError) as exc:
        raise SetupError(f"the compiled BPF program cannot be read back: {exc}") from exc
    finally:
        compiled.cleanup()


def _bcc_library() -> Path | None:
    """libbcc.so.0, the library that compiles (its Python side is upgraded with it)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for folder in (f"/usr/lib/{multiarch}", f"/lib/{multiarch}", "/usr/lib64", "/usr/lib",
                   "/usr/local/lib"):
        path = Path(folder) / "libbcc.so.0"
        if path.exists():
            return path
    return None


def _kernel_headers() -> Path | None:
    """What bcc compiles against: the running kernel's build tree (its Makefile)."""
    build = Path("/lib/modules") / os.uname().release / "build"
    return build / "Makefile" if (build / "Makefile").exists() else None


# ---- uprobes: one BPF link each --------------------------------------------------------------
#
# Not bcc's attach_uprobe: Debian's python3-bpfcc 0.26 declares libbcc's 7-argument
# bpf_attach_uprobe with 6 arguments, so the 7th, ref_ctr_offset, is whatever the stack holds;
# the kernel registers the uprobe with it, and then refuses any other tracer's uprobe on the
# same function (its ref_ctr_offset is 0: "ref_ctr_offset mismatch" in dmesg), or ours when the
# other came first. bcc also falls back to tracefs events, whose removal fails with EBUSY while
# a copy of the fd is open, and stops at 1000 open probes per process.
#
# So, as libbpf does: where the kernel has them (Linux 6.6+), a BPF uprobe_multi link per probe
# (one offset each: each function has a program of its own), ref_ctr_offset 0. Not the uprobe
# PMU: releasing a perf-event uprobe takes the kernel ~100 ms, one after another however many
# threads close them, a link ~50 ms alone and ~2.7 ms 32 at a time; and while perf uprobes are
# being released (an earlier trace's releaser), registering one took 1-11 ms where a link took
# 0.1-0.3 ms: a traced PyTorch start-up was held ~7 s at its dlopens for ~320 probes, ~0.1 s
# with links (bench/attach_cost.py, bench/RESULTS.md). Older kernels: perf_event_open(2) on
# the uprobe PMU, then a BPF link (5.15+) or PERF_EVENT_IOC_SET_BPF. One fd per probe; closing
# it detaches.

_NR_PERF_EVENT_OPEN = bpfload.NR_PERF_EVENT_OPEN
_NR_BPF = bpfload.NR_BPF
_BPF_PROG_LOAD = bpfload.BPF_PROG_LOAD
_BPF_LINK_CREATE = 28
_BPF_PERF_EVENT = 41
#: enum bpf_attach_type: a program loaded for it attaches only through uprobe_multi links.
BPF_TRACE_UPROBE_MULTI = 48
_BPF_F_UPROBE_MULTI_RETURN = 1
_BPF_PROG_TYPE_KPROBE = bpfload.BPF_PROG_TYPE_KPROBE
_PERF_FLAG_FD_CLOEXEC = 1 << 3
_PERF_EVENT_IOC_ENABLE = 0x2400
_PERF_EVENT_IOC_SET_BPF = 0x40042408
_PERF_ATTR_DISABLED = 1  # perf_event_attr's first flag bit
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe")
#: The kernel's own ENOTSUPP (not EOPNOTSUPP): an instruction it cannot probe.
ENOTSUPP = 524
#: Errors that concern a whole file (or this process), not one function: the file is skipped
#: rather than every function tried in vain.
FILE_ERRNOS = frozenset({
    errno.ENOENT, errno.ENOTDIR, errno.ESTALE, errno.ELOOP, errno.EPERM, errno.EACCES,
    errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENODEV, errno.ENOSYS,
})


class Uprobes(Protocol):
    """How Probes attaches a program to one uprobe and detaches it (the seam tests fake)."""

    #: The expected attach type the programs must be loaded with (-1: none).
    attach_type: int

    def attach(self, prog_fd: int, path: str, offset: int, retprobe: bool,
               cookie: int = 0) -> int: ...
    def detach(self, fd: int) -> None: ...


class _LinkCreate(ctypes.Structure):
    """union bpf_attr as BPF_LINK_CREATE reads it for a perf event."""

    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("bpf_cookie", ctypes.c_uint64),
    ]


class _UprobeMultiLink(ctypes.Structure):
    """union bpf_attr as BPF_LINK_CREATE reads it for a uprobe_multi link."""

    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("path", ctypes.c_uint64),
        ("offsets", ctypes.c_uint64),
        ("ref_ctr_offsets", ctypes.c_uint64),  # NULL: no USDT semaphores
        ("cookies", ctypes.c_uint64),
        ("cnt", ctypes.c_uint32),
        ("multi_flags", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),  # 0: every process that maps the file
        ("pad", ctypes.c_uint32),
    ]


class UprobeLinks:
    """Attaches BPF programs to uprobes; the seam tests replace to make one fail."""

    def __init__(self, pmu: Path = UPROBE_PMU, multi: bool | None = None) -> None:
        """`multi`: whether to use uprobe_multi links (None: where the kernel has them)."""
        self._links = True  # BPF links for perf events, until the kernel says it has none
        self.multi = self._has_uprobe_multi() if multi is None else multi
        self.attach_type = BPF_TRACE_UPROBE_MULTI if self.multi else -1
        self._type = self._retprobe = 0
        if self.multi:
            return
        try:
            self._type = int((pmu / "type").read_text())
            retprobe = (pmu / "format" / "retprobe").read_text().strip()  # "config:0"
            self._retprobe = 1 << int(retprobe.removeprefix("config:"))
        except (OSError, ValueError) as exc:
            raise SetupError(f"this kernel has no uprobe PMU ({pmu}) and no uprobe_multi "
                             "links: gpuflight needs Linux 4.17 or later with "
                             "CONFIG_UPROBE_EVENTS") from exc

    def _has_uprobe_multi(self) -> bool:
        """Whether the kernel has uprobe_multi links (6.6+), probed as libbpf does: a
        do-nothing program loaded for them, linked to "/", is refused with EBADF (not a
        regular file) where they exist, with EINVAL before."""
        insns = (ctypes.c_uint64 * 2)(0xB7, 0x95)  # r0 = 0; exit
        license = ctypes.create_string_buffer(b"GPL")
        load = bpfload.ProgLoad(prog_type=_BPF_PROG_TYPE_KPROBE, insn_cnt=2,
                         insns=ctypes.addressof(insns), license=ctypes.addressof(license),
                         expected_attach_type=BPF_TRACE_UPROBE_MULTI)
        try:
            prog = self._call(_NR_BPF, _BPF_PROG_LOAD, ctypes.byref(load), ctypes.sizeof(load))
        except OSError as exc:
            log.debug("no uprobe_multi programs (%s): uprobes through the perf PMU", exc)
            return False
        try:
            root = ctypes.create_string_buffer(b"/")
            offsets = (ctypes.c_uint64 * 1)(0)
            link = _UprobeMultiLink(prog_fd=prog, attach_type=BPF_TRACE_UPROBE_MULTI,
                                    path=ctypes.addressof(root),
                                    offsets=ctypes.addressof(offsets), cnt=1)
            try:
                os.close(self._call(_NR_BPF, _BPF_LINK_CREATE, ctypes.byref(link),
                                    ctypes.sizeof(link)))
            except OSError as exc:
                log.debug("uprobe_multi links: %s", exc)
                return exc.errno == errno.EBADF
            return True  # not expected ("/" is no file), but it linked
        finally:
            os.close(prog)

    def attach(self, prog_fd: int, path: str, offset: int, retprobe: bool,
               cookie: int = 0) -> int:
        """An fd holding a uprobe at `offset` of the file at `path` that runs `prog_fd`
        (which reads `cookie` with bpf_get_attach_cookie; 0 before Linux 5.15);
        OSError with the kernel's errno when it refuses. Each probe holds a file descriptor
        (~85 per runtime file): out of them, the soft limit is raised towards the hard one
        (only then, so that a traced command started before inherits the usual limit)."""
        try:
            return self._attach(prog_fd, path, offset, retprobe, cookie)
        except OSError as exc:
            if exc.errno != errno.EMFILE or not _raise_open_files_limit():
                raise
        return self._attach(prog_fd, path, offset, retprobe, cookie)

    def _attach(self, prog_fd: int, path: str, offset: int, retprobe: bool,
                cookie: int) -> int:
        name = ctypes.create_string_buffer(os.fsencode(path))
        if self.multi:
            offsets = (ctypes.c_uint64 * 1)(offset)
            cookies = (ctypes.c_uint64 * 1)(cookie)
            multi = _UprobeMultiLink(
                prog_fd=prog_fd, attach_type=BPF_TRACE_UPROBE_MULTI,
                path=ctypes.addressof(name), offsets=ctypes.addressof(offsets),
                cookies=ctypes.addressof(cookies), cnt=1,
                multi_flags=_BPF_F_UPROBE_MULTI_RETURN if retprobe else 0,
            )
            return self._call(_NR_BPF, _BPF_LINK_CREATE, ctypes.byref(multi),
                              ctypes.sizeof(multi))
        attr = bpfload.PerfEventAttr(
            type=self._type,
            size=ctypes.sizeof(bpfload.PerfEventAttr),
            config=self._retprobe if retprobe else 0,  # ref_ctr_offset 0: not a USDT semaphore
            flags=_PERF_ATTR_DISABLED,
            config1=ctypes.addressof(name),
            config2=offset,
        )
        event = self._call(_NR_PERF_EVENT_OPEN, ctypes.byref(attr), -1, 0, -1,
                           _PERF_FLAG_FD_CLOEXEC)
        try:
            if self._links:
                link = _LinkCreate(prog_fd=prog_fd, target_fd=event, attach_type=_BPF_PERF_EVENT,
                                   bpf_cookie=cookie)
                try:
                    fd = self._call(_NR_BPF, _BPF_LINK_CREATE, ctypes.byref(link),
                                    ctypes.sizeof(link))
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._links = False  # before Linux 5.15: the perf event holds the program
                else:
                    try:
                        fcntl.ioctl(event, _PERF_EVENT_IOC_ENABLE, 0)
                    except BaseException:
                        os.close(fd)
                        raise
                    os.close(event)  # the link holds the event
                    return fd
            fcntl.ioctl(event, _PERF_EVENT_IOC_SET_BPF, prog_fd)
            fcntl.ioctl(event, _PERF_EVENT_IOC_ENABLE, 0)
            return event
        except BaseException:
            os.close(event)
            raise

    def detach(self, fd: int) -> None:
        os.close(fd)

    def _call(self, number: int, *args: Any) -> int:
        return bpfload.syscall(number, *args)


def read_pinned_tally(directory: Path) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
    """A dead agent's pinned tally (producer/tally.py): events committed per pid, and per pid
    (delivered, dropped) as it settled them. OSError when the maps cannot be opened."""

    def open_map(name: str) -> bpfload.BpfMap:
        try:
            fd = bpfload.obj_get(directory / name)
        except OSError as exc:
            raise OSError(exc.errno, f"{directory / name}: {exc.strerror}") from None
        try:
            return bpfload.BpfMap(fd, bpfload.map_spec(fd, name))
        except BaseException:
            os.close(fd)
            raise

    def entries(table: bpfload.BpfMap, dtype: np.dtype[Any]) -> dict[int, np.void]:
        if table.spec.key_size != 4 or table.spec.value_size != dtype.itemsize:
            raise OSError(errno.EINVAL, f"{directory / table.spec.name}: not a tally map "
                          f"({table.spec.key_size}-byte keys, {table.spec.value_size}-byte values)")
        return {_U32.unpack(k)[0]: np.frombuffer(v, dtype=dtype)[0] for k, v in table.items()}

    committed_map = open_map("committed")
    try:
        settled_map = open_map("settled")
        try:
            committed = {pid: int(v) for pid, v in
                         entries(committed_map, np.dtype("<u8")).items()}
            settled = {pid: (int(v["delivered"]), int(v["dropped"]))
                       for pid, v in entries(settled_map, SETTLED_DTYPE).items()}
        finally:
            os.close(settled_map.fd)
    finally:
        os.close(committed_map.fd)
    return committed, settled


def _strerror(err: int) -> str:
    if err == ENOTSUPP:
        return "the kernel cannot probe the instruction there (ENOTSUPP)"
    if err in (errno.EMFILE, errno.ENFILE):
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (f"{os.strerror(err)}: each probe holds a file descriptor, and the limit is "
                f"{soft} (raise it: ulimit -n, or LimitNOFILE= for a service)")
    return os.strerror(err)


def _reason(exc: OSError) -> str:
    return _strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))


def _loader_threads() -> int:
    """Threads for the CUDA programs loading while the command starts: every CPU but one,
    left to this process and the command (they are what a start-up waits for; the loads are
    not: ~10 ms on one thread, wanted ~0.3 s later)."""
    return max(1, (os.cpu_count() or 1) - 1)


#: The file descriptors this process's table is grown to at once (grow_fd_table): a PyTorch
#: start-up's probes, programs and maps hold ~450.
FD_TABLE_SLOTS = 1024


def grow_fd_table(slots: int = FD_TABLE_SLOTS) -> int:
    """Have the kernel make room for `slots` file descriptors now (up to the open files
    limit); the room there is then (FDSize). The kernel grows a process's table by doubling
    it (64, 128, 256, ... slots) as descriptors are opened, and in a process with threads
    each growth waits for an RCU grace period (expand_fdtable: 4-30 ms here): each probe is
    a descriptor, so three such waits fell in the holds of a traced PyTorch start-up. Grown
    at once before any thread starts, it waits for nothing. Never raises."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = (slots if soft == resource.RLIM_INFINITY else min(slots, soft)) - 1
    try:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            # The lowest free descriptor from `top` on: no open one is touched.
            os.close(fcntl.fcntl(null, fcntl.F_DUPFD_CLOEXEC, top))
        finally:
            os.close(null)
    except OSError as exc:
        log.debug("the fd table was not grown ahead: %s", exc)
    return _fd_table_size()


def _fd_table_size() -> int:
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"FDSize:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _raise_open_files_limit() -> bool:
    """Double the soft limit on open files, up to the hard one; whether it went up."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft * 2, 1024)
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if want <= soft:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError) as exc:
        log.debug("cannot raise the open files limit from %d: %s", soft, exc)
        return False
    log.debug("open files limit raised from %d to %d for the probes", soft, want)
    return True


def _release_in_background(cleanup: Callable[[], object]) -> None:
    """Run `cleanup` (which closes this process's probes, tracepoints and programs) cheaply:
    a detached grandchild holds a copy of every fd meanwhile, so that what the kernel does to
    release each one (a grace period per probe, ~50-100 ms) happens there, after we go on."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            if os.fork() == 0:
                # Holds every probe until our parent has closed its copies, so
                # that the last (costly) release happens here, then exits.
                with open("/proc/self/comm", "w") as comm:
                    comm.write(RELEASER_NAME)
                _let_go_of_stdio()  # a pipe reading our output is not kept open meanwhile
                os.close(write_end)
                os.read(read_end, 1)
                _close_all_at_once(keep=read_end)
        finally:
            os._exit(0)
    os.close(read_end)
    os.waitpid(child, 0)
    try:
        cleanup()  # cheap now: the grandchild still holds each probe
    finally:
        os.close(write_end)


def _let_go_of_stdio() -> None:
    """Point stdin, stdout and stderr at /dev/null: whoever reads gpuflight's output through
    a pipe (`gpuflight trace ... | tee`, a test's subprocess) would otherwise wait for the
    releaser too (~0.6 s after a PyTorch start-up)."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if null > 2:
            os.close(null)


def _close_all_at_once(keep: int) -> None:
    """Close every fd of this process but stdio and `keep`, many at a time: each release of a
    uprobe or tracepoint waits for its own grace period, and waits made together overlap
    (60 uprobe links: 3.4 s one after another, 0.16 s 32 at a time). Exiting would close them
    one after another."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return

    def close(fd: int) -> bool:
        with contextlib.suppress(OSError):
            os.close(fd)
        return True

    _together([fd for fd in fds if fd > 2 and fd != keep], close)


def _together(fds: list[int], release: Callable[[int], bool]) -> int:
    """`release` every fd, 32 at a time (a probe's release waits for a grace period of its
    own; waits made together overlap); how many failed."""
    from concurrent.futures import ThreadPoolExecutor

    if not fds:
        return 0
    with ThreadPoolExecutor(max_workers=min(32, len(fds))) as pool:
        return sum(1 for ok in pool.map(release, fds) if not ok)


class HttpProbes:
    """The HTTP capture (bpf/http_proto.bpf.c: syscall tracepoints on accepted TCP sockets),
    a program of its own beside the CUDA probes, compiled and kept as theirs is (an image in
    the cache folder: a server held at its first listen(2) waits ~0.1 s for it, not ~1.8 s).
    Its scope is the `http_pids` map, which the capture fills with the processes it captures
    (`watch`); connections a process accepted before it was watched are added from /proc,
    mid-stream (producer/httpconns.py)."""

    def __init__(self, settings: CaptureSettings) -> None:
        from producer import httpconns, httprecords
        from producer.btf import Btf, BtfError, socket_offsets

        self._settings = settings
        self._records = httprecords
        self._conns_mod = httpconns
        def walk() -> list[str]:
            try:
                return socket_offsets(Btf.from_file()).cflags()
            except (BtfError, OSError) as exc:
                log.info("HTTP capture without the socket walk (%s): the address family "
                         "decides", exc)
                return []

        source = settings.bpf_dir / "http_proto.bpf.c"
        if not source.is_file():
            raise SetupError(f"BPF source {source} is missing (set GPUFLIGHT_BPF_DIR)")
        cflags = [f"-I{settings.bpf_dir}", "-DGF_FILTER_PIDS=0",
                  *httprecords.head_cflags(httprecords.DEFAULT_HEAD)]
        image = program_image(source, cflags, settings.verdict_cache_dir, walk)
        self._bpf = bpfload.LoadedObject(image)  # attaches its tracepoints
        events = self._bpf.map("http_events")
        try:
            self._ring = RingBufferReader(events.fd, events.spec.max_entries)
        except BaseException:
            self._bpf.close()
            raise
        #: Records too short for their own header (never expected; counted).
        self.malformed = 0
        self._pids = self._bpf.map("http_pids")
        self._conns = self._bpf.map("http_conns")
        self._watched: set[int] = set()
        self._seed_ids = 0

    def watch(self, pids: Iterable[int]) -> None:
        """Capture the HTTP requests these processes serve, from now on."""
        for pid in pids:
            if pid in self._watched:
                continue
            self._watched.add(pid)
            self._pids.update(_U32.pack(pid), _ONE_BYTE)
            self._seed(pid)

    def _seed(self, pid: int) -> None:
        for conn in self._conns_mod.server_connections(self._settings.proc_root, pid):
            self._seed_ids += 1
            # Unique per host, never an accept's (those are monotonic ns since boot).
            conn_id = (1 << 63) | (pid << 24) | (self._seed_ids & 0xFFFFFF)
            key = _CONN_KEY.pack(pid, conn.fd)
            with contextlib.suppress(OSError):  # a full table: that connection goes unseen
                if self._conns.lookup(key) is None:
                    self._conns.update(key, self._conns_mod.seed_value(conn, conn_id))

    def unwatch(self, pid: int) -> None:
        """A process gone (or out of scope): its connections go with it."""
        self._watched.discard(pid)
        self._pids.delete(_U32.pack(pid))
        for key in self._conns:
            if _CONN_KEY.unpack(key)[0] == pid:
                self._conns.delete(key)

    @property
    def watched(self) -> frozenset[int]:
        return frozenset(self._watched)

    def drain(self) -> list[Any]:
        """Every HTTP record committed so far (httprecords.HttpRecord), oldest first."""
        records = []
        for raw in self._ring.drain_bytes():
            try:
                records.append(self._records.decode(raw))
            except self._records.RecordError:
                self.malformed += 1
        return records

    def drops(self) -> list[int]:
        """The `http_drops` slots (httprecords.DROP_*), summed over CPUs."""
        table = self._bpf.map("http_drops")
        return [sum(_U64.unpack(v)[0] for v in table.lookup_percpu(_U32.pack(slot)))
                for slot in range(self._records.SLOTS)]

    def close(self, background: bool = True) -> None:
        """Detach the tracepoints and free the program. Each tracepoint costs the kernel
        ~0.1 s to release (25 of them: 2.5 s): with `background`, a detached grandchild
        releases them (as for the probes) and we return at once."""
        with contextlib.suppress(Exception):
            self._ring.close()
        if background:
            _release_in_background(self._bpf.close)
        else:
            self._bpf.close()
