"""Which functions an ELF file defines, fast enough to ask of every mapped file on a node,
and safe to ask of any file a user can map.

Pure: reads files, imports no bcc. A question about symbols is answered from .dynsym and
.symtab together, so a runtime linked statically into an executable or into another shared
object (where its symbols are only in .symtab) is found as well as libcudart.so itself.

Files are read with os.pread, never mapped (a file truncated under an mmap would kill the
reader with SIGBUS), and parsed with struct and numpy: headers with struct, symbol tables as
numpy structured arrays decoded in bulk. The string tables are searched for the wanted names
before any symbol is looked at, and only the symbols whose st_name points at a hit are
decoded: a 500 MB libtorch_cuda.so that is not a runtime costs one pass over its string
tables (about 0.3 s), and a 48 MB .symtab of 2 million symbols one vectorised pass more.

Every size and offset a file states is checked before anything is read, and what one
question may read of a file is bounded whatever the file says (issue 25): a table larger than
MAX_SECTION_BYTES, or outside the file, is not read (the file's other tables still answer);
all the tables one question reads add up to at most MAX_FILE_BYTES and the file's size; and a
table read past the bytes the file has on disk (st_blocks * 512, after a first
_UNCHECKED_BYTES) is read only if the kernel reports no hole in it (SEEK_HOLE): a sparse file
whose headers claim four tables of a GiB each, a few KB on disk, is refused before a byte of
them is read, where the same reads of a file on a compressing or late-counting file system
(ZFS) go ahead. A refused file defines nothing, with one warning per file. Tables are read
in pieces of _CHUNK_BYTES, so memory follows the piece, not what a header claims.

A file that is not ELF, is truncated, lies about its layout or cannot be read defines nothing
(or what its sound tables say): these functions never raise because of a file. Answers are
cached by file identity (st_dev, st_ino, st_size, st_mtime_ns).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_SECTION_BYTES",
    "clear_cache",
    "defined_functions",
    "file_offset_to_vaddr",
    "function_addresses",
    "function_extents",
    "interpreter",
    "local_statics",
    "referenced_functions",
    "symbol_address",
    "symbol_at",
    "vaddr_to_file_offset",
]

#: The largest section read (a string or symbol table): a table said to be larger is not
#: read. The largest real ones (libtorch_cuda.so's .strtab) are tens of MB (74).
MAX_SECTION_BYTES = 1 << 30
#: The most one question reads of a file, all its tables together, and keeps of them (it
#: reads no more than the file's size either): the largest real question, libtorch_cpu.so's
#: __handle statics, reads 98 MB.
MAX_FILE_BYTES = 1 << 29
#: What one question may read of a file without asking the kernel whether those bytes are on
#: disk; past it, and past the file's allocated blocks, a table holding a hole is refused.
_UNCHECKED_BYTES = 1 << 24
#: Tables are read in pieces of at most this many bytes.
_CHUNK_BYTES = 1 << 23
#: The most bytes of section or of program headers read (2**18 section headers: the ELF
#: extension allows 2**32).
_MAX_HEADER_BYTES = 1 << 24
#: The most executable or relocation sections searched for references (a real file has a few).
_MAX_SECTIONS_SCANNED = 1 << 10
#: The most places a string table may hold a wanted name at (a real one: once or twice each).
_MAX_NAME_HITS = 1 << 16
#: The most executable code searched for references (referenced_functions).
_MAX_CODE_SCANNED = 1 << 28
#: Code is searched in chunks of this many bytes: the arrays of one chunk stay in the CPU's
#: cache and are reused from the allocator, where a chunk of 4 MB cost page faults (a 2.5 MB
#: .text took 8 ms of them).
_CODE_CHUNK = 1 << 16
#: 0, 1, 2, ... for each byte of a chunk.
_CHUNK_OFFSETS = np.arange(_CODE_CHUNK, dtype=np.uint32)
#: The longest symbol name read back by symbol_at (C++ template kernels run to a few KB).
_MAX_NAME_BYTES = 1 << 16

_CACHE_SIZE = 4096

# Names are grouped by this many leading characters, so each group's pattern starts with a
# literal that the regex engine can skip to (the CUDA names all share "cuda").
_PREFIX_LEN = 2
#: ... and a name's characters after its group's common prefix that a match must begin with.
_NEXT_LEN = 3
_IDENTIFIER = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Definition:
    value: int
    is_function: bool
    size: int = 0  # st_size


def defined_functions(
    path: str, wanted: frozenset[str], unless_imported: frozenset[str] = frozenset()
) -> frozenset[str]:
    """The names in `wanted` that `path` defines as functions (name@VER counts as name).

    `unless_imported`: names whose import shows that the file links them from another
    file. If .dynsym imports one of them (an undefined symbol of that name), .symtab is
    not read: what is only there (a copy linked in statically, its symbols local) cannot
    hold them, or the static linker would have resolved the import against it. Only
    .dynsym's definitions are then answered."""
    found = _definitions(path, wanted, unless_imported)
    return frozenset(name for name, d in found.items() if d.is_function)


def function_addresses(path: str, wanted: frozenset[str]) -> dict[str, int]:
    """st_value of each function in `wanted` that `path` defines (one read for all names)."""
    found = _definitions(path, wanted)
    return {name: d.value for name, d in found.items() if d.is_function}


def function_extents(path: str, wanted: frozenset[str]) -> dict[str, tuple[int, int]]:
    """(st_value, st_size) of each function in `wanted` that `path` defines: where its code
    starts and how many bytes it has (0: not known). The same read as function_addresses."""
    found = _definitions(path, wanted)
    return {name: (d.value, d.size) for name, d in found.items() if d.is_function}


def referenced_functions(path: str, wanted: frozenset[str]) -> frozenset[str] | None:
    """Of the functions in `wanted` that `path` defines in .symtab only (a runtime linked in
    statically and hidden, as in NCCL or NVSHMEM), those its own code refers to: the target
    of a rel32 displacement anywhere in its executable sections (call, jmp, lea of the
    address) or of a relative relocation (an address stored in data).

    None when that cannot be told cheaply, so every defined function is worth probing: one
    of them is exported (.dynsym: any file may call it), none is referred to, the file is not
    x86-64 position-independent code, or its code is larger than _MAX_CODE_SCANNED."""
    return _cached(path, ("refs", wanted), lambda file: _read_references(file, wanted))


def symbol_address(path: str, name: str) -> int | None:
    """st_value of the symbol `name` that `path` defines (any symbol type), or None."""
    found = _definitions(path, frozenset((name,))).get(name)
    return None if found is None else found.value


def symbol_at(path: str, file_offset: int) -> tuple[str, int] | None:
    """(name, st_value) of the function symbol covering the code at `file_offset` of `path`,
    from .symtab and .dynsym (a host stub nvcc 13 leaves only in .symtab is found too)."""
    table = _cached(path, ("functions",), _read_function_table)
    if table is None:
        return None
    vaddr = _to_vaddr(table.loads, file_offset)
    if vaddr is None:
        return None
    i = int(np.searchsorted(table.starts, vaddr, side="right")) - 1
    if i < 0:
        return None
    start, size = int(table.starts[i]), int(table.sizes[i])
    if vaddr >= start + max(size, 1):
        return None
    # The name is read back now: keeping every function's name would cost tens of MB for a
    # big library, and this is asked only for launches no record named.
    name = _cached(path, ("name", i), lambda file: _read_name(file, table, i))
    return None if name is None else (name, start)


def file_offset_to_vaddr(path: str, file_offset: int) -> int | None:
    """The virtual address (st_value terms) of the byte at `file_offset` of a loaded segment."""
    table = _cached(path, ("functions",), _read_function_table)
    return None if table is None else _to_vaddr(table.loads, file_offset)


def vaddr_to_file_offset(path: str, vaddr: int) -> int | None:
    """The file offset of the byte at virtual address `vaddr` (st_value terms) of a loaded
    segment: where a uprobe on the function at `vaddr` goes. None outside every segment."""
    loads = _cached(path, ("loads",), _read_loads)
    if loads is None:
        return None
    for p_offset, p_filesz, p_vaddr in loads:
        if p_vaddr <= vaddr < p_vaddr + p_filesz:
            return vaddr - p_vaddr + p_offset
    return None


@dataclass(frozen=True, slots=True)
class LocalStatics:
    """Function-local static objects named `suffix` (e.g. nvcc's `__handle` next to each
    kernel stub) and what is needed to find them in a process."""

    objects: tuple[tuple[int, str], ...]  # (st_value, mangled symbol), by address
    relocatable: bool  # ET_DYN: loaded at a base address (PIE, shared object)
    first_vaddr: int  # the lowest PT_LOAD p_vaddr (the base maps to its page)


def local_statics(path: str, suffix: str) -> LocalStatics | None:
    """The local static objects `_ZZ...E<len><suffix>` that `path` defines, from .symtab.

    The string tables are searched for the suffix first: a file without one costs a pass
    over its string tables, not a symbol decode."""
    return _cached(path, ("statics", suffix), lambda file: _read_local_statics(file, suffix))


def interpreter(path: str) -> str | None:
    """The program interpreter (PT_INTERP) the executable at `path` asks for, or None."""
    return _cached(path, ("interp",), _read_interpreter)


def clear_cache() -> None:
    """Forget every cached answer (and which files were warned about)."""
    _CACHE.clear()
    _WARNED.clear()


# --- cache ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Answer(Generic[_T]):
    """A cached answer; None inside (a bad file) is not a cache miss."""

    value: _T | None


class _LRU:
    """A bounded, thread-safe LRU keyed by file identity; lru_cache would key on the path too."""

    def __init__(self, maxsize: int) -> None:
        self._maxsize = maxsize
        self._items: OrderedDict[tuple[object, ...], _Answer[object]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[object, ...]) -> _Answer[object] | None:
        with self._lock:
            answer = self._items.get(key)
            if answer is not None:
                self._items.move_to_end(key)
            return answer

    def put(self, key: tuple[object, ...], answer: _Answer[object]) -> None:
        with self._lock:
            self._items[key] = answer
            self._items.move_to_end(key)
            while len(self._items) > self._maxsize:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_CACHE = _LRU(_CACHE_SIZE)
#: The files (by identity) a refusal was logged for: one warning per file, not per question.
_WARNED = _LRU(_CACHE_SIZE)


def _cached(
    path: str, question: tuple[object, ...], read: Callable[[_File], _T | None]
) -> _T | None:
    """Answer `question` about the file at `path`, from the cache while the file is unchanged.

    `read(file)` parses the open file; whatever a file makes it raise, the answer is None
    (a parser must not be the way a user's file stops the agent). `path` may be any path
    the kernel opens, /proc/self/fd/N included."""
    try:
        # O_NONBLOCK: opening a FIFO must not hang a scan; regular files ignore it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a directory, device or FIFO: no ELF file to read
            return None
        file = _File(fd, st)
        key = (*file.identity, *question)
        hit = _CACHE.get(key)
        if hit is not None:
            return hit.value  # type: ignore[return-value]
        try:
            value = read(file)
        except _OverBudgetError as exc:  # what it claims costs more than it holds: defines nothing
            _warn_once(path, file, exc)
            value = None
        except Exception as exc:  # a hostile file, or a parser bug it found: defines nothing
            log.debug("%s: unreadable as ELF (%s: %s)", path, type(exc).__name__, exc)
            value = None
        _CACHE.put(key, _Answer(value))
        return value
    except OSError:
        return None
    finally:
        os.close(fd)


def _within(file: _File, question: tuple[object, ...], read: Callable[[_File], _T]) -> _T:
    """Answer `question` about the open `file` from the cache, or `read` it (a question of
    its own, with its own budget) and keep the answer: for one reader that needs another's
    answer (what a raise means is the outer _cached's business)."""
    key = (*file.identity, *question)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit.value  # type: ignore[return-value]
    value = read(file.again())
    _CACHE.put(key, _Answer(value))
    return value


def _warn_once(path: str, file: _File, exc: _OverBudgetError) -> None:
    if _WARNED.get(file.identity) is not None:
        return
    _WARNED.put(file.identity, _Answer(None))
    shown = path
    if path.startswith("/proc/self/fd/"):  # a descriptor the caller checked: name its file
        with contextlib.suppress(OSError):
            shown = os.readlink(path)
    log.warning(
        "%s: %s (%d bytes, %d on disk): read as defining nothing",
        shown, exc, file.size, file.allocated,
    )


# --- the budget ----------------------------------------------------------------------------


class _OverBudgetError(Exception):
    """What a file's headers send a question to read is more than the question may read of
    it, or lies in holes: the file defines nothing that can be read."""


class _ShrankError(Exception):
    """A read came back short: the file shrank under the reader."""


class _File:
    """An open file asked one question: what it reads and keeps, within that question's
    budget.

    A range is taken (checked, and counted) before it is read: it must lie in the file and
    be no longer than MAX_SECTION_BYTES (else the table is unreadable: False, the file's
    other tables may answer), and the question must stay within its budget (else
    _OverBudgetError: the whole question is refused): at most the file's size read (a real
    file's tables do not overlap), at most MAX_FILE_BYTES read and kept together, and bytes
    read past what the file has on disk must hold no hole. The same range taken twice
    counts once."""

    __slots__ = (
        "_kept", "_read", "_read_limit", "_stat", "_taken", "allocated", "fd", "identity", "size"
    )

    def __init__(self, fd: int, st: os.stat_result) -> None:
        self.fd = fd
        self.size = st.st_size
        self.allocated = st.st_blocks * 512
        self.identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self._read_limit = min(MAX_FILE_BYTES, max(self.size, _UNCHECKED_BYTES))
        self._read = 0
        self._kept = 0
        self._taken: set[tuple[int, int]] = set()
        self._stat = st

    def again(self) -> _File:
        """The same open file, for another question (a fresh budget)."""
        return _File(self.fd, self._stat)

    def take(self, offset: int, length: int) -> bool:
        """Whether [offset, offset + length) may be read; counted against the budget."""
        if offset < 0 or length < 0 or length > MAX_SECTION_BYTES or offset + length > self.size:
            return False
        if (offset, length) in self._taken:
            return True
        read = self._read + length
        if read > self._read_limit or read + self._kept > MAX_FILE_BYTES:
            raise _OverBudgetError(
                f"its tables come to more than {min(self._read_limit, MAX_FILE_BYTES)} bytes,"
                " the most one question reads of it"
            )
        if read > max(_UNCHECKED_BYTES, self.allocated) and self._has_hole(offset, length):
            raise _OverBudgetError(
                f"its table of {length} bytes at offset {offset} is a hole, not on disk"
            )
        self._read = read
        self._taken.add((offset, length))
        return True

    def spend(self, size: int) -> None:
        """Count `size` bytes the answer keeps (arrays, names) against the budget."""
        self._kept += size
        if self._read + self._kept > MAX_FILE_BYTES:
            raise _OverBudgetError(
                f"its answer would keep more than {MAX_FILE_BYTES - self._read} bytes"
            )

    def read(self, offset: int, length: int) -> bytes | None:
        """`length` bytes at `offset`, taken first; None if they cannot be taken or the read
        comes back short (the file shrank)."""
        if not self.take(offset, length):
            return None
        data = os.pread(self.fd, length, offset)
        return data if len(data) == length else None

    def pieces(
        self, offset: int, length: int, piece: int = 0, overlap: int = 0
    ) -> Iterator[tuple[int, bytes]]:
        """(file offset, bytes) of a range already taken, `piece` bytes (_CHUNK_BYTES) at a
        time, each with up to `overlap` bytes more (what straddles two pieces is whole in
        one)."""
        end, piece = offset + length, piece or _CHUNK_BYTES
        for start in range(offset, end, piece):
            want = min(piece + overlap, end - start)
            data = os.pread(self.fd, want, start)
            if len(data) != want:
                raise _ShrankError(f"{want} bytes at {start}, {len(data)} read")
            yield start, data

    def _has_hole(self, offset: int, length: int) -> bool:
        """Whether the kernel reports a hole in [offset, offset + length) (a file system
        that cannot tell reports none: every byte of the file is data)."""
        try:
            return os.lseek(self.fd, offset, os.SEEK_HOLE) < offset + length
        except OSError:
            return False


# --- reading -------------------------------------------------------------------------------

_ELF_MAGIC = b"\x7fELF"
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_RELA, _SHT_DYNSYM, _SHT_NOBITS = 1, 2, 4, 11, 8
_SHF_EXECINSTR = 0x4
_EM_X86_64 = 62
_R_X86_64_RELATIVE = 8
_PT_LOAD, _PT_INTERP = 1, 3
_ET_DYN = 3
_STT_OBJECT, _STT_FUNC, _STT_GNU_IFUNC = 1, 2, 10
_SHN_UNDEF = 0

# ELF header fields after e_ident, for ELFCLASS32 (1) and ELFCLASS64 (2).
_EHDR = {1: "HHIIIIIHHHHHH", 2: "HHIQQQIHHHHHH"}


def _spread(fields: list[tuple[str, str, int]], endian: str, itemsize: int) -> np.dtype[np.void]:
    """A structured dtype of (name, format, offset) fields over `itemsize` bytes per entry."""
    return np.dtype({
        "names": [name for name, _, _ in fields],
        "formats": [endian + kind for _, kind, _ in fields],
        "offsets": [offset for _, _, offset in fields],
        "itemsize": itemsize,
    })


# Elf32_Shdr / Elf64_Shdr, Elf32_Phdr / Elf64_Phdr, Elf32_Sym / Elf64_Sym: (name, format,
# offset), by ELF class.
_SECTION_FIELDS = {
    1: [("type", "u4", 4), ("flags", "u4", 8), ("addr", "u4", 12), ("offset", "u4", 16),
        ("size", "u4", 20), ("link", "u4", 24), ("entsize", "u4", 36)],
    2: [("type", "u4", 4), ("flags", "u8", 8), ("addr", "u8", 16), ("offset", "u8", 24),
        ("size", "u8", 32), ("link", "u4", 40), ("entsize", "u8", 56)],
}
_SEGMENT_FIELDS = {
    1: [("type", "u4", 0), ("offset", "u4", 4), ("vaddr", "u4", 8), ("filesz", "u4", 16)],
    2: [("type", "u4", 0), ("offset", "u8", 8), ("vaddr", "u8", 16), ("filesz", "u8", 32)],
}
_SYMBOL_FIELDS = {
    1: [("name", "u4", 0), ("value", "u4", 4), ("size", "u4", 8), ("info", "u1", 12),
        ("shndx", "u2", 14)],
    2: [("name", "u4", 0), ("info", "u1", 4), ("shndx", "u2", 6), ("value", "u8", 8),
        ("size", "u8", 16)],
}
_SECTION_SIZE = {1: 40, 2: 64}
_SEGMENT_SIZE = {1: 32, 2: 56}
_SYMBOL_SIZE = {1: 16, 2: 24}


class _Section(NamedTuple):
    number: int
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


class _Elf(NamedTuple):
    """The layout of an open ELF file: what its headers say, checked against its size."""

    file: _File
    endian: str  # "<" or ">"
    elfclass: int  # 1 or 2
    e_type: int
    machine: int
    sections: npt.NDArray[np.void]  # every section header, sound or not
    loads: tuple[tuple[int, int, int], ...]  # (p_offset, p_filesz, p_vaddr) of each PT_LOAD
    interp: tuple[int, int] | None  # (p_offset, p_filesz) of PT_INTERP


def _open_elf(file: _File) -> _Elf | None:
    """The file's headers, or None if it is not an ELF file whose headers lie in it."""
    ident = file.read(0, 16)
    if ident is None or ident[:4] != _ELF_MAGIC or ident[4] not in _EHDR or ident[5] not in (1, 2):
        return None
    elfclass, endian = ident[4], "<" if ident[5] == 1 else ">"
    ehdr = struct.Struct(endian + _EHDR[elfclass])
    raw = file.read(16, ehdr.size)
    if raw is None:
        return None
    e_type, machine, _v, _e, phoff, shoff, _f, _eh, phentsize, phnum, shentsize, shnum, _x = (
        ehdr.unpack(raw)
    )
    section_fields = (_SECTION_FIELDS[elfclass], _SECTION_SIZE[elfclass])
    sections = _headers(file, (shoff, shentsize, shnum), section_fields, endian)
    if sections is not None and shnum == 0 and shoff:
        # More than 0xff00 sections: the count is in section 0's sh_size.
        first = _headers(file, (shoff, shentsize, 1), section_fields, endian)
        if first is not None and len(first):
            count = int(first["size"][0])
            sections = _headers(file, (shoff, shentsize, count), section_fields, endian)
    segment_fields = (_SEGMENT_FIELDS[elfclass], _SEGMENT_SIZE[elfclass])
    segments = _headers(file, (phoff, phentsize, phnum), segment_fields, endian)
    loads: list[tuple[int, int, int]] = []
    interp: tuple[int, int] | None = None
    for seg in segments if segments is not None else ():
        kind, offset, filesz = int(seg["type"]), int(seg["offset"]), int(seg["filesz"])
        if kind == _PT_LOAD:
            loads.append((offset, filesz, int(seg["vaddr"])))
        elif kind == _PT_INTERP and interp is None:
            interp = (offset, filesz)
    if sections is None:
        sections = np.empty(0, _spread(section_fields[0], endian, section_fields[1]))
    return _Elf(file, endian, elfclass, e_type, machine, sections, tuple(loads), interp)


def _headers(
    file: _File,
    where: tuple[int, int, int],
    fields: tuple[list[tuple[str, str, int]], int],
    endian: str,
) -> npt.NDArray[np.void] | None:
    """A table of headers, `where` = (offset, entry size, count), `fields` = (the fields,
    the entry size they need); None if it does not fit in the file or is beyond reason."""
    offset, entsize, count = where
    layout, needed = fields
    dtype = _spread(layout, endian, max(entsize, needed))
    if offset == 0 or count == 0:
        return np.empty(0, dtype)
    if entsize < needed or count * entsize > _MAX_HEADER_BYTES:
        return None
    raw = file.read(offset, count * entsize)
    if raw is None:
        return None
    return np.frombuffer(raw, dtype=dtype, count=count)


def _section(elf: _Elf, number: int) -> _Section:
    s = elf.sections[number]
    return _Section(
        number, int(s["type"]), int(s["flags"]), int(s["addr"]), int(s["offset"]),
        int(s["size"]), int(s["link"]), int(s["entsize"]),
    )


def _sections_where(elf: _Elf, chosen: npt.NDArray[np.bool_]) -> list[_Section] | None:
    """The sections `chosen` marks, or None if there are more than _MAX_SECTIONS_SCANNED."""
    numbers = np.flatnonzero(chosen)
    if len(numbers) > _MAX_SECTIONS_SCANNED:
        return None
    return [_section(elf, int(i)) for i in numbers.tolist()]


def _take(elf: _Elf, section: _Section) -> bool:
    """Whether a section's bytes may be read (see _File.take); not one that has none."""
    return section.type != _SHT_NOBITS and elf.file.take(section.offset, section.size)


def _symbol_tables(elf: _Elf) -> list[tuple[_Section, _Section]]:
    """(symbol table, its string table) of .dynsym and of .symtab, .dynsym first (its answer
    wins where both define a name); a table whose link or entry size is unsound is left out.

    Only the first of each type is read: an object file has at most one of each (the gABI),
    so a file with a thousand .symtab headers costs what one does."""
    pairs = []
    for kind in (_SHT_DYNSYM, _SHT_SYMTAB):
        numbers = np.flatnonzero(elf.sections["type"] == kind)[:1].tolist()
        table = _section(elf, int(numbers[0])) if numbers else None
        if (
            table is not None
            and 0 < table.link < len(elf.sections)
            and _SYMBOL_SIZE[elf.elfclass] <= table.entsize <= _CHUNK_BYTES
        ):
            pairs.append((table, _section(elf, table.link)))
    return pairs


def _read_symbols(elf: _Elf, table: _Section) -> Iterator[npt.NDArray[np.void]] | None:
    """The symbols of `table`, a piece (at most _CHUNK_BYTES) at a time, in order;
    None if the table cannot be read."""
    if not _take(elf, table):
        return None
    count = table.size // table.entsize  # a partial last entry is no symbol
    dtype = _spread(_SYMBOL_FIELDS[elf.elfclass], elf.endian, table.entsize)
    piece = _CHUNK_BYTES // table.entsize * table.entsize
    return (
        np.frombuffer(raw, dtype=dtype, count=len(raw) // table.entsize)
        for _start, raw in elf.file.pieces(table.offset, count * table.entsize, piece)
    )


def _definitions(
    path: str, wanted: frozenset[str], unless_imported: frozenset[str] = frozenset()
) -> Mapping[str, _Definition]:
    found = _cached(
        path,
        ("defs", wanted, unless_imported),
        lambda file: _read_definitions(file, wanted, unless_imported),
    )
    return {} if found is None else found


def _read_definitions(
    file: _File, wanted: frozenset[str], unless_imported: frozenset[str]
) -> dict[str, _Definition]:
    found: dict[str, _Definition] = {}
    if not unless_imported:
        for _kind, definitions in _within(
            file, ("tables", wanted), lambda file_: _read_table_definitions(file_, wanted)
        ):
            for name, definition in definitions.items():
                found.setdefault(name, definition)
        return found
    elf = _open_elf(file)
    if elf is None:
        return {}
    for table, strtab in _symbol_tables(elf):  # .dynsym first
        definitions, imported = _table_symbols(elf, table, strtab, wanted, unless_imported)
        for name, definition in definitions.items():
            found.setdefault(name, definition)
        if table.type == _SHT_DYNSYM and imported:
            # Linked from another file (the CUDA runtime from libcudart.so): no copy of it is
            # linked in, so .symtab (10x the size of .dynsym in libtorch_cuda.so) is not read.
            break
    return found


def _read_table_definitions(
    file: _File, wanted: frozenset[str]
) -> tuple[tuple[int, dict[str, _Definition]], ...]:
    """(section type, the definitions of wanted names) of each symbol table, .dynsym first:
    function_addresses and referenced_functions ask this of a static runtime's file alike."""
    elf = _open_elf(file)
    if elf is None:
        return ()
    return tuple(
        (table.type, _table_symbols(elf, table, strtab, wanted, frozenset())[0])
        for table, strtab in _symbol_tables(elf)
    )


def _table_symbols(
    elf: _Elf,
    table: _Section,
    strtab: _Section,
    wanted: frozenset[str],
    imports: frozenset[str],
) -> tuple[dict[str, _Definition], frozenset[str]]:
    """The definitions of `wanted` names in one symbol table, and which of `imports` it
    has as undefined symbols (one search of the string table for both)."""
    names = _names_in(elf, strtab, wanted | imports)
    if not names:
        return {}, frozenset()
    pieces = _read_symbols(elf, table)
    if pieces is None:
        return {}, frozenset()
    offsets = np.fromiter(names, dtype=np.uint32, count=len(names))
    found: dict[str, _Definition] = {}
    imported: set[str] = set()
    for symbols in pieces:
        named = np.isin(symbols["name"], offsets)
        if not named.any():
            continue
        undefined = symbols["shndx"] == _SHN_UNDEF
        hits = np.flatnonzero(named & ~undefined & (symbols["value"] != 0))
        # The first symbol of each name is the one kept: only it is looked at (a table may
        # name one function a million times).
        _, first = np.unique(symbols["name"][hits], return_index=True)
        for index in np.sort(hits[first]).tolist():
            symbol = symbols[index]
            name = names[int(symbol["name"])]
            if name in wanted:
                kind = int(symbol["info"]) & 0xF
                found.setdefault(name, _Definition(
                    int(symbol["value"]), kind in (_STT_FUNC, _STT_GNU_IFUNC), int(symbol["size"])
                ))
        if imports:
            for offset in np.unique(symbols["name"][named & undefined]).tolist():
                if names[offset] in imports:
                    imported.add(names[offset])
    return found, frozenset(imported)


def _string_at(strings: bytes, offset: int) -> str:
    end = strings.find(b"\0", offset)
    return strings[offset : end if end >= 0 else len(strings)].decode("utf-8", "replace")


def _names_in(elf: _Elf, strtab: _Section, wanted: frozenset[str]) -> dict[int, str] | None:
    """Where in the string table `strtab` each wanted name starts (name@VER counts as
    name): {st_name: name}. Read a piece at a time, each piece with the longest name's
    length more, so a name across two pieces is whole in the first."""
    if not wanted or not _take(elf, strtab):
        return None
    overlap = max(len(name.encode()) for name in wanted) + 1
    found: dict[int, str] = {}
    for start, strings in elf.file.pieces(strtab.offset, strtab.size, overlap=overlap):
        for offset, name in _name_offsets(strings, wanted).items():
            found[start - strtab.offset + offset] = name
        if len(found) > _MAX_NAME_HITS:
            raise _OverBudgetError(f"its string table names a wanted function {len(found)} times")
    return found


def _name_offsets(strings: bytes, wanted: frozenset[str]) -> dict[int, str]:
    """Offsets in a string table where a wanted name starts, ending in NUL or '@' (a version),
    and the name.

    No NUL is required before the name: linkers share a string's tail between names. One
    pass per group of names sharing a prefix finds every identifier that starts with it (the
    regex engine's fast literal search: a 73 MB .strtab in ~0.07 s, where an alternation of
    the names took 0.46 s); a wanted name starting inside one found (a shared tail) is looked
    for there.
    """
    names, patterns, prefixes = _patterns(wanted)
    offsets: dict[int, str] = {}
    for pattern in patterns:
        for match in pattern.finditer(strings):
            start, text = match.start(), match.group()
            if text in names:
                offsets[start] = text.decode()
            for prefix in prefixes:
                inner = text.find(prefix, 1)
                while inner > 0:
                    if text[inner:] in names:
                        offsets[start + inner] = text[inner:].decode()
                    inner = text.find(prefix, inner + 1)
    return offsets


@lru_cache(maxsize=64)
def _patterns(
    wanted: frozenset[str],
) -> tuple[frozenset[bytes], tuple[re.Pattern[bytes], ...], tuple[bytes, ...]]:
    """The names, one search per group of names sharing their first two characters (for the
    identifiers starting with the group's longest common prefix), and those prefixes."""
    encoded = sorted(name.encode() for name in wanted if name)
    groups: dict[bytes, list[bytes]] = {}
    for name in encoded:
        groups.setdefault(name[:_PREFIX_LEN], []).append(name)
    prefixes = tuple(_common_prefix(names[0], names[-1]) for names in groups.values())
    # The characters of an identifier, and any other a wanted name has.
    other = sorted(set(b"".join(encoded)) - set(_IDENTIFIER))
    chars = b"A-Za-z0-9_" + b"".join(re.escape(bytes([c])) for c in other)
    # After the prefix, the names' next few characters: "cuda" in a C++ namespace
    # ("4cuda6detail") is not worth a look.
    patterns = tuple(
        re.compile(
            re.escape(prefix)
            + b"(?:"
            + b"|".join(re.escape(c) for c in sorted(
                {n[len(prefix) : len(prefix) + _NEXT_LEN] for n in names}))
            + b")["
            + chars
            + rb"]*(?=[\x00@])"
        )
        for prefix, names in zip(prefixes, groups.values(), strict=True)
    )
    return frozenset(encoded), patterns, prefixes


def _common_prefix(first: bytes, last: bytes) -> bytes:
    """What the first and the last of sorted names (so all of them) begin with."""
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    return first[:size]


@dataclass(frozen=True, slots=True)
class _FunctionTable:
    """Every defined function of a file, sorted by address, and its PT_LOAD segments; names
    are where to read them back: (string table's file offset, its size, st_name)."""

    starts: npt.NDArray[np.uint64]
    sizes: npt.NDArray[np.uint64]
    names: npt.NDArray[np.uint64]  # per function: strtab offset in the file + st_name
    name_limits: npt.NDArray[np.uint64]  # per function: where its string table ends
    loads: tuple[tuple[int, int, int], ...]  # (p_offset, p_filesz, p_vaddr)


#: What the function table keeps of each function, and as much again while it is sorted.
_FUNCTION_BYTES = 64


def _read_function_table(file: _File) -> _FunctionTable | None:
    elf = _open_elf(file)
    if elf is None:
        return None
    starts, sizes, names, limits = [], [], [], []
    for table, strtab in _symbol_tables(elf):
        if strtab.type == _SHT_NOBITS or strtab.offset + strtab.size > file.size:
            continue
        pieces = _read_symbols(elf, table)
        if pieces is None:
            continue
        for symbols in pieces:
            kind = symbols["info"] & 0xF
            keep = (
                ((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC))
                & (symbols["shndx"] != _SHN_UNDEF)
                & (symbols["value"] != 0)
                & (symbols["name"] != 0)
                & (symbols["name"] < strtab.size)
            )
            chosen = symbols[keep]
            file.spend(_FUNCTION_BYTES * len(chosen))
            starts.append(chosen["value"].astype(np.uint64))
            sizes.append(chosen["size"].astype(np.uint64))
            names.append(chosen["name"].astype(np.uint64) + np.uint64(strtab.offset))
            limits.append(np.full(len(chosen), strtab.offset + strtab.size, dtype=np.uint64))
    if not starts:
        empty = np.empty(0, np.uint64)
        return _FunctionTable(empty, empty, empty, empty, elf.loads)
    all_starts = np.concatenate(starts)
    # The first name seen for an address wins (.dynsym comes first): a stable sort, then the
    # first of each run of equal addresses.
    order = np.argsort(all_starts, kind="stable")
    ordered = all_starts[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    pick = order[first]
    return _FunctionTable(
        starts=ordered[first],
        sizes=np.concatenate(sizes)[pick],
        names=np.concatenate(names)[pick],
        name_limits=np.concatenate(limits)[pick],
        loads=elf.loads,
    )


def _read_loads(file: _File) -> tuple[tuple[int, int, int], ...] | None:
    """(p_offset, p_filesz, p_vaddr) of each PT_LOAD segment: the program headers only."""
    elf = _open_elf(file)
    return None if elf is None else elf.loads


def _read_name(file: _File, table: _FunctionTable, index: int) -> str | None:
    """The name of function `index` of `table`, read back from the file (name@VER → name)."""
    offset, limit = int(table.names[index]), min(int(table.name_limits[index]), file.size)
    length = min(limit - offset, _MAX_NAME_BYTES)
    raw = file.read(offset, length) if length > 0 else None
    if raw is None:
        return None
    name = _string_at(raw, 0).split("@", 1)[0]
    return name or None


def _to_vaddr(loads: tuple[tuple[int, int, int], ...], file_offset: int) -> int | None:
    for p_offset, p_filesz, p_vaddr in loads:
        if p_offset <= file_offset < p_offset + p_filesz:
            return file_offset - p_offset + p_vaddr
    return None


def _read_local_statics(file: _File, suffix: str) -> LocalStatics | None:
    elf = _open_elf(file)
    if elf is None:
        return None
    tail = f"E{len(suffix)}{suffix}".encode() + b"\0"
    objects: dict[int, str] = {}
    searched = False
    for table, strtab in _symbol_tables(elf):
        if not _holds(elf, strtab, tail):
            continue
        pieces = _read_symbols(elf, table)
        if pieces is None:
            continue
        searched = True
        objects.update(
            (value, name) for value, name in _statics_in(elf, pieces, strtab, tail)
            if value not in objects
        )
    if not searched:
        return None
    loads = [vaddr for _offset, _filesz, vaddr in elf.loads]
    return LocalStatics(
        objects=tuple(sorted(objects.items())),
        relocatable=elf.e_type == _ET_DYN,
        first_vaddr=min(loads) if loads else 0,
    )


def _holds(elf: _Elf, strtab: _Section, text: bytes) -> bool:
    """Whether the string table `strtab` holds `text` (read a piece at a time)."""
    if not text or not _take(elf, strtab):
        return False
    pieces = elf.file.pieces(strtab.offset, strtab.size, overlap=len(text) - 1)
    return any(text in strings for _start, strings in pieces)


#: What a local static's entry costs beyond its name (the tuple, the int, the str object).
_STATIC_BYTES = 128


def _statics_in(
    elf: _Elf,
    pieces: Iterator[npt.NDArray[np.void]],
    strtab: _Section,
    tail: bytes,
) -> list[tuple[int, str]]:
    """(st_value, name) of each defined object named `_ZZ…<tail>` (tail ends in NUL), in the
    order of the symbols `pieces`.

    Only the names of objects starting `_ZZ` are looked at, each up to its NUL: in
    libtorch_cuda.so's 74 MB .strtab, 50,000 of them (24,000 `__handle` statics), where a
    search of the whole table for its NULs and for the tails cost 0.2 s more. The string
    table is read a piece at a time, each with _MAX_NAME_BYTES more; a name longer than
    that across two pieces is read back from the file."""
    values_of, names_of = [], []
    for symbols in pieces:
        name = symbols["name"].astype(np.int64)
        candidate = (
            ((symbols["info"] & 0xF) == _STT_OBJECT)
            & (symbols["shndx"] != _SHN_UNDEF)
            & (symbols["value"] != 0)
            & (name + 3 < strtab.size)
        )
        elf.file.spend(16 * int(np.count_nonzero(candidate)))
        values_of.append(symbols["value"][candidate].astype(np.uint64))
        names_of.append(name[candidate])
    if not values_of or not sum(map(len, values_of)):
        return []
    values, at = np.concatenate(values_of), np.concatenate(names_of)
    order = np.argsort(at, kind="stable")  # the candidates by where their names are
    ordered = at[order]
    suffix = tail.removesuffix(b"\0")
    found: list[tuple[int, int, str]] = []  # (symbol, st_value, name)
    for start, strings in elf.file.pieces(strtab.offset, strtab.size, overlap=_MAX_NAME_BYTES):
        base = start - strtab.offset
        lo, hi = np.searchsorted(ordered, [base, base + _CHUNK_BYTES]).tolist()
        if lo == hi:
            continue
        text = np.frombuffer(strings, dtype=np.uint8)
        here = ordered[lo:hi] - base
        starts_zz = (
            (text[here] == ord("_")) & (text[here + 1] == ord("Z")) & (text[here + 2] == ord("Z"))
        )
        chosen = order[lo:hi][starts_zz]
        for symbol, offset in zip(chosen.tolist(), here[starts_zz].tolist(), strict=True):
            end = strings.find(b"\0", offset)  # a name ends at the first NUL after it
            if end >= 0:
                raw = strings[offset:end] if strings.endswith(suffix, offset, end) else None
            elif base + len(strings) < strtab.size:  # the piece ends inside the name
                whole = _string_from(elf, strtab, base + offset)
                raw = whole if whole is not None and whole.endswith(suffix) else None
            else:
                raw = None  # no NUL before the table ends: no name
            if raw is not None:
                elf.file.spend(len(raw) + _STATIC_BYTES)
                found.append((symbol, int(values[symbol]), raw.decode("utf-8", "replace")))
    found.sort()
    return [(value, name) for _symbol, value, name in found]


def _string_from(elf: _Elf, strtab: _Section, offset: int) -> bytes | None:
    """The string at `offset` of the string table `strtab` (already taken), up to its NUL,
    read a piece at a time; None if the table ends first."""
    parts = []
    start = strtab.offset + offset
    for _at, raw in elf.file.pieces(start, strtab.offset + strtab.size - start, _MAX_NAME_BYTES):
        nul = raw.find(b"\0")
        parts.append(raw if nul < 0 else raw[:nul])
        elf.file.spend(len(parts[-1]))
        if nul >= 0:
            return b"".join(parts)
    return None


def _read_interpreter(file: _File) -> str | None:
    elf = _open_elf(file)
    if elf is None or elf.interp is None:
        return None
    offset, length = elf.interp
    raw = file.read(offset, min(length, 4096))
    if not raw:
        return None
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape") or None


def _read_references(file: _File, wanted: frozenset[str]) -> frozenset[str] | None:
    elf = _open_elf(file)
    if elf is None or elf.machine != _EM_X86_64 or elf.e_type != _ET_DYN or elf.elfclass != 2:
        return None
    hidden: dict[str, int] = {}
    tables = _within(
        file, ("tables", wanted), lambda file_: _read_table_definitions(file_, wanted)
    )
    for kind, defined in tables:
        if kind == _SHT_DYNSYM and any(d.is_function for d in defined.values()):
            return None  # exported: other files call it
        for name, definition in defined.items():
            if definition.is_function:
                hidden.setdefault(name, definition.value)
    if not hidden:
        return frozenset()
    headers = elf.sections
    code = _sections_where(
        elf,
        (headers["type"] == _SHT_PROGBITS)
        & ((headers["flags"] & _SHF_EXECINSTR) != 0)
        & (headers["size"] != 0),
    )
    if not code or sum(s.size for s in code) > _MAX_CODE_SCANNED:
        return None
    relocations = _sections_where(
        elf, (headers["type"] == _SHT_RELA) & (headers["entsize"] == 24)
    )
    if relocations is None:
        return None
    addresses = np.array(sorted(set(hidden.values())), dtype=np.int64)
    seen = np.zeros(len(addresses), dtype=bool)
    functions = _within(file, ("functions",), _read_function_table)
    outside: dict[int, bool] = {}  # function index → not the runtime's own (names read once)
    for section in code:
        if not _take(elf, section):
            return None
        # 3 bytes of overlap: a displacement may straddle two chunks.
        for at, raw in file.pieces(section.offset, section.size, _CODE_CHUNK, overlap=3):
            vaddr = section.addr + at - section.offset
            sites, targets = _rel32_hits(raw, vaddr, addresses)
            slots = np.searchsorted(addresses, targets)
            todo = ~seen[slots]  # a function already found referred to needs no more sites
            sites = sites[todo].astype(np.int64) + vaddr
            slots = slots[todo]
            seen[slots[_from_outside_the_runtime(file, functions, sites, outside)]] = True
    for section in relocations:
        if not _take(elf, section):
            continue
        entries = section.size // 24 * 24
        for _at, raw in file.pieces(section.offset, entries, _CHUNK_BYTES // 24 * 24):
            rela = np.frombuffer(raw, dtype=elf.endian + "u8").reshape(-1, 3)
            relative = rela[(rela[:, 1] & 0xFFFFFFFF) == _R_X86_64_RELATIVE, 2].astype(np.int64)
            seen |= np.isin(addresses, relative)
    if not seen.any():  # a runtime nothing refers to: nothing to tell by, probe all of it
        return None
    referenced = {int(a) for a in addresses[seen].tolist()}
    return frozenset(name for name, value in hidden.items() if value in referenced)


#: Functions of a statically linked runtime itself: their references to its API functions are
#: the runtime's own business (cudaMallocHost calling cudaMalloc), not the file's calls.
_RUNTIME_INTERNAL = (b"cuda", b"libcudart_static_")
_RUNTIME_INTERNAL_LONGEST = max(map(len, _RUNTIME_INTERNAL))


def _named_like_the_runtime(file: _File, table: _FunctionTable, index: int) -> bool:
    """Whether function `index` of `table` has a name of the runtime's own: only the first
    bytes of the name are read (NVSHMEM's runtime calls its API from 1,100 functions)."""
    offset, limit = int(table.names[index]), min(int(table.name_limits[index]), file.size)
    length = min(limit - offset, _RUNTIME_INTERNAL_LONGEST)
    raw = file.read(offset, length) if length > 0 else None
    return raw is not None and raw.split(b"\0", 1)[0].startswith(_RUNTIME_INTERNAL)


def _from_outside_the_runtime(
    file: _File,
    functions: _FunctionTable | None,
    sites: npt.NDArray[np.int64],
    outside: dict[int, bool],
) -> npt.NDArray[np.bool_]:
    """Whether the code at each address of `sites` is in a function that is not the
    runtime's own (a site in no function's bounds is the runtime's unnamed code). `outside`
    remembers the answer per function (its index in `functions`) across calls."""
    if functions is None:
        return np.ones(len(sites), dtype=bool)
    if not len(sites) or not len(functions.starts):
        return np.zeros(len(sites), dtype=bool)
    at = sites.astype(np.uint64)
    index = np.searchsorted(functions.starts, at, side="right").astype(np.int64) - 1
    known = np.maximum(index, 0)
    within = (index >= 0) & (
        at < functions.starts[known] + np.maximum(functions.sizes[known], np.uint64(1))
    )
    for i in np.unique(known[within]).tolist():
        if i not in outside:
            outside[i] = not _named_like_the_runtime(file, functions, i)
    result = np.zeros(len(sites), dtype=bool)
    chosen = np.flatnonzero(within)
    result[chosen] = [outside[i] for i in known[chosen].tolist()]
    return result


def _rel32_hits(
    code: bytes, vaddr: int, addresses: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
    """(offset in `code`, target) of each byte of `code` (loaded at `vaddr`, at most
    _CODE_CHUNK + 3 bytes) where a rel32 displacement would point at one of `addresses`
    (sorted), taking the displacement as an instruction's last four bytes (call, jmp, lea,
    mov).

    Every byte is a candidate, in one vectorised pass: the displacements are read in place
    (a little-endian 32-bit word at each byte: a view with a stride of one byte), and only
    the targets within the span of `addresses` are matched against them. The span test is
    done in wrapping 32-bit arithmetic (half the memory of 64-bit), so it may let through a
    target 4 GB away; each one let through is checked in 64 bits. (NCCL's 2.5 MB .text:
    4 ms, where shifting four byte arrays together and matching every target took 35.)"""
    n = min(len(code) - 3, _CODE_CHUNK)
    if n <= 0 or not len(addresses):
        return np.empty(0, np.intp), np.empty(0, np.int64)
    lowest, span = int(addresses[0]), int(addresses[-1]) - int(addresses[0])
    # target - lowest = start + offset + displacement, for the byte at each offset.
    start = vaddr + 4 - lowest
    if span >= 1 << 32:
        near = np.arange(n)
    else:
        relative = _CHUNK_OFFSETS[:n] + np.uint32(start % (1 << 32))
        relative += np.ndarray((n,), dtype="<u4", buffer=code, strides=(1,))
        near = np.flatnonzero(relative <= np.uint32(span))
    displacements = np.ndarray((n,), dtype="<i4", buffer=code, strides=(1,))
    found = displacements[near].astype(np.int64) + near + (start + lowest)
    hit = np.isin(found, addresses)
    return near[hit], found[hit]
