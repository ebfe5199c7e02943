"""Raw event arrays → the events of `--output` (one JSON object per line).

Two steps: `Enricher` adds, once per batch and in ring order, what only the node
knows (wall-clock time, the size of each free, which launches were captured into a
graph and how many kernel nodes each graph exec holds); `to_events` turns enriched
records into dicts, per batch (columns become Python lists once), naming launches
from the enricher's KernelNames. Aggregates (events the kernel counted under overload
instead of recording them, records.AGGREGATE_DTYPE) take the same two steps:
`Enricher.enrich_aggregates`, `to_aggregate_events`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.abi import (
    AGG_F_FAILED,
    ALLOC_KINDS,
    API_NAMES,
    CAPTURE_BEGIN,
    CAPTURE_END,
    CAPTURE_KERNEL_NODES,
    COPY_KINDS,
    F_ASYNC,
    F_BYTES_KNOWN,
    F_CAPTURED,
    F_HAS_RESULT,
    GRAPH_KERNEL_NODES,
    SYNC_SCOPES,
    TYPE_NAMES,
    EventType,
    layer_of,
)
from gpuflight.producer.contract.wire import EventAttribution, KernelName, RequestRecord
from gpuflight.producer.decode.kernels import KernelNames

Event = dict[str, Any]

#: Graphs and graph execs whose kernel-node counts are remembered (oldest forgotten first).
MAX_GRAPHS = 65536

_GRAPH_TYPES = (EventType.GRAPH_CAPTURE, EventType.GRAPH_INSTANTIATE, EventType.GRAPH_LAUNCH)

def monotonic_to_wall_offset_ns(tries: int = 5) -> int:
    """Offset that turns bpf_ktime_get_ns() (CLOCK_MONOTONIC) into wall-clock ns: the wall
    clock read between two monotonic reads, of `tries` the one read most tightly (a thread
    preempted between the reads would be off by half the time it lost)."""
    gap, offset = _clock_pair()
    for _ in range(tries - 1):
        other_gap, other = _clock_pair()
        if other_gap < gap:
            gap, offset = other_gap, other
    return offset


def _clock_pair() -> tuple[int, int]:
    """(ns between the two monotonic reads, wall clock minus their midpoint)."""
    before = time.monotonic_ns()
    wall = time.time_ns()
    after = time.monotonic_ns()
    return after - before, wall - (before + after) // 2


class AllocationSizes:
    """Bytes of each live allocation, per process, from successful allocations."""

    def __init__(self) -> None:
        self._sizes: dict[int, dict[int, int]] = {}

    def allocated(self, pid: int, ptr: int, nbytes: int) -> None:
        if ptr:
            self._sizes.setdefault(pid, {})[ptr] = nbytes

    def freed(self, pid: int, ptr: int) -> int | None:
        mine = self._sizes.get(pid)
        return None if mine is None else mine.pop(ptr, None)

    def forget(self, pids: Collection[int]) -> None:
        """Processes gone: what they never freed is nobody's any more."""
        for pid in pids:
            self._sizes.pop(pid, None)

    def __len__(self) -> int:
        return sum(len(mine) for mine in self._sizes.values())

    def pids(self) -> set[int]:
        return set(self._sizes)


class _Bounded(OrderedDict[tuple[int, int], int]):
    """A dict that forgets its oldest entries beyond MAX_GRAPHS."""

    def __setitem__(self, key: tuple[int, int], value: int) -> None:
        super().__setitem__(key, value)
        if len(self) > MAX_GRAPHS:
            self.popitem(last=False)


class GraphNodes:
    """Stream capture, per process, in ring order: launches on a stream being captured are
    graph nodes (F_CAPTURED), counted into the graph that EndCapture returns, then into each
    exec instantiated from it; a graph launch's dim[GRAPH_KERNEL_NODES] gets its exec's."""

    def __init__(self) -> None:
        self.capturing: dict[tuple[int, int], int] = {}  # (pid, stream) → kernel nodes so far
        self.graphs = _Bounded()  # (pid, graph) → kernel nodes
        self.execs = _Bounded()  # (pid, graph exec) → kernel nodes

    def apply(self, events: npt.NDArray[np.void]) -> None:
        types = events["type"]
        relevant = np.isin(types, _GRAPH_TYPES)
        if self.capturing or (types == EventType.GRAPH_CAPTURE).any():
            relevant |= types == EventType.LAUNCH
        for i in np.flatnonzero(relevant).tolist():
            self._one(events[i])

    def pids(self) -> set[int]:
        return {key[0] for table in (self.capturing, self.graphs, self.execs) for key in table}

    def forget(self, pids: Collection[int]) -> None:
        """Processes gone: their streams, graphs and graph execs."""
        for table in (self.capturing, self.graphs, self.execs):
            for key in [k for k in table if k[0] in pids]:
                del table[key]

    def _one(self, event: np.void) -> None:
        etype, pid = int(event["type"]), int(event["pid"])
        stream, handle = (pid, int(event["stream"])), int(event["handle"])
        ok = not event["flags"] & F_HAS_RESULT or int(event["result"]) == 0
        if etype == EventType.LAUNCH:
            if stream in self.capturing:
                self.capturing[stream] += 1
                event["flags"] |= F_CAPTURED
        elif etype == EventType.GRAPH_CAPTURE:
            phase = int(event["dim"][0])
            if phase == CAPTURE_BEGIN:
                self.capturing[stream] = 0
            elif phase == CAPTURE_END:
                nodes = self.capturing.pop(stream, 0)
                if ok and handle:
                    self.graphs[(pid, handle)] = nodes
                    event["dim"][CAPTURE_KERNEL_NODES] = nodes
        elif etype == EventType.GRAPH_INSTANTIATE:
            nodes = self.graphs.get((pid, int(event["bytes"])), 0)
            if ok and handle:
                self.execs[(pid, handle)] = nodes
                event["dim"][GRAPH_KERNEL_NODES] = nodes
        elif etype == EventType.GRAPH_LAUNCH:
            nodes = self.execs.get((pid, handle), 0)
            event["dim"][GRAPH_KERNEL_NODES] = nodes
            if stream in self.capturing:  # a child graph of the one being captured
                self.capturing[stream] += nodes


class Enricher:
    """What only the node knows, added once per batch, in ring order: wall-clock
    timestamps, the size of each free (from the allocation of its pointer), captured
    launches and graph kernel nodes (GraphNodes); and the kernel names of launch
    handles (`kernels`, fed by the capture from the names ring).

    Everything downstream (--output, Kafka, the summary) sees enriched records, so
    a consumer decodes exactly the events `--output` writes, with no state.
    """

    def __init__(
        self, clock_offset_ns: int | None = None, proc_root: Path = Path("/proc")
    ) -> None:
        self.clock_offset_ns = (
            monotonic_to_wall_offset_ns() if clock_offset_ns is None else clock_offset_ns
        )
        self.allocations = AllocationSizes()
        self.graphs = GraphNodes()
        self.kernels = KernelNames(proc_root)

    def forget(self, pids: Collection[int]) -> None:
        """Drop what is kept of processes that are gone (their last events enriched, named
        and handed on): allocation sizes, graphs, kernel names and maps."""
        self.allocations.forget(pids)
        self.graphs.forget(pids)
        self.kernels.forget(pids)

    def pids(self) -> set[int]:
        """The processes something is kept of."""
        return self.allocations.pids() | self.graphs.pids() | self.kernels.pids()

    def enrich_aggregates(self, aggregates: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
        """Enrich drained aggregates in place and return them: wall-clock times, and the
        kernel nodes of each graph launch's exec (as `enrich` gives an event's). Their events
        came before the events drained with them (the kernel's generations lag a drain)."""
        if len(aggregates) == 0:
            return aggregates
        offset = np.uint64(self.clock_offset_ns)
        aggregates["ts_ns"] += offset
        aggregates["last_ts_ns"] += offset
        graphs = np.flatnonzero(aggregates["type"] == EventType.GRAPH_LAUNCH)
        for i in graphs.tolist():
            key = (int(aggregates["pid"][i]), int(aggregates["handle"][i]))
            aggregates["dim"][i, GRAPH_KERNEL_NODES] = self.graphs.execs.get(key, 0)
        return aggregates

    def enrich(self, events: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
        """Enrich a drained batch in place (it is ours) and return it."""
        if len(events) == 0:
            return events
        events["ts_ns"] += np.uint64(self.clock_offset_ns)
        self.graphs.apply(events)
        types = events["type"]
        memory = np.flatnonzero((types == EventType.ALLOC) | (types == EventType.FREE))
        for i in memory.tolist():
            event = events[i]
            ok = bool(event["flags"] & F_HAS_RESULT) and int(event["result"]) == 0
            pid, ptr = int(event["pid"]), int(event["handle"])
            if int(event["type"]) == EventType.ALLOC:
                if ok:
                    self.allocations.allocated(pid, ptr, int(event["bytes"]))
            elif ok:
                nbytes = self.allocations.freed(pid, ptr)
                if nbytes is not None:
                    event["bytes"] = nbytes
                    event["flags"] |= F_BYTES_KNOWN
        return events


def to_aggregate_events(
    aggregates: npt.NDArray[np.void], kernels: KernelNames | None = None
) -> list[Event]:
    """Enriched aggregates → lines of --output: "type": "aggregate", the type of the events
    it stands for ("of"), how many ("count"), the first and last one's time ("ts_ns",
    "last_ts_ns"), and what they share, as an event of theirs has it (a launch: its grid, block
    and kernel; a copy: its kind; a sync: its scope; "ok": false for failed calls), with
    "bytes" and "duration_ns" their sums (null where none was timed)."""
    out: list[Event] = []
    if len(aggregates) == 0:
        return out
    c = {name: aggregates[name].tolist() for name in aggregates.dtype.names or ()}
    for i, count in enumerate(c["count"]):
        etype, api, flags, pid = c["type"][i], c["api"][i], c["flags"][i], c["pid"][i]
        dim, handle, nbytes = c["dim"][i], c["handle"][i], c["bytes"][i]
        timed = bool(flags & F_HAS_RESULT)
        event: Event = {
            "type": "aggregate",
            "of": TYPE_NAMES.get(etype, f"unknown_{etype}"),
            "count": count,
            "ts_ns": c["ts_ns"][i],
            "last_ts_ns": c["last_ts_ns"][i],
            "pid": pid,
            "api": API_NAMES.get(api, f"unknown_{api}"),
            "layer": layer_of(api),
            "device": c["device"][i],
        }
        if etype == EventType.LAUNCH:
            name = kernels.name_of(pid, handle) if kernels is not None else None
            event.update(grid=dim[0:3], block=dim[3:6], shared_mem_bytes=nbytes,
                         kernel=name.short if name else None,
                         kernel_full=name.full if name else None, function=handle)
        elif etype == EventType.GRAPH_LAUNCH:
            event.update(graph_exec=handle, kernel_nodes=dim[GRAPH_KERNEL_NODES] or None)
        elif etype == EventType.MEMCPY:
            kind = dim[0]
            event.update(kind=COPY_KINDS[kind] if kind < len(COPY_KINDS) else f"unknown_{kind}",
                         bytes=nbytes)
            event["async"] = bool(flags & F_ASYNC)
        elif etype == EventType.MEMSET:
            event["bytes"] = nbytes
            event["async"] = bool(flags & F_ASYNC)
        elif etype == EventType.ALLOC:
            event.update(bytes=nbytes, alloc_kind=ALLOC_KINDS.get(dim[0], "unknown"))
        elif etype == EventType.FREE:
            event["null"] = not handle
        elif etype == EventType.SYNC:
            event["scope"] = SYNC_SCOPES.get(dim[0], "unknown")
        if timed:
            event.update(duration_ns=c["duration_ns"][i], ok=not flags & AGG_F_FAILED)
        out.append(event)
    return out


def request_event(pid: int, r: RequestRecord) -> Event:
    """A request as a line of --output ("type": "request"; wire.RequestRecord's fields, with
    the pid, its end as "ts_ns" and its duration)."""
    return {
        "type": "request", "ts_ns": r.end_ns, "pid": pid, "tid": r.tid,
        "request_id": r.request_id, "method": r.method, "path": r.path, "route": r.route,
        "status": r.status, "start_ns": r.start_ns, "end_ns": r.end_ns,
        "duration_ns": r.duration_ns, "bytes_in": r.bytes_in, "bytes_out": r.bytes_out,
        "trace_id": r.trace_id, "parent_span_id": r.parent_span_id, "complete": r.complete,
        "port": r.port, "cost": {k: v for k, v in r.cost.items() if v},
        "gpu_source": r.gpu_source,
        **({"code_paths": [list(p) for p in r.code_paths]} if r.code_paths else {}),
    }


def to_events(
    events: npt.NDArray[np.void], kernels: KernelNames | None = None,
    attribution: EventAttribution | None = None,
) -> list[Event]:
    """Enriched records → the events of --output; launches are named from `kernels`
    (without it, `kernel` and `kernel_full` are null); with `attribution`, each event made for
    a request has its `request_id` (exact) or `requests` ([id, share] pairs: shared)."""
    if len(events) == 0:
        return []
    columns = {name: events[name].tolist() for name in events.dtype.names or ()}
    names: dict[tuple[int, int], KernelName | None] | None = None
    if kernels is not None:
        launches = events[events["type"] == EventType.LAUNCH]
        pairs = set(zip(launches["pid"].tolist(), launches["handle"].tolist(), strict=True))
        names = {(pid, h): kernels.name_of(pid, h) for pid, h in pairs}
    out = [_one(columns, i, names) for i in range(len(events))]
    if attribution is not None:
        made_for = (attribution.request_id > 0) | (attribution.request_set > 0)
        for i in np.flatnonzero(made_for).tolist():
            out[i].update(attribution.of(i))
    return out


def _one(
    c: dict[str, list[Any]], i: int, names: dict[tuple[int, int], KernelName | None] | None
) -> Event:
    etype = c["type"][i]
    flags = c["flags"][i]
    has_result = bool(flags & F_HAS_RESULT)
    event: Event = {
        "type": TYPE_NAMES.get(etype, f"unknown_{etype}"),
        "ts_ns": c["ts_ns"][i],
        "pid": c["pid"][i],
        "tid": c["tid"][i],
        "api": API_NAMES.get(c["api"][i], f"unknown_{c['api'][i]}"),
        "layer": layer_of(c["api"][i]),
        "device": c["device"][i],
    }
    result = c["result"][i] if has_result else None
    ok = (result == 0) if has_result else None
    duration = c["duration_ns"][i] if has_result else None
    dim = c["dim"][i]
    is_async = bool(flags & F_ASYNC)
    if etype == EventType.LAUNCH:
        name = names.get((c["pid"][i], c["handle"][i])) if names is not None else None
        event.update(
            grid=dim[0:3],
            block=dim[3:6],
            shared_mem_bytes=c["bytes"][i],
            stream=c["stream"][i],
            kernel=name.short if name else None,
            kernel_full=name.full if name else None,
            function=c["handle"][i],
            captured=bool(flags & F_CAPTURED),
        )
    elif etype == EventType.MEMCPY:
        kind = dim[0]
        event.update(
            bytes=c["bytes"][i],
            kind=COPY_KINDS[kind] if kind < len(COPY_KINDS) else f"unknown_{kind}",
            stream=c["stream"][i],
            duration_ns=duration,
            ok=ok,
        )
        event["async"] = is_async
    elif etype == EventType.MEMSET:
        event.update(bytes=c["bytes"][i], stream=c["stream"][i])
        event["async"] = is_async
    elif etype == EventType.ALLOC:
        event.update(
            bytes=c["bytes"][i],
            ptr=c["handle"][i] if ok else None,
            alloc_kind=ALLOC_KINDS.get(dim[0], "unknown"),
            stream=c["stream"][i],
            duration_ns=duration,
            ok=ok,
        )
    elif etype == EventType.FREE:
        event.update(
            ptr=c["handle"][i],
            bytes=c["bytes"][i] if flags & F_BYTES_KNOWN else None,
            stream=c["stream"][i],
            duration_ns=duration,
            ok=ok,
        )
    elif etype == EventType.SYNC:
        scope = SYNC_SCOPES.get(dim[0], "unknown")
        handle = c["handle"][i]
        event.update(
            scope=scope,
            stream=handle if scope == "stream" else 0,
            event=handle if scope == "event" else None,
            duration_ns=duration,
            ok=ok,
        )
    elif etype == EventType.GRAPH_LAUNCH:
        nodes = dim[GRAPH_KERNEL_NODES]
        event.update(
            graph_exec=c["handle"][i], stream=c["stream"][i], kernel_nodes=nodes or None
        )
    elif etype == EventType.GRAPH_CAPTURE:
        ended = dim[0] == CAPTURE_END
        event.update(
            phase="end" if ended else "begin",
            stream=c["stream"][i],
            graph=(c["handle"][i] or None) if ended else None,
            kernel_nodes=dim[CAPTURE_KERNEL_NODES] if ended and ok else None,
            duration_ns=duration,
            ok=ok,
        )
    elif etype == EventType.GRAPH_INSTANTIATE:
        event.update(
            graph_exec=c["handle"][i] if ok else None,
            graph=c["bytes"][i],
            kernel_nodes=dim[GRAPH_KERNEL_NODES] if ok else None,
            duration_ns=duration,
            ok=ok,
        )
    if has_result:
        event["result"] = result
    return event
