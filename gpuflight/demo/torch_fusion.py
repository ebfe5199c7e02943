# mypy: disable-error-code="import-not-found"
"""The showcase's computation in PyTorch, run by a Python that has torch (not gpuflight's).

    torch_fusion.py eager|compile STEPS RESULT.json

The same step, eight elementwise ops on one tensor: eager PyTorch launches a kernel per op;
torch.compile (Inductor -> Triton) fuses them into one kernel per step. After a warm-up
(start-up, compilation, the first calls), the measured region runs STEPS steps between two
synchronizations; its wall-clock bounds go to RESULT.json, so that the demo counts only the
region's events. On the simulated GPU the timeline's account restarts at the region
(gfsim_timeline_restart), so GF_SIM_REPORT's utilization is the region's.
"""

import contextlib
import ctypes
import json
import sys
import time

import torch

ELEMENTS = 1 << 18


def step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = x * w
    y = y + b
    y = torch.relu(y)
    y = y * 0.5
    y = torch.tanh(y)
    y = y + x
    y = y * y
    return y - 1.0


def restart_timeline() -> None:
    """Start the simulated GPU's account afresh (no-op on a real GPU)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libcuda.so.1").gfsim_timeline_restart()


def main() -> None:
    mode, steps, result = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.manual_seed(0)
    x = torch.randn(ELEMENTS, device="cuda")
    w = torch.randn(ELEMENTS, device="cuda")
    b = torch.randn(ELEMENTS, device="cuda")
    fn = torch.compile(step) if mode == "compile" else step
    for _ in range(3):
        out = fn(x, w, b)
    torch.cuda.synchronize()
    restart_timeline()
    # CLOCK_MONOTONIC, as the probes stamp events: trace's clock offset puts it on the events'
    # time line exactly (the wall clock may be stepped or slewed during the run).
    start = time.monotonic_ns()
    for _ in range(steps):
        out = fn(x, w, b)
    torch.cuda.synchronize()
    end = time.monotonic_ns()
    with open(result, "w") as f:
        json.dump({"start_monotonic_ns": start, "end_monotonic_ns": end, "steps": steps,
                   "shape": list(out.shape)}, f)


if __name__ == "__main__":
    main()
