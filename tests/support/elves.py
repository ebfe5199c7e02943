"""ELF files built from tests/fixtures/elf, and a fake /proc tree whose maps name them by their
real device and inode: what the discovery and ELF tests (tests/unit/producer/discover) share."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpuflight.producer.discover.procmaps import LibraryFile, LibraryKey, Snapshot
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures"
ELF_SOURCES = FIXTURES / "elf"
STATIC_PROC = FIXTURES / "proc"
# Where the nvidia-cuda-runtime wheels (dev dependencies) put their files.
NVIDIA_DIRS = [Path(entry) / "nvidia" for entry in sys.path if (Path(entry) / "nvidia").is_dir()]

PROGRAM_RUNTIME = frozenset({"cudaLaunchKernel", "cudaMemcpy"})


@dataclass(frozen=True)
class Elves:
    """The ELF (and not-quite-ELF) files of tests/fixtures/elf, built into one folder."""

    dir: Path

    def __getitem__(self, name: str) -> Path:
        path = self.dir / name
        assert path.exists(), f"{name} was not built"
        return path


def build_elves(out: Path) -> Elves:
    """Build the ELF files of tests/fixtures/elf into `out`."""
    shared = ("-shared", "-fPIC")
    cc(
        out / "libcudart.so.12",
        *shared,
        "-Wl,-soname,libcudart.so.12",
        "-Wl,--version-script=cudart.map",
        "runtime.c",
    )
    cc(out / "libcublasLt.so", *shared, "-fvisibility=hidden", "runtime.c", "foo.c")
    cc(out / "app", "app.c", "runtime.c")
    cc(out / "versioned", "versioned.c", "-Wl,--version-script=cudart.map")
    cc(out / "ld-linux-x86-64.so.2", *shared, "loader.c")
    cc(out / "myloader.so", *shared, "loader.c")
    cc(out / "libfoo.so", *shared, "foo.c")
    cc(out / "ld-fake.so.1", *shared, "foo.c")
    cc(out / "libuses.so", *shared, "uses.c")
    cc(out / "libtorch_cpu.so", *shared, "-DAUTOGRAD", "hooks.c")
    cc(out / "libpython3.so", *shared, "-DFINALIZE", "hooks.c")
    cc(out / "holder", "holder.c", "-ldl")
    cc(out / "weird", "holder.c", "-ldl", "-Wl,--dynamic-linker=/opt/weird/myloader.so")
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


def cc(out: Path, *args: str) -> None:
    subprocess.run(["cc", "-O1", "-o", str(out), *args], check=True, cwd=ELF_SOURCES)


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


def stored(proc: FakeProc, name: str) -> Path:
    return proc.root.parent / "store" / name


def only(snapshot: Snapshot, kind: str) -> list[LibraryFile]:
    return sorted(
        (lib for lib in snapshot.libraries.values() if lib.kind == kind), key=lambda lib: lib.path
    )
