"""Which request each CUDA call of a process was made for, and what it cost (numpy, vectorised).

Given one process's requests (start, end, the thread that read each) and its CUDA events
(records.EVENT_DTYPE), every event gets:

- **exact**: the calling thread is serving exactly one request at that moment (it read it, and
  its response has not gone out): thread-per-request servers (WSGI, ThreadingHTTPServer,
  gunicorn sync workers);
- **shared**: otherwise, while requests of the process are in flight (an asyncio server, a
  batching engine thread): the call's cost is split equally over every request of the process
  in flight at that time;
- **unattributed**: no request of the process in flight (start-up, background work).

A request is in flight from `start_ns` to `end_ns`, both included; a request still open has
end OPEN_END. `rollup` sums the cost per request; by construction, the sum over requests of
what they were given plus what went unattributed is the process's total, whatever the input.

The cost of a call (COST_FIELDS): kernel launches and their weight (blocks x threads), graph
launches and the kernels they ran, bytes copied by direction, bytes set, allocations, syncs and
the CPU time blocked in syncs and synchronous copies, and GPU time. GPU time comes from
`busy_gpu_ns` (the time the process had work queued: from the first launch or copy after the
GPU went idle to the return of the sync or synchronous copy that drained it, split equally over
the work enqueued in that span) or, where NVML gives per-process utilisation, from
`nvml_gpu_ns` (each sample's GPU time spread over the busy spans it overlaps; a sample that
overlaps none is GPU time no event explains, and stays unattributed).

In a stream, attribute a batch of events once the HTTP records up to its last event have been
parsed (every request that started by then is known; those not yet answered are in flight
with OPEN_END), with the requests that overlap it. A busy span still open at a batch's end ends
at its last event: to keep spans whole, hold the events after the batch's last drain back for
the next batch.

Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.abi import (
    F_ASYNC,
    F_CAPTURED,
    F_HAS_RESULT,
    GRAPH_KERNEL_NODES,
    EventType,
)

UNATTRIBUTED: Final = 0
EXACT: Final = 1
SHARED: Final = 2
MODE_NAMES: Final = {UNATTRIBUTED: "unattributed", EXACT: "exact", SHARED: "shared"}
#: The end of a request still in flight.
OPEN_END: Final = np.iinfo(np.int64).max

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


class _Interval(Protocol):
    @property
    def request_id(self) -> int: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def tid(self) -> int: ...


@dataclass(frozen=True)
class RequestTable:
    """One process's requests as columns."""

    request_id: I64
    start_ns: I64
    end_ns: I64  # OPEN_END while in flight
    tid: I64

    def __len__(self) -> int:
        return len(self.request_id)

    @classmethod
    def of(cls, requests: Iterable[_Interval]) -> RequestTable:
        """From http.Request (finished) and http.OpenRequest (in flight) objects."""
        items = list(requests)
        return cls(
            request_id=np.array([r.request_id for r in items], dtype=np.int64),
            start_ns=np.array([r.start_ns for r in items], dtype=np.int64),
            end_ns=np.array([getattr(r, "end_ns", OPEN_END) for r in items], dtype=np.int64),
            tid=np.array([r.tid for r in items], dtype=np.int64),
        )


@dataclass(frozen=True)
class _Segments:
    """Elementary time spans (per group) and the requests in flight in each."""

    bounds: I64  # segment j is [bounds[j], bounds[j + 1]) in composite keys
    offsets: I64  # members of segment j: members[offsets[j]:offsets[j + 1]]
    members: I64  # request indices
    counts: I64

    def locate(self, keys: I64) -> I64:
        """The segment of each key, or -1 where no request is in flight."""
        j = np.searchsorted(self.bounds, keys, side="right") - 1
        valid = (j >= 0) & (j < len(self.counts))
        j = np.where(valid, j, 0)
        has = valid & (self.counts[j] > 0) if len(self.counts) else np.zeros(len(keys), bool)
        return np.where(has, j, -1)


def _segments(group: I64, start: I64, stop: I64, width: int) -> _Segments:
    """`start` and `stop` (exclusive) are time ranks; keys are group * width + rank."""
    s = group * width + start
    e = group * width + stop
    bounds = np.unique(np.concatenate([s, e]))
    a = np.searchsorted(bounds, s)
    b = np.searchsorted(bounds, e)
    spans = (b - a).astype(np.int64)
    total = int(spans.sum())
    first = np.cumsum(spans) - spans
    owner = np.repeat(np.arange(len(s), dtype=np.int64), spans)
    seg = np.repeat(a, spans) + (np.arange(total, dtype=np.int64) - np.repeat(first, spans))
    order = np.argsort(seg, kind="stable")
    counts = np.bincount(seg, minlength=max(len(bounds) - 1, 0))[: max(len(bounds) - 1, 0)]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return _Segments(bounds, offsets, owner[order], counts.astype(np.int64))


@dataclass(frozen=True)
class Attribution:
    """Per event: its mode, and its request (exact) or the requests it is shared by."""

    table: RequestTable
    mode: npt.NDArray[np.uint8]
    #: exact: the request's index in `table`; else -1.
    request: I64
    #: shared: the index of its in-flight set; else -1.
    segment: I64
    segment_offsets: I64
    segment_members: I64

    def take(self, mask: npt.NDArray[np.bool_]) -> Attribution:
        """The attribution of the events where `mask` is true."""
        return Attribution(self.table, self.mode[mask], self.request[mask], self.segment[mask],
                           self.segment_offsets, self.segment_members)

    def request_ids(self) -> npt.NDArray[np.uint64]:
        """Per event: the request id of an exact event, else 0 (the wire's `request_id`)."""
        out = np.zeros(len(self.mode), dtype=np.uint64)
        exact = self.request >= 0
        out[exact] = self.table.request_id[self.request[exact]].astype(np.uint64)
        return out

    def shares(self, i: int) -> list[tuple[int, float]]:
        """(request id, share) of event i: one with share 1 (exact), several (shared), none."""
        if self.mode[i] == EXACT:
            return [(int(self.table.request_id[self.request[i]]), 1.0)]
        if self.mode[i] == SHARED:
            j = int(self.segment[i])
            members = self.segment_members[self.segment_offsets[j] : self.segment_offsets[j + 1]]
            share = 1.0 / len(members)
            return [(int(self.table.request_id[m]), share) for m in members]
        return []

    def wire(self, i: int) -> dict[str, object]:
        """The fields an event carries on the wire: `request_id`, or `requests` with shares."""
        if self.mode[i] == EXACT:
            return {"request_id": int(self.table.request_id[self.request[i]])}
        if self.mode[i] == SHARED:
            return {"requests": [[rid, share] for rid, share in self.shares(i)]}
        return {}


def attribute(table: RequestTable, events: npt.NDArray[np.void]) -> Attribution:
    """Attribute every event of one process to its request(s)."""
    n, m = len(events), len(table)
    mode = np.zeros(n, dtype=np.uint8)
    request = np.full(n, -1, dtype=np.int64)
    segment = np.full(n, -1, dtype=np.int64)
    empty = np.zeros(1, dtype=np.int64)
    if n == 0 or m == 0:
        return Attribution(table, mode, request, segment, empty, np.zeros(0, dtype=np.int64))
    ts = events["ts_ns"].astype(np.int64)
    # Times as ranks, so that composite (group, time) keys fit in 64 bits: a request's time is
    # 2i + 1 (i: its place among the requests' times), an event's 2i + 1 on one of them, else
    # 2i between them; order and equality are kept, and the events need no sort.
    times, inverse = np.unique(np.concatenate([table.start_ns, table.end_ns]),
                               return_inverse=True)
    width = 2 * len(times) + 2
    start_rank = 2 * inverse[:m] + 1
    stop_rank = 2 * inverse[m:] + 2  # in flight through end_ns included
    at = np.searchsorted(times, ts, side="left")
    on = times[np.minimum(at, len(times) - 1)] == ts
    t_rank = 2 * at + on
    # Per thread: is the caller serving exactly one request?
    tids, tid_group = np.unique(table.tid, return_inverse=True)
    threads = _segments(tid_group.astype(np.int64), start_rank, stop_rank, width)
    ev_tid = events["tid"].astype(np.int64)
    slot = np.clip(np.searchsorted(tids, ev_tid), 0, len(tids) - 1)
    known = tids[slot] == ev_tid
    keys = slot.astype(np.int64) * width + t_rank
    j = np.where(known, threads.locate(keys), -1)
    one = (j >= 0) & (threads.counts[np.maximum(j, 0)] == 1)
    request[one] = threads.members[threads.offsets[j[one]]]
    mode[one] = EXACT
    # Per process: which requests are in flight at all?
    process = _segments(np.zeros(m, dtype=np.int64), start_rank, stop_rank, width)
    k = process.locate(t_rank)
    shared = ~one & (k >= 0)
    segment[shared] = k[shared]
    mode[shared] = SHARED
    return Attribution(table, mode, request, segment, process.offsets, process.members)


# -- cost ------------------------------------------------------------------------------------


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


# -- sums ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rollup:
    """Cost per request (given exactly and by shares), unattributed, and the total."""

    request_ids: I64
    exact: F64  # (requests, fields)
    shared: F64
    unattributed: F64  # (fields,)
    total: F64

    @property
    def per_request(self) -> F64:
        return self.exact + self.shared

    def of(self, request_id: int) -> dict[str, float]:
        (i,) = np.flatnonzero(self.request_ids == request_id)
        return dict(zip(COST_FIELDS, self.per_request[i].tolist(), strict=True))

    def field(self, name: str) -> F64:
        return self.per_request[:, FIELD[name]]


def rollup(attr: Attribution, costs: F64, residual: Mapping[str, float] | None = None) -> Rollup:
    """Sum each event's cost into its request(s); `residual` is cost no event carries (NVML
    GPU time outside every busy span), unattributed."""
    m, k = len(attr.table), costs.shape[1]
    exact = np.zeros((m, k))
    shared = np.zeros((m, k))
    is_exact = attr.mode == EXACT
    owner = attr.request[is_exact]
    for c in range(k):
        exact[:, c] = np.bincount(owner, weights=costs[is_exact, c], minlength=m)
    is_shared = attr.mode == SHARED
    if is_shared.any():
        n_seg = len(attr.segment_offsets) - 1
        per_segment = np.zeros((n_seg, k))
        seg = attr.segment[is_shared]
        for c in range(k):
            per_segment[:, c] = np.bincount(seg, weights=costs[is_shared, c], minlength=n_seg)
        counts = np.diff(attr.segment_offsets)
        used = np.flatnonzero(per_segment.any(axis=1))
        each = per_segment[used] / counts[used, None]
        member_seg = np.repeat(used, counts[used])
        starts = attr.segment_offsets[used]
        first = np.cumsum(counts[used]) - counts[used]
        pos = np.repeat(starts, counts[used]) + (
            np.arange(int(counts[used].sum())) - np.repeat(first, counts[used]))
        owners = attr.segment_members[pos]
        given = each[np.searchsorted(used, member_seg)]
        for c in range(k):
            shared[:, c] = np.bincount(owners, weights=given[:, c], minlength=m)
    unattributed = costs[attr.mode == UNATTRIBUTED].sum(axis=0)
    total = costs.sum(axis=0)
    if residual:
        extra = np.zeros(k)
        for name, value in residual.items():
            extra[FIELD[name]] += value
        unattributed = unattributed + extra
        total = total + extra
    return Rollup(attr.table.request_id, exact, shared, unattributed, total)


def top_kernels(
    attr: Attribution, events: npt.NDArray[np.void], names: Mapping[int, str], limit: int = 5,
) -> dict[int, list[tuple[str, float]]]:
    """Per request id: its most launched kernels, (name, launches), shares counted as fractions.
    `names` maps a launch's handle to its kernel name (unknown handles show as hex)."""
    launch = (events["type"] == EventType.LAUNCH) & ((events["flags"] & F_CAPTURED) == 0)
    out: dict[int, dict[str, float]] = {}
    for i in np.flatnonzero(launch & (attr.mode != UNATTRIBUTED)):
        handle = int(events["handle"][i])
        name = names.get(handle, f"0x{handle:x}")
        for rid, share in attr.shares(int(i)):
            per = out.setdefault(rid, {})
            per[name] = per.get(name, 0.0) + share
    return {
        rid: sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
        for rid, counts in out.items()
    }


def kernel_launches(attr: Attribution, events: npt.NDArray[np.void]) -> dict[int, dict[int, float]]:
    """Per request id: launches per kernel handle, shares counted as fractions."""
    launch = (events["type"] == EventType.LAUNCH) & ((events["flags"] & F_CAPTURED) == 0)
    out: dict[int, dict[int, float]] = {}
    exact = np.flatnonzero(launch & (attr.mode == EXACT))
    if len(exact):
        rids = attr.table.request_id[attr.request[exact]]
        handles = events["handle"][exact].astype(np.uint64)
        pairs, counts = np.unique(np.stack([rids.astype(np.uint64), handles], axis=1), axis=0,
                                  return_counts=True)
        for (rid, handle), count in zip(pairs.tolist(), counts.tolist(), strict=True):
            out.setdefault(int(rid), {})[int(handle)] = float(count)
    for i in np.flatnonzero(launch & (attr.mode == SHARED)).tolist():
        handle = int(events["handle"][i])
        for rid, share in attr.shares(i):
            per = out.setdefault(rid, {})
            per[handle] = per.get(handle, 0.0) + share
    return out
