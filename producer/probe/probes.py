"""Load the BPF program, attach it to library files, and read what it reports.

The program is compiled (or read from the cache) by compile.py, and loaded by bpfload.py,
which also reads its maps. The uprobes are attached here, a BPF uprobe_multi link each
(uprobes.py: why not bcc's attach_uprobe, and why not the uprobe PMU where the kernel has those
links, is told there). Attachment is once per library file (inode): a uprobe on a file covers
every process that maps it, now or later.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import mmap
import os
import select
import struct
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.abi import (
    AGG_KEY_DTYPE,
    AGG_STATE_DTYPE,
    AGG_VALUE_DTYPE,
    AGGREGATE_DTYPE,
    AGGREGATED,
    COOKIE_STEPPED,
    DROP_EVENTS,
    DROP_LOADER,
    DROP_NAMES,
    DROP_PY_SAMPLES,
    DROP_SLOTS,
    EVENT_DTYPE,
    FILE_ID_DTYPE,
    FORWARDED,
    LOADER_EVENT_DTYPE,
    LOADER_EXIT,
    LOADER_LISTEN,
    LOADER_MAPPED,
    MAX_RUNTIME_RANGES,
    NAME_EVENT_DTYPE,
    PROBES,
    QUIET_LOADS,
    STEPPED,
    TEXT_RANGES_DTYPE,
    Probe,
    py_head_dtype,
    py_stack_dtype,
)
from gpuflight.producer.contract.errors import AttachError, SetupError
from gpuflight.producer.discover import attachplan
from gpuflight.producer.discover.attachplan import LOADER_SYMBOL
from gpuflight.producer.discover.procmaps import DRIVER_SYMBOLS, RUNTIME_SYMBOLS, LibraryFile
from gpuflight.producer.probe import bpfload
from gpuflight.producer.probe.compile import kernel_cflags, program_image
from gpuflight.producer.probe.cpubuffers import CpuBuffers, MergedEvents
from gpuflight.producer.probe.fds import grow_fd_table, release_in_background, together
from gpuflight.producer.probe.ringbuf import RingBufferReader
from gpuflight.producer.probe.uprobes import FILE_ERRNOS, UprobeLinks, Uprobes, reason
from gpuflight.producer.settings import CaptureSettings

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class LoaderEvent:
    pid: int
    held: bool
    #: CLOCK_MONOTONIC (time.monotonic_ns) when the probe saw the change (and held the process).
    ts_ns: int = 0
    #: Why (abi.LOADER_MAPPED: a change of what the process maps; LOADER_LISTEN: a first
    #: listen(2); LOADER_EXIT: a walked Python process exits).
    reason: int = LOADER_MAPPED

    @property
    def listen(self) -> bool:
        return self.reason == LOADER_LISTEN

    @property
    def exiting(self) -> bool:
        return self.reason == LOADER_EXIT


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
    #: Code paths: samples (or new stacks' frames) lost, their ring full.
    py_samples: int = 0


# What each kind of library file is probed for: its API functions and name functions.
_PROBED = attachplan.PROBED
_PROBE_ROWS: dict[str, Probe] = {p.name: p for p in PROBES}
#: The kinds of file whose loss costs the user CUDA calls (a loader's costs only timeliness).
CUDA_KINDS = frozenset({"runtime", "driver"})
#: The kinds of file probed for code paths alone (procmaps.HOOK_KINDS), and their program.
_HOOK_PROGRAMS: Mapping[str, str] = MappingProxyType(
    {"autograd": "gf_backward_enter", "exit": "gf_exit_hold"})


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


@dataclass(frozen=True)
class StackRate:
    """What the stack sampler did (bpf/cudart.bpf.c struct gf_py_rate, over every CPU)."""

    #: The highest period a CPU came to, and how many times a CPU's period doubled (for the
    #: bound on walks, or the cost budget).
    peak: int = 0
    raised: int = 0
    #: Recorded calls the sampler saw, walks made, and the ns the kernel timed them at.
    calls: int = 0
    walks: int = 0
    spent_ns: int = 0
    #: Of those walks, the first of each new stack (its frames sent with it): a one-off cost
    #: each, which the rate does not follow (bpf/cudart.bpf.c gf_py_timed).
    new_walks: int = 0
    new_spent_ns: int = 0

    @property
    def known_walks(self) -> int:
        """Walks of stacks already known: the ones the cost budget keeps to."""
        return self.walks - self.new_walks

    @property
    def known_spent_ns(self) -> int:
        return self.spent_ns - self.new_spent_ns


_U32 = struct.Struct("<I")
#: struct gf_py_rate (bpf/cudart.bpf.c): left, drawn, period, walks, window, peak, raised,
#: spent, timed, calls, spent_total, calls_total, walks_total, the window's own counts, then
#: fresh_spent_total, fresh_walks_total.
_PY_RATE = struct.Struct("<IIIIQIIQIIQQQQQQQQ")
_U64 = struct.Struct("<Q")
_ONE_BYTE = b"\x01"
#: The tally's maps (bpf/cudart.bpf.c: BPF_TABLE_PINNED), pinned in settings.tally_dir.
TALLY_PINNED = ("committed", "settled")
#: Maps only the CUDA API programs use (this process reads them once those may have run, or
#: waits for them): made with those programs, on the loader thread, while the command starts
#: (~20 ms of the kernel's: the rings' 48 MiB and the tables' entries are allocated up front).
LATER_MAPS = frozenset({"events", "names", "inflight", "ctx_device", "runtime_text",
                        "aggregates", "ring_share", "cpu_events", "cpu_heads"})


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
                              lambda: kernel_cflags(settings))
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
        #: The events ring's (LATER_MAPS), made at its first use (`ring`), and with it the
        #: per-CPU buffers' reader (settings.cpu_slots) and the two merged.
        self._events_ring: RingBufferReader | None = None
        self._cpu_buffers: CpuBuffers | None = None
        self._merged: MergedEvents | None = None
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
        #: The code paths' rings (start_stacks), when stacks are sampled.
        self._py_frames: RingBufferReader | None = None
        self._py_samples: RingBufferReader | None = None
        self._py_lock = threading.Lock()
        self._py_moved: list[npt.NDArray[np.void]] = []

    def drain_events(self, max_events: int | None = None,
                     everything: bool = False) -> npt.NDArray[np.void]:
        """The events committed so far (EVENT_DTYPE; from the ring up to `max_events`), in
        each thread's order. With the per-CPU buffers, the latest may wait for the next drain
        (producer/probe/cpubuffers.py); `everything` (at the end) takes those too. None
        before the loader thread has made the ring: no CUDA program can have run then."""
        if self._events_ring is None and not self._bpf.made("events"):
            return np.empty(0, dtype=EVENT_DTYPE)
        ring = self.ring
        if self._merged is not None:
            return self._merged.drain(max_events, everything)
        return ring.drain(max_events)

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
            ring = RingBufferReader(events.fd, self._settings.ringbuf_bytes)
            if self._settings.cpu_buffers:
                self._cpu_buffers = CpuBuffers.open(self._bpf.map("cpu_events").fd,
                                                    self._bpf.map("cpu_heads").fd,
                                                    self._settings.ncpus,
                                                    self._settings.cpu_slots)
                self._merged = MergedEvents(ring, self._cpu_buffers)
                self._merged.start_moving()
            self._events_ring = ring
        return self._events_ring

    # -- code paths (issue 28, settings.stack_period) -------------------------------------

    def start_stacks(self) -> None:
        """Put the walker in its program array and set the period: from then on one recorded
        call in `stack_period` ends in a walk of its caller's Python stack (bpf/cudart.bpf.c).
        SetupError if the kernel refuses the walker (the capture cannot sample then)."""
        period = self._settings.stack_period
        if period is None:
            return
        try:
            fd = self._bpf.program("gf_py_walker", self._program_type,
                                   self._uprobes.attach_type)
            self._bpf.map("py_walker").update(_U32.pack(0), _U32.pack(fd))
        except OSError as exc:
            raise SetupError(f"the Python stack walker did not load: {exc}") from exc
        budget = self._settings.stack_budget_ns
        config = self._bpf.map("py_config")
        config.update(_U32.pack(0), _U32.pack(max(1, period)))
        # Per window of 2^30 ns, as the kernel counts them; none when every call is asked for.
        walks = self._settings.stack_max_walks if period > 1 or budget else 0
        config.update(_U32.pack(1), _U32.pack(min(math.ceil(walks * (1 << 30) / 1e9), 2**32 - 1)))
        config.update(_U32.pack(2), _U32.pack(min(budget, 2**32 - 1)))
        depth = self._settings.stack_depth
        ring_bytes = self._settings.stack_ring_pages * mmap.PAGESIZE
        self._py_frames = RingBufferReader(self._bpf.map("py_frames").fd, ring_bytes,
                                           py_stack_dtype(depth))
        self._py_samples = RingBufferReader(self._bpf.map("py_samples").fd, ring_bytes,
                                            py_head_dtype())

    def set_python(self, pid: int, offsets: bytes) -> None:
        """Process `pid`'s CPython layout (struct gf_py_offsets): its calls' stacks are
        walked from now on; a process without one gets its native caller alone."""
        self._bpf.map("py_procs").update(_U32.pack(pid), offsets)

    def forget_python(self, pid: int) -> None:
        if self._settings.stack_period is not None:
            self._bpf.map("py_procs").delete(_U32.pack(pid))

    def stack_rate(self) -> StackRate:
        """What the sampler did, summed over the CPUs (all 0 when not sampling)."""
        if self._py_samples is None:
            return StackRate()
        peak = raised = calls = walks = spent = new_walks = new_spent = 0
        for raw in self._bpf.map("py_rate").lookup_percpu(_U32.pack(0)):
            fields = _PY_RATE.unpack_from(raw)
            peak, raised = max(peak, fields[5]), raised + fields[6]
            spent, calls, walks = spent + fields[10], calls + fields[11], walks + fields[12]
            new_spent, new_walks = new_spent + fields[16], new_walks + fields[17]
        return StackRate(peak, raised, calls, walks, spent, new_walks, new_spent)

    def drain_stacks(self) -> tuple[npt.NDArray[np.void], npt.NDArray[np.void]]:
        """(new stacks' frames, every sample's head) committed so far: the frames first, so
        that a head's stack is known when the head is read (one read after the other: a
        head may still come before its frames; producer/decode/pysamples.py waits)."""
        if self._py_frames is None or self._py_samples is None:
            return np.zeros(0, py_stack_dtype(1)), np.zeros(0, py_head_dtype())
        self.take_stack_frames()
        with self._py_lock:
            moved, self._py_moved = self._py_moved, []
        frames = (np.zeros(0, py_stack_dtype(self._settings.stack_depth)) if not moved else moved[0]
                  if len(moved) == 1 else np.concatenate(moved))
        return frames, self._py_samples.drain(None)

    def stack_frames_fd(self) -> int | None:
        """What to wait on for new stacks' frames (the kernel wakes it for each, once the
        reader has caught up); None when not sampling."""
        return None if self._py_frames is None else self._py_frames.fileno()

    def take_stack_frames(self) -> npt.NDArray[np.void]:
        """Move the new stacks' frames the ring holds out of it (either thread: the stacks'
        reader reads their code objects at once; drain_stacks hands them on); what it moved."""
        with self._py_lock:
            if self._py_frames is None:
                return np.zeros(0, py_stack_dtype(1))
            batch = self._py_frames.drain(None)
            if len(batch):
                self._py_moved.append(batch)
            return batch

    @property
    def event_sources(self) -> tuple[int, int]:
        """Events drained so far from the per-CPU buffers and from the ring."""
        merged = self._merged
        return (merged.from_cpus, merged.from_ring) if merged is not None else (0, 0)

    def take_ring_fill_max(self) -> float:
        """The fullest (0..1) a drain found the events ring since the last call; 0 before
        the ring is made."""
        return 0.0 if self._events_ring is None else self._events_ring.take_fill_max()

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
                elif library.kind in _HOOK_PROGRAMS:
                    attached = self._attach_hook(library, path, fds)
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
                    raise AttachError(f"cannot attach to {name}: {reason(exc)}",
                                      exc.errno) from exc
                first_errno = first_errno if first_errno is not None else exc.errno
                unprobed[name] = reason(exc)
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
            raise AttachError(f"cannot attach to {LOADER_SYMBOL}: {reason(exc)}",
                              exc.errno) from exc
        return AttachedFile(library, 1, frozenset({LOADER_SYMBOL}))

    def _attach_hook(self, library: LibraryFile, path: str, fds: list[int]) -> AttachedFile:
        """A file probed for code paths alone (the programs exist only while stacks are
        walked): PyTorch's autograd engine (libtorch_cpu.so), where a backward pass starts, so
        that the calls its device threads make are walked from the stack that entered it; or
        where a process exits (libc's _exit, CPython's Py_FinalizeEx), where `trace` holds a
        walked process until its new stacks' code objects are read."""
        if self._settings.stack_period is None:
            raise AttachError(f"probed only for code paths (--stacks): {library.kind}")
        plan = _plan(library, path)
        offsets = {name: offset for name, offset in plan.offsets if offset is not None}
        if not offsets:
            raise AttachError("defines none of its functions within its loaded segments")
        program = self._program(_HOOK_PROGRAMS[library.kind])
        claimed: set[int] = set()
        unprobed: dict[str, str] = {}
        first_errno: int | None = None
        for name, offset in sorted(offsets.items()):
            if offset in claimed:  # an alias: one probe
                continue
            try:
                fds.append(self._uprobes.attach(program, path, offset, retprobe=False))
            except OSError as exc:
                if exc.errno in FILE_ERRNOS:
                    raise AttachError(f"cannot attach to {name}: {reason(exc)}",
                                      exc.errno) from exc
                first_errno = first_errno if first_errno is not None else exc.errno
                unprobed[name] = reason(exc)  # its file's other function is probed still
                continue
            claimed.add(offset)
        if not claimed:
            raise AttachError(f"none of its functions could be probed ({unprobed})", first_errno)
        return AttachedFile(library, len(claimed), frozenset(offsets) - unprobed.keys(),
                            unprobed, stepped=plan.stepped - unprobed.keys())

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
                first = first or reason(exc)
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
        failed = together(fds, lambda fd: self._detach([fd]) == 0)
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
        processes are held (trace); None elsewhere. producer/probe/holdguard.py reads it."""
        return self._bpf.maps.get("holds")

    @property
    def scope_map(self) -> bpfload.BpfMap:
        """`scope_pids`, the processes in scope: the holds' watchdog empties it when the tracer
        dies (producer/probe/holdguard.py)."""
        return self._scope

    # -- reading ----------------------------------------------------------

    def poll_loader(self, timeout_s: float) -> list[LoaderEvent]:
        """Wait up to timeout_s for loader notifications (they wake us at once)."""
        if timeout_s > 0 and not self._loader_ring.pending_bytes():
            with contextlib.suppress(InterruptedError):
                self._wake.poll(timeout_s)
        raw = self._loader_ring.drain()
        return [LoaderEvent(int(r["pid"]), bool(r["held"]), int(r["ts_ns"]), int(r["reason"]))
                for r in raw]

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
            py_samples=totals[DROP_PY_SAMPLES],
        )

    # -- the tally (producer/publish/deadagents.py): node agent with Kafka only
    # ----------------------

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
        if self._merged is not None:
            self._merged.close()
            log.debug("events read: %d from the per-CPU buffers, %d from the ring",
                      *self.event_sources)
        for ring in (self._events_ring, self._loader_ring, self._names_ring, self._cpu_buffers):
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
            release_in_background(release)
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


def _loader_threads() -> int:
    """Threads for the CUDA programs loading while the command starts: every CPU but one,
    left to this process and the command (they are what a start-up waits for; the loads are
    not: ~10 ms on one thread, wanted ~0.3 s later)."""
    return max(1, (os.cpu_count() or 1) - 1)
