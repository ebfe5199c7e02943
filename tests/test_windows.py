"""Job states (streams/windows.py): once-only application, closing, writes and acks, and the
state's round trip through a Faust table value. Pure: no services."""

from __future__ import annotations

import pytest

from streams import measurements as m
from streams.windows import JobState, WindowSettings
from tests.support.streams_support import copies, launches

W = 1_000_000_000
T0 = 1_796_000_000 * W
SETTINGS = WindowSettings(window_s=1.0, grace_s=2.0)


def counts(points: list[m.Point], measurement: str = "launches") -> int:
    return sum(int(p.fields["count"]) for p in points if p.measurement == measurement)


def test_a_message_is_applied_once_per_offset() -> None:
    state = JobState("h", "j", 0)
    assert state.apply(launches([T0, T0 + 1], 1, 8, 8), 0, 5, SETTINGS).events == 2
    again = state.apply(launches([T0, T0 + 1], 1, 8, 8), 0, 5, SETTINGS)
    assert again.duplicate and again.events == 0
    assert state.apply(launches([T0 + 2], 1, 8, 8), 0, 4, SETTINGS).duplicate
    assert state.apply(launches([T0 + 3], 1, 8, 8), 0, 6, SETTINGS).events == 1
    assert state.windows[T0].agg.kernel_launches == 3


def test_windows_are_written_at_their_end_and_closed_after_grace() -> None:
    state = JobState("h", "j", 0)
    state.apply(launches([T0 + 1, T0 + 2], 1, 8, 8), 0, 0, SETTINGS)
    writes, closed = state.due(T0 + W // 2, SETTINGS)
    assert writes == [] and closed.memory_bound == []
    writes, closed = state.due(T0 + W, SETTINGS)  # ended, in grace: provisional
    assert [(w.window_start_ns, w.final, counts(w.points)) for w in writes] == [(T0, False, 2)]
    assert state.acknowledge(T0, writes[0].version, final=False)
    assert state.due(T0 + W + 1, SETTINGS)[0] == []  # nothing new to write
    state.apply(launches([T0 + 3], 1, 8, 8), 0, 1, SETTINGS)  # late, within grace
    writes, _ = state.due(T0 + W + 2, SETTINGS)
    assert [(w.final, counts(w.points)) for w in writes] == [(False, 3)]
    writes, closed = state.due(T0 + 3 * W, SETTINGS)  # end + grace: final
    assert [(w.final, counts(w.points)) for w in writes] == [(True, 3)]
    assert [v.window_start_ns for v in closed.memory_bound] == [T0]
    assert {p.measurement for p in writes[0].points} >= {"launches", "memory_bound"}
    # Until InfluxDB has it, the final write is offered again (after a restart, say).
    assert state.due(T0 + 4 * W, SETTINGS)[0] == writes
    assert not state.acknowledge(T0, writes[0].version + 1, final=True)
    assert state.acknowledge(T0, writes[0].version, final=True)
    assert state.due(T0 + 4 * W, SETTINGS)[0] == [] and state.idle
    late = state.apply(launches([T0 + 4, T0 + 5 * W], 1, 8, 8), 0, 2, SETTINGS)
    assert late.events == 1 and late.late is not None and late.late["ts_ns"].tolist() == [T0 + 4]


def test_memory_carries_across_windows_and_the_state_round_trips() -> None:
    from producer.records import API_IDS, F_HAS_RESULT, EventType

    state = JobState("h", "j", 3)
    alloc = launches([T0 + 1], 1, 1, 1)
    alloc["type"], alloc["api"], alloc["flags"], alloc["bytes"] = (
        EventType.ALLOC, API_IDS["cudaMalloc"], F_HAS_RESULT, 1 << 20)
    alloc["handle"] = 0xBEEF
    state.apply(alloc, 3, 0, SETTINGS)
    state.apply(copies([T0 + W + 1], 1, 1, 4096, 1000), 3, 1, SETTINGS)
    state.due(T0 + 2 * W + 2 * W, SETTINGS)  # closes window 0 only
    back = JobState.from_bytes(state.to_bytes(), SETTINGS)
    assert back.to_bytes() == state.to_bytes()
    assert back.pending == state.pending and back.offsets == {3: 1}
    writes, _ = back.due(T0 + 5 * W, SETTINGS)
    memory = [p for w in writes if w.window_start_ns == T0 + W for p in w.points
              if p.measurement == "memory"]
    assert memory[0].fields[m.Fields.LIVE_BYTES] == 1 << 20  # carried from window 0
    for w in writes:
        for point in w.points:
            m.validate(point)
    with pytest.raises(ValueError, match="malformed job state"):
        JobState.from_bytes(b'{"v": 1}', SETTINGS)
    with pytest.raises(ValueError, match="version"):
        JobState.from_bytes(b'{"v": 0}', SETTINGS)
