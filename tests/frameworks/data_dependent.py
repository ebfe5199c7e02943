# mypy: disable-error-code="import-not-found"
"""Workload (d): data-dependent ops whose output size comes back to the host.

torch.nonzero and boolean-mask indexing size their output by a count that a kernel
writes on the device and torch copies to the host. On the simulated GPU kernels do
nothing, so the count torch reads is whatever the device memory holds: before each
op this script copies a block of PLANTED int64 values to the device and frees it,
so torch's caching allocator hands that block out again for the op's count. The
output size torch reads back then proves the device-to-host copy carried the real
bytes. Prints one JSON line.
"""

import json

import torch

PLANTED = 3


def plant() -> None:
    """A block of PLANTED values, copied from the host, freed back to torch's cache."""
    block = torch.full((4096,), PLANTED, dtype=torch.int64).to("cuda")
    del block


def main() -> None:
    values = [0.0, 3.0, 0.0, 5.0, 7.0, 0.0]
    x = torch.tensor(values, device="cuda")  # a host-to-device copy of real bytes
    back = x.cpu().tolist()  # and back
    plant()
    nz = torch.nonzero(x)
    plant()
    masked = x[x > 0]
    torch.cuda.synchronize()
    print(
        json.dumps(
            {
                "roundtrip": back == values,
                "planted": PLANTED,
                "nonzero": list(nz.shape),
                "masked": list(masked.shape),
            }
        )
    )


if __name__ == "__main__":
    main()
