"""Requests and cost in the stream: per (window, job, route) request aggregates, the GPU time no
request explains, and the points they become. Pure: no Faust, no I/O.

    win = RequestWindow()                        # one per (window, job), beside its counts
    add_requests(batch.requests, window_ns, window_of)   # each to the window of its end
    add_unattributed(batch, window_ns, window_of)        # the message's cost of no request
    points = to_points(win, start, host=..., job=..., labels=..., window_s=...,
                       usd_per_gpu_hour=...)

The producer attributes each CUDA call to its request(s) (producer/http/attribution.py: exact, or
shared over the requests in flight) and sends, with each events message, the requests its
process answered in it, each with the cost of its calls (`wire.RequestRecord.cost`), and the
cost of the message's calls that no request explains (`EventBatch.unattributed`: start-up,
warm-up, background work). Here a request counts in the window its response ended in, under
its route, with its cost: kernel launches that ran (shares make fractions), GPU time, bytes
copied (`COSTS`); the unattributed cost of a message counts in the window of its first event.
Σ over routes of GPU time + unattributed GPU time = the job's GPU time.

Money: GPU-seconds at the price of the job's GPU model (USD per GPU-hour,
producer/contract/pricing.py).

Latency percentiles come from a log histogram of LATENCY_STEPS buckets per doubling (each
value within 2^(1/16), 4.4 %, of its bucket's middle); like every sum here it merges exactly,
so a window written in parts (messages, restarts) is the window written at once. The slowest
REQUEST_SAMPLES requests of a (window, route) are kept with their trace ids. Everything
round-trips through plain dicts (`to_dict`/`from_dict`) for the Faust table's changelog.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpuflight.producer.contract.wire import RequestRecord
from gpuflight.streams import measurements as m
from gpuflight.streams.measurements import Fields, FieldValue, Point, Tags

DICT_VERSION: Final = 1
#: Sums per request: kernel launches that ran, GPU time (ns), bytes copied.
COSTS: Final = ("launches", "gpu_ns", "bytes")
LAUNCHES, GPU_NS, BYTES = range(3)
#: Request cost fields (wire.REQUEST_COST_FIELDS) that are bytes copied.
COPY_FIELDS: Final = ("h2d_bytes", "d2h_bytes", "d2d_bytes", "other_copy_bytes")
#: Latency histogram: bucket b holds latencies in [2^(b/STEPS), 2^((b+1)/STEPS)) ns.
LATENCY_STEPS: Final = 8
#: Server errors: a response of 500 and beyond, or none at all (status 0).
SERVER_ERROR: Final = 500
#: Routes a (window, job) keeps (a job's processes each keep up to 200, producer/http/parser.py);
#: the requests of further routes count under OTHER_ROUTE: each route is a series in InfluxDB
#: and about a kilobyte in the job's state (5,000 routes made it undurable).
MAX_ROUTES: Final = 200
OTHER_ROUTE: Final = "other"


def costs_of(cost: Mapping[str, float]) -> list[float]:
    """COSTS of a wire cost mapping (RequestRecord.cost, EventBatch.unattributed)."""
    return [float(cost.get("launches", 0.0)), float(cost.get("gpu_ns", 0.0)),
            float(sum(cost.get(name, 0.0) for name in COPY_FIELDS))]


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
    #: The user function whose sampled calls cost it most (code paths sampled), if any.
    top_function: str | None = None

    def key(self) -> tuple[int, int]:
        return (-self.latency_ns, self.request_id)

    def to_list(self) -> list[Any]:
        return [self.request_id, self.method, self.status, self.latency_ns, self.trace_id,
                self.parent_span_id, self.costs, self.top_function]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> Sample:
        rid, method, status, latency, trace, parent, costs, *more = row  # a state of before
        top = more[0] if more else None  # top_function: none
        return cls(int(rid), str(method), int(status), int(latency),
                   None if trace is None else str(trace),
                   None if parent is None else str(parent), [_number(c) for c in costs],
                   None if top is None else str(top))


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

    def add(self, request: RequestRecord) -> None:
        costs = costs_of(request.cost)
        self.requests += 1
        self.server_errors += int(request.status >= SERVER_ERROR or request.status == 0)
        self.bytes_in += request.bytes_in
        self.bytes_out += request.bytes_out
        self.add_costs(costs)
        b = latency_bucket(request.duration_ns)
        self.latency[b] = self.latency.get(b, 0) + 1
        self._keep([Sample(request.request_id, request.method, request.status,
                           request.duration_ns, request.trace_id, request.parent_span_id,
                           costs, request.code_paths[0][0] if request.code_paths else None)])

    def add_costs(self, costs: Sequence[float]) -> None:
        for i, c in enumerate(costs):
            self.costs[i] += float(c)

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
                   [_number(c) for c in costs], {int(b): int(n) for b, n in latency},
                   [Sample.from_list(s) for s in samples])


@dataclass
class RequestWindow:
    """One (window, job): the requests that ended in it by route, and the GPU time of its
    calls that no request explains."""

    routes: dict[str, RouteStats] = field(default_factory=dict)
    unattributed_gpu_ns: float = 0.0

    @property
    def empty(self) -> bool:
        return not self.routes and not self.unattributed_gpu_ns

    @property
    def request_gpu_ns(self) -> float:
        return math.fsum(s.costs[GPU_NS] for s in self.routes.values())

    @property
    def gpu_ns(self) -> float:
        """The job's GPU time: its requests' and what no request explains."""
        return self.request_gpu_ns + self.unattributed_gpu_ns

    def route(self, name: str) -> RouteStats:
        """The route's stats, made if new; OTHER_ROUTE's past MAX_ROUTES routes."""
        stats = self.routes.get(name)
        if stats is None:
            if name != OTHER_ROUTE and len(self.routes) - (OTHER_ROUTE in self.routes) \
                    >= MAX_ROUTES:
                return self.route(OTHER_ROUTE)
            stats = self.routes[name] = RouteStats()
        return stats

    def merge_from(self, other: RequestWindow) -> None:
        for name, stats in other.routes.items():
            self.route(name).merge_from(stats)
        self.unattributed_gpu_ns += other.unattributed_gpu_ns

    def to_dict(self) -> dict[str, Any]:
        return {"v": DICT_VERSION, "unattributed_gpu_ns": self.unattributed_gpu_ns,
                "routes": {k: v.to_list() for k, v in sorted(self.routes.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestWindow:
        if data.get("v") != DICT_VERSION:
            raise ValueError(f"request window version {data.get('v')!r}, expected {DICT_VERSION}")
        try:
            return cls({str(k): RouteStats.from_list(v) for k, v in data["routes"].items()},
                       _number(data["unattributed_gpu_ns"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed request window: {exc!r}") from None


def _number(value: Any) -> float:
    """A float of a stored window: JSON has no infinity, so one that was written as null (by a
    worker before costs were bounded at decode) reads as 0, not as a state dropped whole."""
    return 0.0 if value is None else float(value)


#: window start → that window's RequestWindow while it is open; None: closed.
WindowOf = Callable[[int], RequestWindow | None]


def window_start(ts_ns: int, window_ns: int) -> int:
    return (ts_ns // window_ns) * window_ns


def add_requests(requests: Iterable[RequestRecord], window_ns: int,
                 window_of: WindowOf) -> list[RequestRecord]:
    """Each request to its route in the window of its end; those of closed windows (late)
    are returned, not counted."""
    late = []
    for request in requests:
        window = window_of(window_start(request.end_ns, window_ns))
        if window is None:
            late.append(request)
        else:
            window.route(request.route).add(request)
    return late


def add_unattributed(unattributed: Mapping[str, float], at_ns: int, window_ns: int,
                     window_of: WindowOf) -> bool:
    """A message's cost that no request explains, to the window of `at_ns` (its first
    event); False when that window is closed (late: not counted)."""
    gpu_ns = float(unattributed.get("gpu_ns", 0.0))
    if not gpu_ns:
        return True
    window = window_of(window_start(at_ns, window_ns))
    if window is None:
        return False
    window.unattributed_gpu_ns += gpu_ns
    return True


# -- points ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Labels:
    """Who a job is, for cost: its Kubernetes namespace and team label (NO_LABEL: none)."""

    namespace: str = m.NO_LABEL
    team: str = m.NO_LABEL


def usd(gpu_ns: float, usd_per_gpu_hour: float | None) -> float:
    return 0.0 if usd_per_gpu_hour is None else gpu_ns / 1e9 * usd_per_gpu_hour / 3600.0


def request_id_text(request_id: int) -> str:
    """A request id as written: 16 hex digits, as its OTLP span id (producer/http/otlp.py)."""
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
            if sample.top_function:
                sample_fields[Fields.TOP_FUNCTION] = sample.top_function
            points.append(Point(m.REQUEST_SAMPLES_M.name,
                                {**who, Tags.ROUTE: route, Tags.RANK: str(rank)},
                                sample_fields, t))
    if not win.empty:
        total = win.gpu_ns
        cost = usd(total, usd_per_gpu_hour)
        points.append(Point(m.JOB_COST.name, cost_tags, {
            Fields.GPU_NS: total,
            Fields.REQUEST_GPU_NS: request_gpu_ns,
            Fields.UNATTRIBUTED_GPU_NS: win.unattributed_gpu_ns,
            Fields.UNATTRIBUTED_SHARE: win.unattributed_gpu_ns / total if total else 0.0,
            Fields.COST_USD: cost,
            Fields.COST_PER_HOUR_USD: cost * 3600.0 / window_s,
            Fields.UNPRICED_GPU_NS: 0.0 if usd_per_gpu_hour is not None else total,
        }, t))
    return points
