"""The conformance suite: real PyTorch under `gpuflight trace`, exact against the GPU's own counts.

Each workload of tests/frameworks runs once (a module-scoped fixture, shared by the
assertions on it) as

    gpuflight trace --output FILE -- env <simulated GPU> <frameworks python> WORKLOAD.py

on the simulated GPU (gpuflight/simgpu: our libcudart.so.13 and libcuda.so.1, which count
every launch per kernel name and write the counts at exit). The trace's --output is held
against those counts, per kernel name and in total:

- launches that ran = what the simulated driver ran, per (demangled) kernel name;
- launches captured into a graph are flagged `captured`, per name, as the driver recorded them;
- graph launches and the kernel nodes they ran = the driver's replays;
- every launch is named, with the name the kernel was registered or looked up with;
- nothing counted twice: launch events (runtime + driver layer) = the driver's launch calls
  (a runtime launch reaches cuLaunchKernel too, and is recorded once);
- the summary lists the library files probed, once each, with their probe counts.

Devices: every event carries its thread's current device (gf_event.device, kept by the probes on
cudaSetDevice and the driver's context calls), so the two-device workload is held per kernel
name per device against the simulated driver's per-device counts. Needs root and bcc (skips
locally without, fails under CI=true) and the frameworks venv (scripts/setup-frameworks). A
traced torch start-up takes a minute or more on a small machine: hence one traced run per
workload and generous timeouts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuflight.simgpu.build import SimGpu, build, read_counts
from tests.conftest import REPO
from tests.support.conformance import (
    TracedLaunches,
    demangle_all,
    differences,
    on_device,
    read_events,
    traced_launches,
)
from tests.support.frameworks import FRAMEWORKS, require_frameworks_python

pytestmark = [pytest.mark.bpf, pytest.mark.frameworks, pytest.mark.simgpu]

TRACE_TIMEOUT_S = 1800


@dataclass
class Run:
    """One workload traced: its JSON line, the trace's events, the driver's counts, stderr."""

    result: dict[str, Any]
    events: list[dict[str, Any]]
    counts: list[dict[str, Any]]
    stderr: str
    sim: SimGpu


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> SimGpu:
    return build(tmp_path_factory.mktemp("simgpu"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache folder for the module's traces, as a user's runs share theirs: the first
    compiles the BPF program and classifies PyTorch's files; those after load the program and
    let the dlopens of files known to hold nothing probed through unheld (the quiet loads),
    and are held to the same exact counts."""
    return tmp_path_factory.mktemp("gpuflight-cache")


@pytest.fixture(scope="module")
def python() -> Path:
    return require_frameworks_python()


def trace_workload(
    python: Path, sim: SimGpu, cache: Path, tmp: Path, script: str, *args: str, devices: int = 1
) -> Run:
    """`gpuflight trace --output` of tests/frameworks/SCRIPT on the simulated GPU."""
    counts = tmp / "counts.json"
    out = tmp / "events.jsonl"
    sim_env = sim.env(devices=devices, counts=counts, base={})
    sim_env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor")  # fresh: real compiles
    sim_env["TRITON_CACHE_DIR"] = str(tmp / "triton")
    command = ["env", "-u", "PYTHONPATH", *(f"{k}={v}" for k, v in sim_env.items()),
               str(python), str(FRAMEWORKS / f"{script}.py"), *args]
    proc = subprocess.run(
        [sys.executable, "-m", "gpuflight", "trace", "--output", str(out), "--", *command],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "GPUFLIGHT_CACHE_DIR": str(cache)},
        timeout=TRACE_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"{script} under trace failed:\n{proc.stderr[-4000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"{script} printed no result:\n{proc.stdout[-2000:]}"
    return Run(json.loads(lines[-1]), read_events(out), read_counts(counts), proc.stderr, sim)


@pytest.fixture(scope="module")
def autograd(python: Path, sim: SimGpu, cache: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Run:
    return trace_workload(python, sim, cache, tmp_path_factory.mktemp("autograd"), "autograd")


@pytest.fixture(scope="module")
def cuda_graph(python: Path, sim: SimGpu, cache: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Run:
    return trace_workload(python, sim, cache, tmp_path_factory.mktemp("graph"), "cuda_graph", "7")


@pytest.fixture(scope="module")
def compiled(python: Path, sim: SimGpu, cache: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Run:
    return trace_workload(python, sim, cache, tmp_path_factory.mktemp("compile"), "compile_mlp")


@pytest.fixture(scope="module")
def data_dependent(python: Path, sim: SimGpu, cache: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Run:
    return trace_workload(python, sim, cache, tmp_path_factory.mktemp("data"), "data_dependent")


@pytest.fixture(scope="module")
def two_devices(python: Path, sim: SimGpu, cache: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Run:
    return trace_workload(python, sim, cache, tmp_path_factory.mktemp("two"), "two_devices",
                          devices=2)


# ---- the exact comparison, the same for every workload ----------------------------------------


def gpu_processes(run: Run) -> list[dict[str, Any]]:
    """The driver's counts of each process that launched a kernel."""
    found = [c for c in run.counts if c["kernels"]]
    assert found, "no process launched anything on the simulated GPU"
    return found


def assert_conforms(run: Run) -> list[TracedLaunches]:
    """Every launch once, by its registered name, as the simulated driver counted it."""
    traced = []
    pids = set()
    for c in gpu_processes(run):
        pids.add(c["pid"])
        kernels: dict[str, dict[str, Any]] = c["kernels"]
        names = demangle_all(kernels)
        ran = {names[k]: v["launches"] for k, v in kernels.items()}
        captured = {names[k]: v["captured"] for k, v in kernels.items()}
        replayed = sum(v["replayed"] for v in kernels.values())
        t = traced_launches(run.events, pid=c["pid"])
        # every launch named, with the name it was registered / looked up with
        assert t.unnamed == 0, f"{t.unnamed} launches without a name"
        # per kernel name: launches that ran, and launches recorded into graphs
        assert differences(t.launches, ran) == {}, "launches per kernel (ours, driver's)"
        assert differences(t.captured, captured) == {}, "captured per kernel (ours, driver's)"
        # in total
        assert sum(t.launches.values()) == sum(ran.values())
        assert sum(t.captured.values()) == sum(captured.values())
        # nothing twice across runtime and driver: one launch event per launch call the
        # driver served (the runtime's cudaLaunchKernel reaches cuLaunchKernel too)
        assert sum(t.by_layer.values()) == sum(c["launch_calls"].values()), t.by_layer
        # graphs: launches, and the kernel nodes they ran = the kernels the driver replayed
        assert t.graph_launches == sum(c["graphs"]["launches"])
        assert t.graph_kernel_nodes == replayed == sum(c["graphs"]["kernel_nodes_replayed"])
        traced.append(t)
    # and no launch from a process the driver did not serve
    others = {e["pid"] for e in run.events if e["type"] == "launch"} - pids
    assert not others, f"launches from processes the simulated GPU never saw: {others}"
    return traced


def probed_files(stderr: str) -> dict[str, list[tuple[str, int]]]:
    """The summary's "probed library files" list: path -> [(kind, probes), ...]."""
    _, _, rest = stderr.partition("probed library files:")
    assert rest, f"the summary lists no probed files:\n{stderr[-3000:]}"
    files: dict[str, list[tuple[str, int]]] = {}
    for line in rest.splitlines()[1:]:
        m = re.match(r"^\s+([\d,]+)\s+(\w+)\s+(/\S+)(?:   # .*)?$", line)
        if not m:
            break
        files.setdefault(m.group(3), []).append((m.group(2), int(m.group(1).replace(",", ""))))
    return files


# ---- the workloads ------------------------------------------------------------------------------


def test_autograd_forward_and_backward(autograd: Run) -> None:
    assert autograd.result["x_grad"] == [64, 128]
    (t,) = assert_conforms(autograd)
    assert sum(t.launches.values()) >= 15
    assert set(t.by_layer) == {"runtime"}  # eager torch: libcudart launches only
    assert not t.captured and t.graph_launches == 0


def test_summary_lists_each_probed_file_once(autograd: Run) -> None:
    files = probed_files(autograd.stderr)
    assert all(len(entries) == 1 for entries in files.values()), files
    runtime = files.get(str(autograd.sim.runtime(13)))
    driver = files.get(str(autograd.sim.driver))
    assert runtime and runtime[0][0] == "runtime" and runtime[0][1] > 10, files
    assert driver and driver[0][0] == "driver" and driver[0][1] > 10, files
    # The simulated driver is entered as NVIDIA's is (a `cmp` thunk the kernel single-steps):
    # its probes are past it, none single-stepped (tests/unit/producer/discover/test_entrypoint.py:
    # where they go).
    assert "single-stepped" not in autograd.stderr, autograd.stderr[-3000:]
    # the file and probe totals in the heading are the sums of the rows
    heading = re.search(r"probed library files: ([\d,]+) \(([\d,]+) probes\)", autograd.stderr)
    assert heading is not None
    assert int(heading.group(1).replace(",", "")) == len(files)
    assert int(heading.group(2).replace(",", "")) == sum(e[0][1] for e in files.values())


def unheld(run: Run) -> int:
    found = re.search(r"not held: ([\d,]+) dlopen", run.stderr)
    return int(found.group(1).replace(",", "")) if found else 0


def test_a_later_trace_lets_quiet_dlopens_through(autograd: Run, cuda_graph: Run) -> None:
    """Whichever of the two ran second found PyTorch's files classified in the shared cache:
    most of its dlopens (Python's extension modules, libtorch_cpu...) went unheld, and it
    conforms all the same (its own test)."""
    later = max(unheld(autograd), unheld(cuda_graph))
    assert later >= 20, (autograd.stderr[-1500:], cuda_graph.stderr[-1500:])


def test_cuda_graph_captured_and_replayed(cuda_graph: Run) -> None:
    assert cuda_graph.result["replays"] == 7
    (t,) = assert_conforms(cuda_graph)
    assert sum(t.captured.values()) >= 3  # mul, add, sin recorded, not run
    assert t.graph_launches == 7
    assert t.graph_kernel_nodes == 7 * sum(t.captured.values())


def test_torch_compile_triton_kernels(compiled: Run) -> None:
    assert compiled.result["shape"] == [64]
    (t,) = assert_conforms(compiled)
    triton = {k: n for k, n in t.launches.items() if k.startswith("triton_")}
    assert any(k.startswith("triton_tem_fused") for k in triton), sorted(t.launches)
    assert any(k.startswith(("triton_poi_", "triton_per_", "triton_red_")) for k in triton)
    # Triton's launcher: cuLaunchKernelEx on the driver, named by cuModuleGetFunction
    assert t.by_layer["driver"] >= sum(triton.values())
    (c,) = gpu_processes(compiled)
    assert c["launch_calls"]["cuLaunchKernelEx"] == t.by_layer["driver"]


def test_data_dependent_ops(data_dependent: Run) -> None:
    assert data_dependent.result["nonzero"] == [data_dependent.result["planted"], 1]
    (t,) = assert_conforms(data_dependent)
    assert any("cub" in k for k in t.launches), sorted(t.launches)


def test_two_devices(two_devices: Run) -> None:
    assert two_devices.result["devices"] == 2
    (t,) = assert_conforms(two_devices)
    (c,) = gpu_processes(two_devices)
    # the driver ran kernels on both devices; the trace has them all, per name
    per_device = [sum(v["per_device"]["launches"][d] for v in c["kernels"].values())
                  for d in (0, 1)]
    assert all(per_device), per_device
    assert sum(t.launches.values()) == sum(per_device)
    # and each launch on the device the driver ran it on: per kernel name per device, exactly
    names = demangle_all(c["kernels"])
    truth = {on_device(names[k], d): n for k, v in c["kernels"].items()
             for d, n in enumerate(v["per_device"]["launches"])}
    assert differences(t.launches_on_device, truth) == {}, "launches per kernel per device"
    ours = [sum(n for key, n in t.launches_on_device.items() if key.endswith(f"@ device {d}"))
            for d in (0, 1)]
    assert ours == per_device
    # the summary splits kernel launches per device when it saw more than one
    summary = two_devices.stderr.replace(",", "")
    for d, n in enumerate(per_device):
        assert re.search(rf"^\s+{n}\s+on device {d}$", summary, re.M), summary
