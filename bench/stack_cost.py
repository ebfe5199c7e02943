"""What code-path sampling adds to a probed call of the real capture (issue 28's budget: ≤ 10 %
of the probe's own cost at the default rate), per Python version, on NVIDIA's own driver.

    sudo .venv/bin/python bench/stack_cost.py [--pythons 3.9,3.10,3.11,3.12,3.13] [--calls N]
                                              [--rounds R] [--depths 20,100]

A Python process recurses D frames deep (the walk stops at 64: 100 is its worst case) and
calls NVIDIA's libcuda 535 `cuLaunchKernel` through ctypes N times (scripts/setup-libcuda;
without a GPU each call fails at once, so what is left is the probe's cost), five ways,
interleaved, R rounds:
- untraced;
- under `gpuflight trace` (no code paths);
- under `gpuflight trace --stacks F` at the defaults (`--stack-sampling auto`: the period each
  CPU's walks, as the kernel times them, need to add at most `--stack-cost` 40 ns to a recorded
  call; at most 2,000 walks a second a CPU);
- under `gpuflight trace --stacks F --stack-sampling 100` (one call in 100, the fixed default
  before the budget);
- under `gpuflight trace --stacks F --stack-sampling 1` (every call walked: exact).
Two figures a call: the loop's own wall-clock time (what the process pays: the probe's own
cost is traced minus untraced), and the time of the capture's BPF programs per hit, from the
kernel's BPF statistics of the trace process's programs (what sampling adds, without the
wall clock's noise). The loop runs on one core, the trace on the other; medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
NVIDIA_LIBCUDA = REPO / ".cache" / "nvidia-cuda" / "libcuda.so.1"
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
LOOP_CPU, READER_CPU = "1", "0"
#: The workload: warm up until told to go (the probes attach when libcuda is seen), then N
#: timed calls D frames deep; wait to be let go (the trace's programs are read meanwhile).
WORKLOAD = """
import ctypes, os, sys, time
lib, depth, calls, sync = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cuda = ctypes.CDLL(lib)
launch = cuda.cuLaunchKernel
launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
launch.restype = ctypes.c_int
go, done, leave = (os.path.join(sync, name) for name in ("go", "done", "leave"))
def deep(n):
    if n > 1:
        return deep(n - 1)
    while not os.path.exists(go):
        for _ in range(1000):
            launch(None, 1, 2, 3, 32, 1, 1, 0, None, None, None)
    start = time.perf_counter_ns()
    for _ in range(calls):
        launch(None, 1, 2, 3, 32, 1, 1, 0, None, None, None)
    ns = (time.perf_counter_ns() - start) / calls
    with open(done, "w") as out:
        out.write(f"{ns}\\n")
    while not os.path.exists(leave):
        time.sleep(0.01)
sys.setrecursionlimit(10000)
deep(depth)
"""
#: The ways the loop runs: label → trace's arguments (None: untraced).
WAYS: dict[str, list[str] | None] = {
    "untraced": None,
    "trace": [],
    "trace --stacks (default: auto, 40 ns)": ["--stacks", "{stacks}"],
    "trace --stacks --stack-sampling 100": ["--stacks", "{stacks}", "--stack-sampling", "100"],
    "trace --stacks --stack-sampling 1": ["--stacks", "{stacks}", "--stack-sampling", "1"],
}


@dataclass(frozen=True)
class Run:
    wall_ns: float  # the loop's wall-clock time a call
    program_ns: float | None  # the capture's programs a hit of cuLaunchKernel's probe
    walks: int | None


def _programs(pid: int) -> dict[int, tuple[int, int]]:
    """prog_id → (run_time_ns, run_cnt) of the BPF programs `pid` holds."""
    out = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) != "anon_inode:bpf-prog":
                continue
            fields = dict(line.split(":", 1) for line in
                          Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().splitlines())
        except OSError:
            continue
        out[int(fields["prog_id"])] = (int(fields["run_time_ns"]), int(fields["run_cnt"]))
    return out


def _wait(path: Path, proc: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited ({proc.returncode}) before {path.name}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {path.name} in {seconds:.0f} s")
        time.sleep(0.02)


def _firing(pid: int, proc: subprocess.Popen[str],
            seconds: float = 120) -> dict[int, tuple[int, int]]:
    """The trace's programs once one of them runs (cuLaunchKernel's probe is attached)."""
    deadline = time.monotonic() + seconds
    first = _programs(pid)
    while True:
        now = _programs(pid)
        if any(count > first.get(prog, (0, 0))[1] + 1000 for prog, (_, count) in now.items()):
            return now
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the trace's probes never fired")
        time.sleep(0.05)


def _one(python: str, depth: int, calls: int, way: list[str] | None) -> Run:
    with tempfile.TemporaryDirectory() as tmp:
        sync = Path(tmp)
        workload = ["taskset", "-c", LOOP_CPU, python, "-c", WORKLOAD, str(NVIDIA_LIBCUDA),
                    str(depth), str(calls), tmp]
        if way is None:
            args = workload
        else:
            args = ["taskset", "-c", READER_CPU, sys.executable, "-m", "gpuflight", "trace",
                    *(a.format(stacks=sync / "stacks.txt") for a in way), "--", *workload]
        with subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as proc:
            try:
                before = _firing(proc.pid, proc) if way is not None else {}
                (sync / "go").touch()
                _wait(sync / "done", proc)
                after = _programs(proc.pid) if way is not None else {}
                (sync / "leave").touch()
                _, err = proc.communicate(timeout=300)
            finally:
                if proc.poll() is None:
                    proc.kill()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:8])} … exited {proc.returncode}: {err[-2000:]}")
        wall = float((sync / "done").read_text())
        program = walks = None
        if way is not None:
            # The programs that ran at least once a call: cuLaunchKernel's probe (others, such
            # as the process watch, run a few times).
            deltas = [(t - before.get(p, (0, 0))[0], c - before.get(p, (0, 0))[1])
                      for p, (t, c) in after.items()]
            hot = [(t, c) for t, c in deltas if c >= calls // 2]
            hits = max((c for _, c in hot), default=0)
            program = sum(t for t, _ in hot) / hits if hits else None
            found = re.search(r"stack\(s\), ([\d,]+) walk\(s\)", err)
            if found:
                walks = int(found.group(1).replace(",", ""))
        return Run(wall, program, walks)


def _python(version: str) -> str | None:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(root.glob(f"{version}.*/bin/python{version}"))
    return str(found[-1]) if found else shutil.which(f"python{version}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pythons", default="3.9,3.10,3.11,3.12,3.13")
    parser.add_argument("--calls", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--depths", default="20,100")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/stack_cost.py: run as root", file=sys.stderr)
        return 1
    if not NVIDIA_LIBCUDA.exists():
        print(f"bench/stack_cost.py: {NVIDIA_LIBCUDA} is not unpacked (scripts/setup)",
              file=sys.stderr)
        return 1
    before = STATS.read_text().strip()
    STATS.write_text("1\n")
    rows = []
    try:
        for version, depth in ((v, int(d)) for v in args.pythons.split(",")
                               for d in args.depths.split(",")):
            python = _python(version)
            if python is None:
                print(f"CPython {version}: not here, skipped")
                continue
            runs: dict[str, list[Run]] = {way: [] for way in WAYS}
            for _ in range(args.rounds):
                for way, trace_args in WAYS.items():
                    runs[way].append(_one(python, depth, args.calls, trace_args))
            wall = {w: statistics.median(r.wall_ns for r in rs) for w, rs in runs.items()}
            program = {w: statistics.median(r.program_ns for r in rs if r.program_ns is not None)
                       for w, rs in runs.items() if w != "untraced"}
            own = wall["trace"] - wall["untraced"]
            for way in WAYS:
                added = None if way in ("untraced", "trace") else program[way] - program["trace"]
                walks = [r.walks for r in runs[way] if r.walks is not None]
                rows.append([
                    f"{version}, {depth} frames" if way == "untraced" else "", way,
                    f"{wall[way]:.0f}",
                    f"{program[way]:.0f}" if way in program else "-",
                    "-" if added is None else f"{added:+.0f}",
                    "-" if added is None else f"{100 * added / own:.1f} %",
                    f"{statistics.median(walks):,.0f}" if walks else "-",
                ])
    finally:
        STATS.write_text(before + "\n")
    print(f"machine: {platform.node()} {platform.machine()}, kernel {platform.release()}, "
          f"{time.strftime('%Y-%m-%d')}, cuLaunchKernel (NVIDIA's libcuda 535) through ctypes, "
          f"{args.calls:,} calls x {args.rounds} rounds, medians")
    print(tabulate(rows, disable_numparse=True, headers=[
        "Python, stack", "run", "wall ns a call", "programs ns a hit", "added by sampling ns",
        "vs the probe's own cost", "stacks walked"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
