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

The cost of a call is producer/contract/costs.py's (COST_FIELDS, event_costs): the same model
prices code paths.

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

from gpuflight.producer.contract.abi import F_CAPTURED, EventType
from gpuflight.producer.contract.costs import COST_FIELDS, FIELD

UNATTRIBUTED: Final = 0
EXACT: Final = 1
SHARED: Final = 2
MODE_NAMES: Final = {UNATTRIBUTED: "unattributed", EXACT: "exact", SHARED: "shared"}
#: The end of a request still in flight.
OPEN_END: Final = np.iinfo(np.int64).max


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


# -- what a call was made for -----------------------------------------------------------------

#: The requests a call was made for: (request id, route, share of its cost), the shares summing
#: to 1 (exact: one request, share 1; shared: each request in flight its part).
CallSet = tuple[tuple[int, str, float], ...]


@dataclass(frozen=True)
class CallShares:
    """Per event of a batch, the requests it was made for, with their routes: `sets[keys[i]]`
    (`sets[0]` is empty: no request). What a sampled call's code path costs goes to them (per
    route, and per request for its span)."""

    keys: I64
    sets: tuple[CallSet, ...]


def call_shares(request_id: npt.NDArray[np.uint64], request_set: I64,
                sets: tuple[tuple[tuple[int, float], ...], ...],
                route_of: Mapping[int, str]) -> CallShares:
    """The requests of a batch's events, from their attribution (wire.EventAttribution's
    columns: an exact request id, or 1 + the index of a shared set), with each request's route
    ("" where not known)."""
    keys = np.zeros(len(request_id), dtype=np.int64)
    found: list[CallSet] = [()]

    def named(members: Iterable[tuple[int, float]]) -> CallSet:
        return tuple((rid, route_of.get(rid, ""), share) for rid, share in members)

    exact = np.flatnonzero(request_id)
    if len(exact):
        rids, inverse = np.unique(request_id[exact], return_inverse=True)
        keys[exact] = len(found) + inverse
        found += [named([(rid, 1.0)]) for rid in rids.tolist()]
    shared = np.flatnonzero(request_set > 0)
    if len(shared):
        ids, inverse = np.unique(request_set[shared], return_inverse=True)
        keys[shared] = len(found) + inverse
        found += [named(sets[i - 1]) for i in ids.tolist()]
    return CallShares(keys, tuple(found))
