"""Which functions an ELF file defines, fast enough to ask of every mapped file on a node.

Pure: reads files, imports no bcc. A question about symbols is answered from .dynsym and
.symtab together, so a runtime linked statically into an executable or into another shared
object (where its symbols are only in .symtab) is found as well as libcudart.so itself.

The string tables are searched for the wanted names before any symbol is decoded, and only
the symbols whose names point at a hit are decoded: a 1 GB libtorch_cuda.so that is not a
runtime costs one pass over its string tables, and one that is costs one more pass over its
symbol tables' name fields. Answers are cached by file identity (st_dev, st_ino, st_size,
st_mtime_ns). A file that is not ELF, is truncated or cannot be read defines nothing: these
functions never raise because of a bad file.
"""

from __future__ import annotations

import bisect
import os
import re
import stat
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import BinaryIO, Generic, NamedTuple, TypeVar

from elftools.common.exceptions import ELFError
from elftools.construct.core import ConstructError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
from elftools.elf.segments import InterpSegment

__all__ = [
    "clear_cache",
    "defined_functions",
    "file_offset_to_vaddr",
    "function_addresses",
    "interpreter",
    "local_statics",
    "symbol_address",
    "symbol_at",
    "vaddr_to_file_offset",
]

# pyelftools names type 10 (STT_GNU_IFUNC) after the range it opens, STT_LOOS.
_FUNCTION_TYPES = frozenset({"STT_FUNC", "STT_GNU_IFUNC", "STT_LOOS"})

# What a malformed file can make pyelftools, or our own decoding, raise.
_BAD_FILE_ERRORS = (ELFError, ConstructError, OSError, ValueError, LookupError, struct.error)

_CACHE_SIZE = 4096

# Names are grouped by this many leading characters, so each group's pattern starts with a
# literal that the regex engine can skip to (the CUDA names all share "cuda").
_PREFIX_LEN = 4

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Definition:
    value: int
    is_function: bool


def defined_functions(path: str, wanted: frozenset[str]) -> frozenset[str]:
    """The names in `wanted` that `path` defines as functions (name@VER counts as name)."""
    found = _definitions(path, wanted)
    return frozenset(name for name, d in found.items() if d.is_function)


def function_addresses(path: str, wanted: frozenset[str]) -> dict[str, int]:
    """st_value of each function in `wanted` that `path` defines (one read for all names)."""
    found = _definitions(path, wanted)
    return {name: d.value for name, d in found.items() if d.is_function}


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
    i = bisect.bisect_right(table.starts, vaddr) - 1
    if i < 0:
        return None
    start, size, name = table.starts[i], table.sizes[i], table.names[i]
    if vaddr < start + max(size, 1):
        return name, start
    return None


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
    return _cached(path, ("statics", suffix), lambda f: _read_local_statics(f, suffix))


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
    path: str, question: tuple[object, ...], read: Callable[[BinaryIO], _T | None]
) -> _T | None:
    """Answer `question` about the file at `path`, from the cache while the file is unchanged."""
    try:
        # O_NONBLOCK: opening a FIFO must not hang a scan; regular files ignore it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        regular = stat.S_ISREG(st.st_mode)
    except OSError:
        regular = False
    if not regular:  # a directory, device or FIFO: no ELF file to read
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as f:
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, *question)
        hit = _CACHE.get(key)
        if hit is not None:
            return hit.value  # type: ignore[return-value]
        try:
            value = read(f)
        except _BAD_FILE_ERRORS:
            value = None
        _CACHE.put(key, _Answer(value))
        return value


# --- reading -------------------------------------------------------------------------------

_ELF_MAGIC = b"\x7fELF"
_SHT_SYMTAB, _SHT_DYNSYM, _SHT_NOBITS = 2, 11, 8

# ELF header fields after e_ident, and section headers, for ELFCLASS32 and ELFCLASS64.
_EHDR = {1: "HHIIIIIHHHHHH", 2: "HHIQQQIHHHHHH"}
_SHDR = {1: "IIIIIIIIII", 2: "IIQQQQIIQQ"}


class _SectionHeader(NamedTuple):
    """The fields of one section header that the pre-check uses."""

    number: int  # its index in the section header table
    type: int
    offset: int
    size: int
    link: int
    entsize: int


class _Layout(NamedTuple):
    """What the pre-check needs of a file: its byte order and its section headers."""

    endian: str  # "<" or ">"
    sections: tuple[_SectionHeader, ...]


def _definitions(path: str, wanted: frozenset[str]) -> Mapping[str, _Definition]:
    found = _cached(path, ("defs", wanted), lambda f: _read_definitions(f, wanted))
    return {} if found is None else found


def _read_definitions(f: BinaryIO, wanted: frozenset[str]) -> dict[str, _Definition]:
    size = os.fstat(f.fileno()).st_size
    layout = _layout(f, size)
    found: dict[str, _Definition] = {}
    elf: ELFFile | None = None  # parsed only for a file whose string tables name a wanted symbol
    # .dynsym comes before .symtab in section order; its answer wins where both define a name.
    for table in layout.sections:
        if table.type not in (_SHT_SYMTAB, _SHT_DYNSYM) or table.link >= len(layout.sections):
            continue
        offsets = _name_offsets(_section_bytes(f, size, layout.sections[table.link]), wanted)
        if not offsets:
            continue
        elf = elf or ELFFile(f)
        symbols = elf.get_section(table.number)
        if not isinstance(symbols, SymbolTableSection):
            continue
        for index in _symbols_named(f, size, layout.endian, table, offsets):
            named = _definition(symbols, index, wanted)
            if named is not None:
                found.setdefault(*named)
    return found


def _layout(f: BinaryIO, size: int) -> _Layout:
    """Byte order and section headers, read with struct: far cheaper than an ELFFile."""
    ident = f.read(16)
    if (
        len(ident) < 16
        or ident[:4] != _ELF_MAGIC
        or ident[4] not in _EHDR
        or ident[5] not in (1, 2)
    ):
        raise ValueError("not an ELF file")
    elfclass, endian = ident[4], "<" if ident[5] == 1 else ">"
    ehdr = struct.Struct(endian + _EHDR[elfclass])
    fields = ehdr.unpack(f.read(ehdr.size))
    shoff, shentsize, shnum = fields[5], fields[10], fields[11]
    shdr = struct.Struct(endian + _SHDR[elfclass])
    if shoff == 0 or shentsize < shdr.size:
        return _Layout(endian, ())
    if shnum == 0:  # more than 0xff00 sections: the count is in section 0's sh_size
        shnum = _section_header(f, size, shdr, shoff, 0).size
    if shoff + shnum * shentsize > size:
        raise ValueError("section headers outside the file")
    headers = tuple(_section_header(f, size, shdr, shoff + i * shentsize, i) for i in range(shnum))
    return _Layout(endian, headers)


def _section_header(
    f: BinaryIO, size: int, shdr: struct.Struct, offset: int, index: int
) -> _SectionHeader:
    if offset + shdr.size > size:
        raise ValueError("section header outside the file")
    f.seek(offset)
    _name, kind, _flags, _addr, sh_offset, sh_size, link, _info, _align, entsize = shdr.unpack(
        f.read(shdr.size)
    )
    return _SectionHeader(index, kind, sh_offset, sh_size, link, entsize)


def _section_bytes(f: BinaryIO, size: int, section: _SectionHeader) -> bytes:
    """A section's raw bytes; a section that runs past the end of the file is a bad file."""
    if section.type == _SHT_NOBITS or section.offset + section.size > size:
        raise ValueError("section outside the file")
    f.seek(section.offset)
    return f.read(section.size)


def _name_offsets(strings: bytes, wanted: frozenset[str]) -> frozenset[int]:
    """Offsets in a string table where a wanted name starts, ending in NUL or '@' (a version).

    No NUL is required before the name: linkers share a string's tail between names.
    """
    offsets: set[int] = set()
    for pattern, suffixes in _patterns(wanted):
        for match in pattern.finditer(strings):
            start, text = match.start(), match.group(1)
            offsets.add(start)
            # A wanted name that is a tail of the one matched starts inside the match.
            offsets.update(start + len(text) - len(s) for s in suffixes.get(text, ()))
    return frozenset(offsets)


@lru_cache(maxsize=64)
def _patterns(
    wanted: frozenset[str],
) -> tuple[tuple[re.Pattern[bytes], Mapping[bytes, tuple[bytes, ...]]], ...]:
    """One compiled search per group of names sharing a prefix, with each name's tails."""
    encoded = sorted(name.encode() for name in wanted if name)
    groups: dict[bytes, list[bytes]] = {}
    for name in encoded:
        groups.setdefault(name[:_PREFIX_LEN], []).append(name)
    suffixes = {
        name: tuple(other for other in encoded if other != name and name.endswith(other))
        for name in encoded
    }
    return tuple(
        (
            re.compile(b"(" + b"|".join(re.escape(n) for n in names) + b")[\x00@]"),
            {n: suffixes[n] for n in names if suffixes[n]},
        )
        for names in groups.values()
    )


def _symbols_named(
    f: BinaryIO, size: int, endian: str, table: _SectionHeader, offsets: frozenset[int]
) -> list[int]:
    """Indexes of the symbols whose st_name is one of `offsets`, reading only st_name."""
    if table.entsize < 4 or table.size % table.entsize:
        raise ValueError("malformed symbol table")
    raw = _section_bytes(f, size, table)
    # st_name is the first word of both Elf32_Sym and Elf64_Sym.
    layout = f"{endian}I{table.entsize - 4}x"
    return [i for i, (name,) in enumerate(struct.iter_unpack(layout, raw)) if name in offsets]


def _definition(
    symbols: SymbolTableSection, index: int, wanted: frozenset[str]
) -> tuple[str, _Definition] | None:
    """The symbol at `index`, if it is a definition of a wanted name."""
    symbol = symbols.get_symbol(index)
    name = symbol.name.split("@", 1)[0]
    if name not in wanted or symbol["st_shndx"] == "SHN_UNDEF" or symbol["st_value"] == 0:
        return None
    return name, _Definition(symbol["st_value"], symbol["st_info"]["type"] in _FUNCTION_TYPES)


@dataclass(frozen=True, slots=True)
class _FunctionTable:
    """Every defined function of a file, sorted by address, and its PT_LOAD segments."""

    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    names: tuple[str, ...]
    loads: tuple[tuple[int, int, int], ...]  # (p_offset, p_filesz, p_vaddr)


def _read_function_table(f: BinaryIO) -> _FunctionTable:
    elf = ELFFile(f)
    loads = tuple(
        (seg["p_offset"], seg["p_filesz"], seg["p_vaddr"])
        for seg in elf.iter_segments()
        if seg["p_type"] == "PT_LOAD"
    )
    by_address: dict[int, tuple[int, str]] = {}
    for section in elf.iter_sections():
        if not isinstance(section, SymbolTableSection):
            continue
        for symbol in section.iter_symbols():
            if (
                symbol["st_info"]["type"] not in _FUNCTION_TYPES
                or symbol["st_shndx"] == "SHN_UNDEF"
                or not symbol["st_value"]
                or not symbol.name
            ):
                continue
            # The first name seen for an address wins (.dynsym comes first).
            by_address.setdefault(
                symbol["st_value"], (symbol["st_size"], symbol.name.split("@", 1)[0])
            )
    ordered = sorted(by_address.items())
    return _FunctionTable(
        starts=tuple(a for a, _ in ordered),
        sizes=tuple(s for _, (s, _) in ordered),
        names=tuple(n for _, (_, n) in ordered),
        loads=loads,
    )


def _read_loads(f: BinaryIO) -> tuple[tuple[int, int, int], ...]:
    """(p_offset, p_filesz, p_vaddr) of each PT_LOAD segment: the program headers only."""
    return tuple(
        (seg["p_offset"], seg["p_filesz"], seg["p_vaddr"])
        for seg in ELFFile(f).iter_segments()
        if seg["p_type"] == "PT_LOAD"
    )


def _to_vaddr(loads: tuple[tuple[int, int, int], ...], file_offset: int) -> int | None:
    for p_offset, p_filesz, p_vaddr in loads:
        if p_offset <= file_offset < p_offset + p_filesz:
            return file_offset - p_offset + p_vaddr
    return None


def _read_local_statics(f: BinaryIO, suffix: str) -> LocalStatics | None:
    size = os.fstat(f.fileno()).st_size
    layout = _layout(f, size)
    tail = f"E{len(suffix)}{suffix}".encode()
    wanted = [
        t for t in layout.sections
        if t.type in (_SHT_SYMTAB, _SHT_DYNSYM) and t.link < len(layout.sections)
        and tail + b"\0" in _section_bytes(f, size, layout.sections[t.link])
    ]
    if not wanted:
        return None
    elf = ELFFile(f)
    objects: dict[int, str] = {}
    for table in wanted:
        section = elf.get_section(table.number)
        if not isinstance(section, SymbolTableSection):
            continue
        for symbol in section.iter_symbols():
            name = symbol.name
            if (
                name.startswith("_ZZ")
                and name.endswith(tail.decode())
                and symbol["st_info"]["type"] == "STT_OBJECT"
                and symbol["st_shndx"] != "SHN_UNDEF"
                and symbol["st_value"]
            ):
                objects.setdefault(symbol["st_value"], name)
    loads = [seg["p_vaddr"] for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"]
    return LocalStatics(
        objects=tuple(sorted(objects.items())),
        relocatable=elf["e_type"] == "ET_DYN",
        first_vaddr=min(loads) if loads else 0,
    )


def _read_interpreter(f: BinaryIO) -> str | None:
    for segment in ELFFile(f).iter_segments():
        if isinstance(segment, InterpSegment):
            return segment.get_interp_name()
    return None
