"""What each CUDA call cost (numpy, vectorised): the one cost model that prices requests
(producer/http/attribution.py) and code paths (producer/decode/pysamples.py) alike.

The cost of a call (COST_FIELDS): kernel launches and their weight (blocks x threads), graph
launches and the kernels they ran, bytes copied by direction, bytes set, allocations, syncs and
the CPU time blocked in syncs and synchronous copies, and GPU time. GPU time comes from
`busy_gpu_ns` (the time the process had work queued: from the first launch or copy after the
GPU went idle to the return of the sync or synchronous copy that drained it, split equally over
the work enqueued in that span) or, where NVML gives per-process utilisation, from
`nvml_gpu_ns` (each sample's GPU time spread over the busy spans it overlaps; a sample that
overlaps none is GPU time no event explains, and stays unattributed). Both take one process's
events.

Pure: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.abi import (
    F_ASYNC,
    F_CAPTURED,
    F_HAS_RESULT,
    GRAPH_KERNEL_NODES,
    EventType,
)

COST_FIELDS: Final = (
    "launches",  # kernel launches that ran (not those captured into a graph)
    "weight",  # blocks x threads of those launches
    "graph_launches",
    "kernels",  # launches + the kernel nodes of graph launches (where known)
    "h2d_bytes",
    "d2h_bytes",
    "d2d_bytes",
    "other_copy_bytes",  # host to host, and "default" (unified addressing decides)
    "memset_bytes",
    "allocs",
    "alloc_bytes",
    "syncs",
    "blocked_ns",  # CPU time blocked in syncs and synchronous copies
    "gpu_ns",
)
FIELD: Final = {name: i for i, name in enumerate(COST_FIELDS)}

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

def _is_work(events: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    """Events that put work on the GPU (launches that ran, graph launches, copies, memsets)."""
    t = events["type"]
    launch = (t == EventType.LAUNCH) & ((events["flags"] & F_CAPTURED) == 0)
    work: npt.NDArray[np.bool_] = launch | (t == EventType.GRAPH_LAUNCH) | (
        t == EventType.MEMCPY) | (t == EventType.MEMSET)
    return work


def _sync_copy(events: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    sync_copy: npt.NDArray[np.bool_] = (
        (events["type"] == EventType.MEMCPY)
        & ((events["flags"] & F_ASYNC) == 0)
        & ((events["flags"] & F_HAS_RESULT) != 0)
    )
    return sync_copy


def _is_drain(events: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    """Events after whose return the process's queued work is done."""
    has_result = (events["flags"] & F_HAS_RESULT) != 0
    drain: npt.NDArray[np.bool_] = ((events["type"] == EventType.SYNC) & has_result) | _sync_copy(
        events)
    return drain


def drains(events: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    """Events after whose return the process's queued work is done (a busy span ends)."""
    return _is_drain(events)


@dataclass(frozen=True)
class GpuTime:
    """GPU time per event, and what no event explains (unattributed as a whole)."""

    per_event: F64
    residual_ns: float
    #: Busy spans found: [start, end] each, disjoint, in time order.
    spans: I64

    @property
    def total_ns(self) -> float:
        return float(self.per_event.sum()) + self.residual_ns


def _busy_spans(events: npt.NDArray[np.void]) -> tuple[I64, I64, I64, I64]:
    """(order, span of each work event in `order` or -1, span starts, span ends)."""
    order = np.argsort(events["ts_ns"], kind="stable")
    ts = events["ts_ns"][order].astype(np.int64)
    end = ts + events["duration_ns"][order].astype(np.int64)
    work = _is_work(events)[order]
    drain = _is_drain(events)[order]
    drain_at = np.flatnonzero(drain)
    # A work event belongs to the first drain called at or after it (a synchronous copy drains
    # its own work); work after the last drain ends with the last event seen.
    period = np.searchsorted(ts[drain_at], ts, side="left")
    n_periods = len(drain_at) + 1
    last_end = int(end.max()) if len(end) else 0
    period_end = np.concatenate([end[drain_at], [last_end]]).astype(np.int64)
    starts = np.full(n_periods, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(starts, period[work], ts[work])
    # Spans never overlap: each starts no earlier than every earlier span has ended.
    before = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(period_end)[:-1]])
    span_start = np.maximum(starts, before)
    busy = (span_start < period_end) & (starts < np.iinfo(np.int64).max)
    span_of = np.where(work, period, -1)
    return order, span_of, np.where(busy, span_start, 0), np.where(busy, period_end, 0)


def _spread(events: npt.NDArray[np.void], order: I64, span_of: I64, span_ns: F64) -> F64:
    """Each span's GPU time split equally over the work enqueued in it."""
    per_event = np.zeros(len(events), dtype=np.float64)
    has = span_of >= 0
    if not has.any():
        return per_event
    items = np.bincount(span_of[has], minlength=len(span_ns)).astype(np.float64)
    each = np.divide(span_ns, items, out=np.zeros_like(span_ns), where=items > 0)
    per_event[order[has]] = each[span_of[has]]
    return per_event


def busy_gpu_ns(events: npt.NDArray[np.void]) -> GpuTime:
    """GPU time as the time the process had work queued on the GPU."""
    if len(events) == 0:
        return GpuTime(np.zeros(0), 0.0, np.zeros((0, 2), dtype=np.int64))
    order, span_of, start, end = _busy_spans(events)
    span_ns = (end - start).astype(np.float64)
    busy = span_ns > 0
    # Work in a span of no length (its drain returned before it: another thread's) gets none.
    per_event = _spread(events, order, np.where(busy[np.maximum(span_of, 0)], span_of, -1),
                        span_ns)
    return GpuTime(per_event, 0.0, np.stack([start[busy], end[busy]], axis=1))


def nvml_gpu_ns(
    events: npt.NDArray[np.void], sample_ts_ns: npt.ArrayLike, sm_util_percent: npt.ArrayLike,
    first_interval_ns: int | None = None, sample_start_ns: npt.ArrayLike | None = None,
) -> GpuTime:
    """GPU time from NVML's per-process utilisation samples of this process.

    Sample i covers (ts[i-1], ts[i]] (the first, `first_interval_ns` before it, or nothing) at
    sm_util[i] percent; or, given `sample_start_ns`, (start[i], ts[i]] (NVML gives a sample
    only for a period the process was busy in: the periods come from the device's samples, and
    samples of several GPUs may overlap). Its GPU time goes to the busy spans it overlaps, by
    overlap, then equally to the work in each span; a sample overlapping no span stays
    unattributed."""
    ts = np.asarray(sample_ts_ns, dtype=np.int64)
    util = np.clip(np.asarray(sm_util_percent, dtype=np.float64), 0, 100) / 100.0
    order_s = np.argsort(ts, kind="stable")
    ts, util = ts[order_s], util[order_s]
    if sample_start_ns is not None:
        lo = np.minimum(np.asarray(sample_start_ns, dtype=np.int64)[order_s], ts)
    else:
        lo = np.concatenate([[ts[0] - (first_interval_ns or 0)], ts[:-1]]) if len(ts) else ts
    sample_ns = util * (ts - lo)
    if len(events) == 0:
        return GpuTime(np.zeros(0), float(sample_ns.sum()), np.zeros((0, 2), dtype=np.int64))
    order, span_of, start, end = _busy_spans(events)
    busy = end > start
    idx = np.flatnonzero(busy)
    s_start, s_end = start[idx], end[idx]  # disjoint, in time order
    # (sample, span) pairs that overlap.
    a = np.searchsorted(s_end, lo, side="right")
    b = np.searchsorted(s_start, ts, side="left")
    counts = np.maximum(b - a, 0)
    sample_rep = np.repeat(np.arange(len(ts)), counts)
    first = np.cumsum(counts) - counts
    span_rep = np.repeat(a, counts) + (np.arange(int(counts.sum())) - np.repeat(first, counts))
    overlap = (np.minimum(ts[sample_rep], s_end[span_rep])
               - np.maximum(lo[sample_rep], s_start[span_rep])).clip(min=0).astype(np.float64)
    covered = np.bincount(sample_rep, weights=overlap, minlength=len(ts))
    part = np.divide(overlap, covered[sample_rep], out=np.zeros_like(overlap),
                     where=covered[sample_rep] > 0)
    span_gpu = np.zeros(len(start), dtype=np.float64)
    np.add.at(span_gpu, idx[span_rep], sample_ns[sample_rep] * part)
    residual = float(sample_ns[covered <= 0].sum())
    per_event = _spread(events, order, np.where(busy[np.maximum(span_of, 0)], span_of, -1),
                        span_gpu)
    return GpuTime(per_event, residual, np.stack([s_start, s_end], axis=1))


def event_costs(events: npt.NDArray[np.void], gpu: GpuTime | None = None) -> F64:
    """The cost of each event, (n, len(COST_FIELDS)); GPU time from `gpu` (default: busy)."""
    n = len(events)
    # Built column by column: columns are contiguous (Fortran order).
    out = np.zeros((len(COST_FIELDS), n), dtype=np.float64).T
    if n == 0:
        return out
    t = events["type"]
    flags = events["flags"]
    dims = events["dim"]
    nbytes = events["bytes"].astype(np.float64)
    duration = events["duration_ns"].astype(np.float64)
    has_result = (flags & F_HAS_RESULT) != 0
    launch = (t == EventType.LAUNCH) & ((flags & F_CAPTURED) == 0)
    out[:, FIELD["launches"]] = launch
    launched = np.flatnonzero(launch)
    if len(launched):
        d = dims[launched].astype(np.float64)
        out[launched, FIELD["weight"]] = d[:, 0] * d[:, 1] * d[:, 2] * d[:, 3] * d[:, 4] * d[:, 5]
    graph = t == EventType.GRAPH_LAUNCH
    out[:, FIELD["graph_launches"]] = graph
    out[:, FIELD["kernels"]] = launch + np.where(graph, dims[:, GRAPH_KERNEL_NODES], 0)
    copy = t == EventType.MEMCPY
    kind = dims[:, 0]
    for name, value in (("h2d_bytes", 1), ("d2h_bytes", 2), ("d2d_bytes", 3)):
        out[:, FIELD[name]] = np.where(copy & (kind == value), nbytes, 0)
    out[:, FIELD["other_copy_bytes"]] = np.where(copy & ((kind == 0) | (kind >= 4)), nbytes, 0)
    out[:, FIELD["memset_bytes"]] = np.where(t == EventType.MEMSET, nbytes, 0)
    alloc = (t == EventType.ALLOC) & (~has_result | (events["result"] == 0))
    out[:, FIELD["allocs"]] = alloc
    out[:, FIELD["alloc_bytes"]] = np.where(alloc, nbytes, 0)
    sync = t == EventType.SYNC
    out[:, FIELD["syncs"]] = sync
    blocked = (sync & has_result) | _sync_copy(events)
    out[:, FIELD["blocked_ns"]] = np.where(blocked, duration, 0)
    out[:, FIELD["gpu_ns"]] = (gpu or busy_gpu_ns(events)).per_event
    return out
