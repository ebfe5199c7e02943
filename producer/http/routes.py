"""trace's per-route table: requests, latency, GPU work and cost per route, from the requests
a capture answered (wire.RequestRecord with their attributed cost).

Pure: numbers and text. Cost comes from the price book (producer/contract/pricing.py) for the GPU
model the trace ran on; without a model, or one the book has no price for, the cost column says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpuflight.producer.contract.pricing import PriceBook
from gpuflight.producer.contract.wire import RequestRecord
from gpuflight.producer.http.parser import ProcessStats

_COPIED = ("h2d_bytes", "d2h_bytes", "d2d_bytes", "other_copy_bytes")


@dataclass(frozen=True)
class RouteRow:
    method: str
    route: str
    requests: int
    errors: int  # status 5xx, or no response seen
    p50_ms: float
    p99_ms: float
    launches: float  # per request
    gpu_s: float  # GPU-seconds per request
    copied_bytes: float  # bytes copied to, from and on the GPU, per request
    bytes_in: float  # HTTP bytes per request
    bytes_out: float
    exact: bool  # every request's GPU work was its own (no shared calls)
    cost_per_1k: float | None  # USD per 1,000 requests
    #: Where its GPU time came from: "nvml", "queued", "mixed", or "" (none).
    gpu_source: str = ""


@dataclass(frozen=True)
class RouteTable:
    rows: tuple[RouteRow, ...]
    #: GPU-seconds, launches no request explains (start-up, background work).
    unattributed_gpu_s: float
    unattributed_launches: float
    gpu_model: str | None
    usd_per_gpu_hour: float | None
    #: NVML's per-process utilisation was read during the trace.
    nvml: bool = False


def _percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (a latency some request had)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q, method="inverted_cdf"))


def route_table(
    requests: Iterable[RequestRecord], unattributed: Mapping[str, float],
    prices: PriceBook | None = None, gpu_name: str | None = None,
    shared: Iterable[int] = (), *, nvml: bool = False,
) -> RouteTable:
    """`shared`: the ids of requests some of whose GPU work was shared with others; `nvml`:
    NVML's per-process utilisation was read."""
    by: dict[tuple[str, str], list[RequestRecord]] = {}
    for r in requests:
        by.setdefault((r.method, r.route), []).append(r)
    per_hour = prices.per_hour(gpu_name) if prices is not None and gpu_name else None
    shared_ids = set(shared)
    rows = []
    for (method, route), items in by.items():
        n = len(items)
        ms = [r.duration_ns / 1e6 for r in items]
        gpu_s = sum(r.cost_of("gpu_ns") for r in items) / 1e9
        rows.append(RouteRow(
            method=method, route=route, requests=n,
            errors=sum(1 for r in items if r.status >= 500 or r.status == 0),
            p50_ms=_percentile(ms, 50), p99_ms=_percentile(ms, 99),
            launches=sum(r.cost_of("launches") for r in items) / n,
            gpu_s=gpu_s / n,
            copied_bytes=sum(sum(r.cost_of(c) for c in _COPIED) for r in items) / n,
            bytes_in=sum(r.bytes_in for r in items) / n,
            bytes_out=sum(r.bytes_out for r in items) / n,
            exact=not any(r.request_id in shared_ids for r in items),
            cost_per_1k=None if per_hour is None else gpu_s / n * per_hour / 3600 * 1000,
            gpu_source=_source(r.gpu_source for r in items),
        ))
    rows.sort(key=lambda r: (-(r.gpu_s * r.requests), r.route, r.method))
    model = prices.model_of(gpu_name) if prices is not None and gpu_name else None
    return RouteTable(tuple(rows), unattributed.get("gpu_ns", 0.0) / 1e9,
                      unattributed.get("launches", 0.0), model, per_hour, nvml)


def _source(sources: Iterable[str | None]) -> str:
    found = {s for s in sources if s}
    if "mixed" in found or len(found) > 1:
        return "mixed"
    return found.pop() if found else ""


#: The route table's words for where GPU time came from.
SOURCE_WORDS = {"nvml": "NVML", "queued": "queued", "mixed": "NVML+queued", "": "-"}


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GiB"


def _usd(v: float) -> str:
    """Dollars and cents; below a dollar, three significant digits ($0.000467)."""
    if v >= 1 or v == 0:
        return f"${v:,.2f}"
    return "$" + np.format_float_positional(v, precision=3, unique=False, fractional=False)


def render(table: RouteTable, gpu_name: str | None = None) -> str:
    """The table as text (empty when no request was seen)."""
    if not table.rows:
        return ""
    from tabulate import tabulate  # ~5 ms to import: only where requests were served

    rows = [[
        f"{r.method} {r.route}", f"{r.requests:,}", f"{r.errors:,}" if r.errors else "",
        f"{r.p50_ms:,.2f}", f"{r.p99_ms:,.2f}", f"{r.launches:,.1f}",
        f"{r.gpu_s * 1e3:,.3f}", _size(r.copied_bytes), _size(r.bytes_in + r.bytes_out),
        "-" if r.cost_per_1k is None else _usd(r.cost_per_1k),
        "exact" if r.exact else "shared", SOURCE_WORDS[r.gpu_source],
    ] for r in table.rows]
    headers = ["route", "requests", "errors", "p50 ms", "p99 ms", "launches/req",
               "GPU ms/req", "copied/req", "HTTP bytes/req", "USD/1k req", "attribution",
               "GPU time"]
    text = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True,
                    colalign=("left", *["right"] * 9, "left", "left"))
    lines = [" requests by route", " " + text.replace("\n", "\n ")]
    lines.append(f" not explained by any request: {table.unattributed_gpu_s * 1e3:,.3f} GPU ms,"
                 f" {table.unattributed_launches:,.0f} launches (start-up, background work)")
    lines.append(_source_line(table))
    if table.usd_per_gpu_hour is not None:
        lines.append(f" cost: GPU time at ${table.usd_per_gpu_hour:,.2f}/GPU-hour "
                     f"({table.gpu_model}; price book)")
    elif gpu_name:
        lines.append(f" cost: the price book has no price for {gpu_name!r} (--prices FILE)")
    else:
        lines.append(" cost: no GPU model known (NVML gave none): --gpu-model NAME prices it")
    return "\n".join(lines)


def _source_line(table: RouteTable) -> str:
    found = {r.gpu_source for r in table.rows} - {""}
    nvml = " GPU time: NVML per-process utilisation (SM time per sample period, spread over " \
        "the spans the process had work queued)"
    queued = " GPU time: queued time (first launch after idle to the sync or copy that " \
        "drained it)"
    if found == {"nvml"}:
        return nvml
    if found and "nvml" not in found and "mixed" not in found:
        why = ("NVML had no per-process figures for these processes" if table.nvml
               else "no NVML on this machine")
        return f"{queued}: {why}"
    if found:
        return f"{nvml}; queued time where NVML had none for a batch (NVML+queued)"
    return " GPU time: none"


def render_http(stats: Mapping[int, ProcessStats]) -> str:
    """One line: what the HTTP capture saw that is not a request it could parse."""
    total = ProcessStats()
    for one in stats.values():
        for name in vars(total):
            setattr(total, name, getattr(total, name) + getattr(one, name))
    ignored = [(total.garbage_connections, "not HTTP"), (total.tls_connections, "TLS"),
               (total.http2_connections, "HTTP/2"), (total.unix_sockets, "unix sockets"),
               (total.upgraded_connections, "upgraded")]
    parts = [f"{n:,} {what}" for n, what in ignored if n]
    line = f" HTTP: {total.requests:,} requests ({total.incomplete:,} incomplete)"
    line += f"; connections ignored: {', '.join(parts)}" if parts else ""
    if total.gaps:
        line += f"; {total.gaps:,} records lost ({total.gap_bytes:,} bytes)"
    if total.malformed_records or total.parser_errors:
        line += (f"; {total.malformed_records:,} malformed records, "
                 f"{total.parser_errors:,} parser errors")
    return line
