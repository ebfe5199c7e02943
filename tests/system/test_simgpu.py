"""The simulated GPU (gpuflight/simgpu): real PyTorch runs on it, and its counts are right.

The framework workloads (tests/frameworks/*.py) run in the frameworks venv
(scripts/setup-frameworks, or $GF_FRAMEWORKS_PYTHON) on our libcudart.so.13 and
libcuda.so.1 (LD_PRELOAD), without gpuflight; each test asserts against the counts
the simulated driver wrote. Tests of the libraries themselves need no framework.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuflight.demo.build import build_fusion
from gpuflight.simgpu.build import SimGpu, build, read_counts
from tests.conftest import REPO
from tests.support.frameworks import FRAMEWORKS, require_frameworks_python

pytestmark = pytest.mark.simgpu

TIMEOUT_S = 600


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> SimGpu:
    return build(tmp_path_factory.mktemp("simgpu"))


@pytest.fixture
def python() -> Path:
    return require_frameworks_python()


def run_workload(
    python: Path,
    sim: SimGpu,
    tmp: Path,
    script: str,
    *args: str,
    devices: int = 1,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run tests/frameworks/SCRIPT on the simulated GPU; its JSON line and its counts."""
    counts = tmp / f"{script}.counts.json"
    run_env = sim.env(devices=devices, counts=counts)
    run_env.update(env or {})
    run_env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tmp / "inductor"))
    run_env.setdefault("TRITON_CACHE_DIR", str(tmp / "triton"))
    proc = subprocess.run(
        [str(python), str(FRAMEWORKS / f"{script}.py"), *args],
        capture_output=True,
        text=True,
        env=run_env,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stderr[-4000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"{script} printed no result:\n{proc.stdout[-2000:]}"
    processes = [c for c in read_counts(counts) if c["kernels"]]
    assert len(processes) == 1, f"expected one process that used the GPU: {processes}"
    return json.loads(lines[-1]), processes[0]


def launches(counts: dict[str, Any], part: str = "launches") -> dict[str, int]:
    """Kernel name -> count of `part` (launches, captured, replayed), nonzero only."""
    return {k: v[part] for k, v in counts["kernels"].items() if v[part]}


def one(names: Iterator[str] | list[str], what: str) -> str:
    found = list(names)
    assert len(found) == 1, f"{what}: {found}"
    return found[0]


# ---- the libraries alone ----------------------------------------------------------------


def test_exported_functions_have_distinct_bodies(sim: SimGpu) -> None:
    # A probe on one API function must not fire for another: no two share an address.
    for lib in (sim.driver, sim.runtime(13), sim.runtime(12)):
        out = subprocess.run(
            ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        by_addr: dict[str, list[str]] = {}
        for line in out.splitlines():
            addr, kind, name = line.split()
            if kind == "T":
                by_addr.setdefault(addr, []).append(name)
        shared = {a: n for a, n in by_addr.items() if len(n) > 1}
        assert not shared, f"{lib.name}: functions folded together: {shared}"
        assert len(by_addr) > 300


def test_runtime_soname_and_symbol_versions(sim: SimGpu) -> None:
    for major in (13, 12):
        lib = sim.runtime(major)
        dyn = subprocess.run(
            ["readelf", "-d", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        assert f"[libcudart.so.{major}]" in dyn
        syms = subprocess.run(
            ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        assert f"cudaLaunchKernel@@libcudart.so.{major}" in syms
        assert f"__cudaRegisterFatBinary@@libcudart.so.{major}" in syms


def test_get_proc_address_resolves_versions(sim: SimGpu) -> None:
    lib = ctypes.CDLL(str(sim.driver))
    proc = lib.cuGetProcAddress_v2
    proc.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_int),
    ]

    def lookup(name: str, version: int, flags: int = 0) -> tuple[int, int | None, int]:
        fn = ctypes.c_void_p()
        status = ctypes.c_int(-1)
        rc = proc(name.encode(), ctypes.byref(fn), version, flags, ctypes.byref(status))
        return rc, fn.value, status.value

    def addr(symbol: str) -> int:
        value = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
        assert value is not None
        return value

    per_thread = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    assert lookup("cuMemAlloc", 3020) == (0, addr("cuMemAlloc_v2"), 0)
    assert lookup("cuMemAlloc", 13000) == (0, addr("cuMemAlloc_v2"), 0)
    assert lookup("cuMemAlloc", 2000) == (0, addr("cuMemAlloc"), 0)
    assert lookup("cuStreamGetCaptureInfo", 12030) == (0, addr("cuStreamGetCaptureInfo_v3"), 0)
    assert lookup("cuStreamGetCaptureInfo", 11030) == (0, addr("cuStreamGetCaptureInfo_v2"), 0)
    assert lookup("cuGraphInstantiate", 12000) == (0, addr("cuGraphInstantiateWithFlags"), 0)
    assert lookup("cuMemcpyHtoD", 12000, per_thread) == (0, addr("cuMemcpyHtoD_v2_ptds"), 0)
    assert lookup("cuLaunchKernel", 12000, per_thread) == (0, addr("cuLaunchKernel_ptsz"), 0)
    assert lookup("cuLaunchKernel", 12000) == (0, addr("cuLaunchKernel"), 0)
    assert lookup("cuGetProcAddress", 12000) == (0, addr("cuGetProcAddress_v2"), 0)
    not_found = 500  # CUDA_ERROR_NOT_FOUND
    assert lookup("cuNoSuchFunction", 13000) == (not_found, None, 1)  # SYMBOL_NOT_FOUND
    assert lookup("cuMemAlloc", 1000) == (not_found, None, 2)  # VERSION_NOT_SUFFICIENT


def test_driver_moves_bytes_and_counts(sim: SimGpu, tmp_path: Path) -> None:
    # A C-level check through ctypes, in a child process (the counts are written at exit).
    code = f"""
import ctypes
cu = ctypes.CDLL({str(sim.driver)!r})
assert cu.cuInit(0) == 0
ctx = ctypes.c_void_p(); assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 1) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
dptr = ctypes.c_uint64(); assert cu.cuMemAlloc_v2(ctypes.byref(dptr), 4096) == 0
src = (ctypes.c_ubyte * 16)(*range(16)); dst = (ctypes.c_ubyte * 16)()
assert cu.cuMemcpyHtoD_v2(dptr, src, 16) == 0
assert cu.cuMemsetD8_v2(ctypes.c_uint64(dptr.value + 8), 0xAB, 4) == 0
assert cu.cuMemcpyDtoH_v2(dst, dptr, 16) == 0
print(list(dst))
dev = ctypes.c_int(-1)
assert cu.cuPointerGetAttribute(ctypes.byref(dev), 9, dptr) == 0  # DEVICE_ORDINAL
assert dev.value == 1, dev.value
host = ctypes.c_int(0)
assert cu.cuPointerGetAttribute(ctypes.byref(dev), 9, ctypes.c_uint64(ctypes.addressof(host))) == 1
"""
    counts = tmp_path / "c.json"
    proc = subprocess.run(
        ["python3", "-c", code],
        env=sim.env(devices=2, counts=counts, base={}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [*range(8), 0xAB, 0xAB, 0xAB, 0xAB, 12, 13, 14, 15]
    (c,) = read_counts(counts)
    assert c["copies"]["h2d"] == {"count": 1, "bytes": 16}
    assert c["copies"]["d2h"] == {"count": 1, "bytes": 16}
    assert c["memsets"] == {"count": 1, "bytes": 4}
    assert c["allocs"]["count"] == 1
    assert c["devices"] == 2


# ---- PyTorch ------------------------------------------------------------------------------


@pytest.mark.frameworks
def test_torch_imports_only_what_the_runtime_exports(sim: SimGpu, python: Path) -> None:
    torch_lib = (
        Path(
            subprocess.run(
                [str(python), "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
                capture_output=True,
                text=True,
                check=True,
                env=sim.env(),
            ).stdout.strip()
        )
        / "lib"
    )
    needed: set[str] = set()
    for lib in torch_lib.glob("*.so"):
        out = subprocess.run(
            ["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        needed |= {ln.split()[-1].split("@")[0] for ln in out.splitlines() if "@libcudart" in ln}
    ours = subprocess.run(
        ["nm", "-D", "--defined-only", str(sim.runtime(13))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {ln.split()[-1].split("@")[0] for ln in ours.splitlines()}
    assert needed, "torch imports nothing from libcudart?"
    assert needed <= exported, sorted(needed - exported)


@pytest.mark.frameworks
def test_autograd_elementwise_and_reductions(sim: SimGpu, python: Path, tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    out1, c1 = run_workload(python, sim, tmp_path / "1", "autograd")
    _, c2 = run_workload(python, sim, tmp_path / "2", "autograd")
    assert out1["x_grad"] == [64, 128] and out1["w_grad"] == [128]
    runs = launches(c1)
    assert runs == launches(c2), "counts differ between two identical runs"
    assert all(n > 0 for n in runs.values())
    for part in (
        "tanh_kernel_cuda",
        "tanh_backward_kernel_cuda",
        "exp_kernel_cuda",
        "reduce_kernel",
        "MeanOps",
        "FillFunctor",
    ):
        assert any(part in name for name in runs), f"no {part} kernel in {sorted(runs)}"
    # forward and backward: at least one kernel per op of the graph
    assert sum(runs.values()) >= 15
    assert not launches(c1, "captured") and not launches(c1, "replayed")
    # loss.item(): one 4-byte device-to-host copy
    assert c1["copies"]["d2h"] == {"count": 1, "bytes": 4}
    assert c1["launch_calls"]["cuLaunchKernel"] == sum(runs.values())
    assert c1["refused"]["count"] == 0


@pytest.mark.frameworks
def test_cuda_graph_capture_and_replay(sim: SimGpu, python: Path, tmp_path: Path) -> None:
    replays = 7
    out, c = run_workload(python, sim, tmp_path, "cuda_graph", str(replays))
    assert out["replays"] == replays
    captured = launches(c, "captured")
    nodes = sum(captured.values())
    assert nodes >= 3  # mul, add, sin
    assert c["graphs"]["instantiated"] == 1
    assert c["graphs"]["launches"] == [replays]
    assert c["graphs"]["kernel_nodes_replayed"] == [replays * nodes]
    replayed = launches(c, "replayed")
    assert replayed == {k: replays * n for k, n in captured.items()}
    # Captured launches did not run: each captured kernel ran only in the 2 warm-ups.
    ran = launches(c)
    assert {k: ran[k] for k in captured} == dict.fromkeys(captured, 2)
    # fill_ before each replay runs for real (not captured)
    fill = one((k for k in ran if "FillFunctor" in k), "fill kernels")
    assert ran[fill] == replays and fill not in captured


@pytest.mark.frameworks
def test_torch_compile_with_triton_matmul(sim: SimGpu, python: Path, tmp_path: Path) -> None:
    out, c = run_workload(
        python,
        sim,
        tmp_path,
        "compile_mlp",
        env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "fresh-inductor")},
    )
    assert out["shape"] == [64]
    runs = launches(c)
    triton = {k: n for k, n in runs.items() if k.startswith("triton_")}
    assert triton, f"no Triton kernels: {sorted(runs)}"
    # the matmuls ran as Triton templates: autotuning benchmarks, then the two calls
    assert any(k.startswith("triton_tem_fused") and "mm" in k for k in triton), sorted(triton)
    assert any(k.startswith(("triton_poi_", "triton_per_", "triton_red_")) for k in triton)
    # Triton loads its cubins and launches through cuLaunchKernelEx
    assert c["launch_calls"]["cuLaunchKernelEx"] >= sum(triton.values())
    assert c["modules_loaded"] >= len(triton)
    # no cuBLAS: nothing of NVIDIA's asked the driver anything
    assert c["refused"]["count"] == 0


@pytest.mark.frameworks
def test_data_dependent_sizes_come_from_device_bytes(
    sim: SimGpu, python: Path, tmp_path: Path
) -> None:
    out, c = run_workload(python, sim, tmp_path, "data_dependent")
    assert out["roundtrip"] is True
    # The no-op count kernels leave the planted bytes: torch sizes the outputs by them.
    assert out["nonzero"] == [out["planted"], 1]
    assert out["masked"] == [out["planted"]]
    h2d, d2h = c["copies"]["h2d"], c["copies"]["d2h"]
    assert h2d["count"] == 3 and h2d["bytes"] == 6 * 4 + 2 * 4096 * 8
    assert d2h["count"] >= 3  # the round trip, then one count per op
    cub = [k for k in launches(c) if "cub" in k]
    assert cub, "nonzero and masking run CUB kernels"


@pytest.mark.frameworks
def test_two_devices(sim: SimGpu, python: Path, tmp_path: Path) -> None:
    out, c = run_workload(python, sim, tmp_path, "two_devices", devices=2)
    assert out["devices"] == 2
    assert out["copied"] == [float(i) for i in range(16)]
    per_dev = {k: v["per_device"]["launches"] for k, v in c["kernels"].items()}
    fill = one((k for k in per_dev if "FillFunctor" in k), "fill")
    neg = one((k for k in per_dev if "neg_kernel" in k), "neg")
    add = one((k for k in per_dev if "add" in k.lower()), "add")
    assert per_dev[fill] == [0, 1]
    assert per_dev[neg] == [0, 1]
    assert per_dev[add] == [1, 0]
    assert c["copies"]["peer"] == {"count": 1, "bytes": 64}


def _realtime_priority() -> list[str]:
    """The model runs in real time: a host thread the scheduler puts aside for a busy machine's
    other work leaves the simulated GPU idle meanwhile (as a real one would be), and the
    utilization measured then is the machine's, not the model's (0.56 fused with a CPU-bound
    process on each core). A real-time priority gives the workload its core when it runs."""
    return ["chrt", "--fifo", "1"] if os.geteuid() == 0 and shutil.which("chrt") else []


def test_timing_model_runs_the_fusion_demo(sim: SimGpu, tmp_path: Path) -> None:
    # The demo's fusion workload (built as the demo builds it) on the real-time model's own
    # defaults is launch-bound unfused and keeps the GPU busy fused, copies counted
    # (GF_SIM_REPORT: the simulator's own account, all work).
    fusion = build_fusion(tmp_path, sim.lib_dir)
    report = tmp_path / "report.jsonl"
    env = {"PATH": os.environ.get("PATH", ""), "GF_SIM_REPORT": str(report)}
    for mode in ("unfused", "fused"):
        subprocess.run(
            [*_realtime_priority(), str(fusion), "--mode", mode, "--steps", "3000"], env=env,
            check=True, timeout=60,
        )
    unfused, fused = (json.loads(line) for line in report.read_text().splitlines())
    assert unfused["kernels"] == 8 * 3000 and fused["kernels"] == 3000
    assert unfused["utilization"] < 0.8
    assert fused["utilization"] > 0.85
    assert fused["utilization"] > unfused["utilization"] + 0.15


#: The demo's two runs on its device, and what the simulated NVML says of each (in a process
#: of its own: pynvml keeps one NVML library per process).
DEMO_NVML = """
import json, subprocess, sys, time
from pathlib import Path
from gpuflight.demo.build import DemoBuild, build_fusion
from gpuflight.demo.simnvml import SimulatedNvml
from gpuflight.simgpu.build import SimGpu

sim, tmp, prefix = SimGpu(Path(sys.argv[1])), Path(sys.argv[2]), sys.argv[3:]
built = DemoBuild(sim, build_fusion(tmp, sim.lib_dir))
shares = {}
with SimulatedNvml(built, tmp / "nvml") as nvml:
    for mode in ("unfused", "fused"):
        before = nvml.processes()
        subprocess.run([*prefix, *built.command(mode, 5000)], check=True, timeout=60,
                       env=built.env(nvml_dir=tmp / "nvml"))
        shares[mode] = nvml.utilization(nvml.processes() - before, time.time_ns())
print(json.dumps(shares))
"""


def test_the_demos_nvml_finds_the_fused_run_busier(sim: SimGpu, tmp_path: Path) -> None:
    """`gpuflight demo`'s GPU utilization is the simulated NVML's (kernel time, not copies) on
    the demo's device (gpuflight.demo.build.DEVICE): unfused, eight short kernels a step leave
    the GPU idle between launches; fused, one longer kernel keeps it busy."""
    proc = subprocess.run(
        [sys.executable, "-c", DEMO_NVML, str(sim.lib_dir), str(tmp_path),
         *_realtime_priority()],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shares = json.loads(proc.stdout.splitlines()[-1])
    assert shares["unfused"] is not None and shares["fused"] is not None, shares
    # ~0.3 and ~0.6 at a real-time priority on the 2-core VM; a loaded machine lowers both
    # (0.15 and 0.29 at load 6 without one), not their ratio.
    assert shares["unfused"] < 0.55, shares
    assert shares["fused"] > 1.4 * shares["unfused"], shares


def test_simulated_nvml_reports_the_drivers_timeline(sim: SimGpu, tmp_path: Path) -> None:
    """Our libnvidia-ml.so.1 through pynvml and gpuflight's sampler: a process's per-process
    utilisation is the device time of its kernels on the simulated driver's real-time timeline
    (20 kernels of 3 ms), within the rounding of smUtil to a whole percent (P/200 a sample)."""
    period_us = 10_000
    env = {**os.environ, "PYTHONPATH": str(REPO), "GF_SIM_NS_PER_THREAD": "1",
           "GF_SIM_NVML_PERIOD_US": str(period_us), "GF_SIM_NVML_DIR": str(tmp_path),
           "GPUFLIGHT_NVML_LIB": str(sim.nvml)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.workloads.nvml_server", "nvml",
         "--runtime", str(sim.runtime(12))],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["truth_ns"] == pytest.approx(20 * 3.0e6, rel=1e-3)
    assert abs(got["nvml_ns"] - got["truth_ns"]) <= got["windows"] * period_us * 1000 / 200
    assert got["periods_ns"] == [period_us * 1000]
    # The windows are where the work was: CLOCK_REALTIME µs, as NVML's timestamps are.
    assert got["started_ns"] - period_us * 1000 <= got["first_start_ns"]
    assert got["last_end_ns"] <= got["ended_ns"] + period_us * 1000
    assert (got["name"], got["uuid"]) == ("NVIDIA H100 80GB HBM3",
                                          "GPU-5e1f0000-0000-4000-8000-000000000000")
    assert got["memory_total_bytes"] == 80 * 10**9
    assert got["power_w"] is None and got["temperature_c"] is None  # not supported
    assert got["processes"] == [got["pid"]]
    assert (tmp_path / f"activity.{got['pid']}").is_file()


def test_simulated_nvml_without_activity_logs(sim: SimGpu, tmp_path: Path) -> None:
    """No GF_SIM_NVML_DIR: the GPU is there, idle; nothing is logged in virtual-time mode."""
    code = (
        "import json; from gpuflight.producer.nvml import NvmlSampler\n"
        "s = NvmlSampler(); (g,) = s.sample()\n"
        "print(json.dumps([g.name, g.utilization_gpu_pct, g.processes]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUFLIGHT_NVML_LIB": str(sim.nvml)}
    env.pop("GF_SIM_NVML_DIR", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == ["NVIDIA H100 80GB HBM3", 0, []]
