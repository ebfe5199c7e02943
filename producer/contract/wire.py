"""The Kafka wire contract, version 1 — the one module producers and streams share.

Topics (PREFIX defaults to "gpuflight"; the major version is in the name, and changes within a
version are additive only):

  PREFIX.events.v1     raw events, many per message: one message holds one process's events of
                       one flush interval, as columns (`EventBatch`). Key: the host, so
                       per-process order holds within a partition and every per-host table
                       needs no repartition. Kafka timestamp: the first event's wall-clock time
                       (ms). Kept (no retention limit) so time ranges can be replayed.
  PREFIX.processes.v1  one identity per process (`ProcessRecord`; compacted, key host/pid/start).
  PREFIX.metrics.v1    the producer's counters, every few seconds (`MetricsRecord`; key: host).
  PREFIX.nvml.v1       every GPU's gauges from NVML, every second (`NvmlRecord`; key: host).

Every message is one JSON object (orjson) whose first two fields are "schema" and "v" (1); a
reader refuses another schema or version. Each record is a frozen dataclass here with
`encode_*` / `decode_*`; decoding a message that is not valid raises `WireError` with a
one-line reason (not JSON, wrong schema or version, a missing field, a wrong type, a negative
count, an absurd size), never anything else.

Additive within v1: a reader ignores fields it does not know; every field of the first v1 is
required (one that may be null is there as null), and a field added after it is optional with
a default (marked below), so a reader takes the messages of every v1 producer.

An events message (`EventBatch`):

  {"schema": "gpuflight.events", "v": 1, "host": str, "pid": int,
   "start_time": int,          # process start, clock ticks since boot (/proc stat)
   "count": N, "ts0": int,     # first event's wall-clock ns; N <= MAX_EVENTS
   "columns": {NAME: [N ints], ...},
   "kernels": {HANDLE: [SHORT, FULL], ...}}   # optional (additive in v1)

Added within v1 (optional; a producer without the HTTP capture never writes them):

   "columns": {..., "request_id": [N ints],   # exact: the request the event was made for
                    "request_set": [N ints]},  # shared: 1 + its index in "request_sets"
   "request_sets": [[[REQUEST_ID, SHARE], ...], ...],   # shares of one set sum to 1
   "requests": [REQUEST, ...],   # the process's requests answered in this flush interval
   "unattributed": {COST: number, ...}   # the cost of this message's events no request explains

Added within v1 (optional; a producer only writes it when its kernel counted events under
overload instead of recording them, bpf/cudart.bpf.c):

   "aggregates": {"count": M, "columns": {NAME: [M ints], ...}}

each of the M an aggregate (`records.AGGREGATE_DTYPE`): "count" events of this process that
share its "api", "type", "flags" (F_ASYNC, F_HAS_RESULT, AGG_F_FAILED: the calls failed),
"device", "handle" (a launch's function, a graph launch's exec) and "dim" (6·M values: a
launch's grid and block, else dim[0] as the event has it: copy kind, allocation kind, sync
scope; a graph launch's kernel nodes in GRAPH_KERNEL_NODES), made from "ts_ns" to "last_ts_ns"
(wall clock ns, absolute), with "bytes" and "duration_ns" their sums. Columns of zeros are left
out; "count" is never 0. They count as their events do (producer/contract/counting.py,
Counts.add_aggregates) in every figure; a message may hold aggregates and no event ("count": 0,
"ts0" the first aggregate's time). An older reader ignores them: its figures miss those
events, as they would have missed them had the kernel dropped them.

An event has "request_id" (non-zero) when the thread that made the call was serving exactly
one request (exact), or "request_set" (non-zero) when its cost is split equally over the
requests of the process in flight at that time (shared), or neither (unattributed; both are
never set). A message that carries "requests" may have "count": 0 (requests answered while the
process made no CUDA call; then "ts0" is the first request's end, and "columns" is {}).

A REQUEST (`RequestRecord`): one HTTP/1.1 request and its response, on a server socket of the
process (producer/http/parser.py), with what its CUDA calls cost:

  {"request_id": int,            # 1 .. 2^63-1, unique per host; what events point at
   "tid": int,                   # the thread that read it
   "method": str, "path": str,   # the path without its query
   "route": str,                 # bounded: id segments are {id}; "other" past a process's cap
   "status": int,                # 0: no response seen (connection closed, lost, expired)
   "start_ns": int,              # wall clock: the read that brought its first byte
   "end_ns": int,                # wall clock: the write that sent its response's last byte
   "bytes_in": int, "bytes_out": int,
   "trace_id": str|null,         # the W3C traceparent the client sent: 32 hex digits
   "parent_span_id": str|null,   # and the caller's span: 16 hex digits
   "complete": bool,             # false: the response was not seen whole
   "port": int,                  # the server's port (0: unknown)
   "cost": {COST: number, ...},  # what its CUDA calls cost: exact, plus its shares
   "gpu_source": str|null,       # gpu_ns from "nvml" (per-process utilisation), "queued"
                                 # (time its process had work queued), "mixed"; null: none
   "code_paths": [[FUNCTION, LAUNCHES, GPU_NS], ...]}  # optional, added within v1: the
                                 # user functions whose sampled calls cost it most (at most
                                 # MAX_REQUEST_PATHS, costliest first; estimates)

COST names are REQUEST_COST_FIELDS (producer/contract/costs.py's COST_FIELDS): launches, weight
(blocks x threads), graph_launches, kernels, h2d_bytes, d2h_bytes, d2d_bytes,
other_copy_bytes, memset_bytes, allocs, alloc_bytes, syncs, blocked_ns (CPU time blocked in
syncs and synchronous copies), gpu_ns (GPU time); a cost that is zero may be left out. Over a
process, the sum of its requests' costs plus its messages' "unattributed" is the total cost
of its events.

"kernels" names every launched `handle` of the message whose name the node knows: FULL is the
demangled name (or the symbol as it is when it does not demangle), SHORT the same without
template arguments and parameter lists (the stream app's bounded `kernel` tag); a kernel of
unknown name is "MODULE+0xOFFSET". Each message carries its own names, so any replayed range
decodes on its own.

Columns are those of struct gf_event (bpf/events.h) after enrichment (wall
clock, free sizes), with "ts" as deltas from ts0 and "dim" flattened to 6·N
values; a column that is all zeros is left out. Decoding gives back exactly the
records, hence exactly the events `--output` writes — but for "bytes" and
"duration_ns" beyond MAX_AMOUNT (2^48; a failed call's size is what its caller
passed), which read as MAX_AMOUNT. "host" is 1 to 255 characters; a value out of
its field's range (a time before 1970 or past 2^63 ns, a tid past 2^32) is a
WireError. A request's bytes_in and bytes_out are at most MAX_AMOUNT, a cost at
most 2^63.

Added within v1: "device" (the CUDA device of the calling thread, its ordinal in the process).
Like every column it is left out when all zeros, so a message of an older producer (which
never wrote it) decodes as device 0 — the default device, all a producer before it could see —
and an older reader, which ignores columns it does not know, reads a newer message as before.

Added within v1: "paths" (`PathRecord`), the code paths of the process's sampled calls since
its last message (`gpuflight producer --stack-sampling N`), one per distinct stack:

  {"ts_ns": int,                          # wall clock: the latest of its sampled calls
   "frames": [[FUNCTION, FILE, LINE|null], ...],   # root first, at most MAX_PATH_FRAMES;
                                          # the last, with no line, is the native caller
   "values": {VALUE: number, ...},        # PATH_VALUES, each weighted by 1/p (estimates)
   "route": ROUTE}                        # optional: the calls were made for requests of it

Added within v1 to paths: "route". A process serving HTTP has one path per (stack, route):
what its sampled calls made for requests of that route cost (a call shared by requests in
flight gives each its share), and one without "route" for calls made for no request. An
older reader sums a stack's paths as before.

A message may carry paths and nothing else ("count": 0). Each message carries its paths'
frames whole, so any replayed range decodes on its own; an older reader ignores them.

A processes message (`ProcessRecord`), published once per process while it is alive, and
once more under the same key, with "exited_ns", once the node agent has found it gone and
published its last events (the compacted topic keeps that one):

  {"schema": "gpuflight.process", "v": 1,
   "host": str, "pid": int, "start_time": int,   # the key: host/pid/start_time
   "started_at_ns": int|null,                    # wall clock of the start
   "comm": str|null, "cmdline": [str], "exe": str|null,
   "container_id": str|null, "pod_uid": str|null, "pod": str|null, "namespace": str|null,
   "slurm_job_id": str|null,
   "job": str,          # k8s:NAMESPACE/POD, slurm:ID or COMM:PID (producer/publish/identity.py)
   "team": str|null,    # $GPUFLIGHT_TEAM (a pod label through the downward API); absent: null
   "exited_ns": int|null}  # wall clock when the agent found it gone, its events all sent;
                           # absent (an older producer, or the process lives): null

A metrics message (`MetricsRecord`), every metrics interval; counters since the producer
started (a restart begins again at 0):

  {"schema": "gpuflight.metrics", "v": 1, "host": str, "ts_ns": int, "uptime_s": float,
   "captured": int,                  # events read from the ring buffer
   "produced": int, "published": int,   # events handed to librdkafka, delivered to Kafka
   "dropped_kernel": int, "dropped_kernel_by_pid": {PID: int},   # ring buffer full
   "dropped_user": int, "dropped_user_by_pid": {PID: int},       # beyond the Kafka queue
   "queue_messages": int,            # messages in librdkafka's queue
   "libraries_attached": int,        # runtime library files probed
   # added within v1 (optional, default 0):
   "driver_libraries_attached": int, # driver library files probed
   "dropped_names": int,             # kernel-name records lost in the kernel
   "forwarded_driver_calls": int,    # driver calls left out as the runtime's own
   "requests": int, "http_records_lost": int, "http_connections_untracked": int,
   "dropped_agent_died": int,        # events a killed earlier agent never published nor
   "dropped_agent_died_by_pid": {PID: int},   # counted (the kernel's tally:
                                              # producer/publish/deadagents.py)
   "events_aggregated": int}         # not lost: counted in the kernel under overload, sent as
                                     # events messages' "aggregates"

PID keys are decimal strings (JSON object keys); every field after "libraries_attached" is
optional (added within v1).

An NVML message (`NvmlRecord` of `GpuSample`s of `GpuProcessSample`s), every second:

  {"schema": "gpuflight.nvml", "v": 1, "host": str, "ts_ns": int,
   "gpus": [{"gpu": int,                         # NVML's index (nvidia-smi's order)
             "uuid": str|null, "name": str|null,
             "utilization_gpu_pct": int|null, "utilization_memory_pct": int|null,
             "memory_used_bytes": int|null, "memory_total_bytes": int|null,
             "power_w": float|null, "temperature_c": int|null, "sm_clock_mhz": int|null,
             "pcie_rx_bytes_per_s": int|null, "pcie_tx_bytes_per_s": int|null,
             "processes": [{"pid": int, "sm_util_pct": int|null, "mem_util_pct": int|null,
                            "used_memory_bytes": int|null}] | null}]}

A gauge NVML did not give is null; "processes" is null when NVML gives neither list of
processes for the GPU.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal, NamedTuple, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt
import orjson

from gpuflight.producer.contract.abi import AGGREGATE_DTYPE, EVENT_DTYPE
from gpuflight.producer.contract.errors import GpuflightError

log = logging.getLogger(__name__)

VERSION: Final = 1
EVENTS_SCHEMA: Final = "gpuflight.events"
PROCESS_SCHEMA: Final = "gpuflight.process"
METRICS_SCHEMA: Final = "gpuflight.metrics"
NVML_SCHEMA: Final = "gpuflight.nvml"
DEFAULT_PREFIX: Final = "gpuflight"

#: Columns of an events message, in struct order ("ts" holds ts_ns - ts0).
COLUMNS: Final[tuple[str, ...]] = (
    "ts", "tid", "api", "type", "flags", "result", "duration_ns",
    "handle", "stream", "bytes", "dim", "device",
)
#: Added within v1: each event's request (exact) or shared set of requests (1 + its index).
ATTRIBUTION_COLUMNS: Final[tuple[str, ...]] = ("request_id", "request_set")
#: The costs a request carries, and the unattributed cost of a message: those of
#: producer/contract/costs.py (COST_FIELDS; tests/unit/producer/contract/test_wire.py checks they
#: are the same).
REQUEST_COST_FIELDS: Final[tuple[str, ...]] = (
    "launches", "weight", "graph_launches", "kernels", "h2d_bytes", "d2h_bytes", "d2d_bytes",
    "other_copy_bytes", "memset_bytes", "allocs", "alloc_bytes", "syncs", "blocked_ns", "gpu_ns",
)
_FIELD_OF: Final = {"ts": "ts_ns"}
#: The most events a reader takes in one message (80 MB decoded; the producer sends at most
#: KafkaSettings.max_batch_events, 100,000).
MAX_EVENTS: Final = 1_000_000
#: Columns of a message's aggregates (records.AGGREGATE_DTYPE; "dim" flattened to 6·M).
AGGREGATE_COLUMNS: Final[tuple[str, ...]] = (
    "ts_ns", "last_ts_ns", "api", "type", "flags", "device", "handle", "dim", "count", "bytes",
    "duration_ns",
)
#: The most aggregates a reader takes in one message (the kernel's table holds 16,384).
MAX_AGGREGATES: Final = 1_000_000
_DIMS: Final = 6
#: The most an event's `bytes` or `duration_ns` reads as (2^48: 256 TiB, 78 hours). A failed
#: call's size is whatever the caller passed (cudaMalloc((size_t)-1)), and the wire carries
#: these uint64 as int64; a reader takes anything beyond as this, so no sum of a window, nor
#: InfluxQL's int64 sum of a range of windows, overflows on one absurd event.
MAX_AMOUNT: Final = 1 << 48
#: The longest host name (as `Host`).
MAX_HOST: Final = 255
#: Each integer column's range (its struct field's); "ts" is checked as times, "handle" and
#: "stream" are any uint64 (as int64), "duration_ns" and "bytes" are read up to MAX_AMOUNT.
_COLUMN_RANGES: Final[dict[str, tuple[int, int]]] = {
    "tid": (0, 2**32 - 1), "api": (0, 2**16 - 1), "type": (0, 255), "flags": (0, 255),
    "result": (-(2**31), 2**31 - 1), "dim": (0, 2**32 - 1), "device": (-(2**31), 2**31 - 1),
}
_AMOUNTS: Final = frozenset({"duration_ns", "bytes"})


class WireError(GpuflightError):
    """A message that is not a valid gpuflight message of this version."""


@dataclass(frozen=True)
class Topics:
    events: str
    processes: str
    metrics: str
    nvml: str

    @classmethod
    def with_prefix(cls, prefix: str = DEFAULT_PREFIX) -> Topics:
        return cls(
            events=f"{prefix}.events.v{VERSION}",
            processes=f"{prefix}.processes.v{VERSION}",
            metrics=f"{prefix}.metrics.v{VERSION}",
            nvml=f"{prefix}.nvml.v{VERSION}",
        )


class KernelName(NamedTuple):
    short: str
    full: str


def no_aggregates() -> npt.NDArray[np.void]:
    """An empty array of aggregates (records.AGGREGATE_DTYPE)."""
    return np.zeros(0, dtype=AGGREGATE_DTYPE)


#: What a code path carries (producer/decode/codepaths.py's names): kernel launches, GPU
#: time, bytes copied, CPU time blocked on the GPU, and the probed calls its samples stand for.
PATH_VALUES: Final[tuple[str, ...]] = ("launches", "gpu_ns", "bytes", "blocked_ns", "calls")
#: The most frames a path carries, and paths a message (a reader refuses more).
MAX_PATH_FRAMES: Final = 128
MAX_PATHS: Final = 10_000
#: The longest function or file name a frame carries.
MAX_FRAME_TEXT: Final = 1024
FrameText = Annotated[str, msgspec.Meta(max_length=MAX_FRAME_TEXT)]
LineNo = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
PathValue = Annotated[str, msgspec.Meta(pattern=f"^({'|'.join(PATH_VALUES)})\\Z")]


@dataclass(frozen=True)
class PathRecord:
    """A code path of a process's sampled calls, and what they cost (events.v1, additive)."""

    #: Wall clock: the latest of its sampled calls.
    ts_ns: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    #: Root first: (function, file, line); the native caller last, with no line.
    frames: Annotated[tuple[tuple[FrameText, FrameText, LineNo | None], ...],
                      msgspec.Meta(max_length=MAX_PATH_FRAMES)]
    values: Annotated[Mapping[PathValue, Annotated[float, msgspec.Meta(ge=0, le=2.0**63)]],
                      msgspec.Meta(max_length=len(PATH_VALUES))]
    #: The route of the requests the calls were made for (None: made for no request).
    route: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None


@dataclass(frozen=True)
class EventBatch:
    """One events message: a process's records (records.EVENT_DTYPE)."""

    host: str
    pid: int
    start_time: int
    events: npt.NDArray[np.void]
    #: Launch handle → name, for the launches of `events` whose name is known.
    kernels: Mapping[int, KernelName] = field(default_factory=dict)
    #: Which request(s) each event was made for (None: the node does not capture requests).
    attribution: EventAttribution | None = None
    #: The process's requests answered in this flush interval.
    requests: tuple[RequestRecord, ...] = ()
    #: The cost of these events that no request explains (REQUEST_COST_FIELDS; zeros left out).
    unattributed: Mapping[str, float] = field(default_factory=dict)
    #: Events of the process the kernel counted instead of recording (records.AGGREGATE_DTYPE).
    aggregates: npt.NDArray[np.void] = field(default_factory=no_aggregates)
    #: The code paths of its sampled calls since its last message (none: not sampled).
    paths: tuple[PathRecord, ...] = ()

    @property
    def first_ts_ns(self) -> int:
        if len(self.events):
            return int(self.events["ts_ns"][0])
        if self.requests:
            return min(r.end_ns for r in self.requests)
        if len(self.aggregates):
            return int(self.aggregates["ts_ns"].min())
        return min((p.ts_ns for p in self.paths), default=0)


#: Where a request's GPU time came from (RequestRecord.gpu_source).
GpuSource = Literal["nvml", "queued", "mixed"]
RequestId = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]
#: The user functions a request names (RequestRecord.code_paths).
MAX_REQUEST_PATHS: Final = 5
#: (user function, launches, GPU ns) of a request's code paths.
RequestPath = tuple[Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_FRAME_TEXT)],
                    Annotated[float, msgspec.Meta(ge=0, le=2.0**63)],
                    Annotated[float, msgspec.Meta(ge=0, le=2.0**63)]]
Share = Annotated[float, msgspec.Meta(gt=0, le=1)]
_COST_NAMES = "|".join(REQUEST_COST_FIELDS)
CostName = Annotated[str, msgspec.Meta(pattern=f"^({_COST_NAMES})\\Z")]
#: A cost is finite, and at most 2^63 (a sum of a million of them is still a finite float).
Costs = Annotated[Mapping[CostName, Annotated[float, msgspec.Meta(ge=0, le=2.0**63)]],
                  msgspec.Meta(max_length=len(REQUEST_COST_FIELDS))]
#: The most requests one message carries, and shared sets (a reader refuses more).
MAX_REQUESTS: Final = 1_000_000
#: The most requests one shared set holds (requests of one process in flight at once).
MAX_SET: Final = 65_536


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request and its response, with what its CUDA calls cost (events.v1, additive)."""

    request_id: RequestId
    tid: Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
    method: Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
    path: Annotated[str, msgspec.Meta(max_length=16_384)]
    route: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    #: 0: no response was seen.
    status: Annotated[int, msgspec.Meta(ge=0, le=999)]
    #: Wall clock ns: the read that brought its first byte; the write of its response's last.
    start_ns: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    end_ns: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    #: At most MAX_AMOUNT, so their sums fit what InfluxDB sums.
    bytes_in: Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
    bytes_out: Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
    #: The W3C traceparent the client sent: its trace id and the caller's span id.
    trace_id: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")] | None
    parent_span_id: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{16}$")] | None
    #: False when the response was not seen whole.
    complete: bool
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)]
    #: What its CUDA calls cost (REQUEST_COST_FIELDS): exact, plus its shares of shared calls.
    cost: Costs
    #: Where its gpu_ns came from: NVML per-process utilisation, the time its process had work
    #: queued, both (batches of each), or None (no GPU time).
    gpu_source: GpuSource | None = None
    #: The user functions whose sampled calls cost it most: (function, launches, GPU ns),
    #: the costliest first (code paths sampled; none: not sampled, or no sampled call).
    code_paths: Annotated[tuple[RequestPath, ...],
                          msgspec.Meta(max_length=MAX_REQUEST_PATHS)] = ()

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    def cost_of(self, name: str) -> float:
        return float(self.cost.get(name, 0.0))


@dataclass(frozen=True)
class EventAttribution:
    """Per event of a batch: its request (exact) or its shared set, as the wire carries them."""

    #: The request the event was made for (exact), else 0.
    request_id: npt.NDArray[np.uint64]
    #: 1 + the index in `sets` of the requests the event's cost is split over, else 0.
    request_set: npt.NDArray[np.int64]
    #: Each shared set: (request id, share) pairs whose shares sum to 1.
    sets: tuple[tuple[tuple[int, float], ...], ...] = ()

    def of(self, i: int) -> dict[str, Any]:
        """The fields event i carries in --output: `request_id`, or `requests`, or none."""
        rid = int(self.request_id[i])
        if rid:
            return {"request_id": rid}
        k = int(self.request_set[i])
        if k:
            return {"requests": [[r, share] for r, share in self.sets[k - 1]]}
        return {}

    def take(self, keep: npt.NDArray[np.bool_]) -> EventAttribution:
        """The attribution of the events `keep` selects (sets renumbered, unused ones gone)."""
        rid, rset = self.request_id[keep], self.request_set[keep]
        used = np.unique(rset[rset > 0])
        renumber = np.zeros(len(self.sets) + 1, dtype=np.int64)
        renumber[used] = np.arange(1, len(used) + 1)
        return EventAttribution(rid, renumber[rset], tuple(self.sets[k - 1] for k in used))

    @classmethod
    def concat(cls, parts: list[EventAttribution]) -> EventAttribution:
        sets: list[tuple[tuple[int, float], ...]] = []
        ids, rsets = [], []
        for part in parts:
            ids.append(part.request_id)
            rsets.append(np.where(part.request_set > 0, part.request_set + len(sets), 0))
            sets.extend(part.sets)
        return cls(np.concatenate(ids).astype(np.uint64), np.concatenate(rsets).astype(np.int64),
                   tuple(sets))


def _request_json(r: RequestRecord) -> dict[str, Any]:
    out = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    out["cost"] = {k: v for k, v in r.cost.items() if v}
    if not r.code_paths:
        del out["code_paths"]  # an older reader's message, byte for byte
    return out


def _costs_json(costs: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in costs.items() if v}


def host_key(host: str) -> bytes:
    return host.encode()


def process_key(host: str, pid: int, start_time: int) -> bytes:
    return f"{host}/{pid}/{start_time}".encode()


def encode_events(batch: EventBatch) -> bytes:
    events = batch.events
    if len(events) == 0 and not batch.requests and not len(batch.aggregates) and not batch.paths:
        raise ValueError("an events message holds at least one event, request, aggregate or"
                         " path")
    ts = events["ts_ns"].astype(np.int64)
    ts0 = batch.first_ts_ns
    columns: dict[str, npt.NDArray[Any]] = {}
    for name in COLUMNS:
        if name == "ts":
            column = ts - ts0
        elif name == "dim":
            column = np.ascontiguousarray(events["dim"]).reshape(-1)
        else:
            column = np.ascontiguousarray(events[_FIELD_OF.get(name, name)])
        if column.any():
            columns[name] = column.astype(np.int64)
    attr = batch.attribution
    if attr is not None:
        if len(attr.request_id) != len(events) or len(attr.request_set) != len(events):
            raise ValueError("an attribution has one entry per event")
        if attr.request_id.any():
            columns["request_id"] = attr.request_id.astype(np.int64)
        if attr.request_set.any():
            columns["request_set"] = attr.request_set.astype(np.int64)
    message: dict[str, Any] = {
        "schema": EVENTS_SCHEMA,
        "v": VERSION,
        "host": batch.host,
        "pid": batch.pid,
        "start_time": batch.start_time,
        "count": len(events),
        "ts0": ts0,
        "columns": columns,
    }
    if batch.kernels:
        message["kernels"] = {
            str(handle): [name.short, name.full] for handle, name in batch.kernels.items()
        }
    if attr is not None and attr.sets:
        message["request_sets"] = [[[rid, share] for rid, share in one] for one in attr.sets]
    if batch.requests:
        message["requests"] = [_request_json(r) for r in batch.requests]
    if any(batch.unattributed.values()):
        message["unattributed"] = _costs_json(batch.unattributed)
    if len(batch.aggregates):
        message["aggregates"] = _aggregates_json(batch.aggregates)
    if batch.paths:
        message["paths"] = [_path_json(p) for p in batch.paths]
    return orjson.dumps(message, option=orjson.OPT_SERIALIZE_NUMPY)


def _path_json(path: PathRecord) -> dict[str, Any]:
    out = {"ts_ns": path.ts_ns, "frames": path.frames, "values": _costs_json(path.values)}
    if path.route is not None:
        out["route"] = path.route
    return out


def _aggregates_json(aggregates: npt.NDArray[np.void]) -> dict[str, Any]:
    if (aggregates["count"] == 0).any():
        raise ValueError("an aggregate stands for at least one event")
    columns: dict[str, list[int]] = {}
    for name in AGGREGATE_COLUMNS:
        column = np.ascontiguousarray(aggregates[name])
        if column.any():
            columns[name] = column.reshape(-1).tolist()
    return {"count": len(aggregates), "columns": columns}


def _aggregates(value: Any) -> npt.NDArray[np.void]:
    """A message's "aggregates" (absent: none); WireError when they are not valid."""
    if value is None:
        return no_aggregates()
    if not isinstance(value, dict) or not isinstance(value.get("columns"), dict):
        raise WireError("aggregates is not an object of columns")
    count = value.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_AGGREGATES:
        raise WireError(f"aggregates: a count of 1 to {MAX_AGGREGATES}, not {count!r}")
    out = np.zeros(count, dtype=AGGREGATE_DTYPE)
    for name, values in value["columns"].items():
        if name not in AGGREGATE_COLUMNS:
            continue  # additive: a column a later producer adds
        expected = count * _DIMS if name == "dim" else count
        if not isinstance(values, list) or len(values) != expected:
            raise WireError(f"aggregates: column {name} does not have {expected} values")
        least = -(2**31) if name == "device" else 0
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= least
                   for v in values):
            raise WireError(f"aggregates: column {name} holds what is not a count")
        column = out[name]
        try:
            out[name] = np.asarray(values, dtype=column.dtype.base).reshape(column.shape)
        except OverflowError:
            raise WireError(f"aggregates: column {name} holds values beyond its width") from None
    if (out["count"] == 0).any():
        raise WireError("aggregates: an aggregate of no event")
    return out


def _load(value: bytes | None, schema: str) -> dict[str, Any]:
    if not value:
        raise WireError("empty message")
    try:
        message = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(message, dict) or message.get("schema") != schema:
        raise WireError(f"not a {schema} message")
    if message.get("v") != VERSION:
        raise WireError(f"{schema} version {message.get('v')!r}, this reader knows {VERSION}")
    return message


def decode_events(value: bytes | None) -> EventBatch:
    message = _load(value, EVENTS_SCHEMA)
    try:
        count = int(message["count"])
        host, pid = str(message["host"]), int(message["pid"])
        start_time = int(message["start_time"])
        ts0 = int(message["ts0"])
        columns = message["columns"]
        if not 1 <= len(host) <= MAX_HOST:
            raise WireError(f"host must be 1 to {MAX_HOST} characters, not {len(host)}")
        if not 0 <= pid <= 2**32 - 1 or not 0 <= start_time <= _I64 or not 0 <= ts0 <= _I64:
            raise WireError("pid, start_time or ts0 out of range")
        requests = _requests(message.get("requests", []))
        aggregates = _aggregates(message.get("aggregates"))
        aggregates["pid"] = pid
        paths = tuple(msgspec.convert(message.get("paths", []), _Paths))
        if (count < 0 or (count == 0 and not requests and not len(aggregates) and not paths)
                or not isinstance(columns, dict)):
            raise WireError("no events")
        if count > MAX_EVENTS:
            raise WireError(f"{count} events in one message, more than {MAX_EVENTS}")
        # The count is checked against what the message holds before anything is allocated
        # for it: every column has one value per event (dim six), and events that differ in
        # nothing but their count (no column at all) are no events a producer sends — a real
        # event has a thread id. So memory follows the message's size, not its claims.
        known = {name: values for name, values in columns.items() if name in COLUMNS}
        for name, values in known.items():
            expected = count * _DIMS if name == "dim" else count
            if not isinstance(values, list) or len(values) != expected:
                size = len(values) if isinstance(values, list) else type(values).__name__
                raise WireError(f"column {name} has {size} values, not {expected}")
        if count > 1 and not known:
            raise WireError(f"{count} events without a column")
        events = np.zeros(count, dtype=EVENT_DTYPE)
        events["pid"] = pid
        attribution = _attribution(count, columns, message.get("request_sets"))
        for name, values in known.items():
            column = np.asarray(values, dtype=np.int64)
            if column.ndim != 1:
                raise WireError(f"column {name} is not a list of integers")
            column = _in_range(name, column, ts0)
            if name == "dim":
                events["dim"] = column.reshape(count, _DIMS)
            elif name == "ts":
                events["ts_ns"] = column + ts0
            else:
                events[_FIELD_OF.get(name, name)] = column
        if "ts" not in columns:
            events["ts_ns"] = ts0
        kernels = _kernel_names(message.get("kernels", {}))
        unattributed = msgspec.convert(message.get("unattributed", {}), Costs)
    except msgspec.ValidationError as exc:
        raise WireError(f"malformed events message: {exc}") from None
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"malformed events message: {exc}") from None
    return EventBatch(
        host=host, pid=pid, start_time=start_time, events=events, kernels=kernels,
        attribution=attribution, requests=requests, unattributed=dict(unattributed),
        aggregates=aggregates, paths=paths,
    )


_Paths = Annotated[list[PathRecord], msgspec.Meta(max_length=MAX_PATHS)]


def _in_range(name: str, column: npt.NDArray[np.int64], ts0: int) -> npt.NDArray[np.int64]:
    """`column` checked against its field's range (WireError); amounts beyond MAX_AMOUNT (and
    uint64 beyond int64, negative on the wire) read as MAX_AMOUNT."""
    if not len(column):
        return column
    if name in _AMOUNTS:
        absurd = (column < 0) | (column > MAX_AMOUNT)
        return np.where(absurd, MAX_AMOUNT, column) if absurd.any() else column
    if name == "ts":
        low, high = 0 - ts0, _I64 - ts0  # event times within [0, 2^63)
    elif name in _COLUMN_RANGES:
        low, high = _COLUMN_RANGES[name]
    else:
        return column
    if int(column.min()) < low or int(column.max()) > high:
        raise WireError(f"column {name} has values out of range")
    return column


def _requests(value: Any) -> tuple[RequestRecord, ...]:
    if not isinstance(value, list) or len(value) > MAX_REQUESTS:
        raise WireError("requests is not a list of at most MAX_REQUESTS requests")
    try:
        return tuple(msgspec.convert(value, list[RequestRecord]))
    except msgspec.ValidationError as exc:
        raise WireError(f"malformed request: {exc}") from None


def _attribution(count: int, columns: dict[str, Any], sets: Any) -> EventAttribution | None:
    if not any(name in columns for name in ATTRIBUTION_COLUMNS) and sets is None:
        return None
    try:
        parsed = msgspec.convert(
            sets or [],
            Annotated[list[Annotated[list[tuple[RequestId, Share]],
                                     msgspec.Meta(min_length=1, max_length=MAX_SET)]],
                      msgspec.Meta(max_length=MAX_REQUESTS)],
        )
    except msgspec.ValidationError as exc:
        raise WireError(f"malformed request_sets: {exc}") from None
    out = {}
    for name in ATTRIBUTION_COLUMNS:
        column = np.asarray(columns.get(name, np.zeros(count)), dtype=np.int64)
        if column.shape != (count,):
            raise WireError(f"column {name} has {column.size} values, not {count}")
        out[name] = column
    rid, rset = out["request_id"], out["request_set"]
    if (rid < 0).any() or (rset < 0).any() or (rset > len(parsed)).any():
        raise WireError("an event points at a request set that is not there")
    if ((rid > 0) & (rset > 0)).any():
        raise WireError("an event is both exact and shared")
    for one in parsed:
        if abs(sum(share for _, share in one) - 1.0) > 1e-6:
            raise WireError("the shares of a request set do not sum to 1")
    return EventAttribution(rid.astype(np.uint64), rset,
                            tuple(tuple((int(r), float(x)) for r, x in one) for one in parsed))


def _kernel_names(names: Any) -> dict[int, KernelName]:
    if not isinstance(names, dict):
        raise WireError("kernels is not an object")
    out: dict[int, KernelName] = {}
    for handle, name in names.items():
        if (
            not isinstance(name, list)
            or len(name) != 2
            or not all(isinstance(part, str) and part for part in name)
        ):
            raise WireError(f"kernel {handle}: not a [short, full] pair of names")
        out[int(handle)] = KernelName(name[0], name[1])
    return out


# -- processes, metrics, NVML -----------------------------------------------------------------

#: The largest processes, metrics or nvml message a reader takes (the producer's
#: message.max.bytes; a process's cmdline is read up to 1 MiB).
MAX_RECORD_BYTES: Final = 8_000_000
_I64: Final = 2**63 - 1

#: Non-negative 64-bit integers: counts, times, byte sizes.
Count = Annotated[int, msgspec.Meta(ge=0, le=_I64)]
Pid = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
Host = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
#: The longest name, path or id a record holds (PATH_MAX is 4096; the producer clips what
#: comes from a process's environment to this).
MAX_TEXT: Final = 4096 * 4
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
ByPid = Annotated[Mapping[int, Count], msgspec.Meta(max_length=1 << 22)]  # pid_max


@dataclass(frozen=True)
class ProcessRecord:
    """Who a process is (processes.v1), read once from /proc while it is alive."""

    host: Host
    pid: Pid
    #: Clock ticks since boot (/proc/PID/stat field 22): with the pid, the process's key.
    start_time: Count
    started_at_ns: Count | None
    comm: Text | None
    cmdline: Annotated[tuple[str, ...], msgspec.Meta(max_length=1 << 20)]
    exe: Text | None
    container_id: Text | None
    pod_uid: Text | None
    pod: Text | None
    namespace: Text | None
    slurm_job_id: Text | None
    #: The job it belongs to: k8s:NAMESPACE/POD, slurm:ID or COMM:PID.
    job: Annotated[str, msgspec.Meta(min_length=1, max_length=2 * MAX_TEXT + 16)]
    #: The team its cost is rolled up under ($GPUFLIGHT_TEAM), additive: absent is None.
    team: Text | None = None
    #: Wall clock (ns) when the node agent found the process gone, after publishing its last
    #: events (additive: absent, from an older producer or while it lives, is None).
    exited_ns: Count | None = None

    @property
    def own_job(self) -> bool:
        """Whether the job is this process alone (COMM:PID): it ends when the process does."""
        return not self.pod and not self.slurm_job_id  # as identity.job_of has it


@dataclass(frozen=True)
class MetricsRecord:
    """The producer's counters (metrics.v1), since it started."""

    host: Host
    ts_ns: Count
    uptime_s: Annotated[float, msgspec.Meta(ge=0)]
    #: Events read from the ring buffer.
    captured: Count
    #: Events handed to librdkafka, and delivered to the broker.
    produced: Count
    published: Count
    #: Events lost in the kernel (ring buffer full), in all and by pid.
    dropped_kernel: Count
    dropped_kernel_by_pid: ByPid
    #: Events dropped beyond the bounded Kafka queue, in all and by pid.
    dropped_user: Count
    dropped_user_by_pid: ByPid
    #: Messages waiting in librdkafka's queue.
    queue_messages: Count
    #: Runtime library files probed.
    libraries_attached: Count
    # Added within v1, so optional:
    #: Driver library files probed.
    driver_libraries_attached: Count = 0
    #: Kernel-name records lost in the kernel.
    dropped_names: Count = 0
    #: Not lost: driver calls left out because a probed runtime made them (recorded once).
    forwarded_driver_calls: Count = 0
    #: HTTP requests answered (with the HTTP capture on); HTTP records lost in the kernel
    #: (ring full) and accepted connections not followed (table full): requests incomplete.
    requests: Count = 0
    http_records_lost: Count = 0
    http_connections_untracked: Count = 0
    #: Events an earlier agent on this host captured but never published nor counted, because
    #: it was killed (SIGKILL, OOM): reported by the next agent from the kernel's pinned tally
    #: (producer/publish/deadagents.py), in all and by pid; since this agent started.
    dropped_agent_died: Count = 0
    dropped_agent_died_by_pid: ByPid = field(default_factory=dict)
    #: Not lost: events the kernel counted under overload instead of recording them; they are
    #: in the events messages' "aggregates" (and so in every count), their details shed.
    events_aggregated: Count = 0


@dataclass(frozen=True)
class GpuProcessSample:
    """One process on one GPU; a figure NVML did not give for it is None."""

    pid: Pid
    #: SM and memory-controller utilization of this process in its latest NVML sample since the
    #: previous sample (None: NVML had no utilization sample for it, or cannot give them).
    sm_util_pct: Count | None
    mem_util_pct: Count | None
    #: GPU memory the process holds (None: not a compute process, or not reported).
    used_memory_bytes: Count | None


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment; every gauge the GPU or driver did not give is None."""

    #: NVML's device index (the order of nvidia-smi, not CUDA_VISIBLE_DEVICES').
    gpu: Annotated[int, msgspec.Meta(ge=0, le=4096)]
    uuid: Text | None
    name: Text | None
    utilization_gpu_pct: Count | None
    utilization_memory_pct: Count | None
    memory_used_bytes: Count | None
    memory_total_bytes: Count | None
    power_w: Annotated[float, msgspec.Meta(ge=0)] | None
    temperature_c: Annotated[int, msgspec.Meta(ge=-273, le=1000)] | None
    sm_clock_mhz: Count | None
    pcie_rx_bytes_per_s: Count | None
    pcie_tx_bytes_per_s: Count | None
    #: Compute processes and processes with utilization samples, by pid; None when NVML gives
    #: neither list for this GPU (empty: it gives them and there are none).
    processes: Annotated[tuple[GpuProcessSample, ...], msgspec.Meta(max_length=1 << 16)] | None


@dataclass(frozen=True)
class NvmlRecord:
    """Every GPU of a host at one moment (nvml.v1)."""

    host: Host
    ts_ns: Count
    gpus: Annotated[tuple[GpuSample, ...], msgspec.Meta(max_length=4096)]


_Record = TypeVar("_Record", ProcessRecord, MetricsRecord, NvmlRecord)


def _encode_record(schema: str, record: ProcessRecord | MetricsRecord | NvmlRecord) -> bytes:
    # "schema" and "v" first, then the fields in their order (nested dataclasses as objects,
    # pid keys as strings): byte for byte what the v1 producer has always written.
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    if fields.get("exited_ns", 0) is None:  # additive: a live process's record is as before
        del fields["exited_ns"]
    if fields.get("events_aggregated") == 0:  # additive: a record without overload as before
        del fields["events_aggregated"]
    return orjson.dumps({"schema": schema, "v": VERSION, **fields},
                        option=orjson.OPT_NON_STR_KEYS)


def _decode_record(value: bytes | None, schema: str, kind: type[_Record]) -> _Record:
    if value is not None and len(value) > MAX_RECORD_BYTES:
        raise WireError(f"{schema} message of {len(value)} bytes, more than {MAX_RECORD_BYTES}")
    message = _load(value, schema)
    del message["schema"], message["v"]
    try:
        return msgspec.convert(message, kind, str_keys=True)
    except msgspec.ValidationError as exc:
        raise WireError(f"malformed {schema} message: {exc}") from None


def encode_process(record: ProcessRecord) -> bytes:
    return _encode_record(PROCESS_SCHEMA, record)


def decode_process(value: bytes | None) -> ProcessRecord:
    return _decode_record(value, PROCESS_SCHEMA, ProcessRecord)


def encode_metrics(record: MetricsRecord) -> bytes:
    return _encode_record(METRICS_SCHEMA, record)


def decode_metrics(value: bytes | None) -> MetricsRecord:
    return _decode_record(value, METRICS_SCHEMA, MetricsRecord)


def encode_nvml(record: NvmlRecord) -> bytes:
    return _encode_record(NVML_SCHEMA, record)


def decode_nvml(value: bytes | None) -> NvmlRecord:
    return _decode_record(value, NVML_SCHEMA, NvmlRecord)


# -- topics ----------------------------------------------------------------------------------

def topic_configs(topics: Topics) -> dict[str, dict[str, str]]:
    return {
        topics.events: {"retention.ms": "-1"},  # kept for postmortem replay
        topics.processes: {"cleanup.policy": "compact"},
        topics.metrics: {"retention.ms": str(30 * 24 * 3600 * 1000)},
        topics.nvml: {"retention.ms": "-1"},
    }


def ensure_topics(
    admin: Any,
    wanted: Mapping[str, Mapping[str, str]],
    partitions: int,
    timeout_s: float = 10.0,
) -> bool:
    """Create the topics if missing; False if the broker could not be asked."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    # Replication: the broker's default.replication.factor.
    new = [NewTopic(name, partitions, -1, config=dict(config)) for name, config in wanted.items()]
    try:
        futures = admin.create_topics(new, request_timeout=timeout_s)
        for future in futures.values():
            try:
                future.result(timeout=timeout_s)
            except Exception as exc:
                error = exc.args[0] if exc.args else None
                if getattr(error, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    except Exception as exc:
        log.warning("cannot create Kafka topics yet (%s); retrying in the background", exc)
        return False
    return True
