"""Per-window aggregates of events, and the points they become: the stream app's pure math.

    agg = WindowAggregate(window_start_ns, host, job)
    for start, part in split_windows(batch.events, window_ns):   # a message may straddle two
        add_events(table[start, host, job], part)                # vectorised, in place
    merge(a, b)                                                  # partitions, workers
    points = to_points(agg, window_s, memory=ledger.close(agg))  # once the window is closed

A `WindowAggregate` is small whatever the window holds (counts, sums, two fixed 64-bucket
histograms, at most `max_kernels` kernel keys, at most MAX_PIDS pids), and round-trips through
plain dicts (`to_dict`/`from_dict`) for a Faust table and its changelog.

What is counted, per (window, host, job):

- launches by (layer, api): kernel launches and graph launches (`cudaGraphLaunch*` is its own
  api, so a panel can leave it out), and for graph launches the kernel nodes they ran where
  the graph was instantiated while observed (`graph_kernel_nodes`); launches made while their
  stream was captured into a graph (F_CAPTURED) ran nothing and count only as `captured`;
  kernels by name when the caller knows it (`kernel_names`), else
  "function@0x<host stub address>"; log2 histograms of grid blocks (x·y·z) and block threads
  (x·y·z), threads launched (Σ blocks·threads).
- copies by kind: count and bytes of every copy; `sync_*` for synchronous copies that completed
  (not async, a result of 0): their bytes and CPU-side duration, whence achieved bandwidth.
- memsets; allocations and frees that succeeded (a free of a null pointer is not one); free
  bytes are known only where the node saw the allocation (F_BYTES_KNOWN); the net change of
  live bytes and the highest point the running change reached within the window, which
  `MemoryLedger` turns into live and peak bytes across windows.
- syncs by scope: count and CPU-side duration (failed ones too: the CPU waited all the same).
- failed calls by api (a result other than 0), and the distinct pids seen.

Histogram buckets: bucket i holds values in [2^i, 2^(i+1)); 0 (an invalid launch) shares
bucket 0 with 1; values of 2^63 and beyond are all in bucket 63. `percentile` interpolates
log-linearly inside a bucket (values taken as spread evenly in log2 within it) and never
leaves the bucket: its error is under a factor 2, and for values all equal to a power of two
2^i the median reads 2^(i+0.5), about 1.41·2^i.

Kernel keys are bounded without losing associativity: when a window meets more than
`max_kernels` distinct keys, it keeps those with the smallest CRC-32 (ties by name) and folds
the rest into "other". Which keys are kept then depends only on the set of keys, never on the
order of events or how they were split, so `merge` stays exact; `to_points` reports the
`top` most launched of those kept (`top_kernels`) and folds the rest into "other" as well.

`merge(a, b)` is associative, and commutative except for the within-window memory peak, for
which b's events are taken to follow a's (exact for successive parts of one stream; for parts
that ran at the same time it may miss an overlap of their peaks). Aggregating a time-ordered
stream in parts and merging equals aggregating it at once.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from producer.counting import CopyStats
from producer.records import (
    API_NAMES,
    COPY_KINDS,
    F_ASYNC,
    F_BYTES_KNOWN,
    F_CAPTURED,
    F_HAS_RESULT,
    GRAPH_KERNEL_NODES,
    SYNC_SCOPES,
    EventType,
    layer_of,
)
from producer.wire import MetricsRecord, NvmlRecord
from streams import measurements as m
from streams.measurements import Fields, FieldValue, Point, Tags

#: Version of the `to_dict` layout (bump the Faust app version with it).
DICT_VERSION: Final = 1
DEFAULT_MAX_KERNELS: Final = 256
DEFAULT_TOP_KERNELS: Final = 20
#: Distinct pids remembered per window (the smallest ones when there are more).
MAX_PIDS: Final = 4096
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
_EXACT_LIMIT: Final = float(1 << 62)  # below it, uint64 products and sums cannot overflow
_FLOAT_EXACT: Final = 1 << 53

# Plain ints: an IntEnum member costs an attribute lookup per use.
_LAUNCH: Final = int(EventType.LAUNCH)
_GRAPH_LAUNCH: Final = int(EventType.GRAPH_LAUNCH)
_MEMCPY: Final = int(EventType.MEMCPY)
_MEMSET: Final = int(EventType.MEMSET)
_ALLOC: Final = int(EventType.ALLOC)
_FREE: Final = int(EventType.FREE)
_SYNC: Final = int(EventType.SYNC)

Events = npt.NDArray[np.void]
K = TypeVar("K")


def kernel_key(function: int, kernel_names: Mapping[int, str] | None = None) -> str:
    """A kernel's key: its name when known, else the address of its host stub."""
    name = kernel_names.get(function) if kernel_names else None
    return name if name else f"function@0x{function:x}"


def api_name(api: int) -> str:
    return API_NAMES.get(api, m.UNKNOWN_API)


def _zeros() -> list[int]:
    return [0] * _BUCKETS


@dataclass
class WindowAggregate:
    """The events of one (window start, host, job), summed. Mutable: `add_events` adds."""

    window_start_ns: int
    host: str
    job: str
    max_kernels: int = DEFAULT_MAX_KERNELS
    events: int = 0
    #: (layer, api name) → kernel and graph launches.
    launches: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (layer, api name) of graph launches → kernel nodes those launches ran (where known).
    graph_kernel_nodes: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Kernel launches recorded into a graph under stream capture (not run).
    captured: int = 0
    kernels: dict[str, int] = field(default_factory=dict)
    #: Launches of kernels folded away (beyond `max_kernels` distinct keys).
    kernels_other: int = 0
    grid_blocks: list[int] = field(default_factory=_zeros)
    block_threads: list[int] = field(default_factory=_zeros)
    threads_launched: int = 0
    #: Times of the window's first and last kernel launch (ns; 0: none yet).
    first_launch_ns: int = 0
    last_launch_ns: int = 0
    copies: dict[str, CopyStats] = field(default_factory=dict)
    memset_count: int = 0
    memset_bytes: int = 0
    alloc_count: int = 0
    alloc_bytes: int = 0
    free_count: int = 0
    free_bytes: int = 0
    #: Allocated minus freed (known) bytes over the window.
    memory_net_bytes: int = 0
    #: The highest the running net change reached within the window (≥ 0: the window's start).
    memory_peak_rise_bytes: int = 0
    sync_count: dict[str, int] = field(default_factory=dict)
    sync_ns: dict[str, int] = field(default_factory=dict)
    #: api name → calls that returned an error.
    errors: dict[str, int] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.max_kernels < 1:
            raise ValueError(f"max_kernels must be at least 1, not {self.max_kernels}")

    # -- views ---------------------------------------------------------------------------------

    @property
    def kernel_launches(self) -> int:
        return sum(self.kernels.values()) + self.kernels_other

    @property
    def all_launches(self) -> int:
        """Kernel and graph launches."""
        return sum(self.launches.values())

    @property
    def copy_sync_ns(self) -> int:
        """CPU time spent in synchronous copies that completed."""
        return sum(c.sync_ns for c in self.copies.values())

    @property
    def total_sync_ns(self) -> int:
        return sum(self.sync_ns.values())

    @property
    def host_device_bytes(self) -> int:
        return sum(c.bytes for k, c in self.copies.items() if k in HOST_DEVICE_KINDS)

    @property
    def processes(self) -> int:
        return len(self.pids)

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
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed window aggregate: {exc!r}") from None
        return agg


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
    n = len(events)
    if n == 0:
        return
    agg.events += n
    types = np.ascontiguousarray(events["type"])
    failed = ((events["flags"] & F_HAS_RESULT) != 0) & (events["result"] != 0)
    if failed.any():
        _add_counts(agg.errors, events["api"][failed], api_name)
    pid = events["pid"]
    lo, hi = int(pid.min()), int(pid.max())
    _add_pids(agg, [lo] if lo == hi else np.unique(pid).tolist())

    # take() on a structured array is an order of magnitude faster than a boolean index.
    is_launch = types == _LAUNCH
    captured = is_launch & ((events["flags"] & F_CAPTURED) != 0)
    if captured.any():
        agg.captured += int(np.count_nonzero(captured))
        is_launch &= ~captured
    kernels = events.take(np.flatnonzero(is_launch))
    graphs = events.take(np.flatnonzero(types == _GRAPH_LAUNCH))
    for launches in (kernels, graphs):
        if len(launches):
            apis, counts = _bincount(launches["api"])
            for a, c in zip(apis, counts, strict=True):
                key = (layer_of(a), api_name(a))
                agg.launches[key] = agg.launches.get(key, 0) + c
    if len(graphs):
        nodes = graphs["dim"][:, GRAPH_KERNEL_NODES].astype(np.int64)
        for a in np.unique(graphs["api"]).tolist():
            n = int(nodes[graphs["api"] == a].sum())
            if n:
                key = (layer_of(a), api_name(a))
                agg.graph_kernel_nodes[key] = agg.graph_kernel_nodes.get(key, 0) + n
    if len(kernels):
        _add_kernels(agg, kernels["handle"], kernel_names)
        _add_shapes(agg, kernels["dim"])
        ts = kernels["ts_ns"]
        first, last = int(ts.min()), int(ts.max())
        agg.first_launch_ns = min(agg.first_launch_ns, first) if agg.first_launch_ns else first
        agg.last_launch_ns = max(agg.last_launch_ns, last)
    copies = events.take(np.flatnonzero(types == _MEMCPY))
    if len(copies):
        _add_copies(agg, copies)
    memsets = events.take(np.flatnonzero(types == _MEMSET))
    if len(memsets):
        agg.memset_count += len(memsets)
        agg.memset_bytes += _exact_sum(memsets["bytes"])
    memory = events.take(np.flatnonzero((types == _ALLOC) | (types == _FREE)))
    if len(memory):
        _add_memory(agg, memory)
    syncs = events.take(np.flatnonzero(types == _SYNC))
    if len(syncs):
        _add_syncs(agg, syncs)


def _bincount(values: npt.NDArray[Any]) -> tuple[list[int], list[int]]:
    counts = np.bincount(values)
    present = np.flatnonzero(counts)
    return present.tolist(), counts[present].tolist()


def _add_counts(
    into: dict[str, int], values: npt.NDArray[Any], name: Callable[[int], str]
) -> None:
    for value, count in zip(*_bincount(values), strict=True):
        key = name(value)
        into[key] = into.get(key, 0) + count


def _add_pids(agg: WindowAggregate, pids: Iterable[int]) -> None:
    agg.pids.update(pids)
    if len(agg.pids) > MAX_PIDS:
        agg.pids = set(sorted(agg.pids)[:MAX_PIDS])


def _exact_sum(values: npt.NDArray[Any]) -> int:
    """Σ values as an exact int (uint64 when it cannot overflow, else Python ints)."""
    if values.size == 0:
        return 0
    if float(values.max()) * values.size < _EXACT_LIMIT:
        return int(values.sum(dtype=np.uint64))
    return sum(values.tolist())


def _add_kernels(
    agg: WindowAggregate, handles: npt.NDArray[np.uint64], names: Mapping[int, str] | None
) -> None:
    first, last = handles[0], handles[-1]
    if first == last and bool((handles == first).all()):
        functions, counts = [int(first)], [len(handles)]
    else:
        uniq, cnt = np.unique(handles, return_counts=True)
        functions, counts = uniq.tolist(), cnt.tolist()
    kernels = agg.kernels
    for function, count in zip(functions, counts, strict=True):
        key = kernel_key(function, names)
        kernels[key] = kernels.get(key, 0) + count
    if len(kernels) > agg.max_kernels:
        _fold_kernels(agg)


def _kernel_rank(key: str) -> tuple[int, str]:
    return zlib.crc32(key.encode()), key


def _fold_kernels(agg: WindowAggregate) -> None:
    kept = heapq.nsmallest(agg.max_kernels, agg.kernels, key=_kernel_rank)
    folded = sum(agg.kernels.values()) - sum(agg.kernels[k] for k in kept)
    agg.kernels = {k: agg.kernels[k] for k in kept}
    agg.kernels_other += folded


def _add_shapes(agg: WindowAggregate, dims: npt.NDArray[np.uint32]) -> None:
    d = dims.astype(np.uint64)  # contiguous (n, 6): grid x y z, block x y z
    top = [int(v) for v in d.max(axis=0).tolist()]
    grid_max, block_max = top[0] * top[1] * top[2], top[3] * top[4] * top[5]
    if grid_max * block_max * len(d) < _EXACT_LIMIT:  # no product nor sum can overflow
        blocks = d[:, 0] * d[:, 1] * d[:, 2]
        threads = d[:, 3] * d[:, 4] * d[:, 5]
        _add_histogram(agg.grid_blocks, _floor_log2(blocks))
        _add_histogram(agg.block_threads, _floor_log2(threads))
        agg.threads_launched += int((blocks * threads).sum(dtype=np.uint64))
        return
    # Products near or beyond 2^62 (invalid launches): exact in Python ints.
    for g0, g1, g2, b0, b1, b2 in d.tolist():
        nblocks, nthreads = g0 * g1 * g2, b0 * b1 * b2
        agg.grid_blocks[bucket_of(nblocks)] += 1
        agg.block_threads[bucket_of(nthreads)] += 1
        agg.threads_launched += nblocks * nthreads


def _floor_log2(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """floor(log2(v)) for v ≥ 1, 0 for v = 0, exactly (v < 2^62)."""
    exponent = np.frexp(values.astype(np.float64))[1].astype(np.int64)  # v = m·2^e, m in [½, 1)
    if int(values.max()) >= _FLOAT_EXACT:
        # The float may have rounded up to the next power of two.
        shift = np.maximum(exponent - 1, 0).astype(np.uint64)
        rounded_up = (values < np.left_shift(np.uint64(1), shift)) & (exponent > 0)
        exponent -= rounded_up.astype(np.int64)
    return np.maximum(exponent - 1, 0)


def _add_histogram(counts: list[int], buckets: npt.NDArray[np.int64]) -> None:
    added = np.bincount(buckets, minlength=_BUCKETS)
    for i in np.flatnonzero(added).tolist():
        counts[i] += int(added[i])


def _copy_kind(kind: int) -> str:
    return COPY_KINDS[kind] if kind < len(COPY_KINDS) else m.UNKNOWN_KIND


def _add_copies(agg: WindowAggregate, copies: Events) -> None:
    kinds = np.minimum(copies["dim"][:, 0], len(COPY_KINDS))
    flags = copies["flags"]
    nbytes = copies["bytes"]
    timed = ((flags & F_ASYNC) == 0) & ((flags & F_HAS_RESULT) != 0) & (copies["result"] == 0)
    durations = copies["duration_ns"]
    first = int(kinds[0])
    present = [first] if bool((kinds == first).all()) else np.unique(kinds).tolist()
    for kind in present:
        mine = kinds == kind if len(present) > 1 else np.ones(len(copies), dtype=bool)
        mine_timed = mine & timed
        totals = CopyStats(
            count=int(np.count_nonzero(mine)),
            bytes=_exact_sum(nbytes[mine]),
            sync_count=int(np.count_nonzero(mine_timed)),
            sync_bytes=_exact_sum(nbytes[mine_timed]),
            sync_ns=_exact_sum(durations[mine_timed]),
        )
        agg.copies.setdefault(_copy_kind(kind), CopyStats()).add(totals)


def _add_memory(agg: WindowAggregate, events: Events) -> None:
    events = events.take(np.argsort(events["ts_ns"], kind="stable"))
    flags = events["flags"]
    ok = ((flags & F_HAS_RESULT) != 0) & (events["result"] == 0)
    is_alloc = events["type"] == _ALLOC
    allocs = ok & is_alloc
    frees = ok & ~is_alloc & (events["handle"] != 0)
    known = frees & ((flags & F_BYTES_KNOWN) != 0)
    nbytes = events["bytes"]
    agg.alloc_count += int(np.count_nonzero(allocs))
    agg.free_count += int(np.count_nonzero(frees))
    alloc_bytes = _exact_sum(nbytes[allocs])
    free_bytes = _exact_sum(nbytes[known])
    agg.alloc_bytes += alloc_bytes
    agg.free_bytes += free_bytes
    changes = allocs | known
    if not changes.any():
        return
    if max(alloc_bytes, free_bytes) < _EXACT_LIMIT:
        delta = nbytes[changes].astype(np.int64)
        delta[~allocs[changes]] *= -1
        rise = max(int(np.cumsum(delta).max()), 0)
    else:
        level = rise = 0
        for size, up in zip(nbytes[changes].tolist(), allocs[changes].tolist(), strict=True):
            level += size if up else -size
            rise = max(rise, level)
    net = alloc_bytes - free_bytes
    agg.memory_peak_rise_bytes = max(agg.memory_peak_rise_bytes, agg.memory_net_bytes + rise)
    agg.memory_net_bytes += net


def _sync_scope(scope: int) -> str:
    return SYNC_SCOPES.get(scope, m.UNKNOWN_SCOPE)


def _add_syncs(agg: WindowAggregate, syncs: Events) -> None:
    scopes = syncs["dim"][:, 0]
    timed = (syncs["flags"] & F_HAS_RESULT) != 0
    durations = syncs["duration_ns"]
    for scope in np.unique(scopes).tolist():
        mine = scopes == scope
        name = _sync_scope(scope)
        agg.sync_count[name] = agg.sync_count.get(name, 0) + int(np.count_nonzero(mine))
        agg.sync_ns[name] = agg.sync_ns.get(name, 0) + _exact_sum(durations[mine & timed])


# -- merging ---------------------------------------------------------------------------------


def merge(a: WindowAggregate, b: WindowAggregate) -> WindowAggregate:
    """A new aggregate of a's events followed by b's (same window, host, job, max_kernels)."""
    key_a = (a.window_start_ns, a.host, a.job, a.max_kernels)
    key_b = (b.window_start_ns, b.host, b.job, b.max_kernels)
    if key_a != key_b:
        raise ValueError(f"cannot merge aggregates of {key_a} and {key_b}")
    out = WindowAggregate.from_dict(a.to_dict())
    out.events += b.events
    _merge_counts(out.launches, b.launches)
    _merge_counts(out.graph_kernel_nodes, b.graph_kernel_nodes)
    out.captured += b.captured
    _merge_counts(out.kernels, b.kernels)
    out.kernels_other += b.kernels_other
    if len(out.kernels) > out.max_kernels:
        _fold_kernels(out)
    out.grid_blocks = [x + y for x, y in zip(out.grid_blocks, b.grid_blocks, strict=True)]
    out.block_threads = [x + y for x, y in zip(out.block_threads, b.block_threads, strict=True)]
    out.threads_launched += b.threads_launched
    if b.first_launch_ns:
        out.first_launch_ns = (min(out.first_launch_ns, b.first_launch_ns)
                               if out.first_launch_ns else b.first_launch_ns)
        out.last_launch_ns = max(out.last_launch_ns, b.last_launch_ns)
    for kind, totals in b.copies.items():
        out.copies.setdefault(kind, CopyStats()).add(totals)
    out.memset_count += b.memset_count
    out.memset_bytes += b.memset_bytes
    out.alloc_count += b.alloc_count
    out.alloc_bytes += b.alloc_bytes
    out.free_count += b.free_count
    out.free_bytes += b.free_bytes
    out.memory_peak_rise_bytes = max(
        a.memory_peak_rise_bytes, a.memory_net_bytes + b.memory_peak_rise_bytes
    )
    out.memory_net_bytes += b.memory_net_bytes
    _merge_counts(out.sync_count, b.sync_count)
    _merge_counts(out.sync_ns, b.sync_ns)
    _merge_counts(out.errors, b.errors)
    _add_pids(out, b.pids)
    return out


def _merge_counts(into: dict[K, int], other: Mapping[K, int]) -> None:
    for key, n in other.items():
        into[key] = into.get(key, 0) + n


# -- percentiles -----------------------------------------------------------------------------


def bucket_of(value: int) -> int:
    """The log2 bucket of `value` (0 and 1 → 0; 2^63 and beyond → 63)."""
    if value < 0:
        raise ValueError(f"no bucket for {value}")
    return min(max(value.bit_length() - 1, 0), _BUCKETS - 1)


def percentile(counts: list[int], q: float) -> float | None:
    """The q-quantile (0 ≤ q ≤ 1) of a log2 histogram; None when it is empty.

    The bucket i holding rank q·n is found; the fraction f of that bucket's values below the
    rank gives 2^(i+f) (log-linear interpolation), kept within the bucket's integers
    [2^i, 2^(i+1) - 1].
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    below = 0
    for i, count in enumerate(counts):
        if count and below + count >= rank:
            fraction = (rank - below) / count
            return min(math.exp2(i + fraction), float((1 << (i + 1)) - 1))
        below += count
    raise AssertionError("unreachable: the rank is within the total")


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
    return points


def _value(value: float | None) -> float:
    if value is None:
        raise AssertionError("a histogram with launches is never empty")
    return value


def blocked_share(agg: WindowAggregate, window_s: float) -> float:
    """Mean share of the window each of the job's processes spent blocked in syncs and
    synchronous copies: (Σ sync ns + Σ sync-copy ns) / (window · processes).

    Several threads of one process blocked at once count twice, so it can exceed 1.
    """
    return (agg.total_sync_ns + agg.copy_sync_ns) / (window_s * 1e9 * max(agg.processes, 1))


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
        Fields.QUEUE_MESSAGES: record.queue_messages,
    }, record.ts_ns)


def lost_points(record: MetricsRecord, job_of_pid: Callable[[int], str]) -> list[Point]:
    """A metrics.v1 record → the events each job lost so far (its processes' drops summed),
    for the jobs that lost any."""
    by_job: dict[str, dict[str, int]] = {}
    for field_name, by_pid in ((Fields.DROPPED_KERNEL, record.dropped_kernel_by_pid),
                               (Fields.DROPPED_USER, record.dropped_user_by_pid)):
        for pid, count in by_pid.items():
            if count > 0:
                sums = by_job.setdefault(job_of_pid(pid),
                                         {Fields.DROPPED_KERNEL: 0, Fields.DROPPED_USER: 0})
                sums[field_name] += count
    return [Point(m.EVENTS_LOST.name, {Tags.HOST: record.host, Tags.JOB: job}, dict(sums),
                  record.ts_ns)
            for job, sums in sorted(by_job.items())]
