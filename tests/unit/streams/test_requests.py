"""streams/requests.py: requests and cost per (window, job, route), pure (no Faust, no Kafka)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflight.producer.contract.abi import EVENT_DTYPE
from gpuflight.producer.contract.wire import RequestRecord
from gpuflight.streams import measurements as m
from gpuflight.streams import requests as rq
from gpuflight.streams.measurements import Fields, Tags
from gpuflight.streams.requests import Labels, RequestWindow

W = 1_000_000_000
T0 = 1_700_000_000 * W


class Windows:
    """Open windows of one job, as JobState keeps them."""

    def __init__(self) -> None:
        self.open: dict[int, RequestWindow] = {}
        self.closed_before = 0

    def __call__(self, start: int) -> RequestWindow | None:
        if start < self.closed_before:
            return None
        return self.open.setdefault(start, RequestWindow())


def done(rid: int, route: str, start: int, end: int, *, status: int = 200,
         trace: str | None = None, **cost: float) -> RequestRecord:
    return RequestRecord(rid, 7, "POST", route.replace("{id}", "12"), route, status, start, end,
                         100, 2000, trace, None if trace is None else "00f067aa0ba902b7", True,
                         8000, cost)


def test_requests_count_in_the_window_of_their_end_with_their_cost() -> None:
    wins = Windows()
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    late = rq.add_requests([
        done(1, "/infer", T0 - 500, T0 + 11_000, launches=2, gpu_ns=10_000, h2d_bytes=64),
        done(2, "/embed/{id}", T0 + 19_000, T0 + W + 30, trace=trace, launches=0.5,
             gpu_ns=2500.5, d2h_bytes=4096, d2d_bytes=4, other_copy_bytes=1, memset_bytes=99),
        done(3, "/infer", T0, T0 + 20_000, status=0, launches=1, gpu_ns=1),
    ], W, wins)
    assert late == []
    assert rq.add_unattributed({"gpu_ns": 700.0, "launches": 3}, T0 + 5, W, wins)
    assert rq.add_unattributed({}, T0 - 5 * W, W, wins)  # nothing to count: no window made
    first, second = wins.open[T0], wins.open[T0 + W]
    assert set(wins.open) == {T0, T0 + W}
    infer = first.routes["/infer"]
    assert (infer.requests, infer.server_errors, infer.costs) == (2, 1, [3.0, 10_001.0, 64.0])
    embed = second.routes["/embed/{id}"]
    assert embed.costs == [0.5, 2500.5, 4101.0]  # memset is no copy
    assert embed.samples[0].trace_id == trace and embed.bytes_in == 100
    assert first.unattributed_gpu_ns == 700 and first.gpu_ns == 10_701
    # A closed window takes nothing: its requests and cost are late.
    wins.closed_before = T0 + W
    old = done(9, "/infer", T0, T0 + 5, gpu_ns=1)
    assert rq.add_requests([old], W, wins) == [old]
    assert not rq.add_unattributed({"gpu_ns": 1.0}, T0 + 5, W, wins)
    assert first.routes["/infer"].requests == 2 and first.unattributed_gpu_ns == 700


def test_latency_percentiles_are_within_the_bucket_error() -> None:
    stats = rq.RouteStats()
    latencies = [1_000_000 * (i + 1) for i in range(100)]  # 1..100 ms
    for i, lat in enumerate(latencies):
        stats.add(done(i + 1, "/a", T0, T0 + lat))
    p50 = rq.latency_percentile(stats.latency, 0.5)
    p99 = rq.latency_percentile(stats.latency, 0.99)
    assert p50 is not None and p99 is not None
    error = 2 ** (1 / rq.LATENCY_STEPS / 2)
    assert 50e6 / error <= p50 <= 50e6 * error
    assert 99e6 / error <= p99 <= 99e6 * error
    assert rq.latency_percentile({}, 0.5) is None
    # The slowest are kept, slowest first.
    assert [s.latency_ns for s in stats.samples] == sorted(latencies, reverse=True)[
        : m.REQUEST_SAMPLES]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * W - 1), st.integers(0, 3 * W),
                          st.sampled_from(["/a", "/b/{id}"]), st.floats(0, 1e9),
                          st.integers(0, 600)), min_size=1, max_size=40),
       st.integers(0, 40))
def test_in_parts_and_through_dicts_is_at_once(
        rows: list[tuple[int, int, str, float, int]], cut: int) -> None:
    requests = [done(i + 1, route, T0 + start, T0 + start + took, status=status, gpu_ns=gpu)
                for i, (start, took, route, gpu, status) in enumerate(rows)]

    def run(parts: list[list[RequestRecord]]) -> dict[int, Any]:
        wins = Windows()
        for part in parts:
            # Each part through the changelog's dicts, as a restarted worker would see it.
            for start in list(wins.open):
                wins.open[start] = RequestWindow.from_dict(wins.open[start].to_dict())
            rq.add_requests(part, W, wins)
            rq.add_unattributed({"gpu_ns": float(len(part))}, T0, W, wins)
        return {s: w.to_dict() for s, w in sorted(wins.open.items())}

    whole = run([requests, []])
    parts = run([requests[:cut], requests[cut:]])
    assert _rounded(whole) == _rounded(parts)
    merged = RequestWindow()
    for part in (requests[:cut], requests[cut:]):
        wins = Windows()
        rq.add_requests(part, W, wins)
        for w in wins.open.values():
            merged.merge_from(w)
    together = RequestWindow()
    rq.add_requests(requests, W, lambda _: together)
    assert _rounded(merged.to_dict()) == _rounded(together.to_dict())


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def test_points_and_cost_by_hand() -> None:
    """H100 at 3.00 USD per GPU-hour: 1.2 GPU-seconds of two /infer requests cost
    1.2 · 3 / 3600 = 0.001 USD, 0.0005 each; the job's 1.5 GPU-seconds cost 0.00125."""
    win = RequestWindow(unattributed_gpu_ns=0.3e9)
    infer = win.route("/infer")
    infer.add(done(1, "/infer", T0, T0 + 40_000_000, trace="4bf92f3577b34da6a3ce929d0e0e4736",
                   launches=10, gpu_ns=0.5e9, h2d_bytes=1000))
    infer.add(done(2, "/infer", T0, T0 + 80_000_000, status=503, launches=30, gpu_ns=0.7e9,
                   d2h_bytes=3000))
    points = rq.to_points(win, T0, host="h", job="k8s:ml/serve-0",
                          labels=Labels("ml", "search"), window_s=10.0, usd_per_gpu_hour=3.0)
    for p in points:
        m.validate(p)
    by = {(p.measurement, p.tags.get(Tags.RANK)): p for p in points}
    route = by[(m.ROUTES.name, None)]
    assert route.tags == {Tags.HOST: "h", Tags.JOB: "k8s:ml/serve-0", Tags.NAMESPACE: "ml",
                          Tags.TEAM: "search", Tags.ROUTE: "/infer"}
    f = route.fields
    assert f[Fields.REQUESTS] == 2 and f[Fields.SERVER_ERRORS] == 1
    assert f[Fields.LAUNCHES_PER_REQUEST] == 20.0
    assert f[Fields.GPU_SECONDS_PER_REQUEST] == pytest.approx(0.6)
    assert f[Fields.BYTES_PER_REQUEST] == 2000.0
    assert f[Fields.COST_USD] == pytest.approx(0.001)
    assert f[Fields.COST_PER_REQUEST_USD] == pytest.approx(0.0005)
    assert f[Fields.COST_PER_HOUR_USD] == pytest.approx(0.36)
    assert f[Fields.BYTES_IN] == 200 and f[Fields.BYTES_OUT] == 4000
    p99 = float(f[Fields.LATENCY_P99_NS])
    assert math.isclose(p99, 80e6, rel_tol=0.05)
    slowest = by[(m.REQUEST_SAMPLES_M.name, "0")].fields
    assert slowest[Fields.REQUEST_ID] == "0000000000000002" and slowest[Fields.STATUS] == 503
    assert Fields.TRACE_ID not in slowest
    traced = by[(m.REQUEST_SAMPLES_M.name, "1")].fields
    assert traced[Fields.TRACE_ID] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert traced[Fields.COST_USD] == pytest.approx(0.5 * 3 / 3600)
    job = by[(m.JOB_COST.name, None)]
    assert job.tags[Tags.TEAM] == "search"
    assert job.fields[Fields.COST_USD] == pytest.approx(0.00125)
    assert job.fields[Fields.UNATTRIBUTED_SHARE] == pytest.approx(0.2)
    assert job.fields[Fields.UNPRICED_GPU_NS] == 0.0
    # No price for its GPU: no cost, and the GPU time says it went unpriced.
    unpriced = rq.to_points(win, T0, host="h", job="j", labels=Labels(), window_s=10.0,
                            usd_per_gpu_hour=None)
    (job_point,) = [p for p in unpriced if p.measurement == m.JOB_COST.name]
    assert job_point.fields[Fields.UNPRICED_GPU_NS] == 1.5e9
    assert job_point.tags[Tags.NAMESPACE] == m.NO_LABEL


def test_a_slow_request_names_the_function_that_cost_it_most_and_an_old_state_reads() -> None:
    import dataclasses

    win = RequestWindow()
    named = dataclasses.replace(done(1, "/infer", T0, T0 + 9_000, launches=3, gpu_ns=5.0),
                                code_paths=(("Model.forward (srv/model.py)", 3.0, 5.0),))
    win.route("/infer").add(named)
    win.route("/infer").add(done(2, "/infer", T0, T0 + 1_000, launches=1))
    back = RequestWindow.from_dict(orjson.loads(orjson.dumps(win.to_dict())))
    samples = {p.fields[Fields.REQUEST_ID]: p.fields for p in rq.to_points(
        back, T0, host="h", job="j", labels=Labels(), window_s=1.0, usd_per_gpu_hour=None)
        if p.measurement == m.REQUEST_SAMPLES_M.name}
    assert samples["0000000000000001"][Fields.TOP_FUNCTION] == "Model.forward (srv/model.py)"
    assert Fields.TOP_FUNCTION not in samples["0000000000000002"]
    # A sample stored before top_function (seven items) reads as one without it.
    old = rq.Sample.from_list([5, "GET", 200, 10, None, None, [0.0] * len(rq.COSTS)])
    assert old.top_function is None and old.latency_ns == 10


def test_malformed_dicts_are_value_errors() -> None:
    with pytest.raises(ValueError, match="version"):
        RequestWindow.from_dict({"v": 99})
    with pytest.raises(ValueError, match="malformed"):
        RequestWindow.from_dict({"v": rq.DICT_VERSION, "routes": {"/a": [1]},
                                 "unattributed_gpu_ns": 0})


def test_a_job_state_counts_requests_once_across_restarts_and_prices_them() -> None:
    from gpuflight.streams.windows import JobState, WindowSettings

    settings = WindowSettings(window_s=1.0, grace_s=0.0)
    state = JobState("h", "serve:1", 0, labels=Labels("ml", m.NO_LABEL))
    empty = np.zeros(0, dtype=EVENT_DTYPE)
    batch = [done(1, "/a", T0, T0 + 10, gpu_ns=3.6e9), done(2, "/a", T0, T0 + 20, gpu_ns=1.8e9)]
    assert state.apply(empty, 0, 5, settings, requests=batch,
                       unattributed={"gpu_ns": 0.6e9}).late_requests == 0
    state = JobState.from_bytes(state.to_bytes(), settings)  # a restart: the changelog's
    assert state.apply(empty, 0, 5, settings, requests=batch).duplicate  # redelivered
    writes, _ = state.due(T0 + 2 * W, settings, gpu_price=lambda host, job: 3.0)
    (final,) = writes
    route = [p for p in final.points if p.measurement == m.ROUTES.name]
    (only,) = route
    assert only.fields[Fields.REQUESTS] == 2
    assert only.fields[Fields.COST_USD] == pytest.approx(5.4 * 3 / 3600)
    (job,) = [p for p in final.points if p.measurement == m.JOB_COST.name]
    assert job.tags[Tags.NAMESPACE] == "ml"
    assert job.fields[Fields.GPU_NS] == pytest.approx(6.0e9)
    assert job.fields[Fields.UNATTRIBUTED_SHARE] == pytest.approx(0.1)
    # A request of a window closed already is late: not counted.
    late = state.apply(empty, 0, 6, settings, requests=[done(3, "/a", T0, T0 + 30)])
    assert late.late_requests == 1


def test_a_window_keeps_max_routes_and_counts_the_rest_as_other() -> None:
    """5,000 routes in one job were 5,000 series a window, and ~1.15 KB each in the job's
    state (undurable past 1 MB: a pod with ~900 routes). A (window, job) keeps MAX_ROUTES;
    the requests of the others count under "other", and merging keeps the bound."""
    windows = Windows()
    batch = [done(i + 1, f"/r{i}", T0, T0 + 10, gpu_ns=1.0) for i in range(5000)]
    assert rq.add_requests(batch, W, windows) == []
    (win,) = windows.open.values()
    assert len(win.routes) == rq.MAX_ROUTES + 1
    assert win.routes[rq.OTHER_ROUTE].requests == 5000 - rq.MAX_ROUTES
    assert sum(s.requests for s in win.routes.values()) == 5000
    assert math.fsum(s.costs[rq.GPU_NS] for s in win.routes.values()) == 5000.0
    more = RequestWindow()
    rq.add_requests([done(9000 + i, f"/x{i}", T0, T0 + 10) for i in range(300)], W,
                    lambda start: more)
    win.merge_from(more)
    assert len(win.routes) == rq.MAX_ROUTES + 1
    assert sum(s.requests for s in win.routes.values()) == 5300
    assert len(rq.to_points(win, T0, host="h", job="j", labels=Labels(), window_s=1.0,
                            usd_per_gpu_hour=None)) < 2 * (rq.MAX_ROUTES + 1) * (
                                m.REQUEST_SAMPLES + 1)


def test_a_cost_stored_as_null_is_read_as_zero_not_a_state_dropped() -> None:
    """JSON has no infinity: a cost that summed to it was written as null, and the whole job
    state was dropped when a restarted worker read it. Costs are bounded at decode now
    (producer/contract/wire.py); one stored so before reads as 0."""
    win = RequestWindow()
    win.route("/a").add(done(1, "/a", T0, T0 + 10, gpu_ns=5.0))
    win.unattributed_gpu_ns = math.inf
    data = orjson.loads(orjson.dumps(win.to_dict()))
    assert data["unattributed_gpu_ns"] is None
    data["routes"]["/a"][4][1] = None
    back = RequestWindow.from_dict(data)
    assert back.unattributed_gpu_ns == 0.0 and back.routes["/a"].costs[rq.GPU_NS] == 0.0
    assert back.routes["/a"].requests == 1


def test_one_message_of_requests_over_many_windows_makes_a_bounded_state() -> None:
    """As its events (tests/unit/streams/test_windows.py), a message's requests add to at most
    max_windows_per_message windows; those ending in others are not counted."""
    from gpuflight.streams.windows import JobState, WindowSettings

    settings = WindowSettings(window_s=1.0, grace_s=1.0)
    state = JobState("h", "serve:1", 0)
    batch = [done(i + 1, "/a", T0 + i * W, T0 + i * W + 10) for i in range(5000)]
    applied = state.apply(np.zeros(0, dtype=EVENT_DTYPE), 0, 0, settings, requests=batch)
    assert len(state.windows) == settings.max_windows_per_message
    assert applied.late_requests == 5000 - settings.max_windows_per_message
