"""Code paths during a capture (issue 28, settings.stack_period): each process's CPython is
found by the first scan of it that shows it (a shared libpython is mapped after the exec a
traced command is first scanned at) and its layout handed to the kernel's walk; the samples
and stacks the kernel sends are taken each turn, after the turn's events, and each sample is
joined to its call's event (producer/decode/pysamples.py).

A stack's code objects are read from the process's memory, which its exit takes away. A turn
of the capture loop may take tens of ms (attaching a library's probes, reading its kernels'
names), as long as a short process lives: so a thread of its own (`gf-stacks`) reads each new
stack's code objects as its frames arrive (the kernel wakes it), and the turn names the stack
from what it read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.wire import PathRecord
from gpuflight.producer.decode.codepaths import PathFrame, PathSample
from gpuflight.producer.decode.kernels import KernelNames
from gpuflight.producer.decode.pysamples import StackSamples
from gpuflight.producer.decode.pystacks import ProcessMemory
from gpuflight.producer.discover.pythons import PyLayout, PythonRuntime, find_python
from gpuflight.producer.http.attribution import CallShares
from gpuflight.producer.probe.compile import thread_pointer_known
from gpuflight.producer.probe.probes import Probes, StackRate

log = logging.getLogger(__name__)


class PythonStacks:
    """The capture's side of code paths."""

    def __init__(self, probes: Probes, proc_root: Path, max_depth: int,
                 clock_offset_ns: int, kernels: KernelNames | None = None) -> None:
        self._probes = probes
        self._proc_root = proc_root
        self._runtimes: dict[int, PythonRuntime] = {}
        self._memories: dict[int, ProcessMemory] = {}
        #: What the sampler did, read at the end (Probes.stack_rate).
        self.rate = StackRate()
        #: Processes whose CPython was found but the kernel cannot walk (said once each).
        self.unwalkable: dict[int, str] = {}
        self._kernels = kernels
        self.samples = StackSamples(max_depth, self._memory, self._layout, clock_offset_ns,
                                    self._native if kernels is not None else None)
        probes.start_stacks()
        #: Held by the reader thread and the capture's while either reads a process's memory
        #: or its code objects (the caches of both, the processes' runtimes and memories).
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._kick = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # close() wakes it
        self._reader: threading.Thread | None = None
        fd = probes.stack_frames_fd()
        if fd is not None:
            self._reader = threading.Thread(target=self._read_ahead, args=(fd,),
                                            name="gf-stacks", daemon=True)
            self._reader.start()

    def _read_ahead(self, fd: int) -> None:
        """The stacks' reader: each new stack's code objects read as its frames arrive."""
        with select.epoll() as wake:
            wake.register(fd, select.EPOLLIN)
            wake.register(self._kick, select.EPOLLIN)
            while not self._stop.is_set():
                try:
                    wake.poll(1.0)
                    self.settle()
                except Exception as exc:  # a figure's name at worst: never the capture's end
                    log.debug("the stacks' reader: %s", exc)
                    if self._stop.wait(0.1):
                        return

    def settle(self) -> None:
        """Read the code objects of every new stack the kernel has sent: taken and read
        under one lock, so that once this returns, none sent before is left unread (a
        process held at its exit may go on, and free them)."""
        with self._lock:
            frames = self._probes.take_stack_frames()
            if len(frames):
                self.samples.read_codes(frames)

    def observe(self, pid: int) -> None:
        """A process scanned: its CPython, once found, is walked from then on (until then,
        and for a process that runs none, its calls get their native caller alone)."""
        if pid in self._runtimes or pid in self.unwalkable:
            return
        with self._lock:
            self._observe(pid)

    def _observe(self, pid: int) -> None:
        try:
            runtime = find_python(self._proc_root, pid)
        except Exception as exc:  # a file that cannot be read: native callers only
            log.debug("finding CPython in %d: %s", pid, exc)
            return
        if runtime is None:
            return
        # The kernel's BTF is read only once a 3.9/3.10 process needs it.
        if not runtime.walkable(runtime.layout.frames == "object" and thread_pointer_known()):
            version = ".".join(map(str, runtime.layout.version))
            self.unwalkable[pid] = version
            log.info("process %d runs CPython %s: its code paths are its native callers "
                     "(3.9/3.10 stacks need the kernel's BTF to say where a task keeps its "
                     "thread pointer)", pid, version)
            return
        self._runtimes[pid] = runtime
        self._probes.set_python(pid, runtime.offsets_record())

    def drain(self) -> None:
        """What the kernel sent since the last turn: new stacks symbolised now, samples
        waiting for their events (`add_events`)."""
        frames, heads = self._probes.drain_stacks()
        if len(frames):
            with self._lock:
                self.samples.add_frames(frames)
        if len(heads):
            self.samples.add_samples(heads)
        self.samples.end_turn()

    def finish(self) -> None:
        """At the end of the capture, before the probes close: every busy span ends, every
        sample is priced, and what the bound on walks did is read (`rate`)."""
        self.samples.finish()
        try:
            self.rate = self._probes.stack_rate()
        except OSError as exc:  # a figure for the summary: never worth the capture's end
            log.warning("the stack sampler's rate could not be read: %s", exc)

    def add_events(self, events: npt.NDArray[np.void], calls: CallShares | None = None) -> None:
        """A drained batch, enriched: what the sampled calls among it cost (`calls`: the
        requests its events were made for, when HTTP is captured)."""
        self.samples.add_events(events, calls)

    def forget(self, pids: Iterable[int]) -> None:
        for pid in pids:
            with self._lock:
                self._runtimes.pop(pid, None)
                self.unwalkable.pop(pid, None)
                memory = self._memories.pop(pid, None)
                if memory is not None:
                    memory.close()
                self.samples.forget(pid)
            with contextlib.suppress(OSError):
                self._probes.forget_python(pid)

    def take_paths(self) -> dict[int, list[PathRecord]]:
        """Per process, its code paths since the last take (once `samples.publish()`)."""
        return self.samples.take_paths()

    def paths(self, usd_per_gpu_hour: float | None = None) -> list[PathSample]:
        """The code paths of the capture (at its end), priced where a price is known."""
        return self.samples.samples(usd_per_gpu_hour)

    def close(self) -> None:
        self._stop.set()
        if self._reader is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(self._kick, 1)
            self._reader.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._kick)
        with self._lock:
            for memory in self._memories.values():
                memory.close()
            self._memories.clear()

    def _native(self, pid: int, address: int) -> PathFrame:
        """A call's native caller as a frame: its function (short name) in its library."""
        assert self._kernels is not None
        name, file = self._kernels.code_at(pid, address)
        library = os.path.basename(file) if file else ""
        # No symbol covers it: named by address in its library ("+0x6f7a (libffi.so.8)").
        function = name.short.removeprefix(library) if library else name.short
        return PathFrame(function, library, None)

    def _layout(self, pid: int) -> PyLayout | None:
        runtime = self._runtimes.get(pid)
        return runtime.layout if runtime is not None else None

    def _memory(self, pid: int) -> ProcessMemory | None:
        memory = self._memories.get(pid)
        if memory is None:
            try:
                memory = self._memories[pid] = ProcessMemory(pid, str(self._proc_root))
            except OSError:
                return None
        return memory
