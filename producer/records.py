"""Python mirror of bpf/events.h: enums, the record layout and the probe table.

tests/test_records.py compiles the header and checks every value here against
it, so the two cannot drift apart.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

import numpy as np


class EventType(IntEnum):
    LAUNCH = 1
    MEMCPY = 2
    MEMSET = 3
    ALLOC = 4
    FREE = 5
    SYNC = 6
    GRAPH_LAUNCH = 7


TYPE_NAMES: Final[dict[int, str]] = {t.value: t.name.lower() for t in EventType}

#: enum gf_api: the function that was called. Append only.
API_IDS: Final[dict[str, int]] = {
    "cudaLaunchKernel": 1,
    "cudaLaunchKernel_ptsz": 2,
    "cudaLaunchKernelExC": 3,
    "cudaLaunchKernelExC_ptsz": 4,
    "cudaLaunchCooperativeKernel": 5,
    "cudaLaunchCooperativeKernel_ptsz": 6,
    "cudaMemcpy": 20,
    "cudaMemcpy_ptds": 21,
    "cudaMemcpyAsync": 22,
    "cudaMemcpyAsync_ptsz": 23,
    "cudaMemcpyPeer": 24,
    "cudaMemcpyPeerAsync": 25,
    "cudaMemcpy2D": 26,
    "cudaMemcpy2D_ptds": 27,
    "cudaMemcpy2DAsync": 28,
    "cudaMemcpy2DAsync_ptsz": 29,
    "cudaMemset": 40,
    "cudaMemset_ptds": 41,
    "cudaMemsetAsync": 42,
    "cudaMemsetAsync_ptsz": 43,
    "cudaMemset2D": 44,
    "cudaMemset2D_ptds": 45,
    "cudaMemset2DAsync": 46,
    "cudaMemset2DAsync_ptsz": 47,
    "cudaMemset3D": 48,
    "cudaMemset3D_ptds": 49,
    "cudaMemset3DAsync": 50,
    "cudaMemset3DAsync_ptsz": 51,
    "cudaMalloc": 60,
    "cudaMallocAsync": 61,
    "cudaMallocAsync_ptsz": 62,
    "cudaMallocManaged": 63,
    "cudaMallocHost": 64,
    "cudaHostAlloc": 65,
    "cudaMallocFromPoolAsync": 66,
    "cudaMallocFromPoolAsync_ptsz": 67,
    "cudaFree": 80,
    "cudaFreeAsync": 81,
    "cudaFreeAsync_ptsz": 82,
    "cudaFreeHost": 83,
    "cudaStreamSynchronize": 100,
    "cudaStreamSynchronize_ptsz": 101,
    "cudaDeviceSynchronize": 102,
    "cudaEventSynchronize": 103,
    "cudaGraphLaunch": 120,
    "cudaGraphLaunch_ptsz": 121,
}
API_NAMES: Final[dict[int, str]] = {v: k for k, v in API_IDS.items()}

LAYER_RUNTIME: Final = "runtime"
LAYER_DRIVER: Final = "driver"
#: API ids from this value up are driver API (libcuda) functions; below it, runtime ones.
DRIVER_API_BASE: Final = 200


def layer_of(api: int) -> str:
    """The API layer of an api id: "runtime" (libcudart) or "driver" (libcuda)."""
    return LAYER_DRIVER if api >= DRIVER_API_BASE else LAYER_RUNTIME


#: Functions whose probe completes at return (result, duration, out-pointer).
WITH_RETURN: Final[frozenset[str]] = frozenset(
    {
        "cudaMemcpy",
        "cudaMemcpy_ptds",
        "cudaMemcpyPeer",
        "cudaMemcpy2D",
        "cudaMemcpy2D_ptds",
        "cudaMalloc",
        "cudaMallocAsync",
        "cudaMallocAsync_ptsz",
        "cudaMallocManaged",
        "cudaMallocHost",
        "cudaHostAlloc",
        "cudaMallocFromPoolAsync",
        "cudaMallocFromPoolAsync_ptsz",
        "cudaFree",
        "cudaFreeAsync",
        "cudaFreeAsync_ptsz",
        "cudaFreeHost",
        "cudaStreamSynchronize",
        "cudaStreamSynchronize_ptsz",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
    }
)

#: enum gf_copy_kind, indexed by value (cudaMemcpyKind).
COPY_KINDS: Final[tuple[str, ...]] = ("H2H", "H2D", "D2H", "D2D", "default")
ALLOC_KINDS: Final[dict[int, str]] = {
    1: "device",
    2: "device_async",
    3: "managed",
    4: "host_pinned",
    5: "pool_async",
}
SYNC_SCOPES: Final[dict[int, str]] = {1: "stream", 2: "device", 3: "event"}

F_HAS_RESULT: Final = 0x1
F_ASYNC: Final = 0x2
#: Set by user space (never by BPF): a launch made while its stream was being captured
#: into a graph (cudaStreamBeginCapture … EndCapture): recorded as a graph node, not run.
F_CAPTURED: Final = 0x40
#: Set by user space (never by BPF): a free's `bytes` is known (from its allocation).
F_BYTES_KNOWN: Final = 0x80
#: A graph_launch event's dim[GRAPH_KERNEL_NODES]: the kernel nodes of the graph exec it
#: launched, when the exec was instantiated while observed (0: not known).
GRAPH_KERNEL_NODES: Final = 0

#: struct gf_event (80 bytes).
EVENT_DTYPE: Final = np.dtype(
    {
        "names": [
            "ts_ns", "pid", "tid", "api", "type", "flags", "result",
            "duration_ns", "handle", "stream", "bytes", "dim",
        ],
        "formats": [
            "<u8", "<u4", "<u4", "<u2", "u1", "u1", "<i4",
            "<u8", "<u8", "<u8", "<u8", ("<u4", (6,)),
        ],
        "offsets": [0, 8, 12, 16, 18, 19, 20, 24, 32, 40, 48, 56],
        "itemsize": 80,
    }
)

#: struct gf_loader_event.
LOADER_EVENT_DTYPE: Final = np.dtype([("pid", "<u4"), ("held", "<u4")])

#: A ring buffer record: the kernel's 8-byte header, then one gf_event.
RINGBUF_HEADER_BYTES: Final = 8
RECORD_DTYPE: Final = np.dtype(
    {
        "names": ["len", "pg_off", "event"],
        "formats": ["<u4", "<u4", EVENT_DTYPE],
        "offsets": [0, 4, 8],
        "itemsize": RINGBUF_HEADER_BYTES + EVENT_DTYPE.itemsize,
    }
)

#: Slots of the `drops` per-CPU array.
DROP_EVENTS: Final = 0
DROP_LOADER: Final = 1
