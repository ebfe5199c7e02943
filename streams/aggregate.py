"""Per-window aggregates of events, and the points they become: the stream app's pure math.

    agg = WindowAggregate(window_start_ns, host, job)
    for start, part in split_windows(batch.events, window_ns):   # a message may straddle two
        add_events(table[start, host, job], part)                # vectorised, in place
    for start, part in split_windows(batch.aggregates, window_ns):  # counted in the kernel
        add_aggregates(table[start, host, job], part)
    merge(a, b)                                                  # partitions, workers
    points = to_points(agg, window_s, memory=ledger.close(agg))  # once the window is closed

A `WindowAggregate` is the counts of one (window, host, job): what is counted, and how, is the
counting core's (`producer.contract.counting.Counts`, the same the trace summary is made of: one
rule
for captured launches, graph launches, failed calls and the CPU blocked on the GPU). It is
small whatever the window holds (counts, sums, two fixed 64-bucket histograms, at most
`max_kernels` kernel keys, at most MAX_PIDS pids), and round-trips through plain dicts
(`to_dict`/`from_dict`) for a Faust table and its changelog.

Kernels are keyed by name when the caller knows it (`kernel_names`), else
"function@0x<host stub address>". Sums are exact ints (uint64 where nothing can overflow, else
Python ints). Histogram buckets: bucket i holds values in [2^i, 2^(i+1)); 0 (an invalid
launch) shares bucket 0 with 1; values of 2^63 and beyond are all in bucket 63. `percentile`
interpolates log-linearly inside a bucket (values taken as spread evenly in log2 within it)
and never leaves the bucket: its error is under a factor 2, and for values all equal to a
power of two 2^i the median reads 2^(i+0.5), about 1.41·2^i.

Kernel keys are bounded without losing associativity: when a window meets more than
`max_kernels` distinct keys, it keeps those with the smallest CRC-32 (ties by name) and folds
the rest into "other". Which keys are kept then depends only on the set of keys, never on the
order of events or how they were split, so `merge` stays exact; `to_points` reports the
`top` most launched of those kept (`top_kernels`) and folds the rest into "other" as well.

`merge(a, b)` is associative, and commutative except for the within-window memory peak, for
which b's events are taken to follow a's (exact for successive parts of one stream; for parts
that ran at the same time it may miss an overlap of their peaks). Aggregating a time-ordered
stream in parts and merging equals aggregating it at once.

The CPU blocked on the GPU (syncs + synchronous copies) is written as `cpu_blocked`, its share
per process of the window: (Σ sync ns + Σ sync-copy ns) / (window · processes).

Per CUDA device (the calling thread's), `devices`: kernel launches, copies and bytes by kind,
syncs and the CPU blocked in them and in synchronous copies; summed over devices, the job's
totals (`device_fields_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.counting import (
    DEFAULT_MAX_KERNELS,
    MAX_PIDS,
    CopyStats,
    Counts,
    api_name,
    bucket_of,
    kernel_key,
    percentile,
)
from gpuflight.producer.contract.wire import MetricsRecord, NvmlRecord
from gpuflight.streams import measurements as m
from gpuflight.streams.measurements import LOST_FIELDS, Fields, FieldValue, Point, Tags

# The histogram and kernel-key helpers are the counting core's; the stream app's callers
# reach them here.
__all__ = [
    "DEFAULT_MAX_KERNELS", "DEFAULT_TOP_KERNELS", "MAX_PIDS", "MemoryLedger", "MemoryLevel",
    "StaleWindowError", "WindowAggregate", "add_aggregates", "add_events", "api_name",
    "blocked_share", "bucket_of",
    "device_fields_of",
    "gpu_points", "kernel_key", "lost_points", "merge", "percentile", "pipeline_point",
    "split_windows", "to_points", "top_kernels",
]

#: Version of the `to_dict` layout (bump the Faust app version with it).
DICT_VERSION: Final = 1
DEFAULT_TOP_KERNELS: Final = 20
#: Copy kinds the stream app distinguishes; kind values beyond COPY_KINDS are UNKNOWN_KIND.
COPY_KIND_NAMES: Final = m.COPY_KIND_VALUES
#: Copies whose bytes cross PCIe (or may: "default" is inferred from the pointers).
HOST_DEVICE_KINDS: Final[frozenset[str]] = frozenset({"H2D", "D2H", "default"})
PERCENTILES: Final[tuple[tuple[float, str, str], ...]] = (
    (0.50, Fields.P50_GRID_BLOCKS, Fields.P50_BLOCK_THREADS),
    (0.90, Fields.P90_GRID_BLOCKS, Fields.P90_BLOCK_THREADS),
    (0.99, Fields.P99_GRID_BLOCKS, Fields.P99_BLOCK_THREADS),
)

_BUCKETS: Final = m.HISTOGRAM_BUCKETS

Events = npt.NDArray[np.void]


@dataclass
class WindowAggregate(Counts):
    """The events of one (window start, host, job), counted by the counting core
    (`producer.contract.counting.Counts`: its fields and views). Mutable: `add_events` adds."""

    window_start_ns: int
    host: str
    job: str
    max_kernels: int = DEFAULT_MAX_KERNELS

    def __post_init__(self) -> None:
        if self.max_kernels < 1:
            raise ValueError(f"max_kernels must be at least 1, not {self.max_kernels}")

    # -- views ---------------------------------------------------------------------------------

    @property
    def host_device_bytes(self) -> int:
        return sum(c.bytes for k, c in self.copies.items() if k in HOST_DEVICE_KINDS)

    # -- plain dicts ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only; `from_dict` is the inverse."""
        return {
            "v": DICT_VERSION,
            "window_start_ns": self.window_start_ns,
            "host": self.host,
            "job": self.job,
            "max_kernels": self.max_kernels,
            "events": self.events,
            "launches": [[layer, api, n] for (layer, api), n in sorted(self.launches.items())],
            "graph_kernel_nodes": [
                [layer, api, n] for (layer, api), n in sorted(self.graph_kernel_nodes.items())
            ],
            "captured": self.captured,
            "kernels": dict(sorted(self.kernels.items())),
            "kernels_other": self.kernels_other,
            "device_launches": [[d, n] for d, n in sorted(self.device_launches.items())],
            "device_copies": [[d, kind, *c.as_list()]
                              for (d, kind), c in sorted(self.device_copies.items())],
            "device_syncs": [[d, n, self.device_sync_ns.get(d, 0)]
                             for d, n in sorted(self.device_sync_count.items())],
            "grid_blocks": _trim(self.grid_blocks),
            "block_threads": _trim(self.block_threads),
            "threads_launched": self.threads_launched,
            "launch_span": [self.first_launch_ns, self.last_launch_ns],
            "copies": {k: c.as_list() for k, c in sorted(self.copies.items())},
            "memset": [self.memset_count, self.memset_bytes],
            "memory": [
                self.alloc_count,
                self.alloc_bytes,
                self.free_count,
                self.free_bytes,
                self.memory_net_bytes,
                self.memory_peak_rise_bytes,
            ],
            "syncs": {s: [n, self.sync_ns.get(s, 0)] for s, n in sorted(self.sync_count.items())},
            "errors": dict(sorted(self.errors.items())),
            "pids": sorted(self.pids),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowAggregate:
        """Decode `to_dict()` output; ValueError when it is not one (of this version)."""
        if data.get("v") != DICT_VERSION:
            raise ValueError(f"window aggregate version {data.get('v')!r}, expected {DICT_VERSION}")
        try:
            agg = cls(
                window_start_ns=int(data["window_start_ns"]),
                host=str(data["host"]),
                job=str(data["job"]),
                max_kernels=int(data["max_kernels"]),
                events=int(data["events"]),
                launches={(str(lay), str(api)): int(n) for lay, api, n in data["launches"]},
                graph_kernel_nodes={
                    (str(lay), str(api)): int(n)
                    for lay, api, n in data.get("graph_kernel_nodes", ())
                },
                captured=int(data.get("captured", 0)),
                kernels={str(k): int(n) for k, n in data["kernels"].items()},
                kernels_other=int(data["kernels_other"]),
                device_launches={
                    int(d): int(n) for d, n in data.get("device_launches", ())
                },
                grid_blocks=_untrim(data["grid_blocks"]),
                block_threads=_untrim(data["block_threads"]),
                threads_launched=int(data["threads_launched"]),
                first_launch_ns=int(data.get("launch_span", (0, 0))[0]),
                last_launch_ns=int(data.get("launch_span", (0, 0))[1]),
                copies={
                    str(k): CopyStats(*(int(x) for x in _exactly(v, 5)))
                    for k, v in data["copies"].items()
                },
                errors={str(k): int(n) for k, n in data["errors"].items()},
                pids={int(p) for p in data["pids"]},
            )
            agg.memset_count, agg.memset_bytes = (int(x) for x in _exactly(data["memset"], 2))
            (
                agg.alloc_count,
                agg.alloc_bytes,
                agg.free_count,
                agg.free_bytes,
                agg.memory_net_bytes,
                agg.memory_peak_rise_bytes,
            ) = (int(x) for x in _exactly(data["memory"], 6))
            for scope, pair in data["syncs"].items():
                count, ns = _exactly(pair, 2)
                agg.sync_count[str(scope)] = int(count)
                agg.sync_ns[str(scope)] = int(ns)
            _devices_from_dict(agg, data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed window aggregate: {exc!r}") from None
        return agg


def _devices_from_dict(agg: WindowAggregate, data: Mapping[str, Any]) -> None:
    """The per-device counts of `to_dict` output. An aggregate of a worker before a part of
    them was kept (a window open across the upgrade) has that part all on device 0, as the
    wire has the events of a producer before devices (producer/contract/wire.py)."""
    if "device_launches" not in data and agg.kernel_launches:
        agg.device_launches = {0: agg.kernel_launches}
    if "device_copies" in data:
        agg.device_copies = {
            (int(row[0]), str(row[1])): CopyStats(*(int(x) for x in _exactly(row[2:], 5)))
            for row in data["device_copies"]
        }
    else:
        agg.device_copies = {(0, kind): CopyStats(*c.as_list())
                             for kind, c in agg.copies.items()}
    if "device_syncs" in data:
        for d, n, ns in (_exactly(row, 3) for row in data["device_syncs"]):
            agg.device_sync_count[int(d)] = int(n)
            agg.device_sync_ns[int(d)] = int(ns)
    elif agg.sync_count:
        agg.device_sync_count = {0: sum(agg.sync_count.values())}
        agg.device_sync_ns = {0: agg.total_sync_ns}


def _trim(counts: list[int]) -> list[int]:
    end = len(counts)
    while end and counts[end - 1] == 0:
        end -= 1
    return counts[:end]


def _untrim(values: Iterable[Any]) -> list[int]:
    counts = [int(v) for v in values]
    if len(counts) > _BUCKETS:
        raise ValueError(f"{len(counts)} histogram buckets, at most {_BUCKETS}")
    return counts + [0] * (_BUCKETS - len(counts))


def _exactly(values: Any, n: int) -> list[Any]:
    items = list(values)
    if len(items) != n:
        raise ValueError(f"{len(items)} values where {n} belong")
    return items


# -- adding events ---------------------------------------------------------------------------


def split_windows(events: Events, window_ns: int) -> list[tuple[int, Events]]:
    """The events of each window they fall in, as (window start ns, events), in time order.

    A window starts at a multiple of `window_ns` (epoch-aligned, as the Faust windows are).
    Aggregates (records.AGGREGATE_DTYPE) are split by their first event's time: the kernel
    counts each in a wall-clock slot of records.AGG_SLOT_NS (100 ms), so with windows of whole
    100 ms (every window gpuflight is given) all its events are in that one window.
    """
    if window_ns <= 0:
        raise ValueError(f"window_ns must be positive, not {window_ns}")
    if len(events) == 0:
        return []
    index = events["ts_ns"] // np.uint64(window_ns)
    first, last = int(index.min()), int(index.max())
    if first == last:
        return [(first * window_ns, events)]
    order = np.argsort(index, kind="stable")
    windows, starts = np.unique(index[order], return_index=True)
    bounds = [*starts.tolist(), len(events)]
    return [
        (int(w) * window_ns, events.take(order[bounds[i] : bounds[i + 1]]))
        for i, w in enumerate(windows.tolist())
    ]


def add_events(
    agg: WindowAggregate, events: Events, kernel_names: Mapping[int, str] | None = None
) -> None:
    """Add a batch of enriched records (records.EVENT_DTYPE) to `agg`, in place.

    The events are taken to follow those already added (for the memory peak) and to belong to
    agg's window (see `split_windows`). `kernel_names` maps a launch's host-stub address
    (`handle`) to the kernel's name, for the batch's process.
    """
    agg.add(events, kernel_names)


def add_aggregates(
    agg: WindowAggregate, aggregates: Events, kernel_names: Mapping[int, str] | None = None
) -> None:
    """Add aggregates (records.AGGREGATE_DTYPE: events the kernel counted under overload
    instead of recording them) of agg's window to `agg`, in place: each counts as its events
    do (producer.contract.counting.Counts.add_aggregates)."""
    agg.add_aggregates(aggregates, kernel_names)


# -- merging ---------------------------------------------------------------------------------


def merge(a: WindowAggregate, b: WindowAggregate) -> WindowAggregate:
    """A new aggregate of a's events followed by b's (same window, host, job, max_kernels)."""
    key_a = (a.window_start_ns, a.host, a.job, a.max_kernels)
    key_b = (b.window_start_ns, b.host, b.job, b.max_kernels)
    if key_a != key_b:
        raise ValueError(f"cannot merge aggregates of {key_a} and {key_b}")
    out = WindowAggregate.from_dict(a.to_dict())
    out.merge_from(b)
    return out


# -- points ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryLevel:
    """Live bytes of a job at the end of a window, and the most it held within it."""

    live_bytes: int
    peak_live_bytes: int


def top_kernels(agg: WindowAggregate, top: int = DEFAULT_TOP_KERNELS) -> list[tuple[str, int]]:
    """The `top` most launched kernels (ties by name), then ("other", the rest) if any."""
    ranked = sorted(agg.kernels.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ranked[:top]
    rest = agg.kernels_other + sum(n for _, n in ranked[top:])
    return [*shown, (m.OTHER_KERNEL, rest)] if rest else shown


def to_points(
    agg: WindowAggregate,
    window_s: float,
    *,
    memory: MemoryLevel | None = None,
    top: int = DEFAULT_TOP_KERNELS,
) -> list[Point]:
    """The window's points (time: the window start). Rates divide by `window_s`.

    `memory` (from `MemoryLedger.close`) adds live and peak bytes to the memory point, which is
    written when the window had allocations or frees, or a level is given.
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, not {window_s}")
    t = agg.window_start_ns
    job = {Tags.HOST: agg.host, Tags.JOB: agg.job}
    points: list[Point] = []

    def add(spec: m.Measurement, tags: Mapping[str, str], fields: Mapping[str, FieldValue]) -> None:
        points.append(Point(spec.name, {**job, **tags}, dict(fields), t))

    for (layer, api), n in sorted(agg.launches.items()):
        launch_fields: dict[str, int | float] = {Fields.COUNT: n, Fields.RATE_PER_S: n / window_s}
        nodes = agg.graph_kernel_nodes.get((layer, api))
        if nodes:
            launch_fields[Fields.GRAPH_KERNEL_NODES] = nodes
        add(m.LAUNCHES, {Tags.LAYER: layer, Tags.API: api}, launch_fields)
    for kernel, n in top_kernels(agg, top):
        add(m.KERNELS, {Tags.KERNEL: kernel}, {Fields.COUNT: n})
    for spec, counts in ((m.GRID_BLOCKS, agg.grid_blocks), (m.BLOCK_THREADS, agg.block_threads)):
        for i, n in enumerate(counts):
            if n:
                add(spec, {Tags.BUCKET: m.bucket_label(i)}, {Fields.COUNT: n})
    launches = agg.kernel_launches
    if launches or agg.captured:
        shape: dict[str, int | float] = {
            Fields.LAUNCHES: launches,
            Fields.THREADS_PER_S: agg.threads_launched / window_s,
        }
        if launches:
            # When in the window the job launched first and last (a job's first and last
            # windows are partly idle: their rates read low, unless one knows this).
            shape[Fields.FIRST_LAUNCH_OFFSET_NS] = agg.first_launch_ns - t
            shape[Fields.LAST_LAUNCH_OFFSET_NS] = agg.last_launch_ns - t
        if agg.captured:
            shape[Fields.CAPTURED_LAUNCHES] = agg.captured
        if launches:
            for q, grid_field, block_field in PERCENTILES:
                shape[grid_field] = _value(percentile(agg.grid_blocks, q))
                shape[block_field] = _value(percentile(agg.block_threads, q))
        add(m.LAUNCH_SHAPE, {}, shape)
    for kind, c in sorted(agg.copies.items()):
        fields: dict[str, int | float] = {
            Fields.COUNT: c.count,
            Fields.BYTES: c.bytes,
            Fields.BYTES_PER_S: c.bytes / window_s,
            Fields.SYNC_COUNT: c.sync_count,
            Fields.SYNC_BYTES: c.sync_bytes,
            Fields.SYNC_NS: c.sync_ns,
        }
        bandwidth = c.sync_bandwidth
        if bandwidth is not None:
            fields[Fields.BANDWIDTH_BYTES_PER_S] = bandwidth
        add(m.COPIES, {Tags.KIND: kind}, fields)
    if agg.memset_count:
        add(m.MEMSET, {}, {Fields.COUNT: agg.memset_count, Fields.BYTES: agg.memset_bytes})
    if agg.alloc_count or agg.free_count or memory is not None:
        mem: dict[str, int | float] = {
            Fields.ALLOC_COUNT: agg.alloc_count,
            Fields.ALLOC_BYTES: agg.alloc_bytes,
            Fields.FREE_COUNT: agg.free_count,
            Fields.FREE_BYTES: agg.free_bytes,
        }
        if memory is not None:
            mem[Fields.LIVE_BYTES] = memory.live_bytes
            mem[Fields.PEAK_LIVE_BYTES] = memory.peak_live_bytes
        add(m.MEMORY, {}, mem)
    for scope, n in sorted(agg.sync_count.items()):
        add(m.SYNCS, {Tags.SCOPE: scope}, {Fields.COUNT: n, Fields.SYNC_NS: agg.sync_ns[scope]})
    if agg.sync_count or agg.copies:
        add(m.CPU_BLOCKED, {}, {
            Fields.SYNC_NS: agg.total_sync_ns,
            Fields.COPY_NS: agg.copy_sync_ns,
            Fields.BLOCKED_SHARE: blocked_share(agg, window_s),
            Fields.PROCESSES: agg.processes,
        })
    for api, n in sorted(agg.errors.items()):
        add(m.ERRORS, {Tags.API: api}, {Fields.COUNT: n})
    for label, device_fields in device_fields_of(agg, window_s).items():
        add(m.DEVICES, {Tags.DEVICE: label}, device_fields)
    return points


def device_fields_of(agg: WindowAggregate, window_s: float) -> dict[str, dict[str, FieldValue]]:
    """`devices` fields by device tag (`measurements.device_label`; devices beyond its range
    summed into one), for the devices that launched, copied or synced in the window. The bytes
    of a copy kind are there when the device had copies of that kind."""
    sums: dict[str, dict[str, int]] = {}
    for device in agg.devices:
        label = m.device_label(device)
        into = sums.setdefault(label, dict.fromkeys(
            (Fields.LAUNCHES, Fields.COPIES, Fields.BYTES, Fields.SYNCS, Fields.SYNC_NS,
             Fields.COPY_NS), 0))
        into[Fields.LAUNCHES] += agg.device_launches.get(device, 0)
        for kind, c in agg.device_copy_stats(device).items():
            into[Fields.COPIES] += c.count
            into[Fields.BYTES] += c.bytes
            into[Fields.COPY_NS] += c.sync_ns
            by_kind = m.BYTES_OF_KIND[kind if kind in m.BYTES_OF_KIND else m.UNKNOWN_KIND]
            into[by_kind] = into.get(by_kind, 0) + c.bytes
        into[Fields.SYNCS] += agg.device_sync_count.get(device, 0)
        into[Fields.SYNC_NS] += agg.device_sync_ns.get(device, 0)
    return {label: {**into, Fields.RATE_PER_S: into[Fields.LAUNCHES] / window_s}
            for label, into in sums.items()}


def _value(value: float | None) -> float:
    if value is None:
        raise AssertionError("a histogram with launches is never empty")
    return value


def blocked_share(agg: WindowAggregate, window_s: float) -> float:
    """The CPU blocked on the GPU as a share per process of the window: the mean share of the
    window each of the job's processes spent in syncs and synchronous copies,
    (Σ sync ns + Σ sync-copy ns) / (window · processes).

    Several threads of one process blocked at once count twice, so it can exceed 1.
    """
    return agg.blocked_ns / (window_s * 1e9 * max(agg.processes, 1))


# -- memory across windows -------------------------------------------------------------------


class StaleWindowError(ValueError):
    """A window older than the last one the ledger closed for the same job."""


@dataclass
class _Level:
    window_start_ns: int
    live_before: int
    live_after: int
    peak: int


class MemoryLedger:
    """Live bytes per (host, job), carried from window to window.

    `close(agg)` for each job's windows in time order gives the live bytes at the window's end
    and the peak within it. Closing the latest window again recomputes it (a replay after a
    restart); an older one is StaleWindowError. Live bytes never go below 0 (memory allocated
    before the stream app started, freed since, would otherwise drive it negative).

    Processes that exit release their memory without frees: `forget` a job whose processes
    are gone (or `expire` those idle for long), or its last level stays.
    """

    def __init__(self) -> None:
        self._levels: dict[tuple[str, str], _Level] = {}

    def close(self, agg: WindowAggregate) -> MemoryLevel:
        key = (agg.host, agg.job)
        last = self._levels.get(key)
        if last is None:
            before = 0
        elif agg.window_start_ns == last.window_start_ns:
            before = last.live_before
        elif agg.window_start_ns > last.window_start_ns:
            before = last.live_after
        else:
            raise StaleWindowError(
                f"window {agg.window_start_ns} of {key} is older than the last closed,"
                f" {last.window_start_ns}"
            )
        after = max(before + agg.memory_net_bytes, 0)
        peak = max(before + agg.memory_peak_rise_bytes, after)
        self._levels[key] = _Level(agg.window_start_ns, before, after, peak)
        return MemoryLevel(live_bytes=after, peak_live_bytes=peak)

    def live_bytes(self, host: str, job: str) -> int | None:
        level = self._levels.get((host, job))
        return None if level is None else level.live_after

    def forget(self, host: str, job: str) -> None:
        self._levels.pop((host, job), None)

    def expire(self, older_than_ns: int) -> list[tuple[str, str]]:
        """Forget the jobs whose last closed window started before `older_than_ns`."""
        gone = [k for k, v in self._levels.items() if v.window_start_ns < older_than_ns]
        for key in gone:
            del self._levels[key]
        return gone

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": DICT_VERSION,
            "jobs": [
                [host, job, v.window_start_ns, v.live_before, v.live_after, v.peak]
                for (host, job), v in sorted(self._levels.items())
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryLedger:
        if data.get("v") != DICT_VERSION:
            raise ValueError(f"memory ledger version {data.get('v')!r}, expected {DICT_VERSION}")
        ledger = cls()
        try:
            for row in data["jobs"]:
                host, job, start, before, after, peak = _exactly(row, 6)
                ledger._levels[(str(host), str(job))] = _Level(
                    int(start), int(before), int(after), int(peak)
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed memory ledger: {exc!r}") from None
        return ledger


# -- the other topics ------------------------------------------------------------------------

#: `gpu_process` job of a process the stream app has no identity for.
UNKNOWN_JOB: Final = "unknown"



def gpu_points(record: NvmlRecord, job_of_pid: Callable[[int], str | None]) -> list[Point]:
    """An nvml.v1 record → gpu points, and gpu_process points summed per (gpu, job) (several
    processes of a job share one point).

    Gauges NVML did not give are left out; a GPU without any is not written.
    """
    points: list[Point] = []
    for gpu in record.gpus:
        tags = {Tags.HOST: record.host, Tags.GPU: str(gpu.gpu)}
        gauges: dict[str, int | float | None] = {
            Fields.UTILIZATION_GPU_PCT: gpu.utilization_gpu_pct,
            Fields.UTILIZATION_MEMORY_PCT: gpu.utilization_memory_pct,
            Fields.MEMORY_USED_BYTES: gpu.memory_used_bytes,
            Fields.MEMORY_TOTAL_BYTES: gpu.memory_total_bytes,
            Fields.POWER_W: gpu.power_w,
            Fields.TEMPERATURE_C: gpu.temperature_c,
            Fields.SM_CLOCK_MHZ: gpu.sm_clock_mhz,
            Fields.PCIE_RX_BYTES_PER_S: gpu.pcie_rx_bytes_per_s,
            Fields.PCIE_TX_BYTES_PER_S: gpu.pcie_tx_bytes_per_s,
        }
        fields = {name: m.GPU.field(name).type(value)
                  for name, value in gauges.items() if value is not None}
        if fields:
            points.append(Point(m.GPU.name, tags, fields, record.ts_ns))
        jobs: dict[str, dict[str, int]] = {}
        for proc in gpu.processes or ():
            job = job_of_pid(proc.pid) or UNKNOWN_JOB
            sums = jobs.setdefault(job, {Fields.PROCESSES: 0})
            sums[Fields.PROCESSES] += 1
            for name, value in ((Fields.SM_UTIL_PCT, proc.sm_util_pct),
                                (Fields.MEM_UTIL_PCT, proc.mem_util_pct),
                                (Fields.USED_MEMORY_BYTES, proc.used_memory_bytes)):
                if value is not None:
                    sums[name] = sums.get(name, 0) + value
        for job, sums in sorted(jobs.items()):
            points.append(Point(m.GPU_PROCESS.name, {**tags, Tags.JOB: job}, dict(sums),
                                record.ts_ns))
    return points


def pipeline_point(record: MetricsRecord) -> Point:
    """A metrics.v1 record → the producer's counters."""
    return Point(m.PIPELINE.name, {Tags.HOST: record.host}, {
        Fields.CAPTURED: record.captured,
        Fields.PRODUCED: record.produced,
        Fields.PUBLISHED: record.published,
        Fields.DROPPED_KERNEL: record.dropped_kernel,
        Fields.DROPPED_USER: record.dropped_user,
        Fields.DROPPED_AGENT_DIED: record.dropped_agent_died,
        Fields.QUEUE_MESSAGES: record.queue_messages,
        Fields.REQUESTS: record.requests,
        Fields.HTTP_RECORDS_LOST: record.http_records_lost,
    }, record.ts_ns)


def lost_points(record: MetricsRecord, job_of_pid: Callable[[int], str]) -> list[Point]:
    """A metrics.v1 record → the events each job lost so far (its processes' drops summed),
    for the jobs that lost any."""
    by_job: dict[str, dict[str, int]] = {}
    for field_name, by_pid in ((Fields.DROPPED_KERNEL, record.dropped_kernel_by_pid),
                               (Fields.DROPPED_USER, record.dropped_user_by_pid),
                               (Fields.DROPPED_AGENT_DIED, record.dropped_agent_died_by_pid)):
        for pid, count in by_pid.items():
            if count > 0:
                sums = by_job.setdefault(job_of_pid(pid), dict.fromkeys(LOST_FIELDS, 0))
                sums[field_name] += count
    return [Point(m.EVENTS_LOST.name, {Tags.HOST: record.host, Tags.JOB: job}, dict(sums),
                  record.ts_ns)
            for job, sums in sorted(by_job.items())]
