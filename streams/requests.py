"""Requests and cost in the stream: per (window, job, route) request aggregates, the GPU time no
request explains, and the points they become. Pure: no Faust, no I/O.

    ledger = RequestLedger()                                  # one per job, in its state
    win = RequestWindow()                                     # one per (window, job)
    costs = call_costs(events)                                # (n, COSTS) from the attribution
    ledger.add_calls(events, costs, attributed, window_ns, window_of)  # calls to requests
    ledger.finish(done, window_ns, window_of)                 # a request's totals to its route
    ledger.closed(start, end, win)                            # as its window closes
    points = to_points(win, start, host=..., job=..., labels=..., window_s=...,
                       usd_per_gpu_hour=...)

A call's cost (`COSTS`: kernel launches that ran, GPU time, bytes copied) comes from the
counting of producer/attribution.py (`event_costs`: GPU time as the time the process had
work queued, split over the work enqueued in that span). The producer says which request(s)
each call was made for (`Attributed`): one request (exact), several with shares (shared), or
none (unattributed: GPU time no request explains — start-up, warm-up, background work, idle
spin). A request's calls are summed in the job's `RequestLedger` until its `request` event
says it is done (route, status, latency, bytes, traceparent); then its totals go to the
route of the window its response ended in. Calls of a request that come after it was done go
to the same window while it is open (later, they wait as those of a request not done). Σ request GPU time + unattributed GPU time = the job's
GPU time, always (the calls of a request never done within `max_open_ns` go to the route
UNFINISHED_ROUTE, with no request counted).

Latency percentiles come from a log histogram of LATENCY_STEPS buckets per doubling (error
under 2^(1/16), 4.4 %); like every sum here it merges exactly, so a window written in parts
(messages, restarts) is the window written at once. Everything round-trips through plain
dicts (`to_dict`/`from_dict`) for the Faust table's changelog.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from producer import attribution
from streams import measurements as m
from streams.measurements import Fields, FieldValue, Point, Tags

DICT_VERSION: Final = 1
#: Sums per request and call: kernel launches that ran, GPU time (ns), bytes copied.
COSTS: Final = ("launches", "gpu_ns", "bytes")
LAUNCHES, GPU_NS, BYTES = range(3)
#: Latency histogram: bucket b holds latencies in [2^(b/STEPS), 2^((b+1)/STEPS)) ns.
LATENCY_STEPS: Final = 8
#: A request open (calls seen, never done) this long after its last call is given up on: its
#: calls become unattributed (the producer closes a request after 15 minutes at most).
DEFAULT_MAX_OPEN_NS: Final = 20 * 60 * 1_000_000_000
#: The route of the costs of requests never done (see `RequestLedger.closed`).
UNFINISHED_ROUTE: Final = "(unfinished)"
#: Server errors: a response of 500 and beyond, or none at all (status 0).
SERVER_ERROR: Final = 500

Events = npt.NDArray[np.void]
F64 = npt.NDArray[np.float64]


def call_costs(events: Events) -> F64:
    """Each call's (launches, GPU ns, bytes copied), (n, len(COSTS))."""
    full = attribution.event_costs(events)
    f = attribution.FIELD
    out = np.zeros((len(events), len(COSTS)), dtype=np.float64)
    out[:, LAUNCHES] = full[:, f["launches"]]
    out[:, GPU_NS] = full[:, f["gpu_ns"]]
    out[:, BYTES] = (full[:, f["h2d_bytes"]] + full[:, f["d2h_bytes"]] + full[:, f["d2d_bytes"]]
                     + full[:, f["other_copy_bytes"]])
    return out


# -- latency histogram -----------------------------------------------------------------------


def latency_bucket(ns: int) -> int:
    """The bucket of a latency (0 and 1 ns in bucket 0)."""
    return 0 if ns <= 1 else math.floor(math.log2(ns) * LATENCY_STEPS)


def latency_percentile(hist: Mapping[int, int], q: float) -> float | None:
    """The q-quantile (0..1) of a histogram: the geometric middle of the bucket it falls in."""
    total = sum(hist.values())
    if total <= 0:
        return None
    rank = max(math.ceil(q * total), 1)
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return float(2.0 ** ((bucket + 0.5) / LATENCY_STEPS))
    raise AssertionError("unreachable: rank <= total")


# -- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """A `request` event: one request whose response has gone out (times: wall clock ns)."""

    request_id: int
    route: str
    method: str
    status: int
    start_ns: int
    end_ns: int
    bytes_in: int
    bytes_out: int
    trace_id: str | None = None
    parent_span_id: str | None = None

    @property
    def latency_ns(self) -> int:
        return max(self.end_ns - self.start_ns, 0)


@dataclass(frozen=True)
class Attributed:
    """Which request(s) each call of a batch was made for: `exact[i]` its request id (0:
    none), else `shared[i]` the (request id, share) it is split over; neither: unattributed."""

    exact: npt.NDArray[np.uint64]
    shared: Mapping[int, Sequence[tuple[int, float]]] = field(default_factory=dict)

    @classmethod
    def none(cls, n: int) -> Attributed:
        return cls(np.zeros(n, dtype=np.uint64))


# -- aggregates ------------------------------------------------------------------------------


@dataclass
class Sample:
    """One request among the slowest of its (window, route)."""

    request_id: int
    method: str
    status: int
    latency_ns: int
    trace_id: str | None
    parent_span_id: str | None
    costs: list[float]

    def key(self) -> tuple[int, int]:
        return (-self.latency_ns, self.request_id)

    def to_list(self) -> list[Any]:
        return [self.request_id, self.method, self.status, self.latency_ns, self.trace_id,
                self.parent_span_id, self.costs]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> Sample:
        rid, method, status, latency, trace, parent, costs = row
        return cls(int(rid), str(method), int(status), int(latency),
                   None if trace is None else str(trace),
                   None if parent is None else str(parent), [float(c) for c in costs])


@dataclass
class RouteStats:
    """The requests of one route that ended in one window."""

    requests: int = 0
    server_errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    #: Sums of COSTS over the requests.
    costs: list[float] = field(default_factory=lambda: [0.0] * len(COSTS))
    latency: dict[int, int] = field(default_factory=dict)
    #: The slowest REQUEST_SAMPLES (latency, then request id): merges exactly.
    samples: list[Sample] = field(default_factory=list)

    def add(self, done: Done, costs: Sequence[float]) -> None:
        self.requests += 1
        self.server_errors += int(done.status >= SERVER_ERROR or done.status == 0)
        self.bytes_in += done.bytes_in
        self.bytes_out += done.bytes_out
        self.add_costs(costs)
        b = latency_bucket(done.latency_ns)
        self.latency[b] = self.latency.get(b, 0) + 1
        self._keep([Sample(done.request_id, done.method, done.status, done.latency_ns,
                           done.trace_id, done.parent_span_id, [float(c) for c in costs])])

    def add_costs(self, costs: Sequence[float], request_id: int | None = None) -> None:
        for i, c in enumerate(costs):
            self.costs[i] += float(c)
        if request_id is not None:
            for s in self.samples:
                if s.request_id == request_id:
                    s.costs = [a + float(b) for a, b in zip(s.costs, costs, strict=True)]

    def merge_from(self, other: RouteStats) -> None:
        self.requests += other.requests
        self.server_errors += other.server_errors
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out
        self.add_costs(other.costs)
        for b, n in other.latency.items():
            self.latency[b] = self.latency.get(b, 0) + n
        self._keep(other.samples)

    def _keep(self, more: Iterable[Sample]) -> None:
        self.samples = sorted([*self.samples, *more], key=Sample.key)[: m.REQUEST_SAMPLES]

    def to_list(self) -> list[Any]:
        return [self.requests, self.server_errors, self.bytes_in, self.bytes_out, self.costs,
                sorted(self.latency.items()), [s.to_list() for s in self.samples]]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> RouteStats:
        requests, errors, bytes_in, bytes_out, costs, latency, samples = row
        if len(costs) != len(COSTS):
            raise ValueError(f"{len(costs)} costs where {len(COSTS)} belong")
        return cls(int(requests), int(errors), int(bytes_in), int(bytes_out),
                   [float(c) for c in costs], {int(b): int(n) for b, n in latency},
                   [Sample.from_list(s) for s in samples])


@dataclass
class RequestWindow:
    """One (window, job): its routes, and its GPU time by the time of the calls."""

    routes: dict[str, RouteStats] = field(default_factory=dict)
    #: GPU time of every call in the window, and of those no request explains (ns).
    gpu_ns: float = 0.0
    unattributed_gpu_ns: float = 0.0

    @property
    def empty(self) -> bool:
        return not self.routes and not self.gpu_ns

    def route(self, name: str) -> RouteStats:
        stats = self.routes.get(name)
        if stats is None:
            stats = self.routes[name] = RouteStats()
        return stats

    def merge_from(self, other: RequestWindow) -> None:
        for name, stats in other.routes.items():
            self.route(name).merge_from(stats)
        self.gpu_ns += other.gpu_ns
        self.unattributed_gpu_ns += other.unattributed_gpu_ns

    def to_dict(self) -> dict[str, Any]:
        return {"v": DICT_VERSION, "gpu_ns": self.gpu_ns,
                "unattributed_gpu_ns": self.unattributed_gpu_ns,
                "routes": {k: v.to_list() for k, v in sorted(self.routes.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestWindow:
        if data.get("v") != DICT_VERSION:
            raise ValueError(f"request window version {data.get('v')!r}, expected {DICT_VERSION}")
        try:
            return cls({str(k): RouteStats.from_list(v) for k, v in data["routes"].items()},
                       float(data["gpu_ns"]), float(data["unattributed_gpu_ns"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed request window: {exc!r}") from None


#: window start → that window's RequestWindow, when the window is open (None: closed).
WindowOf = Callable[[int], RequestWindow | None]


@dataclass
class _Open:
    costs: list[float]
    last_ns: int


@dataclass
class Late:
    """What came for windows already closed (not counted in any window)."""

    requests: int = 0
    calls: int = 0


@dataclass
class RequestLedger:
    """One job's requests in progress: the costs of their calls so far; and the requests done
    whose window is still open (their late calls go there)."""

    max_open_ns: int = DEFAULT_MAX_OPEN_NS
    open: dict[int, _Open] = field(default_factory=dict)
    #: request id → (window start, route) of a request done, while that window is open.
    done: dict[int, tuple[int, str]] = field(default_factory=dict)

    def add_calls(self, events: Events, costs: F64, attributed: Attributed, window_ns: int,
                  window_of: WindowOf) -> Late:
        """Each call's cost to its request(s), and every call's GPU time to its window."""
        late = Late()
        n = len(events)
        if n == 0:
            return late
        ts = events["ts_ns"].astype(np.int64)
        starts = (ts // window_ns) * window_ns
        exact = attributed.exact.astype(np.uint64)
        is_shared = np.zeros(n, dtype=bool)
        if attributed.shared:
            is_shared[np.fromiter(attributed.shared, dtype=np.int64)] = True
        for start in np.unique(starts).tolist():
            idx = np.flatnonzero(starts == start)
            window = window_of(int(start))
            if window is None:
                late.calls += len(idx)
                continue
            gpu = costs[idx, GPU_NS]
            window.gpu_ns += float(gpu.sum())
            mine = exact[idx]
            none = (mine == 0) & ~is_shared[idx]
            window.unattributed_gpu_ns += float(gpu[none].sum())
            has = mine != 0
            if has.any():
                rids, owner = np.unique(mine[has], return_inverse=True)
                sums = np.zeros((len(rids), len(COSTS)))
                np.add.at(sums, owner, costs[idx[has]])
                last = np.zeros(len(rids), dtype=np.int64)
                np.maximum.at(last, owner, ts[idx[has]])
                for k, rid in enumerate(rids.tolist()):
                    self._give(int(rid), sums[k], int(last[k]), window, window_of)
            for i in idx[is_shared[idx]].tolist():
                for request_id, share in attributed.shared[i]:
                    self._give(int(request_id), costs[i] * float(share), int(ts[i]), window,
                               window_of)
        return late

    def _give(self, request_id: int, cost: F64, ts_ns: int, event_window: RequestWindow,
              window_of: WindowOf) -> None:
        finished = self.done.get(request_id)
        if finished is not None:
            window = window_of(finished[0])
            if window is not None:
                window.route(finished[1]).add_costs(cost.tolist(), request_id)
                return
            # Its window closed: the call is GPU time no open window's request explains.
            event_window.unattributed_gpu_ns += float(cost[GPU_NS])
            return
        entry = self.open.get(request_id)
        if entry is None:
            entry = self.open[request_id] = _Open([0.0] * len(COSTS), ts_ns)
        for j in range(len(COSTS)):
            entry.costs[j] += float(cost[j])
        entry.last_ns = max(entry.last_ns, ts_ns)

    def finish(self, requests: Iterable[Done], window_ns: int, window_of: WindowOf) -> Late:
        """Requests done: their costs so far to their route, in the window of their end."""
        late = Late()
        for done in requests:
            start = (done.end_ns // window_ns) * window_ns
            window = window_of(start)
            entry = self.open.pop(done.request_id, None)
            costs = entry.costs if entry is not None else [0.0] * len(COSTS)
            if window is None:
                late.requests += 1
                continue
            window.route(done.route).add(done, costs)
            self.done[done.request_id] = (start, done.route)
        return late

    def closed(self, window_start_ns: int, window_end_ns: int,
               window: RequestWindow) -> None:
        """`window` closes: forget the requests done in it; requests open with no call since
        `max_open_ns` before its end are given up on: their costs go to its route
        UNFINISHED_ROUTE (no requests counted), so nothing attributed is lost."""
        self.done = {rid: v for rid, v in self.done.items() if v[0] > window_start_ns}
        cutoff = window_end_ns - self.max_open_ns
        stale = [rid for rid, entry in self.open.items() if entry.last_ns < cutoff]
        for rid in stale:
            window.route(UNFINISHED_ROUTE).add_costs(self.open.pop(rid).costs)

    def to_dict(self) -> dict[str, Any]:
        return {"v": DICT_VERSION, "max_open_ns": self.max_open_ns,
                "open": [[rid, e.costs, e.last_ns] for rid, e in sorted(self.open.items())],
                "done": [[rid, s, r] for rid, (s, r) in sorted(self.done.items())]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestLedger:
        if data.get("v") != DICT_VERSION:
            raise ValueError(f"request ledger version {data.get('v')!r}, expected {DICT_VERSION}")
        try:
            return cls(int(data["max_open_ns"]),
                       {int(rid): _Open([float(c) for c in costs], int(last))
                        for rid, costs, last in data["open"]},
                       {int(rid): (int(s), str(r)) for rid, s, r in data["done"]})
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed request ledger: {exc!r}") from None


# -- points ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Labels:
    """Who a job is, for cost: its Kubernetes namespace and team label (NO_LABEL: none)."""

    namespace: str = m.NO_LABEL
    team: str = m.NO_LABEL


def usd(gpu_ns: float, usd_per_gpu_hour: float | None) -> float:
    return 0.0 if usd_per_gpu_hour is None else gpu_ns / 1e9 * usd_per_gpu_hour / 3600.0


def request_id_text(request_id: int) -> str:
    """A request id as written (16 hex digits: ids are unsigned 64-bit, InfluxDB's ints not)."""
    return f"{request_id & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def to_points(win: RequestWindow, window_start_ns: int, *, host: str, job: str,
              labels: Labels, window_s: float, usd_per_gpu_hour: float | None) -> list[Point]:
    """The window's routes, request samples and job cost points (time: the window start).

    Without a price (`usd_per_gpu_hour` None: the job's GPU model is not in the price book),
    costs are 0 and the job's GPU time is `unpriced_gpu_ns`."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, not {window_s}")
    t = window_start_ns
    who = {Tags.HOST: host, Tags.JOB: job}
    cost_tags = {**who, Tags.NAMESPACE: labels.namespace or m.NO_LABEL,
                 Tags.TEAM: labels.team or m.NO_LABEL}
    points: list[Point] = []
    request_gpu_ns = 0.0
    for route, s in sorted(win.routes.items()):
        launches, gpu_ns, nbytes = s.costs
        request_gpu_ns += gpu_ns
        cost = usd(gpu_ns, usd_per_gpu_hour)
        fields: dict[str, FieldValue] = {
            Fields.REQUESTS: s.requests,
            Fields.SERVER_ERRORS: s.server_errors,
            Fields.BYTES_IN: s.bytes_in,
            Fields.BYTES_OUT: s.bytes_out,
            Fields.LAUNCHES: launches,
            Fields.GPU_NS: gpu_ns,
            Fields.BYTES: nbytes,
            Fields.COST_USD: cost,
            Fields.COST_PER_HOUR_USD: cost * 3600.0 / window_s,
        }
        if s.requests:
            p50 = latency_percentile(s.latency, 0.50)
            p99 = latency_percentile(s.latency, 0.99)
            assert p50 is not None and p99 is not None
            fields |= {
                Fields.LATENCY_P50_NS: p50,
                Fields.LATENCY_P99_NS: p99,
                Fields.LAUNCHES_PER_REQUEST: launches / s.requests,
                Fields.GPU_SECONDS_PER_REQUEST: gpu_ns / 1e9 / s.requests,
                Fields.BYTES_PER_REQUEST: nbytes / s.requests,
                Fields.COST_PER_REQUEST_USD: cost / s.requests,
            }
        points.append(Point(m.ROUTES.name, {**cost_tags, Tags.ROUTE: route}, fields, t))
        for rank, sample in enumerate(s.samples):
            sample_fields: dict[str, FieldValue] = {
                Fields.REQUEST_ID: request_id_text(sample.request_id),
                Fields.METHOD: sample.method,
                Fields.STATUS: sample.status,
                Fields.LATENCY_NS: sample.latency_ns,
                Fields.LAUNCHES: sample.costs[LAUNCHES],
                Fields.GPU_NS: sample.costs[GPU_NS],
                Fields.COST_USD: usd(sample.costs[GPU_NS], usd_per_gpu_hour),
            }
            if sample.trace_id:
                sample_fields[Fields.TRACE_ID] = sample.trace_id
            if sample.parent_span_id:
                sample_fields[Fields.PARENT_SPAN_ID] = sample.parent_span_id
            points.append(Point(m.REQUEST_SAMPLES_M.name,
                                {**who, Tags.ROUTE: route, Tags.RANK: str(rank)},
                                sample_fields, t))
    if win.gpu_ns or win.routes:
        total = win.gpu_ns
        cost = usd(total, usd_per_gpu_hour)
        points.append(Point(m.JOB_COST.name, cost_tags, {
            Fields.GPU_NS: total,
            Fields.REQUEST_GPU_NS: total - win.unattributed_gpu_ns,
            Fields.UNATTRIBUTED_GPU_NS: win.unattributed_gpu_ns,
            Fields.UNATTRIBUTED_SHARE: win.unattributed_gpu_ns / total if total else 0.0,
            Fields.COST_USD: cost,
            Fields.COST_PER_HOUR_USD: cost * 3600.0 / window_s,
            Fields.UNPRICED_GPU_NS: 0.0 if usd_per_gpu_hour is not None else total,
        }, t))
    return points
