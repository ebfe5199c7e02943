"""The oracle: which CUDA runtime events the C workloads cause, written from their sources.

Written from capture.c, dlopen.c and producer/demo/fusion.c (their header
comments), never from producer code. Events are compared as an unordered
multiset, in the JSON schema of gpuflight's records, keeping only the keys named
in KEYS (no ts_ns, pid, tid, pointer values, results or durations):

    every event   type (launch|memcpy|memset|alloc|free|sync|graph_launch),
                  api (the exact function name), layer ("runtime")
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
from collections.abc import Iterable, Mapping

Event = dict[str, object]

LAYER = "runtime"

COMMON_KEYS: tuple[str, ...] = ("type", "api", "layer")
KEYS: dict[str, tuple[str, ...]] = {
    "launch": (*COMMON_KEYS, "grid", "block", "shared_mem_bytes", "stream"),
    "memcpy": (*COMMON_KEYS, "bytes", "kind", "async", "stream"),
    "memset": (*COMMON_KEYS, "bytes", "async", "stream"),
    "alloc": (*COMMON_KEYS, "bytes", "alloc_kind"),
    "free": COMMON_KEYS,
    "sync": (*COMMON_KEYS, "scope", "stream", "event"),
    "graph_launch": (*COMMON_KEYS, "graph_exec", "stream"),
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
        "layer": LAYER,
        "grid": list(grid),
        "block": list(block),
        "shared_mem_bytes": shared_mem_bytes,
        "stream": stream,
    }


def memcpy(api: str, nbytes: int, kind: str, *, is_async: bool, stream: int = 0) -> Event:
    return {
        "type": "memcpy",
        "api": api,
        "layer": LAYER,
        "bytes": nbytes,
        "kind": kind,
        "async": is_async,
        "stream": stream,
    }


def memset(api: str, nbytes: int, *, is_async: bool, stream: int = 0) -> Event:
    return {
        "type": "memset",
        "api": api,
        "layer": LAYER,
        "bytes": nbytes,
        "async": is_async,
        "stream": stream,
    }


def alloc(api: str, nbytes: int, alloc_kind: str) -> Event:
    return {"type": "alloc", "api": api, "layer": LAYER, "bytes": nbytes, "alloc_kind": alloc_kind}


def free(api: str) -> Event:
    return {"type": "free", "api": api, "layer": LAYER}


def sync(api: str, scope: str, handle: int = 0) -> Event:
    """A wait; `handle` is the stream (scope stream) or the event (scope event)."""
    return {
        "type": "sync",
        "api": api,
        "layer": LAYER,
        "scope": scope,
        "stream": handle if scope == "stream" else 0,
        "event": handle if scope == "event" else None,
    }


def graph_launch(api: str, graph_exec: int, stream: int) -> Event:
    return {
        "type": "graph_launch",
        "api": api,
        "layer": LAYER,
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


# ---- producer/demo/fusion.c -----------------------------------------------------

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


# ---- comparing ------------------------------------------------------------------


def project(event: Mapping[str, object]) -> Event:
    """An actual event cut down to the keys the oracle speaks about (KEYS[type])."""
    keys = KEYS.get(str(event.get("type")), COMMON_KEYS)
    return {key: event.get(key) for key in keys}


def _canonical(event: Mapping[str, object]) -> str:
    return json.dumps(event, sort_keys=True)


def diff(
    expected: Iterable[Mapping[str, object]], actual: Iterable[Mapping[str, object]]
) -> tuple[list[Event], list[Event]]:
    """(missing, unexpected): multiset difference of expected and projected actual events."""
    want = Counter(_canonical(e) for e in expected)
    got = Counter(_canonical(project(e)) for e in actual)
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
