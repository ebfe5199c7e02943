"""Raw event arrays → the events of `--output` (one JSON object per line).

Two steps: `Enricher` adds, once per batch and in ring order, what only the node
knows (wall-clock time, the size of each free); `to_events` turns enriched
records into dicts, per batch (columns become Python lists once).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt

from producer.records import (
    ALLOC_KINDS,
    API_NAMES,
    COPY_KINDS,
    F_ASYNC,
    F_BYTES_KNOWN,
    F_HAS_RESULT,
    SYNC_SCOPES,
    TYPE_NAMES,
    EventType,
    layer_of,
)

Event = dict[str, Any]

def monotonic_to_wall_offset_ns() -> int:
    """Offset that turns bpf_ktime_get_ns() (CLOCK_MONOTONIC) into wall-clock ns."""
    before = time.monotonic_ns()
    wall = time.time_ns()
    after = time.monotonic_ns()
    return wall - (before + after) // 2


class AllocationSizes:
    """Bytes of each live allocation, per process, from successful allocations."""

    def __init__(self) -> None:
        self._sizes: dict[tuple[int, int], int] = {}

    def allocated(self, pid: int, ptr: int, nbytes: int) -> None:
        if ptr:
            self._sizes[(pid, ptr)] = nbytes

    def freed(self, pid: int, ptr: int) -> int | None:
        return self._sizes.pop((pid, ptr), None)


class Enricher:
    """What only the node knows, added once per batch, in ring order: wall-clock
    timestamps, and the size of each free (from the allocation of its pointer).

    Everything downstream (--output, Kafka, the summary) sees enriched records, so
    a consumer decodes exactly the events `--output` writes, with no state.
    """

    def __init__(self, clock_offset_ns: int | None = None) -> None:
        self.clock_offset_ns = (
            monotonic_to_wall_offset_ns() if clock_offset_ns is None else clock_offset_ns
        )
        self.allocations = AllocationSizes()

    def enrich(self, events: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
        """Enrich a drained batch in place (it is ours) and return it."""
        if len(events) == 0:
            return events
        events["ts_ns"] += np.uint64(self.clock_offset_ns)
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


def to_events(events: npt.NDArray[np.void]) -> list[Event]:
    """Enriched records → the events of --output. Stateless."""
    if len(events) == 0:
        return []
    columns = {name: events[name].tolist() for name in events.dtype.names or ()}
    return [_one(columns, i) for i in range(len(events))]


def _one(c: dict[str, list[Any]], i: int) -> Event:
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
    }
    result = c["result"][i] if has_result else None
    ok = (result == 0) if has_result else None
    duration = c["duration_ns"][i] if has_result else None
    dim = c["dim"][i]
    is_async = bool(flags & F_ASYNC)
    if etype == EventType.LAUNCH:
        event.update(
            grid=dim[0:3],
            block=dim[3:6],
            shared_mem_bytes=c["bytes"][i],
            stream=c["stream"][i],
            kernel=None,
            function=c["handle"][i],
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
        event.update(graph_exec=c["handle"][i], stream=c["stream"][i])
    if has_result:
        event["result"] = result
    return event
