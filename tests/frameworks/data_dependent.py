"""Workload (d): data-dependent ops whose output size comes back to the host.

torch.nonzero and boolean-mask indexing size their output from a count that a
kernel writes on the device and torch copies to the host. On the simulated GPU
kernels do nothing, so the count torch reads is whatever the device memory holds:
this script plants a known count in the freed block that torch's caching
allocator hands out for it, so the size torch reads back proves the device-to-host
copy carried the real bytes. Prints one JSON line.
"""

import json

import torch

PLANTED = 3


def main() -> None:
    values = [0.0, 3.0, 0.0, 5.0, 7.0, 0.0]
    x = torch.tensor(values, device="cuda")  # a host-to-device copy of real bytes
    back = x.cpu().tolist()  # and back
    # Plant: 4096 int64 threes, copied in from the host, then freed to the cache.
    plant = torch.full((4096,), PLANTED, dtype=torch.int64).to("cuda")
    del plant
    nz = torch.nonzero(x)
    plant = torch.full((4096,), PLANTED, dtype=torch.int64).to("cuda")
    del plant
    masked = x[x > 0]
    torch.cuda.synchronize()
    print(json.dumps({"roundtrip": back == values, "nonzero": list(nz.shape),
                      "masked": list(masked.shape)}))


if __name__ == "__main__":
    main()
