"""One set of events through both counting paths, and the figures each shows.

- the trace: `producer.decode.summary.Summary` (what `gpuflight trace` prints) and the printed text;
- the stream app: the events as the producer publishes them (one wire message per process
  and time slice), decoded, applied to a job's windows (`streams.windows.JobState`, the
  worker's pure state) and closed into InfluxDB points, summed over the windows as
  `gpuflight report` sums them.

`figures_of_summary` and `figures_of_points` give the same keys, so a test compares every
shared figure at once; `events_from_json` rebuilds records from `--output` lines (every field
the counting reads survives the round trip).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import (
    AGG_F_FAILED,
    AGG_SLOT_NS,
    AGGREGATE_DTYPE,
    ALLOC_KINDS,
    API_IDS,
    CAPTURE_BEGIN,
    CAPTURE_END,
    CAPTURE_KERNEL_NODES,
    COPY_KINDS,
    EVENT_DTYPE,
    F_ASYNC,
    F_BYTES_KNOWN,
    F_CAPTURED,
    F_HAS_RESULT,
    GRAPH_KERNEL_NODES,
    SYNC_SCOPES,
    TYPE_NAMES,
    EventType,
)
from gpuflight.producer.contract.counting import GRAPH_LAUNCH_APIS
from gpuflight.producer.decode.summary import Summary
from gpuflight.streams import measurements as m
from gpuflight.streams.measurements import Fields, Point, Tags
from gpuflight.streams.windows import JobState, WindowSettings
from tests.support.builders import stamped_events

Events = npt.NDArray[np.void]
Figures = dict[str, Any]

_TYPE_IDS = {name: value for value, name in TYPE_NAMES.items()}
_ALLOC_KIND_IDS = {name: value for value, name in ALLOC_KINDS.items()}
_SCOPE_IDS = {name: value for value, name in SYNC_SCOPES.items()}


# -- hand-made events ------------------------------------------------------------------------

S = 1_000_000_000
OK = {"flags": F_HAS_RESULT, "result": 0}


def launch(grid: int = 8, block: int = 32, api: str = "cudaLaunchKernel", **kw: Any
           ) -> dict[str, Any]:
    return {"type": EventType.LAUNCH, "api": API_IDS[api], "handle": 0xA0,
            "dim": [grid, 1, 1, block, 1, 1], **kw}


def graph(nodes: int, api: str = "cudaGraphLaunch", **kw: Any) -> dict[str, Any]:
    return {"type": EventType.GRAPH_LAUNCH, "api": API_IDS[api], "handle": 0xE0,
            "dim": [nodes, 0, 0, 0, 0, 0], **kw}


def copy(kind: int, nbytes: int, ns: int, api: str = "cudaMemcpy", **kw: Any
         ) -> dict[str, Any]:
    timed = {"duration_ns": ns, **OK} if "Async" not in api else {"flags": F_ASYNC}
    return {"type": EventType.MEMCPY, "api": API_IDS[api], "bytes": nbytes,
            "dim": [kind, 0, 0, 0, 0, 0], **timed, **kw}


def alloc(ptr: int, nbytes: int, **kw: Any) -> dict[str, Any]:
    return {"type": EventType.ALLOC, "api": API_IDS["cudaMalloc"], "handle": ptr,
            "bytes": nbytes, "dim": [1, 0, 0, 0, 0, 0], "duration_ns": 10, **OK, **kw}


def free(ptr: int, nbytes: int | None, **kw: Any) -> dict[str, Any]:
    known = {} if nbytes is None else {"bytes": nbytes, "flags": F_HAS_RESULT | F_BYTES_KNOWN}
    return {"type": EventType.FREE, "api": API_IDS["cudaFree"], "handle": ptr,
            "duration_ns": 10, **OK, **known, **kw}


def sync(scope: int, ns: int, **kw: Any) -> dict[str, Any]:
    api = {1: "cudaStreamSynchronize", 2: "cudaDeviceSynchronize", 3: "cudaEventSynchronize"}
    return {"type": EventType.SYNC, "api": API_IDS[api[scope]], "duration_ns": ns,
            "dim": [scope, 0, 0, 0, 0, 0], **OK, **kw}


#: What `synthetic_events` holds, by its script.
SYNTHETIC_KERNEL_LAUNCHES = 600
SYNTHETIC_CAPTURED = len(range(0, 600, 25))
SYNTHETIC_GRAPH_LAUNCHES = len(range(0, 600, 10))
SYNTHETIC_GRAPH_KERNEL_NODES = 3 * len(range(10, 600, 20))
SYNTHETIC_FAILED = {"allocations": len(range(0, 600, 30)), "copies": len(range(0, 600, 49)),
                    "syncs": len(range(0, 600, 33))}
SYNTHETIC_PIDS = (100, 101)


def synthetic_events(t0: int) -> Events:
    """Two processes over three seconds from `t0`: kernel launches (some captured into a
    graph), graph launches (kernel nodes known and not), copies of every kind (synchronous,
    async, failed, of an unknown kind), failed allocations and syncs, memsets, frees known,
    unknown and of null. Memory events are all one process's (a job's live bytes are its
    processes' together, in time order)."""
    rng = np.random.default_rng(17)
    rows: list[dict[str, Any]] = []
    for i in range(SYNTHETIC_KERNEL_LAUNCHES):
        pid = SYNTHETIC_PIDS[i % 2]
        rows.append(launch(grid=int(rng.choice([8, 64, 4096])), block=int(rng.choice([32, 256])),
                           api=str(rng.choice(["cudaLaunchKernel", "cuLaunchKernel"])),
                           handle=0xA0 + 0x10 * int(rng.integers(0, 5)), pid=pid))
        if i % 25 == 0:
            rows.append(launch(grid=16, flags=F_CAPTURED, pid=pid))
        if i % 10 == 0:
            rows.append(graph(3 if i % 20 else 0, pid=pid))
        if i % 7 == 0:
            rows.append(copy(int(rng.integers(0, 6)), int(rng.integers(1, 1 << 20)),
                             int(rng.integers(1, 10**6)), pid=pid,
                             result=700 if i % 49 == 0 else 0))
        if i % 9 == 0:
            rows.append(copy(2, 4096, 0, api="cudaMemcpyAsync", pid=pid))
        if i % 11 == 0:
            rows.append(sync(int(rng.integers(1, 4)), int(rng.integers(1, 10**6)), pid=pid,
                             result=4 if i % 33 == 0 else 0))
        if i % 13 == 0:
            rows.append({"type": EventType.MEMSET, "api": API_IDS["cudaMemsetAsync"],
                         "bytes": 256, "flags": F_ASYNC, "pid": pid})
        if i % 30 == 0:
            owner = SYNTHETIC_PIDS[0]
            ptr = 0x1000 + i
            rows.append(alloc(ptr, 1 << 20, pid=owner))
            rows.append(alloc(0, 1 << 40, result=2, pid=owner))
            rows.append(free(ptr - 30 if i else 0, (1 << 20) if i else None, pid=owner))
            rows.append(free(0x9, None, pid=owner))  # allocated before the trace
    events = stamped_events(rows)
    events["ts_ns"] = t0 + np.arange(len(events), dtype=np.uint64) * (3 * S // len(events))
    return events


# -- the kernel's aggregates -------------------------------------------------------------------


def aggregates_of(events: Events) -> Events:
    """The aggregates (AGGREGATE_DTYPE) the kernel would make of enriched `events` had it shed
    them all: bpf/cudart.bpf.c's gf_aggregate, in Python — one per process, api, type, flags
    (async, timed, failed), device, kernel (launches: the handle; graph launches: the exec;
    frees: whether the pointer was not null), shape (launches: all of dim; else dim[0]) and
    wall-clock slot of AGG_SLOT_NS; bytes summed for launches, copies, memsets and
    allocations, durations for timed calls. A graph launch's kernel nodes (dim[0], which user
    space sets from its exec) are as the events have them."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    c = {name: events[name].tolist() for name in events.dtype.names or ()}
    for i in range(len(events)):
        etype, flags = c["type"][i], c["flags"][i]
        key_flags = flags & (F_ASYNC | F_HAS_RESULT)
        if flags & F_HAS_RESULT and c["result"][i] != 0:
            key_flags |= AGG_F_FAILED
        dim = tuple(c["dim"][i]) if etype == EventType.LAUNCH else (c["dim"][i][0], 0, 0, 0, 0, 0)
        handle = c["handle"][i]
        if etype == EventType.FREE:
            handle = int(handle != 0)
        elif etype not in (EventType.LAUNCH, EventType.GRAPH_LAUNCH):
            handle = 0
        key = (c["pid"][i], c["api"][i], etype, key_flags, c["device"][i], handle, dim,
               c["ts_ns"][i] // AGG_SLOT_NS)
        groups.setdefault(key, []).append(i)
    out = np.zeros(len(groups), dtype=AGGREGATE_DTYPE)
    for row, (key, rows) in enumerate(groups.items()):
        pid, api, etype, key_flags, device, handle, dim, _slot = key
        ts = [c["ts_ns"][i] for i in rows]
        with_bytes = etype in (EventType.LAUNCH, EventType.MEMCPY, EventType.MEMSET,
                               EventType.ALLOC)
        out[row] = (min(ts), max(ts), pid, api, etype, key_flags, device, handle, dim, len(rows),
                    sum(c["bytes"][i] for i in rows) if with_bytes else 0,
                    sum(c["duration_ns"][i] for i in rows) if key_flags & F_HAS_RESULT else 0)
    return out


def aggregates_from_json(lines: Iterable[Mapping[str, Any]]) -> Events:
    """The aggregates (AGGREGATE_DTYPE) of `--output`'s "aggregate" lines."""
    rows = [a for a in lines if a["type"] == "aggregate"]
    out = np.zeros(len(rows), dtype=AGGREGATE_DTYPE)
    for i, a in enumerate(rows):
        r = out[i]
        kind = a["of"]
        r["type"] = _TYPE_IDS[kind]
        r["ts_ns"], r["last_ts_ns"], r["pid"] = a["ts_ns"], a["last_ts_ns"], a["pid"]
        r["api"], r["device"], r["count"] = API_IDS[a["api"]], a["device"], a["count"]
        flags = F_HAS_RESULT if "ok" in a else 0
        if "ok" in a and not a["ok"]:
            flags |= AGG_F_FAILED
        if a.get("async"):
            flags |= F_ASYNC
        r["flags"] = flags
        r["duration_ns"] = a.get("duration_ns") or 0
        dim = [0] * 6
        if kind == "launch":
            dim = [*a["grid"], *a["block"]]
            r["bytes"], r["handle"] = a["shared_mem_bytes"], a["function"]
        elif kind == "graph_launch":
            dim[GRAPH_KERNEL_NODES] = a["kernel_nodes"] or 0
            r["handle"] = a["graph_exec"]
        elif kind == "memcpy":
            dim[0] = COPY_KINDS.index(a["kind"])
            r["bytes"] = a["bytes"]
        elif kind in ("memset", "alloc"):
            r["bytes"] = a["bytes"]
            if kind == "alloc":
                dim[0] = _ALLOC_KIND_IDS.get(a["alloc_kind"], 0)
        elif kind == "free":
            r["handle"] = int(not a["null"])
        elif kind == "sync":
            dim[0] = _SCOPE_IDS.get(a["scope"], 0)
        r["dim"] = dim
    return out


# -- --output lines → records ----------------------------------------------------------------


def events_from_json(events: Iterable[Mapping[str, Any]]) -> Events:
    """The records (EVENT_DTYPE) of `--output` events, as the node enriched them."""
    rows = list(events)
    out = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, e in enumerate(rows):
        r = out[i]
        kind = e["type"]
        r["type"] = _TYPE_IDS[kind]
        r["ts_ns"], r["pid"], r["tid"] = e["ts_ns"], e["pid"], e["tid"]
        r["api"] = API_IDS[e["api"]]
        flags = F_HAS_RESULT if "result" in e else 0
        if "result" in e:
            r["result"] = e["result"]
        if e.get("async"):
            flags |= F_ASYNC
        r["duration_ns"] = e.get("duration_ns") or 0
        dim = [0] * 6
        if kind == "launch":
            dim = [*e["grid"], *e["block"]]
            r["bytes"], r["stream"], r["handle"] = e["shared_mem_bytes"], e["stream"], e["function"]
            if e["captured"]:
                flags |= F_CAPTURED
        elif kind == "memcpy":
            name = e["kind"]
            dim[0] = (COPY_KINDS.index(name) if name in COPY_KINDS
                      else int(name.removeprefix("unknown_")))
            r["bytes"], r["stream"] = e["bytes"], e["stream"]
        elif kind == "memset":
            r["bytes"], r["stream"] = e["bytes"], e["stream"]
        elif kind == "alloc":
            dim[0] = _ALLOC_KIND_IDS.get(e["alloc_kind"], 0)
            r["bytes"], r["stream"], r["handle"] = e["bytes"], e["stream"], e["ptr"] or 0
        elif kind == "free":
            r["stream"], r["handle"] = e["stream"], e["ptr"]
            if e["bytes"] is not None:
                r["bytes"] = e["bytes"]
                flags |= F_BYTES_KNOWN
        elif kind == "sync":
            dim[0] = _SCOPE_IDS.get(e["scope"], 0)
            r["handle"] = e["event"] if e["scope"] == "event" else e["stream"]
        elif kind == "graph_launch":
            dim[GRAPH_KERNEL_NODES] = e["kernel_nodes"] or 0
            r["handle"], r["stream"] = e["graph_exec"], e["stream"]
        elif kind == "graph_capture":
            dim[0] = CAPTURE_END if e["phase"] == "end" else CAPTURE_BEGIN
            dim[CAPTURE_KERNEL_NODES] = e["kernel_nodes"] or 0
            r["handle"], r["stream"] = e["graph"] or 0, e["stream"]
        elif kind == "graph_instantiate":
            dim[GRAPH_KERNEL_NODES] = e["kernel_nodes"] or 0
            r["handle"], r["bytes"] = e["graph_exec"] or 0, e["graph"]
        r["dim"] = dim
        r["flags"] = flags
    return out


# -- the stream app's path -------------------------------------------------------------------


def stream_points(events: Events, window_s: float = 1.0, slice_ns: int = 250_000_000,
                  host: str = "node1", job: str = "job1", *,
                  aggregates: Events | None = None) -> list[Point]:
    """The final points of the job's windows: the events (and `aggregates`, by their first
    event's time) published as the producer does (per process and time slice of `slice_ns`,
    through the wire format), applied in time order, every window closed."""
    settings = WindowSettings(window_s=window_s, grace_s=0.0)
    state = JobState(host, job, partition=0)
    counted = wire.no_aggregates() if aggregates is None else aggregates
    ts, first = events["ts_ns"], counted["ts_ns"]
    times = np.concatenate([ts, first])
    offset = 0
    for start in range(int(times.min()) // slice_ns, int(times.max()) // slice_ns + 1):
        in_slice = events[(ts // np.uint64(slice_ns)) == np.uint64(start)]
        counted_in = counted[(first // np.uint64(slice_ns)) == np.uint64(start)]
        for pid in np.unique(np.concatenate([in_slice["pid"], counted_in["pid"]])).tolist():
            mine = in_slice[in_slice["pid"] == pid]
            theirs = counted_in[counted_in["pid"] == pid]
            message = wire.encode_events(wire.EventBatch(host, pid, 1, mine, aggregates=theirs))
            batch = wire.decode_events(message)
            applied = state.apply(batch.events, 0, offset, settings,
                                  aggregates=batch.aggregates)
            assert applied.events == len(mine) + int(theirs["count"].sum())
            assert applied.late is None and not applied.late_aggregated
            offset += 1
    writes, _closed = state.due(int(times.max()) + 10 * settings.window_ns, settings)
    assert writes and all(w.final for w in writes) and not state.windows
    return [p for w in writes for p in w.points]


def _add(into: dict[Any, Any], key: Any, values: tuple[int, ...]) -> None:
    old = into.get(key, (0,) * len(values))
    into[key] = tuple(a + b for a, b in zip(old, values, strict=True))


def figures_of_points(points: list[Point], window_s: float = 1.0) -> Figures:
    """The shared figures, summed over the windows' points as `gpuflight report` sums them."""
    by_api: dict[str, int] = {}
    graphs_by_api: dict[str, int] = {}
    nodes = captured = kernel_launches = threads = 0
    grid: dict[str, int] = {}
    block: dict[str, int] = {}
    copies: dict[str, tuple[int, ...]] = {}
    syncs: dict[str, tuple[int, ...]] = {}
    errors: dict[str, int] = {}
    memset = (0, 0)
    memory = (0, 0, 0, 0)
    peak = 0
    blocked = (0, 0)
    kernels = 0
    for p in points:
        f = p.fields
        if p.measurement == m.LAUNCHES.name:
            api = p.tags[Tags.API]
            into = graphs_by_api if api in GRAPH_LAUNCH_APIS else by_api
            into[api] = into.get(api, 0) + int(f[Fields.COUNT])
            nodes += int(f.get(Fields.GRAPH_KERNEL_NODES, 0))
        elif p.measurement == m.LAUNCH_SHAPE.name:
            kernel_launches += int(f[Fields.LAUNCHES])
            captured += int(f.get(Fields.CAPTURED_LAUNCHES, 0))
            threads += round(float(f[Fields.THREADS_PER_S]) * window_s)
        elif p.measurement == m.KERNELS.name:
            kernels += int(f[Fields.COUNT])
        elif p.measurement in (m.GRID_BLOCKS.name, m.BLOCK_THREADS.name):
            into = grid if p.measurement == m.GRID_BLOCKS.name else block
            into[p.tags[Tags.BUCKET]] = into.get(p.tags[Tags.BUCKET], 0) + int(f[Fields.COUNT])
        elif p.measurement == m.COPIES.name:
            _add(copies, p.tags[Tags.KIND], tuple(int(f[k]) for k in (
                Fields.COUNT, Fields.BYTES, Fields.SYNC_COUNT, Fields.SYNC_BYTES,
                Fields.SYNC_NS)))
        elif p.measurement == m.MEMSET.name:
            memset = (memset[0] + int(f[Fields.COUNT]), memset[1] + int(f[Fields.BYTES]))
        elif p.measurement == m.MEMORY.name:
            memory = tuple(a + int(f[k]) for a, k in zip(memory, (  # type: ignore[assignment]
                Fields.ALLOC_COUNT, Fields.ALLOC_BYTES, Fields.FREE_COUNT, Fields.FREE_BYTES),
                strict=True))
            peak = max(peak, int(f.get(Fields.PEAK_LIVE_BYTES, 0)))
        elif p.measurement == m.SYNCS.name:
            _add(syncs, p.tags[Tags.SCOPE], (int(f[Fields.COUNT]), int(f[Fields.SYNC_NS])))
        elif p.measurement == m.CPU_BLOCKED.name:
            blocked = (blocked[0] + int(f[Fields.SYNC_NS]), blocked[1] + int(f[Fields.COPY_NS]))
        elif p.measurement == m.ERRORS.name:
            api = p.tags[Tags.API]
            errors[api] = errors.get(api, 0) + int(f[Fields.COUNT])
    # The stream app's own figures agree with each other.
    assert kernel_launches == sum(by_api.values()) == kernels
    return {
        "kernel launches": kernel_launches,
        "kernel launches by api": by_api,
        "captured into graphs": captured,
        "graph launches": sum(graphs_by_api.values()),
        "graph launches by api": graphs_by_api,
        "graph kernel nodes run": nodes,
        "threads launched": threads,
        "grid blocks": grid,
        "block threads": block,
        "copies": copies,
        "memsets": memset,
        "allocations, frees": memory,
        "peak live bytes": peak,
        "syncs": syncs,
        "CPU blocked on the GPU in syncs": blocked[0],
        "CPU blocked on the GPU in synchronous copies": blocked[1],
        "failed calls": errors,
    }


# -- the trace's path ------------------------------------------------------------------------


def figures_of_summary(summary: Summary) -> Figures:
    c = summary.counts
    return {
        "kernel launches": summary.launches,
        "kernel launches by api": summary.launches_by_api,
        "captured into graphs": summary.captured_launches,
        "graph launches": summary.graph_launches,
        "graph launches by api": c.launches_by_api(graphs=True),
        "graph kernel nodes run": summary.graph_kernels,
        "threads launched": summary.threads_total,
        "grid blocks": {m.bucket_label(i): n for i, n in enumerate(c.grid_blocks) if n},
        "block threads": {m.bucket_label(i): n for i, n in enumerate(c.block_threads) if n},
        "copies": {k: tuple(s.as_list()) for k, s in summary.copies.items()},
        "memsets": (summary.memset_count, summary.memset_bytes),
        "allocations, frees": (summary.alloc_count, summary.alloc_bytes, summary.free_count,
                               c.free_bytes),
        "peak live bytes": summary.peak_live_bytes,
        "syncs": {s: (n, summary.sync_ns[s]) for s, n in summary.sync_count.items()},
        "CPU blocked on the GPU in syncs": c.total_sync_ns,
        "CPU blocked on the GPU in synchronous copies": c.copy_sync_ns,
        "failed calls": c.errors,
    }


def _count(pattern: str, text: str) -> int:
    found = re.search(pattern, text, re.MULTILINE)
    return int(found.group(1).replace(",", "")) if found else 0


def figures_of_text(text: str) -> Figures:
    """The figures the printed trace summary shows (a subset of the keys above; times in
    ms with 3 decimals, as printed)."""
    blocked = re.search(r"CPU blocked on the GPU: ([\d.]+) ms \(.*\) — in syncs ([\d.]+) ms,"
                        r" in synchronous copies ([\d.]+) ms", text)
    memory = re.search(r"allocations: ([\d,]+) \(.*\), frees: ([\d,]+),", text)
    assert memory, text
    copies = {}
    for kind in (*COPY_KINDS, "unknown"):
        row = re.search(rf"^\s+{kind}\s+([\d,]+)\s", text, re.MULTILINE)
        if row:
            copies[kind] = int(row.group(1).replace(",", ""))
    return {
        "kernel launches": _count(r"^\s+([\d,]+)  kernel launches", text),
        "captured into graphs": _count(r"^\s+([\d,]+)  captured into graphs", text),
        "graph launches": _count(r"^\s+([\d,]+)  graph launches", text),
        "graph kernel nodes run": _count(r"^\s+([\d,]+)  graph kernel nodes run", text),
        "failed calls": _count(r"failed calls: ([\d,]+)", text),
        "allocations": int(memory.group(1).replace(",", "")),
        "frees": int(memory.group(2).replace(",", "")),
        "copies": copies,
        "CPU blocked on the GPU ms": tuple(float(x) for x in blocked.groups()) if blocked
        else (0.0, 0.0, 0.0),
    }


def text_figures_of_summary(summary: Summary) -> Figures:
    """`figures_of_text`'s figures, from a Summary (times rounded as printed)."""
    c = summary.counts
    return {
        "kernel launches": summary.launches,
        "captured into graphs": summary.captured_launches,
        "graph launches": summary.graph_launches,
        "graph kernel nodes run": summary.graph_kernels,
        "failed calls": summary.failed_calls,
        "allocations": summary.alloc_count,
        "frees": summary.free_count,
        "copies": {k: s.count for k, s in summary.copies.items()},
        "CPU blocked on the GPU ms": (
            (round(c.blocked_ns / 1e6, 3), round(c.total_sync_ns / 1e6, 3),
             round(c.copy_sync_ns / 1e6, 3)) if c.sync_count or c.copy_sync_ns
            else (0.0, 0.0, 0.0)),
    }
