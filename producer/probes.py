"""Load the BPF program, attach it to library files, and read what it reports.

The only module that imports bcc. Attachment is once per library file (inode):
a uprobe on a file covers every process that maps it, now or later.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from producer import elfsyms
from producer.discover import RUNTIME_SYMBOLS, LibraryFile
from producer.errors import AttachError, SetupError
from producer.records import API_IDS, DROP_EVENTS, DROP_LOADER, LOADER_EVENT_DTYPE, WITH_RETURN
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
        self._bpf["loader_events"].open_ring_buffer(self._on_loader_event)
        self.ring = RingBufferReader(self._bpf["events"].map_fd, settings.ringbuf_bytes)
        self._scope = self._bpf["scope_pids"]

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
        functions = elfsyms.defined_functions(library.host_path, RUNTIME_SYMBOLS)
        if not functions:
            raise AttachError("defines none of the CUDA runtime functions we probe")
        probes = 0
        path = library.host_path.encode()
        for name in sorted(functions):
            if name not in API_IDS:
                continue
            try:
                self._bpf.attach_uprobe(
                    name=path, sym=name.encode(), fn_name=f"{name}_entry".encode()
                )
                probes += 1
                if name in WITH_RETURN:
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

    # -- scope ------------------------------------------------------------

    def add_to_scope(self, pids: Iterable[int]) -> None:
        one = self._scope.Leaf(1)
        for pid in pids:
            self._scope[self._scope.Key(pid)] = one

    def scope(self) -> set[int]:
        return {int(k.value) for k in self._scope}

    # -- reading ----------------------------------------------------------

    def poll_loader(self, timeout_s: float) -> list[LoaderEvent]:
        """Wait up to timeout_s for loader notifications (they wake us at once)."""
        self._bpf.ring_buffer_poll(max(0, int(timeout_s * 1000)))
        events, self._loader_events = self._loader_events, []
        return events

    def _on_loader_event(self, _ctx: Any, data: Any, size: int) -> None:
        raw = np.frombuffer(ctypes.string_at(data, size), dtype=LOADER_EVENT_DTYPE)[0]
        self._loader_events.append(LoaderEvent(int(raw["pid"]), bool(raw["held"])))

    def drops(self) -> DropCounts:
        table = self._bpf["drops"]
        totals = [sum(int(v) for v in table[table.Key(slot)]) for slot in range(3)]
        by_pid = {int(k.value): int(v.value) for k, v in self._bpf["drops_by_pid"].items()}
        return DropCounts(events=totals[DROP_EVENTS], loader=totals[DROP_LOADER], by_pid=by_pid)

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
