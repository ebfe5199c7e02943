"""Coverage on a real GPU: gpuflight's launch counts against torch.profiler's (CUPTI).

    sudo scripts/gpu-check [--python PY] [--iters N] [--case NAME ...]

Needs an NVIDIA GPU and a Python with CUDA PyTorch (PY, default `python3` on PATH).
Each case runs twice in fresh processes with the same code: once under
`gpuflight trace --output`, once under torch.profiler (CUPTI). Both count only a
measured region after warm-up (compilation, cuBLAS handles, graph capture), marked by
the workload with wall-clock timestamps around synchronized loops:

    eager    elementwise ops and a reduction, PyTorch eager (libcudart launches)
    compile  the same under torch.compile (Triton kernels: cuLaunchKernel(Ex) on libcuda)
    cublas   float32 matmuls (cuBLAS kernels, launched by cuBLAS's private runtime)
    graph    a CUDA graph of elementwise ops and a matmul, captured, then replayed

Kernels executed by gpuflight's count: launches not captured into a graph, plus each
graph launch's kernel nodes. CUPTI's: kernel activity records. Coverage is the ratio;
below 99% the check fails (exit 1). No GPU or no CUDA PyTorch: one line, exit 3.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CASES = ("eager", "compile", "cublas", "graph")
MIN_COVERAGE = 0.99

# The workload, run by the user's Python (the one with torch): prints the region's
# wall-clock bounds, or with --profile the CUPTI kernel count of the region.
WORKLOAD = textwrap.dedent('''
    import json, sys, time
    import torch

    case, iters, profile = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "profile"
    dev = torch.device("cuda")
    x = torch.randn(1 << 20, device=dev)
    a = torch.randn(1024, 1024, device=dev)
    b = torch.randn(1024, 1024, device=dev)

    def eager():
        return ((x * 2 + 1).relu() * x).sum()

    step = eager
    if case == "compile":
        step = torch.compile(lambda: ((x * 2 + 1).relu() * x).sin(), dynamic=False)
    elif case == "cublas":
        step = lambda: a @ b
    elif case == "graph":
        static = torch.cuda.Stream()
        static.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(static):
            for _ in range(3):
                ((x * 2).sin(), a @ b)
        torch.cuda.current_stream().wait_stream(static)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = (x * 2).sin() + 1
            z = a @ b
        step = g.replay
    for _ in range(3):
        step()
    torch.cuda.synchronize()

    def region():
        for _ in range(iters):
            step()
        torch.cuda.synchronize()

    if profile:
        from torch.profiler import ProfilerActivity, profile as prof
        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            region()
        out = sys.argv[4]
        p.export_chrome_trace(out)
        trace = json.load(open(out))
        kernels = sum(1 for e in trace.get("traceEvents", []) if e.get("cat") == "kernel")
        print(json.dumps({"cupti_kernels": kernels}))
    else:
        start = time.time_ns()
        region()
        print(json.dumps({"start_ns": start, "end_ns": time.time_ns()}))
''')


class CheckError(Exception):
    """A check that cannot run here: one line, exit 3."""


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver with a device: its device files exist."""
    return Path("/dev/nvidiactl").exists() and any(Path("/dev").glob("nvidia[0-9]*"))


def preflight(python: str) -> None:
    if not has_nvidia_gpu():
        raise CheckError("no NVIDIA GPU on this machine (no /dev/nvidia*): nothing to check")
    if os.geteuid() != 0:
        raise CheckError("run as root (gpuflight attaches uprobes): sudo scripts/gpu-check")
    probe = subprocess.run(
        [python, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 4)"],
        capture_output=True, text=True, check=False,
    )
    if probe.returncode == 4:
        raise CheckError(f"no CUDA GPU visible to PyTorch ({python}): nothing to check")
    if probe.returncode != 0:
        raise CheckError(f"{python} cannot import torch: install CUDA PyTorch or pass --python")


def last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            value: dict[str, Any] = json.loads(line)
            return value
    raise RuntimeError(f"the workload printed no result: {text[-500:]}")


def run_traced(python: str, workload: Path, case: str, iters: int, out: Path) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuflight", "trace", "--output", str(out), "--",
         python, str(workload), case, str(iters), "trace"],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{case} under gpuflight failed: {proc.stderr.strip()[-500:]}")
    bounds = last_json(proc.stdout)
    lo, hi = bounds["start_ns"], bounds["end_ns"]
    counts = {"runtime": 0, "driver": 0, "captured": 0, "graph_launches": 0, "graph_kernels": 0}
    with out.open() as f:
        for line in f:
            event = json.loads(line)
            if not lo <= event["ts_ns"] <= hi:
                continue
            if event["type"] == "launch":
                if event.get("captured"):
                    counts["captured"] += 1
                else:
                    counts[event["layer"]] += 1
            elif event["type"] == "graph_launch":
                counts["graph_launches"] += 1
                counts["graph_kernels"] += event.get("kernel_nodes") or 0
    dropped = proc.stderr.rsplit("events dropped:", 1)[-1].split()[0].replace(",", "")
    counts["dropped"] = int(dropped) if dropped.isdigit() else -1
    return counts


def run_profiled(python: str, workload: Path, case: str, iters: int, out: Path) -> int:
    proc = subprocess.run(
        [python, str(workload), case, str(iters), "profile", str(out)],
        capture_output=True, text=True, check=False, timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{case} under torch.profiler failed: {proc.stderr.strip()[-500:]}")
    return int(last_json(proc.stdout)["cupti_kernels"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default="python3", help="a Python with CUDA PyTorch")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--case", action="append", choices=CASES)
    args = parser.parse_args(argv)
    try:
        preflight(args.python)
    except CheckError as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 3
    failed = False
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        workload = Path(tmp) / "workload.py"
        workload.write_text(WORKLOAD)
        for case in args.case or CASES:
            ours = run_traced(args.python, workload, case, args.iters, Path(tmp) / f"{case}.jsonl")
            cupti = run_profiled(args.python, workload, case, args.iters,
                                 Path(tmp) / f"{case}.trace.json")
            executed = ours["runtime"] + ours["driver"] + ours["graph_kernels"]
            coverage = executed / cupti if cupti else float("nan")
            failed |= not coverage >= MIN_COVERAGE or ours["dropped"] != 0
            rows.append((case, ours, executed, cupti, coverage))
    print(f"{'case':8} {'runtime':>8} {'driver':>8} {'graphs':>7} {'in graphs':>9} "
          f"{'gpuflight':>9} {'CUPTI':>8} {'coverage':>9} {'dropped':>7}")
    for case, ours, executed, cupti, coverage in rows:
        print(f"{case:8} {ours['runtime']:>8} {ours['driver']:>8} {ours['graph_launches']:>7} "
              f"{ours['graph_kernels']:>9} {executed:>9} {cupti:>8} {coverage:>8.1%} "
              f"{ours['dropped']:>7}")
    if failed:
        print(f"gpu-check: coverage below {MIN_COVERAGE:.0%} or events dropped: a bug to chase",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
