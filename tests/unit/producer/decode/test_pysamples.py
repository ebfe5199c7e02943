"""Samples to code paths: each sample's head is joined to the event of the call it sampled,
whichever ring is read first, and its path gets what that call cost, times the calls the sample
stands for; a head whose frames never come is counted unknown, one whose event never comes
counts as calls alone and is counted — nothing is lost silently; a process with no CPython is
one frame that says so."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuflight.producer.contract.abi import F_ASYNC, F_HAS_RESULT, EventType
from gpuflight.producer.decode import pysamples
from gpuflight.producer.decode.codepaths import PathFrame
from gpuflight.producer.decode.pysamples import (
    BACKWARD,
    IN_BACKWARD,
    NEW,
    NO_FRAMES,
    NO_PYTHON,
    UNKNOWN,
    StackSamples,
    head_dtype,
    stack_dtype,
)
from tests.support.builders import build_events, call

DEPTH = 8
#: The enricher's monotonic → wall offset: events are enriched, heads are not.
OFFSET = 50
PID = 9


def _heads(*samples: tuple[int, int, int] | tuple[int, int, int, int]) -> np.ndarray:
    """(stack, weight, event time on the wall clock[, tid]) each."""
    heads = np.zeros(len(samples), head_dtype())
    for i, (stack_id, weight, ts, *tid) in enumerate(samples):
        heads[i]["pid"], heads[i]["stack_id"], heads[i]["weight"] = PID, stack_id, weight
        heads[i]["ts_ns"], heads[i]["tid"] = ts - OFFSET, tid[0] if tid else 1
    return heads


def _frames(stack_id: int, flags: int = NEW, depth: int = 2) -> np.ndarray:
    whole = np.zeros(1, stack_dtype(DEPTH))
    whole[0]["pid"], whole[0]["stack_id"], whole[0]["flags"] = PID, stack_id, flags
    whole[0]["depth"] = depth
    whole[0]["code"][:depth] = [0x1000 + i for i in range(depth)]
    return whole


def _samples() -> StackSamples:
    return StackSamples(DEPTH, lambda pid: None, lambda pid: None, clock_offset_ns=OFFSET)


def _values(samples: StackSamples, **price: Any) -> dict[tuple[Any, ...], dict[str, float]]:
    return {p.frames: dict(p.values) for p in samples.samples(**price)}


def test_a_launch_read_before_its_head_and_a_sync_read_after_it_are_both_joined() -> None:
    samples = _samples()
    samples.add_frames(_frames(1))
    # The launch's event is sent before its walk: read in the same turn, before the head.
    samples.add_events(build_events([call(5_000, dim=[4, 1, 1, 32, 1, 1])]))
    samples.add_samples(_heads((1, 10, 5_000), (1, 10, 9_000)))  # the sync's: waits
    samples.end_turn()
    # The sync returns later: its event comes in a later turn, after its head.
    samples.add_events(build_events([call(9_000, type_=EventType.SYNC, duration_ns=700)]))
    samples.end_turn()
    (values,) = _values(samples).values()
    # GPU time: the launch's busy span runs to the sync's return, a turn later, whole.
    assert values == {"launches": 10.0, "gpu_ns": 10.0 * (9_000 + 700 - 5_000), "bytes": 0.0,
                      "blocked_ns": 7000.0, "calls": 20.0,
                      "launches_variance": 10.0 * 9}  # Σ w(w-1) over the launch's samples
    assert samples.unjoined == 0 and samples.unknown_stacks == 0


def test_gpu_time_is_the_busy_model_over_every_turn_whatever_the_batches() -> None:
    """Batches cut anywhere — a read turn inside a long sync, as in a GPU-bound loop — give
    each call the GPU time the busy model gives it over the whole stream."""
    from gpuflight.producer.contract.costs import busy_gpu_ns

    rows = []
    for k in range(5):  # 10 launches, then a 100 µs sync; five times
        t0 = 1_000 + k * 200_000
        rows += [call(t0 + 10 * i) for i in range(10)]
        rows.append(call(t0 + 500, type_=EventType.SYNC, duration_ns=100_000))
    events = build_events(rows)
    truth = busy_gpu_ns(events).per_event
    for cuts in ([], [3], [10, 11], [5, 27, 40, 52]):
        samples = _samples()
        samples.add_frames(_frames(1))
        samples.add_samples(_heads(*((1, 1, int(t)) for t in events["ts_ns"])))
        for part in np.split(events, cuts):
            samples.add_events(part)
            samples.end_turn()
        (values,) = _values(samples).values()
        assert values["gpu_ns"] == pytest.approx(truth.sum()), cuts
        assert values["calls"] == len(events) and samples.unjoined == 0


def test_each_path_gets_its_own_calls_costs_weighted_and_priced() -> None:
    samples = _samples()
    samples.add_frames(_frames(1))
    samples.add_frames(_frames(2, depth=3))
    events = build_events([
        call(100),                                                       # launch, stack 1
        call(200, type_=EventType.MEMCPY, bytes=4096, dim=[1, 0, 0, 0, 0, 0],
             flags=F_ASYNC),                                             # H2D, stack 2
        call(300, type_=EventType.MEMCPY, bytes=1000, dim=[2, 0, 0, 0, 0, 0],
             flags=F_HAS_RESULT, duration_ns=50),                        # sync D2H: drains
        call(400, tid=2),                                                # not sampled
    ])
    samples.add_events(events)
    samples.add_samples(_heads((1, 3, 100), (2, 2, 200), (2, 1, 300)))
    got = _values(samples, usd_per_gpu_hour=3600.0)  # $1 a GPU-second: 1 µ$ a GPU-µs
    one, two = got[(UNKNOWN, UNKNOWN)], got[(UNKNOWN, UNKNOWN, UNKNOWN)]
    # GPU time: the busy span [100, 350] (launch to the sync copy's return), split equally
    # over the three pieces of work in it (250 / 3 ns each), as requests are priced.
    assert one["launches"] == 3 and one["calls"] == 3 and one["bytes"] == 0
    assert one["gpu_ns"] == pytest.approx(3 * 250 / 3)
    assert two == pytest.approx({"launches": 0.0, "gpu_ns": 3 * 250 / 3,
                                 "bytes": 2 * 4096 + 1000.0, "blocked_ns": 50.0,
                                 "calls": 3.0, "cost": 3 * 250 / 3 / 1000,
                                 "launches_variance": 0.0})
    assert one["launches_variance"] == 3 * 2


def test_a_batch_of_several_processes_holds_each_apart() -> None:
    samples = _samples()
    samples.add_frames(_frames(1))
    other = {**call(150, type_=EventType.SYNC, duration_ns=10), "pid": PID + 1}
    samples.add_events(build_events([call(100), other, call(200, type_=EventType.SYNC,
                                                             duration_ns=50)]))
    samples.add_samples(_heads((1, 1, 100)))
    (values,) = _values(samples).values()
    # PID's span [100, 250] is its launch's alone: the other process's sync drains nothing.
    assert values["gpu_ns"] == 150 and values["launches"] == 1


def test_heads_match_only_their_own_thread_and_process() -> None:
    samples = _samples()
    samples.add_frames(_frames(1))
    samples.add_events(build_events([call(100, tid=2), {**call(100), "pid": PID + 1}]))
    samples.add_samples(_heads((1, 5, 100)))  # tid 1 of PID: neither event is its call
    (values,) = _values(samples).values()
    assert values["calls"] == 5 and values["launches"] == 0
    assert samples.unjoined == 1


def test_a_head_finds_events_priced_in_the_last_turn_not_older_ones() -> None:
    samples = _samples()
    samples.add_frames(_frames(1))
    sync = EventType.SYNC
    samples.add_events(build_events([call(100, type_=sync, duration_ns=5)]))  # priced now
    samples.end_turn()
    samples.add_events(build_events([call(200, type_=sync, duration_ns=7)]))
    samples.end_turn()
    samples.add_samples(_heads((1, 1, 200), (1, 1, 100)))  # 100's turn is gone
    (values,) = _values(samples).values()
    assert values["blocked_ns"] == 7 and values["calls"] == 2 and samples.unjoined == 1


def test_heads_waiting_for_events_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pysamples, "MAX_UNJOINED", 2)
    samples = _samples()
    samples.add_frames(_frames(1))
    samples.add_samples(_heads((1, 1, 100), (1, 1, 200), (1, 1, 300)))
    assert samples.unjoined == 1  # the oldest, at once
    samples.add_events(build_events([call(100), call(200), call(300)]))
    (values,) = _values(samples).values()
    assert values["launches"] == 2 and values["calls"] == 3


def test_heads_wait_for_their_frames_and_the_rest_are_counted_unknown() -> None:
    samples = _samples()
    samples.add_events(build_events([call(100), call(200), call(300)]))
    samples.add_samples(_heads((1, 10, 100), (1, 10, 200), (2, 5, 300)))  # before the frames
    samples.add_frames(_frames(1))
    (path,) = samples.samples()
    assert path.values["launches"] == 20.0 and path.values["calls"] == 20.0
    assert path.frames == (UNKNOWN, UNKNOWN)  # no layout known: named as unknown code
    assert samples.unknown_stacks == 1  # stack 2's frames never came


def test_a_process_with_no_cpython_is_one_frame_that_says_so() -> None:
    samples = _samples()
    samples.add_frames(_frames(3, flags=NEW | NO_PYTHON, depth=0))
    samples.add_events(build_events([call(100)]))
    samples.add_samples(_heads((3, 1, 100)))
    (path,) = samples.samples()
    assert path.frames == (NO_FRAMES,) and path.values["launches"] == 1.0


def test_a_backward_threads_call_is_under_the_stack_that_entered_the_pass() -> None:
    """An autograd device thread's call walked from the thread that entered the engine
    (BACKWARD): that thread's frames, then the mark, then the call's native caller; the same
    thread's call with no pass known to be running has no Python frames."""
    gemm = PathFrame("at::native::gemm", "libtorch_cuda.so", None)
    samples = StackSamples(DEPTH, lambda pid: None, lambda pid: None, clock_offset_ns=OFFSET,
                           native=lambda pid, address: gemm)
    entered, alone = _frames(1, flags=NEW | BACKWARD), _frames(2, depth=0)
    entered[0]["caller"] = alone[0]["caller"] = 0x7F00_1234
    samples.add_frames(entered)
    samples.add_frames(alone)
    samples.add_events(build_events([call(100), call(200)]))
    samples.add_samples(_heads((1, 1, 100), (2, 1, 200)))
    assert {p.frames for p in samples.samples()} == {
        (UNKNOWN, UNKNOWN, IN_BACKWARD, gemm), (NO_FRAMES, gemm)}
    assert IN_BACKWARD.folded() == "[autograd backward]"  # a mark has no place to name


def test_the_native_caller_is_each_paths_leaf() -> None:
    gemm = PathFrame("at::native::gemm", "libtorch_cuda.so", None)
    asked: list[tuple[int, int]] = []

    def native(pid: int, address: int) -> PathFrame:
        asked.append((pid, address))
        return gemm

    samples = StackSamples(DEPTH, lambda pid: None, lambda pid: None, clock_offset_ns=OFFSET,
                           native=native)
    python, no_python, no_caller = _frames(1), _frames(2, flags=NEW | NO_PYTHON, depth=0), \
        _frames(3)
    python[0]["caller"] = no_python[0]["caller"] = 0x7F00_1234
    for frames in (python, no_python, no_caller):
        samples.add_frames(frames)
    samples.add_events(build_events([call(100), call(200), call(300)]))
    samples.add_samples(_heads((1, 1, 100), (2, 1, 200), (3, 1, 300)))
    got = {p.frames for p in samples.samples()}
    assert got == {(UNKNOWN, UNKNOWN, gemm), (gemm,), (UNKNOWN, UNKNOWN)}
    assert asked == [(PID, 0x7F00_1234)] * 2  # a stack with no caller read asks nothing


def test_the_agent_takes_each_processs_paths_and_forgets_an_exited_one() -> None:
    samples = _samples()
    samples.publish()
    samples.add_frames(_frames(1))
    samples.add_events(build_events([call(100), call(300)]))  # launches: held, no drain yet
    samples.add_samples(_heads((1, 4, 100), (1, 4, 300), (9, 2, 999)))
    assert samples.take_paths() == {}  # nothing priced: the busy span is open
    samples.add_events(build_events([call(500, type_=EventType.SYNC, duration_ns=100)]))
    (path,) = samples.take_paths()[PID]
    assert path.values == {"launches": 8.0, "gpu_ns": 8.0 * (600 - 100) / 2, "calls": 8.0}
    assert path.ts_ns == 300 and path.frames == (("[unknown code]", "", None),) * 2
    assert samples.take_paths() == {}  # taken once
    samples.forget(PID)  # the head of 999 never found its call: calls alone, said
    (unknown,) = samples.take_paths()[PID]
    assert unknown.frames == (("[unknown stack]", "", None),)
    assert unknown.values == {"calls": 2.0} and samples.unjoined == 1
    assert unknown.ts_ns == 999  # when the call was made: its window
    assert samples._frames == {} and samples._values == {}  # nothing kept for ever


def test_a_line_read_out_of_range_is_published_as_none() -> None:
    from gpuflight.producer.decode.pysamples import _line

    assert [_line(x) for x in (0, 41, -3, 2**31, None)] == [0, 41, None, None, None]


def test_published_paths_are_per_route_a_shared_call_split_by_its_shares() -> None:
    """With the requests each event was made for, a stack's sampled calls give each route
    its calls' cost (a call shared by requests in flight: each its share), and the calls made
    for no request a path of no route; the routes of a stack sum to it. Each request gets
    its share too (its span), once."""
    from gpuflight.producer.http.attribution import CallShares

    samples = _samples()
    samples.publish()
    samples.per_request = True
    samples.add_frames(_frames(1))
    events = build_events([call(100), call(200), call(300), call(400, type_=EventType.SYNC,
                                                                 duration_ns=100)])
    # 100: request 7 of /a; 200: 7, 8 of /a and 9 of /b in flight; 300, 400: none.
    sets = ((), ((7, "/a", 1.0),), ((7, "/a", 1 / 3), (8, "/a", 1 / 3), (9, "/b", 1 / 3)))
    samples.add_events(events, CallShares(np.array([1, 2, 0, 0]), sets))
    samples.add_samples(_heads((1, 3, 100), (1, 3, 200), (1, 3, 300)))
    (seven,) = samples.take_request_paths(7)
    assert seven.values["launches"] == pytest.approx(3 + 1) and seven.values["calls"] == 4
    assert samples.take_request_paths(7) == []  # taken once
    assert samples.take_request_paths(9)[0].values["launches"] == pytest.approx(1)
    paths = {p.route: p for p in samples.take_paths()[PID]}
    assert set(paths) == {"/a", "/b", None}
    assert paths["/a"].values["launches"] == pytest.approx(3 + 3 * 2 / 3)
    assert paths["/b"].values["launches"] == pytest.approx(3 / 3)
    assert paths[None].values["launches"] == 3
    assert sum(p.values["calls"] for p in paths.values()) == pytest.approx(9)
    assert {p.frames for p in paths.values()} == {(("[unknown code]", "", None),) * 2}
    assert paths["/b"].ts_ns == 200 and paths[None].ts_ns == 300


def test_what_calls_were_made_for_is_kept_no_longer_than_their_events(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch's requests are kept while an event of it is held or may still be joined
    (priced in this turn or the last); requests' paths never taken are bounded."""
    from gpuflight.producer.http.attribution import CallShares

    monkeypatch.setattr(pysamples, "MAX_REQUESTS_KEPT", 1)
    samples = _samples()
    samples.per_request = True
    samples.add_frames(_frames(1))
    one = CallShares(np.array([1]), ((), ((7, "/a", 1.0),)))
    samples.add_events(build_events([call(100)]), one)  # held: no drain yet
    samples.end_turn()
    assert list(samples._calls.values()) == [((7, "/a", 1.0),)]
    samples.add_events(build_events([call(200, type_=EventType.SYNC, duration_ns=10)]),
                       CallShares(np.array([1]), ((), ((8, "/b", 1.0),))))  # priced: both
    samples.end_turn()
    assert len(samples._calls) == 2  # priced in the last turn: a head may still come
    samples.add_samples(_heads((1, 1, 100), (1, 1, 200)))
    samples.end_turn()
    samples.end_turn()
    assert samples._calls == {}
    # Request 7's paths were pushed out by 8's (one kept): dropped, counted.
    assert samples.take_request_paths(7) == [] and samples.request_paths_dropped == 1
    assert samples.take_request_paths(8)[0].values["calls"] == 1


def test_a_turn_s_samples_summed_per_stack_are_each_call_s_costs_added_one_by_one() -> None:
    """Calls made for no request are added per (process, stack) at once; with requests to
    follow (per_request), call by call: the paths are the same either way, on random turns of
    launches, copies and syncs from three threads over four stacks."""
    rng = np.random.default_rng(28)
    kinds = (EventType.LAUNCH, EventType.MEMCPY, EventType.SYNC)
    rows = [call(1_000 + 100 * i, tid=int(rng.integers(1, 4)), type_=kinds[int(k)],
                 bytes=int(rng.integers(0, 1 << 20)), duration_ns=int(rng.integers(0, 90)))
            for i, k in enumerate(rng.integers(0, 3, 600))]
    events = build_events(rows)
    sampled = rng.random(len(events)) < 0.7
    heads = _heads(*((int(rng.integers(1, 5)), int(rng.integers(1, 40)), int(e["ts_ns"]),
                      int(e["tid"])) for e in events[sampled]))
    cuts = sorted(rng.choice(np.arange(1, len(events)), 5, replace=False).tolist())
    got = []
    for per_request in (False, True):
        samples = _samples()
        samples.per_request = per_request
        for stack_id in range(1, 5):
            samples.add_frames(_frames(stack_id, depth=stack_id))
        for part, part_heads in zip(np.split(events, cuts), np.split(heads, cuts), strict=True):
            samples.add_events(part)
            samples.add_samples(part_heads)
            samples.end_turn()
        got.append(_values(samples))
        assert samples.unjoined == 0
    summed, one_by_one = got
    assert summed.keys() == one_by_one.keys() and len(summed) == 4
    for frames, values in summed.items():
        assert values == pytest.approx(one_by_one[frames], rel=1e-12), frames
    assert sum(v["calls"] for v in summed.values()) == heads["weight"].sum()
