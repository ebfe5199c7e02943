"""The oracle: which CUDA runtime events the C workloads cause, written from their sources.

Written from capture.c, dlopen.c and gpuflight/demo/fusion.c (their header
comments), never from producer code. Events are compared as an unordered
multiset, in the JSON schema of gpuflight's records, keeping only the keys named
in KEYS (no ts_ns, pid, tid, pointer values, results or durations):

    every event   type (launch|memcpy|memset|alloc|free|sync|graph_launch),
                  api (the exact function name), layer ("runtime"), device (the
                  calling thread's CUDA device; 0 where an oracle does not say)
    launch        grid [x, y, z], block [x, y, z], shared_mem_bytes, stream
    memcpy        bytes, kind (H2H|H2D|D2H|D2D|default), async, stream
                  (Peer copies are D2D; 2D copies move width*height bytes;
                  synchronous copies have stream 0)
    memset        bytes (2D: width*height; 3D: width*height*depth), async, stream
    alloc         bytes, alloc_kind (device|device_async|managed|host_pinned|pool_async)
    free          nothing more
    sync          scope (stream|device|event), stream (the stream or event handle;
                  0 for the device)
    graph_launch  graph_exec, stream

Use project() to cut an actual event down to these keys and diff() to compare.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

Event = dict[str, object]

LAYER = "runtime"
DRIVER_LAYER = "driver"


def layer_of_api(api: str) -> str:
    """Driver API functions are named cu*, runtime ones cuda* (CUDA's own convention)."""
    return LAYER if api.startswith("cuda") else DRIVER_LAYER

COMMON_KEYS: tuple[str, ...] = ("type", "api", "layer", "device")
KEYS: dict[str, tuple[str, ...]] = {
    "launch": (*COMMON_KEYS, "grid", "block", "shared_mem_bytes", "stream"),
    "memcpy": (*COMMON_KEYS, "bytes", "kind", "async", "stream"),
    "memset": (*COMMON_KEYS, "bytes", "async", "stream"),
    "alloc": (*COMMON_KEYS, "bytes", "alloc_kind"),
    "free": COMMON_KEYS,
    "sync": (*COMMON_KEYS, "scope", "stream", "event"),
    "graph_launch": (*COMMON_KEYS, "graph_exec", "stream"),
    "graph_capture": (*COMMON_KEYS, "phase", "stream"),
    "graph_instantiate": COMMON_KEYS,
}
#: With names=True, diff() also compares these (kernel names, graph bookkeeping).
NAMED_KEYS: dict[str, tuple[str, ...]] = {
    "launch": ("kernel", "kernel_full", "captured"),
    "graph_launch": ("kernel_nodes",),
    "graph_capture": ("kernel_nodes",),
    "graph_instantiate": ("kernel_nodes",),
}


# ---- event constructors ---------------------------------------------------------


def launch(
    api: str,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem_bytes: int,
    stream: int,
) -> Event:
    return {
        "type": "launch",
        "api": api,
        "layer": layer_of_api(api),
        "grid": list(grid),
        "block": list(block),
        "shared_mem_bytes": shared_mem_bytes,
        "stream": stream,
    }


def memcpy(api: str, nbytes: int, kind: str, *, is_async: bool, stream: int = 0) -> Event:
    return {
        "type": "memcpy",
        "api": api,
        "layer": layer_of_api(api),
        "bytes": nbytes,
        "kind": kind,
        "async": is_async,
        "stream": stream,
    }


def memset(api: str, nbytes: int, *, is_async: bool, stream: int = 0) -> Event:
    return {
        "type": "memset",
        "api": api,
        "layer": layer_of_api(api),
        "bytes": nbytes,
        "async": is_async,
        "stream": stream,
    }


def alloc(api: str, nbytes: int, alloc_kind: str) -> Event:
    return {
        "type": "alloc",
        "api": api,
        "layer": layer_of_api(api),
        "bytes": nbytes,
        "alloc_kind": alloc_kind,
    }


def free(api: str) -> Event:
    return {"type": "free", "api": api, "layer": layer_of_api(api)}


def sync(api: str, scope: str, handle: int = 0) -> Event:
    """A wait; `handle` is the stream (scope stream) or the event (scope event)."""
    return {
        "type": "sync",
        "api": api,
        "layer": layer_of_api(api),
        "scope": scope,
        "stream": handle if scope == "stream" else 0,
        "event": handle if scope == "event" else None,
    }


def graph_launch(api: str, graph_exec: int, stream: int) -> Event:
    return {
        "type": "graph_launch",
        "api": api,
        "layer": layer_of_api(api),
        "graph_exec": graph_exec,
        "stream": stream,
    }


# ---- capture.c ------------------------------------------------------------------

CAPTURE_DEV_BYTES = 1 << 24
CAPTURE_HOST_BYTES = 1 << 20
CAPTURE_MAX_THREADS = 256


def capture_thread_events(t: int, iters: int) -> list[Event]:
    """What worker thread t (0-based) of capture calls."""
    stream = 0x1000 + t
    events: list[Event] = [
        alloc("cudaMalloc", CAPTURE_DEV_BYTES, "device"),
        alloc("cudaMallocHost", CAPTURE_HOST_BYTES, "host_pinned"),
    ]
    for _ in range(iters):
        events += [
            launch("cudaLaunchKernel", (t + 1, 2, 3), (128, 1, 1), 256, stream),
            launch("cudaLaunchKernel_ptsz", (64, 1, 1), (32, 4, 1), 0, 0),
            launch("cudaLaunchKernelExC", (8, 8, 1), (16, 16, 1), 1024, 0x2000 + t),
            launch("cudaLaunchCooperativeKernel", (4, 1, 1), (256, 1, 1), 0, 0),
            memcpy("cudaMemcpy", 4096 * (t + 1), "H2D", is_async=False),
            memcpy("cudaMemcpyAsync", CAPTURE_HOST_BYTES, "D2H", is_async=True, stream=stream),
            memset("cudaMemset", 1000, is_async=False),
            sync("cudaStreamSynchronize", "stream", stream),
        ]
    events += [free("cudaFree"), free("cudaFreeHost")]
    return events


def capture_after_join_events() -> list[Event]:
    """What capture's main thread calls after joining the workers."""
    return [
        graph_launch("cudaGraphLaunch", 0x3000, 0),
        sync("cudaDeviceSynchronize", "device", 0),
    ]


def capture_all_apis_events() -> list[Event]:
    """What `capture --all-apis` calls on top, in call order (capture.c's table)."""
    return [
        launch("cudaLaunchKernelExC_ptsz", (3, 5, 7), (32, 2, 2), 4096, 0x4001),
        launch("cudaLaunchCooperativeKernel_ptsz", (9, 1, 1), (64, 2, 1), 512, 0x4002),
        memcpy("cudaMemcpy_ptds", 1111, "D2D", is_async=False),
        memcpy("cudaMemcpyAsync_ptsz", 2222, "H2H", is_async=True, stream=0x4003),
        memcpy("cudaMemcpyPeer", 3333, "D2D", is_async=False),
        memcpy("cudaMemcpyPeerAsync", 4444, "D2D", is_async=True, stream=0x4004),
        memcpy("cudaMemcpy2D", 100 * 11, "D2H", is_async=False),
        memcpy("cudaMemcpy2D_ptds", 200 * 12, "H2D", is_async=False),
        memcpy("cudaMemcpy2DAsync", 300 * 13, "default", is_async=True, stream=0x4005),
        memcpy("cudaMemcpy2DAsync_ptsz", 400 * 14, "D2D", is_async=True, stream=0x4006),
        memset("cudaMemset_ptds", 5555, is_async=False),
        memset("cudaMemsetAsync", 6666, is_async=True, stream=0x4007),
        memset("cudaMemsetAsync_ptsz", 7777, is_async=True, stream=0x4008),
        memset("cudaMemset2D", 120 * 10, is_async=False),
        memset("cudaMemset2D_ptds", 130 * 10, is_async=False),
        memset("cudaMemset2DAsync", 140 * 10, is_async=True, stream=0x4009),
        memset("cudaMemset2DAsync_ptsz", 150 * 10, is_async=True, stream=0x400A),
        memset("cudaMemset3D", 16 * 4 * 2, is_async=False),
        memset("cudaMemset3D_ptds", 17 * 4 * 2, is_async=False),
        memset("cudaMemset3DAsync", 18 * 4 * 2, is_async=True, stream=0x400B),
        memset("cudaMemset3DAsync_ptsz", 19 * 4 * 2, is_async=True, stream=0x400C),
        alloc("cudaMallocAsync", 10001, "device_async"),
        alloc("cudaMallocAsync_ptsz", 10002, "device_async"),
        alloc("cudaMallocManaged", 10003, "managed"),
        alloc("cudaHostAlloc", 10004, "host_pinned"),
        alloc("cudaMallocFromPoolAsync", 10005, "pool_async"),
        alloc("cudaMallocFromPoolAsync_ptsz", 10006, "pool_async"),
        free("cudaFreeAsync"),
        free("cudaFreeAsync_ptsz"),
        sync("cudaStreamSynchronize_ptsz", "stream", 0x4013),
        sync("cudaEventSynchronize", "event", 0x6000),
        graph_launch("cudaGraphLaunch_ptsz", 0x3001, 0x4014),
    ]


def capture_events(threads: int, iters: int, all_apis: bool = False) -> list[Event]:
    """Every event of `capture --threads T --iters N [--all-apis]` (an unordered multiset)."""
    if not 0 <= threads <= CAPTURE_MAX_THREADS:
        raise ValueError(f"capture runs 0..{CAPTURE_MAX_THREADS} threads, not {threads}")
    if iters < 0:
        raise ValueError(f"iters must be >= 0, not {iters}")
    events: list[Event] = []
    for t in range(threads):
        events += capture_thread_events(t, iters)
    events += capture_after_join_events()
    if all_apis:
        events += capture_all_apis_events()
    return events


#: Every function of bpf/events.h. `capture --all-apis` calls each at least once
#: (checked by tests against capture_events).
ALL_APIS: tuple[str, ...] = (
    "cudaLaunchKernel",
    "cudaLaunchKernel_ptsz",
    "cudaLaunchKernelExC",
    "cudaLaunchKernelExC_ptsz",
    "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernel_ptsz",
    "cudaMemcpy",
    "cudaMemcpy_ptds",
    "cudaMemcpyAsync",
    "cudaMemcpyAsync_ptsz",
    "cudaMemcpyPeer",
    "cudaMemcpyPeerAsync",
    "cudaMemcpy2D",
    "cudaMemcpy2D_ptds",
    "cudaMemcpy2DAsync",
    "cudaMemcpy2DAsync_ptsz",
    "cudaMemset",
    "cudaMemset_ptds",
    "cudaMemsetAsync",
    "cudaMemsetAsync_ptsz",
    "cudaMemset2D",
    "cudaMemset2D_ptds",
    "cudaMemset2DAsync",
    "cudaMemset2DAsync_ptsz",
    "cudaMemset3D",
    "cudaMemset3D_ptds",
    "cudaMemset3DAsync",
    "cudaMemset3DAsync_ptsz",
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
    "cudaGraphLaunch",
    "cudaGraphLaunch_ptsz",
)


# ---- dlopen.c -------------------------------------------------------------------


def dlopen_events(iters: int) -> list[Event]:
    """Every event of `dlopen --lib PATH --iters N`."""
    events: list[Event] = []
    for _ in range(iters):
        events.append(launch("cudaLaunchKernel", (7, 1, 1), (64, 1, 1), 0, 0))
        events.append(memcpy("cudaMemcpy", 512, "H2H", is_async=False))
    return events


# ---- devices.c (on gpuflight/simgpu with two devices) ----------------------------


def devices_events() -> list[Event]:
    """Every event of `devices`: launches, block (32,1,1), told apart by grid x, each on the
    device its thread had current."""
    runtime = [("cudaLaunchKernel", g, d) for g, d in ((1, 0), (2, 1), (3, 1), (4, 1), (5, 0))]
    driver = [("cuLaunchKernel", g, d) for g, d in ((6, 0), (7, 1), (8, 0), (9, 1), (10, 0),
                                                       (11, 1))]
    return [{**launch(api, (g, 1, 1), (32, 1, 1), 0, 0), "device": d}
            for api, g, d in runtime + driver]


def devices_launches_per_device() -> list[int]:
    """Launches of `devices` per device (0, 1), as the simulated driver counts them."""
    events = devices_events()
    return [sum(1 for e in events if e["device"] == d) for d in (0, 1)]


# ---- gpuflight/demo/fusion.c -----------------------------------------------------

FUSION_MODES: tuple[str, ...] = ("unfused", "fused")
FUSION_DEFAULT_STEPS = 10000
FUSION_OPS = 8
FUSION_BATCH_BYTES = 512 * 1024
FUSION_RESULT_BYTES = 4096
FUSION_ELEMS = FUSION_BATCH_BYTES // 4
FUSION_UNFUSED_GRID = (32, 1, 1)
FUSION_UNFUSED_BLOCK = (256, 1, 1)
FUSION_FUSED_GRID = (FUSION_ELEMS // 256, 1, 1)
FUSION_FUSED_BLOCK = (256, 1, 1)


def _fusion_mode(mode: str) -> bool:
    if mode not in FUSION_MODES:
        raise ValueError(f"fusion mode is unfused or fused, not {mode!r}")
    return mode == "fused"


def fusion_launches(mode: str, steps: int = FUSION_DEFAULT_STEPS) -> int:
    """cudaLaunchKernel calls of `fusion --mode MODE --steps N` (also the stub's "kernels")."""
    return steps if _fusion_mode(mode) else FUSION_OPS * steps


def fusion_step_events(mode: str) -> list[Event]:
    """The events of one fusion step."""
    if _fusion_mode(mode):
        kernels = [
            launch("cudaLaunchKernel", FUSION_FUSED_GRID, FUSION_FUSED_BLOCK, 0, 0),
        ]
    else:
        kernels = [
            launch("cudaLaunchKernel", FUSION_UNFUSED_GRID, FUSION_UNFUSED_BLOCK, 0, 0)
            for _ in range(FUSION_OPS)
        ]
    return [
        memcpy("cudaMemcpy", FUSION_BATCH_BYTES, "H2D", is_async=False),
        *kernels,
        memcpy("cudaMemcpyAsync", FUSION_RESULT_BYTES, "D2H", is_async=True, stream=0),
        sync("cudaStreamSynchronize", "stream", 0),
    ]


def fusion_events(mode: str, steps: int = FUSION_DEFAULT_STEPS) -> list[Event]:
    """Every event of `fusion --mode MODE --steps N`."""
    _fusion_mode(mode)
    setup = [
        alloc("cudaMalloc", FUSION_BATCH_BYTES, "device"),
        alloc("cudaMalloc", FUSION_BATCH_BYTES, "device"),
        alloc("cudaMallocHost", FUSION_BATCH_BYTES, "host_pinned"),
        alloc("cudaMallocHost", FUSION_RESULT_BYTES, "host_pinned"),
    ]
    teardown = [free("cudaFree"), free("cudaFree"), free("cudaFreeHost"), free("cudaFreeHost")]
    return [*setup, *fusion_step_events(mode) * steps, *teardown]


def fusion_call_counts(mode: str, steps: int = FUSION_DEFAULT_STEPS) -> Counter[str]:
    """Calls per API of `fusion --mode MODE --steps N`."""
    return api_counts(fusion_events(mode, steps))


# ---- names and graphs (for diff(..., names=True)) -------------------------------


def named(event: Event, short: str, full: str | None = None, captured: bool = False) -> Event:
    """A launch event with its kernel name (full defaults to short: not mangled)."""
    return {**event, "kernel": short, "kernel_full": full or short, "captured": captured}


def capture(api: str, phase: str, stream: int, kernel_nodes: int | None = None) -> Event:
    return {"type": "graph_capture", "api": api, "layer": layer_of_api(api), "phase": phase,
            "stream": stream, "kernel_nodes": kernel_nodes}


def instantiate(api: str, kernel_nodes: int | None) -> Event:
    return {"type": "graph_instantiate", "api": api, "layer": layer_of_api(api),
            "kernel_nodes": kernel_nodes}


def graph_replay(api: str, graph_exec: int, stream: int, kernel_nodes: int | None) -> Event:
    return {**graph_launch(api, graph_exec, stream), "kernel_nodes": kernel_nodes}


# ---- driver.c -------------------------------------------------------------------

TRITON_KERNEL = "triton_poi_fused_add_mul_0"
JAX_FUSION = "fusion_12"
JAX_REDUCE_MANGLED = "_ZN3xla3gpu12_GLOBAL__N_113reduce_kernelIfLi256EEEvPKT_PS3_i"
JAX_REDUCE = ("void xla::gpu::(anonymous namespace)::reduce_kernel<float, 256>"
              "(float const*, float*, int)")
JAX_REDUCE_SHORT = "xla::gpu::(anonymous namespace)::reduce_kernel"


def no_handles(x: int) -> int:
    return x


def memory_handles(base: int) -> Callable[[int], int]:
    """driver --handles-in-memory: made-up handle X is BASE + (X & 0xfff) * 64."""
    return lambda x: base + (x & 0xFFF) * 64


def triton_events(iters: int, h: Callable[[int], int] = no_handles,
                  names: bool = True) -> list[Event]:
    """`driver --mode triton --iters N` (with the stub driver's names unless `names`)."""
    kernel = launch("cuLaunchKernelEx", (64, 1, 1), (128, 1, 1), 1024, h(0x7001))
    return [
        alloc("cuMemAlloc_v2", 1 << 20, "device"),
        *[named(kernel, TRITON_KERNEL) if names else kernel] * iters,
        sync("cuStreamSynchronize", "stream", h(0x7001)),
        free("cuMemFree_v2"),
    ]


def jax_events(iters: int, h: Callable[[int], int] = no_handles) -> list[Event]:
    """`driver --mode jax --iters N` on the stub driver, names and graph included."""
    fusion = launch("cuLaunchKernel", (7, 8, 9), (32, 4, 2), 48, h(0x7002))
    reduce = launch("cuLaunchKernel", (1, 2, 3), (64, 1, 1), 0, h(0x7002))
    captured = launch("cuLaunchKernel", (7, 8, 9), (32, 4, 2), 48, h(0x7003))
    return [
        alloc("cuMemAlloc_v2", 65536, "device"),
        memcpy("cuMemcpyHtoDAsync_v2", 4096, "H2D", is_async=True, stream=h(0x7002)),
        *[named(fusion, JAX_FUSION), named(reduce, JAX_REDUCE_SHORT, JAX_REDUCE)] * iters,
        capture("cuStreamBeginCapture_v2", "begin", h(0x7003)),
        *[named(captured, JAX_FUSION, captured=True)] * 2,
        capture("cuStreamEndCapture", "end", h(0x7003), kernel_nodes=2),
        instantiate("cuGraphInstantiateWithFlags", 2),
        *[graph_replay("cuGraphLaunch", 0xB0001, h(0x7002), 2)] * 3,
        memcpy("cuMemcpyDtoHAsync_v2", 4096, "D2H", is_async=True, stream=h(0x7002)),
        sync("cuStreamSynchronize", "stream", h(0x7002)),
        free("cuMemFree_v2"),
    ]


def driver_all_events(h: Callable[[int], int] = no_handles) -> list[Event]:
    """`driver --mode all`: every probed driver function once, in events.h order.
    Without names (the real driver makes no handles); graph execs as passed."""
    s = h
    return [
        launch("cuLaunchKernel", (1, 2, 3), (4, 5, 6), 100, s(0x8000)),
        launch("cuLaunchKernel_ptsz", (2, 1, 1), (64, 1, 1), 0, s(0)),
        launch("cuLaunchKernelEx", (3, 5, 7), (32, 2, 2), 4096, s(0x8001)),
        launch("cuLaunchKernelEx_ptsz", (3, 5, 7), (32, 2, 2), 8192, s(0x8002)),
        launch("cuLaunchCooperativeKernel", (9, 1, 1), (256, 1, 1), 512, s(0x8003)),
        launch("cuLaunchCooperativeKernel_ptsz", (10, 1, 1), (128, 2, 1), 256, s(0x8004)),
        memcpy("cuMemcpyHtoD_v2", 1001, "H2D", is_async=False),
        memcpy("cuMemcpyHtoD_v2_ptds", 1002, "H2D", is_async=False),
        memcpy("cuMemcpyDtoH_v2", 1003, "D2H", is_async=False),
        memcpy("cuMemcpyDtoH_v2_ptds", 1004, "D2H", is_async=False),
        memcpy("cuMemcpyDtoD_v2", 1005, "D2D", is_async=False),
        memcpy("cuMemcpyDtoD_v2_ptds", 1006, "D2D", is_async=False),
        memcpy("cuMemcpyHtoDAsync_v2", 1007, "H2D", is_async=True, stream=s(0x8005)),
        memcpy("cuMemcpyHtoDAsync_v2_ptsz", 1008, "H2D", is_async=True, stream=s(0x8006)),
        memcpy("cuMemcpyDtoHAsync_v2", 1009, "D2H", is_async=True, stream=s(0x8007)),
        memcpy("cuMemcpyDtoHAsync_v2_ptsz", 1010, "D2H", is_async=True, stream=s(0x8008)),
        memcpy("cuMemcpyDtoDAsync_v2", 1011, "D2D", is_async=True, stream=s(0x8009)),
        memcpy("cuMemcpyDtoDAsync_v2_ptsz", 1012, "D2D", is_async=True, stream=s(0x800A)),
        memcpy("cuMemcpy", 1013, "default", is_async=False),
        memcpy("cuMemcpy_ptds", 1014, "default", is_async=False),
        memcpy("cuMemcpyAsync", 1015, "default", is_async=True, stream=s(0x800B)),
        memcpy("cuMemcpyAsync_ptsz", 1016, "default", is_async=True, stream=s(0x800C)),
        memcpy("cuMemcpyPeer", 1017, "D2D", is_async=False),
        memcpy("cuMemcpyPeer_ptds", 1018, "D2D", is_async=False),
        memcpy("cuMemcpyPeerAsync", 1019, "D2D", is_async=True, stream=s(0x800D)),
        memcpy("cuMemcpyPeerAsync_ptsz", 1020, "D2D", is_async=True, stream=s(0x800E)),
        memset("cuMemsetD8_v2", 2001, is_async=False),
        memset("cuMemsetD8_v2_ptds", 2002, is_async=False),
        memset("cuMemsetD16_v2", 2003 * 2, is_async=False),
        memset("cuMemsetD16_v2_ptds", 2004 * 2, is_async=False),
        memset("cuMemsetD32_v2", 2005 * 4, is_async=False),
        memset("cuMemsetD32_v2_ptds", 2006 * 4, is_async=False),
        memset("cuMemsetD8Async", 2007, is_async=True, stream=s(0x800F)),
        memset("cuMemsetD8Async_ptsz", 2008, is_async=True, stream=s(0x8010)),
        memset("cuMemsetD16Async", 2009 * 2, is_async=True, stream=s(0x8011)),
        memset("cuMemsetD16Async_ptsz", 2010 * 2, is_async=True, stream=s(0x8012)),
        memset("cuMemsetD32Async", 2011 * 4, is_async=True, stream=s(0x8013)),
        memset("cuMemsetD32Async_ptsz", 2012 * 4, is_async=True, stream=s(0x8014)),
        alloc("cuMemAlloc_v2", 3001, "device"),
        alloc("cuMemAllocAsync", 3002, "device_async"),
        alloc("cuMemAllocAsync_ptsz", 3003, "device_async"),
        alloc("cuMemAllocManaged", 3004, "managed"),
        alloc("cuMemAllocHost_v2", 3005, "host_pinned"),
        alloc("cuMemHostAlloc", 3006, "host_pinned"),
        free("cuMemFree_v2"),
        free("cuMemFreeAsync"),
        free("cuMemFreeAsync_ptsz"),
        free("cuMemFreeHost"),
        sync("cuStreamSynchronize", "stream", s(0x8019)),
        sync("cuStreamSynchronize_ptsz", "stream", s(0x801A)),
        sync("cuCtxSynchronize", "device"),
        sync("cuEventSynchronize", "event", s(0x6001)),
        graph_launch("cuGraphLaunch", s(0x3101), s(0x801B)),
        graph_launch("cuGraphLaunch_ptsz", s(0x3102), s(0x801C)),
        capture("cuStreamBeginCapture_v2", "begin", s(0x801D)),
        capture("cuStreamBeginCapture_v2_ptsz", "begin", s(0x801E)),
        capture("cuStreamEndCapture", "end", s(0x801D)),
        capture("cuStreamEndCapture_ptsz", "end", s(0x801E)),
        instantiate("cuGraphInstantiateWithFlags", None),
        instantiate("cuGraphInstantiateWithParams", None),
        instantiate("cuGraphInstantiateWithParams_ptsz", None),
    ]


# ---- nvccstyle.c ----------------------------------------------------------------

NVCC_SCALE = ("scale", "scale(float*, int)")
NVCC_AXPY = ("axpy", "void axpy<float, 4>(float*, float, int)")
NVCC_GEMM = ("cutlass::Kernel",
             "void cutlass::Kernel<cutlass::gemm::kernel::Gemm<float, 128> >"
             "(cutlass::gemm::kernel::Gemm<float, 128>::Params)")
NVCC_UNREGISTERED = ("unregistered", "unregistered(float*)")


def nvccstyle_events(iters: int, replays: int, late: bool = False) -> list[Event]:
    """`nvccstyle --iters N --replays R`: runtime events only, whatever the runtime asks
    of the driver; with kernel names and graph kernel nodes. `late`: what a tracer sees
    that attached while `--wait-file` held the program (after registration, the
    allocation and one iteration)."""
    def kernel(api: str, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
               stream: int, *, name: tuple[str, str], captured: bool = False) -> Event:
        return named(launch(api, grid, block, smem, stream), *name, captured=captured)

    step = [
        kernel("cudaLaunchKernel", (16, 1, 1), (256, 1, 1), 0, 0x9000, name=NVCC_SCALE),
        kernel("cudaLaunchKernel", (8, 2, 1), (128, 1, 1), 0, 0x9000, name=NVCC_AXPY),
        kernel("cudaLaunchKernelExC", (4, 4, 1), (32, 8, 1), 2048, 0x9000, name=NVCC_GEMM),
        kernel("cudaLaunchKernel", (1, 1, 1), (32, 1, 1), 0, 0x9000, name=NVCC_UNREGISTERED),
        memcpy("cudaMemcpy", 4096, "H2D", is_async=False),
    ]
    scale = kernel("cudaLaunchKernel", (16, 1, 1), (256, 1, 1), 0, 0x9001, name=NVCC_SCALE,
                   captured=True)
    axpy = kernel("cudaLaunchKernel", (8, 2, 1), (128, 1, 1), 0, 0x9001, name=NVCC_AXPY,
                  captured=True)
    return [
        *([] if late else [alloc("cudaMalloc", 4096, "device")]),
        *step * iters,
        capture("cudaStreamBeginCapture", "begin", 0x9001),
        scale, scale, axpy,
        capture("cudaStreamEndCapture", "end", 0x9001, kernel_nodes=3),
        instantiate("cudaGraphInstantiate", 3),
        *[graph_replay("cudaGraphLaunch", 0xB0001, 0x9002, 3)] * replays,
        sync("cudaStreamSynchronize", "stream", 0x9002),
        sync("cudaDeviceSynchronize", "device"),
        free("cudaFree"),
    ]


# ---- comparing ------------------------------------------------------------------


def project(event: Mapping[str, object], names: bool = False) -> Event:
    """An actual event cut down to the keys the oracle speaks about (KEYS[type], and
    NAMED_KEYS[type] with `names`)."""
    etype = str(event.get("type"))
    keys = KEYS.get(etype, COMMON_KEYS) + (NAMED_KEYS.get(etype, ()) if names else ())
    return {key: event.get(key) for key in keys}


def _canonical(event: Mapping[str, object]) -> str:
    return json.dumps(event, sort_keys=True)


def diff(
    expected: Iterable[Mapping[str, object]],
    actual: Iterable[Mapping[str, object]],
    names: bool = False,
) -> tuple[list[Event], list[Event]]:
    """(missing, unexpected): multiset difference of expected and projected actual events."""
    want = Counter(_canonical(project({"device": 0, **e}, names)) for e in expected)
    got = Counter(_canonical(project(e, names)) for e in actual)
    missing: list[Event] = []
    unexpected: list[Event] = []
    for key, n in (want - got).items():
        missing += [json.loads(key)] * n
    for key, n in (got - want).items():
        unexpected += [json.loads(key)] * n
    return missing, unexpected


def api_counts(events: Iterable[Mapping[str, object]]) -> Counter[str]:
    """How many events each API produced."""
    return Counter(str(e["api"]) for e in events)
