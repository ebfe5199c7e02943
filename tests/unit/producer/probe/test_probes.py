"""Attaching: a file is probed whole, or in part with each function it lacks named, or skipped
with why (logged once); detaching never raises. The kernel is replaced by a fake attach seam
here; tests/test_coexist.py runs the real one."""

from __future__ import annotations

import errno
import logging
import os
import select
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuflight.producer.contract.abi import COOKIE_STEPPED, NAME_WITH_RETURN, PROBES, WITH_RETURN
from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.discover import attachplan, elfsyms, procmaps
from gpuflight.producer.discover.procmaps import Classifier, LibraryFile
from gpuflight.producer.probe.bpfload import ENOTSUPP
from gpuflight.producer.probe.probes import Probes
from gpuflight.producer.probe.uprobes import UprobeLinks
from gpuflight.producer.settings import CaptureSettings
from tests.conftest import require
from tests.workloads import build


class FakeUprobes:
    """The seam Probes attaches through: hands out fake fds, or fails as `refuse` says."""

    def __init__(self, refuse: Callable[[str, int, bool], int | None] = lambda *_: None,
                 fail_detach: frozenset[int] = frozenset()) -> None:
        self.refuse = refuse
        self.fail_detach = fail_detach
        self.held: dict[int, tuple[str, int, bool]] = {}
        #: fd -> (program fd, cookie)
        self.programs: dict[int, tuple[int, int]] = {}
        self.detached: list[int] = []
        self._next = 1000
        self.attach_type = -1

    def attach(self, prog_fd: int, path: str, offset: int, retprobe: bool,
               cookie: int = 0) -> int:
        err = self.refuse(path, offset, retprobe)
        if err is not None:
            raise OSError(err, f"refused ({err})")
        self._next += 1
        self.held[self._next] = (path, offset, retprobe)
        self.programs[self._next] = (prog_fd, cookie)
        return self._next

    def detach(self, fd: int) -> None:
        if fd in self.fail_detach:
            raise OSError(errno.EBUSY, "Device or resource busy")
        del self.held[fd]
        self.detached.append(fd)


class FakeProgram:
    """The loaded program (bpfload.LoadedObject): functions by name, each with an fd of its
    own; those named in `unloaded` failed to load (as the verifier refuses one)."""

    def __init__(self, unloaded: frozenset[str] = frozenset()) -> None:
        self.closed = False
        self.loaded: dict[str, int] = {}
        self.unloaded = unloaded

    def program(self, name: str, _kind: int = 2, attach_type: int = -1) -> int:
        if name in self.unloaded:
            raise OSError(errno.EACCES, f"Permission denied: {name}: R2 !read_ok")
        return self.loaded.setdefault(name, 100 + len(self.loaded))

    def background_failure(self) -> tuple[bool, BaseException | None]:
        if self.unloaded:
            return True, OSError(errno.EACCES, "Permission denied: R2 !read_ok")
        return True, None

    def stop_loading(self) -> None:
        pass

    def close(self) -> int:
        self.closed = True
        return 0


class FakeRing:
    def close(self) -> None:
        pass


class Settings(CaptureSettings):
    def __init__(self, cookies: bool) -> None:
        super().__init__()
        object.__setattr__(self, "_cookies", cookies)

    @property
    def attach_cookies(self) -> bool:
        return bool(getattr(self, "_cookies", True))


def make_probes(uprobes: FakeUprobes, cookies: bool = True) -> Probes:
    probes = Probes.__new__(Probes)  # no BPF program: only the attach bookkeeping is tested
    probes._settings = Settings(cookies)
    probes.attached, probes.failed, probes._links = {}, {}, {}
    probes._bpf, probes._uprobes, probes._program_type = FakeProgram(), uprobes, 2  # type: ignore[assignment]
    probes._events_ring = probes._loader_ring = probes._names_ring = FakeRing()  # type: ignore[assignment]
    probes._cpu_buffers, probes._merged = None, None
    probes._wake = probes._names_wake = select.epoll()
    probes._names_lock, probes._names_stop = threading.Lock(), threading.Event()
    probes._names_thread = None
    probes._loading = True
    return probes


def runtime(path: Path, key: tuple[int, int] = (1, 2)) -> LibraryFile:
    return LibraryFile(key=key, path="/opt/x/" + path.name, host_path=str(path), kind="runtime")


@pytest.fixture(scope="module")
def stub_runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.build_simgpu(tmp_path_factory.mktemp("simgpu")) / "libcudart.so.12"


def entry_of(path: Path, name: str) -> int:
    address = elfsyms.function_addresses(str(path), frozenset({name}))[name]
    offset = elfsyms.vaddr_to_file_offset(str(path), address)
    assert offset is not None
    return offset


def offset_of(path: Path, name: str) -> int:
    """Where the probes of `name` go: its entry, or past it where the kernel would single-step
    what is there (producer/discover/entrypoint.py: the stub runtime's cudaMalloc begins `test;
    je`)."""
    kind = "runtime" if name.startswith("cuda") else "driver"
    offset = attachplan.read_plan(str(path), kind, path.stat().st_size).offset(name)
    assert offset is not None and entry_of(path, name) <= offset
    return offset


def test_every_function_gets_its_probes_at_its_file_offset(stub_runtime: Path) -> None:
    uprobes = FakeUprobes()
    probes = make_probes(uprobes)
    attached = probes.attach(runtime(stub_runtime))
    assert attached is not None and not attached.unprobed
    assert attached.probes == len(uprobes.held)
    where = {(offset, ret) for _path, offset, ret in uprobes.held.values()}
    assert (offset_of(stub_runtime, "cudaLaunchKernel"), False) in where
    assert (offset_of(stub_runtime, "cudaLaunchKernel"), True) not in where  # launches: entry only
    for name in ("cudaMemcpy", "cudaMalloc"):  # a result or a duration: a return probe too
        assert name in WITH_RETURN | NAME_WITH_RETURN
        offset = offset_of(stub_runtime, name)
        assert {(offset, False), (offset, True)} <= where


@pytest.mark.parametrize("cookies", [True, False], ids=["cookies", "a program per row"])
def test_each_row_runs_its_program_with_its_cookie(stub_runtime: Path, cookies: bool) -> None:
    """With attach cookies (Linux 5.15+) the rows of a family share its programs, each
    attached with its api id and constant; without, each row has programs of its own."""
    uprobes = FakeUprobes()
    probes = make_probes(uprobes, cookies)
    assert probes.attach(runtime(stub_runtime)) is not None
    loaded = {fd: name for name, fd in probes._bpf.loaded.items()}  # type: ignore[attr-defined]
    got = {(offset, ret): (loaded[prog], cookie)
           for fd, (prog, cookie) in uprobes.programs.items()
           for _path, offset, ret in [uprobes.held[fd]]}
    rows = {p.name: p for p in PROBES}
    for name, half in (("cudaMemcpy", "entry"), ("cudaMemcpy", "return"),
                       ("cudaMemcpy_ptds", "entry"), ("cudaMalloc", "return"),
                       ("cudaMallocHost", "entry"), ("cudaLaunchKernel", "entry"),
                       ("cudaDeviceSynchronize", "entry"), ("cudaStreamSynchronize", "entry")):
        row = rows[name]
        program, cookie = got[offset_of(stub_runtime, name), half == "return"]
        if cookies:
            assert (program, cookie) == (f"gf_{row.family.upper()}_{half}",
                                         (row.api or 0) | row.arg << 16), name
        else:
            assert (program, cookie) == (f"{name}_{half}", 0), name
    if cookies:
        assert rows["cudaMalloc"].arg != rows["cudaMallocHost"].arg  # one program, two kinds
        assert len(loaded) < len({n for n, _ in got.values()}) + 1
        assert len({n for n, _ in got.values()}) < len(got) / 2


@pytest.mark.parametrize("cookies", [True, False], ids=["cookies", "a program per row"])
def test_probes_go_where_the_plan_moved_them_and_stepped_ones_say_so(
    tmp_path: Path, cookies: bool
) -> None:
    """On a driver whose functions begin as NVIDIA's do (tests/workloads/thunks.S), each
    function's entry and return probes go at its planned offset, past its entry where that is
    what the kernel emulates; those left where the kernel single-steps carry the stepped flag
    in their cookie (counted in BPF), and the file says which they are."""
    path = build.build_thunked_stubcuda(tmp_path) / build.LIBCUDA_SONAME
    plan = attachplan.read_plan(str(path), "driver", path.stat().st_size)
    assert plan.entries and plan.stepped  # both kinds, or the test tells nothing
    uprobes = FakeUprobes()
    probes = make_probes(uprobes, cookies)
    library = LibraryFile(key=(1, 3), path="/opt/x/libcuda.so.1", host_path=str(path),
                          kind="driver")
    attached = probes.attach(library)
    assert attached is not None and not attached.unprobed
    assert attached.stepped == plan.stepped
    held: dict[tuple[int, bool], int] = {}
    for fd, (where, at, ret) in uprobes.held.items():
        assert where != str(path)  # through the descriptor, /proc/self/fd/N
        held[at, ret] = uprobes.programs[fd][1]
    rows = {p.name: p for p in PROBES}
    for name, offset in plan.offsets:
        assert offset is not None
        row = rows[name]
        stepped = COOKIE_STEPPED if name in plan.stepped else 0
        want = (row.cookie | stepped) if cookies else 0
        assert held[offset, False] == want, name
        if row.returns:  # the kernel takes the return address at %rsp there, as at the entry
            assert held[offset, True] == want, name
    assert {at for at, _ret in held} == {o for _n, o in plan.offsets}


def test_two_names_of_a_moved_function_are_probed_once(tmp_path: Path) -> None:
    source = tmp_path / "alias.S"
    source.write_text("""
    .data
flag: .long 0
    .text
    .globl cuLaunchKernel, cuLaunchKernel_ptsz
    .type cuLaunchKernel, @function
    .type cuLaunchKernel_ptsz, @function
cuLaunchKernel_ptsz:
cuLaunchKernel:
    cmpl $0x321cba00, flag(%rip)
    je 1f
    xor %eax, %eax
1:  ret
    .size cuLaunchKernel, .-cuLaunchKernel
    .section .note.GNU-stack,"",@progbits
""")
    path = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-nostdlib", str(source), "-o", str(path)], check=True)
    uprobes = FakeUprobes()
    attached = make_probes(uprobes).attach(
        LibraryFile(key=(1, 4), path="/x/libcuda.so.1", host_path=str(path), kind="driver"))
    assert attached is not None and attached.probes == 1  # launches: entry only, once
    ((_where, offset, _ret),) = uprobes.held.values()
    assert offset == entry_of(path, "cuLaunchKernel") + 10  # past the cmp, for both names


@pytest.fixture(scope="module")
def exit_hooks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file that defines both places a process exits (as a static python would, with a
    libc linked in)."""
    out = tmp_path_factory.mktemp("hooks")
    (out / "hooks.c").write_text("int Py_FinalizeEx(void) { return 0; }\n"
                                 "void _exit(int status) { for (;;) (void)status; }\n")
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-fno-builtin", "-o", str(out / "lib.so"),
                    str(out / "hooks.c")], check=True, capture_output=True)
    return out / "lib.so"


def test_a_code_paths_hook_is_probed_only_with_stacks_and_one_refused_costs_only_itself(
        exit_hooks: Path) -> None:
    library = LibraryFile(key=(3, 4), path="/usr/lib/libpython3.so",
                          host_path=str(exit_hooks), kind="exit")
    off = make_probes(FakeUprobes())
    assert off.attach(library) is None
    assert "only for code paths" in off.failed[library.key].reason
    plan = attachplan.read_plan(str(exit_hooks), "exit", exit_hooks.stat().st_size)
    at = {name: offset for name, offset in plan.offsets}
    assert at.keys() == {"Py_FinalizeEx", "_exit"}
    uprobes = FakeUprobes(lambda _p, offset, _r: errno.EINVAL if offset == at["_exit"] else None)
    probes = make_probes(uprobes)
    object.__setattr__(probes._settings, "stack_period", 1)
    attached = probes.attach(library)
    assert attached is not None and attached.functions == {"Py_FinalizeEx"}
    assert list(attached.unprobed) == ["_exit"] and attached.probes == 1
    [(fd, (_path, offset, retprobe))] = uprobes.held.items()
    assert (offset, retprobe) == (at["Py_FinalizeEx"], False)
    assert uprobes.programs[fd][0] == probes._bpf.loaded["gf_exit_hold"]  # type: ignore[attr-defined]


def test_a_function_the_kernel_refuses_costs_only_itself(
    stub_runtime: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refused = offset_of(stub_runtime, "cudaDeviceSynchronize")
    uprobes = FakeUprobes(lambda _p, offset, _r: ENOTSUPP if offset == refused else None)
    probes = make_probes(uprobes)
    whole = make_probes(FakeUprobes()).attach(runtime(stub_runtime))
    assert whole is not None
    with caplog.at_level(logging.WARNING):
        attached = probes.attach(runtime(stub_runtime))
        probes.attach(runtime(stub_runtime))  # a later scan finds it again: no second warning
    assert attached is not None
    assert list(attached.unprobed) == ["cudaDeviceSynchronize"]
    assert "cannot probe the instruction" in attached.unprobed["cudaDeviceSynchronize"]
    assert attached.probes == whole.probes - 2  # its entry and return probes, no other
    assert "cudaDeviceSynchronize" not in attached.functions
    assert not any(offset == refused for _p, offset, _r in uprobes.held.values())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cudaDeviceSynchronize" in warnings[0]


def test_a_refused_return_probe_takes_its_entry_probe_with_it(stub_runtime: Path) -> None:
    memcpy = offset_of(stub_runtime, "cudaMemcpy")
    uprobes = FakeUprobes(lambda _p, offset, ret: errno.EINVAL if offset == memcpy and ret
                          else None)
    attached = make_probes(uprobes).attach(runtime(stub_runtime))
    assert attached is not None and list(attached.unprobed) == ["cudaMemcpy"]
    assert not any(offset == memcpy for _p, offset, _r in uprobes.held.values())  # neither
    assert len(uprobes.detached) == 1  # the entry probe, attached then taken back


@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENOENT, errno.EACCES])
def test_a_failure_of_the_whole_file_detaches_what_was_attached(
    stub_runtime: Path, err: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Half-way through the file: no probe of it stays behind, and the reason is kept."""
    calls = [0]

    def refuse(_path: str, _offset: int, _ret: bool) -> int | None:
        calls[0] += 1
        return err if calls[0] > 10 else None

    uprobes = FakeUprobes(refuse)
    probes = make_probes(uprobes)
    target = runtime(stub_runtime)
    with caplog.at_level(logging.WARNING):
        assert probes.attach(target) is None
        assert probes.attach(target) is None  # once skipped, not tried again
    assert not uprobes.held and len(uprobes.detached) == 10
    assert target.key in probes.failed and target.key not in probes.attached
    assert probes.failed[target.key].errno == err
    assert calls[0] == 11  # the rest of the file was not tried in vain
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("skipping /opt/x/libcudart.so.12:")
    assert probes.skipped_cuda() == [probes.failed[target.key]]


def test_a_file_whose_every_function_is_refused_is_skipped(stub_runtime: Path) -> None:
    probes = make_probes(FakeUprobes(lambda *_: errno.EINVAL))
    target = runtime(stub_runtime)
    assert probes.attach(target) is None
    assert "none of its functions could be probed" in probes.failed[target.key].reason


def test_a_file_without_runtime_functions_is_refused(tmp_path: Path) -> None:
    probes = make_probes(FakeUprobes())
    not_elf = tmp_path / "libcudart.so.12"
    not_elf.write_text("not an ELF file")
    target = LibraryFile(key=(3, 4), path=str(not_elf), host_path=str(not_elf), kind="runtime")
    assert probes.attach(target) is None
    assert "defines none of the CUDA runtime functions" in probes.failed[(3, 4)].reason


def _loader() -> LibraryFile:
    path = elfsyms.interpreter("/proc/self/exe")
    assert path is not None
    return LibraryFile(key=(5, 6), path=path, host_path=path, kind="loader")


@pytest.mark.parametrize("err", [errno.EPERM, errno.EACCES])
def test_a_kernel_refusing_uprobes_for_privilege_is_one_setup_error(err: int) -> None:
    probes = make_probes(FakeUprobes(lambda *_: err))
    with pytest.raises(SetupError) as raised:
        probes.check_permitted(_loader())
    message = str(raised.value)
    assert "\n" not in message and "refused to attach a uprobe" in message
    assert "CAP_SYS_ADMIN" in message


def test_a_loader_refused_for_another_reason_is_only_skipped() -> None:
    """E.g. another tracer holds a probe there that the kernel will not share: logged, and
    the trace summary says so, but capture goes on."""
    probes = make_probes(FakeUprobes(lambda *_: errno.EINVAL))
    probes.check_permitted(_loader())
    assert probes.failed[(5, 6)].errno == errno.EINVAL
    assert probes.skipped_cuda() == []


def test_a_program_that_did_not_load_is_a_setup_error_and_no_half_probed_file(
    stub_runtime: Path
) -> None:
    """The CUDA programs load in the background (Probes._load_programs): one the kernel
    refused there is the capture's error, raised by the first attach that needs it, never a
    function skipped as if the kernel had refused its probe; what was attached to the file
    before it is detached, and the file is neither probed nor skipped."""
    memcpy_return = next(p for p in PROBES if p.name == "cudaMemcpy").program("return", True)
    uprobes = FakeUprobes()
    probes = make_probes(uprobes)
    probes._bpf = FakeProgram(frozenset({memcpy_return}))  # type: ignore[assignment]
    target = runtime(stub_runtime)
    with pytest.raises(SetupError) as raised:
        probes.attach(target)
    assert str(raised.value) == (f"the BPF program did not load: [Errno {errno.EACCES}] "
                                 f"Permission denied: {memcpy_return}: R2 !read_ok")
    assert uprobes.detached and not uprobes.held  # what the file had is taken back
    assert target.key not in probes.attached and target.key not in probes.failed
    with pytest.raises(SetupError, match=r"the BPF program did not load: .*R2 !read_ok"):
        probes.check_loaded()  # the capture loop's check says the same, without waiting


def test_programs_still_loading_or_loaded_are_no_error() -> None:
    probes = make_probes(FakeUprobes())
    probes.check_loaded()
    assert not probes._loading  # all done: not asked again


def test_a_failing_detach_is_logged_and_the_rest_are_detached(
    stub_runtime: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uprobes = FakeUprobes()
    probes = make_probes(uprobes)
    attached = probes.attach(runtime(stub_runtime))
    assert attached is not None
    stuck = sorted(uprobes.held)[3]
    uprobes.fail_detach = frozenset({stuck})
    with caplog.at_level(logging.WARNING):
        probes.close(background=False)  # never raises
    assert list(uprobes.held) == [stuck]
    assert len(uprobes.detached) == attached.probes - 1
    assert any("1 probe(s) could not be detached (Device or resource busy)" in r.getMessage()
               for r in caplog.records)
    assert probes._bpf.closed  # type: ignore[attr-defined]  # the program closed all the same


def test_without_a_uprobe_pmu_the_error_says_what_the_kernel_lacks(tmp_path: Path) -> None:
    with pytest.raises(SetupError) as raised:
        UprobeLinks(pmu=tmp_path / "no-such-pmu", multi=False)
    assert "no uprobe PMU" in str(raised.value) and "\n" not in str(raised.value)


def test_offsets_are_file_offsets(tmp_path: Any) -> None:
    """A symbol's address converts through its PT_LOAD segment (what the kernel wants)."""
    lib = build.build_simgpu(tmp_path) / "libcudart.so.12"
    address = elfsyms.function_addresses(str(lib), frozenset({"cudaMalloc"}))["cudaMalloc"]
    offset = elfsyms.vaddr_to_file_offset(str(lib), address)
    assert offset is not None and elfsyms.file_offset_to_vaddr(str(lib), offset) == address
    assert elfsyms.vaddr_to_file_offset(str(lib), 1 << 40) is None


def test_kernel_releases_are_compared_by_number() -> None:
    """What decides bpf_get_attach_cookie (5.15) in the program: numbers, not strings."""
    from gpuflight.producer.settings import kernel_at_least

    assert kernel_at_least(5, 15, "6.18.44-fc-v1252-gpu")
    assert kernel_at_least(5, 15, "5.15.0-91-generic")
    assert kernel_at_least(6, 6, "6.10.2")
    assert not kernel_at_least(5, 15, "5.10.0-28-amd64")
    assert not kernel_at_least(6, 6, "6.1.0-18-amd64")
    assert not kernel_at_least(5, 15, "garbage")


@pytest.mark.parametrize("limit", [None, 300])
def test_the_fd_table_is_grown_at_once_and_nothing_is_left_open(limit: int | None) -> None:
    """Each probe holds a file descriptor; the kernel grows a process's fd table by doubling,
    waiting for an RCU grace period each time once the process has threads. Probes grows it
    at once (to 1024 slots, or what the open files limit allows) before it starts any: no
    descriptor is touched or left open, and a low limit is no error."""
    import subprocess
    import sys

    script = (
        "import os, resource\n"
        f"limit = {limit!r}\n"
        "if limit: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))\n"
        "from gpuflight.producer.probe.fds import grow_fd_table, _fd_table_size\n"
        "before, fds = _fd_table_size(), sorted(os.listdir('/proc/self/fd'))\n"
        "after = grow_fd_table()\n"
        "print(before, after, fds == sorted(os.listdir('/proc/self/fd')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    before, after, unchanged = int(out[0]), int(out[1]), out[2] == "True"
    assert unchanged
    assert after >= (1024 if limit is None else 256) and after >= before


# --- a user racing the agent's path to a file -------------------------------------------------

NOBODY = 65534
RACE_ROUNDS = 300


@dataclass(frozen=True)
class SwapRace:
    """nobody's process maps its own "runtime" from a directory it swaps, over and over, with
    a link to a root-owned directory holding another file of the same name."""

    pid: int
    key: tuple[int, int]  # the runtime it maps
    symbols: frozenset[str]  # what that runtime defines
    victim: int  # the inode of the root-owned file of the same name


class InodeRecordingUprobes(FakeUprobes):
    """Records which file each probe would be placed in: the inode its path names then."""

    def __init__(self) -> None:
        super().__init__()
        self.inodes: list[int] = []

    def attach(self, prog_fd: int, path: str, offset: int, retprobe: bool,
               cookie: int = 0) -> int:
        self.inodes.append(os.stat(path).st_ino)
        return super().attach(prog_fd, path, offset, retprobe, cookie)


@pytest.fixture
def swap_race(stub_runtime: Path, tmp_path: Path) -> Iterator[SwapRace]:
    require(None if os.geteuid() == 0 else "needs root: the race is run as another user")
    require(None if shutil.which("setpriv") else "no setpriv (util-linux)")
    racer = build.build_swaprace(tmp_path)
    victim = Path(tempfile.mkdtemp(prefix="gpuflight-victim-", dir="/tmp"))
    home = Path(tempfile.mkdtemp(prefix="gpuflight-racer-", dir="/tmp"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        victim.chmod(0o755)
        shutil.copy(racer, victim / "libcudart.so.12")  # root's own file: an ELF, no CUDA
        shutil.copytree(stub_runtime.parent, home / "a")
        shutil.copy(racer, home / "swaprace")
        (home / "b").symlink_to(victim)
        for path in [home, *home.rglob("*")]:
            os.lchown(path, NOBODY, NOBODY)
        home.chmod(0o755)
        runtime_file = home / "a" / "libcudart.so.12"
        st = runtime_file.stat()
        symbols = elfsyms.defined_functions(str(runtime_file), procmaps.RUNTIME_SYMBOLS)
        proc = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
             str(home / "swaprace"), str(home / "a"), str(home / "b"), "libcudart.so.12"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"mapped\n"
        yield SwapRace(proc.pid, (st.st_dev, st.st_ino), symbols,
                       (victim / "libcudart.so.12").stat().st_ino)
    finally:
        if proc is not None:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            proc.stdout.close()
            assert proc.wait(timeout=30) == 0, "the racer failed"
        shutil.rmtree(home)
        shutil.rmtree(victim)


def test_a_user_racing_the_path_to_a_library_never_steers_a_probe_or_a_verdict(
    swap_race: SwapRace,
) -> None:
    """The file is checked once and used only through its descriptor: a probe never lands in
    the root-owned file the path is swapped to (item 1), and the runtime is never classified
    from it either — as defining nothing, never probed again (item 2)."""
    assert procmaps.RUNTIME_SYMBOLS & swap_race.symbols
    steered = misclassified = 0
    for _ in range(RACE_ROUNDS):
        uprobes = InodeRecordingUprobes()
        probes = make_probes(uprobes)
        snapshot = procmaps.scan(Path("/proc"), pids=[swap_race.pid], cache=Classifier())
        runtimes = [lib for lib in snapshot.libraries.values() if lib.kind == "runtime"]
        if [(lib.key, lib.symbols) for lib in runtimes] != [(swap_race.key, swap_race.symbols)]:
            misclassified += 1
            continue
        if probes.attach(runtimes[0]) is None:  # planned from another file: no offsets
            misclassified += 1
        steered += sum(1 for inode in uprobes.inodes if inode != swap_race.key[1])
    assert (steered, misclassified) == (0, 0), (
        f"{steered} probe(s) placed in another file than the mapped one, and the runtime "
        f"misclassified or misplanned in {misclassified} of {RACE_ROUNDS} scans"
    )
