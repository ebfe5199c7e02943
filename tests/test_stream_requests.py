"""streams/requests.py: requests and cost per (window, job, route), pure (no Faust, no Kafka)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producer.records import API_IDS, EVENT_DTYPE, F_ASYNC, F_HAS_RESULT, EventType
from streams import measurements as m
from streams import requests as rq
from streams.measurements import Fields, Tags
from streams.requests import Attributed, Done, Labels, RequestLedger, RequestWindow

W = 1_000_000_000
T0 = 1_700_000_000 * W


def calls(*rows: tuple[int, str, int]) -> npt.NDArray[np.void]:
    """(ts, "L" launch | "S" sync | "C" synchronous H2D copy, duration or bytes)."""
    out = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, (ts, kind, value) in enumerate(rows):
        out["ts_ns"][i] = ts
        out["pid"][i] = out["tid"][i] = 7
        if kind == "L":
            out["type"][i] = EventType.LAUNCH
            out["api"][i] = API_IDS["cudaLaunchKernel"]
            out["flags"][i] = F_ASYNC
            out["dim"][i] = [4, 1, 1, 32, 1, 1]
        elif kind == "S":
            out["type"][i] = EventType.SYNC
            out["api"][i] = API_IDS["cudaDeviceSynchronize"]
            out["flags"][i] = F_HAS_RESULT
            out["duration_ns"][i] = value
        else:
            out["type"][i] = EventType.MEMCPY
            out["api"][i] = API_IDS["cudaMemcpy"]
            out["flags"][i] = F_HAS_RESULT
            out["bytes"][i] = value
            out["duration_ns"][i] = 1000
            out["dim"][i, 0] = 1
    return out


class Windows:
    """Open windows of one job, as JobState keeps them; `close` closes up to a time."""

    def __init__(self) -> None:
        self.open: dict[int, RequestWindow] = {}
        self.closed_before = 0

    def __call__(self, start: int) -> RequestWindow | None:
        if start < self.closed_before:
            return None
        return self.open.setdefault(start, RequestWindow())


def done(rid: int, route: str, start: int, end: int, status: int = 200,
         trace: str | None = None) -> Done:
    return Done(rid, route, "POST", status, start, end, 100, 2000, trace,
                None if trace is None else "00f067aa0ba902b7")


def test_exact_calls_sum_into_their_request_and_route() -> None:
    ledger, wins = RequestLedger(), Windows()
    # Request 1 (/infer): 2 launches drained by a 8 us sync: 10 us of GPU time, 5 each.
    # Request 2 (/embed): 1 launch and a copy of 4 KiB; then work of no request.
    ev = calls((T0, "L", 0), (T0 + 1000, "L", 0), (T0 + 2000, "S", 8000),
               (T0 + 20_000, "L", 0), (T0 + 21_000, "C", 4096),
               (T0 + 50_000, "L", 0), (T0 + 51_000, "S", 1000))
    rid = np.array([1, 1, 1, 2, 2, 0, 0], dtype=np.uint64)
    costs = rq.call_costs(ev)
    late = ledger.add_calls(ev, costs, Attributed(rid), W, wins)
    assert late == rq.Late()
    assert set(ledger.open) == {1, 2}
    assert ledger.open[1].costs == [2.0, 10_000.0, 0.0]
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    ledger.finish([done(1, "/infer", T0 - 500, T0 + 11_000),
                   done(2, "/embed", T0 + 19_000, T0 + 30_000, trace=trace)], W, wins)
    assert ledger.open == {}
    win = wins.open[T0]
    infer, embed = win.routes["/infer"], win.routes["/embed"]
    assert (infer.requests, infer.costs) == (1, [2.0, 10_000.0, 0.0])
    assert embed.costs[rq.LAUNCHES] == 1 and embed.costs[rq.BYTES] == 4096
    # Σ requests' GPU time + unattributed = the job's GPU time.
    assert win.gpu_ns == pytest.approx(float(costs[:, rq.GPU_NS].sum()))
    assert win.unattributed_gpu_ns == pytest.approx(float(costs[5:, rq.GPU_NS].sum()))
    assert win.unattributed_gpu_ns > 0
    assert infer.costs[rq.GPU_NS] + embed.costs[rq.GPU_NS] + win.unattributed_gpu_ns == \
        pytest.approx(win.gpu_ns)
    assert embed.samples[0].trace_id == trace


def test_shared_calls_are_split_by_their_shares_and_sum_to_the_total() -> None:
    ledger, wins = RequestLedger(), Windows()
    ev = calls((T0, "L", 0), (T0 + 100, "L", 0), (T0 + 200, "L", 0), (T0 + 300, "S", 3000))
    shared = {i: [(10, 1 / 3), (11, 1 / 3), (12, 1 / 3)] for i in range(4)}
    costs = rq.call_costs(ev)
    ledger.add_calls(ev, costs, Attributed(np.zeros(4, np.uint64), shared), W, wins)
    ledger.finish([done(10, "/a", T0, T0 + 5000), done(11, "/a", T0, T0 + 6000),
                   done(12, "/b", T0, T0 + 7000)], W, wins)
    win = wins.open[T0]
    a, b = win.routes["/a"], win.routes["/b"]
    assert a.requests == 2 and b.requests == 1
    assert a.costs[rq.LAUNCHES] == pytest.approx(2.0) and b.costs[rq.LAUNCHES] == pytest.approx(1)
    assert a.costs[rq.GPU_NS] + b.costs[rq.GPU_NS] == pytest.approx(win.gpu_ns)
    assert win.unattributed_gpu_ns == 0


def test_calls_after_the_request_is_done_go_to_its_window_until_it_closes() -> None:
    ledger, wins = RequestLedger(), Windows()
    ledger.finish([done(5, "/a", T0, T0 + 10)], W, wins)
    later = calls((T0 + W + 5, "L", 0), (T0 + W + 6, "S", 100))
    ledger.add_calls(later, rq.call_costs(later), Attributed(np.array([5, 5], np.uint64)), W,
                     wins)
    assert wins.open[T0].routes["/a"].costs[rq.LAUNCHES] == 1
    assert wins.open[T0].routes["/a"].samples[0].costs[rq.LAUNCHES] == 1
    assert wins.open[T0 + W].gpu_ns > 0 and wins.open[T0 + W].unattributed_gpu_ns == 0
    ledger.closed(T0, T0 + W, wins.open[T0])
    wins.closed_before = T0 + W
    assert ledger.done == {}
    more = calls((T0 + W + 50, "L", 0), (T0 + W + 60, "S", 100))
    ledger.add_calls(more, rq.call_costs(more), Attributed(np.array([5, 5], np.uint64)), W,
                     wins)
    # Its window closed and forgotten: the calls wait as those of a request not done yet,
    # then go to UNFINISHED_ROUTE (never lost, never counted as a request).
    assert ledger.open[5].costs[rq.LAUNCHES] == 1
    final = wins(T0 + 30 * W)
    assert final is not None
    ledger.closed(T0 + 30 * W, T0 + 30 * W + rq.DEFAULT_MAX_OPEN_NS + W, final)
    assert final.routes[rq.UNFINISHED_ROUTE].costs[rq.GPU_NS] == pytest.approx(
        float(rq.call_costs(more)[:, rq.GPU_NS].sum()))
    # Requests and calls of closed windows are late, counted and kept out.
    late = ledger.finish([done(6, "/a", T0, T0 + 20)], W, wins)
    assert late.requests == 1


def test_requests_never_done_are_kept_apart_not_lost() -> None:
    ledger, wins = RequestLedger(max_open_ns=5 * W), Windows()
    ev = calls((T0, "L", 0), (T0 + 10, "S", 90))
    ledger.add_calls(ev, rq.call_costs(ev), Attributed(np.array([9, 9], np.uint64)), W, wins)
    win = wins(T0 + 10 * W)
    assert win is not None
    ledger.closed(T0 + 10 * W, T0 + 11 * W, win)
    stats = win.routes[rq.UNFINISHED_ROUTE]
    assert stats.requests == 0 and stats.costs[rq.GPU_NS] == 100 and ledger.open == {}


def test_latency_percentiles_are_within_the_bucket_error() -> None:
    stats = rq.RouteStats()
    latencies = [1_000_000 * (i + 1) for i in range(100)]  # 1..100 ms
    for i, lat in enumerate(latencies):
        stats.add(done(i + 1, "/a", T0, T0 + lat), [0.0, 0.0, 0.0])
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
@given(st.lists(st.tuples(st.integers(0, 3 * W - 1), st.integers(0, 4),
                          st.sampled_from("LSC")), min_size=1, max_size=40),
       st.integers(1, 39))
def test_in_parts_and_through_dicts_is_at_once(rows: list[tuple[int, int, str]],
                                               cut: int) -> None:
    rows = sorted(rows)
    ev = calls(*((T0 + t, kind, 500) for t, _, kind in rows))
    rid = np.array([r for _, r, _ in rows], dtype=np.uint64)
    finished = [done(r, f"/r{r % 2}", T0, T0 + 2 * W + r) for r in range(1, 5)]
    costs = rq.call_costs(ev)

    def run(parts: list[slice]) -> dict[str, Any]:
        ledger, wins = RequestLedger(), Windows()
        for part in parts:
            # Each part through the changelog's dicts, as a restarted worker would see it.
            ledger = RequestLedger.from_dict(ledger.to_dict())
            for start in list(wins.open):
                wins.open[start] = RequestWindow.from_dict(wins.open[start].to_dict())
            ledger.add_calls(ev[part], costs[part], Attributed(rid[part]), W, wins)
        ledger.finish(finished, W, wins)
        return {s: w.to_dict() for s, w in sorted(wins.open.items())}

    whole = run([slice(None)])
    parts = run([slice(0, cut), slice(cut, None)])
    assert _rounded(whole) == _rounded(parts)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def test_merge_is_exact() -> None:
    a, b = rq.RouteStats(), rq.RouteStats()
    for i in range(30):
        (a if i % 3 else b).add(done(i + 1, "/a", T0, T0 + 1000 * (i + 1)), [1.0, 2.0, 3.0])
    whole = rq.RouteStats()
    for i in range(30):
        whole.add(done(i + 1, "/a", T0, T0 + 1000 * (i + 1)), [1.0, 2.0, 3.0])
    a.merge_from(b)
    assert a.to_list() == whole.to_list()


def test_points_and_cost_by_hand() -> None:
    """H100 at 3.00 USD per GPU-hour: 1.2 GPU-seconds of two /infer requests cost
    1.2 · 3 / 3600 = 0.001 USD, 0.0005 each; the job's 1.5 GPU-seconds cost 0.00125."""
    win = RequestWindow(gpu_ns=1.5e9, unattributed_gpu_ns=0.3e9)
    infer = win.route("/infer")
    infer.add(done(1, "/infer", T0, T0 + 40_000_000, trace="4bf92f3577b34da6a3ce929d0e0e4736"),
              [10.0, 0.5e9, 1000.0])
    infer.add(done(2, "/infer", T0, T0 + 80_000_000, status=503), [30.0, 0.7e9, 3000.0])
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


def test_malformed_dicts_are_value_errors() -> None:
    with pytest.raises(ValueError, match="version"):
        RequestWindow.from_dict({"v": 99})
    with pytest.raises(ValueError, match="malformed"):
        RequestWindow.from_dict({"v": rq.DICT_VERSION, "routes": {"/a": [1]}, "gpu_ns": 0,
                                 "unattributed_gpu_ns": 0})
    with pytest.raises(ValueError, match="malformed"):
        RequestLedger.from_dict({"v": rq.DICT_VERSION, "open": [[1]], "done": [],
                                 "max_open_ns": 1})
