"""grafana/: the files are what grafana/generate.py writes, valid against grafana-foundation-sdk's
models, name only the InfluxDB contract, and every query of every panel, annotation, variable
and alert rule returns the expected series and values from an InfluxDB the pipeline filled.

No Grafana runs here: tests/grafana_eval.py does what Grafana does with the files (variables,
$timeFilter, $__interval, reduce and threshold expressions, summary templates).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
import yaml

from gpuflight.grafana import generate
from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import API_IDS, COPY_KINDS, LAYER_DRIVER, LAYER_RUNTIME
from gpuflight.streams import aggregate, detect
from gpuflight.streams import measurements as m
from gpuflight.streams.aggregate import bucket_of
from gpuflight.streams.influxql import Series
from gpuflight.streams.measurements import Fields, Tags
from tests.conftest import REPO
from tests.support.grafana_eval import (
    Labels,
    contract_problems,
    evaluate,
    influxql,
    interpolate,
    render,
)
from tests.support.grafana_scenarios import COPIER, HOST, WINDOW_S, events, write_points
from tests.support.pipeline_fixture import PipelineRun

pytestmark = pytest.mark.influx

GRAFANA = REPO / "grafana"
DASHBOARD_FILES = sorted((GRAFANA / "dashboards").glob("*.json"))
ALERTING_FILE = GRAFANA / "provisioning" / "alerting" / "gpuflight.yaml"
DS = generate.DATASOURCE_UID


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in DASHBOARD_FILES}


def alerting() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ALERTING_FILE.read_text())
    return loaded


def rules() -> dict[str, dict[str, Any]]:
    return {r["uid"]: r for g in alerting()["groups"] for r in g["rules"]}


def every_query() -> Iterator[tuple[str, str]]:
    """(where, InfluxQL) of every panel target, annotation, variable and alert query."""
    for name, board in dashboards().items():
        for p in board["panels"]:
            for t in p["targets"]:
                yield f"{name}/{p['title']}/{t['refId']}", t["query"]
        for a in board["annotations"]["list"]:
            if "target" in a:
                yield f"{name}/annotation {a['name']}", a["target"]["query"]
        for v in board["templating"]["list"]:
            if v["type"] == "query":  # not a textbox ($trace_url)
                yield f"{name}/${v['name']}", v["query"]
    for uid, r in rules().items():
        for item in r["data"]:
            if item["datasourceUid"] == DS:
                yield f"{uid}/{item['refId']}", item["model"]["query"]


# -- the files -------------------------------------------------------------------------------


def test_queries_name_only_the_contract() -> None:
    seen: set[str] = set()
    for where, query in every_query():
        names, problems = contract_problems(query)
        assert not problems, f"{where}: {problems}"
        assert names.measurements, where
        seen |= names.measurements
    assert seen == set(m.ALL)  # every measurement is shown somewhere


# -- every panel against the pipeline's data -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Context:
    run: PipelineRun
    jobs: Sequence[str]  # keys of run.jobs the dashboard is shown for
    variables: Mapping[str, Sequence[str]]
    interval_s: float
    has_gpu: bool  # NVML samples of the host
    gpu_jobs: frozenset[str]  # jobs NVML saw processes of

    def job(self, key: str) -> str:
        return self.run.jobs[key]

    def expected(self, key: str) -> Any:
        return self.run.expected[key]


Check = Callable[[list[Series], Context], None]


def by_tag(series: list[Series], tag: str) -> dict[str, Series]:
    out = {s.tags[tag]: s for s in series}
    assert len(out) == len(series), f"several series per {tag}"
    return out


def total(series: Series | list[Series], column: str) -> float:
    items = series if isinstance(series, list) else [series]
    return math.fsum(v for s in items for v in s.numbers(column))


def per_interval_total(series: Series | list[Series], column: str, ctx: Context) -> float:
    """A rate panel's values times the interval: what it counted."""
    return total(series, column) * ctx.interval_s


def approx(value: float, expected: float) -> None:
    assert value == pytest.approx(expected, rel=1e-9), (value, expected)


def launches_of(keys: Sequence[str], ctx: Context) -> int:
    return sum(ctx.expected(k).launches for k in keys)


def check_launches_by_host(series: list[Series], ctx: Context) -> None:
    approx(per_interval_total(by_tag(series, Tags.HOST)[ctx.run.host], "launches", ctx),
           launches_of(ctx.jobs, ctx))


def check_bytes_by_kind(column: str) -> Check:
    def check(series: list[Series], ctx: Context) -> None:
        kinds = by_tag(series, Tags.KIND)
        assert set(kinds) <= set(m.COPY_KIND_VALUES)
        approx(per_interval_total(kinds["H2D"], column, ctx),
               sum(ctx.expected(k).h2d_bytes for k in ctx.jobs))
        approx(per_interval_total(kinds["D2H"], column, ctx),
               sum(ctx.expected(k).d2h_bytes for k in ctx.jobs))
    return check


def check_per_job(column: str, low: float, high: float) -> Check:
    def check(series: list[Series], ctx: Context) -> None:
        jobs = {s.tags[Tags.JOB] for s in series}
        assert jobs == {ctx.job(k) for k in ctx.jobs}
        values = [v for s in series for v in s.numbers(column)]
        assert values and all(low <= v <= high for v in values)
    return check


def check_gpu(column: str, tags: set[str], *, of_job: str | None = None,
              of_view_jobs: bool = False) -> Check:
    """NVML's numbers, there where NVML gave them: the host's GPUs, or the processes of the
    job `of_job` (a key of run.jobs) or of the view's jobs."""
    def check(series: list[Series], ctx: Context) -> None:
        if of_job is not None:
            present = ctx.job(of_job) in ctx.gpu_jobs
        elif of_view_jobs:
            present = all(ctx.job(k) in ctx.gpu_jobs for k in ctx.jobs)
        else:
            present = ctx.has_gpu
        if not present:
            assert series == [], "GPU series without NVML samples"
            return
        assert series and all(set(s.tags) == tags for s in series)
        values = [v for s in series for v in s.numbers(column)]
        assert values and all(0 <= v <= 100 for v in values)
    return check


def rows(series: list[Series]) -> dict[str, dict[str, Any]]:
    """A table's rows by job (tags as columns, as Grafana shows them)."""
    out: dict[str, dict[str, Any]] = {}
    for s in series:
        (row,) = s.values
        out[s.tags[Tags.JOB]] = {**s.tags, **dict(zip(s.columns, row, strict=True))}
    return out


def check_ranked(field_name: str, expected: Callable[[Any], float]) -> Check:
    def check(series: list[Series], ctx: Context) -> None:
        table = rows(series)
        assert set(table) == {ctx.job(k) for k in ctx.jobs}
        for k in ctx.jobs:
            assert table[ctx.job(k)][field_name] == expected(ctx.expected(k))
    return check


def check_memory_bound_table(series: list[Series], ctx: Context) -> None:
    table = rows(series)
    alert_windows = detect.DetectSettings().alert_windows
    for k in ctx.jobs:
        row = table[ctx.job(k)]
        assert (row["memory_bound_windows"] >= alert_windows) == ctx.expected(k).memory_bound
        assert row["memory_bound"] == int(row["memory_bound_windows"] > 0)


def check_pipeline(series: list[Series], ctx: Context) -> None:
    (s,) = series
    assert s.tags == {Tags.HOST: ctx.run.host}
    assert max(s.numbers("captured")) > 0 and max(s.numbers("published")) > 0
    assert s.numbers("dropped_kernel") and not any(s.numbers("dropped_kernel"))
    assert not any(s.numbers("dropped_user"))


def check_nothing_lost(series: list[Series], ctx: Context) -> None:
    assert series == [], "the pipeline run lost no event"


def check_nothing_uncounted(series: list[Series], ctx: Context) -> None:
    assert series == [], "the worker counted every event of the pipeline run (none late)"


def check_lag(series: list[Series], ctx: Context) -> None:
    assert series and all(set(s.tags) == {Tags.WORKER} for s in series)
    assert all(v >= 0 for s in series for v in s.numbers("lag"))


def check_launch_layers(series: list[Series], ctx: Context) -> None:
    for s in series:
        assert s.tags[Tags.LAYER] in {LAYER_RUNTIME, LAYER_DRIVER}
        assert s.tags[Tags.API] in {*API_IDS, m.UNKNOWN_API}
    approx(per_interval_total(series, "launches", ctx), launches_of(ctx.jobs, ctx))


def check_top_kernels(series: list[Series], ctx: Context) -> None:
    kernels = by_tag(series, Tags.KERNEL)
    assert kernels
    assert sum(total(s, "launches") for s in kernels.values()) == launches_of(ctx.jobs, ctx)


def check_histogram(which: str) -> Check:
    def check(series: list[Series], ctx: Context) -> None:
        (key,) = ctx.jobs
        value = getattr(ctx.expected(key), which)
        buckets = {b: total(s, "launches") for b, s in by_tag(series, Tags.BUCKET).items()}
        # All launches of the job have one shape: one bucket, log2 of it, holds them all.
        assert {b: n for b, n in buckets.items() if n} == {
            m.bucket_label(bucket_of(value)): ctx.expected(key).launches}
    return check


def check_percentiles(series: list[Series], ctx: Context) -> None:
    (key,) = ctx.jobs
    blocks = ctx.expected(key).grid_blocks
    (s,) = series
    for column in ("p50", "p90", "p99"):
        assert s.numbers(column)
        assert all(bucket_of(int(v)) == bucket_of(blocks) for v in s.numbers(column))


def check_kinds(series: list[Series], ctx: Context) -> None:
    kinds = by_tag(series, Tags.KIND)
    assert set(kinds) <= set(m.COPY_KIND_VALUES)
    assert {"H2D", "D2H"} <= set(kinds)
    for s in kinds.values():
        assert all(v >= 0 for v in s.numbers(s.columns[1]))


def check_memsets(series: list[Series], ctx: Context) -> None:
    for s in series:  # the demo sets no memory: none, or bytes per second
        assert s.tags == {} and all(v >= 0 for v in s.numbers("bytes"))


def check_bandwidth(series: list[Series], ctx: Context) -> None:
    """The workloads' H2D copies are synchronous (their D2H ones need not be): a bandwidth,
    never 0, in every interval that had some."""
    kinds = by_tag(series, Tags.KIND)
    assert "H2D" in kinds and set(kinds) <= set(m.COPY_KIND_VALUES)
    values = [v for s in kinds.values() for v in s.numbers(s.columns[1])]
    assert values and all(v > 0 for v in values)


def check_columns_non_negative(*columns: str) -> Check:
    def check(series: list[Series], ctx: Context) -> None:
        assert series
        for s in series:
            for c in columns:
                assert s.numbers(c) and all(v >= 0 for v in s.numbers(c))
    return check


def check_live_memory(series: list[Series], ctx: Context) -> None:
    (s,) = series
    for live, peak in zip(s.column("live"), s.column("peak"), strict=True):
        assert live is None or (isinstance(live, int | float) and isinstance(peak, int | float)
                                and 0 <= live <= peak)


def check_scopes(column: str) -> Check:
    def check(series: list[Series], ctx: Context) -> None:
        scopes = by_tag(series, Tags.SCOPE)
        assert scopes and set(scopes) <= set(m.SYNC_SCOPE_VALUES)
        assert all(v >= 0 for s in scopes.values() for v in s.numbers(column))
    return check


def check_verdict(series: list[Series], ctx: Context) -> None:
    (key,) = ctx.jobs
    (s,) = series
    held = max(s.numbers("consecutive_windows"))
    assert (held >= detect.DetectSettings().alert_windows) == ctx.expected(key).memory_bound
    assert set(s.numbers("verdict")) <= {0, 1}


def check_errors(series: list[Series], ctx: Context) -> None:
    assert all(s.tags[Tags.API] in {*API_IDS, m.UNKNOWN_API} for s in series)


def anomalies_of(run: PipelineRun, jobs: Sequence[str], from_ns: int,
                 to_ns: int) -> set[tuple[str, str, str]]:
    """(job, kind, direction) of the run's host the detector flagged in the time range."""
    found = influxql(run.influx_url, run.database,
                     f'SELECT count("{Fields.RATIO}") FROM "{m.BANDWIDTH_ANOMALY.name}" '
                     f"WHERE \"{Tags.HOST}\" = '{run.host}' AND time >= {from_ns} "
                     f'AND time <= {to_ns} '
                     f'GROUP BY "{Tags.JOB}", "{Tags.KIND}", "{Tags.DIRECTION}"')
    return {(s.tags[Tags.JOB], s.tags[Tags.KIND], s.tags[Tags.DIRECTION]) for s in found
            if s.tags[Tags.JOB] in jobs}


def check_anomaly_baseline(series: list[Series], ctx: Context) -> None:
    jobs = [ctx.job(k) for k in ctx.jobs]
    if not anomalies_of(ctx.run, jobs, ctx.run.start_ns, ctx.run.end_ns):
        assert series == []  # the detector found nothing: nothing to draw
    for s in series:
        assert s.tags[Tags.KIND] in m.COPY_KIND_VALUES and all(
            v > 0 for v in s.numbers("baseline"))


def check_anomaly_table(series: list[Series], ctx: Context) -> None:
    for s in series:
        for kind, direction in zip(s.column(Tags.KIND), s.column(Tags.DIRECTION), strict=True):
            assert kind in m.COPY_KIND_VALUES and direction in m.DIRECTIONS


def check_side(column: str, key: str, what: str) -> Check:
    def check(series: list[Series], ctx: Context) -> None:
        expected = ctx.expected(key)
        if what == "launches":
            (s,) = series
            approx(per_interval_total(s, column, ctx), expected.launches)
        elif what == "grid":
            (s,) = series
            assert s.numbers(column)
            assert all(bucket_of(int(v)) == bucket_of(expected.grid_blocks)
                       for v in s.numbers(column))
        else:
            check_gpu(column, set(), of_job=key)(series, ctx)
    return check


def check_fusion_cell(column: str) -> Check:
    def check(series: list[Series], ctx: Context) -> None:
        key = UNFUSED if column.endswith("_a") else FUSED
        if column.startswith("gpu_util") and ctx.job(key) not in ctx.gpu_jobs:
            assert series == []
            return
        (s,) = series
        (value,) = s.numbers(column)
        assert value > 0
    return check


def check_device_launches(series: list[Series], ctx: Context) -> None:
    """The demo workloads run on one device: device 0 has every launch."""
    devices = by_tag(series, Tags.DEVICE)
    assert set(devices) == {"0"}, set(devices)
    approx(per_interval_total(devices["0"], "launches", ctx), launches_of(ctx.jobs, ctx))


def check_device_bytes(series: list[Series], ctx: Context) -> None:
    devices = by_tag(series, Tags.DEVICE)
    assert set(devices) == {"0"}, set(devices)
    (s,) = devices.values()
    assert s.columns[1:] == list(m.COPY_KIND_VALUES)
    approx(per_interval_total(s, "H2D", ctx), sum(ctx.expected(k).h2d_bytes for k in ctx.jobs))
    approx(per_interval_total(s, "D2H", ctx), sum(ctx.expected(k).d2h_bytes for k in ctx.jobs))
    assert total(s, "D2D") == total(s, "H2H") == 0


def check_device_blocked(series: list[Series], ctx: Context) -> None:
    """Device 0 has the CPU's waits: what the job's syncs and synchronous copies took."""
    devices = by_tag(series, Tags.DEVICE)
    assert set(devices) == {"0"}, set(devices)
    (s,) = devices.values()
    jobs = "|".join(re.escape(ctx.job(k)) for k in ctx.jobs)
    where = (f"WHERE \"{Tags.JOB}\" =~ /^({jobs})$/ AND \"{Tags.HOST}\" = '{ctx.run.host}' "
             f"AND time >= {ctx.run.start_ns} AND time <= {ctx.run.end_ns}")
    (blocked,) = influxql(ctx.run.influx_url, ctx.run.database,
                          f'SELECT sum("{Fields.SYNC_NS}") AS "syncs", sum("{Fields.COPY_NS}") '
                          f'AS "copies" FROM "{m.CPU_BLOCKED.name}" {where}')
    approx(per_interval_total(s, "in_syncs", ctx) * 1e9, blocked.numbers("syncs")[0])
    approx(per_interval_total(s, "in_synchronous_copies", ctx) * 1e9,
           blocked.numbers("copies")[0])
    assert blocked.numbers("copies")[0] > 0  # the demo's H2D copies are synchronous


UNFUSED, FUSED = "unfused", "fused"

#: (dashboard, panel title, refId) → its check. Every target must have one.
CHECKS: dict[tuple[str, str, str], Check] = {
    ("fleet", "Launches/s by host", "A"): check_launches_by_host,
    ("fleet", "Copy bandwidth by direction", "A"): check_bytes_by_kind("bytes"),
    ("fleet", generate.BLOCKED_SHARE_TITLE, "A"): check_per_job("blocked", 0, 64),
    ("fleet", "GPU utilization by host", "A"): check_gpu("utilization", {Tags.HOST, Tags.GPU}),
    ("fleet", "Jobs ranked", "A"): check_ranked("launches", lambda e: e.launches),
    ("fleet", "Jobs ranked", "B"): check_ranked("bytes_moved",
                                                lambda e: e.h2d_bytes + e.d2h_bytes),
    ("fleet", "Jobs ranked", "C"): check_memory_bound_table,
    ("fleet", "Pipeline: events/s captured, published, dropped", "A"): check_pipeline,
    ("fleet", "Stream workers: consumer lag", "A"): check_lag,
    ("job", "Launches/s by API and layer", "A"): check_launch_layers,
    ("job", "Top kernels", "A"): check_top_kernels,
    ("job", "Grid size: blocks per launch (log2)", "A"): check_histogram("grid_blocks"),
    ("job", "Block size: threads per block (log2)", "A"): check_histogram("block_threads"),
    ("job", "Grid size percentiles (blocks)", "A"): check_percentiles,
    ("job", generate.DEVICE_LAUNCHES_TITLE, "A"): check_device_launches,
    ("job", generate.DEVICE_BYTES_TITLE, "A"): check_device_bytes,
    ("job", generate.DEVICE_BLOCKED_TITLE, "A"): check_device_blocked,
    ("job", "Copies/s by kind", "A"): check_kinds,
    ("job", "Bytes copied/s by kind, and memset", "A"): check_bytes_by_kind("bytes"),
    ("job", "Bytes copied/s by kind, and memset", "B"): check_memsets,
    ("job", "Achieved bandwidth of synchronous copies", "A"): check_bandwidth,
    ("job", "Allocations and frees", "A"): check_columns_non_negative("allocated", "freed"),
    ("job", "Live device memory", "A"): check_live_memory,
    ("job", "Syncs/s by scope", "A"): check_scopes("syncs"),
    ("job", generate.BLOCKED_PARTS_TITLE, "A"): check_scopes("waiting"),
    ("job", generate.BLOCKED_PARTS_TITLE, "B"):
        check_columns_non_negative("in_synchronous_copies"),
    ("job", "GPU utilization (NVML)", "A"): check_gpu("gpu", {Tags.GPU}),
    ("job", "GPU utilization (NVML)", "B"): check_gpu("job_sm", {Tags.GPU}, of_view_jobs=True),
    ("job", "Memory-bound verdict", "A"): check_verdict,
    ("job", "Failed calls by API", "A"): check_errors,
    ("job", "Events lost by the producer", "A"): check_nothing_lost,
    ("job", "Events not counted by the stream worker", "A"): check_nothing_uncounted,
    ("transfers", "Achieved bandwidth vs baseline", "A"): check_bandwidth,
    ("transfers", "Achieved bandwidth vs baseline", "B"): check_anomaly_baseline,
    ("transfers", "Bytes copied/s vs baseline", "A"): check_bytes_by_kind("observed"),
    ("transfers", "Bytes copied/s vs baseline", "B"): check_anomaly_baseline,
    ("transfers", "Anomalies", "A"): check_anomaly_table,
    ("fusion", "Launches/s", "A"): check_side("launches", UNFUSED, "launches"),
    ("fusion", "Launches/s", "B"): check_side("launches", FUSED, "launches"),
    ("fusion", "Grid size p50 (blocks)", "A"): check_side("p50", UNFUSED, "grid"),
    ("fusion", "Grid size p50 (blocks)", "B"): check_side("p50", FUSED, "grid"),
    ("fusion", "GPU utilization of the job (SM %)", "A"): check_side("sm", UNFUSED, "gpu"),
    ("fusion", "GPU utilization of the job (SM %)", "B"): check_side("sm", FUSED, "gpu"),
    **{("fusion", "Kernel fusion: $job vs $compare_job", f"{ref}{i}"):
       check_fusion_cell(f"{name}_{side}")
       for ref, side in (("A", "a"), ("B", "b"))
       for i, (name, _) in enumerate(generate.COMPARED, start=1)},
}

def views(run: PipelineRun, dashboard: str) -> list[tuple[str, ...]]:
    """The jobs (keys of run.jobs) each view of `dashboard` shows (the demo workloads serve
    no requests and are not sampled: "requests" is proved on the request pipeline,
    tests/system/test_requests_pipeline.py, and "paths" on the code paths' one,
    tests/system/test_codepaths_pipeline.py)."""
    if dashboard in ("requests", "paths"):
        return []
    if dashboard == "fleet":
        return [tuple(run.jobs)]
    if dashboard == "fusion":
        return [(UNFUSED, FUSED)]
    return [(key,) for key in run.jobs]


def nvml_of(run: PipelineRun) -> tuple[bool, frozenset[str]]:
    """Whether NVML samples of the run's host are there (none without a GPU), and the jobs
    whose processes they name."""
    where = (f"WHERE \"{Tags.HOST}\" = '{run.host}' AND time >= {run.start_ns} "
             f"AND time <= {run.end_ns}")
    gpus = influxql(run.influx_url, run.database, f'SELECT count(*) FROM "{m.GPU.name}" {where}')
    jobs = influxql(run.influx_url, run.database,
                    f'SELECT count(*) FROM "{m.GPU_PROCESS.name}" {where} GROUP BY "{Tags.JOB}"')
    return bool(gpus), frozenset(s.tags[Tags.JOB] for s in jobs)


def resolve_variables(board: Mapping[str, Any], run: PipelineRun,
                      jobs: tuple[str, ...]) -> dict[str, Sequence[str]]:
    """Run each variable's query (with the variables before it), check what it offers, and
    pick: the run's host, the view's job(s), every GPU ("All")."""
    chosen: dict[str, Sequence[str]] = {}
    for v in board["templating"]["list"]:
        query = interpolate(v["query"], chosen, run.start_ns, run.end_ns, run.window_s)
        offered = [str(row[1]) for s in influxql(run.influx_url, run.database, query)
                   for row in s.values]
        if v["name"] == "host":
            assert run.host in offered
            chosen["host"] = [run.host]
        elif v["name"] == "job":
            assert {run.jobs[k] for k in jobs} <= set(offered)
            chosen["job"] = [run.jobs[k] for k in jobs] if v["multi"] else [run.jobs[jobs[0]]]
        elif v["name"] == "compare_job":
            assert not v["multi"] and run.jobs[jobs[1]] in offered
            chosen["compare_job"] = [run.jobs[jobs[1]]]
        else:
            assert v["name"] == "gpu"
            chosen["gpu"] = offered or ["none"]
    return chosen


@pytest.mark.bpf
@pytest.mark.kafka
def test_every_panel_query_returns_the_pipeline_numbers(pipeline: PipelineRun) -> None:
    run = pipeline
    gpu, gpu_jobs = nvml_of(run)
    exercised: set[tuple[str, str, str]] = set()
    for name, board in dashboards().items():
        for jobs in views(run, name):
            variables = resolve_variables(board, run, jobs)
            ctx = Context(run, jobs, variables, run.window_s, gpu, gpu_jobs)
            for p in board["panels"]:
                for t in p["targets"]:
                    key = (name, p["title"], t["refId"])
                    assert key in CHECKS, f"no check for {key}"
                    query = interpolate(t["query"], variables, run.start_ns, run.end_ns,
                                        run.window_s)
                    series = influxql(run.influx_url, run.database, query)
                    try:
                        CHECKS[key](series, ctx)
                    except AssertionError as error:
                        raise AssertionError(f"{key} {jobs}: {error}\n{query}") from None
                    exercised.add(key)
    assert exercised == set(CHECKS)


@pytest.mark.bpf
@pytest.mark.kafka
def test_the_fusion_table_shows_the_ratios(pipeline: PipelineRun) -> None:
    """The showcase: the table's queries, merged and divided as its transformations say."""
    run = pipeline
    board = dashboards()["fusion"]
    (table,) = [p for p in board["panels"] if p["type"] == "table"]
    variables = resolve_variables(board, run, (UNFUSED, FUSED))
    row: dict[str, Any] = {}
    for t in table["targets"]:
        query = interpolate(t["query"], variables, run.start_ns, run.end_ns, run.window_s)
        for s in influxql(run.influx_url, run.database, query):
            (values,) = s.values
            row.update(dict(zip(s.columns[1:], values[1:], strict=True)))
    transformations = [tr["id"] for tr in table["transformations"]]
    assert transformations[0] == "merge" and transformations[-1] == "organize"
    for tr in table["transformations"][1:-1]:
        assert tr["id"] == "calculateField" and tr["options"]["mode"] == "binary"
        binary = tr["options"]["binary"]
        assert binary["operator"] == "/"
        left, right = row.get(binary["left"]), row.get(binary["right"])
        row[tr["options"]["alias"]] = None if left is None or not right else left / right
    a, b = run.expected[UNFUSED], run.expected[FUSED]
    assert row["launches_a"] == a.launches and row["launches_b"] == b.launches
    approx(row["launches_ratio"] or 0, a.launches / b.launches)
    assert bucket_of(int(row["grid_blocks_a"] or 0)) == bucket_of(a.grid_blocks)
    assert bucket_of(int(row["grid_blocks_b"] or 0)) == bucket_of(b.grid_blocks)
    ratio = row["grid_blocks_ratio"] or 0
    assert ratio == pytest.approx(2.0 ** (bucket_of(a.grid_blocks) - bucket_of(b.grid_blocks)))
    assert (row["launches_per_s_ratio"] or 0) > 0
    if {run.jobs[UNFUSED], run.jobs[FUSED]} <= nvml_of(run)[1]:
        assert row["gpu_util_ratio"] is not None and row["gpu_util_ratio"] > 0


@pytest.mark.bpf
@pytest.mark.kafka
def test_annotation_queries_run(pipeline: PipelineRun) -> None:
    run = pipeline
    for name, board in dashboards().items():
        if not views(run, name):
            continue
        shown = views(run, name)[0]
        variables = resolve_variables(board, run, shown)
        for a in board["annotations"]["list"]:
            if "target" not in a:
                continue
            query = interpolate(a["target"]["query"], variables, run.start_ns, run.end_ns,
                                run.window_s)
            series = influxql(run.influx_url, run.database, query)
            for s in series:
                assert a["target"]["textColumn"] in s.columns
                assert set(a["target"]["tagsColumn"].split(",")) <= set(s.tags)
            if a["name"] == "Memory-bound alerts":
                memory_bound = {run.jobs[k] for k in shown if run.expected[k].memory_bound}
                assert {s.tags[Tags.JOB] for s in series} == memory_bound


# -- alert rules against the pipeline's data -------------------------------------------------


def job_of(labels: Labels) -> str:
    return dict(labels)[Tags.JOB]


def summary(uid: str, evaluation: Any, labels: Labels) -> str:
    return render(rules()[uid]["annotations"]["summary"], labels,
                  evaluation.values_for(labels))


def run_rule(uid: str, url: str, database: str, now_ns: int) -> Any:
    return evaluate(rules()[uid], DS, url, database, now_ns)


def mine(run: PipelineRun, firing: list[Labels]) -> list[Labels]:
    """The instances of the run's host and jobs (other tests share the database)."""
    def of_the_run(labels: Labels) -> bool:
        found = dict(labels)
        job = found.get(Tags.JOB)
        return found[Tags.HOST] == run.host and (job is None or job in run.jobs.values())

    return [f for f in firing if of_the_run(f)]


@pytest.mark.bpf
@pytest.mark.kafka
def test_the_memory_bound_rule_fires_for_the_memory_bound_job(pipeline: PipelineRun) -> None:
    run = pipeline
    assert run.end_ns - run.start_ns <= generate.RULE_RANGE_S * 10**9, "the rule sees 5 min"
    evaluation = run_rule("gpuflight-memory-bound", run.influx_url, run.database, run.end_ns)
    expected = {run.jobs[k] for k, e in run.expected.items() if e.memory_bound}
    assert {job_of(f) for f in mine(run, evaluation.firing)} == expected
    for labels in mine(run, evaluation.firing):
        values = evaluation.values_for(labels)
        assert values["WINDOWS"] >= detect.DetectSettings().alert_windows
        text = summary("gpuflight-memory-bound", evaluation, labels)
        assert text.startswith(f"{job_of(labels)} on {run.host} is memory-bound")
        assert f"held {values['WINDOWS']:g} consecutive windows" in text
        assert "%" in text and "B copied per kernel launch" in text
    for k, e in run.expected.items():
        if not e.memory_bound:
            labels = ((Tags.HOST, run.host), (Tags.JOB, run.jobs[k]))
            assert evaluation.numbers["FIRING"][labels] == 0


@pytest.mark.bpf
@pytest.mark.kafka
def test_the_launch_rate_rule_reads_each_jobs_busiest_window(pipeline: PipelineRun) -> None:
    run = pipeline
    storm = rules()["gpuflight-launch-storm"]
    (query,) = [item for item in storm["data"] if item["datasourceUid"] == DS]
    interval_s = query["model"]["intervalMs"] / 1000
    buckets = math.ceil(query["relativeTimeRange"]["from"] / interval_s) + 1
    evaluation = evaluate(storm, DS, run.influx_url, run.database, run.end_ns)
    for k, e in run.expected.items():
        labels = ((Tags.HOST, run.host), (Tags.JOB, run.jobs[k]))
        rate = evaluation.numbers["RATE"][labels]
        # The busiest interval holds at least the mean share of the launches, at most all.
        assert e.launches / buckets <= rate * interval_s <= e.launches
        assert evaluation.numbers["FIRING"][labels] == float(rate > generate.LAUNCH_STORM_PER_S)


@pytest.mark.bpf
@pytest.mark.kafka
def test_no_drops_no_anomaly_in_the_pipeline_run(pipeline: PipelineRun) -> None:
    run = pipeline
    dropped = run_rule("gpuflight-events-dropped", run.influx_url, run.database, run.end_ns)
    assert dropped.numbers["DROPPED"][((Tags.HOST, run.host),)] == 0.0
    assert mine(run, dropped.firing) == []
    anomaly = run_rule("gpuflight-bandwidth-anomaly", run.influx_url, run.database, run.end_ns)
    firing = {(dict(f)[Tags.JOB], dict(f)[Tags.KIND], dict(f)[Tags.DIRECTION])
              for f in mine(run, anomaly.firing)}
    since = run.end_ns - generate.RULE_RANGE_S * 10**9
    assert firing == anomalies_of(run, list(run.jobs.values()), since, run.end_ns)


@pytest.mark.bpf
@pytest.mark.kafka
def test_a_producer_that_stops_is_silent_minutes_later(pipeline: PipelineRun) -> None:
    run = pipeline
    uid = "gpuflight-producer-silent"
    # The host's last report (the pipeline's producer, or a later one of the session).
    (last,) = influxql(run.influx_url, run.database,
                       f'SELECT last("{Fields.CAPTURED}") FROM "{m.PIPELINE.name}" '
                       f"WHERE \"{Tags.HOST}\" = '{run.host}'")
    (report,) = last.rows()
    last_ns, captured = report.time_ns, report.number("last")
    assert captured is not None
    host = ((Tags.HOST, run.host),)
    soon = run_rule(uid, run.influx_url, run.database, last_ns + 30 * 10**9)
    assert host not in soon.firing
    later = last_ns + (generate.SILENT_MINUTES + 1) * 60 * 10**9
    evaluation = run_rule(uid, run.influx_url, run.database, later)
    assert host in evaluation.firing
    text = summary(uid, evaluation, host)
    assert text.startswith(f"The producer on {run.host} has sent no metrics for")
    assert f"captured {captured:g} events" in text  # what it had when last heard from
    # Long after the last report (beyond the look-back), nobody is watched any more.
    gone = last_ns + (generate.SILENT_RANGE_S + 120) * 10**9
    assert host not in run_rule(uid, run.influx_url, run.database, gone).firing


# -- alert rules on scenarios the demo does not play -----------------------------------------

SCENARIOS = "gpuflight_scenarios"
T1 = 1_700_100_000 * 10**9  # a window start


def test_scenarios_fire_with_their_evidence(influx_url: str) -> None:
    """A bandwidth drop, a launch storm and a lossy producer, made by the stream app's own
    functions into a database of their own."""
    url, window_ns = influx_url, int(WINDOW_S * 1e9)
    points: list[m.Point] = []
    detector = detect.BandwidthDetector()
    slow_job = "copy-regression"
    for i in range(12):
        t = T1 + i * window_ns
        agg = aggregate.WindowAggregate(t, HOST, slow_job)
        slower = 8 if i == 11 else 1  # the last window's copies take 8 times as long
        batch = events(dataclasses.replace(COPIER, copy_ns=COPIER.copy_ns * slower), t)
        aggregate.add_events(agg, batch)
        points += aggregate.to_points(agg, WINDOW_S)
        points += [a.to_point() for a in detector.observe(agg, WINDOW_S)]
    storm = aggregate.WindowAggregate(T1, HOST, "launch-storm")
    storm.launches[(LAYER_RUNTIME, "cudaLaunchKernel")] = 1_500_000
    points += aggregate.to_points(storm, WINDOW_S)
    lossy = "lossy-node"
    for i, (captured, dropped_kernel, dropped_user) in enumerate(
            [(100, 0, 0), (5000, 500, 0), (9000, 1200, 30), (50, 10, 0)]):  # then a restart
        record = wire.MetricsRecord(
            host=lossy, ts_ns=T1 + i * 5 * 10**9, uptime_s=5.0 * i, captured=captured,
            produced=captured, published=captured, dropped_kernel=dropped_kernel,
            dropped_kernel_by_pid={41: dropped_kernel}, dropped_user=dropped_user,
            dropped_user_by_pid={41: dropped_user}, queue_messages=7, libraries_attached=1)
        points.append(aggregate.pipeline_point(record))
        points += aggregate.lost_points(record, lambda pid: f"lossy-job:{pid}")
    write_points(url, SCENARIOS, points)
    now = T1 + 12 * window_ns

    anomaly = run_rule("gpuflight-bandwidth-anomaly", url, SCENARIOS, now)
    labels = ((Tags.DIRECTION, m.LOW_BANDWIDTH), (Tags.HOST, HOST), (Tags.JOB, slow_job),
              (Tags.KIND, "H2D"))
    assert labels in anomaly.firing
    assert {dict(f)[Tags.JOB] for f in anomaly.firing} == {slow_job}
    values = anomaly.values_for(labels)
    approx(values["RATIO"], values["OBSERVED"] / values["BASELINE"])
    assert values["RATIO"] == pytest.approx(1 / 8, rel=0.01)
    text = summary("gpuflight-bandwidth-anomaly", anomaly, labels)
    assert text.startswith(f"{slow_job} on {HOST}: H2D copies low_bandwidth")
    assert "against a baseline of" in text

    launches = run_rule("gpuflight-launch-storm", url, SCENARIOS, now)
    storm_labels = ((Tags.HOST, HOST), (Tags.JOB, "launch-storm"))
    assert launches.firing == [storm_labels]
    approx(launches.values_for(storm_labels)["RATE"], 1_500_000 / WINDOW_S)
    text = summary("gpuflight-launch-storm", launches, storm_labels)
    assert text.startswith(f"launch-storm on {HOST} launched 150k kernels per second")

    drops = run_rule("gpuflight-events-dropped", url, SCENARIOS, T1 + 60 * 10**9)
    assert drops.firing == [((Tags.HOST, lossy),)]
    # 1200 + 30 before the restart; the restart's fall to 10 is no loss.
    assert drops.values_for(((Tags.HOST, lossy),))["DROPPED"] == 1230
    text = summary("gpuflight-events-dropped", drops, ((Tags.HOST, lossy),))
    assert text.startswith(f"The producer on {lossy} dropped 1230 events")

    # The job's own panel shows what it lost, by host, as the counters stand.
    (lost_panel,) = [p for p in dashboards()["job"]["panels"]
                     if p["title"] == "Events lost by the producer"]
    query = interpolate(lost_panel["targets"][0]["query"],
                        {"host": [lossy], "job": ["lossy-job:41"]}, T1, T1 + 20 * 10**9, 5.0)
    (lost,) = influxql(url, SCENARIOS, query)
    assert lost.tags == {Tags.HOST: lossy}
    assert [v for v in lost.numbers("kernel_ring") if v is not None] == [500, 1200, 10]
    assert max(lost.numbers("kafka_queue")) == 30

    # The transfers dashboard draws the detector's baseline where it found the drop.
    board = dashboards()["transfers"]
    (panel,) = [p for p in board["panels"] if p["title"] == "Achieved bandwidth vs baseline"]
    query = interpolate(panel["targets"][1]["query"], {"host": [HOST], "job": [slow_job]},
                        T1, now, WINDOW_S)
    baselines = by_tag(influxql(url, SCENARIOS, query), Tags.KIND)
    assert set(baselines) == {"H2D", "D2H"}  # both directions slowed
    baseline = baselines["H2D"]
    approx(max(baseline.numbers("baseline")), values["BASELINE"])


def test_the_device_panels_split_a_job_by_device(influx_url: str) -> None:
    """Two windows of a job on two devices, made by the stream app's own functions: the job
    dashboard's device panels give each device its launches and bytes by direction."""
    window_ns = int(WINDOW_S * 1e9)
    job = "two-devices"
    work = {0: dataclasses.replace(COPIER, launches=30, copies=2),
            1: dataclasses.replace(COPIER, launches=7, copies=5, copy_bytes=1 << 20)}
    points: list[m.Point] = []
    for i in range(2):
        t = T1 + i * window_ns
        agg = aggregate.WindowAggregate(t, HOST, job)
        for device, w in work.items():
            batch = events(w, t)
            batch["device"] = device
            aggregate.add_events(agg, batch)
        peer = events(dataclasses.replace(COPIER, launches=0, copies=1, copy_bytes=4096), t)[:1]
        peer["dim"][:, 0] = COPY_KINDS.index("D2D")  # a peer copy, made on device 1
        peer["device"] = 1
        aggregate.add_events(agg, peer)
        points += aggregate.to_points(agg, WINDOW_S)
    write_points(influx_url, SCENARIOS, points)
    panels = {p["title"]: p for p in dashboards()["job"]["panels"]}
    variables = {"host": [HOST], "job": [job]}

    def query(title: str) -> dict[str, Series]:
        text = interpolate(panels[title]["targets"][0]["query"], variables, T1,
                           T1 + 2 * window_ns - 1, WINDOW_S)
        return by_tag(influxql(influx_url, SCENARIOS, text), Tags.DEVICE)

    launches = query(generate.DEVICE_LAUNCHES_TITLE)
    assert {d: total(s, "launches") * WINDOW_S for d, s in launches.items()} == {
        "0": 2 * 30, "1": 2 * 7}
    moved = query(generate.DEVICE_BYTES_TITLE)
    assert set(moved) == {"0", "1"}
    by_direction = {(d, kind): total(s, kind) * WINDOW_S for d, s in moved.items()
                    for kind in m.COPY_KIND_VALUES}
    assert {k: v for k, v in by_direction.items() if v} == {
        ("0", "H2D"): 2 * 2 * COPIER.copy_bytes, ("0", "D2H"): 2 * 2 * COPIER.copy_bytes,
        ("1", "H2D"): 2 * 5 << 20, ("1", "D2H"): 2 * 5 << 20, ("1", "D2D"): 2 * 4096}
    # CPU blocked: the synchronous copies' time (no syncs), seconds per second
    blocked = query(generate.DEVICE_BLOCKED_TITLE)
    assert {d: (round(total(s, "in_syncs") * WINDOW_S * 1e9),
                round(total(s, "in_synchronous_copies") * WINDOW_S * 1e9))
            for d, s in blocked.items()} == {
                "0": (0, 2 * 4 * COPIER.copy_ns), "1": (0, 2 * 11 * COPIER.copy_ns)}


def test_achieved_bandwidth_stays_right_past_9_gb_an_interval(influx_url: str) -> None:
    """The pipeline's fused job copies 10.5 GB synchronously in a few seconds: an interval that
    held over 2^63 / 1e9 bytes (9.2 GB) read as a negative bandwidth (-11e9 beside 11.2e9,
    once, in test_every_panel_query_returns_the_pipeline_numbers) where the query multiplied
    InfluxQL's integer sum by an integer, which wraps. Both bandwidth panels read it right."""
    window_ns = int(WINDOW_S * 1e9)
    job = "big-copies"
    fast = dataclasses.replace(COPIER, launches=1, copies=5, copy_bytes=1 << 30,
                               copy_ns=90_000_000)  # 5 GiB each way a window, ~12 GB/s
    points: list[m.Point] = []
    for i in range(2):
        agg = aggregate.WindowAggregate(T1 + 100 * window_ns + i * window_ns, HOST, job)
        aggregate.add_events(agg, events(fast, agg.window_start_ns))
        points += aggregate.to_points(agg, WINDOW_S)
    write_points(influx_url, SCENARIOS, points)
    expected = fast.copy_bytes * 1e9 / fast.copy_ns
    assert 2 * fast.copies * fast.copy_bytes * 1e9 > 2**63  # what the interval holds wraps
    for board, title in (("job", "Achieved bandwidth of synchronous copies"),
                         ("transfers", "Achieved bandwidth vs baseline")):
        (panel,) = [p for p in dashboards()[board]["panels"] if p["title"] == title]
        query = interpolate(panel["targets"][0]["query"], {"host": [HOST], "job": [job]},
                            T1 + 100 * window_ns, T1 + 102 * window_ns - 1, 2 * WINDOW_S)
        found = by_tag(influxql(influx_url, SCENARIOS, query), Tags.KIND)
        assert set(found) == {"H2D", "D2H"}, (board, found)
        for kind, s in found.items():
            values = [v for v in s.numbers(s.columns[1]) if v is not None]
            assert values, (board, kind)
            for value in values:
                approx(value, expected)


def test_interpolation_is_grafanas() -> None:
    query = 'SELECT 1 FROM "x" WHERE "job" =~ /^$job$/ AND $timeFilter GROUP BY time($__interval)'
    out = interpolate(query, {"job": ["a.b", "c/d"]}, 1_500_000_000, 2_500_000_001, 10)
    assert out == ('SELECT 1 FROM "x" WHERE "job" =~ /^(a\\.b|c\\/d)$/ AND '
                   "time >= 1500ms and time <= 2501ms GROUP BY time(10s)")
    with pytest.raises(AssertionError, match=r"unknown variable \$jb"):
        interpolate("$jb", {}, 0, 0, 10)
    assert re.fullmatch(r"\d+", interpolate("$__interval_ms", {}, 0, 0, 10)) is not None
