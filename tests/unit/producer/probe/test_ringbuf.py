"""The bulk ring-buffer reader, on a memfd laid out like a BPF ring buffer map."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import numpy as np
import pytest

from gpuflight.producer.contract.abi import EVENT_DTYPE, RECORD_DTYPE
from gpuflight.producer.probe.ringbuf import RingBufferReader

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


def test_records_of_any_size_drain_as_bytes(ring: tuple[FakeRing, RingBufferReader]) -> None:
    """The HTTP capture's ring holds records of many sizes: each comes back whole, in order,
    across the wrap; a discarded one is skipped, and a busy one stops the drain there."""
    fake, reader = ring
    sizes = [5, 88, 300, 17, 1000, 64, 2000, 9]
    for i, size in enumerate(sizes):
        position = fake.producer
        fake.push(0, length=size)
        fake._write(position + 8, bytes([i]) * size)
    out = reader.drain_bytes()
    assert out == [bytes([i]) * size for i, size in enumerate(sizes)]
    assert fake.consumer() == fake.producer
    skipped = fake.push(0, DISCARD, length=40)
    kept = fake.producer
    fake.push(0, length=12)
    fake._write(kept + 8, b"k" * 12)
    busy = fake.push(0, BUSY, length=50)
    fake.push(0, length=10)
    assert reader.drain_bytes() == [b"k" * 12]
    assert skipped < kept < busy and fake.consumer() == busy  # waits for the busy one
    fake.set_header(busy, 50)
    assert [len(r) for r in reader.drain_bytes()] == [50, 10]


def test_a_ring_of_another_struct_uses_its_stride() -> None:
    """Loader and name records (producer/probe/probes.py) are read with their own dtype."""
    from gpuflight.producer.contract.abi import LOADER_EVENT_DTYPE
    from gpuflight.producer.probe.ringbuf import record_dtype

    assert record_dtype(EVENT_DTYPE) == RECORD_DTYPE
    assert record_dtype(LOADER_EVENT_DTYPE).itemsize == 8 + LOADER_EVENT_DTYPE.itemsize
    fake = FakeRing()
    reader = RingBufferReader(fake.fd, SIZE, LOADER_EVENT_DTYPE)
    try:
        for pid in (7, 8, 9):
            position = fake.producer
            fake.push(0, length=LOADER_EVENT_DTYPE.itemsize)
            record = np.zeros(1, dtype=LOADER_EVENT_DTYPE)
            record["pid"] = pid
            fake._write(position + 8, record.tobytes())
        assert reader.drain()["pid"].tolist() == [7, 8, 9]
    finally:
        reader.close()
        fake.map.close()
        os.close(fake.fd)


def test_a_drain_says_when_committed_records_were_left_behind(
    ring: tuple[FakeRing, RingBufferReader],
) -> None:
    """Records committed behind one still being written, or past `max_events`, stay in the
    ring: the drain gives the earliest time among them (the per-CPU merge waits for them)."""
    fake, reader = ring
    fake.push(10)
    assert reader.drain()["ts_ns"].tolist() == [10] and reader.untaken_min_ts is None
    busy = fake.push(20, flags=BUSY)
    fake.push(40)
    fake.push(30)
    fake.push(50, flags=BUSY)
    assert len(reader.drain()) == 0
    assert reader.untaken_min_ts == 30
    fake.set_header(busy, EVENT_DTYPE.itemsize)
    assert reader.drain(max_events=1)["ts_ns"].tolist() == [20]
    assert reader.untaken_min_ts == 30
    assert reader.drain()["ts_ns"].tolist() == [40, 30]
    assert reader.untaken_min_ts is None  # only a busy one is left
    fake.push(60, flags=DISCARD)
    fake.push(70, length=16)
    assert len(reader.drain()) == 0 and reader.untaken_min_ts == 0  # past one of another size
