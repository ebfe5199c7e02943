"""What the simulated GPU's NVML says of the demo's runs: the GPU utilization of its table.

    with SimulatedNvml(built, activity_dir) as nvml:   # NVML, read in this process
        before = nvml.processes()
        ... run a workload in built.env(nvml_dir=activity_dir) ...
        share = nvml.utilization(nvml.processes() - before, until_ns=time.time_ns())

The figure is NVML's, read through gpuflight's own sampler (producer/nvml.py) as the node
agent reads a real GPU's: the per-process SM utilisation samples (nvmlDeviceGetProcessUtilization,
one per sampling period in which a process's kernels ran), averaged over the run's processes
and periods. Kernels only, as on NVIDIA's: copies are not SM time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from pathlib import Path
from types import TracebackType

from gpuflight.demo.build import NVML_PERIOD_US, DemoBuild
from gpuflight.producer.nvml import NvmlSampler, UtilWindow

#: The name of each process's activity log (gpuflight/simgpu/activity.h: ACT_NAME + pid).
ACTIVITY_PREFIX = "activity."


class SimulatedNvml:
    """The simulated GPU's libnvidia-ml.so.1, reading the activity logs of `activity` (the
    directory the workloads run with, DemoBuild.env(nvml_dir=...))."""

    def __init__(self, built: DemoBuild, activity: Path) -> None:
        self.activity = Path(activity)
        self.activity.mkdir(parents=True, exist_ok=True)
        self._windows: list[UtilWindow] = []
        # Our NVML reads its directory and period at nvmlInit, from the environment.
        wanted = built.nvml_env(self.activity)
        saved = {name: os.environ.get(name) for name in wanted}
        os.environ.update(wanted)
        try:
            self._sampler = NvmlSampler(built.nvml)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def processes(self) -> set[int]:
        """The processes that have logged kernels for this NVML (an activity log each)."""
        found = set()
        for path in self.activity.glob(ACTIVITY_PREFIX + "*"):
            pid = path.name.removeprefix(ACTIVITY_PREFIX)
            if pid.isdigit():
                found.add(int(pid))
        return found

    def utilization(self, pids: Collection[int], until_ns: int,
                    timeout_s: float = 5.0) -> float | None:
        """The share (0..1) of the time the kernels of `pids` kept the GPU busy, as NVML's
        samples of them say, once NVML has reported up to `until_ns` (wall clock; their end);
        None where NVML has no sample of them."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._sampler.sample()
            report = self._sampler.take_utilization()
            self._windows.extend(report.windows)
            covered = min(report.covered_ns.values(), default=0)
            if covered >= until_ns or time.monotonic() > deadline:
                break
            time.sleep(NVML_PERIOD_US / 1e6)
        mine = [w for w in self._windows if w.pid in pids]
        span = sum(w.end_ns - w.start_ns for w in mine)
        return sum(w.gpu_ns for w in mine) / span if span else None

    def close(self) -> None:
        self._sampler.close()

    def __enter__(self) -> SimulatedNvml:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
