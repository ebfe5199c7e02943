"""Attaching on the real kernel, as root: beside another tracer on the same functions (in either
order, both see every call), far more probes than bcc's 1000-probe quota, a function whose
first instruction the kernel refuses, a file none of whose functions can be probed, and a
kernel that refuses uprobes for lack of privilege."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from gpuflight.producer import trace
from gpuflight.producer.discover import elfsyms, procmaps
from gpuflight.producer.discover.procmaps import LibraryFile
from gpuflight.producer.probe import probes as probes_module
from gpuflight.producer.probe.probes import Probes
from gpuflight.producer.probe.uprobes import UprobeLinks
from gpuflight.producer.settings import CaptureSettings
from tests.conftest import require
from tests.support.capture import GPUFLIGHT, Producer, read_events, wait_for_probe_releases
from tests.workloads import build, expected

pytestmark = pytest.mark.bpf

TIMEOUT_S = 600
CALLS = 7


def run_trace(cmd: list[str], out: Path, timeout_s: float = TIMEOUT_S
              ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*GPUFLIGHT, "trace", "--output", str(out), "--", *cmd],
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


# ---- the registration itself ---------------------------------------------------------------


def _fdinfo(fd: int) -> dict[str, str]:
    """/proc/self/fdinfo/FD as fields; a uprobe_multi link's table of offsets (a header line
    "cookie offset ref_ctr_offset", one row per offset) as "cookie", "offset" and
    "ref_ctr_offset" of its one row."""
    lines = Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
    info = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    for header, row in itertools.pairwise(lines):
        if header.split() == ["cookie", "offset", "ref_ctr_offset"]:
            info.update(zip(header.split(), row.split(), strict=True))
    return info


def test_each_probe_is_a_link_with_no_reference_counter(bindir: Path) -> None:
    """What the kernel holds for each probe (its fdinfo): a link at the function's file offset
    with ref_ctr_offset 0, not the garbage python3-bpfcc 0.26 passes. A uprobe_multi link
    where the kernel has them (6.6+: this machine's 6.18 does), a perf link before."""
    lib = build.build_lockfirst(bindir)
    probes = Probes(CaptureSettings())
    multi = UprobeLinks().multi
    try:
        st = lib.stat()
        attached = probes.attach(LibraryFile((st.st_dev, st.st_ino), str(lib), str(lib),
                                             "runtime"))
        # No process maps the file: the kernel checks no instruction yet, so all 4 functions
        # (3 with a return probe) are accepted, the lock-prefixed one too.
        assert attached is not None and attached.probes == 7
        fds = probes._links[(st.st_dev, st.st_ino)]
        assert len(fds) == attached.probes
        infos = [_fdinfo(fd) for fd in fds]
        if multi:
            assert {i["link_type"] for i in infos} == {"uprobe_multi", "uretprobe_multi"}
            assert {i["uprobe_cnt"] for i in infos} == {"1"}
            assert {i["path"] for i in infos} == {str(lib)}
        else:
            assert {i["link_type"] for i in infos} == {"perf"}
            assert {i["event_type"] for i in infos} == {"uprobe", "uretprobe"}
        assert {int(i["ref_ctr_offset"], 16) for i in infos} == {0}
        address = elfsyms.function_addresses(str(lib), frozenset({"cudaMemcpy"}))["cudaMemcpy"]
        memcpy = elfsyms.vaddr_to_file_offset(str(lib), address)
        assert memcpy is not None
        assert sum(int(i["offset"], 16) == memcpy for i in infos) == 2  # entry and return
        assert all(int(i["flags"], 8) & os.O_CLOEXEC for i in infos)
    finally:
        probes.close()


def test_the_uprobe_pmu_path_still_links_with_no_reference_counter(
    bindir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels before 6.6 have no uprobe_multi links: the perf PMU path, forced here, holds
    the same probes as perf links (the programs loaded without an expected attach type)."""
    lib = build.build_lockfirst(bindir)
    monkeypatch.setattr(probes_module, "UprobeLinks", functools.partial(UprobeLinks, multi=False))
    probes = Probes(CaptureSettings())
    assert probes._uprobes.attach_type == -1
    try:
        st = lib.stat()
        attached = probes.attach(LibraryFile((st.st_dev, st.st_ino), str(lib), str(lib),
                                             "runtime"))
        assert attached is not None and attached.probes == 7
        infos = [_fdinfo(fd) for fd in probes._links[(st.st_dev, st.st_ino)]]
        assert {i["link_type"] for i in infos} == {"perf"}
        assert {i["event_type"] for i in infos} == {"uprobe", "uretprobe"}
        assert {i["ref_ctr_offset"] for i in infos} == {"0x0"}
        address = elfsyms.function_addresses(str(lib), frozenset({"cudaMemcpy"}))["cudaMemcpy"]
        assert sum(int(i["offset"], 16) == elfsyms.vaddr_to_file_offset(str(lib), address)
                   for i in infos) == 2
    finally:
        probes.close()


@contextlib.contextmanager
def dlopener(probes: Probes) -> Iterator[tuple[subprocess.Popen[str], IO[str], IO[str]]]:
    """A Python child that dlopens each path written to its stdin and answers "open", in
    `probes`' scope with its loader probed; (child, its stdin, its stdout)."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import ctypes, sys
            print("ready", flush=True)
            for line in sys.stdin:
                ctypes.CDLL(line.strip())
                print("open", flush=True)
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stdin, stdout = child.stdin, child.stdout
    assert stdin is not None and stdout is not None
    try:
        assert stdout.readline().strip() == "ready"
        loader = procmaps.loader_of(Path("/proc"), child.pid)
        assert loader is not None and probes.attach(loader) is not None
        probes.add_to_scope([child.pid])
        yield child, stdin, stdout
    finally:
        child.kill()
        child.communicate()  # waits, and closes the pipes
        probes.close(background=False)


def test_a_dlopen_notifies_once_its_objects_are_mapped(tmp_path: Path) -> None:
    """ld.so calls _dl_debug_state twice for a dlopen that maps something: RT_ADD before it
    maps anything, RT_CONSISTENT after. Only the second is a notification (and a hold):
    one per dlopen of a new file, none for a file already loaded."""
    from gpuflight.simgpu.cbuild import compile_c

    source = tmp_path / "empty.c"
    source.write_text("int gf_empty(void) { return 0; }\n")
    libs = [compile_c(tmp_path / f"libgfempty{i}.so", [source], ["-shared", "-fPIC"])
            for i in range(3)]
    probes = Probes(CaptureSettings(pids=frozenset()))
    with dlopener(probes) as (child, stdin, stdout):

        def notifications_for(path: Path) -> int:
            stdin.write(f"{path}\n")
            stdin.flush()
            assert stdout.readline().strip() == "open"
            # Submitted by the child's own dlopen before it returned: in the ring now.
            return sum(1 for n in probes.poll_loader(0) if n.pid == child.pid)

        assert [notifications_for(lib) for lib in libs] == [1, 1, 1]
        assert notifications_for(libs[0]) == 0  # loaded already: the link map is unchanged


def test_a_dlopen_of_quiet_files_only_is_neither_notified_nor_held(tmp_path: Path) -> None:
    """With quiet loads (trace's holds), the kernel lets a dlopen through, unheld and counted,
    when every file it mapped is one user space called quiet (Probes.add_quiet); a dlopen of
    any other file is notified and held as before, and so is one that maps a quiet file
    together with another (its DT_NEEDED), and one of a quiet file changed since (its ctime)."""
    from gpuflight.simgpu.cbuild import compile_c

    source = tmp_path / "empty.c"
    source.write_text("int gf_empty(void) { return 0; }\n")
    quiet, unknown, _needed, written = (compile_c(tmp_path / f"libgf{name}.so", [source],
                                                  ["-shared", "-fPIC"])
                                        for name in ("quiet", "unknown", "needed", "written"))
    both = compile_c(tmp_path / "libgfboth.so", [source],
                     ["-shared", "-fPIC", f"-L{tmp_path}", "-Wl,--no-as-needed", "-lgfneeded",
                      f"-Wl,-rpath,{tmp_path}"])
    settings = CaptureSettings(pids=frozenset(), hold_on_load=True, follow_forks=True)
    assert settings.quiet_loads_on
    probes = Probes(settings)
    assert probes.quiet_loads, "the kernel's BTF gives the walk's offsets on this machine"
    files = [(st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)
             for st in (quiet.stat(), both.stat(), written.stat())]
    assert probes.add_quiet(files) == 3
    assert probes.add_quiet(files) == 0  # told already
    before = written.stat().st_ctime_ns
    while written.stat().st_ctime_ns == before:  # changed since (its content could be too)
        os.utime(written)
    with dlopener(probes) as (child, stdin, stdout):

        def holds_for(path: Path) -> list[bool]:
            """Whether each notification of this dlopen held the child (released at once)."""
            stdin.write(f"{path}\n")
            stdin.flush()
            held: list[bool] = []
            deadline = time.monotonic() + 60
            while not select.select([stdout], [], [], 0)[0]:
                assert time.monotonic() < deadline, f"the dlopen of {path} never returned"
                for note in probes.poll_loader(0.05):  # waits on the ring, 50 ms at most
                    if note.pid == child.pid:
                        held.append(note.held)
                        if note.held:
                            os.kill(child.pid, signal.SIGCONT)
            assert stdout.readline().strip() == "open"
            held += [n.held for n in probes.poll_loader(0) if n.pid == child.pid]
            return held

        assert holds_for(quiet) == []
        assert probes.drops().quiet_loads == 1
        assert holds_for(unknown) == [True]
        assert holds_for(both) == [True]  # libgfneeded.so is not known to be quiet
        assert holds_for(written) == [True]  # not the file it was when called quiet
        assert probes.drops().quiet_loads == 1


# ---- beside another tracer -----------------------------------------------------------------


class BpfTrace:
    """bpftrace counting the calls of one function, ready once its BEGIN probe has run (after
    every probe of the script is attached)."""

    def __init__(self, library: Path, function: str, timeout_s: float = 120) -> None:
        binary = shutil.which("bpftrace")
        assert binary is not None
        script = (f'BEGIN {{ printf("ready\\n"); }} uprobe:{library}:{function} '
                  f'{{ @calls++; }} END {{ printf("calls %d\\n", @calls); clear(@calls); }}')
        self.proc = subprocess.Popen([binary, "-e", script], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        deadline = time.monotonic() + timeout_s
        for line in self.proc.stdout:  # bpftrace compiles, attaches, then runs BEGIN
            self.lines.append(line)
            if line.strip() == "ready":
                return
            if time.monotonic() > deadline:
                break
        self.proc.kill()
        raise AssertionError("bpftrace did not attach: " + "".join(self.lines))

    def stop(self) -> int:
        """The calls it counted."""
        self.proc.send_signal(signal.SIGINT)
        rest, _ = self.proc.communicate(timeout=60)  # waits, and closes the pipe
        text = "".join(self.lines) + rest
        found = re.search(r"^calls (\d+)$", text, re.MULTILINE)
        assert found, text
        return int(found.group(1))


class Caller:
    """A process that maps `library`, then (when told) calls cudaDeviceSynchronize N times."""

    SCRIPT = textwrap.dedent("""
        import ctypes, sys
        lib = ctypes.CDLL(sys.argv[1])
        print("mapped", flush=True)
        sys.stdin.readline()
        for _ in range(int(sys.argv[2])):
            assert lib.cudaDeviceSynchronize() == 0
        print("done", flush=True)
    """)

    def __init__(self, library: Path, calls: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT, str(library), str(calls)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "mapped\n"
        self.pid = self.proc.pid

    def go(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "done\n"
        assert self.proc.wait(60) == 0

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=60)  # waits, and closes the pipes


def _mismatches(since: int) -> list[str]:
    """The kernel's 'ref_ctr_offset mismatch' complaints logged after the first `since` lines."""
    log = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout
    return [line for line in log.splitlines()[since:] if "ref_ctr_offset mismatch" in line]


def _dmesg_lines() -> int:
    return len(subprocess.run(["dmesg"], capture_output=True, text=True,
                              check=False).stdout.splitlines())


@pytest.fixture
def bpftrace_ready() -> None:
    require(None if shutil.which("bpftrace") else
            "bpftrace is not installed (scripts/setup test installs it)")


@pytest.fixture
def own_runtime(tmp_path: Path) -> Iterator[Path]:
    """A runtime file no other process maps (its inode is this test's alone)."""
    lib = build.build_simgpu(tmp_path / "simgpu") / "libcudart.so.12"
    yield lib


@pytest.mark.parametrize("first", ["bpftrace", "gpuflight"])
def test_beside_another_tracer_both_see_every_call(
    first: str, own_runtime: Path, tmp_path: Path, bpftrace_ready: None
) -> None:
    """Another tracer's uprobe (bpftrace, through libbcc's own 7-argument attach: ref_ctr_offset
    0) on the function gpuflight probes too, held while gpuflight attaches, and the reverse."""
    wait_for_probe_releases()
    dmesg_before = _dmesg_lines()
    inode = f"{own_runtime.stat().st_ino:#x}"
    caller = Caller(own_runtime, CALLS)
    other = BpfTrace(own_runtime, "cudaDeviceSynchronize") if first == "bpftrace" else None
    producer = Producer(tmp_path / "node.jsonl", "--pid", str(caller.pid))
    try:
        library = producer.wait_for_library(str(own_runtime.parent))
        assert library["unprobed"] == {}, library
        # (The loader may be held by a tracer the kernel will not share with: not this test's.)
        assert [s for s in producer.status()["skipped"] if s["kind"] != "loader"] == []
        if other is None:
            other = BpfTrace(own_runtime, "cudaDeviceSynchronize")
        caller.go()
        producer.wait_for_captured(CALLS)
        counted = other.stop()
        events = producer.stop()
    finally:
        producer.kill()
        caller.close()
        if other is not None and other.proc.poll() is None:
            other.proc.kill()
            other.proc.communicate(timeout=60)
    syncs = [e for e in events if e["pid"] == caller.pid and e["api"] == "cudaDeviceSynchronize"]
    assert len(syncs) == CALLS
    assert counted == CALLS
    # Neither tracer (both register with ref_ctr_offset 0) was refused on this file. (A tracer
    # registering with another value, e.g. an older gpuflight, would be: "(new): 0x6".)
    refused = [m for m in _mismatches(dmesg_before)
               if f"inode: {inode} " in m and "ref_ctr_offset(new): 0x0" in m]
    assert not refused


# ---- many files: no probe quota -------------------------------------------------------------

FILES = 20


def test_twenty_runtime_files_are_all_probed(bindir: Path, tmp_path: Path) -> None:
    """20 copies of the runtime (67 probes each: past bcc's quota of 1000 open probes), each
    dlopened by its own process under one trace: every copy probed, every call seen."""
    wait_for_probe_releases()
    lib = build.build_simgpu(tmp_path / "simgpu") / "libcudart.so.12"
    dlopen = build.build_dlopen(bindir)
    copies = []
    for i in range(FILES):
        copy = tmp_path / f"copy{i}" / "libcudart.so.12"
        copy.parent.mkdir()
        shutil.copyfile(lib, copy)
        copies.append(copy)
    script = "; ".join(f'"{dlopen}" --lib "{c}" --iters 2' for c in copies)
    out = tmp_path / "out.jsonl"
    proc = run_trace(["sh", "-c", script], out, timeout_s=1800)
    assert proc.returncode == 0, proc.stderr
    assert "NOT PROBED" not in proc.stderr and "partly probed" not in proc.stderr, proc.stderr
    events = read_events(out)
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        by_pid.setdefault(event["pid"], []).append(event)
    assert len(by_pid) == FILES, sorted(by_pid)
    for got in by_pid.values():
        missing, unexpected = expected.diff(expected.dlopen_events(2), got)
        assert not missing and not unexpected, (missing, unexpected)


# ---- what the kernel refuses ---------------------------------------------------------------


def test_a_lock_prefixed_function_costs_only_itself(bindir: Path, tmp_path: Path) -> None:
    lib = build.build_lockfirst(bindir)
    out = tmp_path / "out.jsonl"
    proc = run_trace([str(build.build_dlopen(bindir)), "--lib", str(lib), "--iters", "3"], out)
    assert proc.returncode == 0, proc.stderr
    missing, unexpected = expected.diff(expected.dlopen_events(3), read_events(out))
    assert not missing and not unexpected, proc.stderr
    partly = [line for line in proc.stderr.splitlines() if "partly probed" in line]
    assert len(partly) == 1, proc.stderr
    assert str(lib) in partly[0] and "cudaDeviceSynchronize" in partly[0]
    assert "cannot probe the instruction" in partly[0]
    assert "NOT PROBED" not in proc.stderr


def test_nothing_probed_is_loud_and_not_a_success(bindir: Path, tmp_path: Path) -> None:
    """Every function of the command's runtime refused: the summary says the library was not
    probed and that nothing was traced, and trace exits 69 although the command succeeded."""
    lib = build.build_lockfirst(bindir, all_locked=True)
    proc = run_trace([str(build.build_dlopen(bindir)), "--lib", str(lib)],
                     tmp_path / "out.jsonl")
    assert proc.returncode == trace.EXIT_NOT_TRACED, proc.stderr
    assert f"NOT PROBED: CUDA library {lib} (runtime): none of its functions could be probed" in (
        proc.stderr)
    assert "nothing was traced" in proc.stderr


@pytest.fixture
def setpriv() -> str:
    binary = shutil.which("setpriv")
    require(None if binary else "setpriv (util-linux) is not installed")
    assert binary is not None
    return binary


# What the fault sweep ran with: every capability it thought needed, but CAP_SYS_ADMIN, which
# the kernel's uprobe PMU asks for: one line, exit 3, never "ready" with nothing attached.
SOME_CAPS = "-all,+bpf,+perfmon,+sys_ptrace,+dac_read_search,+kill"


@pytest.mark.parametrize("command", ["trace", "producer"])
def test_uprobes_refused_for_privilege_are_one_line_and_exit_3(
    command: str, setpriv: str, bindir: Path, tmp_path: Path
) -> None:
    args = (["trace", "--", str(build.build_capture(bindir, "stub"))] if command == "trace"
            else ["producer", "--output", str(tmp_path / "node.jsonl")])
    proc = subprocess.run([setpriv, f"--bounding-set={SOME_CAPS}", *GPUFLIGHT, *args],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [line for line in proc.stderr.splitlines() if line]
    assert proc.returncode == 3, proc.stderr
    assert len(lines) == 1, proc.stderr
    # The start-up check (producer.probe.preflight) refuses before any attach; without it, the
    # kernel's refusal of the first uprobe would be the same one line (test_probes: the seam).
    assert lines[0].startswith("gpuflight: error: gpuflight lacks CAP_SYS_ADMIN"), lines[0]


@pytest.mark.parametrize("multi", [True, False], ids=["uprobe_multi", "perf PMU"])
def test_each_row_s_cookie_reaches_its_family_s_program_either_way_of_attaching(
        bindir: Path, tmp_path: Path, multi: bool) -> None:
    """One program serves each family of the probe table; the row's api id and constant
    (copy direction, allocation kind, memset width, sync scope) reach it in the attach
    cookie, through uprobe_multi links and through perf links (forced) alike: every call of
    every API is recorded once, exactly as made."""
    binary = build.build_capture(bindir, "cu12")
    out = tmp_path / "out.jsonl"
    force = ("import functools, gpuflight.producer.probe.probes as p; "
             f"p.UprobeLinks = functools.partial(p.UprobeLinks, multi={multi}); ")
    proc = subprocess.run(
        [sys.executable, "-c", force + "from gpuflight.cli import main; raise SystemExit(main())",
         "trace", "--output", str(out), "--", str(binary), "--threads", "2", "--iters", "20",
         "--all-apis"],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    missing, unexpected = expected.diff(expected.capture_events(2, 20, all_apis=True),
                                        read_events(out))
    assert not missing and not unexpected, (missing[:3], unexpected[:3])


def test_before_attach_cookies_each_row_has_programs_the_kernel_verifies() -> None:
    """Kernels before 5.15 read no cookies: there each row of the table has programs of its
    own (GF_ATTACH_COOKIE 0). They compile and the kernel verifies every one."""
    from bcc import BPF

    from gpuflight.producer.contract.abi import PROBES

    settings = CaptureSettings()
    flags = [f for f in settings.cflags() if not f.startswith("-DGF_ATTACH_COOKIE=")]
    bpf = BPF(src_file=str(settings.bpf_dir / "cudart.bpf.c").encode(),
              cflags=[*flags, "-DGF_ATTACH_COOKIE=0"])
    try:
        names = [p.program(half, cookies=False) for p in PROBES
                 for half in ("entry", "return") if half == "entry" or p.returns]
        assert len(names) > 150
        for name in names:
            assert bpf.load_func(name.encode(), BPF.KPROBE).fd >= 0, name
    finally:
        bpf.cleanup()
