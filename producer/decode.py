"""Raw event arrays → the events of `--output` (one JSON object per line).

Decoding is per batch: columns are turned into Python lists once, then each
event is assembled from them. The sizes of allocations are remembered per
process so that a free can say how many bytes it released.
"""

from __future__ import annotations

import time
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from producer.records import (
    ALLOC_KINDS,
    API_NAMES,
    COPY_KINDS,
    F_ASYNC,
    F_HAS_RESULT,
    SYNC_SCOPES,
    TYPE_NAMES,
    EventType,
)

Event = dict[str, Any]

LAYER_RUNTIME: Final = "runtime"


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

    def forget_process(self, pid: int) -> None:
        for key in [k for k in self._sizes if k[0] == pid]:
            del self._sizes[key]


class Decoder:
    """Stateful decoder: feed it batches in ring order."""

    def __init__(self, clock_offset_ns: int | None = None) -> None:
        self.clock_offset_ns = (
            monotonic_to_wall_offset_ns() if clock_offset_ns is None else clock_offset_ns
        )
        self.allocations = AllocationSizes()

    def decode(self, events: npt.NDArray[np.void]) -> list[Event]:
        if len(events) == 0:
            return []
        columns = {name: events[name].tolist() for name in events.dtype.names or ()}
        ts = (events["ts_ns"].astype(np.int64) + self.clock_offset_ns).tolist()
        out: list[Event] = []
        for i in range(len(events)):
            out.append(self._one(columns, ts[i], i))
        return out

    def _one(self, c: dict[str, list[Any]], ts_ns: int, i: int) -> Event:
        etype = c["type"][i]
        flags = c["flags"][i]
        has_result = bool(flags & F_HAS_RESULT)
        event: Event = {
            "type": TYPE_NAMES.get(etype, f"unknown_{etype}"),
            "ts_ns": ts_ns,
            "pid": c["pid"][i],
            "tid": c["tid"][i],
            "api": API_NAMES.get(c["api"][i], f"unknown_{c['api'][i]}"),
            "layer": LAYER_RUNTIME,
        }
        result = c["result"][i] if has_result else None
        ok = (result == 0) if has_result else None
        duration = c["duration_ns"][i] if has_result else None
        dim = c["dim"][i]
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
                **{"async": bool(flags & F_ASYNC)},
                stream=c["stream"][i],
                duration_ns=duration,
                ok=ok,
            )
        elif etype == EventType.MEMSET:
            event.update(
                bytes=c["bytes"][i], **{"async": bool(flags & F_ASYNC)}, stream=c["stream"][i]
            )
        elif etype == EventType.ALLOC:
            ptr = c["handle"][i] if ok else None
            if ok and ptr:
                self.allocations.allocated(event["pid"], ptr, c["bytes"][i])
            event.update(
                bytes=c["bytes"][i],
                ptr=ptr,
                alloc_kind=ALLOC_KINDS.get(dim[0], "unknown"),
                stream=c["stream"][i],
                duration_ns=duration,
                ok=ok,
            )
        elif etype == EventType.FREE:
            ptr = c["handle"][i]
            freed = self.allocations.freed(event["pid"], ptr) if ok is not False else None
            event.update(
                ptr=ptr, bytes=freed, stream=c["stream"][i], duration_ns=duration, ok=ok
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
