"""Partitions the worker holds whose messages wait and are not taken. Pure: no Faust, no I/O.

The worker takes what its Kafka consumer hands its agent. Should a partition stop being handed
over (the fetcher no longer asks for it, or what it fetched never reached the agent) while
messages wait in it, nothing else would say so: its hosts' windows would close on the wall
clock alone, with nothing in them. A partition is *stalled* when, for `stall_s`, its next
offset to take stays the same, below its high-water mark, while the worker took other messages
(the agent is alive, so the partition is starved rather than the worker busy). The worker then
says so, with what the consumer knows of the partition, and reads it again from that offset
(streams/worker.py `check_partitions`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final

#: How long a partition's messages may wait untaken, the worker taking others, before it is
#: read again.
STALL_S: Final = 20.0


@dataclass
class _Waiting:
    next_offset: int
    since_s: float
    taken: int  # the worker's messages taken by then


@dataclass(frozen=True)
class Stall:
    next_offset: int
    highwater: int
    waited_s: float


class StallWatch:
    """Each partition's progress, checked now and then (`check`)."""

    def __init__(self, stall_s: float = STALL_S) -> None:
        self.stall_s = stall_s
        self._waiting: dict[Hashable, _Waiting] = {}

    def check(self, partition: Hashable, next_offset: int, highwater: int, taken: int,
              now_s: float) -> Stall | None:
        """`partition`'s next offset to take and its high-water mark (the offset its next
        message will have), the worker's messages taken so far, at `now_s` (monotonic): a
        Stall once it has waited `stall_s` while others were taken (then watched afresh)."""
        if next_offset >= highwater:
            self._waiting.pop(partition, None)
            return None
        waiting = self._waiting.get(partition)
        if waiting is None or waiting.next_offset != next_offset:
            self._waiting[partition] = _Waiting(next_offset, now_s, taken)
            return None
        waited = now_s - waiting.since_s
        if waited < self.stall_s or taken <= waiting.taken:
            return None
        del self._waiting[partition]
        return Stall(next_offset, highwater, waited)

    def forget(self) -> None:
        """After a rebalance: the partitions held may have changed."""
        self._waiting.clear()
