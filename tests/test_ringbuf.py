"""The bulk ring-buffer reader, on a memfd laid out like a BPF ring buffer map."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import numpy as np
import pytest

from producer.records import EVENT_DTYPE, RECORD_DTYPE
from producer.ringbuf import RingBufferReader

PAGE = mmap.PAGESIZE
SIZE = 4 * PAGE  # data area; records of 88 bytes do not divide it, so spans wrap
BUSY = 1 << 31
DISCARD = 1 << 30


class FakeRing:
    """consumer page | producer page | data | data again (the kernel's double map)."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("ring")
        os.ftruncate(self.fd, 2 * PAGE + 2 * SIZE)
        self.map = mmap.mmap(self.fd, 2 * PAGE + 2 * SIZE)
        self.producer = 0

    def push(self, ts: int, flags: int = 0, length: int = EVENT_DTYPE.itemsize) -> int:
        record = np.zeros(1, dtype=RECORD_DTYPE)
        record["len"] = length | flags
        record["event"]["ts_ns"] = ts
        raw = record.tobytes()[: 8 + length] if length <= EVENT_DTYPE.itemsize else None
        if raw is None:
            raw = record.tobytes()[:8] + bytes(length)
        self._write(self.producer, raw)
        position = self.producer
        self.producer += (8 + length + 7) & ~7
        self.map[PAGE : PAGE + 8] = self.producer.to_bytes(8, "little")
        return position

    def _write(self, position: int, raw: bytes) -> None:
        # The same bytes appear in both copies, wrapping at SIZE in each.
        for offset, byte in enumerate(raw):
            physical = (position + offset) % SIZE
            self.map[2 * PAGE + physical] = byte
            self.map[2 * PAGE + SIZE + physical] = byte

    def set_header(self, position: int, value: int) -> None:
        self._write(position, value.to_bytes(4, "little"))

    def consumer(self) -> int:
        return int.from_bytes(self.map[0:8], "little")


@pytest.fixture
def ring() -> Iterator[tuple[FakeRing, RingBufferReader]]:
    fake = FakeRing()
    reader = RingBufferReader(fake.fd, SIZE)
    yield fake, reader
    reader.close()
    fake.map.close()
    os.close(fake.fd)


def test_drains_committed_records_in_order(ring: tuple[FakeRing, RingBufferReader]) -> None:
    fake, reader = ring
    for ts in range(10):
        fake.push(ts)
    events = reader.drain()
    assert events["ts_ns"].tolist() == list(range(10))
    assert fake.consumer() == 10 * RECORD_DTYPE.itemsize
    assert len(reader.drain()) == 0


def test_stops_at_a_busy_record(ring: tuple[FakeRing, RingBufferReader]) -> None:
    fake, reader = ring
    fake.push(1)
    busy = fake.push(2, flags=BUSY)
    fake.push(3)
    assert reader.drain()["ts_ns"].tolist() == [1]
    fake.set_header(busy, EVENT_DTYPE.itemsize)  # committed now
    assert reader.drain()["ts_ns"].tolist() == [2, 3]


def test_skips_discarded_records(ring: tuple[FakeRing, RingBufferReader]) -> None:
    fake, reader = ring
    fake.push(1)
    fake.push(2, flags=DISCARD)
    fake.push(3)
    assert reader.drain()["ts_ns"].tolist() == [1, 3]
    assert fake.consumer() == 3 * RECORD_DTYPE.itemsize


def test_wraps_around_the_end(ring: tuple[FakeRing, RingBufferReader]) -> None:
    fake, reader = ring
    per_lap = SIZE // RECORD_DTYPE.itemsize
    seen: list[int] = []
    for ts in range(3 * per_lap):
        fake.push(ts)
        if ts % 7 == 0:
            seen += reader.drain()["ts_ns"].tolist()
    seen += reader.drain()["ts_ns"].tolist()
    assert seen == list(range(3 * per_lap))


def test_max_events_bounds_a_drain(ring: tuple[FakeRing, RingBufferReader]) -> None:
    fake, reader = ring
    for ts in range(5):
        fake.push(ts)
    assert reader.drain(max_events=2)["ts_ns"].tolist() == [0, 1]
    assert reader.drain()["ts_ns"].tolist() == [2, 3, 4]


def test_foreign_record_sizes_are_skipped_and_counted(
    ring: tuple[FakeRing, RingBufferReader],
) -> None:
    fake, reader = ring
    fake.push(1)
    fake.push(0, length=16)
    fake.push(3)
    assert reader.drain()["ts_ns"].tolist() == [1, 3]
    assert reader.foreign_records == 1


def test_rejects_a_size_that_is_not_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        RingBufferReader(-1, 3 * PAGE)
