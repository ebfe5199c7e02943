"""The per-CPU event buffers' reader, on anonymous maps laid out as the kernel's arrays, and their
merge with the ring (a memfd laid out as a BPF ring buffer) in each thread's order."""

from __future__ import annotations

import mmap
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gpuflight.producer.contract.abi import (
    CPU_HEAD_DTYPE,
    EVENT_DTYPE,
    SLOT_DISCARDED,
    SLOT_DTYPE,
)
from gpuflight.producer.probe.cpubuffers import CpuBuffers, MergedEvents, mapped_bytes
from gpuflight.producer.probe.ringbuf import RingBufferReader
from tests.unit.producer.probe.test_ringbuf import BUSY, SIZE, FakeRing

SLOTS = 8
NCPUS = 2


class FakeCpus:
    """What the kernel's programs do to the two arrays (bpf/cudart.bpf.c gf_cpu_reserve,
    gf_cpu_commit): take the slot `head` names, fill it, stamp it."""

    def __init__(self, ncpus: int = NCPUS, slots: int = SLOTS) -> None:
        self.slots = slots
        self.slots_map = mmap.mmap(-1, mapped_bytes(ncpus * slots * SLOT_DTYPE.itemsize))
        self.heads_map = mmap.mmap(-1, mapped_bytes(ncpus * CPU_HEAD_DTYPE.itemsize))
        self.slot = np.frombuffer(self.slots_map, dtype=SLOT_DTYPE,
                                  count=ncpus * slots).reshape(ncpus, slots)
        self.heads = np.frombuffer(self.heads_map, dtype=CPU_HEAD_DTYPE, count=ncpus)

    def reserve(self, cpu: int) -> int | None:
        head = int(self.heads["head"][cpu])
        if head - int(self.heads["tail"][cpu]) >= self.slots:
            return None  # full: the program goes to the ring
        self.heads["head"][cpu] = head + 1
        return head

    def fill(self, cpu: int, position: int, ts: int, tid: int = 1, *, stamp: bool = True,
             discard: bool = False) -> None:
        slot = self.slot[cpu, position % self.slots]
        slot["ev"]["ts_ns"] = ts
        slot["ev"]["tid"] = tid
        if stamp or discard:
            self.stamp(cpu, position, discard)

    def stamp(self, cpu: int, position: int, discard: bool = False) -> None:
        self.slot[cpu, position % self.slots]["committed"] = (
            (position + 1) | (SLOT_DISCARDED if discard else 0))

    def taken(self, cpu: int, ts: int, *, stamp: bool = False, discard: bool = False) -> int:
        """A slot taken and filled (stamped or not, or discarded): its position."""
        position = self.reserve(cpu)
        assert position is not None
        self.fill(cpu, position, ts, stamp=stamp, discard=discard)
        return position

    def put(self, cpu: int, ts: int, tid: int = 1) -> bool:
        position = self.reserve(cpu)
        if position is None:
            return False
        self.fill(cpu, position, ts, tid)
        return True

    def buffers(self) -> CpuBuffers:
        return CpuBuffers(self.slots_map, self.heads_map, NCPUS, self.slots)


@pytest.fixture
def cpus() -> Iterator[tuple[FakeCpus, CpuBuffers]]:
    fake = FakeCpus()
    yield fake, fake.buffers()


def test_takes_each_cpu_s_stamped_slots_in_order(cpus: tuple[FakeCpus, CpuBuffers]) -> None:
    fake, buffers = cpus
    for ts in (1, 2, 3):
        fake.put(0, ts)
    fake.put(1, 10)
    assert buffers.take()["ts_ns"].tolist() == [1, 2, 3, 10]
    assert fake.heads["tail"].tolist() == [3, 1]
    assert len(buffers.take()) == 0


def test_a_slot_not_stamped_yet_holds_the_tail_not_the_slots_after_it(
    cpus: tuple[FakeCpus, CpuBuffers],
) -> None:
    """A program preempted between taking its slot and stamping it: the slots after it are
    taken once, the tail waits at it, and its own event comes when it is stamped."""
    fake, buffers = cpus
    fake.put(0, 1)
    open_slot = fake.taken(0, 2)
    fake.put(0, 3)
    fake.put(0, 4)
    assert buffers.take()["ts_ns"].tolist() == [1, 3, 4]
    assert int(fake.heads["tail"][0]) == 1
    assert len(buffers.take()) == 0  # 3 and 4 are not taken again
    fake.stamp(0, open_slot)
    fake.put(0, 5)
    assert buffers.take()["ts_ns"].tolist() == [2, 5]
    assert int(fake.heads["tail"][0]) == 5 == int(fake.heads["head"][0])


def test_a_discarded_slot_is_freed_and_not_read(cpus: tuple[FakeCpus, CpuBuffers]) -> None:
    fake, buffers = cpus
    fake.put(1, 1)
    fake.taken(1, 2, discard=True)
    fake.put(1, 3)
    assert buffers.take()["ts_ns"].tolist() == [1, 3]
    assert int(fake.heads["tail"][1]) == 3


def test_a_stamp_of_the_lap_before_is_not_this_lap_s(cpus: tuple[FakeCpus, CpuBuffers]) -> None:
    """Slots are reused lap after lap: a slot still stamped for its previous position is
    being written, not whole."""
    fake, buffers = cpus
    seen: list[int] = []
    ts = 0
    for _ in range(5):
        while fake.put(0, ts):
            ts += 1
        seen += buffers.take()["ts_ns"].tolist()
    assert seen == list(range(ts)) and ts == 5 * SLOTS
    position = fake.taken(0, 99)  # its old stamp: position + 1 - SLOTS
    assert len(buffers.take()) == 0
    fake.stamp(0, position)
    assert buffers.take()["ts_ns"].tolist() == [99]


def test_a_full_buffer_turns_programs_to_the_ring(cpus: tuple[FakeCpus, CpuBuffers]) -> None:
    fake, buffers = cpus
    assert all(fake.put(0, ts) for ts in range(SLOTS))
    assert not fake.put(0, SLOTS)
    assert buffers.last_fullest == 0
    assert len(buffers.take()) == SLOTS and buffers.last_fullest == SLOTS
    assert fake.put(0, SLOTS + 1)


# -- the merge with the ring ------------------------------------------------------------


@pytest.fixture
def merged() -> Iterator[tuple[FakeRing, FakeCpus, MergedEvents]]:
    ring = FakeRing()
    reader = RingBufferReader(ring.fd, SIZE)
    fake = FakeCpus()
    events = MergedEvents(reader, fake.buffers())
    yield ring, fake, events
    events.close()
    reader.close()
    ring.map.close()
    os.close(ring.fd)


def _tids(events: Any) -> list[tuple[int, int]]:
    return list(zip(events["tid"].tolist(), events["ts_ns"].tolist(), strict=True))


def test_events_of_both_sources_come_in_time_order(
    merged: tuple[FakeRing, FakeCpus, MergedEvents],
) -> None:
    ring, fake, events = merged
    t = time.monotonic_ns()
    fake.put(1, t + 3)
    ring.push(t + 2)
    fake.put(0, t + 1)
    ring.push(t + 4)
    assert events.drain()["ts_ns"].tolist() == [t + 1, t + 2, t + 3, t + 4]
    assert (events.from_cpus, events.from_ring) == (2, 2)


def test_an_event_later_than_the_pass_waits_for_the_next(
    merged: tuple[FakeRing, FakeCpus, MergedEvents],
) -> None:
    """A thread launches into its CPU's buffer just after the pass read it, then syncs into the
    ring before the pass reads that: the sync must not be handed on before the launch."""
    ring, fake, events = merged
    reader = events._ring
    drain = reader.drain

    def late(max_events: int | None = None) -> Any:
        fake.put(0, time.monotonic_ns())  # the launch: after the buffers were read
        ring.push(time.monotonic_ns())    # the sync
        reader.drain = drain  # type: ignore[method-assign]
        return drain(max_events)

    reader.drain = late  # type: ignore[method-assign]
    assert len(events.drain()) == 0
    assert events.waiting == 1  # the sync, read and held
    out = events.drain()
    assert len(out) == 2 and out["ts_ns"][0] < out["ts_ns"][1]
    assert (events.from_cpus, events.from_ring) == (1, 1)


def test_a_ring_event_behind_one_being_written_holds_later_ones_back(
    merged: tuple[FakeRing, FakeCpus, MergedEvents],
) -> None:
    """The ring stops at a record still being written; a thread's event committed behind it
    must come before that thread's later events from the buffers."""
    ring, fake, events = merged
    t = time.monotonic_ns()
    busy = ring.push(t - 10, flags=BUSY)    # another thread's, being written
    ring.push(t - 9)                         # this thread's sync
    fake.put(1, t - 8)                       # and its next launch
    assert len(events.drain()) == 0
    ring.set_header(busy, EVENT_DTYPE.itemsize)
    assert events.drain()["ts_ns"].tolist() == [t - 10, t - 9, t - 8]


def test_at_the_end_everything_comes_out(
    merged: tuple[FakeRing, FakeCpus, MergedEvents],
) -> None:
    ring, fake, events = merged
    t = time.monotonic_ns() + 10**12  # later than any pass
    fake.put(0, t + 2)
    ring.push(t + 1)
    assert len(events.drain()) == 0 and events.waiting == 2
    assert events.drain(everything=True)["ts_ns"].tolist() == [t + 1, t + 2]
    assert events.waiting == 0
    ring.push(t + 3, flags=BUSY)  # never committed: what is behind it comes out at the end
    ring.push(t + 4)
    fake.put(1, t + 5)
    assert events.drain(everything=True)["ts_ns"].tolist() == [t + 5]
    assert len(events.drain(everything=True)) == 0


def test_many_threads_on_both_sources_keep_their_order(
    merged: tuple[FakeRing, FakeCpus, MergedEvents],
) -> None:
    """Threads hop between CPUs and sources; ring records are sometimes left half-written
    for a while; passes come at random: every thread's events come out once, in order."""
    ring, fake, events = merged
    rng = random.Random(26)
    made: dict[int, list[int]] = {tid: [] for tid in range(1, 6)}
    out: list[tuple[int, int]] = []
    writing: list[int] = []
    for _ in range(3000):
        tid = rng.randrange(1, 6)
        ts = time.monotonic_ns()
        if rng.random() < 0.5 and fake.put(rng.randrange(NCPUS), ts, tid):
            made[tid].append(ts)
        elif ring.producer - ring.consumer() < SIZE - 200:
            position = ring.push(ts)
            ring._write(position + 8 + 12, tid.to_bytes(4, "little"))
            made[tid].append(ts)
        if writing and rng.random() < 0.3:
            ring.set_header(writing.pop(), EVENT_DTYPE.itemsize | (1 << 30))  # discarded
        if rng.random() < 0.02 and ring.producer - ring.consumer() < SIZE - 200:
            writing.append(ring.push(0, flags=BUSY))
        if rng.random() < 0.1:
            out += _tids(events.drain(max_events=rng.choice([None, 3])))
    for position in writing:
        ring.set_header(position, EVENT_DTYPE.itemsize | (1 << 30))
    out += _tids(events.drain(everything=True))
    out += _tids(events.drain(everything=True))
    for tid, times in made.items():
        assert [ts for t, ts in out if t == tid] == times
    assert len(out) == sum(len(t) for t in made.values())


def test_a_call_completed_at_return_is_placed_at_its_return(
    merged: tuple[FakeRing, FakeCpus, MergedEvents],
) -> None:
    """A free is recorded at its return, with its entry time and duration; another thread's
    allocation that began while it ran but returned the same pointer after it must come after
    it (the ring's own order), not before it by entry time."""
    ring, fake, events = merged
    t = time.monotonic_ns() - 10_000
    position = fake.taken(0, t + 100)                         # the free: 100..300
    fake.slot[0, position]["ev"]["duration_ns"] = 200
    fake.stamp(0, position)
    alloc = ring.push(t + 50)                                 # the allocation: 50..400
    ring._write(alloc + 8 + 24, (350).to_bytes(8, "little"))  # duration_ns
    out = events.drain()
    assert (out["ts_ns"] - np.uint64(t)).tolist() == [100, 50]


# -- settings ---------------------------------------------------------------------------


def test_the_buffers_are_compiled_in_where_asked_for_and_the_kernel_has_cmpxchg(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuflight.producer import settings as module

    def flags(slots: int) -> list[str]:
        return [f for f in module.CaptureSettings(cpu_slots=slots).cflags()
                if f.startswith(("-DGF_CPU_SLOTS", "-DGF_NCPUS"))]

    monkeypatch.setattr(module, "possible_cpus", lambda: 6)
    assert flags(4096) == ["-DGF_CPU_SLOTS=4096", "-DGF_NCPUS=6"]
    assert flags(0) == []
    monkeypatch.setattr(module, "kernel_at_least", lambda major, minor: (major, minor) < (5, 12))
    assert flags(4096) == []  # Linux 5.8-5.11: the ring alone
    assert not module.CaptureSettings().cpu_buffers


def test_the_possible_cpus_are_one_past_the_highest(tmp_path: Any) -> None:
    from gpuflight.producer.settings import possible_cpus

    for text, want in (("0-3\n", 4), ("0,2-5\n", 6), ("0\n", 1)):
        (tmp_path / "possible").write_text(text)
        assert possible_cpus(tmp_path / "possible") == want
    assert possible_cpus(tmp_path / "missing") == (os.cpu_count() or 1)
