"""What trace's tracepoints cost: to attach, to release, to the next trace started right after
one ended, and to every system call of the machine meanwhile.

    sudo .venv/bin/python bench/tracepoints.py [--rounds R] [--calls N] [--gap S]
        [--baseline REV]

Each round, in a fresh interpreter, builds trace's program (producer.probe.probes.Probes with
trace's settings, from a cache filled by one untimed start), attaches it, as a trace of a
CUDA program would, to the simulated GPU's runtime and driver (gpuflight/simgpu, loaded into
the round's own process: 202 probes) and times:

  start           Probes(settings): the image read, maps made, tracepoints attached
  close           Probes.close(): what trace's exit waits for (the probes' and tracepoints'
                  release is left to a background process)
  start after     a second Probes(settings), --gap seconds after the close (0.15 s: when a
                  new `gpuflight trace` reaches its attach): what a trace started right
                  after another ended waits for while the kernel releases the first's
                  tracepoints (a background process closes them meanwhile)
  syscall         ns per getppid(2) of a C loop out of scope (no probe holds it), with the
                  program attached, less the same loop with nothing attached: what every
                  system call of the machine pays while a trace runs

With `--baseline REV` the same runs in a `git archive` of REV too, interleaved round by
round. Medians. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from startup import archive  # noqa: E402  (bench/startup.py: this file's folder is on the path)

from gpuflight.simgpu.build import SimGpu  # noqa: E402
from gpuflight.simgpu.build import build as build_sim  # noqa: E402

LOOP_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv)
{
	long n = atol(argv[1]);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++)
		syscall(SYS_getppid);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("%.2f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n);
	return 0;
}
"""

# Run in a fresh interpreter with the tree under test first on sys.path: one round.
ROUND = r"""
import ctypes, json, os, subprocess, sys, time
from dataclasses import replace
from pathlib import Path
from gpuflight.producer.discover import procmaps
from gpuflight.producer.probe.probes import Probes
from gpuflight.producer.settings import CaptureSettings

loop, calls, gap, runtime, driver = sys.argv[1:6]
gap = float(gap)
for library in (driver, runtime):
    ctypes.CDLL(library)
settings = replace(CaptureSettings(), pids=frozenset(), follow_forks=True, hold_on_load=True)

def per_call():
    out = subprocess.run([loop, calls], capture_output=True, text=True, check=True)
    return float(out.stdout)

off = per_call()
t = time.perf_counter(); probes = Probes(settings); start = time.perf_counter() - t
probes.wait_loaded()
found = procmaps.scan_pid(Path("/proc"), os.getpid())
attached = [probes.attach(library) for library in found.libraries.values()
            if library.kind in ("runtime", "driver")]
probe_count = sum(a.probes for a in attached if a is not None)
on = per_call()
tracepoints = sorted(probes._bpf.tracepoints)
t = time.perf_counter(); probes.close(); close = time.perf_counter() - t
time.sleep(gap)
t = time.perf_counter(); again = Probes(settings); after = time.perf_counter() - t
again.wait_loaded()
again.close()
print(json.dumps({"start": start, "close": close, "after": after, "off": off, "on": on,
                  "tracepoints": tracepoints, "probes": probe_count}))
"""


def one_round(tree: Path, cache: Path, loop: Path, calls: int, *, gap: float,
              sim: SimGpu) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree), "GPUFLIGHT_CACHE_DIR": str(cache),
           "GPUFLIGHT_BPF_DIR": str(tree / "bpf")}
    out = subprocess.run([sys.executable, "-c", ROUND, str(loop), str(calls), str(gap),
                          str(sim.runtime()), str(sim.driver)], env=env,
                         capture_output=True, text=True, check=False, cwd=tree)
    if out.returncode != 0:
        sys.exit(f"a round failed in {tree}:\n{out.stderr}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2_000_000)
    parser.add_argument("--gap", type=float, default=0.15)
    parser.add_argument("--baseline", metavar="REV")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (BPF)")
    with tempfile.TemporaryDirectory(prefix="gf-bench-tp-") as tmp:
        work = Path(tmp)
        loop = work / "getppid"
        (work / "getppid.c").write_text(LOOP_C)
        subprocess.run(["cc", "-O2", "-o", str(loop), str(work / "getppid.c")], check=True)
        sim = build_sim(work / "simgpu", runtimes=(13,))
        trees = {"this tree": ROOT}
        if args.baseline:
            trees[args.baseline] = archive(args.baseline, work / "base")
        caches = {name: work / f"cache-{i}" for i, name in enumerate(trees)}
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in trees}
        for name, tree in trees.items():  # fills each cache (the compiled program): not timed
            one_round(tree, caches[name], loop, 1000, gap=0.0, sim=sim)
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                runs[name].append(one_round(tree, caches[name], loop, args.calls,
                                            gap=args.gap, sim=sim))
    print(f"{platform.node()} {platform.machine()} Linux {platform.release()}, "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{args.rounds} rounds, {args.calls:,} getppid calls a loop, the second start "
          f"{args.gap} s after the close\n")
    print("| tree | tracepoints | probes | start | close | start right after | "
          "syscall: off | attached | added |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, results in runs.items():
        def med(key: str, of: list[dict[str, object]] = results) -> float:
            return statistics.median(float(r[key]) for r in of)  # type: ignore[arg-type]
        tracepoints = ", ".join(results[0]["tracepoints"])  # type: ignore[arg-type]
        added = statistics.median(float(r["on"]) - float(r["off"])  # type: ignore[arg-type]
                                  for r in results)
        print(f"| {name} | {tracepoints} | {results[0]['probes']} | "
              f"{med('start') * 1000:.0f} ms | {med('close') * 1000:.0f} ms | "
              f"{med('after') * 1000:.0f} ms | {med('off'):.0f} ns | {med('on'):.0f} ns | "
              f"{added:+.0f} ns |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
