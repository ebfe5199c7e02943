"""Load the BPF program, attach it to library files, and read what it reports.

The only module that imports bcc. Attachment is once per library file (inode):
a uprobe on a file covers every process that maps it, now or later.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from producer import elfsyms
from producer.discover import DRIVER_SYMBOLS, RUNTIME_SYMBOLS, LibraryFile
from producer.errors import AttachError, SetupError
from producer.records import (
    DRIVER_NAME_FUNCTIONS,
    DROP_EVENTS,
    DROP_LOADER,
    DROP_NAMES,
    DROP_SLOTS,
    FORWARDED,
    LOADER_EVENT_DTYPE,
    MAX_RUNTIME_RANGES,
    NAME_EVENT_DTYPE,
    NAME_WITH_RETURN,
    RUNTIME_NAME_FUNCTIONS,
    TEXT_RANGES_DTYPE,
    WITH_RETURN,
)
from producer.ringbuf import RingBufferReader
from producer.settings import CaptureSettings

log = logging.getLogger(__name__)

LOADER_SYMBOL = "_dl_debug_state"
#: Process name of the detached helper that releases probes after a capture.
RELEASER_NAME = "gpuflight-rel"


@dataclass(frozen=True)
class LoaderEvent:
    pid: int
    held: bool


@dataclass(frozen=True)
class DropCounts:
    events: int
    loader: int
    by_pid: dict[int, int] = field(default_factory=dict)
    names: int = 0
    #: Not lost: driver calls a probed runtime made for an operation recorded once already.
    forwarded: int = 0


# What each kind of library file is probed for: its API functions and name functions.
_PROBED: dict[str, frozenset[str]] = {
    "runtime": RUNTIME_SYMBOLS | RUNTIME_NAME_FUNCTIONS,
    "driver": DRIVER_SYMBOLS | DRIVER_NAME_FUNCTIONS,
}
_WITH_RETURN = WITH_RETURN | NAME_WITH_RETURN


@dataclass
class AttachedFile:
    library: LibraryFile
    probes: int
    functions: frozenset[str]


class Probes:
    """One compiled BPF program and the library files it is attached to."""

    def __init__(self, settings: CaptureSettings) -> None:
        try:
            from bcc import BPF  # the one bcc import
        except ImportError as exc:
            raise SetupError(
                f"bcc cannot be imported ({exc}): apt-get install python3-bpfcc"
            ) from exc
        self._settings = settings
        source = settings.bpf_dir / "cudart.bpf.c"
        if not source.is_file():
            raise SetupError(f"BPF source {source} is missing (set GPUFLIGHT_BPF_DIR)")
        try:
            self._bpf: Any = BPF(src_file=str(source).encode(), cflags=settings.cflags())
        except Exception as exc:
            raise SetupError(f"the BPF program did not compile or load: {exc}") from exc
        self.attached: dict[tuple[int, int], AttachedFile] = {}
        self.failed: dict[tuple[int, int], str] = {}
        self._loader_events: list[LoaderEvent] = []
        self._names: list[bytes] = []
        self._bpf[b"loader_events"].open_ring_buffer(self._on_loader_event)
        self._bpf[b"names"].open_ring_buffer(self._on_name)
        self._runtime_text = self._bpf[b"runtime_text"]
        self.ring = RingBufferReader(self._bpf[b"events"].map_fd, settings.ringbuf_bytes)
        self._scope = self._bpf[b"scope_pids"]

    # -- attaching --------------------------------------------------------

    def attach(self, library: LibraryFile) -> AttachedFile | None:
        """Attach to a library file once; a file that fails is logged once and skipped."""
        if library.key in self.attached:
            return self.attached[library.key]
        if library.key in self.failed:
            return None
        try:
            if library.kind == "loader":
                attached = self._attach_loader(library)
            else:
                attached = self._attach_runtime(library)
        except AttachError as exc:
            self.failed[library.key] = str(exc)
            log.warning("skipping %s: %s", library.path, exc)  # once per file
            return None
        self.attached[library.key] = attached
        log.debug("attached %d probes to %s (%s)", attached.probes, library.path, library.kind)
        return attached

    def _attach_runtime(self, library: LibraryFile) -> AttachedFile:
        """A runtime or driver file: its API functions and its name functions."""
        addresses = elfsyms.function_addresses(library.host_path, _PROBED[library.kind])
        functions = frozenset(addresses)
        if not functions & (RUNTIME_SYMBOLS | DRIVER_SYMBOLS):
            raise AttachError(f"defines none of the CUDA {library.kind} functions we probe")
        probes = 0
        path = library.host_path.encode()
        claimed: dict[int, str] = {}
        for name in sorted(functions):
            # Two names of one function (an alias) would fire two probes per call.
            if addresses[name] in claimed:
                log.debug("%s: %s is %s, probed once", library.path, name, claimed[addresses[name]])
                continue
            claimed[addresses[name]] = name
            try:
                self._bpf.attach_uprobe(
                    name=path, sym=name.encode(), fn_name=f"{name}_entry".encode()
                )
                probes += 1
                if name in _WITH_RETURN:
                    self._bpf.attach_uretprobe(
                        name=path, sym=name.encode(), fn_name=f"{name}_return".encode()
                    )
                    probes += 1
            except Exception as exc:
                raise AttachError(f"cannot attach to {name}: {exc}") from exc
        return AttachedFile(library, probes, functions)

    def _attach_loader(self, library: LibraryFile) -> AttachedFile:
        try:
            self._bpf.attach_uprobe(
                name=library.host_path.encode(),
                sym=LOADER_SYMBOL.encode(),
                fn_name=b"on_loader_change",
            )
        except Exception as exc:
            raise AttachError(f"cannot attach to {LOADER_SYMBOL}: {exc}") from exc
        return AttachedFile(library, 1, frozenset({LOADER_SYMBOL}))

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
        leaf = self._runtime_text.Leaf.from_buffer_copy(value.tobytes())
        self._runtime_text[self._runtime_text.Key(pid)] = leaf

    def forget_pid(self, pid: int) -> None:
        with contextlib.suppress(KeyError):
            del self._runtime_text[self._runtime_text.Key(pid)]

    # -- scope ------------------------------------------------------------

    def add_to_scope(self, pids: Iterable[int]) -> None:
        one = self._scope.Leaf(1)
        for pid in pids:
            self._scope[self._scope.Key(pid)] = one

    def scope(self) -> set[int]:
        return {int(k.value) for k in self._scope}

    def clear_scope(self) -> None:
        """No process is in scope any more: the probes record nothing and hold no one."""
        self._scope.clear()

    # -- reading ----------------------------------------------------------

    def poll_loader(self, timeout_s: float) -> list[LoaderEvent]:
        """Wait up to timeout_s for loader notifications (they wake us at once)."""
        self._bpf.ring_buffer_poll(max(0, int(timeout_s * 1000)))
        events, self._loader_events = self._loader_events, []
        return events

    def _on_loader_event(self, _ctx: Any, data: Any, size: int) -> None:
        raw = np.frombuffer(ctypes.string_at(data, size), dtype=LOADER_EVENT_DTYPE)[0]
        self._loader_events.append(LoaderEvent(int(raw["pid"]), bool(raw["held"])))

    def _on_name(self, _ctx: Any, data: Any, size: int) -> None:
        self._names.append(ctypes.string_at(data, size))

    def drain_names(self) -> npt.NDArray[np.void]:
        """Every name record committed so far (NAME_EVENT_DTYPE), oldest first.

        Drain the events ring first, then this: a launch is committed after the name
        record of its handle, so every launch drained has its name here."""
        self._bpf.ring_buffer_consume()
        raw, self._names = self._names, []
        size = NAME_EVENT_DTYPE.itemsize
        good = [r[:size] for r in raw if len(r) >= size]
        if not good:
            return np.empty(0, dtype=NAME_EVENT_DTYPE)
        return np.frombuffer(b"".join(good), dtype=NAME_EVENT_DTYPE).copy()

    def drops(self) -> DropCounts:
        table = self._bpf[b"drops"]
        totals = [sum(int(v) for v in table[table.Key(slot)]) for slot in range(DROP_SLOTS)]
        by_pid = {int(k.value): int(v.value) for k, v in self._bpf[b"drops_by_pid"].items()}
        return DropCounts(
            events=totals[DROP_EVENTS],
            loader=totals[DROP_LOADER],
            by_pid=by_pid,
            names=totals[DROP_NAMES],
            forwarded=totals[FORWARDED],
        )

    def close(self, background: bool = True) -> None:
        """Detach everything. Releasing a uprobe costs the kernel ~0.1 s (it waits
        for a grace period), one probe after another: with `background`, a
        detached grandchild that inherited the probes releases them, and we return
        at once."""
        self.ring.close()
        atexit.unregister(self._bpf.cleanup)
        if background:
            _release_in_background(self._bpf.cleanup)
        else:
            self._bpf.cleanup()


def _release_in_background(cleanup: Callable[[], None]) -> None:
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            if os.fork() == 0:
                # Holds every probe until our parent has closed its copies, so
                # that the last (costly) release happens here, then exits.
                with open("/proc/self/comm", "w") as comm:
                    comm.write(RELEASER_NAME)
                os.close(write_end)
                os.read(read_end, 1)
        finally:
            os._exit(0)
    os.close(read_end)
    os.waitpid(child, 0)
    cleanup()  # cheap now: the grandchild still holds each probe
    os.close(write_end)


class HttpProbes:
    """The HTTP capture (bpf/http_proto.bpf.c: syscall tracepoints on accepted TCP sockets),
    a program of its own beside the CUDA probes. Its scope is the `http_pids` map, which the
    capture fills with the processes it captures (`watch`); connections a process accepted
    before it was watched are added from /proc, mid-stream (producer/httpconns.py)."""

    def __init__(self, settings: CaptureSettings) -> None:
        from bcc import BPF

        from producer import httpconns, httprecords
        from producer.bpfsource import bundle
        from producer.btf import Btf, BtfError, socket_offsets

        self._settings = settings
        self._records = httprecords
        self._conns_mod = httpconns
        try:
            walk = socket_offsets(Btf.from_file()).cflags()
        except (BtfError, OSError) as exc:
            log.info("HTTP capture without the socket walk (%s): the address family decides",
                     exc)
            walk = []
        source = settings.bpf_dir / "http_proto.bpf.c"
        cflags = [f"-I{settings.bpf_dir}", "-DGF_FILTER_PIDS=0",
                  *httprecords.head_cflags(httprecords.DEFAULT_HEAD), *walk]
        try:
            self._bpf: Any = BPF(text=bundle(source).encode(), cflags=cflags)
        except SetupError:
            raise
        except Exception as exc:
            raise SetupError(f"the HTTP capture did not compile or load: {exc}") from exc
        self._pending: list[Any] = []
        #: Records too short for their own header (never expected; counted).
        self.malformed = 0
        self._bpf[b"http_events"].open_ring_buffer(self._on_record)
        self._pids = self._bpf[b"http_pids"]
        self._conns = self._bpf[b"http_conns"]
        self._watched: set[int] = set()
        self._seed_ids = 0

    def _on_record(self, _ctx: Any, data: Any, size: int) -> None:
        try:
            self._pending.append(self._records.decode(ctypes.string_at(data, size)))
        except self._records.RecordError:
            self.malformed += 1

    def watch(self, pids: Iterable[int]) -> None:
        """Capture the HTTP requests these processes serve, from now on."""
        one = self._pids.Leaf(1)
        for pid in pids:
            if pid in self._watched:
                continue
            self._watched.add(pid)
            self._pids[self._pids.Key(pid)] = one
            self._seed(pid)

    def _seed(self, pid: int) -> None:
        for conn in self._conns_mod.server_connections(self._settings.proc_root, pid):
            self._seed_ids += 1
            # Unique per host, never an accept's (those are monotonic ns since boot).
            conn_id = (1 << 63) | (pid << 24) | (self._seed_ids & 0xFFFFFF)
            key = self._conns.Key(pid, conn.fd)
            with contextlib.suppress(Exception):  # a full table: that connection goes unseen
                if key not in self._conns:
                    value = self._conns_mod.seed_value(conn, conn_id)
                    self._conns[key] = self._conns.Leaf.from_buffer_copy(value)

    def unwatch(self, pid: int) -> None:
        """A process gone (or out of scope): its connections go with it."""
        self._watched.discard(pid)
        with contextlib.suppress(KeyError):
            del self._pids[self._pids.Key(pid)]
        for key in [k for k in self._conns if int(k.pid) == pid]:
            with contextlib.suppress(KeyError):
                del self._conns[key]

    @property
    def watched(self) -> frozenset[int]:
        return frozenset(self._watched)

    def drain(self) -> list[Any]:
        """Every HTTP record committed so far (httprecords.HttpRecord), oldest first."""
        self._bpf.ring_buffer_consume()
        records, self._pending = self._pending, []
        return records

    def drops(self) -> list[int]:
        """The `http_drops` slots (httprecords.DROP_*), summed over CPUs."""
        table = self._bpf[b"http_drops"]
        return [sum(int(v) for v in table[table.Key(slot)])
                for slot in range(self._records.SLOTS)]

    def close(self) -> None:
        atexit.unregister(self._bpf.cleanup)
        self._bpf.cleanup()
