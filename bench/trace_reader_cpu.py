"""trace's own CPU a captured event, at the fastest the traced process can call.

    sudo .venv/bin/python bench/trace_reader_cpu.py [--calls N] [--rounds R] [--baseline REV]

The C loop of bench/overhead.py calls NVIDIA's libcuda 535 `cuLaunchKernel` N times (pinned to
cpu 1) under `gpuflight trace` (pinned to cpu 0), itself run by /usr/bin/time, so that its own
CPU is known: trace's CPU is what its process tree used less the loop's, per event captured
(start-up and the summary included, as a user pays them). `--baseline REV` also runs the
gpuflight of git revision REV (a worktree of it), interleaved in the same rounds. Each is run
once before the rounds (its BPF program compiled and kept then, as on any machine after its
first trace). The summary's
"events counted in the kernel" says whether trace fell behind (its events then counted, their
details not kept).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]

from lower_bound import settle  # noqa: E402  (bench/ is on the path)
from overhead import NVIDIA_LIBCUDA, READER_CPU, build, loop_args  # noqa: E402

MODE = "nvidia"


def run(tree: Path, calls: Path, n: int) -> tuple[float, float, int]:
    """(trace's CPU ns an event, the loop's ns a call, events counted in the kernel) of one
    `gpuflight trace` of the loop, with the gpuflight in `tree`."""
    command = ["taskset", "-c", READER_CPU, sys.executable, "-m", "gpuflight", "trace", "--",
               "/usr/bin/time", "-f", "loop-cpu %U %S", *loop_args(calls, n, MODE)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    loop = next(line for line in proc.stderr.splitlines() if line.startswith("loop-cpu"))
    loop_s = sum(float(word) for word in loop.split()[1:])
    counted = 0
    if "events counted in the kernel:" in proc.stderr:
        counted = int(proc.stderr.split("events counted in the kernel:")[1].split()[0]
                      .replace(",", ""))
    return (total - loop_s) / n * 1e9, float(proc.stdout), counted


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path),
                        rev], check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(path)], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="REV")
    args = parser.parse_args()
    if not NVIDIA_LIBCUDA.exists():
        print(f"{NVIDIA_LIBCUDA} is not unpacked (scripts/setup)", file=sys.stderr)
        return 1
    with contextlib.ExitStack() as stack:
        trees = {"working tree": REPO}
        if args.baseline:
            trees[f"@{args.baseline}"] = stack.enter_context(worktree(args.baseline))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        calls = build(tmp)
        for tree in trees.values():  # each compiles its BPF program once, not in a round
            run(tree, calls, 100_000)
            settle(calls)
        samples: dict[str, list[tuple[float, float, int]]] = {label: [] for label in trees}
        for round_ in range(args.rounds):
            for label, tree in trees.items():
                samples[label].append(run(tree, calls, args.calls))
                settle(calls)
                cpu, call, counted = samples[label][-1]
                print(f"round {round_ + 1}, {label}: {cpu:.0f} ns of trace's CPU an event, "
                      f"the loop {call:.0f} ns a call, {counted:,} counted in the kernel",
                      file=sys.stderr, flush=True)
    rows = [[label, f"{statistics.median(s[0] for s in runs):.0f}",
             " / ".join(f"{s[0]:.0f}" for s in runs),
             f"{statistics.median(s[1] for s in runs):.0f}",
             f"{sum(s[2] for s in runs):,}"] for label, runs in samples.items()]
    print(f"{platform.node()} · {platform.release()} · {os.cpu_count()} CPUs · "
          f"{args.calls:,} calls x {args.rounds} rounds · {time.strftime('%Y-%m-%d')}")
    print(tabulate(rows, headers=["gpuflight", "trace's CPU ns an event (median)", "rounds",
                                  "the loop's ns a call", "counted in the kernel"],
                   tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
