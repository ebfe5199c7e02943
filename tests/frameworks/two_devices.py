# mypy: disable-error-code="import-not-found"
"""Workload (e): tensors on cuda:0 and cuda:1 and a copy between them (GF_SIM_DEVICES=2).

Prints one JSON line: the device count and the copied values.
"""

import json

import torch


def main() -> None:
    n = torch.cuda.device_count()
    a = torch.arange(16, dtype=torch.float32).to("cuda:0")
    b = torch.full((16,), 2.0, device="cuda:1")
    c = (b * 3.0).neg()  # kernels on device 1 only
    a2 = a.to("cuda:1")  # a peer copy, device 0 -> device 1
    d = a + 1.0  # a kernel on device 0
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    print(
        json.dumps(
            {"devices": n, "copied": a2.cpu().tolist(), "c": list(c.shape), "d": str(d.device)}
        )
    )


if __name__ == "__main__":
    main()
