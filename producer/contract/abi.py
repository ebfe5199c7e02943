"""Python mirror of bpf/events.h: enums, the record layout and the probe table.

tests/unit/producer/contract/test_abi.py compiles the header and checks every value here against
it (and the BPF programs against the probe table), so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
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

LAYER_RUNTIME: Final = "runtime"
LAYER_DRIVER: Final = "driver"
#: API ids from this value up are driver API (libcuda) functions; below it, runtime ones.
DRIVER_API_BASE: Final = 200


def layer_of(api: int) -> str:
    """The API layer of an api id: "runtime" (libcudart) or "driver" (libcuda)."""
    return LAYER_DRIVER if api >= DRIVER_API_BASE else LAYER_RUNTIME


#: The families (bpf/cudart.bpf.c: GF_PROBE_<FAMILY>, GF_NAME_PROBE_<FAMILY>) whose
#: probe completes at return (result, duration, out-pointer): `<name>_return` as well.
RETURN_FAMILIES: Final[frozenset[str]] = frozenset(
    {
        "memcpy", "memcpy_2d", "copy", "copy_peer", "alloc", "alloc_async", "alloc_pool",
        "free", "free_async", "sync", "capture_end", "instantiate",
        "handle", "named_handle",
        "set_device", "ctx_retain", "ctx_create", "ctx_set", "ctx_push", "ctx_pop",
    }
)


@dataclass(frozen=True)
class Probe:
    """A row of the probe table (bpf/events.h: GF_API_PROBES, GF_NAME_PROBES)."""

    #: The probed function: BPF programs `<name>_entry` and, if it returns, `<name>_return`.
    name: str
    #: enum gf_api; None for a function that makes no event: probed for names (struct
    #: gf_name_event) or for the calling thread's device (gf_event.device).
    api: int | None
    #: LAYER_RUNTIME (libcudart) or LAYER_DRIVER (libcuda).
    layer: str
    #: How the BPF program decodes and records the call (the family's macro, lower case).
    family: str
    #: The family's constant for this row (the table's last column: copy direction,
    #: allocation kind, memset width, sync scope), as the compiled header has it.
    arg: int = 0

    @property
    def returns(self) -> bool:
        """Whether the probe has a return half (attached as a uretprobe)."""
        return self.family in RETURN_FAMILIES

    @property
    def cookie(self) -> int:
        """The attach cookie of the row where one program serves a family: api | arg << 16."""
        return (self.api or 0) | self.arg << 16

    def program(self, half: str, cookies: bool) -> str:
        """The BPF program of this row's `half` ("entry" or "return"): the family's, shared
        through the cookie (`cookies`: Linux 5.15+; API rows only), or the row's own."""
        if cookies and self.api is not None:
            return f"gf_{self.family.upper()}_{half}"
        return f"{self.name}_{half}"


_R, _D = LAYER_RUNTIME, LAYER_DRIVER

#: The probe table, in the header's order: what is attached, and enum gf_api (append only).
PROBES: Final[tuple[Probe, ...]] = (
    Probe("cudaLaunchKernel", 1, _R, "launch"),
    Probe("cudaLaunchKernel_ptsz", 2, _R, "launch"),
    Probe("cudaLaunchKernelExC", 3, _R, "launch_ex"),
    Probe("cudaLaunchKernelExC_ptsz", 4, _R, "launch_ex"),
    Probe("cudaLaunchCooperativeKernel", 5, _R, "launch"),
    Probe("cudaLaunchCooperativeKernel_ptsz", 6, _R, "launch"),
    Probe("cudaMemcpy", 20, _R, "memcpy"),
    Probe("cudaMemcpy_ptds", 21, _R, "memcpy"),
    Probe("cudaMemcpyAsync", 22, _R, "memcpy_async"),
    Probe("cudaMemcpyAsync_ptsz", 23, _R, "memcpy_async"),
    Probe("cudaMemcpyPeer", 24, _R, "copy_peer"),
    Probe("cudaMemcpyPeerAsync", 25, _R, "copy_peer_async"),
    Probe("cudaMemcpy2D", 26, _R, "memcpy_2d"),
    Probe("cudaMemcpy2D_ptds", 27, _R, "memcpy_2d"),
    Probe("cudaMemcpy2DAsync", 28, _R, "memcpy_2d_async"),
    Probe("cudaMemcpy2DAsync_ptsz", 29, _R, "memcpy_2d_async"),
    Probe("cudaMemset", 40, _R, "memset", 1),
    Probe("cudaMemset_ptds", 41, _R, "memset", 1),
    Probe("cudaMemsetAsync", 42, _R, "memset_async", 1),
    Probe("cudaMemsetAsync_ptsz", 43, _R, "memset_async", 1),
    Probe("cudaMemset2D", 44, _R, "memset_2d"),
    Probe("cudaMemset2D_ptds", 45, _R, "memset_2d"),
    Probe("cudaMemset2DAsync", 46, _R, "memset_2d_async"),
    Probe("cudaMemset2DAsync_ptsz", 47, _R, "memset_2d_async"),
    Probe("cudaMemset3D", 48, _R, "memset_3d"),
    Probe("cudaMemset3D_ptds", 49, _R, "memset_3d"),
    Probe("cudaMemset3DAsync", 50, _R, "memset_3d_async"),
    Probe("cudaMemset3DAsync_ptsz", 51, _R, "memset_3d_async"),
    Probe("cudaMalloc", 60, _R, "alloc", 1),
    Probe("cudaMallocAsync", 61, _R, "alloc_async"),
    Probe("cudaMallocAsync_ptsz", 62, _R, "alloc_async"),
    Probe("cudaMallocManaged", 63, _R, "alloc", 3),
    Probe("cudaMallocHost", 64, _R, "alloc", 4),
    Probe("cudaHostAlloc", 65, _R, "alloc", 4),
    Probe("cudaMallocFromPoolAsync", 66, _R, "alloc_pool"),
    Probe("cudaMallocFromPoolAsync_ptsz", 67, _R, "alloc_pool"),
    Probe("cudaFree", 80, _R, "free"),
    Probe("cudaFreeAsync", 81, _R, "free_async"),
    Probe("cudaFreeAsync_ptsz", 82, _R, "free_async"),
    Probe("cudaFreeHost", 83, _R, "free"),
    Probe("cudaStreamSynchronize", 100, _R, "sync", 1),
    Probe("cudaStreamSynchronize_ptsz", 101, _R, "sync", 1),
    Probe("cudaDeviceSynchronize", 102, _R, "sync", 2),
    Probe("cudaEventSynchronize", 103, _R, "sync", 3),
    Probe("cudaGraphLaunch", 120, _R, "graph_launch"),
    Probe("cudaGraphLaunch_ptsz", 121, _R, "graph_launch"),
    Probe("cudaStreamBeginCapture", 130, _R, "capture_begin"),
    Probe("cudaStreamBeginCapture_ptsz", 131, _R, "capture_begin"),
    Probe("cudaStreamEndCapture", 132, _R, "capture_end"),
    Probe("cudaStreamEndCapture_ptsz", 133, _R, "capture_end"),
    Probe("cudaGraphInstantiate", 134, _R, "instantiate"),
    Probe("cudaGraphInstantiateWithFlags", 135, _R, "instantiate"),
    Probe("cudaGraphInstantiateWithParams", 136, _R, "instantiate"),
    Probe("cudaGraphInstantiateWithParams_ptsz", 137, _R, "instantiate"),
    Probe("cuLaunchKernel", 200, _D, "launch"),
    Probe("cuLaunchKernel_ptsz", 201, _D, "launch"),
    Probe("cuLaunchKernelEx", 202, _D, "launch_ex"),
    Probe("cuLaunchKernelEx_ptsz", 203, _D, "launch_ex"),
    Probe("cuLaunchCooperativeKernel", 204, _D, "launch"),
    Probe("cuLaunchCooperativeKernel_ptsz", 205, _D, "launch"),
    Probe("cuMemcpyHtoD_v2", 220, _D, "copy", 1),
    Probe("cuMemcpyHtoD_v2_ptds", 221, _D, "copy", 1),
    Probe("cuMemcpyDtoH_v2", 222, _D, "copy", 2),
    Probe("cuMemcpyDtoH_v2_ptds", 223, _D, "copy", 2),
    Probe("cuMemcpyDtoD_v2", 224, _D, "copy", 3),
    Probe("cuMemcpyDtoD_v2_ptds", 225, _D, "copy", 3),
    Probe("cuMemcpyHtoDAsync_v2", 226, _D, "copy_async", 1),
    Probe("cuMemcpyHtoDAsync_v2_ptsz", 227, _D, "copy_async", 1),
    Probe("cuMemcpyDtoHAsync_v2", 228, _D, "copy_async", 2),
    Probe("cuMemcpyDtoHAsync_v2_ptsz", 229, _D, "copy_async", 2),
    Probe("cuMemcpyDtoDAsync_v2", 230, _D, "copy_async", 3),
    Probe("cuMemcpyDtoDAsync_v2_ptsz", 231, _D, "copy_async", 3),
    Probe("cuMemcpy", 232, _D, "copy", 4),
    Probe("cuMemcpy_ptds", 233, _D, "copy", 4),
    Probe("cuMemcpyAsync", 234, _D, "copy_async", 4),
    Probe("cuMemcpyAsync_ptsz", 235, _D, "copy_async", 4),
    Probe("cuMemcpyPeer", 236, _D, "copy_peer"),
    Probe("cuMemcpyPeer_ptds", 237, _D, "copy_peer"),
    Probe("cuMemcpyPeerAsync", 238, _D, "copy_peer_async"),
    Probe("cuMemcpyPeerAsync_ptsz", 239, _D, "copy_peer_async"),
    Probe("cuMemsetD8_v2", 250, _D, "memset", 1),
    Probe("cuMemsetD8_v2_ptds", 251, _D, "memset", 1),
    Probe("cuMemsetD16_v2", 252, _D, "memset", 2),
    Probe("cuMemsetD16_v2_ptds", 253, _D, "memset", 2),
    Probe("cuMemsetD32_v2", 254, _D, "memset", 4),
    Probe("cuMemsetD32_v2_ptds", 255, _D, "memset", 4),
    Probe("cuMemsetD8Async", 256, _D, "memset_async", 1),
    Probe("cuMemsetD8Async_ptsz", 257, _D, "memset_async", 1),
    Probe("cuMemsetD16Async", 258, _D, "memset_async", 2),
    Probe("cuMemsetD16Async_ptsz", 259, _D, "memset_async", 2),
    Probe("cuMemsetD32Async", 260, _D, "memset_async", 4),
    Probe("cuMemsetD32Async_ptsz", 261, _D, "memset_async", 4),
    Probe("cuMemAlloc_v2", 280, _D, "alloc", 1),
    Probe("cuMemAllocAsync", 281, _D, "alloc_async"),
    Probe("cuMemAllocAsync_ptsz", 282, _D, "alloc_async"),
    Probe("cuMemAllocManaged", 283, _D, "alloc", 3),
    Probe("cuMemAllocHost_v2", 284, _D, "alloc", 4),
    Probe("cuMemHostAlloc", 285, _D, "alloc", 4),
    Probe("cuMemFree_v2", 290, _D, "free"),
    Probe("cuMemFreeAsync", 291, _D, "free_async"),
    Probe("cuMemFreeAsync_ptsz", 292, _D, "free_async"),
    Probe("cuMemFreeHost", 293, _D, "free"),
    Probe("cuStreamSynchronize", 300, _D, "sync", 1),
    Probe("cuStreamSynchronize_ptsz", 301, _D, "sync", 1),
    Probe("cuCtxSynchronize", 302, _D, "sync", 2),
    Probe("cuEventSynchronize", 303, _D, "sync", 3),
    Probe("cuGraphLaunch", 320, _D, "graph_launch"),
    Probe("cuGraphLaunch_ptsz", 321, _D, "graph_launch"),
    Probe("cuStreamBeginCapture_v2", 330, _D, "capture_begin"),
    Probe("cuStreamBeginCapture_v2_ptsz", 331, _D, "capture_begin"),
    Probe("cuStreamEndCapture", 332, _D, "capture_end"),
    Probe("cuStreamEndCapture_ptsz", 333, _D, "capture_end"),
    Probe("cuGraphInstantiateWithFlags", 334, _D, "instantiate"),
    Probe("cuGraphInstantiateWithParams", 335, _D, "instantiate"),
    Probe("cuGraphInstantiateWithParams_ptsz", 336, _D, "instantiate"),
    Probe("__cudaRegisterFunction", None, _R, "name"),
    Probe("__cudaGetKernel", None, _R, "handle"),
    Probe("cuModuleGetFunction", None, _D, "named_handle"),
    Probe("cuLibraryGetKernel", None, _D, "named_handle"),
    Probe("cuKernelGetFunction", None, _D, "handle"),
    Probe("cuModuleLoadData", None, _D, "handle"),
    Probe("cuModuleLoadDataEx", None, _D, "handle"),
    Probe("cuLibraryLoadData", None, _D, "handle"),
    Probe("cudaSetDevice", None, _R, "set_device"),
    Probe("cuDevicePrimaryCtxRetain", None, _D, "ctx_retain"),
    Probe("cuCtxCreate_v2", None, _D, "ctx_create"),
    Probe("cuCtxCreate_v3", None, _D, "ctx_create"),
    Probe("cuCtxCreate_v4", None, _D, "ctx_create"),
    Probe("cuCtxSetCurrent", None, _D, "ctx_set"),
    Probe("cuCtxPushCurrent_v2", None, _D, "ctx_push"),
    Probe("cuCtxPopCurrent_v2", None, _D, "ctx_pop"),
)

#: enum gf_api: the function that was called, in the table's order.
API_IDS: Final[dict[str, int]] = {p.name: p.api for p in PROBES if p.api is not None}
API_NAMES: Final[dict[int, str]] = {v: k for k, v in API_IDS.items()}

#: API functions whose probe completes at return (result, duration, out-pointer).
WITH_RETURN: Final[frozenset[str]] = frozenset(
    p.name for p in PROBES if p.api is not None and p.returns
)

#: The runtime and driver functions that have an api id (the rest of API_IDS is neither).
RUNTIME_APIS: Final[frozenset[str]] = frozenset(
    name for name, api in API_IDS.items() if api < DRIVER_API_BASE
)
DRIVER_APIS: Final[frozenset[str]] = frozenset(
    name for name, api in API_IDS.items() if api >= DRIVER_API_BASE
)

#: Functions with no api id, by layer: probed for kernel names and handle identities (struct
#: gf_name_event) or for the thread's device (DEVICE_FUNCTIONS); each has `<name>_entry` and,
#: where it completes at return, `<name>_return`.
RUNTIME_NAME_FUNCTIONS: Final[frozenset[str]] = frozenset(
    p.name for p in PROBES if p.api is None and p.layer == LAYER_RUNTIME
)
DRIVER_NAME_FUNCTIONS: Final[frozenset[str]] = frozenset(
    p.name for p in PROBES if p.api is None and p.layer == LAYER_DRIVER
)
#: The functions that keep the calling thread's device (bpf/cudart.bpf.c: thread_device).
DEVICE_FAMILIES: Final[frozenset[str]] = frozenset(
    {"set_device", "ctx_retain", "ctx_create", "ctx_set", "ctx_push", "ctx_pop"}
)
DEVICE_FUNCTIONS: Final[frozenset[str]] = frozenset(
    p.name for p in PROBES if p.family in DEVICE_FAMILIES
)
#: The functions with no api id whose probe completes at return.
NAME_WITH_RETURN: Final[frozenset[str]] = frozenset(
    p.name for p in PROBES if p.api is None and p.returns
)


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

#: struct gf_event (88 bytes; `reserved` is padding, not a field here).
EVENT_DTYPE: Final = np.dtype(
    {
        "names": [
            "ts_ns", "pid", "tid", "api", "type", "flags", "result",
            "duration_ns", "handle", "stream", "bytes", "dim", "device",
        ],
        "formats": [
            "<u8", "<u4", "<u4", "<u2", "u1", "u1", "<i4",
            "<u8", "<u8", "<u8", "<u8", ("<u4", (6,)), "<i4",
        ],
        "offsets": [0, 8, 12, 16, 18, 19, 20, 24, 32, 40, 48, 56, 80],
        "itemsize": 88,
    }
)

#: A slot's `committed` (struct gf_slot) is its position + 1 once its event is whole, with this
#: bit where it was freed with nothing in it (GF_SLOT_DISCARDED).
SLOT_DISCARDED: Final = 1 << 63

#: struct gf_slot: a slot of a CPU's event buffer.
SLOT_DTYPE: Final = np.dtype({
    "names": ["committed", "ev"],
    "formats": ["<u8", EVENT_DTYPE],
    "offsets": [0, 8],
    "itemsize": 8 + EVENT_DTYPE.itemsize,
})

#: struct gf_cpu_head: a CPU's buffer's `head` (the programs') and `tail` (the reader's).
CPU_HEAD_DTYPE: Final = np.dtype({
    "names": ["head", "tail"], "formats": ["<u8", "<u8"], "offsets": [0, 64], "itemsize": 128,
})

#: struct gf_name_event.
NAME_EVENT_DTYPE: Final = np.dtype(
    {
        "names": ["ts_ns", "pid", "kind", "flags", "handle", "aux", "name"],
        "formats": ["<u8", "<u4", "<u2", "<u2", "<u8", "<u8", f"S{NAME_MAX}"],
        "offsets": [0, 8, 12, 14, 16, 24, 32],
        "itemsize": 32 + NAME_MAX,
    }
)

#: Under overload the kernel counts events in its `aggregates` table (bpf/events.h struct
#: gf_agg_key, gf_agg_value) instead of recording them: by wall-clock slots of AGG_SLOT_NS, and
#: AGG_F_FAILED in the key's flags for a call that returned an error.
AGG_SLOT_NS: Final = 100_000_000
AGG_F_FAILED: Final = 0x4
AGG_KEY_DTYPE: Final = np.dtype(
    {
        "names": ["handle", "slot", "pid", "api", "type", "flags", "dim", "device", "gen"],
        "formats": ["<u8", "<u8", "<u4", "<u2", "u1", "u1", ("<u4", (6,)), "<i4", "<u4"],
        "offsets": [0, 8, 16, 20, 22, 23, 24, 48, 52],
        "itemsize": 56,
    }
)
AGG_VALUE_DTYPE: Final = np.dtype(
    [("count", "<u8"), ("bytes", "<u8"), ("duration_ns", "<u8"), ("first_ts_ns", "<u8"),
     ("last_ts_ns", "<u8")])
#: struct gf_agg_state (the one value of `agg_state`, written by user space).
AGG_STATE_DTYPE: Final = np.dtype([("wall_offset_ns", "<u8"), ("gen", "<u4"), ("pad", "<u4")])

#: User space's form of an aggregate (one entry of `aggregates`, its slot and generation left
#: out): `count` events of one process, api, kind and shape, as the key has them (`handle`,
#: `dim`, `device`; `flags`: F_ASYNC, F_HAS_RESULT, AGG_F_FAILED), made between `ts_ns` and
#: `last_ts_ns` (CLOCK_MONOTONIC in the kernel's, wall clock once enriched), with `bytes` and
#: `duration_ns` their sums. User space sets a graph launch's dim[GRAPH_KERNEL_NODES] as it
#: does an event's.
AGGREGATE_DTYPE: Final = np.dtype(
    [("ts_ns", "<u8"), ("last_ts_ns", "<u8"), ("pid", "<u4"), ("api", "<u2"), ("type", "u1"),
     ("flags", "u1"), ("device", "<i4"), ("handle", "<u8"), ("dim", "<u4", (6,)),
     ("count", "<u8"), ("bytes", "<u8"), ("duration_ns", "<u8")])

#: struct gf_text_ranges (the value of the `runtime_text` map).
TEXT_RANGES_DTYPE: Final = np.dtype(
    [("start", "<u8", (MAX_RUNTIME_RANGES,)), ("end", "<u8", (MAX_RUNTIME_RANGES,))]
)

#: struct gf_file_id (the key of the `quiet_files` map).
FILE_ID_DTYPE: Final = np.dtype(
    [("dev", "<u8"), ("ino", "<u8"), ("size", "<i8"), ("ctime_ns", "<i8")])

#: struct gf_loader_event.
LOADER_EVENT_DTYPE: Final = np.dtype(
    [("pid", "<u4"), ("held", "<u2"), ("reason", "<u2"), ("ts_ns", "<u8")])
#: struct gf_settled (the pinned tally's `settled` map; producer/publish/deadagents.py)
SETTLED_DTYPE: Final = np.dtype([("delivered", "<u8"), ("dropped", "<u8")])
#: enum gf_loader_reason
LOADER_MAPPED: Final = 0
LOADER_LISTEN: Final = 1
LOADER_EXIT: Final = 2

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

class DropSlot(IntEnum):
    """enum gf_drop_slot: the slots of the `drops` per-CPU array."""

    #: Events lost: not in the `events` ring buffer (full) nor counted in `aggregates` (full).
    EVENTS = 0
    #: Loader notifications lost.
    LOADER = 1
    #: Never counted.
    RESERVED = 2
    #: Name records lost because the `names` ring buffer was full.
    NAMES = 3
    #: Not a loss: driver calls made by a probed runtime, left out as the runtime's event.
    FORWARDED = 4
    #: Not a loss: dlopens in scope that mapped only quiet files (neither held nor notified).
    QUIET_LOADS = 5
    #: Not a loss: events counted in the `aggregates` table instead of recorded in the ring
    #: (under pressure over their process's share, or the ring full).
    AGGREGATED = 6
    #: Not a loss: calls in scope whose probe the kernel single-steps (COOKIE_STEPPED).
    STEPPED = 7
    #: Code paths: samples, or a new stack's frames, lost: their ring was full.
    PY_SAMPLES = 8


#: Slots in the `drops` array (GF_DROP_SLOTS).
DROP_SLOTS: Final = len(DropSlot)
DROP_EVENTS: Final = DropSlot.EVENTS
DROP_LOADER: Final = DropSlot.LOADER
DROP_NAMES: Final = DropSlot.NAMES
DROP_PY_SAMPLES: Final = DropSlot.PY_SAMPLES
FORWARDED: Final = DropSlot.FORWARDED
QUIET_LOADS: Final = DropSlot.QUIET_LOADS
AGGREGATED: Final = DropSlot.AGGREGATED
STEPPED: Final = DropSlot.STEPPED

#: GF_COOKIE_STEPPED: in a probe's attach cookie, the probe is at an instruction the kernel
#: single-steps (producer/discover/entrypoint.py); the program counts its calls in DropSlot.STEPPED.
COOKIE_STEPPED: Final = 1 << 63


# -- code paths (bpf/pywalk.bpf.h struct gf_py_stack) -------------------------------------------

#: Flags of a sampled stack.
PY_TRUNCATED: Final = 1
PY_NO_THREAD: Final = 2
PY_NEW: Final = 4
PY_NO_PYTHON: Final = 8
#: A call made on a thread with no Python frames (an autograd backward thread) while another
#: thread of its process was inside the autograd engine: the frames are that thread's, the
#: stack that entered the backward pass (bpf/cudart.bpf.c gf_backward_enter).
PY_BACKWARD: Final = 16

#: The autograd engine's entry, where a backward pass starts (libtorch_cpu.so exports it):
#: `torch::autograd::Engine::execute(roots, inputs, keep_graph, create_graph,
#: accumulate_grad, outputs)` (checked on 2.15), and its older form without accumulate_grad
#: (before 1.5, from the source's history; not checked on a build). The Python
#: binding (THPEngine_run_backward) calls it with the GIL released, on the thread that called
#: backward; the kernels it runs are launched on the engine's device threads.
AUTOGRAD_FUNCTIONS: Final[frozenset[str]] = frozenset({
    "_ZN5torch8autograd6Engine7executeERKSt6vectorINS0_4EdgeESaIS3_EERKS2_IN2at6TensorESaIS9_EEbbbS7_",
    "_ZN5torch8autograd6Engine7executeERKSt6vectorINS0_4EdgeESaIS3_EERKS2_IN2at6TensorESaIS9_EEbbS7_",
})
#: Where a Python process ends while its code objects are still there to be read: CPython's
#: finalization (libpython, or a python executable that exports it) and libc's `_exit`
#: (os._exit, and exit() after its handlers). `trace --stacks` holds a walked process there
#: until the new stacks' code objects are read (bpf/cudart.bpf.c gf_exit_hold).
EXIT_FUNCTIONS: Final[frozenset[str]] = frozenset({"Py_FinalizeEx", "_exit"})


def py_head_dtype() -> np.dtype[np.void]:
    """struct gf_py_stack's head: what every sample sends (ring `py_samples`)."""
    return np.dtype([("ts_ns", "<u8"), ("pid", "<u4"), ("tid", "<u4"), ("tstate", "<u8"),
                     ("depth", "<u4"), ("flags", "<u4"), ("stack_id", "<u8"),
                     ("caller", "<u8"), ("weight", "<u4"), ("pending", "<u4")])


def py_stack_dtype(max_depth: int) -> np.dtype[np.void]:
    """struct gf_py_stack with its frames (GF_PY_MAX_DEPTH of them), its scratch left out:
    a stack's first sample (ring `py_frames`)."""
    return np.dtype([*py_head_dtype().descr, ("code", "<u8", max_depth),
                     ("instr", "<u8", max_depth)])
