# mypy: disable-error-code="import-not-found"
"""Workload (a): elementwise and reduction ops, forward and backward, on cuda:0.

Prints one JSON line: the loss (a host copy of a device scalar) and the grad shapes.
"""

import json

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
