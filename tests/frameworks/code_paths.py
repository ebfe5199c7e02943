# mypy: disable-error-code="import-not-found"
"""Workload (code paths): who launched what, forward and backward, on cuda:0.

`train_step` runs a small model forward and calls backward; the backward kernels are launched
on autograd's device thread, which has no Python frames: gpuflight counts them to the stack
that entered the backward pass. A middle segment is checkpointed (reentrant): its backward
recomputes it and enters the engine again from the device thread (Python frames of its own),
and the outer pass goes on after it. A tensor hook runs Python on the device thread. A second
backward pass is entered from another Python thread (`worker_step`), after the first ones have
left the engine.

Prints one JSON line: the native thread ids of the main thread and the worker thread. Ends
with os._exit after flushing the simulator's counts (see autograd.py).
"""

import ctypes
import json
import os
import sys
import threading

import torch
from torch.utils.checkpoint import checkpoint


def middle(a: torch.Tensor) -> torch.Tensor:
    return torch.tanh(a * 2.0) + a


def doubled(grad: torch.Tensor) -> torch.Tensor:
    return grad * 2.0


def train_step(x: torch.Tensor, w: torch.Tensor) -> None:
    a = (x * w).relu()
    b = checkpoint(middle, a, use_reentrant=True)
    b.register_hook(doubled)
    loss = b.exp().sum()
    loss.backward()


def worker_step(x: torch.Tensor, w: torch.Tensor, tids: dict[str, int]) -> None:
    tids["worker"] = threading.get_native_id()
    loss = (x * w).sigmoid().sum()
    loss.backward()


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 128, device="cuda")
    w = torch.randn(128, device="cuda", requires_grad=True)
    for _ in range(3):
        train_step(x, w)
    torch.cuda.synchronize()
    tids = {"main": threading.get_native_id()}
    worker = threading.Thread(target=worker_step, args=(x, w, tids))
    worker.start()
    worker.join()
    torch.cuda.synchronize()
    assert w.grad is not None
    print(json.dumps(tids))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    ctypes.CDLL("libcuda.so.1").gfsim_flush_counts()
    os._exit(0)
