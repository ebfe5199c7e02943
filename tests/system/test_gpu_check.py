"""scripts/gpu-check on a machine without a GPU: one clear line, exit 3, nothing else.

(On a GPU machine it is run by hand; its figures go in the release notes.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from gpuflight.simgpu.build import build, read_counts
from tests.conftest import REPO, require
from tests.support.conformance import demangle_all
from tests.support.frameworks import frameworks_python

pytestmark = [pytest.mark.bpf, pytest.mark.frameworks, pytest.mark.simgpu]


def load_gpu_check() -> ModuleType:
    """bench/gpu_check.py as a module (bench/ is a directory of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_traced_side_counts_the_region_per_kernel_name(tmp_path: Path) -> None:
    """gpu-check's gpuflight half, on the simulated GPU (no GPU and no CUPTI needed): the
    suite runner runs autograd's main() twice, and only the second, the region, is counted."""
    python = frameworks_python()
    require(None if python else "no frameworks venv (run scripts/setup-frameworks)")
    assert python is not None
    gpu_check = load_gpu_check()
    sim = build(tmp_path / "sim")
    counts = tmp_path / "counts.json"
    argv = gpu_check.case_argv(tmp_path, "autograd", 0, "trace", tmp_path / "unused")
    ours = gpu_check.run_traced(str(python), argv, "autograd", tmp_path / "out.jsonl",
                                workload_env=sim.env(counts=counts, base={}))
    assert ours["dropped"] == 0 and ours["unnamed"] == 0
    (process,) = [c for c in read_counts(counts) if c["kernels"]]
    names = demangle_all(process["kernels"])
    both_calls = {names[k]: v["launches"] for k, v in process["kernels"].items()}
    # main() launches the same kernels each call: the region holds exactly half of them
    assert all(n % 2 == 0 for n in both_calls.values()), both_calls
    assert dict(ours["names"]) == {k: n // 2 for k, n in both_calls.items() if n}
    assert ours["runtime"] == sum(both_calls.values()) // 2 and ours["driver"] == 0
