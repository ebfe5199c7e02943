"""What the in-kernel Python walk costs a probed call (issue 28's budget: ≤ 10 % of the probe's
own cost at the default rate), by the kernel's own BPF statistics.

    sudo .venv/bin/python bench/pywalk_cost.py [--python PY] [--calls N] [--rounds R]

A Python process recurses to a depth D (10, 40, 100 frames) and calls a C function through
ctypes N times; a uprobe on it runs tests/workloads/pywalk.bpf.c (look up the process, count
down, and on a sampled call walk, hash and send the stack) at a sampling period of 1 (every
call walked: the walk's whole cost) and at larger periods, beside an empty program on the same
function (the floor of a program). `run_time_ns / run_cnt` from each program's fdinfo time the
program alone, which moves far less with other work on the machine than wall-clock time.
Rounds interleave the rows; medians.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO)]

from gpuflight.producer.discover.pythons import find_python  # noqa: E402
from gpuflight.producer.probe.btf import Btf, task_fsbase_cflags  # noqa: E402
from tests.workloads.build import build_point  # noqa: E402

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
EMPTY = b"int on_point(struct pt_regs *ctx) { return 0; }\n"
WORKLOAD = """
import ctypes, sys
point = ctypes.CDLL(sys.argv[1]).gf_point
calls = int(sys.argv[3])
def deep(n):
    if n > 1:
        return deep(n - 1)
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    for _ in range(calls):
        point()
sys.setrecursionlimit(10000)
deep(int(sys.argv[2]))
"""


def _stats(fd: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text()
                  .splitlines() if ":" in line)
    return int(fields["run_time_ns"]), int(fields["run_cnt"])


def _one(python: str, library: Path, depth: int, calls: int, period: int | None) -> float:
    """ns per call of the program (None: the empty one)."""
    from bcc import BPF

    with subprocess.Popen([python, "-c", WORKLOAD, str(library), str(depth), str(calls)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "ready\n"
        if period is None:
            bpf = BPF(text=EMPTY)
        else:
            bpf = BPF(text=(REPO / "tests" / "workloads" / "pywalk.bpf.c").read_bytes(),
                      cflags=[f"-I{REPO / 'bpf'}", "-DGF_PY_MAX_DEPTH=128",
                              *task_fsbase_cflags(Btf.from_file())])
        try:
            if period is not None:
                runtime = find_python(Path("/proc"), proc.pid)
                assert runtime is not None, "no CPython found in the workload"
                bpf[b"py_config"][ctypes.c_int(0)] = ctypes.c_uint32(period)
                procs = bpf[b"py_procs"]
                procs[ctypes.c_uint32(proc.pid)] = procs.Leaf.from_buffer_copy(
                    runtime.offsets_record())
                bpf[b"py_frames"].open_ring_buffer(lambda *_: None)
                bpf[b"py_samples"].open_ring_buffer(lambda *_: None)
            bpf.attach_uprobe(name=str(library).encode(), sym=b"gf_point",
                              fn_name=b"on_point", pid=proc.pid)
            fd = bpf.funcs[b"on_point"].fd
            proc.stdin.write("go\n")
            proc.stdin.close()
            while proc.poll() is None:  # the ring taken as it fills (the samples wake no one)
                if period is not None:
                    bpf.ring_buffer_consume()
                try:
                    proc.wait(0.05)
                except subprocess.TimeoutExpired:
                    continue
            run_ns, count = _stats(fd)
        finally:
            bpf.cleanup()
    assert count == calls, (count, calls)
    return run_ns / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--depths", default="10,40,100")
    parser.add_argument("--periods", default="1,100,1000")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/pywalk_cost.py: run as root", file=sys.stderr)
        return 1
    before = STATS.read_text().strip()
    STATS.write_text("1\n")
    periods = [int(p) for p in args.periods.split(",")]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            library = build_point(Path(tmp))
            for depth in (int(d) for d in args.depths.split(",")):
                timings: dict[int | None, list[float]] = {p: [] for p in [None, *periods]}
                for _ in range(args.rounds):
                    for period, taken in timings.items():
                        taken.append(_one(args.python, library, depth, args.calls, period))
                medians = {p: statistics.median(t) for p, t in timings.items()}
                rows.append([depth, f"{medians[None]:.0f}",
                             *(f"{medians[p]:.0f}" for p in periods)])
    finally:
        STATS.write_text(before + "\n")
    print(tabulate(rows, headers=["depth", "empty program ns",
                                  *(f"period {p} ns" for p in periods)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
