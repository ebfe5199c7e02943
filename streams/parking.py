"""Messages waiting for their process's identity, parked instead of waited for.

An events batch names its process (host, pid, start time); a metrics record names the pids
it counts drops for; an NVML record the pids of each GPU's processes. Their jobs come from the
processes topic, read by another thread (streams/identities.py), which may not have caught up
yet. The worker does not wait in its agent (that would stall every host of the partition): the
message is parked in the worker's table, beside the job states (through streams/stored.py: one
changelog record, or, over the broker's record limit, its parts and then a head, so a crash
loses nothing), and resolved on the partition's tick, or by the host's next message; after
`identity_wait_s` it goes to the unknown-job fallback.

The events batches of a host that has one parked queue behind it, and are applied in offset
order: so each job state still sees its messages in order, and its offset check (a redelivery
after a restart changes nothing) holds for parked messages too. The host's windows from its
earliest parked event on stay open meanwhile (`ParkingLot.hold_ns`), so waiting never makes
its events late. Metrics records wait on their own (their points are whole values).

Pure: no Faust, no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Final, TypeVar

import orjson

K = TypeVar("K")
K2 = TypeVar("K2")

#: Table keys of parked messages start with this (job states' keys start with their host).
PARKED_PREFIX: Final = b"\x00parked\x00"
EVENTS: Final = "events"
METRICS: Final = "metrics"
NVML: Final = "nvml"


@dataclass(frozen=True)
class Parked:
    """One message as it came, and why it waits."""

    kind: str  # EVENTS, METRICS or NVML
    host: str
    #: events: the batch's process (pid, start time; 0, 0 for metrics).
    pid: int
    start_time: int
    #: Where the message came from (one parked copy per message).
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    #: events: the earliest event time of the batch (ns), holding its host's windows open
    #: (0: none, an empty batch).
    min_ts_ns: int
    #: Wall clock (ns) since when it waits, on this worker: the wait restarts after a restart.
    since_ns: int

    @property
    def table_key(self) -> bytes:
        return parked_key(self.topic, self.partition, self.offset)

    @property
    def where(self) -> tuple[str, int]:
        """(topic, offset): the message, within its partition."""
        return self.topic, self.offset

    @property
    def process(self) -> tuple[str, int, int]:
        return self.host, self.pid, self.start_time

    def to_bytes(self) -> bytes:
        meta = {
            "kind": self.kind, "host": self.host, "pid": self.pid,
            "start_time": self.start_time, "topic": self.topic, "partition": self.partition,
            "offset": self.offset, "min_ts_ns": self.min_ts_ns,
            "key": None if self.key is None else self.key.hex(),
        }
        return orjson.dumps(meta) + b"\n" + self.value

    @classmethod
    def from_bytes(cls, data: bytes, since_ns: int) -> Parked:
        """ValueError when `data` is not a parked message."""
        head, sep, value = data.partition(b"\n")
        try:
            meta = orjson.loads(head)
            if not sep or meta["kind"] not in (EVENTS, METRICS, NVML):
                raise ValueError("not a parked message")
            key = meta["key"]
            return cls(
                kind=str(meta["kind"]), host=str(meta["host"]), pid=int(meta["pid"]),
                start_time=int(meta["start_time"]), topic=str(meta["topic"]),
                partition=int(meta["partition"]), offset=int(meta["offset"]),
                key=None if key is None else bytes.fromhex(key), value=value,
                min_ts_ns=int(meta["min_ts_ns"]), since_ns=since_ns,
            )
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"malformed parked message: {exc!r}") from None


def parked_key(topic: str, partition: int, offset: int) -> bytes:
    return PARKED_PREFIX + f"{topic}\x00{partition}\x00{offset}".encode()


def is_parked_key(key: bytes) -> bool:
    return key.startswith(PARKED_PREFIX)


class ParkingLot:
    """The parked messages of the partitions a worker owns, by partition and (events) by host."""

    def __init__(self) -> None:
        self._by_partition: dict[int, dict[tuple[str, int], Parked]] = defaultdict(dict)
        self._by_host: dict[str, dict[tuple[str, int], Parked]] = defaultdict(dict)

    def __len__(self) -> int:
        return sum(len(p) for p in self._by_partition.values())

    def add(self, parked: Parked) -> None:
        where = parked.where
        self._by_partition[parked.partition][where] = parked
        if parked.kind == EVENTS:
            self._by_host[parked.host][where] = parked

    def remove(self, parked: Parked) -> None:
        where = parked.where
        _discard(self._by_partition, parked.partition, where)
        if parked.kind == EVENTS:
            _discard(self._by_host, parked.host, where)

    def contains(self, topic: str, partition: int, offset: int) -> bool:
        return (topic, offset) in self._by_partition.get(partition, {})

    def of_partition(self, partition: int) -> list[Parked]:
        """Oldest first, by topic."""
        return [p for _, p in sorted(self._by_partition.get(partition, {}).items())]

    def of_host(self, host: str) -> list[Parked]:
        """The events batches of one host, oldest first: the order they are applied in."""
        return [p for _, p in sorted(self._by_host.get(host, {}).items())]

    def holds(self, host: str) -> bool:
        """Whether events batches of `host` wait (its next ones queue behind them)."""
        return host in self._by_host

    def hold_ns(self, host: str) -> int | None:
        """The earliest event time parked for `host`: its windows from there stay open."""
        times = [p.min_ts_ns for p in self._by_host.get(host, {}).values() if p.min_ts_ns]
        return min(times) if times else None

    def forget_partition(self, partition: int) -> None:
        for parked in list(self._by_partition.get(partition, {}).values()):
            self.remove(parked)

    def clear(self) -> None:
        self._by_partition.clear()
        self._by_host.clear()


def _discard(index: dict[K, dict[K2, Parked]], key: K, inner: K2) -> None:
    found = index.get(key)
    if found is not None:
        found.pop(inner, None)
        if not found:
            del index[key]
