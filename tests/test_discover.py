"""Discovery of runtime and loader files, on fake /proc trees (no root needed) and on this one."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from producer import discover, elfsyms
from producer.discover import Classifier, LibraryFile, LibraryKey, Snapshot
from tests.conftest import require
from tests.support.probe_table import header_rows

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ELF_SOURCES = FIXTURES / "elf"
STATIC_PROC = FIXTURES / "proc"
# Where the nvidia-cuda-runtime wheels (dev dependencies) put their files.
NVIDIA_DIRS = [Path(entry) / "nvidia" for entry in sys.path if (Path(entry) / "nvidia").is_dir()]

PROGRAM_RUNTIME = frozenset({"cudaLaunchKernel", "cudaMemcpy"})


# --- ELF files, built once per session ------------------------------------------------------


@dataclass(frozen=True)
class Elves:
    """The ELF (and not-quite-ELF) files of tests/fixtures/elf, built into one folder."""

    dir: Path

    def __getitem__(self, name: str) -> Path:
        path = self.dir / name
        assert path.exists(), f"{name} was not built"
        return path


def _cc(out: Path, *args: str) -> None:
    subprocess.run(["cc", "-O1", "-o", str(out), *args], check=True, cwd=ELF_SOURCES)


@pytest.fixture(scope="session")
def elves(tmp_path_factory: pytest.TempPathFactory) -> Elves:
    require(None if shutil.which("cc") else "needs a C compiler (cc)")
    out = tmp_path_factory.mktemp("elves")
    shared = ("-shared", "-fPIC")
    _cc(
        out / "libcudart.so.12",
        *shared,
        "-Wl,-soname,libcudart.so.12",
        "-Wl,--version-script=cudart.map",
        "runtime.c",
    )
    _cc(out / "libcublasLt.so", *shared, "-fvisibility=hidden", "runtime.c", "foo.c")
    _cc(out / "app", "app.c", "runtime.c")
    _cc(out / "versioned", "versioned.c", "-Wl,--version-script=cudart.map")
    _cc(out / "ld-linux-x86-64.so.2", *shared, "loader.c")
    _cc(out / "myloader.so", *shared, "loader.c")
    _cc(out / "libfoo.so", *shared, "foo.c")
    _cc(out / "ld-fake.so.1", *shared, "foo.c")
    _cc(out / "libuses.so", *shared, "uses.c")
    _cc(out / "holder", "holder.c", "-ldl")
    _cc(out / "weird", "holder.c", "-ldl", "-Wl,--dynamic-linker=/opt/weird/myloader.so")
    subprocess.run(["strip", "-o", str(out / "app.stripped"), str(out / "app")], check=True)
    subprocess.run(
        ["strip", "-o", str(out / "libcudart.stripped.so"), str(out / "libcudart.so.12")],
        check=True,
    )
    whole = (out / "libcudart.so.12").read_bytes()
    (out / "truncated.so").write_bytes(whole[: len(whole) // 2])
    (out / "header-only.so").write_bytes(whole[:64])
    (out / "empty.so").write_bytes(b"")
    (out / "text.so").write_bytes(b"cudaLaunchKernel\0cudaMemcpy\0 is not an ELF file\n")
    return Elves(out)


@pytest.fixture(autouse=True)
def _fresh_elf_cache() -> Iterator[None]:
    elfsyms.clear_cache()
    yield
    elfsyms.clear_cache()


# --- a fake /proc tree with real inodes ------------------------------------------------------


@dataclass
class FakeProc:
    """A /proc tree under `root` whose maps name real files by their real dev and inode."""

    root: Path
    _next_address: int = 0x7F0000000000
    _maps: dict[int, list[str]] = field(default_factory=dict)

    def process(self, pid: int, ppid: int = 1, comm: str = "python3") -> Path:
        pid_dir = self.root / str(pid)
        pid_dir.mkdir(parents=True, exist_ok=True)
        (pid_dir / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194304 0\n")
        self._maps.setdefault(pid, [])
        self._write_maps(pid)
        return pid_dir

    def map(
        self,
        pid: int,
        path: str,
        file: Path,
        *,
        in_root: bool = True,
        map_files: bool = False,
        deleted: bool = False,
    ) -> str:
        """Map `file` into `pid` at `path`; return the map_files name of its code mapping."""
        st = file.stat()
        dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
        start = self._next_address
        code, end = start + 0x1000, start + 0x3000
        self._next_address += 0x100000
        shown = path + (" (deleted)" if deleted else "")
        self._maps[pid] += [
            f"{start:x}-{code:x} r--p 00000000 {dev} {st.st_ino}    {shown}",
            f"{code:x}-{end:x} r-xp 00001000 {dev} {st.st_ino}    {shown}",
            f"{end:x}-{end + 0x1000:x} rw-p 00003000 {dev} {st.st_ino}    {shown}",
            f"{end + 0x1000:x}-{end + 0x2000:x} rw-p 00000000 00:00 0",
        ]
        self._write_maps(pid)
        if in_root:
            inside = self.root / str(pid) / "root" / path.lstrip("/")
            inside.parent.mkdir(parents=True, exist_ok=True)
            os.link(file, inside)  # a hard link: the same inode, as a bind mount would show
        name = f"{code:x}-{end:x}"
        if map_files:
            links = self.root / str(pid) / "map_files"
            links.mkdir(exist_ok=True)
            (links / name).symlink_to(file)
        return name

    def _write_maps(self, pid: int) -> None:
        lines = [*self._maps[pid], "7ffd1abf8000-7ffd1abfa000 r-xp 00000000 00:00 0   [vdso]"]
        (self.root / str(pid) / "maps").write_text("\n".join(lines) + "\n")


def key_of(path: Path) -> LibraryKey:
    st = path.stat()
    return (st.st_dev, st.st_ino)


@pytest.fixture
def proc(tmp_path: Path, elves: Elves) -> FakeProc:
    # The files live beside the tree, as on a host, and are hard-linked into each root.
    store = tmp_path / "store"
    shutil.copytree(elves.dir, store)
    return FakeProc(tmp_path / "proc")


def stored(proc: FakeProc, name: str) -> Path:
    return proc.root.parent / "store" / name


def only(snapshot: Snapshot, kind: str) -> list[LibraryFile]:
    return sorted(
        (lib for lib in snapshot.libraries.values() if lib.kind == kind), key=lambda lib: lib.path
    )


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
    wanted = discover.RUNTIME_SYMBOLS | {"cudaMalloc"}
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
        assert elfsyms.defined_functions(str(path), discover.RUNTIME_SYMBOLS) == frozenset()
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
        elfsyms.defined_functions(str(path), discover.RUNTIME_SYMBOLS)
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


def test_nvidia_runtimes_define_every_probed_function() -> None:
    libraries = sorted(lib for d in NVIDIA_DIRS for lib in d.glob("*/lib/libcudart.so.*"))
    require(None if libraries else "the nvidia-cuda-runtime wheels are not installed")
    for library in libraries:
        assert elfsyms.defined_functions(str(library), discover.RUNTIME_SYMBOLS) == (
            discover.RUNTIME_SYMBOLS
        ), library


# --- the list of probed functions ------------------------------------------------------------


def test_runtime_symbols_match_events_header() -> None:
    ids = {name: api for name, api, _, _ in header_rows() if api is not None}
    assert tuple(n for n, v in ids.items() if v < 200) == discover.RUNTIME_API_NAMES
    assert tuple(n for n, v in ids.items() if v >= 200) == discover.DRIVER_API_NAMES
    assert all(n.startswith("cuda") for n in discover.RUNTIME_API_NAMES)
    assert all(n.startswith("cu") and not n.startswith("cuda") for n in discover.DRIVER_API_NAMES)
    assert frozenset(discover.RUNTIME_API_NAMES) == discover.RUNTIME_SYMBOLS
    assert frozenset(discover.DRIVER_API_NAMES) == discover.DRIVER_SYMBOLS


# --- scanning fake trees ---------------------------------------------------------------------


def test_every_kind_is_found(proc: FakeProc) -> None:
    proc.process(100)
    paths = {
        "/opt/conda/lib/libcudart.so.12": "libcudart.so.12",
        "/opt/app/bin/app": "app",
        "/usr/lib/libcublasLt.so": "libcublasLt.so",
        "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": "ld-linux-x86-64.so.2",
        "/usr/lib/libfoo.so": "libfoo.so",
        "/usr/lib/libuses.so": "libuses.so",
        "/usr/lib/ld-fake.so.1": "ld-fake.so.1",  # named like a loader, is not one
        "/usr/bin/app.stripped": "app.stripped",
        "/usr/lib/libcudart.so.99": "text.so",
        "/usr/lib/libtruncated.so": "truncated.so",
    }
    for path, name in paths.items():
        proc.map(100, path, stored(proc, name))

    snapshot = discover.scan(proc.root)

    runtimes = only(snapshot, "runtime")
    assert [lib.path for lib in runtimes] == [
        "/opt/app/bin/app",
        "/opt/conda/lib/libcudart.so.12",
        "/usr/lib/libcublasLt.so",
    ]
    for lib in runtimes:
        assert lib.key == key_of(stored(proc, paths[lib.path]))
        assert lib.host_path == f"{proc.root}/100/root{lib.path}"
        assert lib.symbols == PROGRAM_RUNTIME
    [loader] = only(snapshot, "loader")
    assert loader.path == "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    assert loader.host_path == f"{proc.root}/100/root{loader.path}"
    assert loader.symbols == {discover.LOADER_SYMBOL}
    assert snapshot.libraries_by_pid == {100: frozenset(snapshot.libraries)}
    assert snapshot.errors == frozenset()


def test_one_file_mapped_by_two_processes_is_one_library(proc: FakeProc) -> None:
    for pid in (200, 201):
        proc.process(pid)
        proc.map(pid, "/usr/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))

    snapshot = discover.scan(proc.root)

    key = key_of(stored(proc, "libcudart.so.12"))
    assert list(snapshot.libraries) == [key]
    assert snapshot.pids_by_library[key] == {200, 201}
    assert snapshot.libraries_by_pid == {200: {key}, 201: {key}}


def test_file_only_in_one_mount_namespace_is_found_through_it(proc: FakeProc) -> None:
    # 300 is a container whose root we cannot use (no such path here, no map_files);
    # 301 shares the file and shows it at another path in its own root.
    proc.process(300)
    proc.process(301)
    proc.map(300, "/cuda/libcudart.so.12", stored(proc, "libcudart.so.12"), in_root=False)
    proc.map(301, "/opt/x/libcudart.so.12", stored(proc, "libcudart.so.12"))

    [lib] = discover.scan(proc.root).libraries.values()

    assert lib.path == "/opt/x/libcudart.so.12"
    assert lib.host_path == f"{proc.root}/301/root/opt/x/libcudart.so.12"


def test_deleted_file_is_opened_through_map_files(proc: FakeProc) -> None:
    proc.process(400)
    name = proc.map(
        400,
        "/tmp/libcudart.so.12",
        stored(proc, "libcudart.so.12"),
        in_root=False,
        map_files=True,
        deleted=True,
    )
    # A new file now has the old name: it must not be mistaken for the mapped one.
    replacement = proc.root / "400" / "root" / "tmp" / "libcudart.so.12"
    replacement.parent.mkdir(parents=True)
    shutil.copy(stored(proc, "libcudart.so.12"), replacement)

    [lib] = discover.scan(proc.root).libraries.values()

    assert lib.path == "/tmp/libcudart.so.12"
    assert lib.host_path == f"{proc.root}/400/map_files/{name}"
    assert lib.kind == "runtime"


def test_replaced_file_is_opened_through_map_files(proc: FakeProc) -> None:
    proc.process(410)
    name = proc.map(
        410,
        "/usr/lib/libcudart.so.12",
        stored(proc, "libcudart.so.12"),
        in_root=False,
        map_files=True,
    )
    inside = proc.root / "410" / "root" / "usr" / "lib" / "libcudart.so.12"
    inside.parent.mkdir(parents=True)
    shutil.copy(stored(proc, "libfoo.so"), inside)

    [lib] = discover.scan(proc.root).libraries.values()

    assert lib.host_path == f"{proc.root}/410/map_files/{name}"


def test_loader_named_by_pt_interp(proc: FakeProc) -> None:
    proc.process(500)
    proc.map(500, "/opt/weird/bin/weird", stored(proc, "weird"))
    proc.map(500, "/opt/weird/myloader.so", stored(proc, "myloader.so"))
    proc.process(501)  # the same loader file, but no executable to name it
    proc.map(501, "/opt/weird/myloader.so", stored(proc, "myloader.so"))

    assert discover.scan(proc.root, pids=[501]).libraries == {}

    (proc.root / "500" / "exe").symlink_to(stored(proc, "weird"))
    [loader] = discover.scan(proc.root).libraries.values()
    assert loader.kind == "loader"
    assert loader.path == "/opt/weird/myloader.so"
    assert loader.key == key_of(stored(proc, "myloader.so"))
    assert discover.scan(proc.root).pids_by_library[loader.key] == {500, 501}


def test_loader_named_by_pt_interp_through_a_symlink(proc: FakeProc) -> None:
    # PT_INTERP says /opt/weird/myloader.so, a symlink; maps shows the file it points to.
    proc.process(510)
    proc.map(510, "/opt/weird/bin/weird", stored(proc, "weird"))
    proc.map(510, "/opt/weird/impl/loader-impl.so", stored(proc, "myloader.so"))
    (proc.root / "510" / "root" / "opt" / "weird" / "myloader.so").symlink_to("impl/loader-impl.so")
    (proc.root / "510" / "exe").symlink_to(stored(proc, "weird"))

    [loader] = discover.scan(proc.root).libraries.values()
    assert (loader.kind, loader.path) == ("loader", "/opt/weird/impl/loader-impl.so")


def test_vanished_and_unreadable_pids_are_counted(proc: FakeProc) -> None:
    proc.process(600)
    proc.map(600, "/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))
    (proc.root / "601").mkdir()  # exited between listing /proc and reading its maps
    proc.process(602)
    (proc.root / "602" / "maps").unlink()
    (proc.root / "602" / "maps").mkdir()  # unreadable as a file

    snapshot = discover.scan(proc.root)
    assert snapshot.errors == {601, 602}
    assert set(snapshot.libraries_by_pid) == {600}
    assert discover.scan(proc.root, pids=[600, 99999]).errors == {99999}


def test_pids_filter(proc: FakeProc) -> None:
    proc.process(700)
    proc.process(701)
    proc.map(700, "/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))
    proc.map(701, "/lib/libcublasLt.so", stored(proc, "libcublasLt.so"))

    snapshot = discover.scan(proc.root, pids=[701])
    assert [lib.path for lib in snapshot.libraries.values()] == ["/lib/libcublasLt.so"]
    assert set(snapshot.libraries_by_pid) == {701}
    assert discover.scan_pid(proc.root, 700).libraries.keys() == {
        key_of(stored(proc, "libcudart.so.12"))
    }


def test_classification_is_cached_across_scans(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(800)
    proc.map(800, "/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))
    proc.map(800, "/lib/libfoo.so", stored(proc, "libfoo.so"))
    reads: list[str] = []
    real = elfsyms.defined_functions

    def counted(
        path: str, wanted: frozenset[str], unless_imported: frozenset[str] = frozenset()
    ) -> frozenset[str]:
        reads.append(path)
        return real(path, wanted, unless_imported)

    monkeypatch.setattr(elfsyms, "defined_functions", counted)
    classifier = Classifier()
    first = discover.scan(proc.root, cache=classifier)
    assert len(reads) == 2
    assert discover.scan(proc.root, cache=classifier) == first
    assert len(reads) == 2  # nothing read again
    # libfoo.so changes in place (same inode): it is read again, and is now a runtime.
    stored(proc, "libfoo.so").write_bytes(stored(proc, "libcudart.so.12").read_bytes())
    assert len(discover.scan(proc.root, cache=classifier).libraries) == 2
    assert len(reads) == 3


def test_full_scan_forgets_unmapped_files(proc: FakeProc) -> None:
    proc.process(900)
    proc.map(900, "/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))
    classifier = Classifier()
    discover.scan(proc.root, cache=classifier)
    assert len(classifier) == 1
    (proc.root / "900" / "maps").write_text("")
    discover.scan(proc.root, cache=classifier)
    assert len(classifier) == 0


# --- the hand-written tree -------------------------------------------------------------------


@pytest.fixture
def static_proc(tmp_path: Path, elves: Elves) -> Path:
    root = tmp_path / "proc"
    shutil.copytree(STATIC_PROC, root, symlinks=True)
    placed = {
        "4200/map_files/41f000-6d2000": "app",
        "4200/map_files/7f1c2a021000-7f1c2a080000": "libcudart.so.12",
        "4200/map_files/7f1c2c001000-7f1c2c002000": "libcublasLt.so",
        "4200/map_files/7f1c2d000000-7f1c2d001000": "libfoo.so",
        "4200/map_files/7f1c2e001000-7f1c2e028000": "ld-linux-x86-64.so.2",
        "4300/map_files/7f00aa021000-7f00aa080000": "libcudart.so.12",
        # The path exists in 4200's root, but holds another inode than maps shows.
        "4200/root/opt/conda/lib/libcudart.so.12": "libcudart.so.12",
    }
    for where, name in placed.items():
        (root / where).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(elves[name], root / where)
    # A file opened through map_files is checked to be the one maps shows (device and
    # inode), as on a real node: the maps are rewritten to show the copies' own.
    for where in placed:
        if "/map_files/" not in where:
            continue
        pid, _, name = where.partition("/map_files/")
        maps = root / pid / "maps"
        fake = _mapping_key(maps.read_text(), name)
        STATIC_KEYS[fake] = key_of(root / where)
        shown, real = _key_text(fake), _key_text(STATIC_KEYS[fake])
        for other in root.glob("*/maps"):
            other.write_text(other.read_text().replace(shown, real))
    return root


#: The hand-written tree's (device, inode) → the copy's that stands for it (static_proc).
STATIC_KEYS: dict[LibraryKey, LibraryKey] = {}


def _mapping_key(maps: str, map_files_name: str) -> LibraryKey:
    wanted = [int(address, 16) for address in map_files_name.split("-")]
    for line in maps.splitlines():
        fields = line.split()
        if fields and [int(address, 16) for address in fields[0].split("-")] == wanted:
            major, minor = fields[3].split(":")
            return os.makedev(int(major, 16), int(minor, 16)), int(fields[4])
    raise AssertionError(f"no mapping {map_files_name}")


def _key_text(key: LibraryKey) -> str:
    return f"{os.major(key[0]):02x}:{os.minor(key[0]):02x} {key[1]} "


def test_hand_written_tree(static_proc: Path) -> None:
    snapshot = discover.scan(static_proc)
    fd01 = os.makedev(0xFD, 0x01)
    real = dict(STATIC_KEYS)
    found = {
        next((fake for fake, k in real.items() if k == key), key):
            (lib.kind, lib.path, lib.host_path.removeprefix(f"{static_proc}/"))
        for key, lib in snapshot.libraries.items()
    }
    assert found == {
        (fd01, 1311): ("runtime", "/usr/bin/python3.11", "4200/map_files/41f000-6d2000"),
        (fd01, 2622): (
            "runtime",
            "/opt/conda/lib/libcudart.so.12",
            "4200/map_files/7f1c2a021000-7f1c2a080000",
        ),
        (os.makedev(0x103, 0x02), 4444): (
            "runtime",
            "/scratch/my libs/libcublasLt.so.12",
            "4200/map_files/7f1c2c001000-7f1c2c002000",
        ),
        (fd01, 2701): (
            "loader",
            "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            "4200/map_files/7f1c2e001000-7f1c2e028000",
        ),
        (os.makedev(0x00, 0x2C), 9000): (
            "runtime",
            "/usr/local/cuda/lib64/libcudart.so.12",
            "4300/map_files/7f00aa021000-7f00aa080000",
        ),
    }
    assert snapshot.pids_by_library[real[(fd01, 2622)]] == {4200, 4201}
    assert snapshot.pids_by_library[real[(fd01, 1311)]] == {4200, 4201}
    assert snapshot.libraries_by_pid[4201] == {
        real[(fd01, 1311)], real[(fd01, 2622)], real[(fd01, 2701)]}
    assert snapshot.libraries_by_pid[4202] == frozenset()
    assert snapshot.libraries_by_pid[1] == frozenset()
    assert snapshot.errors == {4400}


def test_ppid_and_process_tree(static_proc: Path) -> None:
    assert discover.ppid(static_proc, 4200) == 1  # comm "python3 (train) x"
    assert discover.ppid(static_proc, 4202) == 4201
    assert discover.ppid(static_proc, 1) == 0
    assert discover.ppid(static_proc, 12345) is None
    assert discover.process_tree(static_proc, 4200) == {4200, 4201, 4202}
    assert discover.process_tree(static_proc, 4201) == {4201, 4202}
    assert discover.process_tree(static_proc, 1) == {1, 4200, 4201, 4202, 4300, 4400}
    assert discover.process_tree(static_proc, 12345) == set()


# --- this machine's /proc --------------------------------------------------------------------


def test_real_proc_finds_our_own_loader() -> None:
    snapshot = discover.scan(pids=[os.getpid()])
    loaders = only(snapshot, "loader")
    assert len(loaders) == 1, snapshot
    [loader] = loaders
    assert Path(loader.path).name.startswith("ld-")
    assert os.stat(loader.host_path).st_ino == loader.key[1]
    assert elfsyms.symbol_address(loader.host_path, discover.LOADER_SYMBOL)
    interp = elfsyms.interpreter(os.path.realpath(sys.executable))
    assert interp is not None
    assert os.stat(interp).st_ino == loader.key[1]


@dataclass
class Holder:
    """A live process that has dlopened some files."""

    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid


@pytest.fixture
def hold(elves: Elves) -> Iterator[list[Holder]]:
    """Processes to end after the test (`elves` as well: they and their programs need cc)."""
    started: list[Holder] = []
    yield started
    for holder in started:
        process = holder.process
        assert process.stdin is not None
        process.stdin.close()  # the holder exits when its stdin closes
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def map_files_unusable_reason() -> str | None:
    """Following /proc/PID/map_files links takes CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE)."""
    try:
        os.stat(f"/proc/self/map_files/{os.listdir('/proc/self/map_files')[0]}")
    except OSError as exc:
        return f"cannot follow /proc/PID/map_files links: {exc.strerror}"
    return None


def start_holder(started: list[Holder], program: Path, *libraries: Path) -> Holder:
    process = subprocess.Popen(
        [str(program), *map(str, libraries)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    holder = Holder(process)
    started.append(holder)
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    return holder


def test_real_process_with_a_deleted_runtime(
    tmp_path: Path, elves: Elves, hold: list[Holder]
) -> None:
    library = tmp_path / "libcudart.so.12"
    shutil.copy(elves["libcudart.so.12"], library)
    key = key_of(library)
    holder = start_holder(hold, elves["holder"], library)

    [lib] = only(discover.scan(pids=[holder.pid]), "runtime")
    assert (lib.key, lib.path, lib.host_path) == (
        key,
        str(library),
        f"/proc/{holder.pid}/root{library}",
    )

    library.unlink()
    require(map_files_unusable_reason())
    [lib] = only(discover.scan(pids=[holder.pid]), "runtime")
    assert lib.key == key
    assert lib.path == str(library)
    assert lib.host_path.startswith(f"/proc/{holder.pid}/map_files/")
    assert elfsyms.defined_functions(lib.host_path, discover.RUNTIME_SYMBOLS) == PROGRAM_RUNTIME


def test_real_static_nvidia_runtime(tmp_path: Path, hold: list[Holder]) -> None:
    archives = [d / "cuda_runtime/lib/libcudart_static.a" for d in NVIDIA_DIRS]
    archive = next((a for a in archives if a.exists()), None)
    require(None if archive else "nvidia-cuda-runtime-cu12 is not installed")
    assert archive is not None
    program = tmp_path / "real_static"
    _cc(program, "real_static.c", str(archive), "-lpthread", "-ldl", "-lrt")
    # Popen returns when the exec closes its error pipe, which is before the kernel maps the
    # new program: the program says when it runs.
    process = subprocess.Popen([str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    hold.append(Holder(process))
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    [lib] = only(discover.scan(pids=[process.pid]), "runtime")
    assert lib.path == str(program)
    assert lib.symbols == discover.RUNTIME_SYMBOLS


# --- speed -----------------------------------------------------------------------------------


def synthetic_node(
    base: Path, elves: Elves, *, processes: int, files_per_process: int, files: int, filler: bytes
) -> Path:
    """A /proc where each process maps ld.so and `files_per_process` of `files` other files.

    Every tenth process also maps libcudart.so.12. Each root is a link to one host folder.
    """
    host = base / "host"
    (host / "lib").mkdir(parents=True)
    paths = [f"/lib/lib{i}.so" for i in range(files)]
    for path in paths:
        (host / path.lstrip("/")).write_bytes(filler)
    for name in ("libcudart.so.12", "ld-linux-x86-64.so.2"):
        shutil.copy(elves[name], host / "lib" / name)
    lines = {path: _maps_lines(host, path, i) for i, path in enumerate(paths)}
    loader = _maps_lines(host, "/lib/ld-linux-x86-64.so.2", files)
    runtime = _maps_lines(host, "/lib/libcudart.so.12", files + 1)
    proc = base / "proc"
    for pid in range(1000, 1000 + processes):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "root").symlink_to(host)
        first = (pid * 7) % (files - files_per_process)
        mapped = [lines[path] for path in paths[first : first + files_per_process]]
        mapped += [loader, runtime] if pid % 10 == 0 else [loader]
        (proc / str(pid) / "maps").write_text("".join(mapped) + VDSO_LINE)
    return proc


VDSO_LINE = "7ffd1abf8000-7ffd1abfa000 r-xp 00000000 00:00 0   [vdso]\n"


def _maps_lines(host: Path, path: str, slot: int) -> str:
    """The five lines a shared object takes in maps: four of the file, one anonymous."""
    st = (host / path.lstrip("/")).stat()
    file = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino}   {path}"
    a = 0x7F0000000000 + slot * 0x100000
    return (
        f"{a:x}-{a + 0x1000:x} r--p 00000000 {file}\n"
        f"{a + 0x1000:x}-{a + 0x9000:x} r-xp 00001000 {file}\n"
        f"{a + 0x9000:x}-{a + 0xA000:x} r--p 00009000 {file}\n"
        f"{a + 0xA000:x}-{a + 0xB000:x} rw-p 0000a000 {file}\n"
        f"{a + 0xB000:x}-{a + 0xC000:x} rw-p 00000000 00:00 0\n"
    )


def test_rescanning_a_busy_node_is_fast(tmp_path: Path, elves: Elves) -> None:
    proc = synthetic_node(
        tmp_path, elves, processes=1000, files_per_process=100, files=2000, filler=b"not ELF"
    )
    classifier = Classifier()
    first = discover.scan(proc, cache=classifier)
    started = time.perf_counter()
    again = discover.scan(proc, cache=classifier)
    elapsed = time.perf_counter() - started
    assert again == first
    assert sorted(lib.kind for lib in again.libraries.values()) == ["loader", "runtime"]
    assert len(again.libraries_by_pid) == 1000
    # About 0.25 s on a developer's machine; the bound leaves room for a busy CI machine.
    assert elapsed < 1.5, f"a rescan of 1000 processes took {elapsed:.2f} s"
