"""Build the demo: its kernel-fusion workload (fusion.c) on the simulated GPU (gpuflight/simgpu).

    built = build_demo()            the simulated GPU and the fusion workload, in a cache dir
    built.command(mode, steps)      the command line of one fusion run
    built.env(nvml_dir=d)           its environment: the demo's device (DEVICE), logged for NVML
    build_fusion(outdir, lib_dir)   outdir/fusion, linked with lib_dir/libcudart.so.12

The demo runs on the one simulated GPU the tests run on (gpuflight/simgpu), built by cc with
the CUDA runtime wheels' headers (nvidia-cuda-runtime and -cu12: the dev extras scripts/setup
installs, ~8 MB each): our libcudart.so.12 with our driver inside (the program calls only the
runtime API, and gpuflight probes the file as a runtime alone: see simgpu.build.build), and our
libnvidia-ml.so.1. No GPU and no NVIDIA driver. C is built by gpuflight/simgpu/cbuild.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuflight.simgpu.build import RUNTIME_SONAMES, SimGpu
from gpuflight.simgpu.build import build as build_sim
from gpuflight.simgpu.cbuild import compile_c, link_args

DEMO_DIR = Path(__file__).resolve().parent
ABI_HEADER = DEMO_DIR / "cuda_abi.h"
FUSION_SOURCE = DEMO_DIR / "fusion.c"

#: The CUDA runtime the demo's programs link (CUDA 12's name, as the tests' "stub").
RUNTIME_MAJOR = 12
SIMGPU_SONAME = RUNTIME_SONAMES[RUNTIME_MAJOR]

#: The simulated GPU on the wall clock, with its timing model's defaults (timing.h): a launch
#: costs the CPU 4 us, a kernel takes 0.6 us + 0.04 ns a thread, host copies move 12 GB/s.
#: (Any GF_SIM_ timing variable turns that model on; this one names its default.)
REAL_TIME: Mapping[str, str] = {"GF_SIM_LAUNCH_NS": "4000"}

#: The device of the demo (its NVML reports the table's GPU utilization): NVML counts the time
#: kernels run, not copies, so the fusion step's 512 KiB copy must not dwarf its kernels. A
#: PCIe Gen5 host link (50 GB/s each way) and kernels of 0.6 us + 0.15 ns a thread: the fused
#: one (512 x 256 threads) 20 us; an unfused one (32 x 256) 1.8 us, less than the 4 us a launch
#: costs the CPU, so that eight in a row leave the GPU idle in between (launch-bound).
DEVICE: Mapping[str, str] = {**REAL_TIME, "GF_SIM_NS_PER_THREAD": "0.15",
                             "GF_SIM_H2D_GBPS": "50", "GF_SIM_D2H_GBPS": "50"}

#: How often the demo's NVML samples (µs). A driver samples every 1/6 s; the demo's runs last
#: under a second, which at that period would be a few samples, the first and last partial.
NVML_PERIOD_US = 10_000


def build_fusion(outdir: Path, lib_dir: Path) -> Path:
    """Build outdir/fusion, linked against lib_dir/libcudart.so.12 (with a run path)."""
    runtime = Path(lib_dir) / SIMGPU_SONAME
    return compile_c(Path(outdir) / "fusion", [FUSION_SOURCE],
                     [f"-I{DEMO_DIR}", *link_args(Path(lib_dir), SIMGPU_SONAME)],
                     inputs=[ABI_HEADER, runtime])


@dataclass(frozen=True)
class DemoBuild:
    """The built demo: the simulated GPU and the fusion program linked with its runtime."""

    sim: SimGpu
    fusion: Path

    @property
    def lib_dir(self) -> Path:
        """The simulated GPU's library directory (its runtime, the driver inside, and NVML)."""
        return self.sim.lib_dir

    @property
    def runtime(self) -> Path:
        """Our libcudart.so.12 (what the probes attach to)."""
        return self.sim.runtime(RUNTIME_MAJOR)

    @property
    def nvml(self) -> Path:
        """Our libnvidia-ml.so.1."""
        return self.sim.nvml

    def command(self, mode: str, steps: int | None = None, copies: int = 1) -> list[str]:
        """The command line of one fusion run (mode: "unfused" or "fused"; `copies` H2D
        copies of the batch per step)."""
        cmd = [str(self.fusion), "--mode", mode]
        if steps is not None:
            cmd += ["--steps", str(steps)]
        if copies != 1:
            cmd += ["--copies", str(copies)]
        return cmd

    def env(self, base: Mapping[str, str] | None = None, *,
            device: Mapping[str, str] = DEVICE, nvml_dir: Path | None = None,
            **extra: str) -> dict[str, str]:
        """The environment of a fusion run: `base` (default os.environ) with `device` (the
        simulated GPU's timing: DEVICE, or REAL_TIME for the model's own defaults); with
        `nvml_dir`, each process logs its kernels there for the simulated NVML to read."""
        env = {**(os.environ if base is None else base), **device, **extra}
        if nvml_dir is not None:
            env["GF_SIM_NVML_DIR"] = str(nvml_dir)
        return env

    def nvml_env(self, nvml_dir: Path) -> dict[str, str]:
        """What a reader of the simulated NVML needs in its environment (gpuflight's sampler,
        the node agent): the library, the activity logs' directory, the sampling period."""
        return {"GPUFLIGHT_NVML_LIB": str(self.nvml), "GF_SIM_NVML_DIR": str(nvml_dir),
                "GF_SIM_NVML_PERIOD_US": str(NVML_PERIOD_US)}


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/gpuflight/demo, or ~/.cache/gpuflight/demo."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuflight" / "demo"


def build_demo(cache_dir: Path | None = None) -> DemoBuild:
    """Build (or reuse) the simulated GPU and the fusion workload in `cache_dir`."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    sim = build_sim(root / "simgpu", runtimes=(RUNTIME_MAJOR,), driver_inside=True)
    return DemoBuild(sim=sim, fusion=build_fusion(root / "bin", sim.lib_dir))
