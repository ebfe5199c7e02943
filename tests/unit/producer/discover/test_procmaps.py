"""Discovery of runtime and loader files, on fake /proc trees (no root needed) and on this one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuflight.producer.discover import elfsyms, procmaps
from gpuflight.producer.discover.procmaps import Classifier, LibraryKey
from tests.conftest import require
from tests.support.elves import (
    NVIDIA_DIRS,
    PROGRAM_RUNTIME,
    STATIC_PROC,
    Elves,
    FakeProc,
    cc,
    key_of,
    only,
    stored,
)
from tests.support.probe_table import header_rows


def test_nvidia_runtimes_define_every_probed_function() -> None:
    libraries = sorted(lib for d in NVIDIA_DIRS for lib in d.glob("*/lib/libcudart.so.*"))
    require(None if libraries else "the nvidia-cuda-runtime wheels are not installed")
    for library in libraries:
        assert elfsyms.defined_functions(str(library), procmaps.RUNTIME_SYMBOLS) == (
            procmaps.RUNTIME_SYMBOLS
        ), library


# --- the list of probed functions ------------------------------------------------------------


def test_runtime_symbols_match_events_header() -> None:
    ids = {name: api for name, api, _, _ in header_rows() if api is not None}
    assert tuple(n for n, v in ids.items() if v < 200) == procmaps.RUNTIME_API_NAMES
    assert tuple(n for n, v in ids.items() if v >= 200) == procmaps.DRIVER_API_NAMES
    assert all(n.startswith("cuda") for n in procmaps.RUNTIME_API_NAMES)
    assert all(n.startswith("cu") and not n.startswith("cuda") for n in procmaps.DRIVER_API_NAMES)
    assert frozenset(procmaps.RUNTIME_API_NAMES) == procmaps.RUNTIME_SYMBOLS
    assert frozenset(procmaps.DRIVER_API_NAMES) == procmaps.DRIVER_SYMBOLS


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

    snapshot = procmaps.scan(proc.root)

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
    assert loader.symbols == {procmaps.LOADER_SYMBOL}
    assert snapshot.libraries_by_pid == {100: frozenset(snapshot.libraries)}
    assert snapshot.errors == frozenset()


@pytest.mark.parametrize("hooks", [frozenset(), frozenset({"autograd"}),
                                   frozenset({"autograd", "exit"})])
def test_code_paths_hooks_are_found_only_when_wanted(proc: FakeProc,
                                                     hooks: frozenset[str]) -> None:
    """PyTorch's autograd engine and where a Python process exits are kinds of their own,
    found only for what code paths want (Classifier's `hooks`), never at the cost of a CUDA
    file's kind; a file that defines them is not quiet (a dlopen of it is seen)."""
    proc.process(120)
    proc.map(120, "/opt/torch/lib/libtorch_cpu.so", stored(proc, "libtorch_cpu.so"))
    proc.map(120, "/usr/lib/libpython3.so", stored(proc, "libpython3.so"))
    proc.map(120, "/opt/conda/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))
    classifier = Classifier(hooks=hooks)

    snapshot = procmaps.scan(proc.root, cache=classifier)

    kinds = {lib.path: lib.kind for lib in snapshot.libraries.values()}
    assert kinds.pop("/opt/conda/lib/libcudart.so.12") == "runtime"
    expected = {}
    if "autograd" in hooks:
        expected["/opt/torch/lib/libtorch_cpu.so"] = "autograd"
    if "exit" in hooks:
        expected["/usr/lib/libpython3.so"] = "exit"
    assert kinds == expected
    for lib in snapshot.libraries.values():
        if lib.kind == "autograd":
            assert lib.symbols == procmaps.AUTOGRAD_SYMBOLS - {
                n for n in procmaps.AUTOGRAD_SYMBOLS if n.endswith("EEbbS7_")}
            assert lib.plan is not None and [n for n, _ in lib.plan.offsets] == sorted(lib.symbols)
        if lib.kind == "exit":
            assert lib.symbols == {"Py_FinalizeEx"}
    # The autograd engine is not quiet, wanted or not: a later trace that wants it must see
    # its dlopen (import torch). Where a process exits is mapped at its start: quiet.
    python = stored(proc, "libpython3.so").stat()
    assert classifier.take_quiet() == [
        (python.st_dev, python.st_ino, python.st_size, python.st_ctime_ns)]
    # The names stay in the real libtorch's table (tests/frameworks: torch 2.15).
    assert "_ZN5torch8autograd6Engine7executeERKSt6vectorINS0_4EdgeESaIS3_EERKS2_IN2at6Tensor" \
        "ESaIS9_EEbbbS7_" in procmaps.AUTOGRAD_SYMBOLS


def test_one_file_mapped_by_two_processes_is_one_library(proc: FakeProc) -> None:
    for pid in (200, 201):
        proc.process(pid)
        proc.map(pid, "/usr/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))

    snapshot = procmaps.scan(proc.root)

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

    [lib] = procmaps.scan(proc.root).libraries.values()

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

    [lib] = procmaps.scan(proc.root).libraries.values()

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

    [lib] = procmaps.scan(proc.root).libraries.values()

    assert lib.host_path == f"{proc.root}/410/map_files/{name}"


def test_loader_named_by_pt_interp(proc: FakeProc) -> None:
    proc.process(500)
    proc.map(500, "/opt/weird/bin/weird", stored(proc, "weird"))
    proc.map(500, "/opt/weird/myloader.so", stored(proc, "myloader.so"))
    proc.process(501)  # the same loader file, but no executable to name it
    proc.map(501, "/opt/weird/myloader.so", stored(proc, "myloader.so"))

    assert procmaps.scan(proc.root, pids=[501]).libraries == {}

    (proc.root / "500" / "exe").symlink_to(stored(proc, "weird"))
    [loader] = procmaps.scan(proc.root).libraries.values()
    assert loader.kind == "loader"
    assert loader.path == "/opt/weird/myloader.so"
    assert loader.key == key_of(stored(proc, "myloader.so"))
    assert procmaps.scan(proc.root).pids_by_library[loader.key] == {500, 501}


def test_loader_named_by_pt_interp_through_a_symlink(proc: FakeProc) -> None:
    # PT_INTERP says /opt/weird/myloader.so, a symlink; maps shows the file it points to.
    proc.process(510)
    proc.map(510, "/opt/weird/bin/weird", stored(proc, "weird"))
    proc.map(510, "/opt/weird/impl/loader-impl.so", stored(proc, "myloader.so"))
    (proc.root / "510" / "root" / "opt" / "weird" / "myloader.so").symlink_to("impl/loader-impl.so")
    (proc.root / "510" / "exe").symlink_to(stored(proc, "weird"))

    [loader] = procmaps.scan(proc.root).libraries.values()
    assert (loader.kind, loader.path) == ("loader", "/opt/weird/impl/loader-impl.so")


def test_vanished_and_unreadable_pids_are_counted(proc: FakeProc) -> None:
    proc.process(600)
    proc.map(600, "/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))
    (proc.root / "601").mkdir()  # exited between listing /proc and reading its maps
    proc.process(602)
    (proc.root / "602" / "maps").unlink()
    (proc.root / "602" / "maps").mkdir()  # unreadable as a file

    snapshot = procmaps.scan(proc.root)
    assert snapshot.errors == {601, 602}
    assert set(snapshot.libraries_by_pid) == {600}
    assert procmaps.scan(proc.root, pids=[600, 99999]).errors == {99999}


def test_pids_filter(proc: FakeProc) -> None:
    proc.process(700)
    proc.process(701)
    proc.map(700, "/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))
    proc.map(701, "/lib/libcublasLt.so", stored(proc, "libcublasLt.so"))

    snapshot = procmaps.scan(proc.root, pids=[701])
    assert [lib.path for lib in snapshot.libraries.values()] == ["/lib/libcublasLt.so"]
    assert set(snapshot.libraries_by_pid) == {701}
    assert procmaps.scan_pid(proc.root, 700).libraries.keys() == {
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
    first = procmaps.scan(proc.root, cache=classifier)
    assert len(reads) == 2
    assert procmaps.scan(proc.root, cache=classifier) == first
    assert len(reads) == 2  # nothing read again
    # libfoo.so changes in place (same inode): it is read again, and is now a runtime.
    stored(proc, "libfoo.so").write_bytes(stored(proc, "libcudart.so.12").read_bytes())
    assert len(procmaps.scan(proc.root, cache=classifier).libraries) == 2
    assert len(reads) == 3


def test_full_scan_forgets_unmapped_files(proc: FakeProc) -> None:
    proc.process(900)
    proc.map(900, "/lib/libcudart.so.12", stored(proc, "libcudart.so.12"))
    classifier = Classifier()
    procmaps.scan(proc.root, cache=classifier)
    assert len(classifier) == 1
    (proc.root / "900" / "maps").write_text("")
    procmaps.scan(proc.root, cache=classifier)
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
    snapshot = procmaps.scan(static_proc)
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
    assert procmaps.ppid(static_proc, 4200) == 1  # comm "python3 (train) x"
    assert procmaps.ppid(static_proc, 4202) == 4201
    assert procmaps.ppid(static_proc, 1) == 0
    assert procmaps.ppid(static_proc, 12345) is None
    assert procmaps.process_tree(static_proc, 4200) == {4200, 4201, 4202}
    assert procmaps.process_tree(static_proc, 4201) == {4201, 4202}
    assert procmaps.process_tree(static_proc, 1) == {1, 4200, 4201, 4202, 4300, 4400}
    assert procmaps.process_tree(static_proc, 12345) == set()


# --- this machine's /proc --------------------------------------------------------------------


def test_real_proc_finds_our_own_loader() -> None:
    snapshot = procmaps.scan(pids=[os.getpid()])
    loaders = only(snapshot, "loader")
    assert len(loaders) == 1, snapshot
    [loader] = loaders
    assert Path(loader.path).name.startswith("ld-")
    assert os.stat(loader.host_path).st_ino == loader.key[1]
    assert elfsyms.symbol_address(loader.host_path, procmaps.LOADER_SYMBOL)
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

    [lib] = only(procmaps.scan(pids=[holder.pid]), "runtime")
    assert (lib.key, lib.path, lib.host_path) == (
        key,
        str(library),
        f"/proc/{holder.pid}/root{library}",
    )

    library.unlink()
    require(map_files_unusable_reason())
    [lib] = only(procmaps.scan(pids=[holder.pid]), "runtime")
    assert lib.key == key
    assert lib.path == str(library)
    assert lib.host_path.startswith(f"/proc/{holder.pid}/map_files/")
    assert elfsyms.defined_functions(lib.host_path, procmaps.RUNTIME_SYMBOLS) == PROGRAM_RUNTIME


def test_real_static_nvidia_runtime(tmp_path: Path, hold: list[Holder]) -> None:
    archives = [d / "cuda_runtime/lib/libcudart_static.a" for d in NVIDIA_DIRS]
    archive = next((a for a in archives if a.exists()), None)
    require(None if archive else "nvidia-cuda-runtime-cu12 is not installed")
    assert archive is not None
    program = tmp_path / "real_static"
    cc(program, "real_static.c", str(archive), "-lpthread", "-ldl", "-lrt")
    # Popen returns when the exec closes its error pipe, which is before the kernel maps the
    # new program: the program says when it runs.
    process = subprocess.Popen([str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    hold.append(Holder(process))
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    [lib] = only(procmaps.scan(pids=[process.pid]), "runtime")
    assert lib.path == str(program)
    assert lib.symbols == procmaps.RUNTIME_SYMBOLS


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


def test_rescanning_a_busy_node_reads_no_file_again(
    tmp_path: Path, elves: Elves, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What keeps a rescan cheap: no file's symbols are read again, and each file is opened once
    # (its identity checked through the descriptor), not once per process that maps it.
    # Counted here, not timed (bench/startup.py times it).
    proc = synthetic_node(
        tmp_path, elves, processes=1000, files_per_process=100, files=2000, filler=b"not ELF"
    )
    classifier = Classifier()
    first = procmaps.scan(proc, cache=classifier)
    opened: list[str] = []
    read: list[str] = []
    real_open, real_defined = procmaps._open_regular, elfsyms.defined_functions

    def counted_open(path: str) -> procmaps.OpenFile | None:
        opened.append(os.path.basename(path))
        return real_open(path)

    def counted_defined(path: str, *args: Any, **kwargs: Any) -> Any:
        read.append(path)
        return real_defined(path, *args, **kwargs)

    monkeypatch.setattr(procmaps, "_open_regular", counted_open)
    monkeypatch.setattr(elfsyms, "defined_functions", counted_defined)
    again = procmaps.scan(proc, cache=classifier)
    assert again == first
    assert sorted(lib.kind for lib in again.libraries.values()) == ["loader", "runtime"]
    assert len(again.libraries_by_pid) == 1000
    assert read == []
    assert len(opened) == len(set(opened)) <= 2002
