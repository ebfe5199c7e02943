"""The one counting core: what the trace summary (`gpuflight trace`) and the stream windows
(`gpuflight streams` → InfluxDB → `gpuflight report`, Grafana) count of the events, and how.
A contract module: streams imports it; it imports only producer.contract.abi (and numpy), no
Faust, and runs without root or services.

    counts = Counts()
    counts.add(events, kernel_names)   # a batch of enriched records.EVENT_DTYPE, vectorised
    counts.add_aggregates(aggregates)  # events the kernel counted under overload, not recorded
    counts.merge_from(later)           # later's events taken to follow ours

`producer.decode.summary.Summary` (the trace) and `streams.aggregate.WindowAggregate` (a window of
one job) are views of a `Counts`; neither counts anything itself.

What is counted (the one rule; docs/commands.md "What is counted" says the same):

- **Kernel launches** are launches that ran. A launch made while its stream was being captured
  into a graph (F_CAPTURED) recorded a graph node and ran nothing: it counts only as
  `captured`, never as a kernel launch, a kernel, a shape or threads launched. Kernel launches
  are also counted per CUDA device (`device_launches`: the calling thread's device, as the
  probes tracked it; bpf/cudart.bpf.c).
- **Per device**, by the same rule: kernel launches (`device_launches`), copies by kind
  (`device_copies`) and syncs with their CPU time (`device_sync_count`, `device_sync_ns`), each
  on the device current on the calling thread when it was called (gf_event.device). A copy
  between two devices (a peer copy) counts on the caller's device only, once; a sync on a
  stream or event of another device counts on the caller's. Events of a producer that did not
  know devices come as device 0 (producer/contract/wire.py), so summed over devices each equals its
  total.
- **Graph launches** (cudaGraphLaunch*, cuGraphLaunch*) count in `launches` under their own api
  (so `graph_launches` = all launches - kernel launches) and, where the graph exec was
  instantiated while observed, their kernel nodes count as kernels run
  (`graph_kernel_nodes`; 0 where unknown, so `kernels_run` is then a lower bound). The grid
  and block of graph nodes are not seen: they are in no histogram.
- **A failed call** (a result was seen and is not 0) counts as a failed call of its api
  (`errors`) and as nothing else: a failed allocation is not an allocation, a failed free not
  a free, a failed synchronous copy not a copy (no count, bytes or time). The one exception is
  a failed sync: it still counts as a sync, with its CPU time, as the CPU waited all the same
  (cudaStreamSynchronize reports a kernel's fault after waiting for the kernel).
- **A call whose result is not seen** counts as done: kernel launches and graph launches
  (their probes have no return), async copies and memsets. A launch that fails
  asynchronously counts as launched; its error comes back as a failed call of a later sync or
  synchronous copy.
- **Copies** by kind (`CopyStats`): count and bytes of every copy not known to have failed;
  `sync_*` for synchronous copies that completed with a result of 0: their bytes and CPU-side
  duration, whence achieved bandwidth. Memsets: count and bytes.
- **Memory**: allocations that succeeded; frees that succeeded and were not of a null pointer,
  their bytes known only where the node saw the allocation (F_BYTES_KNOWN);
  `memory_net_bytes` = allocated - freed (known) bytes, and `memory_peak_rise_bytes` the
  highest the running net change reached (≥ 0), in time order.
- **Syncs** by scope: count and CPU-side duration. Distinct pids (at most `max_pids`, the
  smallest ones).
- **Aggregates** (`add_aggregates`): under overload the kernel sheds the details of events and
  counts them per process, api, kernel, shape, kind and device instead (records.AGGREGATE_DTYPE);
  each counts as the events it stands for, by the rules above, so every figure stays exact.
  What an aggregate cannot say: a launch in it counts as run (never as captured), a free in it
  has no known bytes, and its allocations are taken to come before its frees (memory peak).

**CPU blocked on the GPU** (`blocked_ns`) is the CPU time spent in syncs (`in syncs`,
`total_sync_ns`) plus in synchronous copies that completed (`in synchronous copies`,
`copy_sync_ns`), summed over threads (two threads waiting at once count twice). Its share is
taken over what each view knows: the wall time of the traced command (trace summary, the
demo), window · processes (stream windows, InfluxDB `cpu_blocked.blocked_share`, Grafana),
the job's active time (`gpuflight report`/`compare`).

Exactness: every sum is an exact int (uint64 where no sum or product can overflow, else
Python ints). Histogram buckets: bucket i holds values in [2^i, 2^(i+1)); 0 (an invalid
launch) shares bucket 0 with 1; 2^63 and beyond are all in bucket 63. Kernel keys are bounded
without losing associativity: beyond `max_kernels` distinct keys, those with the smallest
CRC-32 (ties by name) are kept and the rest folded into `kernels_other`, so which are kept
depends only on the set of keys, never on order or splitting. `merge_from` is associative, and
commutative except for the memory peak, for which the merged events are taken to follow ours.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.abi import (
    AGG_F_FAILED,
    API_IDS,
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

Events = npt.NDArray[np.void]
#: records.AGGREGATE_DTYPE rows: events the kernel counted instead of recording them.
Aggregates = npt.NDArray[np.void]
#: ((grid x, y, z), (block x, y, z)) of a launch.
Shape = tuple[tuple[int, int, int], tuple[int, int, int]]
K = TypeVar("K")

#: The name of an api, copy kind or sync scope this version does not know.
UNKNOWN: Final = "unknown"
HISTOGRAM_BUCKETS: Final = 64
DEFAULT_MAX_KERNELS: Final = 256
#: Distinct pids remembered by default (the smallest ones when there are more).
MAX_PIDS: Final = 4096
#: The apis of graph launches (the rest of the launch apis launch kernels).
GRAPH_LAUNCH_APIS: Final[frozenset[str]] = frozenset(
    name for name in API_IDS if name.startswith(("cudaGraphLaunch", "cuGraphLaunch"))
)

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
#: What a failed call's type becomes for everything but `errors` (no event has type 0).
_COUNTS_AS_NOTHING: Final = np.uint8(0)


@dataclass
class CopyStats:
    count: int = 0
    bytes: int = 0
    sync_count: int = 0
    sync_bytes: int = 0
    sync_ns: int = 0

    @property
    def sync_bandwidth(self) -> float | None:
        """Achieved bandwidth of synchronous copies, bytes per second."""
        return self.sync_bytes * 1e9 / self.sync_ns if self.sync_ns else None

    def add(self, other: CopyStats) -> None:
        self.count += other.count
        self.bytes += other.bytes
        self.sync_count += other.sync_count
        self.sync_bytes += other.sync_bytes
        self.sync_ns += other.sync_ns

    def as_list(self) -> list[int]:
        return [self.count, self.bytes, self.sync_count, self.sync_bytes, self.sync_ns]


# -- names -----------------------------------------------------------------------------------


def api_name(api: int) -> str:
    return API_NAMES.get(api, UNKNOWN)


def copy_kind_name(kind: int) -> str:
    return COPY_KINDS[kind] if kind < len(COPY_KINDS) else UNKNOWN


def sync_scope_name(scope: int) -> str:
    return SYNC_SCOPES.get(scope, UNKNOWN)


def kernel_key(function: int, kernel_names: Mapping[int, str] | None = None) -> str:
    """A kernel's key: its name when known, else the address of its host stub."""
    name = kernel_names.get(function) if kernel_names else None
    return name if name else f"function@0x{function:x}"


def _zeros() -> list[int]:
    return [0] * HISTOGRAM_BUCKETS


# -- the counts ------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Counts:
    """Everything counted of some events, summed. Mutable: `add` and `merge_from` add."""

    events: int = 0
    #: (layer, api name) → kernel launches that ran, and graph launches.
    launches: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (layer, api name) of graph launches → kernel nodes those launches ran (where known).
    graph_kernel_nodes: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Kernel launches recorded into a graph under stream capture (they ran nothing).
    captured: int = 0
    #: Kernel key (`kernel_key`) → launches that ran; at most `max_kernels` keys.
    kernels: dict[str, int] = field(default_factory=dict)
    #: Launches of kernels folded away (beyond `max_kernels` distinct keys).
    kernels_other: int = 0
    #: CUDA device (the calling thread's, gf_event.device) → kernel launches that ran.
    device_launches: dict[int, int] = field(default_factory=dict)
    #: (CUDA device, copy kind) → copies (as `copies` counts them) made on that device.
    device_copies: dict[tuple[int, str], CopyStats] = field(default_factory=dict)
    #: CUDA device → syncs, and the CPU time in them (as `sync_count`/`sync_ns` count them).
    device_sync_count: dict[int, int] = field(default_factory=dict)
    device_sync_ns: dict[int, int] = field(default_factory=dict)
    #: log2 histograms of grid blocks (x·y·z) and block threads (x·y·z) of the launches.
    grid_blocks: list[int] = field(default_factory=_zeros)
    block_threads: list[int] = field(default_factory=_zeros)
    #: Σ blocks · threads per block of the launches.
    threads_launched: int = 0
    #: Times of the first and last kernel launch (ns; 0: none yet).
    first_launch_ns: int = 0
    last_launch_ns: int = 0
    #: Exact (grid, block) → launches. Unbounded, so kept only where asked (a Counter; the
    #: trace summary does); None: not kept.
    shapes: Counter[Shape] | None = None
    copies: dict[str, CopyStats] = field(default_factory=dict)
    memset_count: int = 0
    memset_bytes: int = 0
    alloc_count: int = 0
    alloc_bytes: int = 0
    free_count: int = 0
    free_bytes: int = 0
    #: Allocated minus freed (known) bytes.
    memory_net_bytes: int = 0
    #: The highest the running net change reached (≥ 0: the level before the first event).
    memory_peak_rise_bytes: int = 0
    sync_count: dict[str, int] = field(default_factory=dict)
    sync_ns: dict[str, int] = field(default_factory=dict)
    #: api name → calls that returned an error.
    errors: dict[str, int] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)
    #: Distinct pids kept (the smallest ones); None: all of them.
    max_pids: int | None = field(default=MAX_PIDS, repr=False, compare=False)

    @property
    def max_kernels(self) -> int:
        """Distinct kernel keys kept (a subclass may make it a field)."""
        return DEFAULT_MAX_KERNELS

    # -- views ---------------------------------------------------------------------------------

    @property
    def kernel_launches(self) -> int:
        """Kernel launches that ran (captured ones are not)."""
        return sum(self.kernels.values()) + self.kernels_other

    @property
    def all_launches(self) -> int:
        """Kernel and graph launches."""
        return sum(self.launches.values())

    @property
    def graph_launches(self) -> int:
        return self.all_launches - self.kernel_launches

    @property
    def graph_kernels(self) -> int:
        """Kernel nodes run by graph launches, where the exec's nodes are known."""
        return sum(self.graph_kernel_nodes.values())

    @property
    def kernels_run(self) -> int:
        """Kernel launches and the kernel nodes of graph launches (where known)."""
        return self.kernel_launches + self.graph_kernels

    def launches_by_api(self, graphs: bool = False) -> dict[str, int]:
        """api name → kernel launches (`graphs`: graph launches instead), most first."""
        found: dict[str, int] = {}
        for (_layer, api), n in self.launches.items():
            if (api in GRAPH_LAUNCH_APIS) == graphs:
                found[api] = found.get(api, 0) + n
        return dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def failed_calls(self) -> int:
        return sum(self.errors.values())

    @property
    def copy_sync_ns(self) -> int:
        """CPU blocked on the GPU in synchronous copies (those that completed)."""
        return sum(c.sync_ns for c in self.copies.values())

    @property
    def total_sync_ns(self) -> int:
        """CPU blocked on the GPU in syncs (failed ones too)."""
        return sum(self.sync_ns.values())

    @property
    def blocked_ns(self) -> int:
        """CPU blocked on the GPU: in syncs and in synchronous copies."""
        return self.total_sync_ns + self.copy_sync_ns

    @property
    def processes(self) -> int:
        return len(self.pids)

    @property
    def devices(self) -> list[int]:
        """The CUDA devices that launched, copied or synced, in order."""
        return sorted({*self.device_launches, *(d for d, _ in self.device_copies),
                       *self.device_sync_count})

    def device_copy_stats(self, device: int) -> dict[str, CopyStats]:
        """Copy kind → the copies made on `device`."""
        return {kind: c for (d, kind), c in sorted(self.device_copies.items()) if d == device}

    def device_blocked_ns(self, device: int) -> int:
        """CPU blocked on the GPU by threads on `device`: in syncs and synchronous copies."""
        return self.device_sync_ns.get(device, 0) + sum(
            c.sync_ns for (d, _), c in self.device_copies.items() if d == device)

    # -- adding ------------------------------------------------------------------------------

    def add(self, events: Events, kernel_names: Mapping[int, str] | None = None) -> None:
        """Add a batch of enriched records (records.EVENT_DTYPE), in place.

        The events are taken to follow those already added (for the memory peak).
        `kernel_names` maps a launch's host-stub address (`handle`) to its kernel's name.
        """
        n = len(events)
        if n == 0:
            return
        self.events += n
        types = np.ascontiguousarray(events["type"])
        flags = events["flags"]
        failed = ((flags & F_HAS_RESULT) != 0) & (events["result"] != 0)
        if failed.any():
            _add_counts(self.errors, events["api"][failed], api_name)
            # A failed call counts as nothing else, but a sync: the CPU waited all the same.
            types = np.where(failed & (types != _SYNC), _COUNTS_AS_NOTHING, types)
        pid = events["pid"]
        lo, hi = int(pid.min()), int(pid.max())
        self._add_pids([lo] if lo == hi else np.unique(pid).tolist())

        # take() on a structured array is an order of magnitude faster than a boolean index.
        is_launch = types == _LAUNCH
        captured = is_launch & ((flags & F_CAPTURED) != 0)
        if captured.any():
            self.captured += int(np.count_nonzero(captured))
            is_launch &= ~captured
        kernels = events.take(np.flatnonzero(is_launch))
        graphs = events.take(np.flatnonzero(types == _GRAPH_LAUNCH))
        for launches in (kernels, graphs):
            if len(launches):
                apis, counts = _bincount(launches["api"])
                for a, c in zip(apis, counts, strict=True):
                    key = (layer_of(a), api_name(a))
                    self.launches[key] = self.launches.get(key, 0) + c
        if len(graphs):
            nodes = graphs["dim"][:, GRAPH_KERNEL_NODES].astype(np.int64)
            for a in np.unique(graphs["api"]).tolist():
                total = int(nodes[graphs["api"] == a].sum())
                if total:
                    key = (layer_of(a), api_name(a))
                    self.graph_kernel_nodes[key] = self.graph_kernel_nodes.get(key, 0) + total
        if len(kernels):
            self._add_kernels(kernels["handle"], kernel_names)
            devices, per_device = np.unique(kernels["device"], return_counts=True)
            for d, c in zip(devices.tolist(), per_device.tolist(), strict=True):
                self.device_launches[d] = self.device_launches.get(d, 0) + c
            dims = kernels["dim"]
            self._add_dims(dims)
            if self.shapes is not None:
                _add_shapes(self.shapes, dims)
            ts = kernels["ts_ns"]
            first, last = int(ts.min()), int(ts.max())
            self.first_launch_ns = (min(self.first_launch_ns, first) if self.first_launch_ns
                                    else first)
            self.last_launch_ns = max(self.last_launch_ns, last)
        copies = events.take(np.flatnonzero(types == _MEMCPY))
        if len(copies):
            self._add_copies(copies)
        memsets = events.take(np.flatnonzero(types == _MEMSET))
        if len(memsets):
            self.memset_count += len(memsets)
            self.memset_bytes += _exact_sum(memsets["bytes"])
        memory = events.take(np.flatnonzero((types == _ALLOC) | (types == _FREE)))
        if len(memory):
            self._add_memory(memory)
        syncs = events.take(np.flatnonzero(types == _SYNC))
        if len(syncs):
            self._add_syncs(syncs)

    def add_aggregates(self, aggregates: Aggregates,
                       kernel_names: Mapping[int, str] | None = None) -> None:
        """Add aggregates (records.AGGREGATE_DTYPE, enriched), in place: each stands for
        `count` events of one process, api, kernel, shape, kind and device that the kernel
        counted instead of recording them (bpf/cudart.bpf.c, "overload"), and counts exactly as
        `add` counts those events, by the same rule — but for what the kernel does not keep of
        them: an aggregated launch counts as run (not as captured into a graph), an aggregated
        free's bytes are not known, and aggregated allocations count toward the memory peak as
        if made before any free of theirs (an upper bound). The kernel keeps allocations, frees
        and graph captures in the ring while it has room, so these are only ever the ones a
        full ring could not hold."""
        if len(aggregates) == 0:
            return
        c = {name: aggregates[name].tolist() for name in aggregates.dtype.names or ()}
        self._add_pids(set(c["pid"]))
        for i, n in enumerate(c["count"]):
            self.events += n
            api, etype, flags = c["api"][i], c["type"][i], c["flags"][i]
            timed = bool(flags & F_HAS_RESULT)
            if timed and flags & AGG_F_FAILED:
                self.errors[api_name(api)] = self.errors.get(api_name(api), 0) + n
                if etype != _SYNC:
                    continue
            device, nbytes, ns = c["device"][i], c["bytes"][i], c["duration_ns"][i]
            if etype in (_LAUNCH, _GRAPH_LAUNCH):
                key = (layer_of(api), api_name(api))
                self.launches[key] = self.launches.get(key, 0) + n
                if etype == _GRAPH_LAUNCH:
                    nodes = c["dim"][i][GRAPH_KERNEL_NODES] * n
                    if nodes:
                        self.graph_kernel_nodes[key] = self.graph_kernel_nodes.get(key, 0) + nodes
                else:
                    self._add_aggregated_launches(c, i, n, kernel_names)
            elif etype == _MEMCPY:
                kind = copy_kind_name(c["dim"][i][0])
                sync = n if timed and not flags & F_ASYNC else 0
                totals = CopyStats(n, nbytes, sync, nbytes if sync else 0, ns if sync else 0)
                self.copies.setdefault(kind, CopyStats()).add(totals)
                self.device_copies.setdefault((device, kind), CopyStats()).add(totals)
            elif etype == _MEMSET:
                self.memset_count += n
                self.memset_bytes += nbytes
            elif etype == _ALLOC and timed:
                self.alloc_count += n
                self.alloc_bytes += nbytes
                self.memory_peak_rise_bytes = max(self.memory_peak_rise_bytes,
                                                  self.memory_net_bytes + nbytes)
                self.memory_net_bytes += nbytes
            elif etype == _FREE and timed and c["handle"][i]:
                self.free_count += n
            elif etype == _SYNC:
                scope = sync_scope_name(c["dim"][i][0])
                ns = ns if timed else 0
                self.sync_count[scope] = self.sync_count.get(scope, 0) + n
                self.sync_ns[scope] = self.sync_ns.get(scope, 0) + ns
                self.device_sync_count[device] = self.device_sync_count.get(device, 0) + n
                self.device_sync_ns[device] = self.device_sync_ns.get(device, 0) + ns
        if len(self.kernels) > self.max_kernels:
            self._fold_kernels()

    def _add_aggregated_launches(self, c: Mapping[str, list[Any]], i: int, n: int,
                                 names: Mapping[int, str] | None) -> None:
        """Row `i` of `add_aggregates`' columns `c`: `n` kernel launches of one shape."""
        key = kernel_key(c["handle"][i], names)
        self.kernels[key] = self.kernels.get(key, 0) + n
        device = c["device"][i]
        self.device_launches[device] = self.device_launches.get(device, 0) + n
        g0, g1, g2, b0, b1, b2 = c["dim"][i]
        blocks, threads = g0 * g1 * g2, b0 * b1 * b2
        self.grid_blocks[bucket_of(blocks)] += n
        self.block_threads[bucket_of(threads)] += n
        self.threads_launched += blocks * threads * n
        if self.shapes is not None:
            self.shapes[((g0, g1, g2), (b0, b1, b2))] += n
        first, last = c["ts_ns"][i], c["last_ts_ns"][i]
        self.first_launch_ns = min(self.first_launch_ns, first) if self.first_launch_ns else first
        self.last_launch_ns = max(self.last_launch_ns, last)

    def _add_pids(self, pids: Iterable[int]) -> None:
        self.pids.update(pids)
        if self.max_pids is not None and len(self.pids) > self.max_pids:
            self.pids = set(sorted(self.pids)[: self.max_pids])

    def _add_kernels(
        self, handles: npt.NDArray[np.uint64], names: Mapping[int, str] | None
    ) -> None:
        first, last = handles[0], handles[-1]
        if first == last and bool((handles == first).all()):
            functions, counts = [int(first)], [len(handles)]
        else:
            uniq, cnt = np.unique(handles, return_counts=True)
            functions, counts = uniq.tolist(), cnt.tolist()
        kernels = self.kernels
        for function, count in zip(functions, counts, strict=True):
            key = kernel_key(function, names)
            kernels[key] = kernels.get(key, 0) + count
        if len(kernels) > self.max_kernels:
            self._fold_kernels()

    def _fold_kernels(self) -> None:
        kept = heapq.nsmallest(self.max_kernels, self.kernels, key=_kernel_rank)
        folded = sum(self.kernels.values()) - sum(self.kernels[k] for k in kept)
        self.kernels = {k: self.kernels[k] for k in kept}
        self.kernels_other += folded

    def _add_dims(self, dims: npt.NDArray[np.uint32]) -> None:
        d = dims.astype(np.uint64)  # (n, 6): grid x y z, block x y z
        top = [int(v) for v in d.max(axis=0).tolist()]
        grid_max, block_max = top[0] * top[1] * top[2], top[3] * top[4] * top[5]
        if grid_max * block_max * len(d) < _EXACT_LIMIT:  # no product nor sum can overflow
            blocks = d[:, 0] * d[:, 1] * d[:, 2]
            threads = d[:, 3] * d[:, 4] * d[:, 5]
            _add_histogram(self.grid_blocks, _floor_log2(blocks))
            _add_histogram(self.block_threads, _floor_log2(threads))
            self.threads_launched += int((blocks * threads).sum(dtype=np.uint64))
            return
        # Products near or beyond 2^62 (invalid launches): exact in Python ints.
        for g0, g1, g2, b0, b1, b2 in d.tolist():
            nblocks, nthreads = g0 * g1 * g2, b0 * b1 * b2
            self.grid_blocks[bucket_of(nblocks)] += 1
            self.block_threads[bucket_of(nthreads)] += 1
            self.threads_launched += nblocks * nthreads

    def _add_copies(self, copies: Events) -> None:
        kinds = np.minimum(copies["dim"][:, 0], len(COPY_KINDS)).astype(np.int64)
        flags = copies["flags"]
        nbytes = copies["bytes"]
        # Failed copies are not here (see `add`): a synchronous one with a result completed.
        timed = (((flags & F_ASYNC) == 0) & ((flags & F_HAS_RESULT) != 0)).astype(np.uint64)
        columns = (np.ones(len(copies), dtype=np.uint64), nbytes, timed, nbytes * timed,
                   copies["duration_ns"] * timed)
        for key, sums in _group_sums(_device_keys(copies["device"], kinds), columns):
            device, kind = divmod(key, _KEY_SPAN)
            totals = CopyStats(*sums)
            name = copy_kind_name(kind)
            self.copies.setdefault(name, CopyStats()).add(totals)
            self.device_copies.setdefault((device, name), CopyStats()).add(totals)

    def _add_memory(self, events: Events) -> None:
        events = events.take(np.argsort(events["ts_ns"], kind="stable"))
        flags = events["flags"]
        # Failed calls are not here (see `add`); one without a result did not complete.
        ok = (flags & F_HAS_RESULT) != 0
        is_alloc = events["type"] == _ALLOC
        allocs = ok & is_alloc
        frees = ok & ~is_alloc & (events["handle"] != 0)
        known = frees & ((flags & F_BYTES_KNOWN) != 0)
        nbytes = events["bytes"]
        self.alloc_count += int(np.count_nonzero(allocs))
        self.free_count += int(np.count_nonzero(frees))
        alloc_bytes = _exact_sum(nbytes[allocs])
        free_bytes = _exact_sum(nbytes[known])
        self.alloc_bytes += alloc_bytes
        self.free_bytes += free_bytes
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
        self.memory_peak_rise_bytes = max(self.memory_peak_rise_bytes,
                                          self.memory_net_bytes + rise)
        self.memory_net_bytes += alloc_bytes - free_bytes

    def _add_syncs(self, syncs: Events) -> None:
        scopes = syncs["dim"][:, 0].astype(np.int64)
        timed = ((syncs["flags"] & F_HAS_RESULT) != 0).astype(np.uint64)
        columns = (np.ones(len(syncs), dtype=np.uint64), syncs["duration_ns"] * timed)
        for key, (n, ns) in _group_sums(_device_keys(syncs["device"], scopes), columns):
            device, scope = divmod(key, _KEY_SPAN)
            name = sync_scope_name(scope)
            self.sync_count[name] = self.sync_count.get(name, 0) + n
            self.sync_ns[name] = self.sync_ns.get(name, 0) + ns
            self.device_sync_count[device] = self.device_sync_count.get(device, 0) + n
            self.device_sync_ns[device] = self.device_sync_ns.get(device, 0) + ns

    # -- merging -----------------------------------------------------------------------------

    def merge_from(self, other: Counts) -> None:
        """Add `other`'s counts to ours, its events taken to follow ours (memory peak).
        Shapes are merged where both keep them."""
        self.events += other.events
        _merge_counts(self.launches, other.launches)
        _merge_counts(self.graph_kernel_nodes, other.graph_kernel_nodes)
        self.captured += other.captured
        _merge_counts(self.kernels, other.kernels)
        self.kernels_other += other.kernels_other
        _merge_counts(self.device_launches, other.device_launches)
        for key, totals in other.device_copies.items():
            self.device_copies.setdefault(key, CopyStats()).add(totals)
        _merge_counts(self.device_sync_count, other.device_sync_count)
        _merge_counts(self.device_sync_ns, other.device_sync_ns)
        if len(self.kernels) > self.max_kernels:
            self._fold_kernels()
        self.grid_blocks = [x + y for x, y in zip(self.grid_blocks, other.grid_blocks,
                                                  strict=True)]
        self.block_threads = [x + y for x, y in zip(self.block_threads, other.block_threads,
                                                    strict=True)]
        self.threads_launched += other.threads_launched
        if other.first_launch_ns:
            self.first_launch_ns = (min(self.first_launch_ns, other.first_launch_ns)
                                    if self.first_launch_ns else other.first_launch_ns)
            self.last_launch_ns = max(self.last_launch_ns, other.last_launch_ns)
        if self.shapes is not None and other.shapes is not None:
            self.shapes.update(other.shapes)
        for kind, totals in other.copies.items():
            self.copies.setdefault(kind, CopyStats()).add(totals)
        self.memset_count += other.memset_count
        self.memset_bytes += other.memset_bytes
        self.alloc_count += other.alloc_count
        self.alloc_bytes += other.alloc_bytes
        self.free_count += other.free_count
        self.free_bytes += other.free_bytes
        self.memory_peak_rise_bytes = max(
            self.memory_peak_rise_bytes, self.memory_net_bytes + other.memory_peak_rise_bytes
        )
        self.memory_net_bytes += other.memory_net_bytes
        _merge_counts(self.sync_count, other.sync_count)
        _merge_counts(self.sync_ns, other.sync_ns)
        _merge_counts(self.errors, other.errors)
        self._add_pids(other.pids)


# -- helpers ---------------------------------------------------------------------------------


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


def _merge_counts(into: dict[K, int], other: Mapping[K, int]) -> None:
    for key, n in other.items():
        into[key] = into.get(key, 0) + n


#: Distinct values of a key column (a copy kind, a sync scope: small ints) below this.
_KEY_SPAN: Final = 1 << 16


def _device_keys(devices: npt.NDArray[Any], keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """One int64 key per row for (device, key): device · _KEY_SPAN + key (divmod undoes it).
    `keys` are non-negative; those beyond _KEY_SPAN - 1 are taken as _KEY_SPAN - 1 (a copy
    kind or sync scope this version does not know: the callers name them all "unknown")."""
    return devices.astype(np.int64) * _KEY_SPAN + np.minimum(keys, _KEY_SPAN - 1)


def _group_sums(
    keys: npt.NDArray[np.int64], columns: Sequence[npt.NDArray[Any]]
) -> list[tuple[int, list[int]]]:
    """(key, [exact Σ of each column over the key's rows]) for each distinct key, in order:
    one sort and one reduceat per column, whatever the number of keys (several devices and
    kinds in one message cost no pass each)."""
    first = int(keys[0])
    if bool((keys == first).all()):
        return [(first, [_exact_sum(c) for c in columns])]
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    n = len(keys)
    sums: list[list[int]] = []
    for column in columns:
        values = column[order]
        if float(values.max()) * n < _EXACT_LIMIT:
            sums.append(np.add.reduceat(values.astype(np.uint64), starts).tolist())
        else:  # sums that may pass 2^64: exact in Python ints
            bounds = [*starts.tolist(), n]
            items = values.tolist()
            sums.append([sum(items[lo:hi]) for lo, hi in pairwise(bounds)])
    return [(key, [s[i] for s in sums]) for i, key in enumerate(ordered[starts].tolist())]


def _exact_sum(values: npt.NDArray[Any]) -> int:
    """Σ values as an exact int (uint64 when it cannot overflow, else Python ints)."""
    if values.size == 0:
        return 0
    if float(values.max()) * values.size < _EXACT_LIMIT:
        return int(values.sum(dtype=np.uint64))
    return sum(values.tolist())


def _kernel_rank(key: str) -> tuple[int, str]:
    return zlib.crc32(key.encode()), key


def _add_shapes(shapes: Counter[Shape], dims: npt.NDArray[np.uint32]) -> None:
    first = dims[0]
    if bool((dims == first).all()):
        g0, g1, g2, b0, b1, b2 = first.tolist()
        shapes[((g0, g1, g2), (b0, b1, b2))] += len(dims)
        return
    # Distinct rows by one packed uint64 key where the six columns fit in 64 bits (real
    # launches do), else by sorting the rows: np.unique(axis=0) is ~20x slower.
    d = dims.astype(np.uint64)
    widths = [int(v).bit_length() for v in d.max(axis=0).tolist()]
    if sum(widths) <= 64:
        key = np.zeros(len(d), dtype=np.uint64)
        shift = 0
        for column, width in enumerate(widths):
            key |= d[:, column] << np.uint64(shift)
            shift += width
        _, index, counts = np.unique(key, return_index=True, return_counts=True)
    else:
        order = np.lexsort(d.T[::-1])
        rows = d[order]
        starts = np.flatnonzero(np.r_[True, (rows[1:] != rows[:-1]).any(axis=1)])
        index, counts = order[starts], np.diff(np.r_[starts, len(rows)])
    for (g0, g1, g2, b0, b1, b2), n in zip(dims[index].tolist(), counts.tolist(), strict=True):
        shapes[((g0, g1, g2), (b0, b1, b2))] += n


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
    added = np.bincount(buckets, minlength=HISTOGRAM_BUCKETS)
    for i in np.flatnonzero(added).tolist():
        counts[i] += int(added[i])


# -- histograms ------------------------------------------------------------------------------


def bucket_of(value: int) -> int:
    """The log2 bucket of `value` (0 and 1 → 0; 2^63 and beyond → 63)."""
    if value < 0:
        raise ValueError(f"no bucket for {value}")
    return min(max(value.bit_length() - 1, 0), HISTOGRAM_BUCKETS - 1)


def percentile(counts: list[int], q: float) -> float | None:
    """The q-quantile (0 ≤ q ≤ 1) of a log2 histogram; None when it is empty.

    The bucket i holding rank q·n is found; the fraction f of that bucket's values below the
    rank gives 2^(i+f) (log-linear interpolation, values taken as spread evenly in log2 within
    the bucket), kept within the bucket's integers [2^i, 2^(i+1) - 1]: the error is under a
    factor 2, and for values all equal to 2^i the median reads 2^(i+0.5), about 1.41·2^i.
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
