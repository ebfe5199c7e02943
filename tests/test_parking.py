"""Parked messages (streams/parking.py): their table values, and the worker's index of them."""

from __future__ import annotations

import pytest

from streams.parking import EVENTS, METRICS, Parked, ParkingLot, is_parked_key
from streams.windows import state_key


def parked(offset: int, *, kind: str = EVENTS, host: str = "h", pid: int = 7,
           min_ts_ns: int = 1_000, partition: int = 2) -> Parked:
    topic = "gpuflight.events.v1" if kind == EVENTS else "gpuflight.metrics.v1"
    return Parked(kind, host, pid, 11, topic, partition, offset, b"h",
                  b"\x00raw\nbytes\n", min_ts_ns, since_ns=5)


def test_a_parked_message_round_trips_as_it_came() -> None:
    one = parked(42)
    back = Parked.from_bytes(one.to_bytes(), since_ns=99)
    assert back == Parked(**{**one.__dict__, "since_ns": 99})
    assert back.value == b"\x00raw\nbytes\n"
    assert is_parked_key(one.table_key) and not is_parked_key(state_key("h", "job:1"))
    assert Parked.from_bytes(Parked(**{**one.__dict__, "key": None}).to_bytes(), 0).key is None
    for bad in (b"", b"{}\n", b'{"kind": "other"}\n', b"not json\n"):
        with pytest.raises(ValueError, match="parked message"):
            Parked.from_bytes(bad, 0)


def test_the_lot_queues_a_hosts_batches_in_order() -> None:
    lot = ParkingLot()
    a, b = parked(9, min_ts_ns=500), parked(3, min_ts_ns=800)
    other_process = parked(5, pid=8, min_ts_ns=300)
    empty = parked(6, min_ts_ns=0)  # no events: holds no window
    metrics = parked(9, kind=METRICS, pid=0, min_ts_ns=0)  # the offset of another topic
    other_partition = parked(3, host="g", partition=1, min_ts_ns=100)
    for p in (a, b, other_process, empty, metrics, other_partition):
        lot.add(p)
    assert len(lot) == 6
    assert lot.of_partition(2) == [b, other_process, empty, a, metrics]  # by topic, offset
    assert lot.of_host("h") == [b, other_process, empty, a]  # every process, in order
    assert lot.contains("gpuflight.metrics.v1", 2, 9) and lot.contains("gpuflight.events.v1", 2, 9)
    assert lot.contains(other_partition.topic, 1, 3) and not lot.contains(a.topic, 1, 9)
    assert a.table_key != metrics.table_key
    assert lot.holds("h") and lot.holds("g") and not lot.holds("x")
    assert lot.hold_ns("h") == 300 and lot.hold_ns("g") == 100 and lot.hold_ns("x") is None
    for done in (b, other_process, a):
        lot.remove(done)
    assert lot.holds("h") and lot.hold_ns("h") is None  # the empty batch still queues
    lot.remove(empty)
    assert not lot.holds("h") and lot.of_host("h") == []  # a metrics record queues nothing
    lot.forget_partition(1)
    assert lot.of_partition(1) == [] and not lot.holds("g") and len(lot) == 1
    lot.clear()
    assert len(lot) == 0
