"""producer/discover/elfsyms.py on files made to hurt it: sizes and offsets that lie, sparse files
that claim hundreds of GB, and symbol tables of millions of entries.

The files are generated here (a minimal ELF64 writer): every field can be set to what an
attacker would choose, which a compiler never does.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from gpuflight.producer.discover import elfsyms, procmaps
from tests.conftest import require
from tests.support.elves import NVIDIA_DIRS, PROGRAM_RUNTIME, Elves, FakeProc

SYM = np.dtype([
    ("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
    ("value", "<u8"), ("size", "<u8"),
])
STT_OBJECT, STT_FUNC, STB_GLOBAL = 1, 2, 1
SHT_STRTAB, SHT_SYMTAB, SHT_DYNSYM = 3, 2, 11
GB = 1 << 30


@dataclass
class Section:
    type: int
    data: bytes
    link: int = 0
    entsize: int = 0
    offset: int = 0  # set by build()
    size: int | None = None  # what the header claims (None: the data's length)


def strings_and_symbols(
    names: list[tuple[str, int]], filler: int = 0
) -> tuple[bytes, np.ndarray]:
    """A string table and symbols: `filler` unnamed-looking functions, then `names` (name,
    type), each defined at its own address."""
    table = bytearray(b"\0")
    symbols = np.zeros(1 + filler + len(names), SYM)  # entry 0 is the null symbol
    if filler:
        # Many symbols share one filler name: the table's size is the symbols', not the names'.
        table += b"filler_function_name\0"
        symbols["name"][1 : 1 + filler] = 1
        symbols["info"][1 : 1 + filler] = (STB_GLOBAL << 4) | STT_FUNC
        symbols["shndx"][1 : 1 + filler] = 1
        symbols["value"][1 : 1 + filler] = np.arange(filler, dtype=np.uint64) * 16 + 0x1000
    for i, (name, kind) in enumerate(names, start=1 + filler):
        symbols[i] = (len(table), (STB_GLOBAL << 4) | kind, 0, 1, 0x100000 + 64 * i, 16)
        table += name.encode() + b"\0"
    return bytes(table), symbols


def build(sections: list[Section], e_shnum: int | None = None) -> bytes:
    """An ELF64 little-endian shared object: the header, the sections' data, their headers."""
    out = bytearray(64)
    for section in sections:
        out += b"\0" * (-len(out) % 8)
        section.offset = len(out)
        out += section.data
    out += b"\0" * (-len(out) % 8)
    shoff = len(out)
    out += bytes(64)  # section 0
    for s in sections:
        size = len(s.data) if s.size is None else s.size
        out += struct.pack("<IIQQQQIIQQ", 0, s.type, 0, 0, s.offset, size, s.link, 0, 8, s.entsize)
    shnum = len(sections) + 1 if e_shnum is None else e_shnum
    header = struct.pack(
        "<16sHHIQQQIHHHHHH",
        b"\x7fELF\x02\x01\x01" + bytes(9), 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, shnum, 0,
    )
    out[:64] = header
    return bytes(out)


def runtime_like(**dynstr: int) -> tuple[list[Section], set[str]]:
    """.dynstr/.dynsym naming two runtime functions, .strtab/.symtab naming them too."""
    names = [("cudaMalloc", STT_FUNC), ("cudaLaunchKernel", STT_FUNC)]
    strings, symbols = strings_and_symbols(names)
    sections = [
        Section(SHT_STRTAB, strings, **dynstr),  # 1: .dynstr
        Section(SHT_DYNSYM, symbols.tobytes(), link=1, entsize=SYM.itemsize),  # 2: .dynsym
        Section(SHT_STRTAB, strings),  # 3: .strtab
        Section(SHT_SYMTAB, symbols.tobytes(), link=3, entsize=SYM.itemsize),  # 4: .symtab
    ]
    return sections, {"cudaMalloc", "cudaLaunchKernel"}


def every_question(path: Path) -> None:
    """Ask everything elfsyms answers; none of it may raise."""
    elfsyms.clear_cache()
    p = str(path)
    elfsyms.defined_functions(p, procmaps.RUNTIME_SYMBOLS)
    elfsyms.function_addresses(p, procmaps.RUNTIME_SYMBOLS)
    elfsyms.symbol_address(p, "cudaMalloc")
    elfsyms.symbol_at(p, 0x100)
    elfsyms.file_offset_to_vaddr(p, 0x100)
    elfsyms.local_statics(p, "__handle")
    elfsyms.interpreter(p)


def test_generated_runtime_is_read(tmp_path: Path) -> None:
    sections, names = runtime_like()
    path = tmp_path / "libcudart.so.12"
    path.write_bytes(build(sections))
    assert elfsyms.defined_functions(str(path), procmaps.RUNTIME_SYMBOLS) == names
    assert elfsyms.symbol_address(str(path), "cudaMalloc") == 0x100000 + 64


def test_a_string_table_claiming_200_gb_is_not_read(tmp_path: Path) -> None:
    # Issue 17, defect 1: the .dynstr size field says 200 GB; the file is small.
    sections, names = runtime_like(size=200 * GB)
    path = tmp_path / "libcudart.so.12"
    path.write_bytes(build(sections))
    every_question(path)
    # The sound tables still answer: .symtab names both functions.
    assert elfsyms.defined_functions(str(path), procmaps.RUNTIME_SYMBOLS) == names


def test_a_sparse_file_of_200_gb_is_not_read_whole(tmp_path: Path) -> None:
    # The same, as the sweep did it: the file really is 200 GB long (sparse, a few KB on
    # disk) and .dynstr runs to its end, inside the file.
    sections, names = runtime_like()
    path = tmp_path / "libcudart.so.12"
    data = build(sections)
    dynstr_at = sections[0].offset
    sections[0].size = 200 * GB - dynstr_at
    data = build(sections)
    path.write_bytes(data)
    try:
        os.truncate(path, 200 * GB)
    except OSError as exc:
        pytest.skip(f"this file system cannot hold a sparse 200 GB file: {exc}")
    assert path.stat().st_size == 200 * GB
    assert path.stat().st_blocks * 512 < 1 << 24  # sparse: nothing was written
    every_question(path)
    assert elfsyms.defined_functions(str(path), procmaps.RUNTIME_SYMBOLS) == names


@pytest.mark.parametrize(
    "field",
    ["offset", "size", "link", "entsize", "e_shnum", "symbol_name", "symbol_shndx"],
)
@pytest.mark.parametrize("value", [0, 1, 7, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63, 2**64 - 1])
def test_lying_fields_never_raise(tmp_path: Path, field: str, value: int) -> None:
    sections, _ = runtime_like()
    path = tmp_path / "libx.so"
    data = bytearray(build(sections))
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    dynsym = shoff + 2 * 64  # section 2's header
    if field == "e_shnum":
        struct.pack_into("<H", data, 0x3C, value & 0xFFFF)
    elif field == "offset":
        struct.pack_into("<Q", data, dynsym + 24, value)
    elif field == "size":
        struct.pack_into("<Q", data, dynsym + 32, value)
    elif field == "link":
        struct.pack_into("<I", data, dynsym + 40, value & 0xFFFFFFFF)
    elif field == "entsize":
        struct.pack_into("<Q", data, dynsym + 56, value)
    else:
        first = sections[1].offset + SYM.itemsize  # the first real symbol of .dynsym
        if field == "symbol_name":
            struct.pack_into("<I", data, first, value & 0xFFFFFFFF)
        else:
            struct.pack_into("<H", data, first + 6, value & 0xFFFF)
    path.write_bytes(bytes(data))
    every_question(path)


def test_extended_section_count_that_lies(tmp_path: Path) -> None:
    # e_shnum 0: the count is section 0's sh_size, here 2**40.
    sections, _ = runtime_like()
    data = bytearray(build(sections, e_shnum=0))
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    struct.pack_into("<Q", data, shoff + 32, 1 << 40)
    path = tmp_path / "libx.so"
    path.write_bytes(bytes(data))
    every_question(path)
    assert elfsyms.defined_functions(str(path), procmaps.RUNTIME_SYMBOLS) == frozenset()


def test_a_file_shrinking_between_header_and_tables(tmp_path: Path) -> None:
    # Read with pread, not mmap: a short read is a bad file, never SIGBUS.
    sections, _ = runtime_like()
    data = build(sections)
    path = tmp_path / "libx.so"
    path.write_bytes(data[: sections[3].offset + 8])
    every_question(path)


def test_two_million_symbols(tmp_path: Path) -> None:
    # Issue 17, defect 6: a 48 MB .symtab. Found right (the time it takes is in
    # bench/startup.py: a vectorised pass, not a Python loop per symbol).
    names = [
        ("cudaMalloc", STT_FUNC),
        ("_ZZ24__device_stub__Z1kPfS_E8__handle", STT_OBJECT),
        ("cudaFree", STT_OBJECT),  # an object of that name is no function
    ]
    strings, symbols = strings_and_symbols(names, filler=2_000_000)
    assert symbols.nbytes >= 48_000_000
    sections = [
        Section(SHT_STRTAB, strings),
        Section(SHT_SYMTAB, symbols.tobytes(), link=1, entsize=SYM.itemsize),
    ]
    path = tmp_path / "libbig.so"
    path.write_bytes(build(sections))
    assert elfsyms.defined_functions(str(path), procmaps.RUNTIME_SYMBOLS) == {"cudaMalloc"}
    statics = elfsyms.local_statics(str(path), "__handle")
    assert statics is not None
    assert [name for _, name in statics.objects] == ["_ZZ24__device_stub__Z1kPfS_E8__handle"]
    # The function table covers every filler function; the one at 0x1000 is named.
    vaddr_of = elfsyms.file_offset_to_vaddr(str(path), 0x1000)
    assert vaddr_of is None  # no PT_LOAD segments: no address to map to


# --- a runtime linked into another library: only what that library calls ---------------------

STATIC_RUNTIME = r"""
#define HIDDEN __attribute__((visibility("hidden"), noinline))
HIDDEN int cudaMalloc(void **p, unsigned long n) { *p = 0; return (int)n; }
HIDDEN int cudaFree(void *p) { return p != 0; }
HIDDEN int cudaLaunchKernel(const void *f) { return f != 0; }
/* The runtime's own code calling one of its API functions is not the library's call. */
HIDDEN int cudaMallocHost(void **p, unsigned long n) { return cudaMalloc(p, n) + 1; }
int nccl_alloc(void **p) { return cudaMalloc(p, 64); }
int nccl_launch(void) { return cudaLaunchKernel((const void *)nccl_alloc); }
"""


def _compile(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    import shutil

    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / name
    subprocess.run(["cc", "-O1", "-fPIC", "-shared", *flags, "-o", str(out), str(src)], check=True)
    return out


def test_a_static_runtime_is_probed_only_where_its_file_calls_it(tmp_path: Path) -> None:
    lib = _compile(tmp_path, "libnccl.so.2", STATIC_RUNTIME)
    wanted = procmaps.RUNTIME_SYMBOLS
    assert elfsyms.defined_functions(str(lib), wanted) == {
        "cudaMalloc", "cudaFree", "cudaLaunchKernel", "cudaMallocHost"
    }
    called = elfsyms.referenced_functions(str(lib), wanted)
    assert called == frozenset({"cudaMalloc", "cudaLaunchKernel"})


def test_an_exported_runtime_is_probed_whole(tmp_path: Path) -> None:
    lib = _compile(tmp_path, "libcudart.so.12", STATIC_RUNTIME.replace('"hidden"', '"default"'))
    assert elfsyms.referenced_functions(str(lib), procmaps.RUNTIME_SYMBOLS) is None


def test_discovery_probes_a_static_runtime_for_what_its_file_calls(tmp_path: Path) -> None:

    nccl = _compile(tmp_path, "libnccl.so.2", STATIC_RUNTIME)
    cudart = _compile(tmp_path, "libcudart.so.12", STATIC_RUNTIME.replace('"hidden"', '"default"'))
    proc = FakeProc(tmp_path / "proc")
    proc.process(100)
    proc.map(100, "/usr/lib/libnccl.so.2", nccl)
    proc.map(100, "/usr/lib/libcudart.so.12", cudart)
    libraries = {lib.path: lib for lib in procmaps.scan(proc.root).libraries.values()}
    linked_in = libraries["/usr/lib/libnccl.so.2"]
    assert linked_in.kind == "runtime"
    assert linked_in.symbols == {"cudaMalloc", "cudaFree", "cudaLaunchKernel", "cudaMallocHost"}
    assert linked_in.probe_only == frozenset({"cudaMalloc", "cudaLaunchKernel"})
    assert libraries["/usr/lib/libcudart.so.12"].probe_only is None


# --- a file that imports the runtime holds no static copy: its .symtab is not read -----------

#: A library linked against libcudart.so (cudaMalloc undefined in .dynsym) whose .symtab has
#: a local function named like another runtime function.
IMPORTS_THE_RUNTIME = r"""
extern int cudaMalloc(void **p, unsigned long n);
__attribute__((visibility("hidden"), noinline)) int cudaFree(void *p) { return p != 0; }
int torch_alloc(void **p) { return cudaMalloc(p, 64) + cudaFree(*p); }
"""

#: A static runtime in a library linked with -lcuda: it imports the driver's functions
#: (cuMemAlloc_v2 undefined in .dynsym), which says nothing about the runtime.
STATIC_RUNTIME_IMPORTING_THE_DRIVER = STATIC_RUNTIME + r"""
extern int cuMemAlloc_v2(unsigned long long *p, unsigned long n);
int nccl_driver_alloc(unsigned long long *p) { return cuMemAlloc_v2(p, 64); }
"""


def _symbol_tables_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The section types of the symbol tables elfsyms decodes from now on."""
    read: list[int] = []
    decode = elfsyms._read_symbols

    def spy(elf: elfsyms._Elf, table: elfsyms._Section) -> object:
        read.append(table.type)
        return decode(elf, table)

    monkeypatch.setattr(elfsyms, "_read_symbols", spy)
    return read


def test_a_file_importing_the_runtime_is_not_searched_for_a_static_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = str(_compile(tmp_path, "libtorch_cuda.so", IMPORTS_THE_RUNTIME))
    runtime = procmaps.RUNTIME_SYMBOLS
    # The local cudaFree is there to be found by a plain question ...
    assert elfsyms.defined_functions(lib, runtime) == {"cudaFree"}
    elfsyms.clear_cache()
    read = _symbol_tables_read(monkeypatch)
    # ... but the import of cudaMalloc shows the runtime comes from another file: .symtab
    # is not decoded at all.
    assert elfsyms.defined_functions(lib, runtime, unless_imported=runtime) == frozenset()
    assert read == [SHT_DYNSYM]


def test_a_static_runtime_importing_the_driver_is_still_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = str(_compile(tmp_path, "libnccl.so.2", STATIC_RUNTIME_IMPORTING_THE_DRIVER))
    read = _symbol_tables_read(monkeypatch)
    runtime = procmaps.RUNTIME_SYMBOLS
    wanted = runtime | procmaps.DRIVER_SYMBOLS
    assert elfsyms.defined_functions(lib, wanted, unless_imported=runtime) == {
        "cudaMalloc", "cudaFree", "cudaLaunchKernel", "cudaMallocHost"
    }
    assert read == [SHT_DYNSYM, SHT_SYMTAB]
    called = frozenset({"cudaMalloc", "cudaLaunchKernel"})
    assert elfsyms.referenced_functions(lib, runtime) == called


def test_classification_finds_static_runtimes_beside_files_importing_one(
    tmp_path: Path,
) -> None:

    importer = _compile(tmp_path, "libtorch_cuda.so", IMPORTS_THE_RUNTIME)
    nccl = _compile(tmp_path, "libnccl.so.2", STATIC_RUNTIME_IMPORTING_THE_DRIVER)
    proc = FakeProc(tmp_path / "proc")
    proc.process(100)
    proc.map(100, "/usr/lib/libtorch_cuda.so", importer)
    proc.map(100, "/usr/lib/libnccl.so.2", nccl)
    libraries = {lib.path: lib for lib in procmaps.scan(proc.root).libraries.values()}
    assert set(libraries) == {"/usr/lib/libnccl.so.2"}
    assert libraries["/usr/lib/libnccl.so.2"].symbols == {
        "cudaMalloc", "cudaFree", "cudaLaunchKernel", "cudaMallocHost"
    }
    called = frozenset({"cudaMalloc", "cudaLaunchKernel"})
    assert libraries["/usr/lib/libnccl.so.2"].probe_only == called


# --- the rel32 search: every byte, exactly ---------------------------------------------------


def _rel32_hits_by_hand(code: bytes, vaddr: int, addresses: set[int]) -> list[tuple[int, int]]:
    hits = []
    for offset in range(len(code) - 3):
        displacement = int.from_bytes(code[offset : offset + 4], "little", signed=True)
        target = vaddr + offset + 4 + displacement
        if target in addresses:
            hits.append((offset, target))
    return hits


def test_rel32_hits_are_every_byte_pointing_at_an_address() -> None:
    rng = np.random.default_rng(14)
    vaddr = 0x7F_0000_0000  # above 4 GB: the 32-bit span test wraps
    code = bytearray(rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes())
    addresses = sorted({vaddr + 5000, vaddr + 5100, vaddr - 300, vaddr + 30_000})
    for offset, target in ((10, addresses[1]), (20, addresses[0]), (19_990, addresses[3])):
        code[offset : offset + 4] = (target - vaddr - offset - 4).to_bytes(4, "little", signed=True)
    sorted_addresses = np.array(addresses, dtype=np.int64)
    chunk = elfsyms._CODE_CHUNK
    found = []
    for start in range(0, len(code), chunk):
        sites, targets = elfsyms._rel32_hits(
            bytes(code[start : start + chunk + 3]), vaddr + start, sorted_addresses
        )
        found += [(start + s, t) for s, t in zip(sites.tolist(), targets.tolist(), strict=True)]
    expected = _rel32_hits_by_hand(bytes(code), vaddr, set(addresses))
    assert found == expected
    assert {(10, addresses[1]), (20, addresses[0]), (19_990, addresses[3])} <= set(found)


def test_rel32_hits_drop_targets_4_gb_away() -> None:
    # vaddr 4 GB up, the address near 0: the byte's target wraps onto it in 32 bits only.
    vaddr, address = 1 << 32, 0x1000
    code = (address - 4).to_bytes(4, "little", signed=True) + bytes(8)
    assert (vaddr + 4 + address - 4 - address) % (1 << 32) == 0
    sites, targets = elfsyms._rel32_hits(code, vaddr, np.array([address], dtype=np.int64))
    assert sites.tolist() == [] and targets.tolist() == []
    sites, targets = elfsyms._rel32_hits(code, 0, np.array([address], dtype=np.int64))
    assert sites.tolist() == [0] and targets.tolist() == [address]


# --- issue 25, item 3: what a file's headers claim costs no more than what it holds ---------

#: Asked of a crafted file in a fresh interpreter: what discovery, attach plans and kernel
#: names ask, and the peak memory and CPU time the answers cost.
MEASURE = r"""
import json, resource, sys, time
from gpuflight.producer.discover import procmaps, elfsyms
path = sys.argv[1]
runtime = procmaps.RUNTIME_SYMBOLS
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.process_time()
found = elfsyms.defined_functions(path, runtime | procmaps.DRIVER_SYMBOLS, runtime)
classified = time.process_time() - started
found |= elfsyms.defined_functions(path, runtime)
found |= set(elfsyms.function_addresses(path, runtime))
elfsyms.referenced_functions(path, runtime)
elfsyms.symbol_at(path, 0x1000)
elfsyms.local_statics(path, "__handle")
print(json.dumps({
    "found": sorted(found),
    "classify_cpu_s": classified,
    "cpu_s": time.process_time() - started,
    "rss_increase_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
}))
"""


def _sparse_elf(path: Path, table_bytes: int) -> Path:
    from tests.fixtures.elf import sparse_tables

    try:
        size = sparse_tables.write(path, table_bytes)
    except OSError as exc:
        pytest.skip(f"this file system cannot hold a sparse file of 4 GB: {exc}")
    assert path.stat().st_size == size
    if path.stat().st_blocks * 512 > 1 << 20:
        pytest.skip("this file system does not keep holes (the file was written whole)")
    return path


def test_a_sparse_file_claiming_four_tables_of_a_gib_costs_little_memory_and_time(
    tmp_path: Path,
) -> None:
    # Issue 25, item 3: 2.6 GB of RSS and a 20 s stall, for a file of 24 KB on disk.
    import json

    from tests.conftest import REPO
    from tests.fixtures.elf import sparse_tables

    path = _sparse_elf(tmp_path / "libcrafted.so", sparse_tables.TABLE_BYTES)
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )
    measured = json.loads(result.stdout)
    assert measured["rss_increase_mb"] < 64, measured  # was 2,350 MB
    assert measured["cpu_s"] < 1.0, measured  # was 12.5 s
    assert measured["found"] == []  # defines nothing that can be read
    # Refused in one line, once for the file, naming it.
    refusals = [line for line in result.stderr.splitlines() if str(path) in line]
    assert len(refusals) == 1, result.stderr
    assert "read as defining nothing" in refusals[0]


def test_tables_within_the_budget_that_are_holes_are_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Four tables of 100 MiB: each within the per-table bound and the per-file budget, so
    # only the bytes the file has on disk tell that they are holes.
    path = _sparse_elf(tmp_path / "libcrafted.so", 100 << 20)
    read: list[int] = []
    pread = os.pread

    def counted(fd: int, length: int, offset: int) -> bytes:
        read.append(length)
        return pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", counted)
    every_question(path)
    for _ in range(2):  # answered from the cache, and not warned about again
        assert elfsyms.defined_functions(str(path), procmaps.RUNTIME_SYMBOLS) == frozenset()
        assert elfsyms.symbol_address(str(path), "cudaMalloc") is None
    assert sum(read) < 1 << 20, f"{sum(read)} bytes read"
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and str(path) in r.message]
    assert len(warnings) == 1 and "not on disk" in warnings[0].message


class _UnderCounted:
    """A stat result whose file system counts 8 blocks for any file (ZFS before its
    transaction group is written, a compressed file system, FUSE)."""

    def __init__(self, st: os.stat_result) -> None:
        self._st = st

    def __getattr__(self, name: str) -> object:
        return 8 if name == "st_blocks" else getattr(self._st, name)


def test_a_real_runtime_is_read_where_the_file_system_under_counts_its_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The check a sparse file fails must not hide a genuine runtime: its tables hold no hole.

    libraries = sorted(lib for d in NVIDIA_DIRS for lib in d.glob("*/lib/libcudart.so.*"))
    require(None if libraries else "the nvidia-cuda-runtime wheels are not installed")
    runtime = procmaps.RUNTIME_SYMBOLS
    expected = {}
    for library in libraries:
        expected[library] = (
            elfsyms.defined_functions(str(library), runtime | procmaps.DRIVER_SYMBOLS, runtime),
            elfsyms.function_addresses(str(library), runtime),
        )
        assert expected[library][0] == runtime, library
    elfsyms.clear_cache()
    fstat, lseek = os.fstat, os.lseek
    holes_asked: list[int] = []

    def asked(fd: int, offset: int, whence: int) -> int:
        if whence == os.SEEK_HOLE:
            holes_asked.append(offset)
        return lseek(fd, offset, whence)

    monkeypatch.setattr(os, "fstat", lambda fd: _UnderCounted(fstat(fd)))
    monkeypatch.setattr(os, "lseek", asked)
    monkeypatch.setattr(elfsyms, "_UNCHECKED_BYTES", 0)  # the whole file is past the blocks
    for library in libraries:
        assert (
            elfsyms.defined_functions(str(library), runtime | procmaps.DRIVER_SYMBOLS, runtime),
            elfsyms.function_addresses(str(library), runtime),
        ) == expected[library], library
    assert holes_asked  # each table was checked, and held no hole


def test_a_file_of_a_thousand_symbol_tables_costs_what_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    strings, symbols = strings_and_symbols([("cudaMalloc", STT_FUNC)])
    dynsym = Section(SHT_DYNSYM, symbols.tobytes(), link=1, entsize=SYM.itemsize)
    path = tmp_path / "libmany.so"
    path.write_bytes(build([Section(SHT_STRTAB, strings), *[dynsym] * 1000]))
    read = _symbol_tables_read(monkeypatch)
    assert elfsyms.defined_functions(str(path), procmaps.RUNTIME_SYMBOLS) == {"cudaMalloc"}
    assert read == [SHT_DYNSYM]


#: Names long enough to cross the pieces the tables are read in, below.
LONG = "Z" * 700


def test_tables_are_read_in_pieces_with_the_answers_of_a_whole_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [
        ("cudaMalloc", STT_FUNC),
        (f"_ZZ{len(LONG)}{LONG}E8__handle", STT_OBJECT),
        ("cudaFree", STT_FUNC),
        ("_ZZ1kE8__handle", STT_OBJECT),
        (f"x{LONG}cudaLaunchKernel", STT_FUNC),  # not the runtime's: a longer name
        ("cudaMemcpy@@libcudart.so.12", STT_FUNC),
        (f"_ZZ2k{LONG}E8__handle", STT_OBJECT),
    ]
    strings, symbols = strings_and_symbols(names, filler=3000)
    sections = [
        Section(SHT_STRTAB, strings),
        Section(SHT_SYMTAB, symbols.tobytes(), link=1, entsize=SYM.itemsize),
    ]
    path = str(tmp_path / "libpieces.so")
    Path(path).write_bytes(build(sections))
    runtime = procmaps.RUNTIME_SYMBOLS

    def answers() -> tuple[object, ...]:
        elfsyms.clear_cache()
        functions = elfsyms._cached(path, ("functions",), elfsyms._read_function_table)
        assert functions is not None
        return (
            elfsyms.defined_functions(path, runtime),
            elfsyms.function_addresses(path, runtime),
            elfsyms.local_statics(path, "__handle"),
            [a.tolist() for a in (functions.starts, functions.sizes, functions.names)],
        )

    whole = answers()
    assert whole[0] == {"cudaMalloc", "cudaFree", "cudaMemcpy"}
    statics = whole[2]
    assert isinstance(statics, elfsyms.LocalStatics)
    assert sorted(name for _, name in statics.objects) == sorted(
        name for name, kind in names if kind == STT_OBJECT
    )
    lengths: list[int] = []
    pread = os.pread

    def counted(fd: int, length: int, offset: int) -> bytes:
        lengths.append(length)
        return pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", counted)
    monkeypatch.setattr(elfsyms, "_CHUNK_BYTES", 997)  # odd: names and symbols straddle pieces
    monkeypatch.setattr(elfsyms, "_MAX_NAME_BYTES", 64)  # long names are read back
    assert answers() == whole
    assert max(lengths) <= 997 + 64  # a piece, and the most a name may cross its end by


def test_a_static_runtime_read_in_pieces_is_probed_for_the_same_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = str(_compile(tmp_path, "libnccl.so.2", STATIC_RUNTIME))
    runtime = procmaps.RUNTIME_SYMBOLS
    whole = elfsyms.referenced_functions(lib, runtime)
    assert whole == frozenset({"cudaMalloc", "cudaLaunchKernel"})
    elfsyms.clear_cache()
    monkeypatch.setattr(elfsyms, "_CHUNK_BYTES", 97)  # relocations 4 a piece, symbols 4
    assert elfsyms.referenced_functions(lib, runtime) == whole
    assert elfsyms.defined_functions(lib, runtime) == {
        "cudaMalloc", "cudaFree", "cudaLaunchKernel", "cudaMallocHost"
    }


# --- elfsyms ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("libcudart.so.12", PROGRAM_RUNTIME),
        ("libcudart.stripped.so", PROGRAM_RUNTIME),  # .dynsym survives strip
        ("libcublasLt.so", PROGRAM_RUNTIME),  # hidden: only in .symtab
        ("app", PROGRAM_RUNTIME),  # a program: only in .symtab
        ("app.stripped", frozenset()),  # nothing left to see
        ("libuses.so", frozenset()),  # calls cudaMalloc, defines nothing
        ("libfoo.so", frozenset()),
        ("ld-linux-x86-64.so.2", frozenset()),
        ("text.so", frozenset()),
        ("truncated.so", frozenset()),
        ("header-only.so", frozenset()),
        ("empty.so", frozenset()),
    ],
)
def test_defined_functions(elves: Elves, name: str, expected: frozenset[str]) -> None:
    wanted = procmaps.RUNTIME_SYMBOLS | {"cudaMalloc"}
    assert elfsyms.defined_functions(str(elves[name]), wanted) == expected


def test_static_program_defines_runtime_only_in_symtab(elves: Elves) -> None:
    with open(elves["app"], "rb") as f:
        elf = ELFFile(f)
        dynsym = elf.get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        assert "cudaLaunchKernel" not in {s.name for s in dynsym.iter_symbols()}


def test_versioned_names_count(elves: Elves) -> None:
    path = str(elves["versioned"])
    assert b"cudaMalloc@@libcudart.so.12\0" in elves["versioned"].read_bytes()
    assert elfsyms.defined_functions(path, frozenset({"cudaMalloc", "cudaFree"})) == {"cudaMalloc"}
    assert elfsyms.symbol_address(path, "cudaMalloc") == elfsyms.symbol_address(
        path, "cudaMalloc_v12"
    )


def test_symbol_address_is_st_value(elves: Elves) -> None:
    path = elves["libcudart.so.12"]
    with open(path, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        symbols = dynsym.get_symbol_by_name("cudaMemcpy")
        assert symbols
        expected = symbols[0]["st_value"]
    assert expected != 0
    assert elfsyms.symbol_address(str(path), "cudaMemcpy") == expected
    assert elfsyms.symbol_address(str(path), "cudaFree") is None
    assert elfsyms.symbol_address(str(elves["text.so"]), "cudaMemcpy") is None


def test_bad_paths_define_nothing(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.so"
    os.mkfifo(fifo)
    for path in (tmp_path / "missing.so", tmp_path, fifo):
        assert elfsyms.defined_functions(str(path), procmaps.RUNTIME_SYMBOLS) == frozenset()
        assert elfsyms.interpreter(str(path)) is None


def test_corrupt_files_never_raise(tmp_path: Path, elves: Elves) -> None:
    good = elves["libcudart.so.12"].read_bytes()
    with open(elves["libcudart.so.12"], "rb") as f:
        shoff = ELFFile(f).header["e_shoff"]
    # Bytes that steer parsing: the ELF header, the section headers, and the first symbols.
    targets = [*range(64), *range(shoff, len(good)), *range(0x200, 0x600)]
    rng = random.Random(0)
    path = tmp_path / "libcudart.so.12"
    for _ in range(150):
        corrupt = bytearray(good)
        for at in rng.sample(targets, rng.randint(1, 4)):
            corrupt[at] = rng.choice((0x00, 0xFF, rng.randrange(256)))
        path.write_bytes(corrupt)
        elfsyms.clear_cache()  # the same path, size and maybe mtime: do not answer from cache
        elfsyms.defined_functions(str(path), procmaps.RUNTIME_SYMBOLS)
        elfsyms.symbol_address(str(path), "cudaMemcpy")
        elfsyms.interpreter(str(path))


def test_interpreter(elves: Elves) -> None:
    assert elfsyms.interpreter(str(elves["weird"])) == "/opt/weird/myloader.so"
    assert elfsyms.interpreter(str(elves["libfoo.so"])) is None
    assert elfsyms.interpreter(str(elves["text.so"])) is None


def test_answers_follow_the_file_not_the_path(tmp_path: Path, elves: Elves) -> None:
    path = tmp_path / "libx.so"
    shutil.copy(elves["libfoo.so"], path)
    assert elfsyms.defined_functions(str(path), PROGRAM_RUNTIME) == frozenset()
    # Rewritten in place (same inode, new size and mtime): read again.
    path.write_bytes(elves["libcudart.so.12"].read_bytes())
    assert elfsyms.defined_functions(str(path), PROGRAM_RUNTIME) == PROGRAM_RUNTIME


# --- the list of probed functions ------------------------------------------------------------


# --- scanning fake trees ---------------------------------------------------------------------


# --- the hand-written tree -------------------------------------------------------------------


# --- this machine's /proc --------------------------------------------------------------------


# --- speed -----------------------------------------------------------------------------------
