"""Requests in the capture loop: HTTP records → requests (producer/http/parser.py) → which request
each CUDA event was made for and what each request cost (producer/http/attribution.py).

Per loop turn the capture feeds the HTTP records drained so far (`feed`), then each batch of
enriched CUDA events (`attribute`), then takes the requests answered (`take_answered`). The
HTTP ring is drained before the CUDA ring: a call a request's thread made before it wrote the
response was committed before the write's record, so every event of an answered request has
been attributed by the time the request is handed on with its cost.

Times: the HTTP records are CLOCK_MONOTONIC, enriched events wall clock; requests are turned
to wall clock with the enricher's offset, once.

GPU time, per process, comes from NVML's per-process utilisation where NVML has it
(contract/costs.nvml_gpu_ns: each sample period's SM time spread over the busy spans it overlaps),
else from the time the process had work queued (costs.busy_gpu_ns). Busy spans are kept
whole: a batch's GPU time is given (`settle`) up to the process's last drain (sync, synchronous
copy) in it, and the events after it wait for the next drain (at most GPU_WAIT_S); the requests
they may belong to wait too. With NVML on (`feed_utilization`), GPU time also waits until NVML
has reported past those events; then NVML's windows of that process that began before they
ended are spread over them, or, when NVML has none for the process in that time (no
per-process figures for its GPU, work too short to show), its queued time is used. Each request
says which source its GPU time came from (`gpu_source`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract import costs as call_costs
from gpuflight.producer.contract import records
from gpuflight.producer.contract.wire import EventAttribution, GpuSource, RequestRecord
from gpuflight.producer.http import attribution as attr
from gpuflight.producer.http.abi import HttpRecord
from gpuflight.producer.http.parser import HttpParser, Notice, OpenRequest, ProcessStats, Request
from gpuflight.producer.nvml import UtilWindow

log = logging.getLogger(__name__)

_N: int = len(call_costs.COST_FIELDS)
_GPU: int = call_costs.FIELD["gpu_ns"]
#: How long a batch's GPU time waits for the drain that closes its busy spans (and NVML to
#: report past it) before it is counted as it is (a span cut at its end; queued time).
GPU_WAIT_S: float = 5.0
#: NVML windows of a process with no CUDA batch left to take them are dropped after this long.
WINDOW_KEEP_NS: int = 60_000_000_000
_NOTICES = {
    Notice.HTTP2: "HTTP/2 (not parsed: HTTP/1.1 only)",
    Notice.TLS: "TLS (encrypted: not parsed)",
    Notice.GARBAGE: "bytes that are not HTTP on a server socket (ignored)",
    Notice.UNIX: "requests on a unix socket (not captured)",
}


@dataclass(frozen=True)
class Answered:
    """A request answered, with what it cost; `request` keeps the parser's view (monotonic
    times), `record` the wire's (wall clock)."""

    pid: int
    request: Request
    record: RequestRecord
    #: "exact", "shared", "mixed" or "none": how its GPU work came to it.
    mode: str
    #: (kernel handle, launches) of the kernels it launched (shares as fractions).
    kernels: Mapping[int, float] = field(default_factory=dict)


@dataclass
class _Open:
    cost: npt.NDArray[np.float64]
    exact: bool = False
    shared: bool = False
    kernels: dict[int, float] = field(default_factory=dict)
    #: Where its GPU time came from: NVML per-process utilisation, queued time.
    nvml: bool = False
    queued: bool = False


@dataclass(frozen=True)
class _Pending:
    """A batch of one process whose GPU time waits: for the drain that closes its busy spans,
    and, with NVML on, for NVML to report past it."""

    events: npt.NDArray[np.void]
    attribution: attr.Attribution
    start_ns: int  # its first event (wall clock)
    end_ns: int  # the end of its last
    added: float  # time.monotonic()
    #: It has a drain (a busy span ends in it): without one nothing in it can be given yet.
    drains: bool


@dataclass
class GpuSources:
    """Batches (per process) whose GPU time came from NVML, from queued time, and NVML GPU time
    no event explains (unattributed)."""

    nvml_batches: int = 0
    queued_batches: int = 0
    nvml_unexplained_ns: float = 0.0


class RequestTracker:
    def __init__(self, clock_offset_ns: int, host_salt: bytes = b"",
                 count_kernels: bool = False) -> None:
        self.parser = HttpParser(host_salt=host_salt)
        self._offset = clock_offset_ns
        #: Count each request's launches per kernel (for its span's top kernels).
        self.count_kernels = count_kernels
        self._answered: dict[int, list[Request]] = {}
        self._open: dict[int, _Open] = {}
        self._unattributed: dict[int, npt.NDArray[np.float64]] = {}
        #: Totals since the start: events attributed exactly, shared, unattributed.
        self.events_exact = 0
        self.events_shared = 0
        self.events_unattributed = 0
        self._next_expire = 0.0
        self._latest_ns = 0
        #: NVML per-process utilisation (feed_utilization): on once fed; windows per pid; the
        #: time NVML has reported up to; batches waiting for it.
        self.nvml = False
        self._windows: dict[int, list[UtilWindow]] = {}
        self._covered_ns = 0
        self._pending: dict[int, list[_Pending]] = {}
        #: Per pid, its first event seen: NVML's windows before it are not ours to explain.
        self._first_ns: dict[int, int] = {}
        self.gpu_sources = GpuSources()

    # -- HTTP --------------------------------------------------------------

    def feed(self, records: Iterable[HttpRecord]) -> None:
        batch = list(records)
        for request in self.parser.feed_all(batch):
            self._answered.setdefault(request.pid, []).append(request)
        if batch:
            self._latest_ns = max(self._latest_ns, *(r.ts_exit_ns for r in batch))
        for pid, kind in self.parser.take_notices():
            log.info("pid %d: %s", pid, _NOTICES.get(kind, kind.value))
        now = time.monotonic()
        if now >= self._next_expire:  # requests unanswered for long, by the records' clock
            self._next_expire = now + 10.0
            for request in self.parser.expire(self._latest_ns):
                self._answered.setdefault(request.pid, []).append(request)

    def forget_pid(self, pid: int) -> None:
        """A process exited: its open requests end as incomplete."""
        self._first_ns.pop(pid, None)
        for request in self.parser.forget_pid(pid):
            self._answered.setdefault(request.pid, []).append(request)

    def close(self) -> None:
        for pid in {r.pid for r in self.parser.open_requests()}:
            self.forget_pid(pid)

    def stats(self) -> dict[int, ProcessStats]:
        return self.parser.all_stats()

    # -- CUDA events ---------------------------------------------------------

    def attribute(self, events: npt.NDArray[np.void]) -> EventAttribution:
        """Attribute an enriched batch (wall clock), in its order; costs go to the requests."""
        n = len(events)
        request_id = np.zeros(n, dtype=np.uint64)
        request_set = np.zeros(n, dtype=np.int64)
        sets: list[tuple[tuple[int, float], ...]] = []
        if n == 0:
            return EventAttribution(request_id, request_set, ())
        pids = events["pid"]
        unique, inverse = np.unique(pids, return_inverse=True)
        for k, pid in enumerate(unique.tolist()):
            index = np.arange(n) if len(unique) == 1 else np.flatnonzero(inverse == k)
            part = events if len(unique) == 1 else events[index]
            table = self._table(pid)
            a = attr.attribute(table, part)
            # Everything now; GPU time once the batch's busy spans are closed (and NVML, when
            # on, has reported past them): `settle`.
            costs = call_costs.event_costs(part, _no_gpu(len(part)))
            ends = part["ts_ns"].astype(np.int64) + part["duration_ns"].astype(np.int64)
            self._first_ns.setdefault(pid, int(part["ts_ns"].min()))
            self._pending.setdefault(pid, []).append(_Pending(
                part, a, int(part["ts_ns"].min()), int(ends.max()), time.monotonic(),
                bool(call_costs.drains(part).any())))
            roll = attr.rollup(a, costs)
            self._account(pid, a, roll, part)
            request_id[index] = a.request_ids()
            shared = np.flatnonzero(a.mode == attr.SHARED)
            if len(shared):
                segments, first = np.unique(a.segment[shared], return_inverse=True)
                base = len(sets)
                for seg in segments.tolist():
                    members = a.segment_members[a.segment_offsets[seg]:a.segment_offsets[seg + 1]]
                    share = 1.0 / len(members)
                    sets.append(tuple((int(table.request_id[m]), share) for m in members))
                request_set[index[shared]] = base + 1 + first
            self.events_exact += int((a.mode == attr.EXACT).sum())
            self.events_shared += len(shared)
            self.events_unattributed += int((a.mode == attr.UNATTRIBUTED).sum())
        return EventAttribution(request_id, request_set, tuple(sets))

    def call_shares(self, events: npt.NDArray[np.void],
                    attribution: EventAttribution) -> attr.CallShares:
        """The requests, and their routes, of a batch `attribute` just gave `attribution` (its
        requests are all still known: answered and not handed on, or in flight)."""
        route_of: dict[int, str] = {}
        for pid in np.unique(events["pid"]).tolist():
            for r in (*self._answered.get(pid, ()), *self.parser.open_requests(pid)):
                route_of[r.request_id] = r.route
        return attr.call_shares(attribution.request_id, attribution.request_set,
                                attribution.sets, route_of)

    def _table(self, pid: int) -> attr.RequestTable:
        """The requests of `pid` answered and not handed on yet, and those in flight."""
        items: list[Request | OpenRequest] = [*self._answered.get(pid, ()),
                                              *self.parser.open_requests(pid)]
        table = attr.RequestTable.of(items)
        off = np.int64(self._offset)
        start = table.start_ns + off
        end = np.where(table.end_ns == attr.OPEN_END, attr.OPEN_END, table.end_ns + off)
        return attr.RequestTable(table.request_id, start, end, table.tid)

    def _account(self, pid: int, a: attr.Attribution, roll: attr.Rollup,
                 events: npt.NDArray[np.void], *, source: str | None = None,
                 count_kernels: bool = True) -> None:
        """Add a batch's cost to its requests; `source`: where the GPU time in it came from
        (None: it has none yet)."""
        per = roll.per_request
        touched = np.flatnonzero(per.any(axis=1))
        for i in touched.tolist():
            rid = int(roll.request_ids[i])
            acc = self._open.get(rid)
            if acc is None:
                acc = self._open[rid] = _Open(np.zeros(_N))
            acc.cost += per[i]
            acc.exact |= bool(roll.exact[i].any())
            acc.shared |= bool(roll.shared[i].any())
            if per[i, _GPU] > 0:
                acc.nvml |= source == "nvml"
                acc.queued |= source == "queued"
        if roll.unattributed.any():
            self._unattributed[pid] = self._unattributed.get(pid, np.zeros(_N)) + roll.unattributed
        if self.count_kernels and count_kernels:
            for rid, top in attr.kernel_launches(a, events).items():
                acc = self._open.setdefault(rid, _Open(np.zeros(_N)))
                for handle, count in top.items():
                    acc.kernels[handle] = acc.kernels.get(handle, 0.0) + count

    # -- NVML ------------------------------------------------------------------

    def feed_utilization(self, windows: Iterable[UtilWindow], covered_ns: int) -> None:
        """NVML's per-process windows read since the last call, and the time (wall clock) up
        to which NVML has reported every process. From the first call on, batches' GPU time
        waits for NVML (`settle`). NVML that reports no time (no device samples) is not used."""
        if covered_ns <= 0:
            return
        self.nvml = True
        for w in windows:
            self._windows.setdefault(w.pid, []).append(w)
        self._covered_ns = max(self._covered_ns, covered_ns)

    def settle(self, force: bool = False) -> None:
        """Give GPU time to the batches (with NVML on: those NVML has reported past), up to the
        process's last drain in them: a busy span is never cut, the events after it wait for
        the next drain. All of them with `force` (at the end), or when one waited longer than
        GPU_WAIT_S (then, if NVML has not reported that far, queued time)."""
        now = time.monotonic()
        for pid, waiting in list(self._pending.items()):
            k = 0
            while k < len(waiting) and (force or not self.nvml
                                        or waiting[k].end_ns <= self._covered_ns
                                        or now - waiting[k].added > GPU_WAIT_S):
                k += 1
            pending = waiting
            if k:
                late = force or any(now - p.added > GPU_WAIT_S for p in waiting[:k])
                pending = self._settle(pid, waiting[:k], whole=late) + waiting[k:]
            if pending:
                self._pending[pid] = pending
            else:
                del self._pending[pid]
        horizon = self._covered_ns - WINDOW_KEEP_NS
        for pid, windows in list(self._windows.items()):
            if pid not in self._pending:
                windows[:] = [w for w in windows if w.end_ns > horizon]
                if not windows:
                    del self._windows[pid]

    def _settle(self, pid: int, ready: list[_Pending], whole: bool) -> list[_Pending]:
        """GPU time for `ready` (up to its last drain unless `whole`); what is left."""
        if not whole and not any(p.drains for p in ready):
            return ready  # every span in it is still open
        events = records.join([p.events for p in ready])  # a copy of its own
        keep = np.ones(len(events), dtype=bool)
        done = events
        if not whole:
            drain = call_costs.drains(events)
            keep = events["ts_ns"] <= events["ts_ns"][drain].max()
            done = records.take(events, keep)
        end = int((done["ts_ns"].astype(np.int64) + done["duration_ns"].astype(np.int64)).max())
        # NVML's windows up to the end of these events (not before the process was first
        # seen: that GPU time was before the capture watched it).
        first = self._first_ns.get(pid, 0)
        windows = [w for w in self._windows.get(pid, []) if w.end_ns > first]
        used = [w for w in windows if w.start_ns < end]
        if used and end <= self._covered_ns:
            self._windows[pid] = [w for w in windows if w.start_ns >= end]
            gpu = call_costs.nvml_gpu_ns(done, [w.end_ns for w in used],
                                         [w.sm_util_pct for w in used],
                                         sample_start_ns=[w.start_ns for w in used])
            source = "nvml"
            self.gpu_sources.nvml_batches += 1
            self.gpu_sources.nvml_unexplained_ns += gpu.residual_ns
        else:
            gpu = call_costs.busy_gpu_ns(done)
            source = "queued"
            self.gpu_sources.queued_batches += 1
        left: list[_Pending] = []
        at = given = 0
        residual = gpu.residual_ns
        for p in ready:
            mask = keep[at:at + len(p.events)]
            at += len(p.events)
            n = int(mask.sum())
            if n:
                a = p.attribution.take(mask)
                roll = _gpu_rollup(a, gpu.per_event[given:given + n], residual)
                given += n
                residual = 0.0
                self._account(pid, a, roll, records.take(p.events, mask), source=source,
                              count_kernels=False)
            if n < len(p.events):
                rest = records.take(p.events, ~mask)
                ends = rest["ts_ns"].astype(np.int64) + rest["duration_ns"].astype(np.int64)
                left.append(_Pending(rest, p.attribution.take(~mask), int(rest["ts_ns"].min()),
                                     int(ends.max()), p.added, False))
        return left

    # -- handing on ------------------------------------------------------------

    def take_answered(
        self, before_ns: int | None = None
    ) -> dict[int, tuple[list[Answered], dict[str, float]]]:
        """Per pid: the requests answered since the last call, with their cost, and the cost
        no request explains in the events attributed since then. With `before_ns` (wall
        clock), only the requests that ended before it: the events of the others may still be
        held back, and they wait for the next call."""
        self.settle()
        out: dict[int, tuple[list[Answered], dict[str, float]]] = {}
        answered, self._answered = self._answered, {}
        if before_ns is not None or self._pending:
            for pid, requests in list(answered.items()):
                # A request whose GPU time may still come (a batch of its process waits for
                # its GPU time) waits too.
                limits = [before_ns] if before_ns is not None else []
                limits += [p.start_ns for p in self._pending.get(pid, ())[:1]]
                if not limits:
                    continue
                limit = min(limits) - self._offset
                later = [r for r in requests if r.end_ns >= limit]
                if later:
                    self._answered[pid] = later
                    answered[pid] = [r for r in requests if r.end_ns < limit]
        unattributed, self._unattributed = self._unattributed, {}
        for pid, requests in answered.items():
            if requests:
                out[pid] = ([self._answered_one(pid, r) for r in requests], {})
        for pid, cost in unattributed.items():
            done = out.setdefault(pid, ([], {}))
            done[1].update(_costs(cost))
        return out

    def _answered_one(self, pid: int, r: Request) -> Answered:
        acc = self._open.pop(r.request_id, None)
        cost = _costs(acc.cost) if acc is not None else {}
        mode = "none"
        if acc is not None and (acc.exact or acc.shared):
            mode = "mixed" if acc.exact and acc.shared else "exact" if acc.exact else "shared"
        source: GpuSource | None = None
        if acc is not None and (acc.nvml or acc.queued):
            source = "mixed" if acc.nvml and acc.queued else "nvml" if acc.nvml else "queued"
        record = RequestRecord(
            request_id=r.request_id, tid=r.tid, method=r.method, path=r.path[:16_384],
            route=r.route, status=r.status, start_ns=r.start_ns + self._offset,
            end_ns=r.end_ns + self._offset, bytes_in=r.bytes_in, bytes_out=r.bytes_out,
            trace_id=r.trace.trace_id if r.trace else None,
            parent_span_id=r.trace.parent_id if r.trace else None,
            complete=r.complete, port=r.lport, cost=cost, gpu_source=source,
        )
        return Answered(pid, r, record, mode, dict(acc.kernels) if acc else {})


def _gpu_rollup(a: attr.Attribution, gpu_ns: npt.NDArray[np.float64],
                residual_ns: float) -> attr.Rollup:
    """attribution.rollup of GPU time alone (the other costs are zero), widened to every cost
    field: one column summed, not all of them."""
    one = attr.rollup(a, gpu_ns[:, None])

    def wide(column: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        out = np.zeros((*column.shape[:-1], _N))
        out[..., _GPU] = column[..., 0]
        return out

    unattributed, total = wide(one.unattributed), wide(one.total)
    unattributed[_GPU] += residual_ns
    total[_GPU] += residual_ns
    return attr.Rollup(one.request_ids, wide(one.exact), wide(one.shared), unattributed, total)


def _no_gpu(n: int) -> call_costs.GpuTime:
    """No GPU time for n events (`settle` gives it)."""
    return call_costs.GpuTime(np.zeros(n), 0.0, np.zeros((0, 2), dtype=np.int64))


def _costs(values: npt.NDArray[np.float64]) -> dict[str, float]:
    return {name: float(v) for name, v in zip(call_costs.COST_FIELDS, values.tolist(), strict=True)
            if v}
