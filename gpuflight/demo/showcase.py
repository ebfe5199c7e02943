"""`gpuflight demo`: the same computation unfused and fused, traced side by side.

Runs on the simulated GPU (gpuflight/simgpu: our libcudart.so.12 and libcuda.so.1 on the
wall clock, modelling launch overhead, kernel time and copy bandwidth: build.DEVICE), so it
works on any machine. gpuflight sees it exactly as it sees NVIDIA's runtime: through uprobes
on libcudart.so.12. The GPU utilization is what the simulated GPU's NVML says of each run
(simnvml.py), as a node's NVML would.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tabulate import tabulate

from gpuflight.demo.build import build_demo
from gpuflight.demo.simnvml import SimulatedNvml
from gpuflight.producer import trace
from gpuflight.producer.decode.summary import Summary
from gpuflight.producer.nvml import NvmlUnavailable

log = logging.getLogger(__name__)

MODES = ("unfused", "fused")


def _top_grid(summary: Summary) -> str:
    if not summary.shapes:
        return "-"
    (grid, _block), _n = summary.shapes.most_common(1)[0]
    return "({},{},{})".format(*grid)


@contextmanager
def environment(changes: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `changes` (what trace.run gives the command it starts), then as it was."""
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.2f}x" if a else "-"


def comparison(results: dict[str, dict[str, Any]], modes: tuple[str, str] = MODES,
               title: str = "kernel fusion") -> str:
    """The side-by-side table of two runs' figures (`modes`: their keys, as the columns)."""
    u, f = results[modes[0]], results[modes[1]]
    rows = [
        ["kernel launches", f"{u['launches']:,}", f"{f['launches']:,}",
         f"{u['launches'] / f['launches']:.1f}x fewer" if f["launches"] else "-"],
        ["launch rate (/s)", f"{u['launch_rate']:,.0f}", f"{f['launch_rate']:,.0f}",
         _ratio(u["launch_rate"], f["launch_rate"])],
        ["blocks per launch (mean)", f"{u['mean_grid_blocks']:,.0f}",
         f"{f['mean_grid_blocks']:,.0f}", _ratio(u["mean_grid_blocks"], f["mean_grid_blocks"])],
        ["top grid", u["top_grid"], f["top_grid"], ""],
        ["bytes copied", f"{u['copy_bytes']:,}", f"{f['copy_bytes']:,}",
         _ratio(u["copy_bytes"], f["copy_bytes"])],
        ["CPU blocked on the GPU (% of wall)", f"{100 * u['blocked_share']:.1f}%",
         f"{100 * f['blocked_share']:.1f}%", ""],
        ["GPU utilization (simulated GPU)",
         f"{100 * u['gpu_util']:.0f}%" if u["gpu_util"] is not None else "-",
         f"{100 * f['gpu_util']:.0f}%" if f["gpu_util"] is not None else "-", ""],
        ["wall time (s)", f"{u['wall_s']:.2f}", f"{f['wall_s']:.2f}",
         _ratio(u["wall_s"], f["wall_s"])],
    ]
    table = tabulate(rows, headers=[title, modes[0], modes[1], f"{modes[1]} vs {modes[0]}"],
                     tablefmt="simple", colalign=("left", "right", "right", "right"))
    return " " + table.replace("\n", "\n ")


def run(steps: int | None = None) -> int:
    built = build_demo()
    print(f"gpuflight demo: the same computation, unfused then fused, on a simulated GPU "
          f"({built.runtime})", file=sys.stderr)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuflight-demo-") as tmp:
        activity = Path(tmp) / "nvml"
        try:
            nvml: SimulatedNvml | None = SimulatedNvml(built, activity)
        except NvmlUnavailable as exc:  # pynvml cannot load it: the table says "-"
            log.warning("the simulated GPU's NVML: %s", exc)
            nvml = None
        try:
            for mode in MODES:
                before = nvml.processes() if nvml is not None else set()
                with environment(built.env({}, nvml_dir=activity)):
                    result = trace.run(built.command(mode, steps))
                if result.exit_code != 0:
                    print(f"gpuflight demo: the {mode} workload failed "
                          f"(exit {result.exit_code})", file=sys.stderr)
                    return 1
                data = result.summary.as_dict(result.wall_s)
                data["top_grid"] = _top_grid(result.summary)
                data["gpu_util"] = (None if nvml is None else
                                    nvml.utilization(nvml.processes() - before, time.time_ns()))
                results[mode] = data
        finally:
            if nvml is not None:
                nvml.close()
    print(comparison(results))
    return 0
