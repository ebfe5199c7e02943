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
    GRAPH_CAPTURE = 8
    GRAPH_INSTANTIATE = 9


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
    "cudaStreamBeginCapture": 130,
    "cudaStreamBeginCapture_ptsz": 131,
    "cudaStreamEndCapture": 132,
    "cudaStreamEndCapture_ptsz": 133,
    "cudaGraphInstantiate": 134,
    "cudaGraphInstantiateWithFlags": 135,
    "cudaGraphInstantiateWithParams": 136,
    "cudaGraphInstantiateWithParams_ptsz": 137,
    "cuLaunchKernel": 200,
    "cuLaunchKernel_ptsz": 201,
    "cuLaunchKernelEx": 202,
    "cuLaunchKernelEx_ptsz": 203,
    "cuLaunchCooperativeKernel": 204,
    "cuLaunchCooperativeKernel_ptsz": 205,
    "cuMemcpyHtoD_v2": 220,
    "cuMemcpyHtoD_v2_ptds": 221,
    "cuMemcpyDtoH_v2": 222,
    "cuMemcpyDtoH_v2_ptds": 223,
    "cuMemcpyDtoD_v2": 224,
    "cuMemcpyDtoD_v2_ptds": 225,
    "cuMemcpyHtoDAsync_v2": 226,
    "cuMemcpyHtoDAsync_v2_ptsz": 227,
    "cuMemcpyDtoHAsync_v2": 228,
    "cuMemcpyDtoHAsync_v2_ptsz": 229,
    "cuMemcpyDtoDAsync_v2": 230,
    "cuMemcpyDtoDAsync_v2_ptsz": 231,
    "cuMemcpy": 232,
    "cuMemcpy_ptds": 233,
    "cuMemcpyAsync": 234,
    "cuMemcpyAsync_ptsz": 235,
    "cuMemcpyPeer": 236,
    "cuMemcpyPeer_ptds": 237,
    "cuMemcpyPeerAsync": 238,
    "cuMemcpyPeerAsync_ptsz": 239,
    "cuMemsetD8_v2": 250,
    "cuMemsetD8_v2_ptds": 251,
    "cuMemsetD16_v2": 252,
    "cuMemsetD16_v2_ptds": 253,
    "cuMemsetD32_v2": 254,
    "cuMemsetD32_v2_ptds": 255,
    "cuMemsetD8Async": 256,
    "cuMemsetD8Async_ptsz": 257,
    "cuMemsetD16Async": 258,
    "cuMemsetD16Async_ptsz": 259,
    "cuMemsetD32Async": 260,
    "cuMemsetD32Async_ptsz": 261,
    "cuMemAlloc_v2": 280,
    "cuMemAllocAsync": 281,
    "cuMemAllocAsync_ptsz": 282,
    "cuMemAllocManaged": 283,
    "cuMemAllocHost_v2": 284,
    "cuMemHostAlloc": 285,
    "cuMemFree_v2": 290,
    "cuMemFreeAsync": 291,
    "cuMemFreeAsync_ptsz": 292,
    "cuMemFreeHost": 293,
    "cuStreamSynchronize": 300,
    "cuStreamSynchronize_ptsz": 301,
    "cuCtxSynchronize": 302,
    "cuEventSynchronize": 303,
    "cuGraphLaunch": 320,
    "cuGraphLaunch_ptsz": 321,
    "cuStreamBeginCapture_v2": 330,
    "cuStreamBeginCapture_v2_ptsz": 331,
    "cuStreamEndCapture": 332,
    "cuStreamEndCapture_ptsz": 333,
    "cuGraphInstantiateWithFlags": 334,
    "cuGraphInstantiateWithParams": 335,
    "cuGraphInstantiateWithParams_ptsz": 336,
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
        "cudaStreamEndCapture",
        "cudaStreamEndCapture_ptsz",
        "cudaGraphInstantiate",
        "cudaGraphInstantiateWithFlags",
        "cudaGraphInstantiateWithParams",
        "cudaGraphInstantiateWithParams_ptsz",
        "cuMemcpyHtoD_v2",
        "cuMemcpyHtoD_v2_ptds",
        "cuMemcpyDtoH_v2",
        "cuMemcpyDtoH_v2_ptds",
        "cuMemcpyDtoD_v2",
        "cuMemcpyDtoD_v2_ptds",
        "cuMemcpy",
        "cuMemcpy_ptds",
        "cuMemcpyPeer",
        "cuMemcpyPeer_ptds",
        "cuMemAlloc_v2",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
        "cuMemAllocManaged",
        "cuMemAllocHost_v2",
        "cuMemHostAlloc",
        "cuMemFree_v2",
        "cuMemFreeAsync",
        "cuMemFreeAsync_ptsz",
        "cuMemFreeHost",
        "cuStreamSynchronize",
        "cuStreamSynchronize_ptsz",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuStreamEndCapture",
        "cuStreamEndCapture_ptsz",
        "cuGraphInstantiateWithFlags",
        "cuGraphInstantiateWithParams",
        "cuGraphInstantiateWithParams_ptsz",
    }
)

#: The runtime and driver functions that have an api id (the rest of API_IDS is neither).
RUNTIME_APIS: Final[frozenset[str]] = frozenset(
    name for name, api in API_IDS.items() if api < DRIVER_API_BASE
)
DRIVER_APIS: Final[frozenset[str]] = frozenset(
    name for name, api in API_IDS.items() if api >= DRIVER_API_BASE
)

#: Functions probed only for kernel names and handle identities (struct gf_name_event),
#: by layer; each has `<name>_entry` and, where it returns a handle, `<name>_return`.
RUNTIME_NAME_FUNCTIONS: Final[frozenset[str]] = frozenset(
    {"__cudaRegisterFunction", "__cudaGetKernel"}
)
DRIVER_NAME_FUNCTIONS: Final[frozenset[str]] = frozenset(
    {
        "cuModuleGetFunction",
        "cuLibraryGetKernel",
        "cuKernelGetFunction",
        "cuModuleLoadData",
        "cuModuleLoadDataEx",
        "cuLibraryLoadData",
    }
)
#: The name functions whose record is completed at return (all of them but one).
NAME_WITH_RETURN: Final[frozenset[str]] = (
    RUNTIME_NAME_FUNCTIONS | DRIVER_NAME_FUNCTIONS
) - {"__cudaRegisterFunction"}

class NameKind(IntEnum):
    """enum gf_name_kind."""

    RUNTIME_FUNCTION = 1
    RUNTIME_KERNEL = 2
    DRIVER_FUNCTION = 3
    DRIVER_KERNEL = 4
    KERNEL_FUNCTION = 5
    MODULE = 6


NAME_MAX: Final = 512
NAME_F_TRUNCATED: Final = 0x1
#: graph_capture events: dim[0] is the phase; set by user space on an end that made a
#: graph, dim[CAPTURE_KERNEL_NODES] is the kernel nodes captured into it.
CAPTURE_BEGIN: Final = 1
CAPTURE_END: Final = 2
CAPTURE_KERNEL_NODES: Final = 1
MAX_RUNTIME_RANGES: Final = 8

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
#: launched, when the exec was instantiated while observed (0: not known). User space sets
#: the same slot of a graph_instantiate event (the nodes of the exec it made).
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

#: struct gf_name_event.
NAME_EVENT_DTYPE: Final = np.dtype(
    {
        "names": ["ts_ns", "pid", "kind", "flags", "handle", "aux", "name"],
        "formats": ["<u8", "<u4", "<u2", "<u2", "<u8", "<u8", f"S{NAME_MAX}"],
        "offsets": [0, 8, 12, 14, 16, 24, 32],
        "itemsize": 32 + NAME_MAX,
    }
)

#: struct gf_text_ranges (the value of the `runtime_text` map).
TEXT_RANGES_DTYPE: Final = np.dtype(
    [("start", "<u8", (MAX_RUNTIME_RANGES,)), ("end", "<u8", (MAX_RUNTIME_RANGES,))]
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
#: Name records lost because the `names` ring buffer was full.
DROP_NAMES: Final = 3
#: Not a loss: driver calls made by a probed runtime, left out as the runtime's event.
FORWARDED: Final = 4
#: Slots in the `drops` array.
DROP_SLOTS: Final = 5
