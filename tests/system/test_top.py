"""`gpuflight top` as a person and a script use it, on a real node-wide capture: `--json`
adds up to exactly what the workload did; in tmux (send-keys, capture-pane) the screen shows
its row, sorts, filters and opens its details; with a node agent running, top reads the agent's
feed instead of probing again."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuflight.demo.build import SIMGPU_SONAME
from tests.support.capture import GPUFLIGHT, start_calls, wait_for_probe_releases
from tests.support.capture import Producer as NodeProducer
from tests.workloads import build

pytestmark = pytest.mark.bpf

THREADS, ITERS = 2, 400
TIMEOUT_S = 120.0


def _wait(done: Callable[[], Any], what: str, timeout_s: float = TIMEOUT_S) -> Any:
    """Poll `done` (a look at a screen or /proc: nothing to block on) until it is truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = done()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@contextmanager
def _workload(bindir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The capture workload, its runtime mapped and its calls held back (start delay) until
    the test ends the delay (start_calls)."""
    binary = build.build_capture(bindir, "stub")
    proc = subprocess.Popen([str(binary), "--threads", str(THREADS), "--iters", str(ITERS),
                             "--start-delay-ms", "600000"])
    try:
        _wait(lambda: SIMGPU_SONAME in Path(f"/proc/{proc.pid}/maps").read_text(),
              "the workload's runtime mapped")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def _command(work: subprocess.Popen[bytes]) -> str:
    """The workload's command as the kernel names it (what top's COMMAND column shows)."""
    args = work.args
    assert isinstance(args, list)
    return Path(str(args[0])).name[:15]


def _lines(proc: subprocess.Popen[bytes]) -> Iterator[dict[str, Any]]:
    assert proc.stdout is not None
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
        assert ready, "top printed nothing"
        line = proc.stdout.readline()
        if not line:
            return
        yield orjson.loads(line)


def test_json_rows_add_up_to_what_the_workload_did(bindir: Path) -> None:
    wait_for_probe_releases()
    with _workload(bindir) as work:
        top = subprocess.Popen([*GPUFLIGHT, "top", "--json", "--interval", "0.5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            lines = _lines(top)
            next(lines)  # the first interval: the probes are on the workload's runtime
            start_calls(work.pid)
            totals = {"launches": 0.0, "h2d": 0.0, "d2h": 0.0}
            rows: list[dict[str, Any]] = []
            for line in lines:
                mine = [r for r in line["rows"] if r["pid"] == work.pid]
                for row in mine:
                    rows.append(row)
                    totals["launches"] += row["launches_per_s"] * line["interval_s"]
                    totals["h2d"] += row["h2d_gb_per_s"] * 1e9 * line["interval_s"]
                    totals["d2h"] += row["d2h_gb_per_s"] * 1e9 * line["interval_s"]
                if work.poll() is not None and not mine:
                    break  # done, and its last interval was read
        finally:
            top.send_signal(signal.SIGINT)
            _, err = top.communicate(timeout=60)
    assert work.returncode == 0
    assert b"Traceback" not in err, err
    # capture.c: per thread and iteration 4 kernel launches, an H2D copy of 4096*(t+1)
    # bytes and a D2H one of 1 MiB.
    assert round(totals["launches"]) == 4 * THREADS * ITERS
    assert round(totals["h2d"]) == ITERS * sum(4096 * (t + 1) for t in range(THREADS))
    assert round(totals["d2h"]) == ITERS * THREADS * (1 << 20)
    busy = [r for r in rows if r["launches_per_s"]]
    assert busy and all(r["command"] == _command(work) for r in busy)
    assert {r["top_kernel"] for r in busy} <= {"kernel_a", "kernel_b", "kernel_c", "kernel_d"}


class _Tmux:
    def __init__(self, session: str, command: list[str]) -> None:
        self.session = session
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "220", "-y", "40",
                        *command], check=True)

    def screen(self) -> str:
        done = subprocess.run(["tmux", "capture-pane", "-p", "-t", self.session],
                              capture_output=True, text=True, check=False)
        return done.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.session, *keys], check=True)

    def alive(self) -> bool:
        return subprocess.run(["tmux", "has-session", "-t", self.session],
                              capture_output=True, check=False).returncode == 0

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.session], capture_output=True,
                       check=False)


def test_a_person_sorts_filters_and_opens_a_process_in_tmux(bindir: Path,
                                                            tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing (scripts/setup installs it)")
    wait_for_probe_releases()
    with _workload(bindir) as work:
        tmux = _Tmux(f"gftop{os.getpid()}", [*GPUFLIGHT, "top"])
        try:
            _wait(lambda: "gpuflight top" in tmux.screen(), "top's screen")
            start_calls(work.pid)
            _wait(lambda: any(line.split()[:2] == [str(work.pid), _command(work)]
                              for line in tmux.screen().splitlines()), "the workload's row")
            assert "LAUNCH/S ▼" in tmux.screen()
            tmux.keys("s")
            _wait(lambda: "BLOCKS/L ▼" in tmux.screen(), "sorted by blocks per launch")
            tmux.keys("/", _command(work), "Enter")
            _wait(lambda: f"filter '{_command(work)}'" in tmux.screen(), "the filter")
            rows = [line for line in tmux.screen().splitlines()
                    if line.strip() and line.split()[0].isdigit()]
            assert rows and all(line.split()[1] == _command(work) for line in rows), rows
            tmux.keys("Enter")
            _wait(lambda: f"pid {work.pid}" in tmux.screen() and "KERNEL" in tmux.screen(),
                  "the process's details")
            # Apart: ESC and a key at once is what a terminal sends for Alt+key.
            tmux.keys("Escape")
            _wait(lambda: "processes, sorted by" in tmux.screen(), "the table again")
            tmux.keys("q")
            _wait(lambda: not tmux.alive(), "top to quit")
        finally:
            tmux.kill()


def test_with_a_node_agent_running_top_reads_its_feed(bindir: Path, tmp_path: Path) -> None:
    wait_for_probe_releases()
    feed = tmp_path / "run" / "top.sock"
    with _workload(bindir) as work:
        agent = NodeProducer(tmp_path / "node.jsonl", "--top-feed", str(feed))
        try:
            agent.wait_for_library(SIMGPU_SONAME)
            start_calls(work.pid)
            assert work.wait(60) == 0
            top = subprocess.run([*GPUFLIGHT, "top", "--once", "--json", "--top-feed",
                                  str(feed)], capture_output=True, timeout=60, check=False)
            assert top.returncode == 0, top.stderr
            (line,) = top.stdout.splitlines()
            shown = orjson.loads(line)
            # It read the feed: it probed nothing itself (the agent's probes are the only ones).
            assert shown["source"].startswith("the node agent's feed"), shown["source"]
            assert isinstance(shown["rows"], list)
        finally:
            agent.stop()


@pytest.mark.simgpu
def test_top_through_the_agent_shows_gpu_seconds_and_prices_them(tmp_path: Path) -> None:
    """The agent reads NVML (the simulated GPU's, real-time timing model) for top as its own
    capture would: the server's row carries GPU-seconds a second and the GPU's model, and top
    prices it with its book (H100: 3.00 USD an hour by default)."""
    from gpuflight.simgpu.build import build as build_sim

    wait_for_probe_releases()
    sim = build_sim(tmp_path / "sim")
    activity = tmp_path / "activity"
    activity.mkdir()
    nvml = {"GF_SIM_NVML_DIR": str(activity), "GF_SIM_NVML_PERIOD_US": "10000"}
    feed = tmp_path / "run" / "top.sock"
    agent = NodeProducer(tmp_path / "node.jsonl", "--top-feed", str(feed), wrapper=(
        "env", f"GPUFLIGHT_NVML_LIB={sim.nvml}", *(f"{k}={v}" for k, v in nvml.items())))
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.workloads.nvml_server", "serve", "--runtime",
         str(sim.runtime(12)), "--expect", str(tmp_path / "expect.json"), "--requests", "3000",
         "--pause-ms", "5", "--hold"],
        stdin=subprocess.PIPE, env={**os.environ, **nvml, "GF_SIM_NS_PER_THREAD": "1"})
    top = None
    try:
        agent.wait_for_library(sim.runtime(12).name)
        top = subprocess.Popen([*GPUFLIGHT, "top", "--json", "--interval", "0.5", "--top-feed",
                                str(feed)], stdout=subprocess.PIPE)
        assert server.stdin is not None
        server.stdin.write(b"go\n")
        server.stdin.flush()
        deadline = time.monotonic() + TIMEOUT_S
        for shown in _lines(top):  # each interval's rows, until NVML has seen its work
            assert time.monotonic() < deadline, "no GPU-seconds for the server's row"
            assert shown["source"].startswith("the node agent's feed"), shown["source"]
            row = next((r for r in shown["rows"]
                        if r["pid"] == server.pid and r["gpu_s_per_s"]), None)
            if row is not None:
                break
        assert row is not None
        assert row["gpu"] == "NVIDIA H100 80GB HBM3"
        assert 0 < row["gpu_s_per_s"] <= 1.0
        assert row["usd_per_h"] == pytest.approx(row["gpu_s_per_s"] * 3.00)
    finally:
        for proc in (top, server):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(30)
                for pipe in (proc.stdin, proc.stdout):
                    if pipe is not None:
                        pipe.close()
        agent.stop()


def _pid_of(binary: Path) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "exe")) == binary:
                    return int(entry.name)
            except OSError:
                continue
    return None


def test_trace_top_shows_the_command_live_then_its_summary(bindir: Path, tmp_path: Path) -> None:
    """`trace --top`: the screen on the command's row while it runs, its output in a file;
    once it exits, the screen closes and the summary counts what it did."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing (scripts/setup installs it)")
    wait_for_probe_releases()
    binary = build.build_capture(bindir, "stub").resolve()
    out, status = tmp_path / "command.out", tmp_path / "status"
    workload = (f"echo the command started; exec {binary} --threads {THREADS} --iters {ITERS} "
                "--start-delay-ms 600000 --hold-ms 600000")
    trace = " ".join([*GPUFLIGHT, "trace", "--top", "--command-output", str(out), "--", "sh",
                      "-c", repr(workload)])
    tmux = _Tmux(f"gftrace{os.getpid()}", [f"{trace}; echo EXIT=$? > {status}; sleep 600"])
    try:
        pid = _wait(lambda: _pid_of(binary), "the workload")
        start_calls(pid)
        _wait(lambda: any(line.split()[:2] == [str(pid), binary.name[:15]]
                          for line in tmux.screen().splitlines()), "the workload's row")
        assert "from trace of sh -c" in tmux.screen()
        os.kill(pid, signal.SIGTERM)  # in its hold, its calls made: the trace ends with it
        _wait(lambda: status.exists() and status.read_text().strip(), "trace to end")
        assert status.read_text().strip() == f"EXIT={128 + signal.SIGTERM}"
        screen = tmux.screen()
        launches = f"{4 * THREADS * ITERS:,}  kernel launches"
        assert launches in screen, screen
        assert f"the command's output: {out}" in screen, screen
        assert "Traceback" not in screen and "error" not in screen, screen  # ended as told
        assert out.read_text() == "the command started\n"
    finally:
        tmux.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_top_for_scripts_stops_on_a_signal_even_as_a_background_job(sig: int) -> None:
    """A background job starts with SIGINT ignored (POSIX), and so did top under it: it kept
    running after SIGINT. It now stops on SIGINT or SIGTERM, as the node agent does, after
    a whole line."""
    wait_for_probe_releases()

    # SIGINT ignored across the exec, as a shell starts a background job.
    ignoring = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "os.execv(sys.argv[1], sys.argv[1:])")
    top = subprocess.Popen([sys.executable, "-c", ignoring, *GPUFLIGHT, "top", "--json",
                            "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = _lines(top)
        next(lines)  # capturing
        top.send_signal(sig)
        out, err = top.communicate(timeout=60)
    finally:
        if top.poll() is None:
            top.kill()
            top.communicate()
    assert top.returncode == 128 + sig, err
    assert b"Traceback" not in err and b"error" not in err, err
    assert all(orjson.loads(line) for line in out.splitlines())  # whole lines only
