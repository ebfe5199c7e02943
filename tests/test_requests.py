"""Requests through the product: `gpuflight trace --output` on real HTTP servers whose handlers
call the simulated GPU (tests/workloads/http_servers.py), `gpuflight demo --serve`, the route
table's numbers, and request events on the wire (Kafka records from the capture's sinks)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuflight.demo.build import build_simgpu
from gpuflight.producer.contract import wire
from gpuflight.producer.contract.pricing import PriceBook
from gpuflight.producer.http.routes import render, route_table
from tests.conftest import REPO, bpf_unavailable_reason, require
from tests.support.otlp_fixture import Collector, attributes, running_collector
from tests.workloads.http_servers import TRACE_ID

ROUTES = {"small": "/v1/small/{id}", "big": "/v1/big/{id}", "items": "/v1/items",
          "missing": "/missing"}


def _trace(tmp_path: Path, kind: str, *extra: str) -> tuple[list[dict[str, Any]],
                                                              dict[str, Any], str]:
    require(bpf_unavailable_reason())
    runtime = build_simgpu(tmp_path / "gpu") / "libcudart.so.12"
    out, expect = tmp_path / "out.jsonl", tmp_path / "expect.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "gpuflight", "trace", "--output", str(out), *extra, "--",
         sys.executable, "-m", "tests.workloads.http_servers", kind, "--runtime", str(runtime),
         "--expect", str(expect)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    return lines, json.loads(expect.read_text()), done.stderr


Traced = tuple[list[dict[str, Any]], dict[str, Any], str]


@pytest.fixture(scope="module")
def traced_with_otlp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Traced, Collector]]:
    require(bpf_unavailable_reason())
    tmp = tmp_path_factory.mktemp("threaded")
    with running_collector(tmp) as collector:
        yield _trace(tmp, "threaded", "--otlp", collector.http), collector


@pytest.fixture
def threaded(traced_with_otlp: tuple[Traced, Collector]) -> Traced:
    return traced_with_otlp[0]


class TestThreadPerRequest:
    """ThreadingHTTPServer (keep-alive clients on 4 threads) and a threaded WSGI server in one
    process, with background launches before and after, traceparents, and garbage."""

    def test_every_request_is_seen_with_its_route_status_and_bytes(
        self, threaded: tuple[list[dict[str, Any]], dict[str, Any], str]
    ) -> None:
        lines, expect, _ = threaded
        requests = [e for e in lines if e["type"] == "request"]
        sent = expect["requests"]
        assert len(sent) >= 300 and len(requests) == len(sent)
        got = Counter((r["method"], r["path"], r["status"], r["bytes_in"], r["bytes_out"],
                       r["trace_id"] and f"00-{r['trace_id']}-{r['parent_span_id']}-01")
                      for r in requests)
        want = Counter((s["method"], s["path"], s["status"], s["bytes_in"], s["bytes_out"],
                        s["traceparent"]) for s in sent)
        assert got == want
        routes = {r["path"]: r["route"] for r in requests}
        for s in sent:
            assert routes[s["path"]] == ROUTES[s["kind"]]
        # Heads the client ended before their blank line: served, recorded, never complete.
        cut = Counter(s["path"] for s in sent if s.get("cut"))
        assert cut.total() == 6
        assert Counter(r["path"] for r in requests if not r["complete"]) == cut
        assert all(r["start_ns"] < r["end_ns"] for r in requests)
        assert len({r["request_id"] for r in requests}) == len(requests)
        assert sum(1 for s in sent if s["traceparent"]) > 50  # the round trip was exercised

    def test_every_launch_copy_and_sync_is_its_requests_exactly(
        self, threaded: tuple[list[dict[str, Any]], dict[str, Any], str]
    ) -> None:
        lines, expect, _ = threaded
        work = expect["work"]
        requests = {e["request_id"]: e for e in lines if e["type"] == "request"}
        kind_of = {s["path"]: s["kind"] for s in expect["requests"]}
        calls: dict[int, Counter[str]] = {rid: Counter() for rid in requests}
        assert not [e for e in lines if "requests" in e]  # nothing shared
        for e in lines:
            if e["type"] != "request" and "request_id" in e:
                calls[e["request_id"]][e["type"]] += 1
        for rid, r in requests.items():
            kind = kind_of.get(r["path"], "items" if r["path"] == "/v1/items" else "missing")
            launches, h2d, d2h, syncs = work[kind]
            assert calls[rid] == Counter({k: v for k, v in (
                ("launch", launches), ("memcpy", h2d + d2h), ("sync", syncs)) if v}), r["path"]
            cost = r["cost"]
            assert cost.get("launches", 0) == launches
            assert cost.get("h2d_bytes", 0) == 4096 * h2d
            assert cost.get("d2h_bytes", 0) == 2048 * d2h
            assert cost.get("syncs", 0) == syncs
            assert cost.get("weight", 0) == launches * 32 * 64

    def test_launches_with_no_request_in_flight_are_counted_apart(
        self, threaded: tuple[list[dict[str, Any]], dict[str, Any], str]
    ) -> None:
        lines, expect, stderr = threaded
        launches = [e for e in lines if e["type"] == "launch"]
        alone = [e for e in launches if "request_id" not in e and "requests" not in e]
        assert len(alone) == expect["background_launches"]
        assert all(e["grid"] == [8, 1, 1] for e in alone)
        attributed = sum(e["cost"].get("launches", 0) for e in lines if e["type"] == "request")
        assert attributed + len(alone) == len(launches)
        assert f"{expect['background_launches']} launches (start-up, background work)" in stderr

    def test_garbage_is_ignored_and_counted(
        self, threaded: tuple[list[dict[str, Any]], dict[str, Any], str]
    ) -> None:
        _, expect, stderr = threaded
        assert expect["garbage"] == 5
        (line,) = [x for x in stderr.splitlines() if x.startswith(" HTTP: ")]
        assert "connections ignored:" in line and "not HTTP" in line and "TLS" in line
        assert "parser errors" not in line
        assert "(6 incomplete)" in line  # the heads ended by the client's end of stream
        assert "requests by route" in stderr and "POST /v1/big/{id}" in stderr

    def test_each_request_is_a_span_in_its_callers_trace(
        self, traced_with_otlp: tuple[Traced, Collector]
    ) -> None:
        (lines, _, _), collector = traced_with_otlp
        requests = {e["request_id"]: e for e in lines if e["type"] == "request"}
        spans = {int(s["spanId"], 16): s for s in collector.wait_for(len(requests))}
        assert set(spans) == set(requests)
        for rid, r in requests.items():
            span = spans[rid]
            attrs = attributes(span["attributes"])
            assert span["name"] == f"{r['method']} {r['route']}"
            assert attrs["http.route"] == r["route"] and attrs["url.path"] == r["path"]
            assert attrs["http.response.status_code"] == r["status"]
            assert attrs.get("gpuflight.gpu.launches", 0) == r["cost"].get("launches", 0)
            if r["trace_id"]:
                assert span["traceId"] == r["trace_id"] == TRACE_ID
                assert span["parentSpanId"] == r["parent_span_id"]
            else:
                assert not span.get("parentSpanId")
            if r["route"] == "/v1/big/{id}":
                assert attrs["gpuflight.attribution"] == "exact"
                # Queued time, or none: a request's work can fall in a span another thread's
                # drain closed before it was queued (concurrent requests).
                assert attrs.get("gpuflight.gpu.seconds_source") == r["gpu_source"]
                assert r["gpu_source"] in ("queued", None)
                assert attrs["gpuflight.gpu.top_kernel_launches"] == [5.0]
                assert int(span["endTimeUnixNano"]) == r["end_ns"]


def test_asyncio_server_shares_sum_to_the_totals(tmp_path: Path) -> None:
    lines, expect, stderr = _trace(tmp_path, "aiohttp")
    requests = [e for e in lines if e["type"] == "request"]
    assert len(requests) == len(expect["requests"])
    ids = {r["request_id"] for r in requests}
    launches = [e for e in lines if e["type"] == "launch"]
    shared = [e for e in lines if "requests" in e]
    assert shared, "concurrent requests on one event loop thread share its calls"
    for e in shared:
        assert math.isclose(sum(s for _, s in e["requests"]), 1.0, abs_tol=1e-9)
        assert {rid for rid, _ in e["requests"]} <= ids
    # Every launch was made inside a handler: all of it is given to requests, in full.
    assert all("request_id" in e or "requests" in e for e in launches)
    given = sum(r["cost"].get("launches", 0) for r in requests)
    assert math.isclose(given, len(launches), rel_tol=1e-9)
    h2d = sum(e["bytes"] for e in lines if e["type"] == "memcpy" and e["kind"] == "H2D")
    assert math.isclose(sum(r["cost"].get("h2d_bytes", 0) for r in requests), h2d,
                        rel_tol=1e-9)
    expected_launches = sum(expect["work"][s["kind"]][0] for s in expect["requests"])
    assert len(launches) == expected_launches
    assert "shared" in stderr


def test_demo_serve_prints_the_cost_of_each_route() -> None:
    require(bpf_unavailable_reason())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "gpuflight", "demo", "--serve", "--clients", "2",
         "--requests", "30"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split()[1]: line.split() for line in done.stdout.splitlines()
            if line.strip().startswith(("POST ", "GET "))}
    assert set(rows) == {"/v1/generate/{id}", "/v1/embed/{id}", "/healthz"}
    total = sum(int(r[2].replace(",", "")) for r in rows.values())
    assert total == 60
    # POST, route, requests, (no errors), p50, p99, launches/req, ...
    assert rows["/v1/generate/{id}"][5] == "24.0" and rows["/v1/embed/{id}"][5] == "2.0"

    def usd(row: list[str]) -> float:
        return float(next(x for x in row if x.startswith("$"))[1:])

    assert usd(rows["/v1/generate/{id}"]) > usd(rows["/v1/embed/{id}"]) > 0
    assert "$3.00/GPU-hour (H100; price book)" in done.stdout


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
    from tests.test_wire import _attributed, _request

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
    sink.write(events[:20], _attributed(50).take(np.arange(50) < 20))
    sink.write(events[20:], _attributed(50).take(np.arange(50) >= 20))
    answered = [Answered(os.getpid(), None, _request(11), "exact")]  # type: ignore[arg-type]
    sink.write_requests(os.getpid(), answered, {"launches": 3.0})
    sink.write_requests(4242, [Answered(4242, None, _request(12), "shared")],  # type: ignore[arg-type]
                        {})
    sink._identities[4242] = sink._identities[os.getpid()]
    sink.flush_pending()
    batches = [wire.decode_events(v) for t, v in sent if t.endswith(".events.v1")]
    mine = next(b for b in batches if b.pid == os.getpid())
    assert mine.requests == (_request(11),) and mine.unattributed == {"launches": 3.0}
    assert mine.attribution is not None
    assert mine.attribution.request_id.tolist() == _attributed(50).request_id.tolist()
    assert mine.attribution.request_set.tolist() == _attributed(50).request_set.tolist()
    only = next(b for b in batches if b.pid == 4242)
    assert len(only.events) == 0 and only.requests == (_request(12),)


# -- node-wide: producer → Kafka → replay ----------------------------------------------------

def test_producer_publishes_requests_and_replay_carries_them(tmp_path: Path) -> None:
    """`gpuflight producer` node-wide captures the requests of a process that maps the CUDA
    runtime; Kafka carries them with every event's attribution; replay writes them back."""
    from gpuflight import stack
    from tests.support.capture import Producer as NodeProducer
    from tests.support.capture import read_events, wait_for_probe_releases
    from tests.support.kafka_fixture import kafka_unavailable_reason

    require(bpf_unavailable_reason())
    require(kafka_unavailable_reason())
    runtime = build_simgpu(tmp_path / "gpu") / "libcudart.so.12"
    data = tmp_path / "kafka"
    handle = stack.kafka_up(data, port=stack.free_port())
    try:
        wait_for_probe_releases()
        node = NodeProducer(tmp_path / "node.jsonl", "--kafka", handle.bootstrap,
                            "--topic-prefix", "rq", ready_timeout_s=240, stop_timeout_s=240)
        try:
            server = subprocess.Popen(
                [sys.executable, "-m", "gpuflight.demo.serve", "--runtime", str(runtime),
                 "--clients", "3", "--requests", "40", "--hold"],
                stdin=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
            assert server.stdin is not None
            # Its runtime probed, so the process is watched (the same scan): then load.
            node.wait_for_library(str(runtime), timeout_s=240)
            server.stdin.write(b"go\n")
            server.stdin.close()
            assert server.wait(timeout=300) == 0
            recorded = node.stop()
            assert node.status()["requests"] >= 120  # the server's, and any other's
        finally:
            node.kill()
        out = tmp_path / "replay.jsonl"
        done = subprocess.run(
            [sys.executable, "-m", "gpuflight", "replay", "--kafka", handle.bootstrap,
             "--topic-prefix", "rq", "--from", f"{node.started_ns - 5 * 10**9}ns",
             "--to", f"{time.time_ns()}ns", "--output", str(out)],
            capture_output=True, text=True, timeout=180, check=False, cwd=REPO)
        assert done.returncode == 0, done.stderr
        replayed = read_events(out)
    finally:
        stack.kafka_down(data)
    mine = [e for e in recorded if e["pid"] == server.pid]
    requests = [e for e in mine if e["type"] == "request"]
    assert len(requests) == 120
    assert Counter(r["route"] for r in requests) == Counter(
        {"/v1/embed/{id}": 88, "/v1/generate/{id}": 29, "/healthz": 3})
    by_id = {r["request_id"]: r for r in requests}
    for e in mine:
        if e["type"] == "launch" and e["grid"] != [1, 1, 1]:
            assert by_id[e["request_id"]]["route"] != "/healthz"  # exact, to a served request
    assert all(e["grid"] == [1, 1, 1] for e in mine
               if e["type"] == "launch" and "request_id" not in e)

    def key(event: dict[str, Any]) -> str:
        return json.dumps(event, sort_keys=True)

    assert Counter(map(key, [e for e in replayed if e["pid"] == server.pid])) == Counter(
        map(key, mine))


# -- the tracker, on records built by hand ---------------------------------------------------

def test_tracker_attributes_holds_and_hands_on_requests_with_their_cost() -> None:
    from gpuflight.producer.contract.abi import F_HAS_RESULT, EventType
    from gpuflight.producer.http.requesttrack import RequestTracker
    from tests.support.httpsim import Wire, response
    from tests.test_attribution import events as make_events

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
    batch = make_events(launch(wall + 10, 11, [2, 1, 1, 4, 1, 1]),
                        launch(wall + 20, 12, [1] * 6), launch(wall + 30, 99, [1] * 6), sync)
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
    none = tracker.attribute(make_events(launch(wall + 10**9, 11)))
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
    from tests.test_attribution import S, ev
    from tests.test_attribution import events as make_events

    return make_events(ev(wall + 100, 11, pid=4242), ev(wall + 1000, 11, S, duration_ns=100,
                                                          pid=4242),
                       ev(wall + 3500, 12, pid=4242), ev(wall + 3520, 12, S, duration_ns=30,
                                                          pid=4242))


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
