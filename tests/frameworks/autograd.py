# mypy: disable-error-code="import-not-found"
"""Workload (a): elementwise and reduction ops, forward and backward, on cuda:0.

Prints one JSON line: the loss (a host copy of a device scalar) and the grad shapes.
It ends with os._exit after flushing the simulator's counts: torch's autograd device
threads can abort an ordinary interpreter exit ("terminate called without an active
exception", pytorch/pytorch#38228), which a test must not mistake for a failure.
"""

import ctypes
import json
import os
import sys

import torch


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 128, device="cuda", requires_grad=True)
    w = torch.randn(128, device="cuda", requires_grad=True)
    y = torch.tanh(x * w + 1.0).relu()
    loss = (y.exp() - y).sum(dim=1).mean()
    loss.backward()
    torch.cuda.synchronize()
    assert x.grad is not None and w.grad is not None
    print(
        json.dumps(
            {"loss": float(loss.item()), "x_grad": list(x.grad.shape), "w_grad": list(w.grad.shape)}
        )
    )


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    ctypes.CDLL("libcuda.so.1").gfsim_flush_counts()
    os._exit(0)
