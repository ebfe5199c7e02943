"""Requests through the product: `gpuflight trace --output` on real HTTP servers whose handlers
call the simulated GPU (tests/workloads/http_servers.py), `gpuflight demo --serve`, the route
table's numbers, and request events on the wire (Kafka records from the capture's sinks)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.pricing import PriceBook
from gpuflight.producer.http.routes import render, route_table
from tests.workloads.http_servers import TRACE_ID

# -- the route table's numbers, by hand ------------------------------------------------------

def _record(rid: int, route: str, *, ms: float, gpu_ns: float, launches: float,
            status: int = 200) -> wire.RequestRecord:
    return wire.RequestRecord(
        request_id=rid, tid=1, method="POST", path=route, route=route, status=status,
        start_ns=10**18, end_ns=10**18 + int(ms * 1e6), bytes_in=100, bytes_out=300,
        trace_id=None, parent_span_id=None, complete=True, port=80,
        cost={"gpu_ns": gpu_ns, "launches": launches, "h2d_bytes": 1024.0})


def test_route_table_costs_match_a_hand_computation(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('[usd_per_gpu_hour]\n"H100" = 3.6\n"A10" = 0.72\n')
    book = PriceBook.load(prices)
    records = [_record(i, "/gen", ms=10 + i, gpu_ns=2e9, launches=24) for i in range(4)]
    records += [_record(10 + i, "/embed", ms=1, gpu_ns=0.5e9, launches=2,
                        status=500 if i == 0 else 200) for i in range(2)]
    table = route_table(records, {"gpu_ns": 3e9, "launches": 5}, book, "NVIDIA H100 80GB HBM3",
                        shared=[11])
    gen, embed = table.rows
    # 2 GPU-seconds a request at 3.6 USD/GPU-hour = 0.002 USD; 1,000 requests: 2 USD.
    assert gen.route == "/gen" and math.isclose(gen.cost_per_1k or 0, 2.0)
    assert math.isclose(embed.cost_per_1k or 0, 0.5)
    assert (gen.requests, gen.launches, gen.gpu_s, gen.exact) == (4, 24, 2.0, True)
    assert gen.p50_ms == pytest.approx(11.0) and gen.p99_ms == pytest.approx(13.0)
    assert (embed.errors, embed.exact, embed.copied_bytes) == (1, False, 1024)
    assert (table.unattributed_gpu_s, table.unattributed_launches) == (3.0, 5)
    text = render(table, "NVIDIA H100 80GB HBM3")
    assert "$2.00" in text and "$0.50 " in text and "$3.60/GPU-hour (H100" in text
    unpriced = route_table(records, {}, book, "Tesla K80")
    assert all(r.cost_per_1k is None for r in unpriced.rows)
    assert "no price for 'Tesla K80'" in render(unpriced, "Tesla K80")


# -- on the wire -----------------------------------------------------------------------------

def test_kafka_sink_carries_requests_attribution_and_unattributed_cost() -> None:
    from gpuflight.producer.contract.abi import EVENT_DTYPE, EventType
    from gpuflight.producer.http.requesttrack import Answered
    from gpuflight.producer.publish.kafkasink import KafkaSettings, KafkaSink
    from tests.support.builders import attribution, request_record

    sent: list[tuple[str, bytes]] = []

    class FakeProducer:  # the Kafka client boundary only: what it is handed is decoded here
        def __init__(self, _config: dict[str, Any]) -> None:
            pass

        def produce(self, topic: str, value: bytes, **_kw: Any) -> None:
            sent.append((topic, value))

        def poll(self, _t: float) -> int:
            return 0

        def flush(self, _t: float) -> int:
            return 0

        def __len__(self) -> int:
            return 0

    sink = KafkaSink(KafkaSettings(bootstrap="127.0.0.1:1"), producer_factory=FakeProducer,
                     create_topics=False, host="h")
    sink._identities[os.getpid()] = wire.ProcessRecord(  # no /proc read for this pid
        "h", os.getpid(), 5, None, None, (), None, None, None, None, None, None, "x:1")
    events = np.zeros(50, dtype=EVENT_DTYPE)
    events["pid"] = os.getpid()
    events["ts_ns"] = 10**18 + np.arange(50)
    events["type"] = EventType.LAUNCH
    sink.write(events[:20], attribution(50).take(np.arange(50) < 20))
    sink.write(events[20:], attribution(50).take(np.arange(50) >= 20))
    answered = [Answered(os.getpid(), None, request_record(11), "exact")]  # type: ignore[arg-type]
    sink.write_requests(os.getpid(), answered, {"launches": 3.0})
    sink.write_requests(4242, [Answered(4242, None, request_record(12), "shared")],  # type: ignore[arg-type]
                        {})
    sink._identities[4242] = sink._identities[os.getpid()]
    sink.flush_pending()
    batches = [wire.decode_events(v) for t, v in sent if t.endswith(".events.v1")]
    mine = next(b for b in batches if b.pid == os.getpid())
    assert mine.requests == (request_record(11),) and mine.unattributed == {"launches": 3.0}
    assert mine.attribution is not None
    assert mine.attribution.request_id.tolist() == attribution(50).request_id.tolist()
    assert mine.attribution.request_set.tolist() == attribution(50).request_set.tolist()
    only = next(b for b in batches if b.pid == 4242)
    assert len(only.events) == 0 and only.requests == (request_record(12),)


# -- node-wide: producer → Kafka → replay ----------------------------------------------------


# -- the tracker, on records built by hand ---------------------------------------------------

def test_tracker_attributes_holds_and_hands_on_requests_with_their_cost() -> None:
    from gpuflight.producer.contract.abi import F_HAS_RESULT, EventType
    from gpuflight.producer.http.requesttrack import RequestTracker
    from tests.support.builders import build_events
    from tests.support.httpsim import Wire, response

    offset = 1_000_000
    a = Wire(tid=11, conn_id=1, fd=7)
    b = Wire(tid=12, conn_id=2, fd=8, now=a.now)
    tracker = RequestTracker(offset)
    a.accept()
    b.accept()
    a.read(b"POST /v1/x/1 HTTP/1.1\r\nContent-Length: 0\r\n"
           b"traceparent: 00-" + TRACE_ID.encode() + b"-00f067aa0ba902b7-01\r\n\r\n")
    b.read(b"GET /v1/y HTTP/1.1\r\n\r\n")
    t_read = a.now
    tracker.feed(a.records + b.records)
    a.records.clear()
    b.records.clear()
    wall = t_read + offset
    def launch(ts: int, tid: int, dim: list[int] | None = None) -> dict[str, Any]:
        return {"ts_ns": ts, "tid": tid, "type": EventType.LAUNCH, "pid": 4242,
                "dim": dim or [0] * 6}

    sync = {"ts_ns": wall + 40, "tid": 99, "type": EventType.SYNC, "pid": 4242,
            "flags": F_HAS_RESULT, "duration_ns": 10}
    batch = build_events([launch(wall + 10, 11, [2, 1, 1, 4, 1, 1]),
                          launch(wall + 20, 12, [1] * 6), launch(wall + 30, 99, [1] * 6), sync])
    attr = tracker.attribute(batch)
    rid_a, rid_b = int(attr.request_id[0]), int(attr.request_id[1])
    assert rid_a and rid_b and rid_a != rid_b
    assert attr.of(2) == {"requests": [[rid_a, 0.5], [rid_b, 0.5]]}
    a.now, b.now = t_read + 1000, t_read + 5000
    a.write(response(200, b"done"))
    b.write(response(404, b""))
    tracker.feed(a.records + b.records)
    # b's response ended after the cut: it waits, its events may still be held back.
    first = tracker.take_answered(before_ns=a.now + offset + 1)
    (done,), _ = first[4242]
    assert done.record.request_id == rid_a and done.record.route == "/v1/x/{id}"
    assert done.record.trace_id == TRACE_ID and done.record.parent_span_id == "00f067aa0ba902b7"
    # GPU time: one busy span of 40 ns (first launch to the sync's return), a third a launch:
    # a's own, and half of the shared one; half the shared sync.
    assert done.record.cost == pytest.approx(
        {"launches": 1.5, "weight": 8.5, "kernels": 1.5, "syncs": 0.5, "blocked_ns": 5.0,
         "gpu_ns": 20.0})
    assert done.record.gpu_source == "queued"
    assert done.record.start_ns - offset < done.record.end_ns - offset == a.now
    assert done.mode == "mixed"
    (later,), _ = tracker.take_answered()[4242]
    assert (later.record.status, later.record.cost["launches"]) == (404, 1.5)
    assert later.mode == "mixed"
    # With no request in flight a call is unattributed, and its cost handed on apart.
    none = tracker.attribute(build_events([launch(wall + 10**9, 11)]))
    assert none.of(0) == {}
    assert tracker.take_answered()[4242] == ([], {"launches": 1.0, "kernels": 1.0})


def _two_requests_one_after_the_other(offset: int) -> tuple[Any, Any, int]:
    """A tracker that has read two requests on two threads (11 then 12) and the wall time at
    which the first was read; their responses are fed by `_answer`."""
    from gpuflight.producer.http.requesttrack import RequestTracker
    from tests.support.httpsim import Wire

    a = Wire(tid=11, conn_id=1, fd=7, step=10)
    b = Wire(tid=12, conn_id=2, fd=8, step=10, now=a.now + 3000)
    tracker = RequestTracker(offset)
    a.accept()
    a.read(b"POST /v1/big/1 HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    b.accept()
    b.read(b"POST /v1/small/2 HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    tracker.feed(a.records + b.records)
    return tracker, (a, b), a.now + offset


def _answer(tracker: Any, wires: Any, at: tuple[int, int]) -> None:
    from tests.support.httpsim import response

    for wire_, now in zip(wires, at, strict=True):
        wire_.records.clear()
        wire_.now = now
        wire_.write(response(200, b"ok"))
        tracker.feed(wire_.records)


def _work(wall: int) -> Any:
    """Request a (thread 11): a launch, 900 ns of CPU, a sync (span [w+100, w+1100]); request
    b (thread 12): a launch and a sync at once (span [w+3500, w+3550])."""
    from gpuflight.producer.contract.abi import EventType
    from tests.support.builders import build_events, call

    sync = EventType.SYNC
    return build_events([call(wall + 100, 11, pid=4242),
                         call(wall + 1000, 11, sync, duration_ns=100, pid=4242),
                         call(wall + 3500, 12, pid=4242),
                         call(wall + 3520, 12, sync, duration_ns=30, pid=4242)])


def test_tracker_gpu_time_from_nvml_waits_for_nvml_and_says_so() -> None:
    from gpuflight.producer.nvml import UtilWindow

    offset = 1_000_000
    tracker, wires, wall = _two_requests_one_after_the_other(offset)
    # Before the process's first event (the capture did not watch it yet): not explained here.
    early = UtilWindow(0, 4242, wall - 5000, wall - 3000, 50)
    tracker.feed_utilization([early, UtilWindow(0, 4242, wall, wall + 2000, 10)], wall + 2000)
    tracker.attribute(_work(wall))
    _answer(tracker, wires, (wall - offset + 1200, wall - offset + 3600))
    tracker.settle()
    # NVML has reported up to w+2000 only: the batch (to w+3550) waits, and its requests.
    assert tracker.take_answered() == {}
    # (w+2000, w+4000] at 5 %: 100 ns, all in b's span; a had (w, w+2000] at 10 %: 200 ns.
    tracker.feed_utilization([UtilWindow(0, 4242, wall + 2000, wall + 4000, 5)], wall + 4000)
    tracker.settle()
    answered, unattributed = tracker.take_answered()[4242]
    got = {r.record.route: (r.record.cost["gpu_ns"], r.record.gpu_source) for r in answered}
    assert got == {"/v1/big/{id}": (pytest.approx(200.0), "nvml"),
                   "/v1/small/{id}": (pytest.approx(100.0), "nvml")}
    assert answered[0].record.cost["launches"] == 1 and answered[0].record.cost["syncs"] == 1
    assert unattributed == {}
    assert tracker.gpu_sources.nvml_batches == 1 and tracker.gpu_sources.queued_batches == 0


def test_tracker_keeps_a_busy_span_whole_across_batches_for_nvml() -> None:
    """a's launch and its sync come in two batches: the first waits for the drain, so NVML's
    (w, w+2000] still lands on a's whole span [w+100, w+1100]."""
    from gpuflight.producer.nvml import UtilWindow

    offset = 1_000_000
    tracker, wires, wall = _two_requests_one_after_the_other(offset)
    work = _work(wall)
    tracker.feed_utilization([UtilWindow(0, 4242, wall, wall + 2000, 10)], wall + 2000)
    tracker.attribute(work[:1])
    tracker.settle()
    assert tracker.gpu_sources.nvml_batches == 0  # no drain yet: the span is open
    tracker.attribute(work[1:])
    _answer(tracker, wires, (wall - offset + 1200, wall - offset + 3600))
    tracker.feed_utilization([UtilWindow(0, 4242, wall + 2000, wall + 4000, 5)], wall + 4000)
    tracker.settle()
    answered, unattributed = tracker.take_answered()[4242]
    got = {r.record.route: r.record.cost["gpu_ns"] for r in answered}
    assert got == {"/v1/big/{id}": pytest.approx(200.0), "/v1/small/{id}": pytest.approx(100.0)}
    assert unattributed == {}


def test_tracker_without_nvml_figures_for_a_process_uses_queued_time() -> None:
    offset = 1_000_000
    tracker, wires, wall = _two_requests_one_after_the_other(offset)
    tracker.feed_utilization([], wall + 10_000)  # NVML reports, but nothing of this process
    tracker.attribute(_work(wall))
    _answer(tracker, wires, (wall - offset + 1200, wall - offset + 3600))
    tracker.settle()
    answered, _ = tracker.take_answered()[4242]
    got = {r.record.route: (r.record.cost["gpu_ns"], r.record.gpu_source) for r in answered}
    # Queued time: a's launch to its sync's return, b's likewise.
    assert got == {"/v1/big/{id}": (pytest.approx(1000.0), "queued"),
                   "/v1/small/{id}": (pytest.approx(50.0), "queued")}


def test_tracker_nvml_that_reports_no_time_is_not_used() -> None:
    offset = 1_000_000
    tracker, wires, wall = _two_requests_one_after_the_other(offset)
    tracker.feed_utilization([], 0)
    assert not tracker.nvml
    tracker.attribute(_work(wall))
    _answer(tracker, wires, (wall - offset + 1200, wall - offset + 3600))
    answered, _ = tracker.take_answered()[4242]
    assert {r.record.gpu_source for r in answered} == {"queued"}


def test_route_table_says_where_gpu_time_came_from() -> None:
    def rec(rid: int, route: str, source: str | None) -> wire.RequestRecord:
        return wire.RequestRecord(rid, 1, "POST", route, route, 200, 0, 10**6, 1, 1, None, None,
                                  True, 80, {"gpu_ns": 1e6}, source)  # type: ignore[arg-type]

    nvml = route_table([rec(1, "/a", "nvml"), rec(2, "/b", "nvml")], {}, nvml=True)
    assert [r.gpu_source for r in nvml.rows] == ["nvml", "nvml"]
    text = render(nvml)
    assert "GPU time: NVML per-process utilisation" in text and " NVML\n" in text + "\n"
    queued = render(route_table([rec(1, "/a", "queued")], {}))
    assert "GPU time: queued time (first launch after idle" in queued
    assert "drained it): no NVML on this machine\n" in queued
    mixed = route_table([rec(1, "/a", "nvml"), rec(2, "/a", "queued")], {}, nvml=True)
    assert mixed.rows[0].gpu_source == "mixed"
    assert "NVML+queued" in render(mixed)
