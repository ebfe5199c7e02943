"""`gpuflight report --by route|job|namespace|team|function|route,function` and `gpuflight
cost`: what requests, jobs and code paths cost on the GPU over a time range, from the stream
app's `routes`, `job_cost`, `code_paths` and `route_code_paths` points in InfluxDB (InfluxQL,
as the dashboards read them).

Every figure is a sum of window points, so it is exact over any range of whole windows:
requests, GPU-seconds, kernel launches, bytes copied, USD. Per request: those sums / requests.
Per hour: USD · 3600 / the range. Latency: the requests' median is the request-weighted mean of
the windows' medians, and p99 the worst window's (percentiles of windows do not add up).

By route, the GPU time is the requests' (exact and their shares). By job, namespace or team it
is the jobs' whole GPU time: their requests' and what no request explains (idle or background
work), shown apart as "no request". By function, each user function's sampled calls
(estimates; "[other]" holds what each window did not keep apart); by route and function,
those of the calls made for each route's requests (the costliest routes first).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Final

import orjson
from tabulate import tabulate

from gpuflight.producer.contract.errors import UsageError
from gpuflight.streams import measurements as m
from gpuflight.streams.influxql import InfluxQL, Row, quote_string
from gpuflight.streams.measurements import Fields, Tags
from gpuflight.streams.settings import InfluxSettings

BY: Final = (Tags.ROUTE, Tags.JOB, Tags.NAMESPACE, Tags.TEAM)
QUERY_TIMEOUT_S: Final = 30.0


@dataclass
class CostRow:
    key: str
    requests: int = 0
    server_errors: int = 0
    gpu_seconds: float = 0.0
    #: GPU-seconds of no request (by job, namespace, team; 0 by route).
    unattributed_gpu_seconds: float = 0.0
    unpriced_gpu_seconds: float = 0.0
    launches: float = 0.0
    bytes_copied: float = 0.0
    cost_usd: float = 0.0
    cost_per_hour_usd: float = 0.0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None

    @property
    def cost_per_request_usd(self) -> float | None:
        return self.request_cost_usd / self.requests if self.requests else None

    @property
    def request_cost_usd(self) -> float:
        """The cost of the requests' GPU time (all of it, by route)."""
        if not self.gpu_seconds:
            return 0.0
        return self.cost_usd * (1 - self.unattributed_gpu_seconds / self.gpu_seconds)

    @property
    def cost_per_1k_requests_usd(self) -> float | None:
        per = self.cost_per_request_usd
        return None if per is None else per * 1000

    @property
    def unattributed_share(self) -> float | None:
        return self.unattributed_gpu_seconds / self.gpu_seconds if self.gpu_seconds else None


@dataclass
class CostTable:
    by: str
    since_ns: int
    until_ns: int
    rows: list[CostRow]

    @property
    def total(self) -> CostRow:
        out = CostRow("total")
        for r in self.rows:
            for name in ("requests", "server_errors", "gpu_seconds", "unattributed_gpu_seconds",
                         "unpriced_gpu_seconds", "launches", "bytes_copied", "cost_usd",
                         "cost_per_hour_usd"):
                setattr(out, name, getattr(out, name) + getattr(r, name))
        return out


def cost_table(settings: InfluxSettings, by: str, since_ns: int, until_ns: int, *,
               host: str | None = None, job: str | None = None) -> CostTable:
    """The cost of each value of `by` (route, job, namespace, team) in [since, until)."""
    if by not in BY:
        raise UsageError(f"--by takes {', '.join(BY)}, not {by!r}")
    where = _where(since_ns, until_ns, host, job)
    db = InfluxQL.from_settings(settings, timeout_s=QUERY_TIMEOUT_S)
    hours = (until_ns - since_ns) / 3.6e12
    rows: dict[str, CostRow] = {}

    def row(r: Row) -> CostRow:
        key = r.text(by) or m.NO_LABEL
        return rows.setdefault(key, CostRow(key))

    for r in db.rows(
            f"SELECT sum({Fields.REQUESTS}) AS requests, sum({Fields.SERVER_ERRORS}) AS errors,"
            f" sum({Fields.LAUNCHES}) AS launches, sum({Fields.BYTES}) AS bytes,"
            f" sum({Fields.GPU_NS}) AS gpu_ns, sum({Fields.COST_USD}) AS cost,"
            f" max({Fields.LATENCY_P99_NS}) AS p99 FROM {m.ROUTES.name} {where} GROUP BY {by}"):
        out = row(r)
        out.requests = r.integer("requests")
        out.server_errors = r.integer("errors")
        out.launches = r.number("launches") or 0.0
        out.bytes_copied = r.number("bytes") or 0.0
        p99 = r.number("p99")
        out.latency_p99_ms = None if p99 is None else p99 / 1e6
        if by == Tags.ROUTE:
            out.gpu_seconds = (r.number("gpu_ns") or 0.0) / 1e9
            out.cost_usd = r.number("cost") or 0.0
    # The request-weighted median: Σ p50 · requests / Σ requests, over the windows.
    medians: dict[str, list[float]] = {}
    for r in db.rows(f"SELECT {Fields.LATENCY_P50_NS}, {Fields.REQUESTS} FROM {m.ROUTES.name}"
                     f" {where} GROUP BY {by}"):
        p50 = r.number(Fields.LATENCY_P50_NS)
        if p50 is not None:
            sums = medians.setdefault(r.text(by) or m.NO_LABEL, [0.0, 0.0])
            sums[0] += p50 * r.integer(Fields.REQUESTS)
            sums[1] += r.integer(Fields.REQUESTS)
    for key, (weighted, n) in medians.items():
        if n and key in rows:
            rows[key].latency_p50_ms = weighted / n / 1e6
    if by != Tags.ROUTE:
        for r in db.rows(
                f"SELECT sum({Fields.GPU_NS}) AS gpu_ns, sum({Fields.UNATTRIBUTED_GPU_NS}) AS"
                f" none, sum({Fields.UNPRICED_GPU_NS}) AS unpriced, sum({Fields.COST_USD}) AS"
                f" cost FROM {m.JOB_COST.name} {where} GROUP BY {by}"):
            out = row(r)
            out.gpu_seconds = (r.number("gpu_ns") or 0.0) / 1e9
            out.unattributed_gpu_seconds = (r.number("none") or 0.0) / 1e9
            out.unpriced_gpu_seconds = (r.number("unpriced") or 0.0) / 1e9
            out.cost_usd = r.number("cost") or 0.0
    for out in rows.values():
        out.cost_per_hour_usd = out.cost_usd / hours
    ranked = sorted(rows.values(), key=lambda r: (-r.cost_usd, -r.gpu_seconds, r.key))
    return CostTable(by, since_ns, until_ns, ranked)


def _where(since_ns: int, until_ns: int, host: str | None, job: str | None) -> str:
    """The WHERE clause of [since, until), one host's and one job's where given."""
    if until_ns <= since_ns:
        raise UsageError("the time range is empty")
    where = f"WHERE time >= {since_ns} AND time < {until_ns}"
    if host:
        where += f" AND {Tags.HOST} = {quote_string(host)}"
    if job:
        where += f" AND {Tags.JOB} = {quote_string(job)}"
    return where


# -- rendering -------------------------------------------------------------------------------


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "$0"
    digits = max(2, 3 - math.floor(math.log10(abs(value))))
    return f"${value:,.{min(digits, 8)}f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render(table: CostTable) -> str:
    """The table, costliest first, with a total line."""
    by_route = table.by == Tags.ROUTE
    headers = [table.by, "requests", "errors", "p50 ms", "p99 ms", "launches/req", "GPU-s",
               *([] if by_route else ["no request"]), "GPU-s/req", "$/req", "$/1k req", "$",
               "$/hour"]
    lines = []
    for r in [*table.rows, table.total]:
        per_request = r.gpu_seconds * (1 - (r.unattributed_share or 0)) / r.requests \
            if r.requests else None
        lines.append([
            r.key, f"{r.requests:,}", f"{r.server_errors:,}",
            _num(r.latency_p50_ms), _num(r.latency_p99_ms),
            _num(r.launches / r.requests if r.requests else None),
            _num(r.gpu_seconds, 3),
            *([] if by_route else [_num(None if r.unattributed_share is None
                                        else 100 * r.unattributed_share) + "%"]),
            _num(per_request, 4), _usd(r.cost_per_request_usd), _usd(r.cost_per_1k_requests_usd),
            _usd(r.cost_usd), _usd(r.cost_per_hour_usd),
        ])
    out = tabulate(lines, headers=headers, tablefmt="simple",
                   colalign=("left", *["right"] * (len(headers) - 1)))
    unpriced = table.total.unpriced_gpu_seconds
    if unpriced:
        out += (f"\nwarning: {unpriced:,.3f} GPU-seconds ran on GPUs the price book has no"
                " price for (not in $): give the worker --prices or --gpu-model")
    if not table.rows:
        out += "\nno requests or GPU cost in that time range"
    return out


def render_json(table: CostTable) -> str:
    def one(r: CostRow) -> dict[str, object]:
        return {**asdict(r), "cost_per_request_usd": r.cost_per_request_usd,
                "cost_per_1k_requests_usd": r.cost_per_1k_requests_usd,
                "unattributed_share": r.unattributed_share}

    return orjson.dumps({"by": table.by, "since_ns": table.since_ns, "until_ns": table.until_ns,
                         "rows": [one(r) for r in table.rows], "total": one(table.total)},
                        option=orjson.OPT_INDENT_2).decode()


# -- by function (code paths) ---------------------------------------------------------------


@dataclass
class FunctionRow:
    function: str
    launches: float = 0.0
    gpu_seconds: float = 0.0
    bytes_copied: float = 0.0
    blocked_seconds: float = 0.0
    calls: float = 0.0
    cost_usd: float = 0.0
    cost_per_hour_usd: float = 0.0
    #: Per (route, function): the route its calls were made for.
    route: str | None = None


@dataclass
class FunctionTable:
    since_ns: int
    until_ns: int
    rows: list[FunctionRow]
    #: Rows per (route, function) (`route_code_paths`), else per function.
    by_route: bool = False


def function_table(settings: InfluxSettings, since_ns: int, until_ns: int, *,
                   host: str | None = None, job: str | None = None,
                   by_route: bool = False) -> FunctionTable:
    """What each user function's code paths cost in [since, until) (`code_paths`); with
    `by_route`, per (route, function), of the calls made for requests (`route_code_paths`)."""
    where = _where(since_ns, until_ns, host, job)
    db = InfluxQL.from_settings(settings, timeout_s=QUERY_TIMEOUT_S)
    hours = (until_ns - since_ns) / 3.6e12
    measurement = m.ROUTE_CODE_PATHS if by_route else m.CODE_PATHS
    group = f"{Tags.ROUTE}, {Tags.FUNCTION}" if by_route else Tags.FUNCTION
    rows = []
    for r in db.rows(
            f"SELECT sum({Fields.LAUNCHES}) AS launches, sum({Fields.GPU_NS}) AS gpu_ns,"
            f" sum({Fields.BYTES}) AS bytes, sum({Fields.BLOCKED_NS}) AS blocked,"
            f" sum({Fields.CALLS}) AS calls, sum({Fields.COST_USD}) AS cost"
            f" FROM {measurement.name} {where} GROUP BY {group}"):
        cost = r.number("cost") or 0.0
        rows.append(FunctionRow(
            r.text(Tags.FUNCTION) or m.NO_LABEL, r.number("launches") or 0.0,
            (r.number("gpu_ns") or 0.0) / 1e9, r.number("bytes") or 0.0,
            (r.number("blocked") or 0.0) / 1e9, r.number("calls") or 0.0, cost, cost / hours,
            (r.text(Tags.ROUTE) or m.NO_LABEL) if by_route else None))
    if by_route:  # the costliest routes first, each route's functions costliest first
        route_gpu: dict[str | None, float] = {}
        for row in rows:
            route_gpu[row.route] = route_gpu.get(row.route, 0.0) + row.gpu_seconds
        rows.sort(key=lambda r: (-route_gpu[r.route], r.route or "", -r.gpu_seconds,
                                 -r.calls, r.function))
    else:
        rows.sort(key=lambda r: (-r.gpu_seconds, -r.calls, r.function))
    return FunctionTable(since_ns, until_ns, rows, by_route)


def render_functions(table: FunctionTable) -> str:
    """The functions, costliest first, each with its share of the GPU time."""
    total_gpu = sum(r.gpu_seconds for r in table.rows)
    headers = ["function", "launches", "GPU-s", "GPU share", "copied", "blocked s", "calls",
               "$", "$/hour"]
    lines = [[r.function, _num(r.launches, 0), _num(r.gpu_seconds, 3),
              _num(100 * r.gpu_seconds / total_gpu if total_gpu else None) + "%",
              _num(r.bytes_copied, 0), _num(r.blocked_seconds, 3), _num(r.calls, 0),
              _usd(r.cost_usd), _usd(r.cost_per_hour_usd)] for r in table.rows]
    if table.by_route:
        headers.insert(0, "route")
        for line, r in zip(lines, table.rows, strict=True):
            line.insert(0, r.route or m.NO_LABEL)
    out = tabulate(lines, headers=headers, tablefmt="simple",
                   colalign=("left", *["right"] * (len(headers) - 1)))
    if not table.rows:
        out += ("\nno code paths of requests in that time range (the producer samples them"
                " with --stack-sampling N; routes need HTTP captured)" if table.by_route else
                "\nno code paths in that time range (the producer samples them with"
                " --stack-sampling N)")
    return out


def render_functions_json(table: FunctionTable) -> str:
    rows = [asdict(r) for r in table.rows]
    if not table.by_route:
        for row in rows:
            del row["route"]
    return orjson.dumps({"by": f"{Tags.ROUTE},{Tags.FUNCTION}" if table.by_route else
                         Tags.FUNCTION, "since_ns": table.since_ns,
                         "until_ns": table.until_ns, "rows": rows},
                        option=orjson.OPT_INDENT_2).decode()
