"""Least privilege: the node agent and `gpuflight trace` capture with only the capabilities
producer/preflight.py names (the set compose and the DaemonSet grant instead of privileged),
each of them is needed, and without one the agent refuses in one line.

Each command runs as root with every other capability dropped from its bounding set (setpriv):
what a container started with `cap_drop: ALL` and `cap_add` gets. The workload runs as another
user (nobody) from its private directory (mode 0700), as a job on a shared GPU node does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from gpuflight.producer.probe import preflight
from gpuflight.producer.probe.uprobes import UprobeLinks
from tests.conftest import require
from tests.support.capture import (
    GPUFLIGHT,
    Producer,
    read_events,
    start_calls,
    wait_for_probe_releases,
)
from tests.workloads import build, expected

pytestmark = pytest.mark.bpf

NOBODY = 65534
TIMEOUT_S = 180


@pytest.fixture(scope="module", autouse=True)
def _setpriv() -> None:
    require(None if shutil.which("setpriv") else "no setpriv (util-linux)")


def only(capabilities: Sequence[str]) -> list[str]:
    """setpriv arguments: run as root with these capabilities and no other."""
    bounding = ",".join(["-all", *(f"+{name.removeprefix('CAP_').lower()}"
                                   for name in capabilities)])
    return ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", "--"]


def mask(capabilities: Sequence[str]) -> int:
    bits = {name: bit for name, (bit, _) in preflight.NODE_CAPABILITIES.items()}
    bits |= {"CAP_BPF": 39, "CAP_PERFMON": 38}
    return sum(1 << bits[name] for name in capabilities)


NODE = tuple(preflight.NODE_CAPABILITIES)


@pytest.fixture
def private_home(bindir: Path) -> Iterator[Path]:
    """nobody's private directory (0700) holding the workload and its CUDA runtime."""
    binary = build.build_capture(bindir, "stub")
    home = Path(tempfile.mkdtemp(prefix="gpuflight-nobody-", dir="/tmp"))
    try:
        shutil.copytree(bindir / "simgpu", home / "lib")
        shutil.copy(binary, home / "capture")
        for path in [home, *home.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
        home.chmod(0o700)
        yield home
    finally:
        shutil.rmtree(home)


def as_nobody(home: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
         str(home / "capture"), *args],
        env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(home / "lib")},
    )


def stop_once_mapped(pid: int, home: Path, timeout_s: float = 60) -> None:
    """SIGSTOP the process as soon as it maps its runtime from `home`/lib."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if str(home / "lib") in Path(f"/proc/{pid}/maps").read_text():
            os.kill(pid, signal.SIGSTOP)
            return
        time.sleep(0.005)
    raise AssertionError(f"{pid} never mapped its runtime")


def effective(pid: int) -> int:
    return preflight.effective_capabilities(Path(f"/proc/{pid}/status"))


def test_the_node_agent_captures_with_only_its_capabilities(
    tmp_path: Path, private_home: Path
) -> None:
    wait_for_probe_releases()
    producer = Producer(tmp_path / "node.jsonl", wrapper=only(NODE), ready_timeout_s=180)
    try:
        assert effective(producer.proc.pid) == mask(NODE)
        job = as_nobody(private_home, "--start-delay-ms", "600000", "--iters", "5")
        # It waits before its first call until its runtime is attached (on a busy node the
        # agent may take long to get to it), then is told to start. (Stopped once its maps
        # showed the runtime, it could be stopped before ld.so's notification.)
        try:
            producer.wait_for_library(str(private_home), timeout_s=180)
            start_calls(job.pid)
            assert job.wait(timeout=60) == 0
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        producer.wait_for_captured(len(expected.capture_events(1, 5)))
        events = producer.stop()
    finally:
        producer.kill()
    mine = [e for e in events if e["pid"] == job.pid]
    missing, unexpected = expected.diff(expected.capture_events(1, 5), mine)
    assert not missing and not unexpected, (missing[:3], unexpected[:3])


#: What a capability-less probe of a live process reaches, run under each set: the files it
#: maps (discover, as the agent finds them), then a uprobe on its runtime (the agent's probes).
PROBE_ONE = """
import logging, sys
from gpuflight.producer.discover import procmaps
from gpuflight.producer.probe.probes import Probes
from gpuflight.producer.settings import CaptureSettings
found = [f for f in procmaps.scan(pids=[int(sys.argv[1])]).libraries.values()
         if f.kind == "runtime" and sys.argv[2] in f.path]
if not found:
    sys.exit("found no runtime")
logging.disable(logging.CRITICAL)
try:
    attached = Probes(CaptureSettings()).attach(found[0])
except Exception as exc:
    sys.exit(f"attach failed: {exc}")
sys.exit(None if attached is not None and attached.probes > 0 else "attach failed")
"""

#: Each capability of the set, and what happens without it (the others kept). Without
#: CAP_SYS_ADMIN the program still loads (CAP_BPF and CAP_PERFMON given in its place): on a
#: kernel without uprobe_multi links the uprobes are refused; with them (6.6+), the probes
#: attach, and what it costs is a runtime deleted or replaced since it was mapped, reached
#: only through /proc/PID/map_files.
WITHOUT: Mapping[str, tuple[tuple[str, ...], str]] = {
    "CAP_SYS_ADMIN": (("CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"),
                      "attach failed"),
    "CAP_SYS_PTRACE": (("CAP_SYS_ADMIN", "CAP_DAC_READ_SEARCH"), "found no runtime"),
    "CAP_DAC_READ_SEARCH": (("CAP_SYS_ADMIN", "CAP_SYS_PTRACE"), "found no runtime"),
}


def probe_one(capabilities: Sequence[str], pid: int, home: Path
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*only(capabilities), sys.executable, "-c", PROBE_ONE, str(pid),
                           str(home)], capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)


def test_each_capability_is_needed(private_home: Path) -> None:
    assert set(WITHOUT) == set(NODE)
    multi = UprobeLinks().multi
    job = as_nobody(private_home, "--start-delay-ms", "600000", "--iters", "1")
    try:
        stop_once_mapped(job.pid, private_home)
        full = probe_one(NODE, job.pid, private_home)
        assert full.returncode == 0, full.stderr
        for name, (kept, failure) in WITHOUT.items():
            assert name not in kept
            proc = probe_one(kept, job.pid, private_home)
            if name == "CAP_SYS_ADMIN" and multi:
                assert proc.returncode == 0, proc.stderr  # uprobe_multi links: no PMU
                continue
            assert proc.returncode == 1 and failure in proc.stderr, (name, proc.stderr)
        if multi:
            # The runtime the job maps, deleted: /proc/PID/map_files is the one way to it.
            for runtime in (private_home / "lib").glob("libcudart*"):
                runtime.unlink()
            assert probe_one(NODE, job.pid, private_home).returncode == 0
            proc = probe_one(WITHOUT["CAP_SYS_ADMIN"][0], job.pid, private_home)
            assert proc.returncode == 1 and "found no runtime" in proc.stderr, proc.stderr
    finally:
        job.kill()
        job.wait()


@pytest.mark.parametrize("dropped", NODE)
def test_the_node_agent_without_one_refuses_in_one_line(dropped: str, tmp_path: Path) -> None:
    kept = [name for name in NODE if name != dropped]
    proc = subprocess.run([*only(kept), *GPUFLIGHT, "producer", "--output",
                           str(tmp_path / "out.jsonl")],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 3
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"gpuflight: error: gpuflight lacks {dropped}, needed for ")
    assert ", ".join(NODE) in line


def test_trace_captures_its_command_with_cap_sys_admin_alone(
    tmp_path: Path, bindir: Path
) -> None:
    """Its command runs as it does (same user, same capabilities): nothing more is needed to
    read its maps or open its files, or to release it from a hold (SIGCONT)."""
    binary = build.build_capture(bindir, "stub")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([*only(list(preflight.TRACE_CAPABILITIES)), *GPUFLIGHT, "trace",
                           "--output", str(out), "--", str(binary), "--iters", "5"],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    missing, unexpected = expected.diff(expected.capture_events(1, 5), read_events(out))
    assert not missing and not unexpected, (missing[:3], unexpected[:3])
    trace = subprocess.run([*only([]), *GPUFLIGHT, "trace", "--", "true"],
                           capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert trace.returncode == 3
    assert trace.stderr.splitlines() == [
        "gpuflight: error: gpuflight lacks CAP_SYS_ADMIN, needed for "
        f"{preflight.NODE_CAPABILITIES['CAP_SYS_ADMIN'][1]}: run it as root with "
        "CAP_SYS_ADMIN (README: least privilege)"]
