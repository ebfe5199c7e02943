"""producer/http/attribution.py: CUDA events to requests, and what each request cost (pure)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflight.producer.contract.abi import (
    F_ASYNC,
    F_CAPTURED,
    F_HAS_RESULT,
    EventType,
)
from gpuflight.producer.contract.costs import COST_FIELDS, busy_gpu_ns, event_costs, nvml_gpu_ns
from gpuflight.producer.http.attribution import (
    EXACT,
    OPEN_END,
    SHARED,
    UNATTRIBUTED,
    RequestTable,
    attribute,
    rollup,
    top_kernels,
)
from gpuflight.producer.http.parser import OpenRequest
from tests.support.builders import build_events, call

L, C, S, M, A, G, F = (EventType.LAUNCH, EventType.MEMCPY, EventType.SYNC, EventType.MEMSET,
                       EventType.ALLOC, EventType.GRAPH_LAUNCH, EventType.FREE)


def events(*rows: dict[str, Any]) -> npt.NDArray[np.void]:
    return build_events(rows)


ev = call


def table(*rows: tuple[int, int, int, int]) -> RequestTable:
    """(request_id, start, end, tid)"""
    return RequestTable(*(np.array(col, dtype=np.int64) for col in zip(*rows, strict=True)))


def test_thread_per_request_is_exact() -> None:
    reqs = table((101, 0, 100, 1), (102, 150, 300, 1), (201, 50, 250, 2))
    evs = events(ev(0, 1), ev(100, 1), ev(120, 1), ev(160, 1), ev(60, 2), ev(249, 2), ev(260, 2))
    attr = attribute(reqs, evs)
    assert attr.mode.tolist() == [EXACT, EXACT, SHARED, EXACT, EXACT, EXACT, SHARED]
    assert [attr.shares(i) for i in range(len(evs))] == [
        [(101, 1.0)], [(101, 1.0)], [(201, 1.0)], [(102, 1.0)], [(201, 1.0)], [(201, 1.0)],
        [(102, 1.0)]]
    # At 120 thread 1 serves nothing; the process has one request in flight (201): shared.
    assert attr.wire(2) == {"requests": [[201, 1.0]]} and attr.wire(0) == {"request_id": 101}
    assert attr.request_ids().tolist() == [101, 101, 0, 102, 201, 201, 0]


def test_one_thread_serving_several_requests_shares() -> None:
    """An event loop read three overlapping requests; a worker thread launches too."""
    reqs = table((1, 0, 100, 7), (2, 10, 50, 7), (3, 20, 200, 7))
    evs = events(ev(5, 7), ev(30, 7), ev(60, 8), ev(150, 8), ev(300, 7))
    attr = attribute(reqs, evs)
    assert attr.mode.tolist() == [EXACT, SHARED, SHARED, SHARED, UNATTRIBUTED]
    thirds = sorted(attr.shares(1))
    assert [rid for rid, _ in thirds] == [1, 2, 3]
    assert [share for _, share in thirds] == pytest.approx([1 / 3] * 3)
    assert sorted(attr.shares(2)) == [(1, 0.5), (3, 0.5)]
    # The worker thread (8) serves no request: what it does is the in-flight requests' share,
    # even when only one is in flight.
    assert attr.shares(3) == [(3, 1.0)]
    assert attr.wire(4) == {}


def test_a_thread_that_read_no_request_shares_even_with_one_in_flight() -> None:
    reqs = table((5, 0, 100, 1))
    attr = attribute(reqs, events(ev(50, 2), ev(50, 1)))
    assert attr.mode.tolist() == [SHARED, EXACT]
    assert attr.shares(0) == [(5, 1.0)]


def test_open_requests_are_in_flight() -> None:
    reqs = RequestTable.of([OpenRequest(77, 9, 3, 1000)])
    assert reqs.end_ns.tolist() == [OPEN_END]
    attr = attribute(reqs, events(ev(999, 3), ev(10**18, 3)))
    assert attr.mode.tolist() == [UNATTRIBUTED, EXACT]


def test_no_requests_or_no_events() -> None:
    assert attribute(table((1, 0, 1, 1)), events()).mode.tolist() == []
    empty = RequestTable(*(np.zeros(0, dtype=np.int64) for _ in range(4)))
    attr = attribute(empty, events(ev(1)))
    assert attr.mode.tolist() == [UNATTRIBUTED]
    r = rollup(attr, event_costs(events(ev(1))))
    assert r.per_request.shape == (0, len(COST_FIELDS)) and r.unattributed[0] == 1


def test_costs_of_each_kind_of_call() -> None:
    evs = events(
        ev(0, dim=[4, 2, 1, 128, 1, 1]),  # 8 blocks of 128 threads
        ev(1, flags=F_ASYNC | F_CAPTURED, dim=[9, 9, 9, 9, 9, 9]),  # captured: ran nothing
        ev(2, type_=G, dim=[5, 0, 0, 0, 0, 0]),  # a graph of 5 kernel nodes
        ev(3, type_=C, bytes=1000, dim=[1, 0, 0, 0, 0, 0], flags=F_ASYNC),
        ev(4, type_=C, bytes=2000, dim=[2, 0, 0, 0, 0, 0], flags=F_HAS_RESULT, duration_ns=70),
        ev(5, type_=C, bytes=300, dim=[3, 0, 0, 0, 0, 0], flags=F_ASYNC),
        ev(6, type_=C, bytes=40, dim=[4, 0, 0, 0, 0, 0], flags=F_ASYNC),
        ev(7, type_=M, bytes=512),
        ev(8, type_=A, bytes=4096, flags=F_HAS_RESULT),
        ev(9, type_=A, bytes=1, flags=F_HAS_RESULT, result=2),  # failed: no allocation
        ev(10, type_=S, duration_ns=500),
        ev(11, type_=F, bytes=4096),
    )
    costs = event_costs(evs)
    col = {name: costs[:, i].tolist() for i, name in enumerate(COST_FIELDS)}
    assert col["launches"] == [1] + [0] * 11
    assert col["weight"] == [1024] + [0] * 11
    assert col["graph_launches"] == [0, 0, 1] + [0] * 9
    assert col["kernels"] == [1, 0, 5] + [0] * 9
    assert col["h2d_bytes"][3] == 1000 and col["d2h_bytes"][4] == 2000
    assert col["d2d_bytes"][5] == 300 and col["other_copy_bytes"][6] == 40
    assert col["memset_bytes"][7] == 512
    assert col["allocs"] == [0] * 8 + [1, 0, 0, 0] and col["alloc_bytes"][8] == 4096
    assert col["syncs"] == [0] * 10 + [1, 0]
    assert col["blocked_ns"] == [0, 0, 0, 0, 70, 0, 0, 0, 0, 0, 500, 0]


def test_busy_time_runs_from_the_first_launch_after_idle_to_the_drain() -> None:
    evs = events(
        ev(10), ev(20),                                  # span 1: [10, 50]
        ev(30, type_=S, duration_ns=20),
        ev(60),                                          # span 2: [60, 80]
        ev(70, type_=C, bytes=8, dim=[2, 0, 0, 0, 0, 0], flags=F_HAS_RESULT, duration_ns=10),
        ev(90, type_=S, duration_ns=5),                  # nothing queued: no span
        ev(100, tid=1, type_=S, duration_ns=100),        # thread 1 waits [100, 200] ...
        ev(150, tid=2),                                  # ... while thread 2 launches
        ev(160, tid=2, type_=S, duration_ns=5),          # and drains it at 165: inside [.., 200]
        ev(300), ev(310, type_=M, bytes=4),              # never drained: ends with the last event
    )
    gpu = busy_gpu_ns(evs)
    assert gpu.per_event.tolist() == [20, 20, 0, 10, 10, 0, 0, 0, 0, 5, 5]
    assert gpu.spans.tolist() == [[10, 50], [60, 80], [300, 310]]
    assert gpu.total_ns == 40 + 20 + 10 and gpu.residual_ns == 0
    assert event_costs(evs)[:, COST_FIELDS.index("gpu_ns")].tolist() == gpu.per_event.tolist()


def test_nvml_samples_spread_over_the_busy_spans_they_overlap() -> None:
    evs = events(ev(10), ev(20), ev(30, type_=S, duration_ns=20),   # span [10, 50]
                 ev(60), ev(70, type_=S, duration_ns=10))          # span [60, 80]
    # (0, 40] at 50 %: 20 ns, all in span 1; (40, 100] at 100 %: 60 ns over 10 ns of span 1
    # and 20 of span 2; (100, 200] at 30 %: 30 ns, no span: unattributed.
    gpu = nvml_gpu_ns(evs, [40, 100, 200], [50, 100, 30], first_interval_ns=40)
    span1, span2 = 20 + 60 * 10 / 30, 60 * 20 / 30
    assert gpu.per_event.tolist() == pytest.approx([span1 / 2, span1 / 2, 0, span2, 0])
    assert gpu.residual_ns == pytest.approx(30)
    assert gpu.total_ns == pytest.approx(20 + 60 + 30)
    reqs = table((1, 0, 55, 1))
    r = rollup(attribute(reqs, evs), event_costs(evs, gpu), residual={"gpu_ns": gpu.residual_ns})
    gpu_col = COST_FIELDS.index("gpu_ns")
    assert r.per_request[0, gpu_col] == pytest.approx(span1)
    assert r.unattributed[gpu_col] == pytest.approx(span2 + 30)
    assert r.total[gpu_col] == pytest.approx(110)


def test_rollup_by_hand() -> None:
    reqs = table((1, 0, 100, 1), (2, 0, 100, 2))
    evs = events(ev(10, 1, dim=[2, 1, 1, 32, 1, 1]), ev(20, 3), ev(30, 3), ev(200, 1),
                 ev(40, 2, type_=S, duration_ns=50))
    attr = attribute(reqs, evs)
    r = rollup(attr, event_costs(evs))
    assert r.of(1)["launches"] == 1 + 0.5 + 0.5 and r.of(2)["launches"] == 1.0
    assert r.of(1)["weight"] == 64 + 1 and r.of(2)["weight"] == 1
    assert r.of(2)["blocked_ns"] == 50 and r.unattributed[0] == 1
    assert r.exact[:, 0].tolist() == [1, 0] and r.shared[:, 0].tolist() == [1, 1]
    assert np.allclose(r.per_request.sum(axis=0) + r.unattributed, r.total)


def test_top_kernels_per_request() -> None:
    reqs = table((1, 0, 100, 1), (2, 0, 100, 2))
    evs = events(*(ev(t, 1, handle=0xA) for t in range(5)), ev(6, 1, handle=0xB),
                 ev(7, 3, handle=0xC), ev(8, 2, handle=0xB))
    top = top_kernels(attribute(reqs, evs), evs, {0xA: "gemm", 0xB: "softmax"}, limit=2)
    assert top[1] == [("gemm", 5.0), ("softmax", 1.0)]
    assert top[2] == [("softmax", 1.0), ("0xc", 0.5)]


# -- the invariant, and the rule, on arbitrary input ----------------------------------------

_times = st.integers(0, 400)


@st.composite
def _case(draw: st.DrawFn) -> tuple[RequestTable, npt.NDArray[np.void]]:
    n_req = draw(st.integers(0, 12))
    rows = []
    for i in range(n_req):
        start = draw(_times)
        end = OPEN_END if draw(st.booleans()) and i % 5 == 0 else start + draw(st.integers(0, 150))
        rows.append((1000 + i, start, end, draw(st.integers(1, 4))))
    reqs = (table(*rows) if rows
            else RequestTable(*(np.zeros(0, dtype=np.int64) for _ in range(4))))
    kinds = st.sampled_from([L, L, L, C, M, S, A, G, F])
    evs = []
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(kinds)
        row = ev(draw(_times), draw(st.integers(1, 5)), kind,
                 duration_ns=draw(st.integers(0, 50)), bytes=draw(st.integers(0, 10_000)),
                 dim=[draw(st.integers(0, 4)) for _ in range(6)])
        if kind == C:
            row["flags"] = draw(st.sampled_from([F_ASYNC, F_HAS_RESULT]))
        evs.append(row)
    return reqs, events(*evs)


@settings(max_examples=400, deadline=None)
@given(case=_case(), nvml=st.sampled_from(["", "consecutive", "windows"]))
def test_attributed_plus_unattributed_is_always_the_total(
    case: tuple[RequestTable, npt.NDArray[np.void]], nvml: str
) -> None:
    reqs, evs = case
    attr = attribute(reqs, evs)
    if nvml == "consecutive":
        gpu = nvml_gpu_ns(evs, [100, 250, 500], [40, 90, 10], first_interval_ns=100)
    elif nvml == "windows":  # driver sample periods, two GPUs' overlapping, gaps between
        gpu = nvml_gpu_ns(evs, [100, 250, 120, 500], [40, 90, 55, 10],
                          sample_start_ns=[0, 200, 20, 450])
        assert gpu.total_ns == pytest.approx(40 + 45 + 55 + 5)
    else:
        gpu = busy_gpu_ns(evs)
    costs = event_costs(evs, gpu)
    r = rollup(attr, costs, residual={"gpu_ns": gpu.residual_ns})
    assert np.allclose(r.per_request.sum(axis=0) + r.unattributed, r.total, rtol=1e-12, atol=1e-6)
    assert np.allclose(r.total, costs.sum(axis=0) + np.eye(len(COST_FIELDS))[-1]
                       * gpu.residual_ns)
    if nvml == "consecutive":
        assert gpu.total_ns == pytest.approx(0.4 * 100 + 0.9 * 150 + 0.1 * 250)
    # The rule itself, by brute force.
    for i, e in enumerate(evs):
        t, tid = int(e["ts_ns"]), int(e["tid"])
        live = [j for j in range(len(reqs)) if reqs.start_ns[j] <= t <= reqs.end_ns[j]]
        mine = [j for j in live if reqs.tid[j] == tid]
        if len(mine) == 1:
            assert attr.mode[i] == EXACT
            assert attr.shares(i) == [(int(reqs.request_id[mine[0]]), 1.0)]
        elif live:
            assert attr.mode[i] == SHARED
            assert sorted(rid for rid, _ in attr.shares(i)) == sorted(
                int(reqs.request_id[j]) for j in live)
            assert sum(share for _, share in attr.shares(i)) == pytest.approx(1.0)
        else:
            assert attr.mode[i] == UNATTRIBUTED and attr.shares(i) == []


def test_call_shares_name_each_events_requests_with_their_routes() -> None:
    from gpuflight.producer.http.attribution import call_shares

    calls = call_shares(
        np.array([0, 7, 7, 8, 0, 0, 9], dtype=np.uint64),
        np.array([0, 0, 0, 0, 1, 2, 0], dtype=np.int64),
        (((7, 1 / 3), (8, 1 / 3), (10, 1 / 3)), ((7, 0.5), (11, 0.5))),
        {7: "/a", 8: "/b", 10: "/a", 11: "/c"})
    got = [calls.sets[k] for k in calls.keys.tolist()]
    assert got[:4] == [(), ((7, "/a", 1.0),), ((7, "/a", 1.0),), ((8, "/b", 1.0),)]
    assert got[4] == ((7, "/a", 1 / 3), (8, "/b", 1 / 3), (10, "/a", 1 / 3))
    assert got[5] == ((7, "/a", 0.5), (11, "/c", 0.5))
    assert got[6] == ((9, "", 1.0),)  # a request whose route is not known
    assert calls.sets[0] == () and len(calls.sets) == 6  # each request and set once
