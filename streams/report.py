"""`gpuflight report` and `gpuflight compare`: a job's windows from InfluxDB, summed over a time
range, for people without Grafana. Reads with InfluxQL (as the dashboards do), so it works on
InfluxDB 1.8, 2.x (DBRP mappings) and 3.x.

Totals are sums of the window points. Rates divide by the job's active time: the windows it
launched in, times the window length (which the points carry: count / rate_per_s), less the
idle start of its first window and the idle end of its last (before its first launch and
after its last: the job started and ended inside them).
Grid and block sizes are percentiles of the summed log2 histograms (streams/aggregate.py).
The words are the counting core's (producer/contract/counting.py), as the trace summary uses them:
kernel launches (that ran), captured into graphs, graph launches, graph kernel nodes run,
failed calls, and the CPU blocked on the GPU (in syncs and in synchronous copies), here as a
share of the job's active time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import orjson
from tabulate import tabulate

from gpuflight.producer.contract.counting import GRAPH_LAUNCH_APIS
from gpuflight.producer.contract.errors import UsageError
from gpuflight.streams import measurements as m
from gpuflight.streams.aggregate import percentile
from gpuflight.streams.influxql import InfluxQL, quote_string
from gpuflight.streams.measurements import LOST_FIELDS, Fields, Tags
from gpuflight.streams.settings import InfluxSettings

#: Queries over long ranges take longer than the sink's writes.
REPORT_TIMEOUT_S: Final = 30.0
_quote: Final = quote_string


@dataclass
class JobSummary:
    job: str
    since_ns: int
    until_ns: int
    hosts: list[str] = field(default_factory=list)
    window_s: float = 0.0
    active_windows: int = 0
    #: Idle parts of the first and last windows (before the first, after the last launch).
    idle_edges_s: float = 0.0
    #: Kernel launches that ran (not those captured into graphs).
    launches: int = 0
    #: "layer/api" → kernel launches and graph launches.
    launches_by_api: dict[str, int] = field(default_factory=dict)
    #: Launches recorded into graphs under stream capture (they ran nothing).
    captured_launches: int = 0
    graph_launches: int = 0
    graph_kernel_nodes: int = 0
    top_kernels: list[tuple[str, int]] = field(default_factory=list)
    grid_blocks_p50: float | None = None
    grid_blocks_p90: float | None = None
    grid_blocks_p99: float | None = None
    block_threads_p50: float | None = None
    block_threads_p90: float | None = None
    #: kind → {count, bytes, sync_bytes, sync_ns, bandwidth_bytes_per_s}
    copies: dict[str, dict[str, float]] = field(default_factory=dict)
    memset_bytes: int = 0
    alloc_bytes: int = 0
    peak_live_bytes: int | None = None
    sync_ns: int = 0
    copy_ns: int = 0
    blocked_share_mean: float | None = None
    gpu_utilization_pct: float | None = None
    memory_bound_windows: int = 0
    judged_windows: int = 0
    memory_bound_alerts: int = 0
    anomalies: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    #: Events of the job the producer lost in the range: kernel ring full, beyond Kafka queue.
    lost_kernel: int = 0
    lost_user: int = 0
    #: ... and those a killed producer never published (its successor's count).
    lost_agent_died: int = 0
    #: Events of the job the stream worker did not count (taken in the range): late beyond
    #: grace, or stamped too far ahead of its clock. In the dead-letter topic.
    uncounted_late: int = 0
    uncounted_future: int = 0
    #: CUDA device (the `devices` tag: the calling thread's ordinal; "HOST/DEVICE" where the
    #: job ran on several hosts, whose device 0s are different GPUs) → its sums: launches,
    #: copies, bytes, bytes of each copy kind present (as COPY_KIND_VALUES names them),
    #: syncs, sync_ns, copy_ns. Σ over devices = the job's figures.
    devices: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def events_lost(self) -> int:
        return self.lost_kernel + self.lost_user + self.lost_agent_died

    @property
    def active_s(self) -> float:
        return max(self.active_windows * self.window_s - self.idle_edges_s, 0.0)

    @property
    def launch_rate(self) -> float | None:
        return self.launches / self.active_s if self.active_s else None

    def copy_bytes(self, *kinds: str) -> int:
        return int(sum(c["bytes"] for k, c in self.copies.items() if not kinds or k in kinds))

    def bandwidth(self, kind: str) -> float | None:
        c = self.copies.get(kind)
        return c["sync_bytes"] / (c["sync_ns"] / 1e9) if c and c["sync_ns"] else None

    @property
    def blocked_share(self) -> float | None:
        """CPU blocked on the GPU (in syncs and synchronous copies) over the job's active
        time (summed over its processes' threads)."""
        return (self.sync_ns + self.copy_ns) / (self.active_s * 1e9) if self.active_s else None


def job_summary(settings: InfluxSettings, job: str, since_ns: int, until_ns: int,
                host: str | None = None) -> JobSummary:
    db = InfluxQL.from_settings(settings, timeout_s=REPORT_TIMEOUT_S)
    where = f"WHERE {Tags.JOB} = {_quote(job)} AND time >= {since_ns} AND time < {until_ns}"
    if host:
        where += f" AND {Tags.HOST} = {_quote(host)}"
    summary = JobSummary(job, since_ns, until_ns)

    launches = db.rows(f"SELECT sum({Fields.COUNT}) AS n, sum({Fields.GRAPH_KERNEL_NODES}) AS g"
                       f" FROM {m.LAUNCHES.name} {where} GROUP BY {Tags.LAYER}, {Tags.API},"
                       f" {Tags.HOST}")
    shape = db.rows(f"SELECT {Fields.LAUNCHES}, {Fields.CAPTURED_LAUNCHES},"
                    f" {Fields.FIRST_LAUNCH_OFFSET_NS}, {Fields.LAST_LAUNCH_OFFSET_NS}"
                    f" FROM {m.LAUNCH_SHAPE.name} {where}")
    if not launches and not any(db.rows(f"SELECT * FROM {spec.name} {where} LIMIT 1")
                                for spec in (m.CPU_BLOCKED, m.EVENTS_LOST)):
        seen = sorted({r.text(Tags.JOB) for r in db.rows(
            f"SELECT last({Fields.COUNT}) FROM {m.LAUNCHES.name} WHERE time >= {since_ns}"
            f" AND time < {until_ns} GROUP BY {Tags.JOB}")})
        hint = f"; jobs in that range: {', '.join(seen[:10])}" if seen else "; no jobs at all"
        raise UsageError(f"no data for job {job!r} in the time range{hint}")
    summary.hosts = sorted({r.text(Tags.HOST) for r in launches})
    for r in launches:
        key = f"{r.text(Tags.LAYER)}/{r.text(Tags.API)}"
        summary.launches_by_api[key] = summary.launches_by_api.get(key, 0) + r.integer("n")
        summary.graph_kernel_nodes += r.integer("g")
        if r.text(Tags.API) in GRAPH_LAUNCH_APIS:
            summary.graph_launches += r.integer("n")
    summary.launches = sum(r.integer(Fields.LAUNCHES) for r in shape)
    summary.captured_launches = sum(r.integer(Fields.CAPTURED_LAUNCHES) for r in shape)
    summary.active_windows = len(shape)
    one = db.rows(f"SELECT {Fields.COUNT}, {Fields.RATE_PER_S} FROM {m.LAUNCHES.name} {where}"
                  " LIMIT 1")
    rate = one[0].number(Fields.RATE_PER_S) if one else None
    if rate:
        summary.window_s = one[0].integer(Fields.COUNT) / rate
    if shape and summary.window_s:
        first, last = shape[0], shape[-1]  # by time
        head = first.number(Fields.FIRST_LAUNCH_OFFSET_NS)
        tail = last.number(Fields.LAST_LAUNCH_OFFSET_NS)
        if head is not None and tail is not None:
            summary.idle_edges_s = (head + summary.window_s * 1e9 - tail) / 1e9

    kernels = db.rows(f"SELECT sum({Fields.COUNT}) AS n FROM {m.KERNELS.name} {where}"
                      f" GROUP BY {Tags.KERNEL}")
    ranked = sorted(((r.text(Tags.KERNEL), r.integer("n")) for r in kernels),
                    key=lambda kv: (-kv[1], kv[0]))
    summary.top_kernels = ranked[:10]

    for spec, attr in ((m.GRID_BLOCKS, "grid_blocks"), (m.BLOCK_THREADS, "block_threads")):
        counts = [0] * m.HISTOGRAM_BUCKETS
        for r in db.rows(f"SELECT sum({Fields.COUNT}) AS n FROM {spec.name} {where}"
                         f" GROUP BY {Tags.BUCKET}"):
            counts[int(r.text(Tags.BUCKET).removeprefix("2^"))] += r.integer("n")
        for q in (50, 90, 99):
            if hasattr(summary, f"{attr}_p{q}"):
                setattr(summary, f"{attr}_p{q}", percentile(counts, q / 100))

    for r in db.rows(f"SELECT sum({Fields.COUNT}) AS count, sum({Fields.BYTES}) AS bytes,"
                     f" sum({Fields.SYNC_BYTES}) AS sync_bytes, sum({Fields.SYNC_NS}) AS sync_ns"
                     f" FROM {m.COPIES.name} {where} GROUP BY {Tags.KIND}"):
        summary.copies[r.text(Tags.KIND)] = {k: r.integer(k) for k in
                                             ("count", "bytes", "sync_bytes", "sync_ns")}
    memset = db.rows(f"SELECT sum({Fields.BYTES}) AS b FROM {m.MEMSET.name} {where}")
    summary.memset_bytes = memset[0].integer("b") if memset else 0
    memory = db.rows(f"SELECT sum({Fields.ALLOC_BYTES}) AS a, max({Fields.PEAK_LIVE_BYTES}) AS p"
                     f" FROM {m.MEMORY.name} {where}")
    if memory:
        summary.alloc_bytes = memory[0].integer("a")
        peak = memory[0].number("p")
        summary.peak_live_bytes = None if peak is None else int(peak)
    blocked = db.rows(f"SELECT sum({Fields.SYNC_NS}) AS s, sum({Fields.COPY_NS}) AS c,"
                      f" mean({Fields.BLOCKED_SHARE}) AS share FROM {m.CPU_BLOCKED.name} {where}")
    if blocked:
        summary.sync_ns = blocked[0].integer("s")
        summary.copy_ns = blocked[0].integer("c")
        summary.blocked_share_mean = blocked[0].number("share")

    gpu = db.rows(f"SELECT mean({Fields.SM_UTIL_PCT}) AS u FROM {m.GPU_PROCESS.name} {where}")
    verdicts = db.rows(
        f"SELECT sum({Fields.VERDICT}) AS v, count({Fields.VERDICT}) AS n,"
        f" sum({Fields.ALERT}) AS a, mean({Fields.GPU_UTILIZATION_PCT}) AS u"
        f" FROM {m.MEMORY_BOUND.name} {where}")
    if gpu and gpu[0].number("u") is not None:
        summary.gpu_utilization_pct = gpu[0].number("u")
    elif verdicts and verdicts[0].number("u") is not None:
        summary.gpu_utilization_pct = verdicts[0].number("u")
    if verdicts:
        summary.memory_bound_windows = verdicts[0].integer("v")
        summary.judged_windows = verdicts[0].integer("n")
    fired = db.rows(f"SELECT {Fields.CONSECUTIVE_WINDOWS} FROM {m.MEMORY_BOUND.name} {where}"
                    f" AND {Fields.ALERT} = 1")
    summary.memory_bound_alerts = sum(1 for r in fired if r[Fields.CONSECUTIVE_WINDOWS] is not None)
    for r in db.rows(f"SELECT count({Fields.RATIO}) AS n FROM {m.BANDWIDTH_ANOMALY.name} {where}"
                     f" GROUP BY {Tags.KIND}, {Tags.DIRECTION}"):
        summary.anomalies[f"{r.text(Tags.KIND)} {r.text(Tags.DIRECTION)}"] = r.integer("n")
    errors = db.rows(f"SELECT sum({Fields.COUNT}) AS n FROM {m.ERRORS.name} {where}")
    summary.errors = errors[0].integer("n") if errors else 0
    summary.lost_kernel, summary.lost_user, summary.lost_agent_died = _events_lost(
        db, job, since_ns, until_ns, host)
    uncounted = db.rows(f"SELECT sum({Fields.LATE_EVENTS}) AS late,"
                        f" sum({Fields.FUTURE_EVENTS}) AS future"
                        f" FROM {m.EVENTS_UNCOUNTED.name} {where}")
    if uncounted:
        summary.uncounted_late = uncounted[0].integer("late")
        summary.uncounted_future = uncounted[0].integer("future")
    summary.devices = _devices(db, where)
    return summary


_DEVICE_SUMS: Final = (Fields.LAUNCHES, Fields.COPIES, Fields.BYTES, Fields.SYNCS,
                       Fields.SYNC_NS, Fields.COPY_NS)


def _devices(db: InfluxQL, where: str) -> dict[str, dict[str, int]]:
    kinds = {f"k{i}": kind for i, kind in enumerate(m.COPY_KIND_VALUES)}
    columns = [*(f"sum({f}) AS {f}" for f in _DEVICE_SUMS),
               *(f"sum({m.BYTES_OF_KIND[kind]}) AS {alias}" for alias, kind in kinds.items())]
    found: dict[tuple[str, str], dict[str, int]] = {}
    for r in db.rows(f"SELECT {', '.join(columns)} FROM {m.DEVICES.name} {where}"
                     f" GROUP BY {Tags.HOST}, {Tags.DEVICE}"):
        sums = {f: r.integer(f) for f in _DEVICE_SUMS}
        sums.update({kind: r.integer(alias) for alias, kind in kinds.items()
                     if r[alias] is not None})
        found[r.text(Tags.HOST), r.text(Tags.DEVICE)] = sums
    several = len({host for host, _ in found}) > 1
    return {f"{host}/{device}" if several else device: sums
            for (host, device), sums in sorted(found.items(), key=_device_order)}


def _device_order(item: tuple[tuple[str, str], Any]) -> tuple[str, int, int]:
    (host, device), _ = item
    return (host, *((0, int(device)) if device.isdigit() else (1, 0)))


def _events_lost(db: InfluxQL, job: str, since_ns: int, until_ns: int,
                 host: str | None) -> tuple[int, int, int]:
    """What the job lost in [since, until): the rise of its producers' counters there, from
    their last value before the range (a fall is a producer restart, from 0)."""
    fields = LOST_FIELDS
    job_host = f"{Tags.JOB} = {_quote(job)}" + (f" AND {Tags.HOST} = {_quote(host)}"
                                                if host else "")
    before = {r.text(Tags.HOST): r for r in db.rows(
        "SELECT " + ", ".join(f"last({f}) AS {f}" for f in fields) +
        f" FROM {m.EVENTS_LOST.name} WHERE {job_host} AND time < {since_ns}"
        f" GROUP BY {Tags.HOST}")}
    previous = {h: [r.integer(f) for f in fields] for h, r in before.items()}
    lost = [0] * len(fields)
    for r in db.rows(f"SELECT {', '.join(fields)} FROM {m.EVENTS_LOST.name}"
                     f" WHERE {job_host} AND time >= {since_ns} AND time < {until_ns}"
                     f" GROUP BY {Tags.HOST}"):
        last = previous.setdefault(r.text(Tags.HOST), [0] * len(fields))
        for i, name in enumerate(fields):
            value = r.integer(name)
            lost[i] += value - last[i] if value >= last[i] else value
            last[i] = value
    return lost[0], lost[1], lost[2]


# -- rendering -------------------------------------------------------------------------------


def _n(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:,.2f} GB/s"


def _bucket(value: float | None) -> str:
    """A percentile of a log2 histogram as the range of its bucket ("32-63")."""
    if value is None:
        return "-"
    low = 1 << max(int(value).bit_length() - 1, 0)
    return f"{low:,}-{2 * low - 1:,}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _rows(s: JobSummary) -> list[tuple[str, str, float | None]]:
    """(label, shown value, comparable value) for the table and the ratios."""
    h2d, d2h = s.copy_bytes("H2D"), s.copy_bytes("D2H")
    return [
        ("active time", _n(s.active_s, " s", 1), s.active_s),
        ("kernel launches", _n(s.launches), s.launches),
        ("launch rate (/s)", _n(s.launch_rate), s.launch_rate),
        ("captured into graphs", _n(s.captured_launches), s.captured_launches),
        ("graph launches", _n(s.graph_launches), s.graph_launches),
        ("graph kernel nodes run", _n(s.graph_kernel_nodes), s.graph_kernel_nodes),
        ("grid blocks p50", _bucket(s.grid_blocks_p50), s.grid_blocks_p50),
        ("grid blocks p90", _bucket(s.grid_blocks_p90), s.grid_blocks_p90),
        ("block threads p50", _bucket(s.block_threads_p50), s.block_threads_p50),
        ("H2D bytes", _bytes(h2d), h2d),
        ("D2H bytes", _bytes(d2h), d2h),
        ("H2D bandwidth (sync)", _rate(s.bandwidth("H2D")), s.bandwidth("H2D")),
        ("D2H bandwidth (sync)", _rate(s.bandwidth("D2H")), s.bandwidth("D2H")),
        ("CPU blocked on the GPU (% of active time)", _pct(s.blocked_share), s.blocked_share),
        ("CPU blocked on the GPU in syncs", _n(s.sync_ns / 1e9, " s", 3), s.sync_ns),
        ("CPU blocked on the GPU in synchronous copies", _n(s.copy_ns / 1e9, " s", 3),
         s.copy_ns),
        ("GPU utilization", _n(s.gpu_utilization_pct, "%", 1), s.gpu_utilization_pct),
        ("peak live bytes", _bytes(s.peak_live_bytes), s.peak_live_bytes),
        ("memory-bound windows", f"{s.memory_bound_windows}/{s.judged_windows}",
         s.memory_bound_windows),
        ("failed calls", _n(s.errors), s.errors),
        ("events lost by the producer", _n(s.events_lost), s.events_lost),
        ("events not counted (late, ahead of the clock)",
         f"{s.uncounted_late:,}, {s.uncounted_future:,}", s.uncounted_late + s.uncounted_future),
    ]


def render_job(s: JobSummary) -> str:
    table = [[label, shown] for label, shown, _ in _rows(s)]
    out = [f"job {s.job} on {', '.join(s.hosts) or '-'}  (windows of {s.window_s:g} s)",
           tabulate(table, tablefmt="plain", colalign=("left", "right"))]
    if s.launches_by_api:
        by_api = sorted(s.launches_by_api.items(), key=lambda kv: (-kv[1], kv[0]))
        out += ["", tabulate(by_api,
                             headers=["launches by layer/api", "count"], tablefmt="simple",
                             intfmt=",")]
    if s.top_kernels:
        out += ["", tabulate(s.top_kernels, headers=["top kernels", "launches"],
                             tablefmt="simple", intfmt=",")]
    if s.copies:
        copies = [[k, f"{int(c['count']):,}", _bytes(c["bytes"]), _rate(s.bandwidth(k))]
                  for k, c in sorted(s.copies.items())]
        out += ["", tabulate(copies, headers=["copies", "count", "bytes", "sync bandwidth"],
                             tablefmt="simple", colalign=("left", "right", "right", "right"))]
    if len(s.devices) > 1:
        devices = [[d, f"{c[Fields.LAUNCHES]:,}", f"{c[Fields.COPIES]:,}",
                    *(_bytes(c[k]) if k in c else "-" for k in ("H2D", "D2H", "D2D")),
                    _n((c[Fields.SYNC_NS] + c[Fields.COPY_NS]) / 1e9, " s", 3)]
                   for d, c in s.devices.items()]
        out += ["", tabulate(devices, headers=["device", "kernel launches", "copies", "H2D",
                                               "D2H", "D2D", "CPU blocked on the GPU"],
                             tablefmt="simple", colalign=("left", *["right"] * 6))]
    if s.anomalies:
        out += ["", "bandwidth anomalies: " + ", ".join(f"{k}: {n}"
                                                        for k, n in sorted(s.anomalies.items()))]
    if s.memory_bound_alerts:
        out += [f"memory-bound alerts: {s.memory_bound_alerts}"]
    if s.events_lost:
        out += [f"warning: the producer lost {s.events_lost:,} events of this job"
                f" ({s.lost_kernel:,} in the kernel ring buffer, {s.lost_user:,} beyond its"
                f" Kafka queue, {s.lost_agent_died:,} captured by a producer that was killed"
                " before it published them); the counts above are lower bounds"]
    if s.uncounted_late or s.uncounted_future:
        out += [f"warning: {s.uncounted_late + s.uncounted_future:,} events of this job were not"
                f" counted ({s.uncounted_late:,} late beyond grace, {s.uncounted_future:,} stamped"
                " too far ahead of the worker's clock); they are in the dead-letter topic"]
    return "\n".join(out)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "-"
    return f"{b / a:.2f}x"


def render_compare(a: JobSummary, b: JobSummary) -> str:
    """The kernel-fusion table: A and B side by side, with B / A."""
    table = [[label, shown_a, shown_b, _ratio(value_a, value_b)]
             for (label, shown_a, value_a), (_, shown_b, value_b)
             in zip(_rows(a), _rows(b), strict=True)]
    return tabulate(table, headers=["", a.job, b.job, "B vs A"], tablefmt="simple",
                    colalign=("left", "right", "right", "right"))


def render_json(summaries: list[JobSummary]) -> str:
    def one(s: JobSummary) -> Mapping[str, Any]:
        return {**asdict(s), "launch_rate": s.launch_rate, "blocked_share": s.blocked_share,
                "active_s": s.active_s, "events_lost": s.events_lost}

    return orjson.dumps([one(s) for s in summaries], option=orjson.OPT_INDENT_2).decode()
