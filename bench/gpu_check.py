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

The conformance suite's workloads (tests/frameworks/*.py, the ones tests/system/test_conformance.py
traces on the simulated GPU) run too, each as its main() twice in one process: the first
call is the warm-up (compilation, autotuning, allocator), the second the measured region:

    autograd  cuda_graph  compile_mlp  data_dependent  two_devices (needs two GPUs)

Kernels executed by gpuflight's count: launches not captured into a graph, plus each
graph launch's kernel nodes. CUPTI's: kernel activity records. Coverage is the ratio;
below 99% the check fails (exit 1). Per kernel name, the launches that ran (not in graphs)
are held against CUPTI's records of the same name ("names" column: how many names
disagree; graph replays are held only in total, since graph launches carry no names).
No GPU or no CUDA PyTorch: one line, exit 3. --profile-only runs the CUPTI side alone
(a machine without bcc: checks that the workloads run and what CUPTI names).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.conformance import differences, read_events, traced_launches  # noqa: E402

FRAMEWORKS = REPO / "tests" / "frameworks"
#: The conformance suite's workloads: name -> (arguments, GPUs needed).
SUITE: dict[str, tuple[tuple[str, ...], int]] = {
    "autograd": ((), 1),
    "cuda_graph": (("7",), 1),
    "compile_mlp": (("max-autotune",), 1),
    "data_dependent": ((), 1),
    "two_devices": ((), 2),
}
CASES = ("eager", "compile", "cublas", "graph", *SUITE)
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
        names = {}
        for e in trace.get("traceEvents", []):
            if e.get("cat") == "kernel":
                names[e["name"]] = names.get(e["name"], 0) + 1
        print(json.dumps({"cupti_kernels": names}))
    else:
        start = time.time_ns()
        region()
        print(json.dumps({"start_ns": start, "end_ns": time.time_ns()}))
''')

# A workload of the conformance suite, its main() run twice: a warm-up, then the region.
SUITE_RUNNER = textwrap.dedent('''
    import json, os, runpy, sys, time
    import torch

    path, mode, out, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    sys.argv = [path, *args]
    main = runpy.run_path(path, run_name="gpu_check_workload")["main"]
    main()
    torch.cuda.synchronize()

    def region():
        main()
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)

    if mode == "profile":
        from torch.profiler import ProfilerActivity, profile as prof
        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            region()
        p.export_chrome_trace(out)
        names = {}
        for e in json.load(open(out)).get("traceEvents", []):
            if e.get("cat") == "kernel":
                names[e["name"]] = names.get(e["name"], 0) + 1
        print(json.dumps({"cupti_kernels": names}))
    else:
        start = time.time_ns()
        region()
        print(json.dumps({"start_ns": start, "end_ns": time.time_ns()}))
    sys.stdout.flush()
    try:  # the simulated GPU's counts (the tests): written at exit, which os._exit skips
        import ctypes
        ctypes.CDLL("libcuda.so.1").gfsim_flush_counts()
    except (OSError, AttributeError):  # a real driver has no such function
        pass
    os._exit(0)  # torch's autograd threads can abort an ordinary exit (see autograd.py)
''')


class CheckError(Exception):
    """A check that cannot run here: one line, exit 3."""


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver with a device: its device files exist."""
    return Path("/dev/nvidiactl").exists() and any(Path("/dev").glob("nvidia[0-9]*"))


def preflight(python: str, trace: bool = True) -> int:
    """Checks that the machine can run the check; the number of GPUs torch sees."""
    if not has_nvidia_gpu():
        raise CheckError("no NVIDIA GPU on this machine (no /dev/nvidia*): nothing to check")
    if trace and os.geteuid() != 0:
        raise CheckError("run as root (gpuflight attaches uprobes): sudo scripts/gpu-check")
    probe = subprocess.run(
        [python, "-c", "import torch, sys; n = torch.cuda.device_count(); print(n); "
         "sys.exit(0 if torch.cuda.is_available() else 4)"],
        capture_output=True, text=True, check=False,
    )
    if probe.returncode == 4:
        raise CheckError(f"no CUDA GPU visible to PyTorch ({python}): nothing to check")
    if probe.returncode != 0:
        raise CheckError(f"{python} cannot import torch: install CUDA PyTorch or pass --python")
    return int(probe.stdout.split()[-1])


def last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            value: dict[str, Any] = json.loads(line)
            return value
    raise RuntimeError(f"the workload printed no result: {text[-500:]}")


def case_argv(tmp: Path, case: str, iters: int, mode: str, out: Path) -> list[str]:
    """The workload's command line (after the Python) for a case, in mode trace or profile."""
    if case in SUITE:
        runner = tmp / "suite_runner.py"
        runner.write_text(SUITE_RUNNER)
        return [str(runner), str(FRAMEWORKS / f"{case}.py"), mode, str(out), *SUITE[case][0]]
    workload = tmp / "workload.py"
    workload.write_text(WORKLOAD)
    return [str(workload), case, str(iters), mode, str(out)]


def run_traced(python: str, argv: list[str], case: str, out: Path,
               workload_env: dict[str, str] | None = None) -> dict[str, Any]:
    """gpuflight's counts of the region: by layer, graphs, and per kernel name.
    `workload_env`: variables for the workload only (the tests' simulated GPU)."""
    prefix = ["env", *(f"{k}={v}" for k, v in workload_env.items())] if workload_env else []
    proc = subprocess.run(
        [sys.executable, "-m", "gpuflight", "trace", "--output", str(out), "--", *prefix,
         python, *argv],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=1800,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{case} under gpuflight failed: {proc.stderr.strip()[-500:]}")
    bounds = last_json(proc.stdout)
    t = traced_launches(read_events(out), window=(bounds["start_ns"], bounds["end_ns"]))
    dropped = proc.stderr.rsplit("events dropped:", 1)[-1].split()[0].replace(",", "")
    return {
        "runtime": t.by_layer["runtime"],
        "driver": t.by_layer["driver"],
        "captured": sum(t.captured.values()),
        "graph_launches": t.graph_launches,
        "graph_kernels": t.graph_kernel_nodes,
        "names": t.launches,
        "unnamed": t.unnamed,
        "dropped": int(dropped) if dropped.isdigit() else -1,
    }


def run_profiled(python: str, argv: list[str], case: str) -> Counter[str]:
    """CUPTI's kernel records of the region, per kernel name."""
    proc = subprocess.run(
        [python, *argv], capture_output=True, text=True, check=False, timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{case} under torch.profiler failed: {proc.stderr.strip()[-500:]}")
    return Counter(last_json(proc.stdout)["cupti_kernels"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default="python3", help="a Python with CUDA PyTorch")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--case", action="append", choices=CASES)
    parser.add_argument("--profile-only", action="store_true",
                        help="only the torch.profiler side (no gpuflight: a machine without bcc)")
    args = parser.parse_args(argv)
    try:
        gpus = preflight(args.python, trace=not args.profile_only)
    except CheckError as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 3
    cases = [c for c in args.case or CASES if c not in SUITE or SUITE[c][1] <= gpus]
    for skipped in sorted(set(args.case or CASES) - set(cases)):
        print(f"gpu-check: {skipped} skipped: it needs {SUITE[skipped][1]} GPUs, "
              f"{gpus} here", file=sys.stderr)
    if args.profile_only:
        return profile_only(args.python, cases, args.iters)
    failed = False
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp_name:
        tmp = Path(tmp_name)
        for case in cases:
            ours = run_traced(args.python, case_argv(tmp, case, args.iters, "trace",
                                                     tmp / f"{case}.jsonl"), case,
                              tmp / f"{case}.jsonl")
            cupti_names = run_profiled(args.python, case_argv(
                tmp, case, args.iters, "profile", tmp / f"{case}.trace.json"), case)
            cupti = sum(cupti_names.values())
            executed = ours["runtime"] + ours["driver"] + ours["graph_kernels"]
            coverage = executed / cupti if cupti else float("nan")
            # per name: without graphs, exact; with graphs, only what ran outside them
            wrong = differences(ours["names"], cupti_names) if not ours["graph_launches"] else {
                n: v for n, v in differences(ours["names"], cupti_names).items() if v[0] > v[1]}
            failed |= (not coverage >= MIN_COVERAGE or ours["dropped"] != 0
                       or ours["unnamed"] != 0)
            rows.append((case, ours, executed, cupti, coverage, wrong))
    print(f"{'case':14} {'runtime':>8} {'driver':>8} {'graphs':>7} {'in graphs':>9} "
          f"{'gpuflight':>9} {'CUPTI':>8} {'coverage':>9} {'names':>6} {'dropped':>7}")
    for case, ours, executed, cupti, coverage, wrong in rows:
        print(f"{case:14} {ours['runtime']:>8} {ours['driver']:>8} {ours['graph_launches']:>7} "
              f"{ours['graph_kernels']:>9} {executed:>9} {cupti:>8} {coverage:>8.1%} "
              f"{len(wrong):>6} {ours['dropped']:>7}")
    for case, _ours, _executed, _cupti, _coverage, wrong in rows:
        for name, (n_ours, n_cupti) in list(wrong.items())[:10]:
            print(f"  {case}: {n_ours} by gpuflight, {n_cupti} by CUPTI: {name[:160]}")
    if failed:
        print(f"gpu-check: coverage below {MIN_COVERAGE:.0%}, unnamed launches or events "
              "dropped: a bug to chase", file=sys.stderr)
    return 1 if failed else 0


def profile_only(python: str, cases: list[str], iters: int) -> int:
    """The CUPTI side alone: each case's kernels by name (no gpuflight)."""
    failed = False
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp_name:
        tmp = Path(tmp_name)
        for case in cases:
            try:
                names = run_profiled(python, case_argv(
                    tmp, case, iters, "profile", tmp / f"{case}.trace.json"), case)
            except RuntimeError as exc:
                print(f"{case:14} FAILED: {exc}")
                failed = True
                continue
            print(f"{case:14} {sum(names.values()):>8} kernels, {len(names)} names")
            for name, n in names.most_common(8):
                print(f"  {n:>8}  {name[:150]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
