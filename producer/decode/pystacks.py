"""Python stacks in user space: a code object's name, file and line for an instruction
(symbolisation, once per (pid, code object)), and a walk of a thread's frames from its
process's memory with the layouts of producer/discover/pythons.py — the reference the
in-kernel walk (bpf/pywalk.bpf.h) is held to by the tests.

Line tables, by version: 3.9's `co_lnotab` (byte offsets), 3.10's `co_linetable` (PEP 626
ranges, code units), 3.11+'s location table (`co_linetable`, entries per code unit).
Every read is bounded and may fail (the process changes under us, or is gone): a failed read
is a frame or a name not known, never an exception out of here but `MemoryReadError` where
a caller asked to read.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Final, Protocol

from gpuflight.producer.discover.pythons import PyLayout, PythonRuntime

#: The deepest walk (frames), and the most bytes of a name or a line table read.
MAX_DEPTH: Final = 128
MAX_NAME_BYTES: Final = 1024
MAX_LINETABLE_BYTES: Final = 1 << 20
#: Threads of an interpreter looked through for the calling one.
MAX_THREADS: Final = 4096
#: A frame's owner when it is a shim on the C stack (3.12+), not Python code.
OWNED_BY_CSTACK: Final = 3


class MemoryReadError(Exception):
    """A read of another process's memory failed (an address not mapped, the process gone)."""


class Memory(Protocol):
    """What the walk and symbolisation read through (MemoryReadError when they cannot)."""

    def read(self, address: int, size: int) -> bytes: ...

    def u64(self, address: int) -> int: ...

    def i32(self, address: int) -> int: ...


class ProcessMemory:
    """Reads of a process's memory (/proc/PID/mem); a context manager."""

    def __init__(self, pid: int, proc_root: str = "/proc") -> None:
        self._fd = os.open(f"{proc_root}/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def read(self, address: int, size: int) -> bytes:
        try:
            data = os.pread(self._fd, size, address)
        except (OSError, OverflowError) as exc:
            raise MemoryReadError(f"{size} bytes at {address:#x}: {exc}") from None
        if len(data) != size:
            raise MemoryReadError(f"{size} bytes at {address:#x}: {len(data)} read")
        return data

    def u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")

    def i32(self, address: int) -> int:
        return int(struct.unpack("<i", self.read(address, 4))[0])

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> ProcessMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame as the walk finds it: its code object and where it is in it (the
    instruction pointer on 3.11+, f_lasti before)."""

    code: int
    instr: int


@dataclass(frozen=True, slots=True)
class Walk:
    frames: tuple[Frame, ...]  # innermost first
    truncated: bool


@dataclass(frozen=True, slots=True)
class CodeInfo:
    """What a code object says of itself."""

    qualname: str
    filename: str
    firstlineno: int
    linetable: bytes


@dataclass(frozen=True, slots=True)
class Located:
    """A frame, symbolised."""

    function: str
    filename: str
    line: int | None


# -- the walk -------------------------------------------------------------------------------


def thread_state(memory: Memory, runtime: PythonRuntime, tid: int,
                 thread_id: int | None = None) -> int | None:
    """The PyThreadState of thread `tid` (3.11+: by native thread id; 3.9/3.10: by
    `thread_id`, its pthread_self(), which the caller gives), in the first interpreter."""
    layout = runtime.layout
    interp = memory.u64(runtime.runtime_address + layout.runtime_interpreters_head)
    if not interp:
        return None
    tstate = memory.u64(interp + layout.interp_threads_head)
    for _ in range(MAX_THREADS):
        if not tstate:
            return None
        if layout.tstate_native_thread_id >= 0:
            if memory.u64(tstate + layout.tstate_native_thread_id) == tid:
                return tstate
        elif thread_id is not None and memory.u64(tstate + layout.tstate_thread_id) == thread_id:
            return tstate
        tstate = memory.u64(tstate + layout.tstate_next)
    return None


def walk(memory: Memory, layout: PyLayout, tstate: int,
         max_depth: int = MAX_DEPTH) -> Walk:
    """The frames of a thread, innermost first: at most `max_depth` (then `truncated`); a
    read that fails or a frame seen twice (a cycle) ends the walk, truncated."""
    if layout.tstate_cframe >= 0:
        cframe = memory.u64(tstate + layout.tstate_cframe)
        frame = memory.u64(cframe + layout.cframe_current_frame) if cframe else 0
    else:
        frame = memory.u64(tstate + layout.tstate_current_frame)
    frames: list[Frame] = []
    seen: set[int] = set()
    while frame:
        if len(frames) >= max_depth or frame in seen:
            return Walk(tuple(frames), truncated=True)
        seen.add(frame)
        try:
            if layout.frame_owner < 0 or (
                    memory.read(frame + layout.frame_owner, 1)[0] != OWNED_BY_CSTACK):
                code = memory.u64(frame + layout.frame_code)
                instr = (memory.u64(frame + layout.frame_instr) if layout.frames == "interpreter"
                         else memory.i32(frame + layout.frame_instr))
                frames.append(Frame(code, instr))
            frame = memory.u64(frame + layout.frame_previous)
        except MemoryReadError:
            return Walk(tuple(frames), truncated=True)
    return Walk(tuple(frames), truncated=False)


# -- symbolisation ------------------------------------------------------------------------------


def read_str(memory: Memory, layout: PyLayout, address: int) -> str:
    """A str object's text (compact ASCII, or compact UCS-1/2/4)."""
    state = memory.u64(address + layout.unicode_state) & 0xFFFFFFFF
    length = memory.u64(address + 16)
    kind, compact, ascii_only = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or kind not in (1, 2, 4):
        raise MemoryReadError(f"str at {address:#x} is not compact")
    if ascii_only:
        raw = memory.read(address + layout.unicode_ascii_data, min(length, MAX_NAME_BYTES))
        return raw.decode("ascii", "replace")
    count = min(length, MAX_NAME_BYTES // kind)
    raw = memory.read(address + layout.unicode_compact_data, count * kind)
    codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
    return raw.decode(codec, "replace")


def read_bytes(memory: Memory, layout: PyLayout, address: int) -> bytes:
    size = memory.u64(address + layout.bytes_size)
    if size > MAX_LINETABLE_BYTES:
        raise MemoryReadError(f"bytes at {address:#x}: {size} bytes, over the bound")
    return memory.read(address + layout.bytes_data, size)


def code_info(memory: Memory, layout: PyLayout, code: int) -> CodeInfo:
    name_at = layout.code_qualname if layout.code_qualname >= 0 else layout.code_name
    return CodeInfo(
        qualname=read_str(memory, layout, memory.u64(code + name_at)),
        filename=read_str(memory, layout, memory.u64(code + layout.code_filename)),
        firstlineno=memory.i32(code + layout.code_firstlineno),
        linetable=read_bytes(memory, layout, memory.u64(code + layout.code_linetable)))


def locate(layout: PyLayout, code: int, info: CodeInfo, instr: int) -> Located:
    """The frame's function, file and line (None where the table has no line for it)."""
    if layout.version >= (3, 11):
        unit = (instr - (code + layout.code_adaptive)) // 2
        line = line_of_locations(info.linetable, info.firstlineno, unit)
    elif layout.version == (3, 10):
        line = line_of_ranges(info.linetable, info.firstlineno, instr * 2)
    else:
        line = line_of_lnotab(info.linetable, info.firstlineno, instr)
    return Located(info.qualname, info.filename, line)


def line_of_lnotab(table: bytes, firstlineno: int, offset: int) -> int:
    """3.9: `co_lnotab`'s (bytecode increment, signed line increment) pairs; `offset` in
    bytes (f_lasti)."""
    line, address = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        address += table[i]
        if address > offset:
            break
        delta = table[i + 1]
        line += delta - 256 if delta >= 128 else delta
    return line


def line_of_ranges(table: bytes, firstlineno: int, offset: int) -> int | None:
    """3.10 (PEP 626): (bytes the range covers, signed line delta; -128: no line) pairs;
    `offset` in bytes."""
    line, start = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        end = start + table[i]
        delta = table[i + 1]
        no_line = delta == 0x80
        if not no_line:
            line += delta - 256 if delta >= 128 else delta
        if start <= offset < end:
            return None if no_line else line
        start = end
    return None


def _varint(table: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = table[at]
        at += 1
        value |= (byte & 63) << shift
        shift += 6
        if not byte & 64:
            return value, at


def _svarint(table: bytes, at: int) -> tuple[int, int]:
    value, at = _varint(table, at)
    return (-(value >> 1) if value & 1 else value >> 1), at


def line_of_locations(table: bytes, firstlineno: int, unit: int) -> int | None:
    """3.11+: the location table; `unit` the instruction's index in code units."""
    line, start, at = firstlineno, 0, 0
    while at < len(table):
        head = table[at]
        at += 1
        code, length = (head >> 3) & 15, (head & 7) + 1
        this: int | None
        if code == 15:  # no location
            this = None
        elif code == 14:  # long form: line delta, end line delta, column, end column
            delta, at = _svarint(table, at)
            line += delta
            this = line
            for _ in range(3):
                _, at = _varint(table, at)
        elif code == 13:  # no column
            delta, at = _svarint(table, at)
            line += delta
            this = line
        elif code >= 10:  # one line form: line delta code - 10, column, end column
            line += code - 10
            this = line
            at += 2
        else:  # short form: the same line, one byte of columns
            this = line
            at += 1
        if start <= unit < start + length:
            return this
        start += length
    return None
