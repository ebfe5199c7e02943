"""Kernel launches from two known Python functions, through the CUDA runtime (the simulated
GPU's, by ctypes), for `trace --stacks` (tests/system/test_codepaths.py).

`python -m tests.workloads.pylaunch RUNTIME N`: N launches from `hot()`, N // 4 from
`cold()`, N // 10 synchronous copies of UPLOAD bytes from `upload()` and as many syncs from
`wait()`, interleaved, then a copy of 4096 bytes; with a third argument `os._exit`, then a
launch from `last()` and os._exit at once (no interpreter shutdown)."""

from __future__ import annotations

import os
import sys

from gpuflight.demo.serve import H2D, Gpu

UPLOAD = 65536


def hot() -> None:
    gpu.launch(64, 128)


def cold() -> None:
    gpu.launch(8, 32)


def upload() -> None:
    gpu.copy(UPLOAD, H2D)


def wait() -> None:
    gpu.sync()


def last() -> None:
    gpu.launch(1, 1)


if __name__ == "__main__":
    gpu = Gpu(sys.argv[1])
    for i in range(int(sys.argv[2])):
        hot()
        if i % 4 == 3:
            cold()
        if i % 10 == 9:
            upload()
            wait()
    gpu.copy(4096, H2D)
    if sys.argv[3:] == ["os._exit"]:
        last()
        sys.stdout.flush()
        os._exit(0)
