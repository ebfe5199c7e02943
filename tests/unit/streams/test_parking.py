"""Parked messages (streams/parking.py): their table values, and the worker's index of them."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from gpuflight.streams.parking import EVENTS, METRICS, Parked, ParkingLot, is_parked_key
from gpuflight.streams.stored import MAX_RECORD_BYTES, Store, is_part_key
from gpuflight.streams.windows import state_key


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


def big_parked(offset: int, size: int) -> Parked:
    """An events message of `size` bytes parked (real ones reach 6.5 MB: 100k events)."""
    rng = np.random.default_rng(offset)
    value = orjson.dumps({"schema": "gpuflight.events",
                          "columns": {"ts": rng.integers(0, 10**9, size // 8).tolist()}})
    return Parked(EVENTS, "h", 7, 11, "gpuflight.events.v1", 2, offset, b"h", value[:size],
                  1_000, since_ns=5)


def test_a_parked_message_over_the_broker_limit_is_kept_in_records_it_takes() -> None:
    """A parked message was one table value, so one changelog record: a broker refuses one over
    its message.max.bytes (1 MiB), and 40,000 of 40,000 events were gone after a restart. A
    value over MAX_RECORD_BYTES is kept compressed, in parts of at most that, and read back
    whole; the parts of the value it replaces go."""
    table: dict[bytes, bytes] = {}
    store = Store(table)
    small, big = parked(1), big_parked(3, 6_500_000)
    store.put(small.table_key, small.to_bytes(), 2)
    assert table == {small.table_key: small.to_bytes()}  # as before: itself
    store.put(big.table_key, big.to_bytes(), 2)
    assert max(len(v) for v in table.values()) <= MAX_RECORD_BYTES
    assert len([k for k in table if is_part_key(k)]) >= 2
    assert store.get(big.table_key) == big.to_bytes()
    assert dict(store.items()) == {small.table_key: small.to_bytes(),
                                   big.table_key: big.to_bytes()}
    bigger = big_parked(4, 9_000_000)
    store.put(big.table_key, bigger.to_bytes(), 2)  # replaced: the old parts go
    assert Parked.from_bytes(store.get(big.table_key) or b"", 0).value == bigger.value
    parts = [k for k in table if is_part_key(k)]
    store.delete(big.table_key)
    assert set(table) == {small.table_key} and parts


def test_a_worker_stopped_while_writing_parts_recovers_the_value_before() -> None:
    table: dict[bytes, bytes] = {}
    store = Store(table, max_record_bytes=1000)
    key = b"host\x00job:1"
    first = bytes(range(256)) * 40
    store.put(key, first, 1)
    written = dict(table)

    class Stops(dict[bytes, bytes]):
        """A table whose worker stops before the head of the next value is written."""

        def __setitem__(self, k: bytes, v: bytes) -> None:
            if k == key:
                raise KeyboardInterrupt
            super().__setitem__(k, v)

    stopped = Stops(written)
    with pytest.raises(KeyboardInterrupt):
        Store(stopped, max_record_bytes=1000).put(key, bytes(range(255, -1, -1)) * 50, 1)
    recovered = Store(stopped, max_record_bytes=1000)
    assert recovered.get(key) == first
    assert recovered.sweep(0) == 0  # another partition's parts are not its to delete
    assert recovered.sweep(1) > 0
    assert dict(stopped) == written and recovered.get(key) == first
    del stopped[min(k for k in stopped if is_part_key(k))]
    with pytest.raises(ValueError, match="missing"):
        recovered.get(key)
    assert list(recovered.items()) == []  # logged, left out
