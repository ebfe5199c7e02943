"""The InfluxDB contract of the stream app: measurement names, tag keys, field keys and types.

Everything the stream app writes is a `Point` of one measurement of `ALL`; the Grafana
dashboards and alert rules may name only what `ALL` lists (a test checks them against it), and
`validate` checks a point before it is written. One measurement per concern:

  measurement        tags                                 written from
  launches           host job layer api                   events (kernel and graph launches)
  kernels            host job kernel                      events (bounded: top kernels + "other")
  grid_blocks        host job bucket                      events (log2 histogram of x·y·z)
  block_threads      host job bucket                      events (log2 histogram of x·y·z)
  launch_shape       host job                             events (percentiles from histograms)
  copies             host job kind                        events (cudaMemcpy*)
  memset             host job                             events (cudaMemset*)
  memory             host job                             events + the memory ledger
  syncs              host job scope                       events (cudaStream/Device/EventSync)
  cpu_blocked        host job                             events (CPU blocked on the GPU)
  errors             host job api                         events (calls whose result was not 0)
  devices            host job device                      events (per CUDA device of the calls)
  gpu                host gpu                             NVML samples
  gpu_process        host gpu job                         NVML samples, processes by job
  bandwidth_anomaly  host job kind direction_of_change    detect.py
  memory_bound       host job                             detect.py
  pipeline           host                                 producer metrics
  events_lost        host job                             producer metrics, drops by process
  streams            worker                               stream worker metrics (lag, ...)
  routes             host job namespace team route        requests (window of their end)
  request_samples    host job route rank                  requests (the slowest of a window)
  job_cost           host job namespace team              events (GPU time, who it went to)

Field types are part of the contract (InfluxDB fixes a field's type per shard): an `int`
field is always written as an integer, a `float` field always as a float. Every point's time
is the start of its window (ns), except gpu, gpu_process, pipeline, events_lost and streams:
the sample's time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from gpuflight.producer.contract.abi import COPY_KINDS, SYNC_SCOPES

FieldValue = int | float | str


class Tags:
    """Tag keys."""

    HOST: Final = "host"
    JOB: Final = "job"
    LAYER: Final = "layer"
    API: Final = "api"
    KERNEL: Final = "kernel"
    BUCKET: Final = "bucket"
    KIND: Final = "kind"
    SCOPE: Final = "scope"
    GPU: Final = "gpu"
    DIRECTION: Final = "direction_of_change"
    WORKER: Final = "worker"
    ROUTE: Final = "route"
    NAMESPACE: Final = "namespace"
    TEAM: Final = "team"
    RANK: Final = "rank"
    #: The CUDA device of the calling thread, its ordinal in the process (as the process's
    #: CUDA_VISIBLE_DEVICES numbers them) — not NVML's index, which `gpu` is.
    DEVICE: Final = "device"
    #: A code path folded to its user function (streams/paths.py): bounded per window.
    FUNCTION: Final = "function"


class Fields:
    """Field keys (a key may be used by several measurements, with one meaning)."""

    COUNT: Final = "count"
    RATE_PER_S: Final = "rate_per_s"
    GRAPH_KERNEL_NODES: Final = "graph_kernel_nodes"
    CAPTURED_LAUNCHES: Final = "captured_launches"
    FIRST_LAUNCH_OFFSET_NS: Final = "first_launch_offset_ns"
    LAST_LAUNCH_OFFSET_NS: Final = "last_launch_offset_ns"
    P50_GRID_BLOCKS: Final = "p50_grid_blocks"
    P90_GRID_BLOCKS: Final = "p90_grid_blocks"
    P99_GRID_BLOCKS: Final = "p99_grid_blocks"
    P50_BLOCK_THREADS: Final = "p50_block_threads"
    P90_BLOCK_THREADS: Final = "p90_block_threads"
    P99_BLOCK_THREADS: Final = "p99_block_threads"
    LAUNCHES: Final = "launches"
    THREADS_PER_S: Final = "threads_per_s"
    BYTES: Final = "bytes"
    BYTES_PER_S: Final = "bytes_per_s"
    SYNC_COUNT: Final = "sync_count"
    SYNC_BYTES: Final = "sync_bytes"
    SYNC_NS: Final = "sync_ns"
    BANDWIDTH_BYTES_PER_S: Final = "bandwidth_bytes_per_s"
    ALLOC_COUNT: Final = "alloc_count"
    ALLOC_BYTES: Final = "alloc_bytes"
    FREE_COUNT: Final = "free_count"
    FREE_BYTES: Final = "free_bytes"
    LIVE_BYTES: Final = "live_bytes"
    PEAK_LIVE_BYTES: Final = "peak_live_bytes"
    COPY_NS: Final = "copy_ns"
    BLOCKED_SHARE: Final = "blocked_share"
    PROCESSES: Final = "processes"
    UTILIZATION_GPU_PCT: Final = "utilization_gpu_pct"
    UTILIZATION_MEMORY_PCT: Final = "utilization_memory_pct"
    MEMORY_USED_BYTES: Final = "memory_used_bytes"
    MEMORY_TOTAL_BYTES: Final = "memory_total_bytes"
    POWER_W: Final = "power_w"
    TEMPERATURE_C: Final = "temperature_c"
    SM_CLOCK_MHZ: Final = "sm_clock_mhz"
    PCIE_RX_BYTES_PER_S: Final = "pcie_rx_bytes_per_s"
    PCIE_TX_BYTES_PER_S: Final = "pcie_tx_bytes_per_s"
    SM_UTIL_PCT: Final = "sm_util_pct"
    MEM_UTIL_PCT: Final = "mem_util_pct"
    USED_MEMORY_BYTES: Final = "used_memory_bytes"
    BASELINE: Final = "baseline"
    OBSERVED: Final = "observed"
    RATIO: Final = "ratio"
    ZSCORE: Final = "zscore"
    VERDICT: Final = "verdict"
    CONSECUTIVE_WINDOWS: Final = "consecutive_windows"
    ALERT: Final = "alert"
    COPY_SYNC_SHARE: Final = "copy_sync_share"
    BYTES_PER_LAUNCH: Final = "bytes_per_launch"
    GPU_UTILIZATION_PCT: Final = "gpu_utilization_pct"
    CAPTURED: Final = "captured"
    PRODUCED: Final = "produced"
    PUBLISHED: Final = "published"
    DROPPED_KERNEL: Final = "dropped_kernel"
    DROPPED_USER: Final = "dropped_user"
    DROPPED_AGENT_DIED: Final = "dropped_agent_died"
    QUEUE_MESSAGES: Final = "queue_messages"
    MESSAGES: Final = "messages"
    EVENTS: Final = "events"
    DUPLICATES: Final = "duplicates"
    LATE_EVENTS: Final = "late_events"
    FUTURE_EVENTS: Final = "future_events"
    DEAD_LETTERS: Final = "dead_letters"
    ALERTS: Final = "alerts"
    POINTS_WRITTEN: Final = "points_written"
    POINTS_REJECTED: Final = "points_rejected"
    WRITE_RETRIES: Final = "write_retries"
    PENDING_POINTS: Final = "pending_points"
    LAG_MESSAGES: Final = "lag_messages"
    JOBS: Final = "jobs"
    REQUESTS: Final = "requests"
    HTTP_RECORDS_LOST: Final = "http_records_lost"
    SERVER_ERRORS: Final = "server_errors"
    LATENCY_P50_NS: Final = "latency_p50_ns"
    LATENCY_P99_NS: Final = "latency_p99_ns"
    LATENCY_NS: Final = "latency_ns"
    BYTES_IN: Final = "bytes_in"
    BYTES_OUT: Final = "bytes_out"
    GPU_NS: Final = "gpu_ns"
    BLOCKED_NS: Final = "blocked_ns"
    CALLS: Final = "calls"
    LAUNCHES_PER_REQUEST: Final = "launches_per_request"
    GPU_SECONDS_PER_REQUEST: Final = "gpu_seconds_per_request"
    BYTES_PER_REQUEST: Final = "bytes_per_request"
    COST_USD: Final = "cost_usd"
    COST_PER_REQUEST_USD: Final = "cost_per_request_usd"
    COST_PER_HOUR_USD: Final = "cost_per_hour_usd"
    REQUEST_GPU_NS: Final = "request_gpu_ns"
    UNATTRIBUTED_GPU_NS: Final = "unattributed_gpu_ns"
    UNATTRIBUTED_SHARE: Final = "unattributed_share"
    UNPRICED_GPU_NS: Final = "unpriced_gpu_ns"
    REQUEST_ID: Final = "request_id"
    TRACE_ID: Final = "trace_id"
    TOP_FUNCTION: Final = "top_function"
    PARENT_SPAN_ID: Final = "parent_span_id"
    STATUS: Final = "status"
    METHOD: Final = "method"
    LATE_REQUESTS: Final = "late_requests"
    COPIES: Final = "copies"
    SYNCS: Final = "syncs"
    H2H_BYTES: Final = "h2h_bytes"
    H2D_BYTES: Final = "h2d_bytes"
    D2H_BYTES: Final = "d2h_bytes"
    D2D_BYTES: Final = "d2d_bytes"
    DEFAULT_BYTES: Final = "default_bytes"
    UNKNOWN_BYTES: Final = "unknown_bytes"


# -- tag values with a fixed vocabulary ------------------------------------------------------

#: `kernels`: the kernels beyond the reported top ones, together.
OTHER_KERNEL: Final = "other"
#: `copies`/`bandwidth_anomaly` kind: a cudaMemcpyKind outside COPY_KINDS.
UNKNOWN_KIND: Final = "unknown"
COPY_KIND_VALUES: Final[tuple[str, ...]] = (*COPY_KINDS, UNKNOWN_KIND)
#: `syncs` scope.
UNKNOWN_SCOPE: Final = "unknown"
SYNC_SCOPE_VALUES: Final[tuple[str, ...]] = (*SYNC_SCOPES.values(), UNKNOWN_SCOPE)
#: `errors` / `launches` api for an API id this version does not know.
UNKNOWN_API: Final = "unknown"
LOW_BANDWIDTH: Final = "low_bandwidth"
HIGH_BYTES: Final = "high_bytes"
DIRECTIONS: Final[tuple[str, ...]] = (LOW_BANDWIDTH, HIGH_BYTES)
#: `devices` bytes field of each copy kind (COPY_KIND_VALUES).
BYTES_OF_KIND: Final[Mapping[str, str]] = MappingProxyType({
    "H2H": Fields.H2H_BYTES,
    "H2D": Fields.H2D_BYTES,
    "D2H": Fields.D2H_BYTES,
    "D2D": Fields.D2D_BYTES,
    "default": Fields.DEFAULT_BYTES,
    UNKNOWN_KIND: Fields.UNKNOWN_BYTES,
})
#: `devices` device tag: the ordinals 0..MAX_DEVICE_TAGS-1 as themselves; any other value (a
#: forged or broken record: the probes record only devices a call accepted) as OTHER_DEVICE,
#: so no message can make more than MAX_DEVICE_TAGS + 1 series per job.
MAX_DEVICE_TAGS: Final = 256
OTHER_DEVICE: Final = "other"
#: The stream app's default tumbling window, seconds (Grafana's minimum interval).
DEFAULT_WINDOW_S: Final = 10.0
#: Consecutive memory-bound windows before the alert fires (the alert rule says so).
MEMORY_BOUND_ALERT_WINDOWS: Final = 3
#: Buckets of the log2 histograms: bucket i holds [2^i, 2^(i+1)) (bucket 0 also holds 0).
HISTOGRAM_BUCKETS: Final = 64
#: `routes`/`job_cost` namespace or team of a process that has none (not in Kubernetes, no
#: such label): producer.contract.pricing.NO_LABEL.
NO_LABEL: Final = "(none)"
#: `request_samples`: the slowest requests of each (window, job, route) written, rank 0..N-1.
REQUEST_SAMPLES: Final = 10


def device_label(device: int) -> str:
    """The `device` tag of a CUDA device ordinal."""
    return str(device) if 0 <= device < MAX_DEVICE_TAGS else OTHER_DEVICE


def bucket_label(index: int) -> str:
    """The `bucket` tag of log2 bucket `index`: "2^5" holds 32..63."""
    if not 0 <= index < HISTOGRAM_BUCKETS:
        raise ValueError(f"bucket {index} is outside 0..{HISTOGRAM_BUCKETS - 1}")
    return f"2^{index}"


# -- the registry ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: type[int] | type[float] | type[str]
    #: For dashboards: "", "bytes", "ns", "1/s", "bytes/s", "%", "W", "C", "MHz", "share",
    #: "usd", "s".
    unit: str = ""


def _int(name: str, unit: str = "") -> FieldSpec:
    return FieldSpec(name, int, unit)


def _float(name: str, unit: str = "") -> FieldSpec:
    return FieldSpec(name, float, unit)


def _str(name: str) -> FieldSpec:
    return FieldSpec(name, str)


@dataclass(frozen=True)
class Measurement:
    name: str
    tags: tuple[str, ...]
    fields: tuple[FieldSpec, ...]

    @property
    def field_names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields)

    def field(self, name: str) -> FieldSpec:
        for spec in self.fields:
            if spec.name == name:
                return spec
        raise KeyError(f"{self.name} has no field {name!r}")


_WINDOW_JOB: Final = (Tags.HOST, Tags.JOB)

LAUNCHES: Final = Measurement(
    "launches",
    (Tags.HOST, Tags.JOB, Tags.LAYER, Tags.API),
    (_int(Fields.COUNT), _float(Fields.RATE_PER_S, "1/s"), _int(Fields.GRAPH_KERNEL_NODES)),
)
KERNELS: Final = Measurement(
    "kernels", (Tags.HOST, Tags.JOB, Tags.KERNEL), (_int(Fields.COUNT),)
)
GRID_BLOCKS: Final = Measurement(
    "grid_blocks", (Tags.HOST, Tags.JOB, Tags.BUCKET), (_int(Fields.COUNT),)
)
BLOCK_THREADS: Final = Measurement(
    "block_threads", (Tags.HOST, Tags.JOB, Tags.BUCKET), (_int(Fields.COUNT),)
)
LAUNCH_SHAPE: Final = Measurement(
    "launch_shape",
    _WINDOW_JOB,
    (
        _int(Fields.LAUNCHES),
        _int(Fields.CAPTURED_LAUNCHES),
        _int(Fields.FIRST_LAUNCH_OFFSET_NS, "ns"),
        _int(Fields.LAST_LAUNCH_OFFSET_NS, "ns"),
        _float(Fields.P50_GRID_BLOCKS),
        _float(Fields.P90_GRID_BLOCKS),
        _float(Fields.P99_GRID_BLOCKS),
        _float(Fields.P50_BLOCK_THREADS),
        _float(Fields.P90_BLOCK_THREADS),
        _float(Fields.P99_BLOCK_THREADS),
        _float(Fields.THREADS_PER_S, "1/s"),
    ),
)
COPIES: Final = Measurement(
    "copies",
    (Tags.HOST, Tags.JOB, Tags.KIND),
    (
        _int(Fields.COUNT),
        _int(Fields.BYTES, "bytes"),
        _float(Fields.BYTES_PER_S, "bytes/s"),
        _int(Fields.SYNC_COUNT),
        _int(Fields.SYNC_BYTES, "bytes"),
        _int(Fields.SYNC_NS, "ns"),
        _float(Fields.BANDWIDTH_BYTES_PER_S, "bytes/s"),
    ),
)
MEMSET: Final = Measurement(
    "memset", _WINDOW_JOB, (_int(Fields.COUNT), _int(Fields.BYTES, "bytes"))
)
MEMORY: Final = Measurement(
    "memory",
    _WINDOW_JOB,
    (
        _int(Fields.ALLOC_COUNT),
        _int(Fields.ALLOC_BYTES, "bytes"),
        _int(Fields.FREE_COUNT),
        _int(Fields.FREE_BYTES, "bytes"),
        _int(Fields.LIVE_BYTES, "bytes"),
        _int(Fields.PEAK_LIVE_BYTES, "bytes"),
    ),
)
SYNCS: Final = Measurement(
    "syncs", (Tags.HOST, Tags.JOB, Tags.SCOPE), (_int(Fields.COUNT), _int(Fields.SYNC_NS, "ns"))
)
CPU_BLOCKED: Final = Measurement(
    "cpu_blocked",
    _WINDOW_JOB,
    (
        _int(Fields.SYNC_NS, "ns"),
        _int(Fields.COPY_NS, "ns"),
        _float(Fields.BLOCKED_SHARE, "share"),
        _int(Fields.PROCESSES),
    ),
)
ERRORS: Final = Measurement(
    "errors", (Tags.HOST, Tags.JOB, Tags.API), (_int(Fields.COUNT),)
)
#: A job's calls per CUDA device in a window (the device current on the calling thread):
#: kernel launches that ran (as `launch_shape.launches`: not captured ones, not graph
#: launches), copies and their bytes by kind (as `copies`; a peer copy on the caller's device),
#: syncs and the CPU blocked on the GPU in them and in synchronous copies (as `syncs` and
#: `cpu_blocked`). Σ over devices = the job's totals. One series per (host, job, device): a
#: measurement of its own rather than a tag on launches/copies/syncs, so their series are not
#: multiplied by devices and their queries, alerts and history are unchanged. Events of a
#: producer before devices were recorded count as device 0 (producer/contract/wire.py).
DEVICES: Final = Measurement(
    "devices",
    (Tags.HOST, Tags.JOB, Tags.DEVICE),
    (
        _int(Fields.LAUNCHES),
        _float(Fields.RATE_PER_S, "1/s"),
        _int(Fields.COPIES),
        _int(Fields.BYTES, "bytes"),
        *(_int(BYTES_OF_KIND[kind], "bytes") for kind in COPY_KIND_VALUES),
        _int(Fields.SYNCS),
        _int(Fields.SYNC_NS, "ns"),
        _int(Fields.COPY_NS, "ns"),
    ),
)
GPU: Final = Measurement(
    "gpu",
    (Tags.HOST, Tags.GPU),
    (
        _int(Fields.UTILIZATION_GPU_PCT, "%"),
        _int(Fields.UTILIZATION_MEMORY_PCT, "%"),
        _int(Fields.MEMORY_USED_BYTES, "bytes"),
        _int(Fields.MEMORY_TOTAL_BYTES, "bytes"),
        _float(Fields.POWER_W, "W"),
        _int(Fields.TEMPERATURE_C, "C"),
        _int(Fields.SM_CLOCK_MHZ, "MHz"),
        _int(Fields.PCIE_RX_BYTES_PER_S, "bytes/s"),
        _int(Fields.PCIE_TX_BYTES_PER_S, "bytes/s"),
    ),
)
GPU_PROCESS: Final = Measurement(
    "gpu_process",
    (Tags.HOST, Tags.GPU, Tags.JOB),
    (
        _int(Fields.SM_UTIL_PCT, "%"),
        _int(Fields.MEM_UTIL_PCT, "%"),
        _int(Fields.USED_MEMORY_BYTES, "bytes"),
        _int(Fields.PROCESSES),
    ),
)
BANDWIDTH_ANOMALY: Final = Measurement(
    "bandwidth_anomaly",
    (Tags.HOST, Tags.JOB, Tags.KIND, Tags.DIRECTION),
    (
        _float(Fields.BASELINE),
        _float(Fields.OBSERVED),
        _float(Fields.RATIO),
        _float(Fields.ZSCORE),
    ),
)
MEMORY_BOUND: Final = Measurement(
    "memory_bound",
    _WINDOW_JOB,
    (
        _int(Fields.VERDICT),
        _int(Fields.CONSECUTIVE_WINDOWS),
        _int(Fields.ALERT),
        _float(Fields.BLOCKED_SHARE, "share"),
        _float(Fields.COPY_SYNC_SHARE, "share"),
        _float(Fields.BYTES_PER_LAUNCH, "bytes"),
        _float(Fields.GPU_UTILIZATION_PCT, "%"),
    ),
)
PIPELINE: Final = Measurement(
    "pipeline",
    (Tags.HOST,),
    (
        _int(Fields.CAPTURED),
        _int(Fields.PRODUCED),
        _int(Fields.PUBLISHED),
        _int(Fields.DROPPED_KERNEL),
        _int(Fields.DROPPED_USER),
        _int(Fields.DROPPED_AGENT_DIED),
        _int(Fields.QUEUE_MESSAGES),
        _int(Fields.REQUESTS),
        _int(Fields.HTTP_RECORDS_LOST),
    ),
)

#: Events of a job's processes that the producer lost: in the kernel (ring buffer full), beyond
#: its Kafka queue (or refused by Kafka), and those an earlier producer on the host captured but
#: never published because it was killed (reported by the next from the kernel's tally,
#: producer/publish/deadagents.py). Counters since the producer started (they restart at 0 with it),
#: summed over the job's processes on the host, written with each metrics record once above 0.
#: While a job has a point here, its other figures are lower bounds.
EVENTS_LOST: Final = Measurement(
    "events_lost",
    (Tags.HOST, Tags.JOB),
    (
        _int(Fields.DROPPED_KERNEL),
        _int(Fields.DROPPED_USER),
        _int(Fields.DROPPED_AGENT_DIED),
    ),
)
#: The fields of EVENTS_LOST, each a counter since the producer started.
LOST_FIELDS: Final = (Fields.DROPPED_KERNEL, Fields.DROPPED_USER, Fields.DROPPED_AGENT_DIED)

#: Events of a job the stream worker did not count, one point per message that had any (at
#: the worker's wall clock when it took the message): late beyond grace (their windows were
#: closed) or stamped further ahead of the worker's clock than --max-future (a forged or
#: broken clock). They are in the dead-letter topic; the job's other figures lack them.
EVENTS_UNCOUNTED: Final = Measurement(
    "events_uncounted",
    (Tags.HOST, Tags.JOB),
    (
        _int(Fields.LATE_EVENTS),
        _int(Fields.FUTURE_EVENTS),
    ),
)

#: Counters since the worker started (they restart at 0 with it), and its consumer lag.
STREAMS: Final = Measurement(
    "streams",
    (Tags.WORKER,),
    (
        _int(Fields.MESSAGES),
        _int(Fields.EVENTS),
        _int(Fields.DUPLICATES),
        _int(Fields.LATE_EVENTS),
        _int(Fields.FUTURE_EVENTS),
        _int(Fields.DEAD_LETTERS),
        _int(Fields.ALERTS),
        _int(Fields.POINTS_WRITTEN),
        _int(Fields.POINTS_REJECTED),
        _int(Fields.WRITE_RETRIES),
        _int(Fields.PENDING_POINTS),
        _int(Fields.LAG_MESSAGES),
        _int(Fields.JOBS),
        _int(Fields.REQUESTS),
        _int(Fields.LATE_REQUESTS),
    ),
)

#: HTTP requests served by a job's processes, per route, counted in the window of their end
#: (the response's last byte out). The GPU work of each request (its exact calls, and its
#: shares of calls made while several requests were in flight) is summed into it: launches
#: (kernel launches that ran; shares make fractions), GPU time (ns), bytes copied; cost is
#: GPU-seconds at the price of the job's GPU model (USD per GPU-hour, the worker's price
#: book). Per request: those sums / requests; per hour: cost · 3600 / window.
ROUTES: Final = Measurement(
    "routes",
    (Tags.HOST, Tags.JOB, Tags.NAMESPACE, Tags.TEAM, Tags.ROUTE),
    (
        _int(Fields.REQUESTS),
        _int(Fields.SERVER_ERRORS),
        _float(Fields.LATENCY_P50_NS, "ns"),
        _float(Fields.LATENCY_P99_NS, "ns"),
        _int(Fields.BYTES_IN, "bytes"),
        _int(Fields.BYTES_OUT, "bytes"),
        _float(Fields.LAUNCHES),
        _float(Fields.GPU_NS, "ns"),
        _float(Fields.BYTES, "bytes"),
        _float(Fields.COST_USD, "usd"),
        _float(Fields.LAUNCHES_PER_REQUEST),
        _float(Fields.GPU_SECONDS_PER_REQUEST, "s"),
        _float(Fields.BYTES_PER_REQUEST, "bytes"),
        _float(Fields.COST_PER_REQUEST_USD, "usd"),
        _float(Fields.COST_PER_HOUR_USD, "usd"),
    ),
)

#: What each code path of a (window, job) cost (`gpuflight producer --stack-sampling N`),
#: folded to its user function: the innermost Python frame outside site-packages and the
#: standard library (streams/paths.py), "function (dir/file.py)". Bounded: the TOP_FUNCTIONS
#: costliest by GPU time, and the rest as "[other]". Estimates (each sample weighted by 1/p).
CODE_PATHS: Final = Measurement(
    "code_paths",
    (Tags.HOST, Tags.JOB, Tags.NAMESPACE, Tags.TEAM, Tags.FUNCTION),
    (
        _float(Fields.LAUNCHES),
        _float(Fields.GPU_NS, "ns"),
        _float(Fields.BYTES, "bytes"),
        _float(Fields.BLOCKED_NS, "ns"),
        _float(Fields.CALLS),
        _float(Fields.COST_USD, "usd"),
        _float(Fields.COST_PER_HOUR_USD, "usd"),
    ),
)

#: What each code path of a (window, job) made for requests of a route cost: CODE_PATHS per
#: (route, user function), for processes serving HTTP. Bounded: MAX_ROUTES routes a window
#: (more: "[other]") and the TOP_ROUTE_FUNCTIONS costliest functions of each, the rest as
#: "[other]" (streams/paths.py). A call shared by requests in flight gives each its share.
ROUTE_CODE_PATHS: Final = Measurement(
    "route_code_paths",
    (Tags.HOST, Tags.JOB, Tags.NAMESPACE, Tags.TEAM, Tags.ROUTE, Tags.FUNCTION),
    CODE_PATHS.fields,
)

#: The slowest requests of a (window, job, route), rank 0 the slowest: what a user follows to
#: their trace backend (trace_id and the caller's span, when the request carried a W3C
#: traceparent; absent otherwise). Bounded: at most REQUEST_SAMPLES per (window, job, route).
REQUEST_SAMPLES_M: Final = Measurement(
    "request_samples",
    (Tags.HOST, Tags.JOB, Tags.ROUTE, Tags.RANK),
    (
        _str(Fields.REQUEST_ID),
        _str(Fields.TRACE_ID),
        _str(Fields.PARENT_SPAN_ID),
        _str(Fields.METHOD),
        _int(Fields.STATUS),
        _int(Fields.LATENCY_NS, "ns"),
        _float(Fields.LAUNCHES),
        _float(Fields.GPU_NS, "ns"),
        _float(Fields.COST_USD, "usd"),
        _str(Fields.TOP_FUNCTION),
    ),
)

#: A job's GPU time in a window (by the time of its calls), the part its requests explain and
#: the part no request does (idle or background work: start-up, warm-up, timers), and what it
#: cost. Σ over jobs grouped by namespace and team is their cost.
JOB_COST: Final = Measurement(
    "job_cost",
    (Tags.HOST, Tags.JOB, Tags.NAMESPACE, Tags.TEAM),
    (
        _float(Fields.GPU_NS, "ns"),
        _float(Fields.REQUEST_GPU_NS, "ns"),
        _float(Fields.UNATTRIBUTED_GPU_NS, "ns"),
        _float(Fields.UNATTRIBUTED_SHARE, "share"),
        _float(Fields.COST_USD, "usd"),
        _float(Fields.COST_PER_HOUR_USD, "usd"),
        _float(Fields.UNPRICED_GPU_NS, "ns"),
    ),
)

#: Every measurement the stream app writes, by name.
ALL: Final[Mapping[str, Measurement]] = MappingProxyType(
    {
        m.name: m
        for m in (
            LAUNCHES,
            KERNELS,
            GRID_BLOCKS,
            BLOCK_THREADS,
            LAUNCH_SHAPE,
            COPIES,
            MEMSET,
            MEMORY,
            SYNCS,
            CPU_BLOCKED,
            ERRORS,
            DEVICES,
            GPU,
            GPU_PROCESS,
            BANDWIDTH_ANOMALY,
            MEMORY_BOUND,
            PIPELINE,
            EVENTS_LOST,
            EVENTS_UNCOUNTED,
            STREAMS,
            ROUTES,
            CODE_PATHS,
            ROUTE_CODE_PATHS,
            REQUEST_SAMPLES_M,
            JOB_COST,
        )
    }
)


@dataclass(frozen=True)
class Point:
    """One InfluxDB point: what a sink writes. Fields that are absent are left out."""

    measurement: str
    tags: Mapping[str, str]
    fields: Mapping[str, FieldValue]
    time_ns: int


def problems(point: Point) -> list[str]:
    """What is wrong with `point` against `ALL` (empty: it may be written)."""
    spec = ALL.get(point.measurement)
    if spec is None:
        return [f"unknown measurement {point.measurement!r}"]
    found: list[str] = []
    if set(point.tags) != set(spec.tags):
        found.append(f"{spec.name}: tags {sorted(point.tags)}, expected {sorted(spec.tags)}")
    found += [f"{spec.name}: tag {k} is empty" for k, v in point.tags.items() if not v]
    if not point.fields:
        found.append(f"{spec.name}: no fields")
    for name, value in point.fields.items():
        if name not in spec.field_names:
            found.append(f"{spec.name}: unknown field {name!r}")
            continue
        expected = spec.field(name).type
        if type(value) is not expected:
            found.append(
                f"{spec.name}.{name}: {type(value).__name__}, expected {expected.__name__}"
            )
        elif isinstance(value, float) and not math.isfinite(value):
            found.append(f"{spec.name}.{name}: {value} is not finite")
        elif isinstance(value, int) and not -(2**63) <= value < 2**63:
            found.append(f"{spec.name}.{name}: {value} is beyond InfluxDB's int64")
    return found


def validate(point: Point) -> None:
    """ValueError listing every problem of `point`; nothing when it may be written."""
    found = problems(point)
    if found:
        raise ValueError("; ".join(found))
