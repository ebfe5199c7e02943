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

Every size and offset a file states is bounded by the file's size and by MAX_SECTION_BYTES
before anything is read: a section header claiming 200 GB (in a sparse file, say) makes that
table unreadable, not the agent run out of memory. A file that is not ELF, is truncated,
lies about its layout or cannot be read defines nothing (or what its sound tables say):
these functions never raise because of a file. Answers are cached by file identity (st_dev,
st_ino, st_size, st_mtime_ns).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

__all__ = [
    "MAX_SECTION_BYTES",
    "clear_cache",
    "defined_functions",
    "file_offset_to_vaddr",
    "function_addresses",
    "interpreter",
    "local_statics",
    "referenced_functions",
    "symbol_address",
    "symbol_at",
    "vaddr_to_file_offset",
]

#: The largest section read (a string or symbol table): a table said to be larger is not
#: read. The largest real ones (libtorch_cuda.so's .strtab) are a few hundred MB.
MAX_SECTION_BYTES = 1 << 30
#: The most section or program headers read (the ELF extension allows 2**32).
_MAX_HEADERS = 1 << 20
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


def referenced_functions(path: str, wanted: frozenset[str]) -> frozenset[str] | None:
    """Of the functions in `wanted` that `path` defines in .symtab only (a runtime linked in
    statically and hidden, as in NCCL or NVSHMEM), those its own code refers to: the target
    of a rel32 displacement anywhere in its executable sections (call, jmp, lea of the
    address) or of a relative relocation (an address stored in data).

    None when that cannot be told cheaply, so every defined function is worth probing: one
    of them is exported (.dynsym: any file may call it), none is referred to, the file is not
    x86-64 position-independent code, or its code is larger than _MAX_CODE_SCANNED."""
    return _cached(path, ("refs", wanted), lambda fd, size: _read_references(fd, size, wanted))


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
    name = _cached(path, ("name", i), lambda fd, size_: _read_name(fd, size_, table, i))
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
    return _cached(
        path, ("statics", suffix), lambda fd, size: _read_local_statics(fd, size, suffix)
    )


def interpreter(path: str) -> str | None:
    """The program interpreter (PT_INTERP) the executable at `path` asks for, or None."""
    return _cached(path, ("interp",), _read_interpreter)


def clear_cache() -> None:
    """Forget every cached answer."""
    _CACHE.clear()


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


def _cached(
    path: str, question: tuple[object, ...], read: Callable[[int, int], _T | None]
) -> _T | None:
    """Answer `question` about the file at `path`, from the cache while the file is unchanged.

    `read(fd, size)` parses the open file; whatever a file makes it raise, the answer is
    None (a parser must not be the way a user's file stops the agent)."""
    try:
        # O_NONBLOCK: opening a FIFO must not hang a scan; regular files ignore it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a directory, device or FIFO: no ELF file to read
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, *question)
        hit = _CACHE.get(key)
        if hit is not None:
            return hit.value  # type: ignore[return-value]
        try:
            value = read(fd, st.st_size)
        except Exception as exc:  # a hostile file, or a parser bug it found: defines nothing
            log.debug("%s: unreadable as ELF (%s: %s)", path, type(exc).__name__, exc)
            value = None
        _CACHE.put(key, _Answer(value))
        return value
    except OSError:
        return None
    finally:
        os.close(fd)


def _within(fd: int, question: tuple[object, ...], read: Callable[[int, int], _T]) -> _T:
    """Answer `question` about the file open as `fd` from the cache, or `read` it and keep
    the answer: for one reader that needs another's answer (what a raise means is the outer
    _cached's business)."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, *question)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit.value  # type: ignore[return-value]
    value = read(fd, st.st_size)
    _CACHE.put(key, _Answer(value))
    return value


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

    fd: int
    size: int  # of the file
    endian: str  # "<" or ">"
    elfclass: int  # 1 or 2
    e_type: int
    machine: int
    sections: tuple[_Section, ...]  # every header, sound or not
    loads: tuple[tuple[int, int, int], ...]  # (p_offset, p_filesz, p_vaddr) of each PT_LOAD
    interp: tuple[int, int] | None  # (p_offset, p_filesz) of PT_INTERP


def _pread(fd: int, size: int, offset: int, length: int) -> bytes | None:
    """`length` bytes at `offset`, or None if any of them lies outside the file (of `size`)
    or the read comes back short (the file shrank), or the length is beyond reason."""
    if offset < 0 or length < 0 or length > MAX_SECTION_BYTES or offset + length > size:
        return None
    data = os.pread(fd, length, offset)
    return data if len(data) == length else None


def _open_elf(fd: int, size: int) -> _Elf | None:
    """The file's headers, or None if it is not an ELF file whose headers lie in it."""
    ident = _pread(fd, size, 0, 16)
    if ident is None or ident[:4] != _ELF_MAGIC or ident[4] not in _EHDR or ident[5] not in (1, 2):
        return None
    elfclass, endian = ident[4], "<" if ident[5] == 1 else ">"
    ehdr = struct.Struct(endian + _EHDR[elfclass])
    raw = _pread(fd, size, 16, ehdr.size)
    if raw is None:
        return None
    e_type, machine, _v, _e, phoff, shoff, _f, _eh, phentsize, phnum, shentsize, shnum, _x = (
        ehdr.unpack(raw)
    )
    section_fields = (_SECTION_FIELDS[elfclass], _SECTION_SIZE[elfclass])
    sections = _headers(fd, size, (shoff, shentsize, shnum), section_fields, endian)
    if sections is not None and shnum == 0 and shoff:
        # More than 0xff00 sections: the count is in section 0's sh_size.
        first = _headers(fd, size, (shoff, shentsize, 1), section_fields, endian)
        if first is not None and len(first):
            count = int(first["size"][0])
            sections = _headers(fd, size, (shoff, shentsize, count), section_fields, endian)
    segment_fields = (_SEGMENT_FIELDS[elfclass], _SEGMENT_SIZE[elfclass])
    segments = _headers(fd, size, (phoff, phentsize, phnum), segment_fields, endian)
    loads: list[tuple[int, int, int]] = []
    interp: tuple[int, int] | None = None
    for seg in segments if segments is not None else ():
        kind, offset, filesz = int(seg["type"]), int(seg["offset"]), int(seg["filesz"])
        if kind == _PT_LOAD:
            loads.append((offset, filesz, int(seg["vaddr"])))
        elif kind == _PT_INTERP and interp is None:
            interp = (offset, filesz)
    return _Elf(
        fd, size, endian, elfclass, e_type, machine,
        tuple(
            _Section(
                i, int(s["type"]), int(s["flags"]), int(s["addr"]), int(s["offset"]),
                int(s["size"]), int(s["link"]), int(s["entsize"]),
            )
            for i, s in enumerate(sections if sections is not None else ())
        ),
        tuple(loads), interp,
    )


def _headers(
    fd: int,
    size: int,
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
    if entsize < needed or count > _MAX_HEADERS:
        return None
    raw = _pread(fd, size, offset, count * entsize)
    if raw is None:
        return None
    return np.frombuffer(raw, dtype=dtype, count=count)


def _section_bytes(elf: _Elf, section: _Section) -> bytes | None:
    """A section's bytes; None for one that has none, or says it lies outside the file."""
    if section.type == _SHT_NOBITS:
        return None
    return _pread(elf.fd, elf.size, section.offset, section.size)


class _Table(NamedTuple):
    """One symbol table and its string table, both read whole and checked."""

    symbols: npt.NDArray[np.void]
    strings: bytes


def _symbol_tables(elf: _Elf) -> list[tuple[_Section, _Section]]:
    """(symbol table, its string table) for each .dynsym and .symtab, .dynsym first (its
    answer wins where both define a name); tables whose link or entry size is unsound are left
    out."""
    pairs = [
        (s, elf.sections[s.link])
        for s in elf.sections
        if s.type in (_SHT_DYNSYM, _SHT_SYMTAB)
        and 0 < s.link < len(elf.sections)
        and s.entsize >= _SYMBOL_SIZE[elf.elfclass]
        and s.entsize <= MAX_SECTION_BYTES
    ]
    return sorted(pairs, key=lambda pair: pair[0].type != _SHT_DYNSYM)


def _read_symbols(elf: _Elf, table: _Section) -> npt.NDArray[np.void] | None:
    raw = _section_bytes(elf, table)
    if raw is None:
        return None
    count = len(raw) // table.entsize  # a partial last entry is no symbol
    dtype = _spread(_SYMBOL_FIELDS[elf.elfclass], elf.endian, table.entsize)
    return np.frombuffer(raw, dtype=dtype, count=count)


def _definitions(
    path: str, wanted: frozenset[str], unless_imported: frozenset[str] = frozenset()
) -> Mapping[str, _Definition]:
    found = _cached(
        path,
        ("defs", wanted, unless_imported),
        lambda fd, size: _read_definitions(fd, size, wanted, unless_imported),
    )
    return {} if found is None else found


def _read_definitions(
    fd: int, size: int, wanted: frozenset[str], unless_imported: frozenset[str]
) -> dict[str, _Definition]:
    found: dict[str, _Definition] = {}
    if not unless_imported:
        for _kind, definitions in _within(
            fd, ("tables", wanted), lambda fd_, size_: _read_table_definitions(fd_, size_, wanted)
        ):
            for name, definition in definitions.items():
                found.setdefault(name, definition)
        return found
    elf = _open_elf(fd, size)
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
    fd: int, size: int, wanted: frozenset[str]
) -> tuple[tuple[int, dict[str, _Definition]], ...]:
    """(section type, the definitions of wanted names) of each symbol table, .dynsym first:
    function_addresses and referenced_functions ask this of a static runtime's file alike."""
    elf = _open_elf(fd, size)
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
    strings = _section_bytes(elf, strtab)
    if strings is None:
        return {}, frozenset()
    offsets = _name_offsets(strings, wanted | imports)
    if not offsets:
        return {}, frozenset()
    symbols = _read_symbols(elf, table)
    if symbols is None:
        return {}, frozenset()
    named = np.isin(symbols["name"], np.fromiter(offsets, dtype=np.uint32, count=len(offsets)))
    undefined = symbols["shndx"] == _SHN_UNDEF
    hits = np.flatnonzero(named & ~undefined & (symbols["value"] != 0))
    found: dict[str, _Definition] = {}
    for index in hits.tolist():
        symbol = symbols[index]
        name = _string_at(strings, int(symbol["name"])).split("@", 1)[0]
        if name in wanted:
            kind = int(symbol["info"]) & 0xF
            found.setdefault(
                name, _Definition(int(symbol["value"]), kind in (_STT_FUNC, _STT_GNU_IFUNC))
            )
    imported: set[str] = set()
    if imports:
        for offset in symbols["name"][named & undefined].tolist():
            name = _string_at(strings, int(offset)).split("@", 1)[0]
            if name in imports:
                imported.add(name)
    return found, frozenset(imported)


def _string_at(strings: bytes, offset: int) -> str:
    end = strings.find(b"\0", offset)
    return strings[offset : end if end >= 0 else len(strings)].decode("utf-8", "replace")


def _name_offsets(strings: bytes, wanted: frozenset[str]) -> frozenset[int]:
    """Offsets in a string table where a wanted name starts, ending in NUL or '@' (a version).

    No NUL is required before the name: linkers share a string's tail between names. One
    pass per group of names sharing a prefix finds every identifier that starts with it (the
    regex engine's fast literal search: a 73 MB .strtab in ~0.07 s, where an alternation of
    the names took 0.46 s); a wanted name starting inside one found (a shared tail) is looked
    for there.
    """
    names, patterns, prefixes = _patterns(wanted)
    offsets: set[int] = set()
    for pattern in patterns:
        for match in pattern.finditer(strings):
            start, text = match.start(), match.group()
            if text in names:
                offsets.add(start)
            for prefix in prefixes:
                inner = text.find(prefix, 1)
                while inner > 0:
                    if text[inner:] in names:
                        offsets.add(start + inner)
                    inner = text.find(prefix, inner + 1)
    return frozenset(offsets)


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


def _read_function_table(fd: int, size: int) -> _FunctionTable | None:
    elf = _open_elf(fd, size)
    if elf is None:
        return None
    starts, sizes, names, limits = [], [], [], []
    for table, strtab in _symbol_tables(elf):
        if strtab.type == _SHT_NOBITS or strtab.offset + strtab.size > size:
            continue
        symbols = _read_symbols(elf, table)
        if symbols is None:
            continue
        kind = symbols["info"] & 0xF
        keep = (
            ((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC))
            & (symbols["shndx"] != _SHN_UNDEF)
            & (symbols["value"] != 0)
            & (symbols["name"] != 0)
            & (symbols["name"] < strtab.size)
        )
        chosen = symbols[keep]
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


def _read_loads(fd: int, size: int) -> tuple[tuple[int, int, int], ...] | None:
    """(p_offset, p_filesz, p_vaddr) of each PT_LOAD segment: the program headers only."""
    elf = _open_elf(fd, size)
    return None if elf is None else elf.loads


def _read_name(fd: int, size: int, table: _FunctionTable, index: int) -> str | None:
    """The name of function `index` of `table`, read back from the file (name@VER → name)."""
    offset, limit = int(table.names[index]), min(int(table.name_limits[index]), size)
    length = min(limit - offset, _MAX_NAME_BYTES)
    raw = _pread(fd, size, offset, length) if length > 0 else None
    if raw is None:
        return None
    name = _string_at(raw, 0).split("@", 1)[0]
    return name or None


def _to_vaddr(loads: tuple[tuple[int, int, int], ...], file_offset: int) -> int | None:
    for p_offset, p_filesz, p_vaddr in loads:
        if p_offset <= file_offset < p_offset + p_filesz:
            return file_offset - p_offset + p_vaddr
    return None


def _read_local_statics(fd: int, size: int, suffix: str) -> LocalStatics | None:
    elf = _open_elf(fd, size)
    if elf is None:
        return None
    tail = f"E{len(suffix)}{suffix}".encode() + b"\0"
    objects: dict[int, str] = {}
    searched = False
    for table, strtab in _symbol_tables(elf):
        strings = _section_bytes(elf, strtab)
        if strings is None or tail not in strings:
            continue
        symbols = _read_symbols(elf, table)
        if symbols is None:
            continue
        searched = True
        objects.update(
            (value, name) for value, name in _statics_in(symbols, strings, tail)
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


def _statics_in(
    symbols: npt.NDArray[np.void], strings: bytes, tail: bytes
) -> list[tuple[int, str]]:
    """(st_value, name) of each defined object named `_ZZ…<tail>` (tail ends in NUL).

    Only the names of objects starting `_ZZ` are looked at, each up to its NUL: in
    libtorch_cuda.so's 74 MB .strtab, 50,000 of them (24,000 `__handle` statics), where a
    search of the whole table for its NULs and for the tails cost 0.2 s more."""
    name = symbols["name"].astype(np.int64)
    candidate = (
        ((symbols["info"] & 0xF) == _STT_OBJECT)
        & (symbols["shndx"] != _SHN_UNDEF)
        & (symbols["value"] != 0)
        & (name + 3 < len(strings))
    )
    if not candidate.any():
        return []
    text = np.frombuffer(strings, dtype=np.uint8)
    at = name[candidate]
    starts_zz = (text[at] == ord("_")) & (text[at + 1] == ord("Z")) & (text[at + 2] == ord("Z"))
    values = symbols["value"][candidate][starts_zz]
    suffix = tail.removesuffix(b"\0")
    found = []
    for value, start in zip(values.tolist(), at[starts_zz].tolist(), strict=True):
        end = strings.find(b"\0", start)  # a name ends at the first NUL after it
        if end >= 0 and strings.endswith(suffix, start, end):
            found.append((int(value), strings[start:end].decode("utf-8", "replace")))
    return found


def _read_interpreter(fd: int, size: int) -> str | None:
    elf = _open_elf(fd, size)
    if elf is None or elf.interp is None:
        return None
    offset, length = elf.interp
    raw = _pread(fd, size, offset, min(length, 4096))
    if not raw:
        return None
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape") or None


def _read_references(fd: int, size: int, wanted: frozenset[str]) -> frozenset[str] | None:
    elf = _open_elf(fd, size)
    if elf is None or elf.machine != _EM_X86_64 or elf.e_type != _ET_DYN or elf.elfclass != 2:
        return None
    hidden: dict[str, int] = {}
    tables = _within(
        fd, ("tables", wanted), lambda fd_, size_: _read_table_definitions(fd_, size_, wanted)
    )
    for kind, defined in tables:
        if kind == _SHT_DYNSYM and any(d.is_function for d in defined.values()):
            return None  # exported: other files call it
        for name, definition in defined.items():
            if definition.is_function:
                hidden.setdefault(name, definition.value)
    if not hidden:
        return frozenset()
    code = [
        s for s in elf.sections
        if s.type == _SHT_PROGBITS and s.flags & _SHF_EXECINSTR and s.size
    ]
    if not code or sum(s.size for s in code) > _MAX_CODE_SCANNED:
        return None
    addresses = np.array(sorted(set(hidden.values())), dtype=np.int64)
    seen = np.zeros(len(addresses), dtype=bool)
    functions = _within(fd, ("functions",), _read_function_table)
    outside: dict[int, bool] = {}  # function index → not the runtime's own (names read once)
    for section in code:
        for start in range(0, section.size, _CODE_CHUNK):
            # 3 bytes of overlap: a displacement may straddle two chunks.
            length = min(_CODE_CHUNK + 3, section.size - start)
            raw = _pread(fd, size, section.offset + start, length)
            if raw is None:
                return None
            sites, targets = _rel32_hits(raw, section.addr + start, addresses)
            slots = np.searchsorted(addresses, targets)
            todo = ~seen[slots]  # a function already found referred to needs no more sites
            sites = sites[todo].astype(np.int64) + (section.addr + start)
            slots = slots[todo]
            seen[slots[_from_outside_the_runtime(fd, size, functions, sites, outside)]] = True
    for section in elf.sections:
        if section.type == _SHT_RELA and section.entsize == 24:
            raw = _section_bytes(elf, section)
            if raw is None:
                continue
            rela = np.frombuffer(raw, dtype=elf.endian + "u8", count=len(raw) // 24 * 3)
            rela = rela.reshape(-1, 3)
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


def _named_like_the_runtime(fd: int, size: int, table: _FunctionTable, index: int) -> bool:
    """Whether function `index` of `table` has a name of the runtime's own: only the first
    bytes of the name are read (NVSHMEM's runtime calls its API from 1,100 functions)."""
    offset, limit = int(table.names[index]), min(int(table.name_limits[index]), size)
    length = min(limit - offset, _RUNTIME_INTERNAL_LONGEST)
    raw = _pread(fd, size, offset, length) if length > 0 else None
    return raw is not None and raw.split(b"\0", 1)[0].startswith(_RUNTIME_INTERNAL)


def _from_outside_the_runtime(
    fd: int,
    size: int,
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
            outside[i] = not _named_like_the_runtime(fd, size, functions, i)
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
