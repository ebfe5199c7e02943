"""Kernel launches from two known Python functions, through the CUDA runtime (the simulated
GPU's, by ctypes), for `trace --stacks` (tests/system/test_codepaths.py).

`python -m tests.workloads.pylaunch RUNTIME N`: N launches from `hot()`, N // 4 from
`cold()`, interleaved, then a copy."""

from __future__ import annotations

import sys

from gpuflight.demo.serve import H2D, Gpu

gpu = Gpu(sys.argv[1])
n = int(sys.argv[2])


def hot() -> None:
    gpu.launch(64, 128)


def cold() -> None:
    gpu.launch(8, 32)


for i in range(n):
    hot()
    if i % 4 == 3:
        cold()
gpu.copy(4096, H2D)
