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

import pytest

from tests.conftest import REPO
from tests.support.otlp_fixture import Collector, attributes, running_collector
from tests.workloads.build import build_simgpu
from tests.workloads.http_servers import TRACE_ID, WORK, kind_of

pytestmark = pytest.mark.bpf

ROUTES = {"small": "/v1/small/{id}", "big": "/v1/big/{id}", "items": "/v1/items",
          "missing": "/missing"}


def _trace(tmp_path: Path, kind: str, *extra: str) -> tuple[list[dict[str, Any]],
                                                              dict[str, Any], str]:
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
        tuple[Traced, Collector, Path]]:
    """The threaded servers traced with --output, --otlp, --timeline (the Perfetto trace's
    path, third) and every call's code path (--stacks, --stack-sampling 1)."""
    tmp = tmp_path_factory.mktemp("threaded")
    timeline = tmp / "timeline.pftrace"
    with running_collector(tmp) as collector:
        yield (_trace(tmp, "threaded", "--otlp", collector.http, "--timeline", str(timeline),
                      "--stacks", str(tmp / "stacks.folded"), "--stack-sampling", "1"),
               collector, timeline)


@pytest.fixture
def threaded(traced_with_otlp: tuple[Traced, Collector, Path]) -> Traced:
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

    def test_the_timeline_holds_every_call_and_request_with_flows_to_its_calls(
        self, traced_with_otlp: tuple[Traced, Collector, Path]
    ) -> None:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

        from gpuflight.producer.decode.timeline import request_flow

        (lines, _, _), _, path = traced_with_otlp
        trace = Trace.FromString(path.read_bytes())
        threads = {p.track_descriptor.uuid: (p.track_descriptor.thread.pid,
                                             p.track_descriptor.thread.tid)
                   for p in trace.packet if p.track_descriptor.HasField("thread")}
        starts = [p for p in trace.packet if p.HasField("track_event")
                  and p.track_event.type in (TrackEvent.TYPE_SLICE_BEGIN,
                                             TrackEvent.TYPE_INSTANT)]
        calls = Counter((*threads[p.track_event.track_uuid], p.timestamp)
                        for p in starts if p.track_event.track_uuid in threads)
        events = [e for e in lines if e["type"] not in ("request", "aggregate")]
        assert calls == Counter((e["pid"], e["tid"], e["ts_ns"]) for e in events)
        flows = Counter(f for p in starts for f in p.track_event.flow_ids)
        requests = [e for e in lines if e["type"] == "request"]
        for r in requests:  # the request's own slice, and each call made for it
            made = sum(1 for e in events if e.get("request_id") == r["request_id"])
            assert flows[request_flow(r["pid"], r["request_id"])] == 1 + made, r["path"]
        http = [p for p in starts if "http" in p.track_event.categories]
        assert sorted(p.timestamp for p in http) == sorted(r["start_ns"] for r in requests)

    def test_each_request_is_a_span_in_its_callers_trace(
        self, traced_with_otlp: tuple[Traced, Collector, Path]
    ) -> None:
        (lines, _, _), collector, _ = traced_with_otlp
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
            # Every call walked: each span names the functions its calls went through
            # (gpuflight/demo/serve.py's Gpu), with the launches each made for it.
            launched = dict(zip(attrs.get("gpuflight.code.top_functions", ()),
                                attrs.get("gpuflight.code.top_function_launches", ()),
                                strict=True))
            work = WORK[kind_of(r["path"])]
            want = {"Gpu.launch (demo/serve.py)": float(work[0])} if work[0] else {}
            assert {f: n for f, n in launched.items() if n} == want, (r["path"], attrs)
            assert {f.split(" ")[0] for f in launched} == {
                name for name, n in zip(("Gpu.launch", "Gpu.copy", "Gpu.copy", "Gpu.sync"),
                                        work, strict=True) if n}, r["path"]


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


# -- on the wire -----------------------------------------------------------------------------


# -- node-wide: producer → Kafka → replay ----------------------------------------------------

@pytest.mark.kafka
def test_producer_publishes_requests_and_replay_carries_them(tmp_path: Path) -> None:
    """`gpuflight producer` node-wide captures the requests of a process that maps the CUDA
    runtime; Kafka carries them with every event's attribution; replay writes them back."""
    from gpuflight import stack
    from tests.support.capture import Producer as NodeProducer
    from tests.support.capture import read_events, wait_for_probe_releases

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
