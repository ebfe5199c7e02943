"""Writes grafana/dashboards/*.json, grafana/provisioning/alerting/gpuflight.yaml and the
datasource, grafana/provisioning/datasources/gpuflight.yaml.

    .venv/bin/python -m grafana.generate           # rewrite the files
    .venv/bin/python -m grafana.generate --check   # exit 1 when a file is not what it writes

Every measurement, field and tag a query names comes from streams/measurements.py, and every
unit from its FieldSpec.unit, so the committed files follow the contract
(tests/system/test_grafana.py
checks that they are current, runs every query against InfluxDB filled by the pipeline, and
validates the files with grafana-foundation-sdk's models). Dashboards pass through those models
on the way out: what is written is what the SDK's schema encodes.

Queries are InfluxQL in Grafana's raw mode: `$timeFilter`, `$__interval`, `$__interval_ms` and
the template variables ($host, $job, $gpu: multi-value, matched as `=~ /^$var$/`) are Grafana's.
Rates are `sum(count) · 1000 / $__interval_ms`, exact whatever the interval (a multiple of the
stream app's window; panels have the window as their minimum interval).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from gpuflight.streams import measurements as m
from gpuflight.streams.measurements import Fields, Tags

ROOT: Final = Path(__file__).resolve().parent
DASHBOARD_DIR: Final = ROOT / "dashboards"
ALERTING_FILE: Final = ROOT / "provisioning" / "alerting" / "gpuflight.yaml"
DATASOURCE_FILE: Final = ROOT / "provisioning" / "datasources" / "gpuflight.yaml"
DATASOURCE_UID: Final = "gpuflight-influxdb"
#: The InfluxQL database the stream app writes (streams.settings.DEFAULT_DATABASE, which a
#: test checks this against: the generator imports only the measurements).
DATABASE: Final = "gpuflight"
DATASOURCE: Final = {"type": "influxdb", "uid": DATASOURCE_UID}
#: The stream app's default window: the least interval a panel groups by.
WINDOW: Final = f"{m.DEFAULT_WINDOW_S:g}s"
FOLDER: Final = "gpuflight"

#: Contract unit (FieldSpec.unit) → Grafana unit id.
GRAFANA_UNITS: Final[Mapping[str, str]] = {
    "": "short",
    "bytes": "bytes",
    "ns": "ns",
    "1/s": "ops",
    "bytes/s": "Bps",
    "%": "percent",
    "W": "watt",
    "C": "celsius",
    "MHz": "rotmhz",
    "share": "percentunit",
    "usd": "currencyUSD",
    "s": "s",
}

# -- alert thresholds ------------------------------------------------------------------------
#: The one term for the CPU waiting on the GPU (producer/contract/counting.py, docs/commands.md
#: "What is counted").
BLOCKED_TERM: Final = "CPU blocked on the GPU"
BLOCKED_SHARE_TITLE: Final = f"{BLOCKED_TERM}: share per process, by job"
BLOCKED_PARTS_TITLE: Final = f"{BLOCKED_TERM}: in syncs and in synchronous copies"
DEVICE_LAUNCHES_TITLE: Final = "Kernel launches/s by device"
DEVICE_BYTES_TITLE: Final = "Bytes copied/s by device and direction"
DEVICE_BLOCKED_TITLE: Final = f"{BLOCKED_TERM} by device"
#: Kernel launches per second of one job that make a launch storm.
LAUNCH_STORM_PER_S: Final = 100_000
#: A producer that sent no metrics for this long is silent (it sends them every 5 s).
SILENT_MINUTES: Final = 3
#: How far back an alert rule looks, seconds.
RULE_RANGE_S: Final = 300
#: How far back the silent-producer rule looks for hosts that did report.
SILENT_RANGE_S: Final = 3600

#: Where a request's trace id leads: a trace backend's page for one trace (Jaeger's, Tempo
#: through Grafana Explore, ...), set on the dashboard ($trace_url) and followed with the id.
TRACE_URL: Final = "http://localhost:16686/trace"
#: A route's GPU cost per request over the last RECENT_S against its baseline (the day before
#: that): the alert fires above this ratio.
COST_RATIO: Final = 2.0
RECENT_S: Final = 600
BASELINE_S: Final = 86_400

HOST: Final = f'"{Tags.HOST}" =~ /^$host$/'
JOB: Final = f'"{Tags.JOB}" =~ /^$job$/'
COMPARE_JOB: Final = f'"{Tags.JOB}" =~ /^$compare_job$/'
GPU: Final = f'"{Tags.GPU}" =~ /^$gpu$/'
EVERY: Final = "GROUP BY time($__interval)"


#: Achieved bandwidth of synchronous copies, over the windows that had some (InfluxQL
#: divides by 0 as 0, which would read as a stalled link). Divided first: InfluxQL divides
#: integers as floats, but multiplies them as int64, which wraps (an interval of over 9.2 GB
#: of copies read as a negative bandwidth).
ACHIEVED: Final = f'sum("{Fields.SYNC_BYTES}") / sum("{Fields.SYNC_NS}") * 1000000000'
TIMED: Final = f'"{Fields.SYNC_NS}" > 0'


def unit(measurement: m.Measurement, field: str) -> str:
    """The Grafana unit of a contract field."""
    return GRAFANA_UNITS[measurement.field(field).unit]


def per_second(field: str) -> str:
    return f'sum("{field}") * 1000 / $__interval_ms'


def where(*conditions: str) -> str:
    return "WHERE " + " AND ".join([*conditions, "$timeFilter"])


def tags(*keys: str) -> str:
    return "".join(f', "{k}"' for k in keys)


def target(ref: str, query: str, *, alias: str | None = None,
           table: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "refId": ref,
        "datasource": DATASOURCE,
        "query": query,
        "rawQuery": True,
        "resultFormat": "table" if table else "time_series",
    }
    if alias:
        out["alias"] = alias
    return out


# -- panels ----------------------------------------------------------------------------------


class Layout:
    """Places panels left to right, rows of 24 grid units."""

    def __init__(self) -> None:
        self.x = self.y = self.row_height = 0
        self.next_id = 1

    def place(self, width: int, height: int) -> dict[str, int]:
        if self.x + width > 24:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        pos = {"x": self.x, "y": self.y, "w": width, "h": height}
        self.x += width
        self.row_height = max(self.row_height, height)
        return pos


def panel(
    layout: Layout,
    kind: str,
    title: str,
    targets: Sequence[dict[str, Any]],
    *,
    unit_id: str,
    description: str = "",
    width: int = 12,
    height: int = 8,
    overrides: Sequence[tuple[str, str]] = (),
    options: Mapping[str, Any] | None = None,
    custom: Mapping[str, Any] | None = None,
    transformations: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A panel; `overrides`: (field name, Grafana unit) for fields whose unit differs."""
    out: dict[str, Any] = {
        "type": kind,
        "id": layout.next_id,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": layout.place(width, height),
        "interval": WINDOW,
        "targets": list(targets),
        "fieldConfig": {
            "defaults": {"unit": unit_id, **({"custom": dict(custom)} if custom else {})},
            "overrides": [
                {"matcher": {"id": "byName", "options": name},
                 "properties": [{"id": "unit", "value": value}]}
                for name, value in overrides
            ],
        },
        "options": dict(options or {}),
    }
    if transformations:
        out["transformations"] = list(transformations)
    layout.next_id += 1
    return out


def timeseries(layout: Layout, title: str, targets: Sequence[dict[str, Any]], unit_id: str,
               **kw: Any) -> dict[str, Any]:
    return panel(layout, "timeseries", title, targets, unit_id=unit_id,
                 options={"legend": {"displayMode": "table", "placement": "bottom",
                                     "showLegend": True, "calcs": ["mean", "max"]},
                          "tooltip": {"mode": "multi", "sort": "desc"}},
                 custom={"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                         "spanNulls": False},
                 **kw)


def table(layout: Layout, title: str, targets: Sequence[dict[str, Any]], unit_id: str,
          sort_by: str, **kw: Any) -> dict[str, Any]:
    return panel(layout, "table", title, targets, unit_id=unit_id,
                 options={"showHeader": True,
                          "sortBy": [{"displayName": sort_by, "desc": True}]},
                 **kw)


def heatmap(layout: Layout, title: str, target_: dict[str, Any], axis: str,
            **kw: Any) -> dict[str, Any]:
    """Pre-bucketed series ("2^i" buckets, renamed to i): log2 of the value on the y axis."""
    return panel(layout, "heatmap", title, [target_], unit_id="short",
                 options={"calculate": False,
                          "yAxis": {"axisLabel": axis, "axisPlacement": "left"},
                          "rowsFrame": {"layout": "auto"},
                          "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                          "cellValues": {"unit": "short"},
                          "tooltip": {"mode": "single", "yHistogram": True}},
                 transformations=[{"id": "renameByRegex",
                                   "options": {"regex": r"^2\^(\d+)$", "renamePattern": "$1"}}],
                 **kw)


# -- template variables ----------------------------------------------------------------------


def variable(name: str, label: str, query: str, *, multi: bool = True) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
        "query": query,
        "definition": query,
        "refresh": 2,  # on time range change: jobs come and go
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        "current": {"text": "All", "value": "$__all"} if multi else {},
        "options": [],
    }


def tag_values(measurement: m.Measurement, key: str, *conditions: str) -> str:
    filter_ = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return f'SHOW TAG VALUES FROM "{measurement.name}" WITH KEY = "{key}"{filter_}'


HOST_VAR: Final = variable("host", "Host", tag_values(m.LAUNCHES, Tags.HOST))
JOB_VAR: Final = variable("job", "Job", tag_values(m.LAUNCHES, Tags.JOB, HOST))
GPU_VAR: Final = variable("gpu", "GPU", tag_values(m.GPU, Tags.GPU, HOST))


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]],
              variables: Sequence[dict[str, Any]], *,
              annotations: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpuflight"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "schemaVersion": 41,
        "version": 1,
        "panels": panels,
        "templating": {"list": list(variables)},
        "annotations": {"list": [
            {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
             "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
             "name": "Annotations & Alerts", "type": "dashboard"},
            *annotations,
        ]},
        "links": [{"title": "gpuflight", "type": "dashboards", "tags": ["gpuflight"],
                   "asDropdown": True, "includeVars": True, "keepTime": True}],
    }


#: Keys of an InfluxDB annotation that the SDK's annotation model does not have.
INFLUX_ANNOTATION_KEYS: Final = ("target",)


def annotation(name: str, query: str, *, color: str, text_column: str,
               tags_column: str) -> dict[str, Any]:
    # The InfluxDB plugin's own annotation query: its columns travel in the target.
    return {"name": name, "datasource": DATASOURCE, "enable": True, "iconColor": color,
            "target": {"refId": "Anno", "query": query, "rawQuery": True,
                       "resultFormat": "table", "fromAnnotations": True,
                       "textColumn": text_column, "tagsColumn": tags_column}}


# -- the dashboards --------------------------------------------------------------------------


def fleet() -> dict[str, Any]:
    lay = Layout()
    jobs_filter = where(HOST, JOB)
    panels = [
        timeseries(lay, "Launches/s by host", [target(
            "A", f'SELECT {per_second(Fields.COUNT)} AS "launches" FROM "{m.LAUNCHES.name}" '
                 f'{jobs_filter} {EVERY}{tags(Tags.HOST)} fill(0)', alias="$tag_host")],
            unit(m.LAUNCHES, Fields.RATE_PER_S),
            description="Kernel launches that ran and graph launches (each once) of the "
                        "selected jobs, per host; launches captured into graphs ran nothing "
                        "and are not here."),
        timeseries(lay, "Copy bandwidth by direction", [target(
            "A", f'SELECT {per_second(Fields.BYTES)} AS "bytes" FROM "{m.COPIES.name}" '
                 f'{jobs_filter} {EVERY}{tags(Tags.KIND)} fill(0)', alias="$tag_kind")],
            unit(m.COPIES, Fields.BYTES_PER_S),
            description="Bytes copied per second by cudaMemcpyKind (H2D, D2H, D2D, ...)."),
        timeseries(lay, BLOCKED_SHARE_TITLE, [target(
            "A", f'SELECT mean("{Fields.BLOCKED_SHARE}") AS "blocked" FROM "{m.CPU_BLOCKED.name}" '
                 f'{jobs_filter} {EVERY}{tags(Tags.HOST, Tags.JOB)}',
            alias="$tag_job @ $tag_host")],
            unit(m.CPU_BLOCKED, Fields.BLOCKED_SHARE),
            description=f"{BLOCKED_TERM}, as a share per process: (time in syncs + time in "
                        "synchronous copies) / (window · the job's processes). Summed over "
                        "threads, so it can pass 100 % when several wait at once."),
        timeseries(lay, "GPU utilization by host", [target(
            "A", f'SELECT mean("{Fields.UTILIZATION_GPU_PCT}") AS "utilization" '
                 f'FROM "{m.GPU.name}" {where(HOST, GPU)} {EVERY}{tags(Tags.HOST, Tags.GPU)}',
            alias="$tag_host GPU $tag_gpu")],
            unit(m.GPU, Fields.UTILIZATION_GPU_PCT), description="NVML's GPU utilization."),
        table(lay, "Jobs ranked", [
            target("A", f'SELECT sum("{Fields.COUNT}") AS "launches" FROM "{m.LAUNCHES.name}" '
                        f'{jobs_filter} GROUP BY "{Tags.HOST}", "{Tags.JOB}"', table=True),
            target("B", f'SELECT sum("{Fields.BYTES}") AS "bytes_moved" FROM "{m.COPIES.name}" '
                        f'{jobs_filter} GROUP BY "{Tags.HOST}", "{Tags.JOB}"', table=True),
            target("C", f'SELECT max("{Fields.VERDICT}") AS "memory_bound", '
                        f'max("{Fields.CONSECUTIVE_WINDOWS}") AS "memory_bound_windows" '
                        f'FROM "{m.MEMORY_BOUND.name}" {jobs_filter} '
                        f'GROUP BY "{Tags.HOST}", "{Tags.JOB}"', table=True),
        ], "short", "launches", width=24,
            overrides=[("bytes_moved", unit(m.COPIES, Fields.BYTES))],
            transformations=[{"id": "merge", "options": {}},
                             {"id": "organize", "options": {"excludeByName": {"Time": True}}}],
            description="Launches, bytes copied and the memory-bound verdict (1: some window "
                        "held it) of each job over the time range."),
        timeseries(lay, "Pipeline: events/s captured, published, dropped", [target(
            "A", f'SELECT non_negative_derivative(last("{Fields.CAPTURED}"), 1s) AS "captured", '
                 f'non_negative_derivative(last("{Fields.PUBLISHED}"), 1s) AS "published", '
                 f'non_negative_derivative(last("{Fields.DROPPED_KERNEL}"), 1s) '
                 f'AS "dropped_kernel", '
                 f'non_negative_derivative(last("{Fields.DROPPED_USER}"), 1s) AS "dropped_user" '
                 f'FROM "{m.PIPELINE.name}" {where(HOST)} {EVERY}{tags(Tags.HOST)}',
            alias="$tag_host $col")],
            GRAFANA_UNITS["1/s"],
            description="The producers' counters, as rates: events captured by the probes, "
                        "published to Kafka, dropped in the kernel ring buffer or the "
                        "publisher's queue."),
        timeseries(lay, "Stream workers: consumer lag", [target(
            "A", f'SELECT max("{Fields.LAG_MESSAGES}") AS "lag" FROM "{m.STREAMS.name}" '
                 f'{where()} {EVERY}{tags(Tags.WORKER)}', alias="$tag_worker")],
            unit(m.STREAMS, Fields.LAG_MESSAGES),
            description="Messages the stream workers have yet to consume."),
    ]
    return dashboard("gpuflight-fleet", "gpuflight: fleet overview",
                     "Every GPU node at a glance: launches, copies, waits, GPU utilization, "
                     "jobs, and the health of the pipeline.", panels,
                     [HOST_VAR, JOB_VAR, GPU_VAR])


def job() -> dict[str, Any]:
    lay = Layout()
    f = where(HOST, JOB)
    panels = [
        timeseries(lay, "Launches/s by API and layer", [target(
            "A", f'SELECT {per_second(Fields.COUNT)} AS "launches" FROM "{m.LAUNCHES.name}" {f} '
                 f'{EVERY}{tags(Tags.LAYER, Tags.API)} fill(0)', alias="$tag_layer $tag_api")],
            unit(m.LAUNCHES, Fields.RATE_PER_S)),
        table(lay, "Top kernels", [target(
            "A", f'SELECT sum("{Fields.COUNT}") AS "launches" FROM "{m.KERNELS.name}" {f} '
                 f'GROUP BY "{Tags.KERNEL}"', table=True)], "short", "launches",
            description=f'The most launched kernels; "{m.OTHER_KERNEL}" holds the rest.'),
        heatmap(lay, "Grid size: blocks per launch (log2)", target(
            "A", f'SELECT sum("{Fields.COUNT}") AS "launches" FROM "{m.GRID_BLOCKS.name}" {f} '
                 f'{EVERY}{tags(Tags.BUCKET)} fill(0)', alias="$tag_bucket"), "log2(blocks)"),
        heatmap(lay, "Block size: threads per block (log2)", target(
            "A", f'SELECT sum("{Fields.COUNT}") AS "launches" FROM "{m.BLOCK_THREADS.name}" {f} '
                 f'{EVERY}{tags(Tags.BUCKET)} fill(0)', alias="$tag_bucket"), "log2(threads)"),
        timeseries(lay, "Grid size percentiles (blocks)", [target(
            "A", f'SELECT mean("{Fields.P50_GRID_BLOCKS}") AS "p50", '
                 f'mean("{Fields.P90_GRID_BLOCKS}") AS "p90", '
                 f'mean("{Fields.P99_GRID_BLOCKS}") AS "p99" '
                 f'FROM "{m.LAUNCH_SHAPE.name}" {f} {EVERY}', alias="$col")],
            unit(m.LAUNCH_SHAPE, Fields.P50_GRID_BLOCKS),
            description="From the log2 histograms: within a factor 2."),
        timeseries(lay, DEVICE_LAUNCHES_TITLE, [target(
            "A", f'SELECT {per_second(Fields.LAUNCHES)} AS "launches" FROM "{m.DEVICES.name}" '
                 f'{f} {EVERY}{tags(Tags.HOST, Tags.DEVICE)} fill(0)',
            alias="$tag_host device $tag_device")],
            unit(m.DEVICES, Fields.RATE_PER_S),
            description=f"Kernel launches that ran, by the CUDA device current on the calling "
                        f"thread (its ordinal in the process, as CUDA_VISIBLE_DEVICES numbers "
                        f"them: not NVML's GPU index), on each host (two hosts' device 0 are two "
                        f"GPUs). Summed over devices: the job's launches. "
                        f'"{m.OTHER_DEVICE}": ordinals beyond {m.MAX_DEVICE_TAGS - 1}.'),
        timeseries(lay, DEVICE_BYTES_TITLE, [target(
            "A", "SELECT " + ", ".join(f'{per_second(m.BYTES_OF_KIND[kind])} AS "{kind}"'
                                       for kind in m.COPY_KIND_VALUES)
                 + f' FROM "{m.DEVICES.name}" {f} {EVERY}{tags(Tags.HOST, Tags.DEVICE)} fill(0)',
            alias="$tag_host device $tag_device $col")],
            unit(m.COPIES, Fields.BYTES_PER_S),
            description="Bytes copied per second by the CUDA device current on the calling "
                        "thread, by direction (cudaMemcpyKind; \"default\": inferred from the "
                        "pointers). A copy between two devices counts once, on the caller's."),
        timeseries(lay, DEVICE_BLOCKED_TITLE, [target(
            "A", f'SELECT sum("{Fields.SYNC_NS}") / $__interval_ms / 1000000 AS "in_syncs", '
                 f'sum("{Fields.COPY_NS}") / $__interval_ms / 1000000 '
                 f'AS "in_synchronous_copies" FROM "{m.DEVICES.name}" {f} '
                 f'{EVERY}{tags(Tags.HOST, Tags.DEVICE)} fill(0)',
            alias="$tag_host device $tag_device $col")],
            unit(m.CPU_BLOCKED, Fields.BLOCKED_SHARE),
            description=f"{BLOCKED_TERM} by the CUDA device current on the waiting thread: "
                        "seconds per second in syncs and in synchronous copies, summed over "
                        "the job's threads on that device."),
        timeseries(lay, "Copies/s by kind", [target(
            "A", f'SELECT {per_second(Fields.COUNT)} AS "copies" FROM "{m.COPIES.name}" {f} '
                 f'{EVERY}{tags(Tags.KIND)} fill(0)', alias="$tag_kind")],
            unit(m.LAUNCHES, Fields.RATE_PER_S)),
        timeseries(lay, "Bytes copied/s by kind, and memset", [
            target("A", f'SELECT {per_second(Fields.BYTES)} AS "bytes" FROM "{m.COPIES.name}" '
                        f'{f} {EVERY}{tags(Tags.KIND)} fill(0)', alias="$tag_kind"),
            target("B", f'SELECT {per_second(Fields.BYTES)} AS "bytes" FROM "{m.MEMSET.name}" '
                        f'{f} {EVERY}', alias="memset"),
        ], unit(m.COPIES, Fields.BYTES_PER_S)),
        timeseries(lay, "Achieved bandwidth of synchronous copies", [target(
            "A", f'SELECT {ACHIEVED} AS "bandwidth" FROM "{m.COPIES.name}" '
                 f'{where(HOST, JOB, TIMED)} {EVERY}{tags(Tags.KIND)}', alias="$tag_kind")],
            unit(m.COPIES, Fields.BANDWIDTH_BYTES_PER_S),
            description="Bytes of synchronous copies that completed over the time the CPU "
                        "spent in them."),
        timeseries(lay, "Allocations and frees", [target(
            "A", f'SELECT {per_second(Fields.ALLOC_BYTES)} AS "allocated", '
                 f'{per_second(Fields.FREE_BYTES)} AS "freed" FROM "{m.MEMORY.name}" {f} '
                 f'{EVERY} fill(0)', alias="$col")],
            GRAFANA_UNITS["bytes/s"]),
        timeseries(lay, "Live device memory", [target(
            "A", f'SELECT last("{Fields.LIVE_BYTES}") AS "live", '
                 f'max("{Fields.PEAK_LIVE_BYTES}") AS "peak" '
                 f'FROM "{m.MEMORY.name}" {f} {EVERY} fill(previous)', alias="$col")],
            unit(m.MEMORY, Fields.LIVE_BYTES)),
        timeseries(lay, "Syncs/s by scope", [target(
            "A", f'SELECT {per_second(Fields.COUNT)} AS "syncs" FROM "{m.SYNCS.name}" {f} '
                 f'{EVERY}{tags(Tags.SCOPE)} fill(0)', alias="$tag_scope")],
            unit(m.LAUNCHES, Fields.RATE_PER_S)),
        timeseries(lay, BLOCKED_PARTS_TITLE, [
            target("A", f'SELECT sum("{Fields.SYNC_NS}") / $__interval_ms / 1000000 AS "waiting" '
                        f'FROM "{m.SYNCS.name}" {f} {EVERY}{tags(Tags.SCOPE)} fill(0)',
                   alias="in syncs: $tag_scope"),
            target("B", f'SELECT sum("{Fields.COPY_NS}") / $__interval_ms / 1000000 '
                        f'AS "in_synchronous_copies" FROM "{m.CPU_BLOCKED.name}" {f} {EVERY} '
                        'fill(0)',
                   alias="in synchronous copies"),
        ], unit(m.CPU_BLOCKED, Fields.BLOCKED_SHARE),
            description=f"{BLOCKED_TERM}, by part: seconds per second in syncs (by scope) and "
                        "in synchronous copies, summed over the job's processes and threads "
                        "(over 1: several waited at once)."),
        timeseries(lay, "GPU utilization (NVML)", [
            target("A", f'SELECT mean("{Fields.UTILIZATION_GPU_PCT}") AS "gpu" FROM "{m.GPU.name}" '
                        f'{where(HOST, GPU)} {EVERY}{tags(Tags.GPU)}', alias="GPU $tag_gpu"),
            target("B", f'SELECT mean("{Fields.SM_UTIL_PCT}") AS "job_sm" '
                        f'FROM "{m.GPU_PROCESS.name}" {where(HOST, JOB, GPU)} '
                        f'{EVERY}{tags(Tags.GPU)}', alias="job's SM share, GPU $tag_gpu"),
        ], unit(m.GPU, Fields.UTILIZATION_GPU_PCT),
            description="The GPUs' utilization and the job's processes' share, on the same "
                        "time axis as the calls."),
        timeseries(lay, "Memory-bound verdict", [target(
            "A", f'SELECT max("{Fields.VERDICT}") AS "verdict", '
                 f'max("{Fields.CONSECUTIVE_WINDOWS}") AS "consecutive_windows" '
                 f'FROM "{m.MEMORY_BOUND.name}" {f} {EVERY}', alias="$col")],
            unit(m.MEMORY_BOUND, Fields.VERDICT)),
        timeseries(lay, "Failed calls by API", [target(
            "A", f'SELECT sum("{Fields.COUNT}") AS "errors" FROM "{m.ERRORS.name}" {f} '
                 f'{EVERY}{tags(Tags.API)}', alias="$tag_api")],
            unit(m.ERRORS, Fields.COUNT)),
        timeseries(lay, "Events lost by the producer", [target(
            "A", f'SELECT last("{Fields.DROPPED_KERNEL}") AS "kernel_ring", '
                 f'last("{Fields.DROPPED_USER}") AS "kafka_queue", '
                 f'last("{Fields.DROPPED_AGENT_DIED}") AS "producer_killed" '
                 f'FROM "{m.EVENTS_LOST.name}" {f} {EVERY}{tags(Tags.HOST)}',
            alias="$tag_host $col")],
            unit(m.EVENTS_LOST, Fields.DROPPED_KERNEL),
            description="Events of the job's processes the producer could not keep, since it "
                        "started: its kernel ring buffer was full, its Kafka queue was, or a "
                        "producer killed outright never published them (counted by the next). "
                        "No line: nothing lost. Where there is one, the other panels show "
                        "lower bounds (`gpuflight report` gives the loss in a range)."),
        timeseries(lay, "Events not counted by the stream worker", [target(
            "A", f'SELECT sum("{Fields.LATE_EVENTS}") AS "late", '
                 f'sum("{Fields.FUTURE_EVENTS}") AS "ahead_of_the_clock" '
                 f'FROM "{m.EVENTS_UNCOUNTED.name}" {f} {EVERY}', alias="$col")],
            unit(m.EVENTS_UNCOUNTED, Fields.LATE_EVENTS),
            description="Events of the job that reached the stream worker after their window "
                        "had closed (later than --idle + --grace), or stamped further ahead of "
                        "its clock than --max-future. They are in the dead-letter topic; the "
                        "other panels lack them."),
    ]
    memory_bound = annotation(
        "Memory-bound alerts",
        f'SELECT "{Fields.CONSECUTIVE_WINDOWS}" FROM "{m.MEMORY_BOUND.name}" '
        f'{where(HOST, JOB, chr(34) + Fields.ALERT + chr(34) + " = 1")} GROUP BY "{Tags.JOB}"',
        color="orange", text_column=Fields.CONSECUTIVE_WINDOWS, tags_column=Tags.JOB)
    return dashboard("gpuflight-job", "gpuflight: job drill-down",
                     "One job's calls: launches, kernels, launch shapes, copies, memory, "
                     "syncs, beside NVML's view of the GPU.", panels,
                     [HOST_VAR, JOB_VAR, GPU_VAR], annotations=[memory_bound])


def transfers() -> dict[str, Any]:
    lay = Layout()
    f = where(HOST, JOB)
    low = f"\"{Tags.DIRECTION}\" = '{m.LOW_BANDWIDTH}'"
    high = f"\"{Tags.DIRECTION}\" = '{m.HIGH_BYTES}'"
    panels = [
        timeseries(lay, "Achieved bandwidth vs baseline", [
            target("A", f'SELECT {ACHIEVED} AS "observed" FROM "{m.COPIES.name}" '
                        f'{where(HOST, JOB, TIMED)} {EVERY}{tags(Tags.KIND)}',
                   alias="$tag_kind observed"),
            target("B", f'SELECT mean("{Fields.BASELINE}") AS "baseline" '
                        f'FROM "{m.BANDWIDTH_ANOMALY.name}" {where(HOST, JOB, low)} '
                        f'{EVERY}{tags(Tags.KIND)}', alias="$tag_kind baseline"),
        ], unit(m.COPIES, Fields.BANDWIDTH_BYTES_PER_S), width=24,
            description="Bandwidth of synchronous copies, and the detector's baseline (the "
                        "median of the last windows) where it found a drop."),
        timeseries(lay, "Bytes copied/s vs baseline", [
            target("A", f'SELECT {per_second(Fields.BYTES)} AS "observed" FROM "{m.COPIES.name}" '
                        f'{f} {EVERY}{tags(Tags.KIND)} fill(0)', alias="$tag_kind observed"),
            target("B", f'SELECT mean("{Fields.BASELINE}") AS "baseline" '
                        f'FROM "{m.BANDWIDTH_ANOMALY.name}" {where(HOST, JOB, high)} '
                        f'{EVERY}{tags(Tags.KIND)}', alias="$tag_kind baseline"),
        ], unit(m.COPIES, Fields.BYTES_PER_S), width=24),
        table(lay, "Anomalies", [target(
            "A", f'SELECT "{Tags.JOB}", "{Tags.KIND}", "{Tags.DIRECTION}", "{Fields.BASELINE}", '
                 f'"{Fields.OBSERVED}", "{Fields.RATIO}", "{Fields.ZSCORE}" '
                 f'FROM "{m.BANDWIDTH_ANOMALY.name}" '
                 f'{f}', table=True)], "short", "Time", width=24,
            overrides=[(Fields.BASELINE, GRAFANA_UNITS["bytes/s"]),
                       (Fields.OBSERVED, GRAFANA_UNITS["bytes/s"])],
            description="baseline and observed: bytes/s achieved (low_bandwidth) or copied "
                        "(high_bytes); zscore: distance from the baseline in spreads."),
    ]
    anomalies = annotation(
        "Bandwidth anomalies",
        f'SELECT "{Fields.RATIO}", "{Fields.OBSERVED}", "{Fields.BASELINE}" '
        f'FROM "{m.BANDWIDTH_ANOMALY.name}" '
        f'{f} GROUP BY "{Tags.KIND}", "{Tags.DIRECTION}"',
        color="red", text_column=Fields.RATIO, tags_column=f"{Tags.KIND},{Tags.DIRECTION}")
    return dashboard("gpuflight-transfers", "gpuflight: transfers & anomalies",
                     "Copies against their baselines, with the detector's anomalies.", panels,
                     [HOST_VAR, JOB_VAR], annotations=[anomalies])


def _side(ref: str, job_filter: str, suffix: str) -> list[dict[str, Any]]:
    """One job's column of the comparison table (refs ref+"1".. ref+"4")."""
    f = where(HOST, job_filter)
    return [
        target(f"{ref}1", f'SELECT sum("{Fields.COUNT}") AS "launches_{suffix}" '
                          f'FROM "{m.LAUNCHES.name}" {f}', table=True),
        target(f"{ref}2", f'SELECT mean("rate") AS "launches_per_s_{suffix}" FROM ('
                          f'SELECT {per_second(Fields.COUNT)} AS "rate" FROM "{m.LAUNCHES.name}" '
                          f'{f} {EVERY})', table=True),
        target(f"{ref}3", f'SELECT median("{Fields.P50_GRID_BLOCKS}") AS "grid_blocks_{suffix}" '
                          f'FROM "{m.LAUNCH_SHAPE.name}" {f}', table=True),
        target(f"{ref}4", f'SELECT mean("{Fields.SM_UTIL_PCT}") AS "gpu_util_{suffix}" '
                          f'FROM "{m.GPU_PROCESS.name}" {where(HOST, job_filter, GPU)}',
               table=True),
    ]


#: The comparison table's columns (each with _a, _b and _ratio) and their units.
COMPARED: Final[tuple[tuple[str, str], ...]] = (
    ("launches", unit(m.LAUNCHES, Fields.COUNT)),
    ("launches_per_s", unit(m.LAUNCHES, Fields.RATE_PER_S)),
    ("grid_blocks", unit(m.LAUNCH_SHAPE, Fields.P50_GRID_BLOCKS)),
    ("gpu_util", unit(m.GPU_PROCESS, Fields.SM_UTIL_PCT)),
)


def fusion() -> dict[str, Any]:
    lay = Layout()
    ratios = [
        {"id": "calculateField", "options": {
            "mode": "binary", "alias": f"{name}_ratio", "replaceFields": False,
            "binary": {"left": f"{name}_a", "operator": "/", "right": f"{name}_b"}}}
        for name, _ in COMPARED
    ]
    table_units = [(f"{name}_{side}", unit_id) for name, unit_id in COMPARED for side in "ab"]
    compare_var = variable("compare_job", "Compared with",
                           tag_values(m.LAUNCHES, Tags.JOB, HOST), multi=False)
    job_var = variable("job", "Job", tag_values(m.LAUNCHES, Tags.JOB, HOST), multi=False)
    either = "<job filter>"  # replaced by each side's
    side_by_side = [
        ("Launches/s", f'SELECT {per_second(Fields.COUNT)} AS "launches" '
                       f'FROM "{m.LAUNCHES.name}" {where(HOST, either)} {EVERY} fill(0)',
         unit(m.LAUNCHES, Fields.RATE_PER_S)),
        ("Grid size p50 (blocks)", f'SELECT mean("{Fields.P50_GRID_BLOCKS}") AS "p50" '
                                   f'FROM "{m.LAUNCH_SHAPE.name}" {where(HOST, either)} {EVERY}',
         unit(m.LAUNCH_SHAPE, Fields.P50_GRID_BLOCKS)),
        ("GPU utilization of the job (SM %)",
         f'SELECT mean("{Fields.SM_UTIL_PCT}") AS "sm" FROM "{m.GPU_PROCESS.name}" '
         f'{where(HOST, either, GPU)} {EVERY}', unit(m.GPU_PROCESS, Fields.SM_UTIL_PCT)),
    ]
    panels = [
        table(lay, "Kernel fusion: $job vs $compare_job",
              [*_side("A", JOB, "a"), *_side("B", COMPARE_JOB, "b")], "short", "launches_a",
              width=24, height=6, overrides=table_units,
              transformations=[{"id": "merge", "options": {}}, *ratios,
                               {"id": "organize", "options": {"excludeByName": {"Time": True}}}],
              description="_a: $job, _b: $compare_job; ratios are a / b. Launches per second "
                          "are averaged over the intervals the job launched in."),
    ]
    for title, query, unit_id in side_by_side:
        panels.append(timeseries(lay, title, [
            target("A", query.replace(either, JOB), alias="$job"),
            target("B", query.replace(either, COMPARE_JOB), alias="$compare_job"),
        ], unit_id, width=8))
    return dashboard("gpuflight-fusion", "gpuflight: kernel-fusion comparison",
                     "Two jobs side by side: an unfused and a fused run of the same work.",
                     panels, [HOST_VAR, job_var, compare_var, GPU_VAR])


ROUTE: Final = f'"{Tags.ROUTE}" =~ /^$route$/'
#: Per 1k requests: Σ cost · 1000 / Σ requests (never a mean of means).
PER_1K: Final = f'sum("{Fields.COST_USD}") * 1000 / sum("{Fields.REQUESTS}")'
#: The share of a job's GPU time that no request explains.
UNEXPLAINED: Final = f'sum("{Fields.UNATTRIBUTED_GPU_NS}") / sum("{Fields.GPU_NS}")'


def requests_board() -> dict[str, Any]:
    lay = Layout()
    f = where(HOST, JOB, ROUTE)
    jobs = where(HOST, JOB)
    usd_unit = unit(m.ROUTES, Fields.COST_USD)
    ranked = table(lay, "Routes ranked by GPU cost", [target(
        "A", f'SELECT sum("{Fields.COST_USD}") AS "cost_usd", sum("{Fields.REQUESTS}") AS '
             f'"requests", {PER_1K} AS "cost_per_1k_requests", sum("{Fields.GPU_NS}") / '
             f'1000000000 AS "gpu_seconds", sum("{Fields.LAUNCHES}") / sum("{Fields.REQUESTS}") '
             f'AS "launches_per_request", max("{Fields.LATENCY_P99_NS}") AS "latency_p99" '
             f'FROM "{m.ROUTES.name}" {f} GROUP BY "{Tags.JOB}", "{Tags.ROUTE}"', table=True)],
        usd_unit, "cost_usd", width=24,
        overrides=[("requests", "short"), ("gpu_seconds", "s"),
                   ("launches_per_request", "short"),
                   ("latency_p99", unit(m.ROUTES, Fields.LATENCY_P99_NS))],
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
        description="Each route's GPU cost over the time range: the GPU-seconds of its "
                    "requests' CUDA calls (exact, and their shares of calls made while several "
                    "were in flight) at the price of the job's GPU model; per 1k requests; "
                    "the slowest window's p99 latency.")
    panels = [
        ranked,
        timeseries(lay, "Cost per 1k requests by route", [target(
            "A", f'SELECT {PER_1K} AS "cost_per_1k" FROM "{m.ROUTES.name}" {f} '
                 f'{EVERY}{tags(Tags.JOB, Tags.ROUTE)}', alias="$tag_route ($tag_job)")],
            usd_unit, description="GPU cost of 1,000 requests of each route."),
        timeseries(lay, "Requests/s by route", [target(
            "A", f'SELECT {per_second(Fields.REQUESTS)} AS "requests" FROM "{m.ROUTES.name}" '
                 f'{f} {EVERY}{tags(Tags.JOB, Tags.ROUTE)} fill(0)',
            alias="$tag_route ($tag_job)")], GRAFANA_UNITS["1/s"]),
        timeseries(lay, "Latency p50 and p99 by route", [target(
            "A", f'SELECT mean("{Fields.LATENCY_P50_NS}") AS "p50", '
                 f'max("{Fields.LATENCY_P99_NS}") AS "p99" FROM "{m.ROUTES.name}" {f} '
                 f'{EVERY}{tags(Tags.ROUTE)}', alias="$tag_route $col")],
            unit(m.ROUTES, Fields.LATENCY_P99_NS),
            description="From first byte in to last byte of the response out, as the kernel "
                        "saw them; per window from a log histogram (within 4.4 %)."),
        timeseries(lay, "GPU work per request by route", [target(
            "A", f'SELECT sum("{Fields.LAUNCHES}") / sum("{Fields.REQUESTS}") AS "launches", '
                 f'sum("{Fields.GPU_NS}") / sum("{Fields.REQUESTS}") AS "gpu_time", '
                 f'sum("{Fields.BYTES}") / sum("{Fields.REQUESTS}") AS "bytes_copied" '
                 f'FROM "{m.ROUTES.name}" {f} {EVERY}{tags(Tags.ROUTE)}',
            alias="$tag_route $col")], "short",
            overrides=[("gpu_time", "ns"), ("bytes_copied", "bytes")],
            description="Kernel launches, GPU time and bytes copied per request."),
        timeseries(lay, "Share of GPU time no request explains", [target(
            "A", f'SELECT {UNEXPLAINED} AS "unexplained" FROM "{m.JOB_COST.name}" {jobs} '
                 f'{EVERY}{tags(Tags.JOB)}', alias="$tag_job")],
            unit(m.JOB_COST, Fields.UNATTRIBUTED_SHARE),
            description="GPU time of the jobs' calls made while none of their requests was "
                        "in flight: idle or background work (start-up, warm-up, timers)."),
        timeseries(lay, "Cost per hour by namespace and team", [target(
            "A", f'SELECT sum("{Fields.COST_USD}") * 3600000 / $__interval_ms AS "usd_per_hour" '
                 f'FROM "{m.JOB_COST.name}" {jobs} {EVERY}{tags(Tags.NAMESPACE, Tags.TEAM)} '
                 'fill(0)', alias="$tag_namespace / $tag_team")], usd_unit,
            description="The jobs' GPU cost (their requests' and what no request explains), "
                        "by Kubernetes namespace and team label."),
        table(lay, "Slowest requests, with their traces", [target(
            "A", f'SELECT "{Tags.JOB}", "{Tags.ROUTE}", "{Fields.LATENCY_NS}", "{Fields.STATUS}", '
                 f'"{Fields.METHOD}", "{Fields.COST_USD}", "{Fields.GPU_NS}", "{Fields.LAUNCHES}", '
                 f'"{Fields.TOP_FUNCTION}", "{Fields.TRACE_ID}", "{Fields.REQUEST_ID}" FROM '
                 f'"{m.REQUEST_SAMPLES_M.name}" {f}', table=True)],
            unit(m.REQUEST_SAMPLES_M, Fields.LATENCY_NS), Fields.LATENCY_NS, width=24,
            overrides=[(Fields.STATUS, "short"), (Fields.COST_USD, usd_unit),
                       (Fields.LAUNCHES, "short"), (Fields.TRACE_ID, "string"),
                       (Fields.REQUEST_ID, "string"), (Fields.METHOD, "string"),
                       (Fields.TOP_FUNCTION, "string")],
            description="The slowest requests of each route and window. top_function (code "
                        "paths sampled: producer --stack-sampling) is the user function whose "
                        "calls cost the request most. trace_id (when the client sent a W3C "
                        "traceparent) opens the trace in your trace backend ($trace_url); "
                        "request_id is the span id of its OTLP span."),
    ]
    (slowest,) = [p for p in panels if p["title"].startswith("Slowest")]
    for override in slowest["fieldConfig"]["overrides"]:
        if override["matcher"]["options"] == Fields.TRACE_ID:
            override["properties"].append({"id": "links", "value": [{
                "title": "Open the trace", "url": "${trace_url}/${__value.raw}",
                "targetBlank": True}]})
    route_var = variable("route", "Route", tag_values(m.ROUTES, Tags.ROUTE, HOST, JOB))
    trace_var = {"type": "textbox", "name": "trace_url", "label": "Trace backend URL",
                 "query": TRACE_URL, "current": {"text": TRACE_URL, "value": TRACE_URL},
                 "options": [{"selected": True, "text": TRACE_URL, "value": TRACE_URL}]}
    job_var = variable("job", "Job", tag_values(m.ROUTES, Tags.JOB, HOST))
    host_var = variable("host", "Host", tag_values(m.ROUTES, Tags.HOST))
    return dashboard("gpuflight-requests", "gpuflight: Requests & cost",
                     "HTTP requests followed down to the CUDA work they caused: GPU cost per "
                     "route, job, namespace and team, latency, and the GPU time no request "
                     "explains.", panels, [host_var, job_var, route_var, trace_var])


CODE_PATHS_TITLE: Final = "Functions ranked by GPU cost"
ROUTE_CODE_PATHS_TITLE: Final = "Functions by route, ranked by GPU cost"


def code_paths_board() -> dict[str, Any]:
    """What each user function's code paths cost (`producer --stack-sampling N`). No flame
    graph: InfluxDB keeps one level of each path (its user function, bounded per window), and
    Grafana's flame graph panel needs whole stacks: `trace --profile` writes those."""
    lay = Layout()
    f = where(HOST, JOB)
    cp = m.CODE_PATHS
    by_function = f"{EVERY}{tags(Tags.JOB, Tags.FUNCTION)} fill(0)"
    panels = [
        table(lay, CODE_PATHS_TITLE, [target(
            "A", f'SELECT sum("{Fields.COST_USD}") AS "cost_usd", sum("{Fields.GPU_NS}") / '
                 f'1000000000 AS "gpu_seconds", sum("{Fields.LAUNCHES}") AS "launches", '
                 f'sum("{Fields.BYTES}") AS "bytes_copied", sum("{Fields.BLOCKED_NS}") / '
                 f'1000000000 AS "blocked_seconds", sum("{Fields.CALLS}") AS "calls" '
                 f'FROM "{cp.name}" {f} GROUP BY "{Tags.JOB}", "{Tags.FUNCTION}"', table=True)],
            unit(cp, Fields.COST_USD), "cost_usd", width=24,
            overrides=[("gpu_seconds", "s"), ("launches", "short"), ("bytes_copied", "bytes"),
                       ("blocked_seconds", "s"), ("calls", "short")],
            transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
            description="Each user function's GPU cost over the time range: the GPU time of "
                        "the calls its code paths made (sampled, each sample weighted by 1/p), "
                        "at the price of the job's GPU model. A function is a path's innermost "
                        "Python frame outside site-packages and the standard library; each "
                        "window keeps the 10 costliest apart and sums the rest as [other]."),
        table(lay, ROUTE_CODE_PATHS_TITLE, [target(
            "A", f'SELECT sum("{Fields.COST_USD}") AS "cost_usd", sum("{Fields.GPU_NS}") / '
                 f'1000000000 AS "gpu_seconds", sum("{Fields.LAUNCHES}") AS "launches", '
                 f'sum("{Fields.BYTES}") AS "bytes_copied", sum("{Fields.CALLS}") AS "calls" '
                 f'FROM "{m.ROUTE_CODE_PATHS.name}" {f} GROUP BY "{Tags.JOB}", "{Tags.ROUTE}", '
                 f'"{Tags.FUNCTION}"', table=True)],
            unit(m.ROUTE_CODE_PATHS, Fields.COST_USD), "cost_usd", width=24,
            overrides=[("gpu_seconds", "s"), ("launches", "short"), ("bytes_copied", "bytes"),
                       ("calls", "short")],
            transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
            description="What each function's calls made for requests of each HTTP route "
                        "cost over the time range (a call shared by requests in flight gives "
                        "each its share). Each window keeps the 5 costliest functions of a "
                        "route apart and sums the rest as [other]; calls made for no request "
                        "are in the table above only."),
        timeseries(lay, "GPU time/s by function", [target(
            "A", f'SELECT sum("{Fields.GPU_NS}") / 1000000000 / $__interval_ms * 1000 AS '
                 f'"gpu_seconds_per_s" FROM "{cp.name}" {f} {by_function}',
            alias="$tag_function ($tag_job)")], "short",
            description="GPU-seconds per second of each function's calls."),
        timeseries(lay, "Kernel launches/s by function", [target(
            "A", f'SELECT {per_second(Fields.LAUNCHES)} AS "launches" FROM "{cp.name}" {f} '
                 f'{by_function}', alias="$tag_function ($tag_job)")], GRAFANA_UNITS["1/s"]),
        timeseries(lay, f"{BLOCKED_TERM} by function", [target(
            "A", f'SELECT sum("{Fields.BLOCKED_NS}") / 1000000000 / $__interval_ms * 1000 AS '
                 f'"blocked_share" FROM "{cp.name}" {f} {by_function}',
            alias="$tag_function ($tag_job)")], GRAFANA_UNITS["share"],
            description="Seconds per second each function's threads waited in syncs and "
                        "synchronous copies (two threads waiting at once count twice)."),
        timeseries(lay, "Bytes copied/s by function", [target(
            "A", f'SELECT {per_second(Fields.BYTES)} AS "bytes" FROM "{cp.name}" {f} '
                 f'{by_function}', alias="$tag_function ($tag_job)")], GRAFANA_UNITS["bytes/s"]),
    ]
    job_var = variable("job", "Job", tag_values(cp, Tags.JOB, HOST))
    host_var = variable("host", "Host", tag_values(cp, Tags.HOST))
    return dashboard("gpuflight-code-paths", "gpuflight: Code paths",
                     "Which functions made the GPU work and what it cost: the code paths of "
                     "sampled CUDA calls, folded to the user function that led to them.",
                     panels, [host_var, job_var])


DASHBOARDS: Final = {"fleet": fleet, "job": job, "transfers": transfers, "fusion": fusion,
                     "requests": requests_board, "paths": code_paths_board}


# -- alert rules -----------------------------------------------------------------------------


def influx_query(ref: str, query: str, range_s: int = RULE_RANGE_S,
                 until_s: int = 0) -> dict[str, Any]:
    return {
        "refId": ref,
        "relativeTimeRange": {"from": range_s, "to": until_s},
        "datasourceUid": DATASOURCE_UID,
        "model": {**target(ref, query), "intervalMs": round(m.DEFAULT_WINDOW_S * 1000),
                  "maxDataPoints": 43_200},
    }


def reduce(ref: str, of: str, reducer: str) -> dict[str, Any]:
    return {"refId": ref, "datasourceUid": "__expr__", "model": {
        "refId": ref, "type": "reduce", "expression": of, "reducer": reducer,
        "settings": {"mode": "dropNN"}, "datasource": {"type": "__expr__", "uid": "__expr__"}}}


def threshold(ref: str, of: str, evaluator: str, value: float) -> dict[str, Any]:
    return {"refId": ref, "datasourceUid": "__expr__", "model": {
        "refId": ref, "type": "threshold", "expression": of,
        "conditions": [{"evaluator": {"type": evaluator, "params": [value]}}],
        "datasource": {"type": "__expr__", "uid": "__expr__"}}}


def math(ref: str, expression: str) -> dict[str, Any]:
    return {"refId": ref, "datasourceUid": "__expr__", "model": {
        "refId": ref, "type": "math", "expression": expression,
        "datasource": {"type": "__expr__", "uid": "__expr__"}}}


def rule(uid: str, title: str, data: list[dict[str, Any]], summary: str, description: str,
         *, severity: str, no_data: str = "OK", for_: str = "0s") -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "condition": "FIRING",
        "data": data,
        "noDataState": no_data,
        "execErrState": "Error",
        "for": for_,
        "annotations": {"summary": summary, "description": description},
        "labels": {"severity": severity, "service": "gpuflight"},
        "isPaused": False,
    }


def alert_rules() -> list[dict[str, Any]]:
    job_groups = f'GROUP BY "{Tags.HOST}", "{Tags.JOB}"'
    memory_bound = rule(
        "gpuflight-memory-bound", "Memory-bound job", [
            influx_query("A", f'SELECT max("{Fields.ALERT}") FROM "{m.MEMORY_BOUND.name}" '
                              f'WHERE $timeFilter {job_groups}'),
            influx_query("B", f'SELECT max("{Fields.CONSECUTIVE_WINDOWS}") FROM '
                              f'"{m.MEMORY_BOUND.name}" WHERE $timeFilter {job_groups}'),
            influx_query("C", f'SELECT mean("{Fields.BLOCKED_SHARE}") FROM "{m.MEMORY_BOUND.name}" '
                              f'WHERE "{Fields.VERDICT}" = 1 AND $timeFilter {job_groups}'),
            influx_query("D", f'SELECT mean("{Fields.BYTES_PER_LAUNCH}") FROM '
                              f'"{m.MEMORY_BOUND.name}" WHERE "{Fields.VERDICT}" = 1 '
                              f'AND $timeFilter '
                              f'{job_groups}'),
            reduce("ALERTING", "A", "max"),
            reduce("WINDOWS", "B", "max"),
            reduce("BLOCKED", "C", "last"),
            reduce("BYTES_PER_LAUNCH", "D", "last"),
            threshold("FIRING", "ALERTING", "gt", 0),
        ],
        "{{ $labels.job }} on {{ $labels.host }} is memory-bound: the verdict held "
        "{{ $values.WINDOWS.Value }} consecutive windows, the CPU was blocked on the GPU "
        "{{ humanizePercentage $values.BLOCKED.Value }} of the time (per process) with "
        "{{ humanize1024 $values.BYTES_PER_LAUNCH.Value }}B copied per kernel launch.",
        f"The stream app's memory-bound rule held for {m.MEMORY_BOUND_ALERT_WINDOWS} or more "
        "windows in a row in the last 5 minutes (see the job drill-down dashboard).",
        severity="warning")
    anomaly_groups = f'GROUP BY "{Tags.HOST}", "{Tags.JOB}", "{Tags.KIND}", "{Tags.DIRECTION}"'
    anomaly = rule(
        "gpuflight-bandwidth-anomaly", "Bandwidth anomaly", [
            influx_query("A", f'SELECT count("{Fields.RATIO}") FROM "{m.BANDWIDTH_ANOMALY.name}" '
                              f'WHERE $timeFilter {anomaly_groups}'),
            influx_query("B", f'SELECT last("{Fields.OBSERVED}") FROM "{m.BANDWIDTH_ANOMALY.name}" '
                              f'WHERE $timeFilter {anomaly_groups}'),
            influx_query("C", f'SELECT last("{Fields.BASELINE}") FROM "{m.BANDWIDTH_ANOMALY.name}" '
                              f'WHERE $timeFilter {anomaly_groups}'),
            influx_query("D", f'SELECT last("{Fields.RATIO}") FROM "{m.BANDWIDTH_ANOMALY.name}" '
                              f'WHERE $timeFilter {anomaly_groups}'),
            reduce("WINDOWS", "A", "sum"),
            reduce("OBSERVED", "B", "last"),
            reduce("BASELINE", "C", "last"),
            reduce("RATIO", "D", "last"),
            threshold("FIRING", "WINDOWS", "gt", 0),
        ],
        "{{ $labels.job }} on {{ $labels.host }}: {{ $labels.kind }} copies "
        "{{ $labels.direction_of_change }}, {{ humanize1024 $values.OBSERVED.Value }}B/s "
        "against a baseline of {{ humanize1024 $values.BASELINE.Value }}B/s "
        "(ratio {{ humanize $values.RATIO.Value }}, {{ $values.WINDOWS.Value }} windows).",
        "low_bandwidth: synchronous copies achieved well under their usual bandwidth; "
        "high_bytes: far more bytes copied than usual (see the transfers dashboard).",
        severity="warning")
    storm = rule(
        "gpuflight-launch-storm", "Launch storm", [
            influx_query("A", f'SELECT {per_second(Fields.COUNT)} FROM "{m.LAUNCHES.name}" '
                              f'WHERE $timeFilter GROUP BY time($__interval), "{Tags.HOST}", '
                              f'"{Tags.JOB}"'),
            reduce("RATE", "A", "max"),
            threshold("FIRING", "RATE", "gt", LAUNCH_STORM_PER_S),
        ],
        "{{ $labels.job }} on {{ $labels.host }} launched {{ humanize $values.RATE.Value }} "
        f"kernels per second (more than {LAUNCH_STORM_PER_S:,}/s): launch overhead likely "
        "dominates; fusing kernels or CUDA graphs would help.",
        "The highest launch rate of one job over a window in the last 5 minutes.",
        severity="warning")
    dropped = rule(
        "gpuflight-events-dropped", "Events dropped by the pipeline", [
            # Counters since the producer started: a restart (a drop) is no loss.
            influx_query("A", f'SELECT sum("kernel") + sum("user") FROM (SELECT '
                              f'non_negative_difference("{Fields.DROPPED_KERNEL}") AS "kernel", '
                              f'non_negative_difference("{Fields.DROPPED_USER}") AS "user" '
                              f'FROM "{m.PIPELINE.name}" WHERE $timeFilter GROUP BY "{Tags.HOST}") '
                              f'GROUP BY "{Tags.HOST}"'),
            influx_query("B", f'SELECT last("{Fields.QUEUE_MESSAGES}") FROM "{m.PIPELINE.name}" '
                              f'WHERE $timeFilter GROUP BY "{Tags.HOST}"'),
            reduce("DROPPED", "A", "sum"),
            reduce("QUEUE", "B", "last"),
            threshold("FIRING", "DROPPED", "gt", 0),
        ],
        "The producer on {{ $labels.host }} dropped {{ $values.DROPPED.Value }} events in the "
        "last 5 minutes ({{ $values.QUEUE.Value }} messages queued for Kafka): its jobs' "
        "numbers are short by that much.",
        "Events lost in the kernel ring buffer or the publisher's bounded queue (a slow or "
        "unreachable Kafka); see the fleet dashboard's pipeline panel.",
        severity="critical")
    silent = rule(
        "gpuflight-producer-silent", "Producer silent", [
            influx_query("A", f'SELECT "reports" FROM ('
                              f'SELECT count("{Fields.CAPTURED}") AS "reports" '
                              f'FROM "{m.PIPELINE.name}" WHERE $timeFilter '
                              f'GROUP BY time(1m), "{Tags.HOST}" fill(0)) GROUP BY "{Tags.HOST}" '
                              f'ORDER BY time DESC LIMIT {SILENT_MINUTES}', SILENT_RANGE_S),
            influx_query("B", f'SELECT last("{Fields.CAPTURED}") FROM "{m.PIPELINE.name}" '
                              f'WHERE $timeFilter GROUP BY "{Tags.HOST}"', SILENT_RANGE_S),
            reduce("REPORTS", "A", "max"),
            reduce("CAPTURED", "B", "last"),
            threshold("FIRING", "REPORTS", "lt", 1),
        ],
        "The producer on {{ $labels.host }} has sent no metrics for "
        f"{SILENT_MINUTES} minutes (it had captured "
        "{{ $values.CAPTURED.Value }} events when last heard from).",
        "A producer reports every few seconds; silence means it stopped, lost Kafka, or the "
        "node is down. Hosts that reported in the last hour are watched.",
        severity="critical")
    route_groups = f'GROUP BY "{Tags.HOST}", "{Tags.JOB}", "{Tags.ROUTE}"'
    per_request = (f'SELECT sum("{Fields.COST_USD}") / sum("{Fields.REQUESTS}") '
                   f'FROM "{m.ROUTES.name}" WHERE $timeFilter {route_groups}')
    costlier = rule(
        "gpuflight-route-cost", "Route GPU cost per request doubled", [
            influx_query("A", per_request, RECENT_S),
            influx_query("B", per_request, BASELINE_S, RECENT_S),
            reduce("RECENT", "A", "last"),
            reduce("BASELINE", "B", "last"),
            math("RATIO", "$RECENT / $BASELINE"),
            threshold("FIRING", "RATIO", "gt", COST_RATIO),
        ],
        "{{ $labels.route }} of {{ $labels.job }} on {{ $labels.host }} costs "
        "{{ humanize $values.RECENT.Value }} USD per request on the GPU, "
        "{{ humanize $values.RATIO.Value }} times its baseline of "
        "{{ humanize $values.BASELINE.Value }} USD.",
        f"A route's GPU cost per request over the last {RECENT_S // 60} minutes is more than "
        f"{COST_RATIO:g} times what it was over the day before (see the Requests & cost "
        "dashboard): more kernels, bigger copies or slower GPU work per request.",
        severity="warning")
    return [memory_bound, anomaly, storm, dropped, silent, costlier]


def alerting() -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "groups": [{"orgId": 1, "name": "gpuflight", "folder": FOLDER, "interval": "1m",
                    "rules": alert_rules()}],
        "contactPoints": [{"orgId": 1, "name": "gpuflight", "receivers": [{
            "uid": "gpuflight-webhook", "type": "webhook", "disableResolveMessage": False,
            "settings": {"url": "$GPUFLIGHT_ALERT_WEBHOOK_URL", "httpMethod": "POST"}}]}],
        "policies": [{"orgId": 1, "receiver": "gpuflight",
                      "group_by": ["alertname", Tags.HOST, Tags.JOB],
                      "group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"}],
    }


# -- through the SDK's models, and out -------------------------------------------------------


def through_sdk(data: Mapping[str, Any]) -> dict[str, Any]:
    """The dashboard as grafana-foundation-sdk's Dashboard model decodes and encodes it."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    encoded: dict[str, Any] = json.loads(
        json.dumps(Dashboard.from_json(dict(data)), cls=JSONEncoder))
    # The SDK's AnnotationTarget knows Grafana's built-in annotation fields only: an InfluxDB
    # annotation's query and columns are the datasource's, carried over as written.
    for ours, theirs in zip(data["annotations"]["list"], encoded["annotations"]["list"],
                            strict=True):
        if ours.get("datasource") == DATASOURCE:
            theirs.update({k: ours[k] for k in INFLUX_ANNOTATION_KEYS})
    return encoded


def datasource() -> dict[str, Any]:
    """The InfluxDB the stream workers write, as Grafana provisions it. Grafana expands the
    variables from its environment when it provisions: the URL, and the user and password it
    logs in with (InfluxDB with auth-enabled; both empty for one without, as the local stack).
    The password goes to secureJsonData, which Grafana keeps encrypted and never sends to
    browsers."""
    return {
        "apiVersion": 1,
        "datasources": [{
            "name": "gpuflight",
            "uid": DATASOURCE_UID,
            "type": "influxdb",
            "access": "proxy",
            "url": "$GPUFLIGHT_INFLUX_URL",
            "user": "$GPUFLIGHT_INFLUX_USER",
            "isDefault": True,
            "editable": False,
            "jsonData": {
                "version": "InfluxQL",
                "dbName": DATABASE,
                "httpMode": "GET",
                # The stream app's window: no panel groups finer than that.
                "timeInterval": WINDOW,
            },
            "secureJsonData": {"password": "$GPUFLIGHT_INFLUX_PASSWORD"},
        }],
    }


class _PlainDumper(yaml.SafeDumper):
    """Writes a shared object out each time (no &anchors): a file for people to read."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def rendered() -> dict[Path, str]:
    """Every generated file and its text."""
    files = {
        DASHBOARD_DIR / f"{name}.json": json.dumps(through_sdk(build()), indent=2) + "\n"
        for name, build in DASHBOARDS.items()
    }
    header = ("# Written by `python -m grafana.generate` (grafana/generate.py, names from "
              "streams/measurements.py): edit those, not this.\n")
    files[ALERTING_FILE] = header + yaml.dump(alerting(), Dumper=_PlainDumper, sort_keys=False,
                                              width=1000, allow_unicode=True)
    files[DATASOURCE_FILE] = (
        header + "# The InfluxDB the stream workers write (InfluxQL). Grafana expands the variables"
        " from its\n# environment: GPUFLIGHT_INFLUX_URL, and GPUFLIGHT_INFLUX_USER and"
        " GPUFLIGHT_INFLUX_PASSWORD\n# (compose/compose.yaml sets them, the password from a"
        " Docker secret).\n"
        + yaml.dump(datasource(), Dumper=_PlainDumper, sort_keys=False, width=1000))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grafana.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a file differs from what it would be")
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered().items():
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT.parent)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT.parent)}")
    if stale:
        print(f"stale: {', '.join(stale)} (run python -m grafana.generate)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
