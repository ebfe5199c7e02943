"""Job states (streams/windows.py): once-only application, closing, writes and acks, and the
state's round trip through a Faust table value. Pure: no services."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from gpuflight.streams import measurements as m
from gpuflight.streams.windows import JobState, WindowSettings
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
    from gpuflight.producer.contract.abi import API_IDS, F_HAS_RESULT, EventType

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


def test_one_message_over_twenty_thousand_windows_makes_a_bounded_state() -> None:
    """One message spread over 20,000 windows made an 11.9 MB state (its changelog record
    stopped the worker). A message takes the windows it has the most events in, up to
    max_windows_per_message, and a job holds at most open_windows_limit windows open: the
    rest of the events are refused (returned, not counted)."""
    state = JobState("h", "j", 0)
    spread = launches([T0 + i * W for i in range(20_000)], 1, 8, 8)
    dense = launches([T0 + 7 * W + i for i in range(5)], 1, 8, 8)  # the message's own window
    applied = state.apply(np.concatenate([spread, dense]), 0, 0, SETTINGS)
    limit = SETTINGS.max_windows_per_message
    assert limit < 100 and len(state.windows) == limit
    assert T0 + 7 * W in state.windows  # the window it has the most events in
    assert applied.events == limit - 1 + 6
    assert applied.refused is not None and len(applied.refused) == 20_000 - limit
    assert len(state.to_bytes()) < 200_000
    for k in range(1, 10):  # more such messages fill the job's windows, no further
        state.apply(launches([T0 + (k * 1000 + i) * W for i in range(1000)], 1, 8, 8), 0, k,
                    SETTINGS)
    assert len(state.windows) == SETTINGS.open_windows_limit < 1000
    assert WindowSettings(window_s=0.1, grace_s=60).open_windows_limit >= 600 + 2 * limit


def test_a_state_keeps_its_messages_latest_times_for_its_hosts_clock() -> None:
    """What streams/clock.py needs after a restart: the two latest message times of the job
    (a state from before them has its latest event time alone)."""
    from gpuflight.streams.clock import HostClock

    state = JobState("h", "j", 0)
    for offset, t in enumerate((T0 + 5, T0 + 9 * W, T0 + 2 * W)):
        assert state.apply(launches([T0, t], 1, 8, 8), 0, offset, SETTINGS).time_ns == t
    assert state.latest_ns == [T0 + 9 * W, T0 + 2 * W]
    back = JobState.from_bytes(state.to_bytes(), SETTINGS)
    assert back.latest_ns == state.latest_ns
    data = orjson.loads(state.to_bytes())
    del data["latest_ns"]
    assert JobState.from_bytes(orjson.dumps(data), SETTINGS).latest_ns == [T0 + 9 * W]
    clock = HostClock()
    clock.merge(back.latest_ns)
    clock.heard(None, T0 + 10 * W)
    assert clock.now(T0 + 10 * W, 5 * W) == T0 + 2 * W  # what two messages attest to


def test_no_single_message_moves_a_hosts_clock() -> None:
    from gpuflight.streams.clock import HostClock

    idle = 5 * W
    clock = HostClock()
    assert clock.now(T0, idle) == 0  # nothing heard yet
    clock.heard(T0 + 100 * W, T0)  # one message, ahead of the wall clock
    assert clock.now(T0, idle) == T0  # the wall clock when it came, no further
    clock.heard(T0 + 1, T0 + 1)
    assert clock.now(T0 + 1, idle) == T0 + 1
    for i in range(2, 10):  # the host's real messages
        clock.heard(T0 + i * W // 4, T0 + i * W // 4)
    assert clock.now(T0 + 9 * W // 4, idle) == T0 + 9 * W // 4  # the second latest: real
    clock.heard(T0 + 10 * W // 4, T0 + 10 * W // 4)
    assert clock.now(T0 + 10 * W // 4, idle) == T0 + 10 * W // 4
    # Silent: its time goes on with the wall clock beyond host_idle (the forged message's
    # time counts alone now, but no further than the wall clock host_idle ago).
    assert clock.now(T0 + 10 * W // 4 + idle + 3 * W, idle) == T0 + 10 * W // 4 + 3 * W
    replay = HostClock()  # old data: its last message far beyond the one before
    replay.heard(T0 + 1, T0 + 3600 * W)
    replay.heard(T0 + 60 * W, T0 + 3600 * W)
    assert replay.now(T0 + 3600 * W, idle) == T0 + 1
    assert replay.now(T0 + 3600 * W + idle, idle) == T0 + 60 * W  # silent: it counts alone
