"""The in-kernel walk's samples (bpf/pywalk.bpf.h) → code paths: each stack symbolised once,
when its frames arrive (ring `py_frames`, before its first sample's head) — the process may
be gone by the end of a trace — and each sample's head (ring `py_samples`) counted with its
weight. A head read before its stack's frames (the rings are read one after the other) waits
for them, bounded.

A code object is read once per (pid, address), and revalidated when a new stack holds that
address again: its name, file and first line's pointers are read back (one read) and compared,
so that an address a freed code object left and a new one took is not given the old name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from gpuflight.producer.contract.abi import (
    PY_NEW,
    PY_NO_PYTHON,
    PY_NO_THREAD,
    PY_TRUNCATED,
    py_head_dtype,
    py_stack_dtype,
)
from gpuflight.producer.decode.codepaths import PathFrame, PathSample
from gpuflight.producer.decode.pystacks import (
    CodeInfo,
    Memory,
    MemoryReadError,
    code_info,
    locate,
)
from gpuflight.producer.discover.pythons import PyLayout

log = logging.getLogger(__name__)

#: Flags of a sample (bpf/pywalk.bpf.h).
TRUNCATED: Final = PY_TRUNCATED
NO_THREAD: Final = PY_NO_THREAD
NEW: Final = PY_NEW
NO_PYTHON: Final = PY_NO_PYTHON
#: Heads kept while their stack's frames are not read yet (more are counted unknown).
MAX_WAITING: Final = 100_000
#: The frame a truncated stack is rooted at, and the one of a thread not running Python.
CUT: Final = PathFrame("[truncated]", "", None)
NO_FRAMES: Final = PathFrame("[no Python frames]", "", None)
UNKNOWN: Final = PathFrame("[unknown code]", "", None)


def head_dtype() -> np.dtype[np.void]:
    return py_head_dtype()


def stack_dtype(max_depth: int) -> np.dtype[np.void]:
    return py_stack_dtype(max_depth)


@dataclass
class _Code:
    fingerprint: bytes
    info: CodeInfo


@dataclass
class _Stack:
    frames: tuple[PathFrame, ...]
    values: dict[str, float] = field(default_factory=dict)


class StackSamples:
    """Samples in, code paths out. `memory(pid)` opens a process's memory (None: gone);
    `layout(pid)` is the process's layout (what its offsets in the kernel came from)."""

    def __init__(self, max_depth: int, memory: Callable[[int], Memory | None],
                 layout: Callable[[int], PyLayout | None]) -> None:
        self._head = head_dtype()
        self._whole = stack_dtype(max_depth)
        self._memory = memory
        self._layout = layout
        self._codes: dict[tuple[int, int], _Code] = {}
        self._stacks: dict[int, _Stack] = {}
        self._waiting: dict[int, list[float]] = {}
        self._waiting_count = 0
        #: Samples whose stack's frames never came (lost, or over MAX_WAITING): counted here.
        self.unknown_stacks = 0

    def add_frames(self, records: Any) -> None:
        """Records of `py_frames` (a stack's first sample, with its frames): symbolised now."""
        for whole in np.atleast_1d(records):
            stack_id = int(whole["stack_id"])
            stack = self._stacks.get(stack_id)
            if stack is None:
                stack = self._stacks[stack_id] = _Stack(self._symbolise(whole))
            for weight in self._waiting.pop(stack_id, ()):
                self._waiting_count -= 1
                stack.values["launches"] = stack.values.get("launches", 0.0) + weight

    def add_samples(self, heads: Any) -> None:
        """Records of `py_samples` (every sample's head)."""
        for head in np.atleast_1d(heads):
            stack_id, weight = int(head["stack_id"]), float(head["weight"])
            stack = self._stacks.get(stack_id)
            if stack is not None:
                stack.values["launches"] = stack.values.get("launches", 0.0) + weight
            elif self._waiting_count < MAX_WAITING:
                self._waiting.setdefault(stack_id, []).append(weight)
                self._waiting_count += 1
            else:
                self.unknown_stacks += 1

    def add(self, raw: bytes) -> None:
        """One record of either ring, told apart by its size."""
        if len(raw) >= self._whole.itemsize:
            self.add_frames(np.frombuffer(raw, self._whole, count=1))
        else:
            self.add_samples(np.frombuffer(raw, self._head, count=1))

    def samples(self) -> list[PathSample]:
        """The code paths so far; heads still waiting for their frames are counted unknown
        (call at the end, once both rings are read)."""
        self.unknown_stacks += self._waiting_count
        self._waiting.clear()
        self._waiting_count = 0
        return [PathSample(s.frames, dict(s.values)) for s in self._stacks.values()]

    def _symbolise(self, whole: Any) -> tuple[PathFrame, ...]:
        pid, flags, depth = int(whole["pid"]), int(whole["flags"]), int(whole["depth"])
        if flags & (NO_THREAD | NO_PYTHON):
            return (NO_FRAMES,)
        layout = self._layout(pid)
        memory = self._memory(pid) if layout is not None else None
        frames: list[PathFrame] = []
        for code, instr in zip(whole["code"][:depth], whole["instr"][:depth], strict=True):
            if not code:  # a shim frame (owned by the C stack)
                continue
            if layout is None or memory is None:
                frames.append(UNKNOWN)
                continue
            info = self._code(memory, layout, pid, int(code))
            if info is None:
                frames.append(UNKNOWN)
                continue
            where = locate(layout, int(code), info, int(instr))
            frames.append(PathFrame(where.function, where.filename, where.line))
        if flags & TRUNCATED:
            frames.append(CUT)
        return tuple(reversed(frames))  # root first

    def _code(self, memory: Memory, layout: PyLayout, pid: int, code: int) -> CodeInfo | None:
        """The code object at `code`: from the cache if its fingerprint still matches."""
        try:
            fingerprint = _fingerprint(memory, layout, code)
            known = self._codes.get((pid, code))
            if known is not None and known.fingerprint == fingerprint:
                return known.info
            info = code_info(memory, layout, code)
        except MemoryReadError as exc:
            log.debug("code object %#x of %d: %s", code, pid, exc)
            return None
        self._codes[pid, code] = _Code(fingerprint, info)
        return info

    def forget(self, pid: int) -> None:
        """A process exited: its code objects' addresses mean nothing any more."""
        for key in [k for k in self._codes if k[0] == pid]:
            del self._codes[key]


def _fingerprint(memory: Memory, layout: PyLayout, code: int) -> bytes:
    """What tells one code object from another at the same address: the pointers to its
    name and file, and its first line (one read of the span that holds them)."""
    fields = [layout.code_filename, layout.code_name, layout.code_firstlineno]
    if layout.code_qualname >= 0:
        fields.append(layout.code_qualname)
    start, end = min(fields), max(fields) + 8
    raw = memory.read(code + start, end - start)
    return b"".join(raw[f - start:f - start + (4 if f == layout.code_firstlineno else 8)]
                    for f in fields)
