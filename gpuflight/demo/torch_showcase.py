"""`gpuflight demo` on real PyTorch: eager (many small launches) vs torch.compile (fused).

The same computation (gpuflight/demo/torch_fusion.py: eight elementwise ops per step) runs
twice under `gpuflight trace --output`, eager then compiled, by a Python that has torch,
on the simulated GPU (gpuflight/simgpu: our libcudart and libcuda, on the real-time timing
model, so that the GPU's busy share means something). Only the measured region counts: the
workload writes its wall-clock bounds after start-up, compilation and warm-up, and the table
is made of the trace's events inside them. The table is the C showcase's (showcase.py), but
for its GPU utilization: the simulator's own account of the region (GF_SIM_REPORT, restarted
at the region: gfsim_timeline_restart), not NVML's as the C showcase's, since the region lasts
tens of milliseconds, a few of NVML's sampling periods, the first and last shared with the
warm-up and the exit.

Torch is found as: `--python PY` (must import torch), else $GF_FRAMEWORKS_PYTHON, else the
frameworks venv (.cache/frameworks/venv, made by scripts/setup-frameworks); without one the
demo is the C showcase.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gpuflight.demo.showcase import comparison
from gpuflight.producer import trace
from gpuflight.producer.contract.errors import SetupError, UsageError
from gpuflight.simgpu.build import SimGpu, build
from gpuflight.simgpu.cbuild import BuildError

REPO = Path(__file__).resolve().parent.parent.parent
WORKLOAD = Path(__file__).resolve().parent / "torch_fusion.py"
MODES = ("eager", "compile")
LABELS = ("eager", "torch.compile")
DEFAULT_STEPS = 2000
#: The simulated GPU's real-time model: what a launch costs the CPU (ns).
LAUNCH_NS = 4000


def frameworks_python() -> Path | None:
    """$GF_FRAMEWORKS_PYTHON, else the frameworks venv's python, if there."""
    env = os.environ.get("GF_FRAMEWORKS_PYTHON")
    path = Path(env) if env else REPO / ".cache" / "frameworks" / "venv" / "bin" / "python"
    return path if path.is_file() else None


def torch_info(python: Path) -> dict[str, Any] | None:
    """Torch's CUDA version and the site-packages of `python`, or None if it has no torch."""
    code = ("import json, site, torch; print(json.dumps({'cuda': torch.version.cuda, "
            "'site': site.getsitepackages()}))")
    try:
        proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    info: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return info if info.get("cuda") else None


@contextmanager
def _headers_of(info: Mapping[str, Any], major: int) -> Iterator[None]:
    """Point the simulated GPU's build at the CUDA headers of torch's own wheels."""
    var = f"GF_SIM_CUDA{major}_INCLUDE"
    found = None
    if var not in os.environ:
        for site in info.get("site", []):
            for sub in ("nvidia/cu13/include", "nvidia/cuda_runtime/include"):
                inc = Path(site) / sub
                if (inc / "cuda_runtime_api.h").is_file():
                    found = found or str(inc)
    if found:
        os.environ[var] = found
    try:
        yield
    finally:
        if found:
            del os.environ[var]


def build_sim(info: Mapping[str, Any], cache_dir: Path) -> tuple[SimGpu, int]:
    major = int(str(info["cuda"]).split(".")[0])
    if major not in (12, 13):
        raise SetupError(f"torch is built for CUDA {info['cuda']}: the simulated GPU has "
                         "runtimes for CUDA 12 and 13 only")
    with _headers_of(info, major):
        try:
            return build(cache_dir, runtimes=(major,)), major
        except BuildError as exc:
            raise SetupError(f"cannot build the simulated GPU: {exc}") from exc


def window_summary(events: list[dict[str, Any]], lo: int, hi: int) -> dict[str, Any]:
    """The showcase's figures (showcase.comparison's keys) from the events in [lo, hi] ns."""
    wall_s = (hi - lo) / 1e9
    grids: Counter[tuple[int, ...]] = Counter()
    launches = copy_bytes = blocked_ns = 0
    for e in events:
        if not lo <= e["ts_ns"] <= hi:
            continue
        kind = e["type"]
        if kind == "launch" and not e.get("captured"):
            launches += 1
            grids[tuple(e["grid"])] += 1
        elif kind == "graph_launch":
            launches += e.get("kernel_nodes") or 0
        elif kind == "memcpy":
            copy_bytes += e["bytes"]
            if not e.get("async"):
                blocked_ns += e.get("duration_ns") or 0
        elif kind == "sync":
            blocked_ns += e.get("duration_ns") or 0
    blocks = sum(g[0] * g[1] * g[2] * n for g, n in grids.items())
    top = grids.most_common(1)[0][0] if grids else None
    return {
        "wall_s": wall_s,
        "launches": launches,
        "launch_rate": launches / wall_s if wall_s else 0.0,
        "mean_grid_blocks": blocks / sum(grids.values()) if grids else 0.0,
        "top_grid": "({},{},{})".format(*top) if top else "-",
        "copy_bytes": copy_bytes,
        "blocked_share": blocked_ns / 1e9 / wall_s if wall_s else 0.0,
    }


def _utilization(report: Path) -> float | None:
    try:
        return float(json.loads(report.read_text().splitlines()[-1])["utilization"])
    except (OSError, IndexError, KeyError, ValueError):
        return None


def measure(python: Path, sim: SimGpu, major: int, tmp: Path, *, mode: str,
            steps: int) -> dict[str, Any]:
    """One traced run of the workload in `mode`; the region's figures."""
    result, report, events = tmp / f"{mode}.json", tmp / f"{mode}.report", tmp / f"{mode}.jsonl"
    env = sim.env(runtime=major, base={})
    env.update(GF_SIM_REPORT=str(report), GF_SIM_LAUNCH_NS=str(LAUNCH_NS),
               TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"), TRITON_CACHE_DIR=str(tmp / "triton"))
    argv = ["env", "-u", "PYTHONPATH", *(f"{k}={v}" for k, v in env.items()),
            str(python), str(WORKLOAD), mode, str(steps), str(result)]
    traced = trace.run(argv, output=events, print_summary=False)
    if traced.exit_code != 0:
        raise SetupError(f"the {mode} PyTorch workload failed (exit {traced.exit_code})")
    bounds = json.loads(result.read_text())
    with events.open("rb") as f:
        decoded = [orjson.loads(line) for line in f if line.strip()]
    offset = traced.clock_offset_ns  # the events' ts_ns are wall clock, by this offset
    data = window_summary(decoded, bounds["start_monotonic_ns"] + offset,
                          bounds["end_monotonic_ns"] + offset)
    data["gpu_util"] = _utilization(report)
    return data


@dataclass(frozen=True)
class Prepared:
    """A Python with CUDA torch and the simulated GPU built for its CUDA version."""

    python: Path
    info: dict[str, Any]
    sim: SimGpu
    major: int


def prepare(python: Path) -> Prepared:
    """Check that `python` has CUDA torch and build the simulated GPU for it (UsageError,
    SetupError: the demo cannot be the PyTorch one)."""
    info = torch_info(python)
    if info is None:
        raise UsageError(f"{python} cannot import a CUDA build of torch")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuflight"
    sim, major = build_sim(info, cache / "simgpu")
    return Prepared(python, info, sim, major)


def run(prepared: Prepared, steps: int | None = None) -> int:
    python, info, sim, major = prepared.python, prepared.info, prepared.sim, prepared.major
    steps = steps or DEFAULT_STEPS
    print(f"gpuflight demo: the same PyTorch computation, eager then torch.compile, on a "
          f"simulated GPU ({python}, torch for CUDA {info['cuda']}); start-up and compilation "
          "take a while under trace", file=sys.stderr)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuflight-demo-torch-") as tmp:
        for mode, label in zip(MODES, LABELS, strict=True):
            results[label] = measure(python, sim, major, Path(tmp), mode=mode, steps=steps)
    print(comparison(results, modes=LABELS, title="PyTorch, one step = 8 elementwise ops"))
    return 0
