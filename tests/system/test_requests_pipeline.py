"""Requests and cost through the pipeline: events messages carrying requests (their attributed
cost) and the cost no request explains, into a real Kafka → `gpuflight streams` → a real
InfluxDB; then exact counts, costs against a hand computation on a fixed price file, every
query of the "Requests & cost" dashboard, the cost-per-request alert rule, and
`gpuflight report --by` / `gpuflight cost` as a user runs them.

The script (a server on an H100 at 3.60 USD per GPU-hour: 1 GPU-second = 0.001 USD):

  an hour ago (the baseline)   /infer: 20 requests of 0.1 GPU-s each, /health: 10 of 0.01
  five minutes ago (recent)    /infer: 10 requests of 0.3 GPU-s each (3 times the baseline),
                               /health: 10 of 0.01 (unchanged)
  each message                 0.5 GPU-s of no request (warm-up, background)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuflight.grafana import generate
from gpuflight.producer.contract import wire
from gpuflight.producer.contract.wire import RequestRecord
from gpuflight.streams.measurements import Fields, Tags
from tests.support.grafana_eval import evaluate, influxql, interpolate, present, render
from tests.support.influx_fixture import DATABASE
from tests.support.streams_support import Feed, StreamWorker, launches, rows, wait_for

pytestmark = [pytest.mark.influx, pytest.mark.kafka]

W = 1_000_000_000
PRICE_FILE = '[usd_per_gpu_hour]\n"H100" = 3.60\n'
USD_PER_GPU_S = 0.001
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
UNATTRIBUTED_GPU_NS = 0.5e9


@dataclass(frozen=True)
class Phase:
    ago_s: int
    infer: int
    infer_gpu_s: float
    health: int
    health_gpu_s: float


PHASES = (Phase(3600, 20, 0.1, 10, 0.01), Phase(300, 10, 0.3, 10, 0.01))


@dataclass(frozen=True)
class Run:
    url: str
    host: str
    job: str
    since_ns: int
    until_ns: int
    recent_ns: int
    env: dict[str, str]


def request(rid: int, route: str, end_ns: int, *, gpu_s: float, latency_ns: int,
            trace: str | None = None) -> RequestRecord:
    return RequestRecord(rid, 41, "POST", route, route, 200, end_ns - latency_ns, end_ns, 512,
                         2048, trace, None if trace is None else "00f067aa0ba902b7", True, 8080,
                         {"launches": 4.0, "gpu_ns": gpu_s * 1e9, "h2d_bytes": 1024.0})


@pytest.fixture(scope="module")
def served(kafka_bootstrap: str, influx_url: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    names = f"requests-{os.getpid()}-{time.time_ns() % 10**6}"
    work = tmp_path_factory.mktemp("requests")
    prices = work / "prices.toml"
    prices.write_text(PRICE_FILE)
    feed = Feed(kafka_bootstrap, names)
    host, pid, job = f"{names}-node", 41, "k8s:ml/serve-0"
    feed.raw(feed.topics.processes, host, wire.encode_process(wire.ProcessRecord(
        host, pid, 9, None, "python3", (), None, None, None, "serve-0", "ml", None, job,
        team="search")))
    now = time.time_ns() // W * W
    rid = 1
    for phase in PHASES:
        t = now - phase.ago_s * W
        batch: list[RequestRecord] = []
        for i in range(phase.infer):
            batch.append(request(rid, "/infer", t + 1000 + i, gpu_s=phase.infer_gpu_s,
                                 latency_ns=(i + 1) * 1_000_000,
                                 trace=TRACE if i == phase.infer - 1 else None))
            rid += 1
        for i in range(phase.health):
            batch.append(request(rid, "/health", t + 2000 + i, gpu_s=phase.health_gpu_s,
                                 latency_ns=100_000))
            rid += 1
        # One message with launches and half the requests, one with only requests (count 0).
        half = len(batch) // 2
        events = launches([t + 10 + i for i in range(5)], pid, 8, 128)
        feed.raw(feed.topics.events, host, wire.encode_events(wire.EventBatch(
            host, pid, 9, events, requests=tuple(batch[:half]),
            unattributed={"gpu_ns": UNATTRIBUTED_GPU_NS, "launches": 5.0})))
        feed.raw(feed.topics.events, host, wire.encode_events(wire.EventBatch(
            host, pid, 9, np.zeros(0, dtype=events.dtype), requests=tuple(batch[half:]))))
    # A last launch later on, so the windows before it close at the worker's pace.
    feed.events(host, pid, 9, launches([now - 60 * W], pid, 1, 32))
    feed.flush()
    worker = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", work,
                          extra=["--prices", str(prices), "--gpu-model", "NVIDIA H100 80GB HBM3"])
    worker.start()
    total = sum(p.infer + p.health for p in PHASES)
    try:
        wait_for(lambda: (rows(influx_url, f"SELECT sum(requests) FROM routes WHERE host = "
                                           f"'{host}'") or [{"sum": 0}])[0]["sum"] == total,
                 120, f"{total} requests in InfluxDB", worker)
        wait_for(lambda: len(rows(influx_url, f"SELECT gpu_ns FROM job_cost WHERE host = "
                                              f"'{host}'")) == len(PHASES),
                 60, "the job's cost of each phase", worker)
        env = {**os.environ, "GPUFLIGHT_INFLUX_TOKEN": ""}
        yield Run(influx_url, host, job, now - 7200 * W, now, now - 300 * W, env)
    finally:
        assert worker.stop() == 0, worker.output()[-3000:]


def expected_gpu_s(route: str) -> float:
    if route == "/infer":
        return sum(p.infer * p.infer_gpu_s for p in PHASES)
    return sum(p.health * p.health_gpu_s for p in PHASES)


def test_requests_are_counted_exactly_and_priced_by_hand(served: Run) -> None:
    by_route = {r[Tags.ROUTE]: r for r in rows(
        served.url, f"SELECT sum(requests) AS n, sum(gpu_ns) AS g, sum(cost_usd) AS c, "
                    f"sum(launches) AS l, sum(bytes) AS b FROM routes WHERE host = "
                    f"'{served.host}' GROUP BY route")}
    assert set(by_route) == {"/infer", "/health"}
    assert by_route["/infer"]["n"] == 30 and by_route["/health"]["n"] == 20
    assert by_route["/infer"]["l"] == 120 and by_route["/infer"]["b"] == 30 * 1024
    # /infer: 20 · 0.1 + 10 · 0.3 = 5 GPU-s = 0.005 USD; /health: 20 · 0.01 = 0.2 GPU-s.
    assert by_route["/infer"]["g"] == pytest.approx(5e9)
    assert by_route["/infer"]["c"] == pytest.approx(0.005)
    assert by_route["/health"]["c"] == pytest.approx(0.0002)
    (job,) = rows(served.url, f"SELECT sum(gpu_ns) AS g, sum(unattributed_gpu_ns) AS u, "
                              f"sum(cost_usd) AS c FROM job_cost WHERE host = '{served.host}' "
                              f"GROUP BY namespace, team")
    assert (job[Tags.NAMESPACE], job[Tags.TEAM]) == ("ml", "search")
    assert job["u"] == pytest.approx(2 * UNATTRIBUTED_GPU_NS)
    assert job["g"] == pytest.approx(5.2e9 + 1e9)
    assert job["c"] == pytest.approx(6.2 * USD_PER_GPU_S)
    # The slowest /infer request of each phase, with its trace id.
    samples = rows(served.url, f"SELECT trace_id, latency_ns FROM request_samples WHERE host = "
                               f"'{served.host}' AND route = '/infer' AND rank = '0'")
    assert [(s["trace_id"], s["latency_ns"]) for s in samples] == [
        (TRACE, 20_000_000), (TRACE, 10_000_000)]


def gpuflight(run: Run, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "gpuflight", *args, "--influx", run.url,
                           "--host", run.host, "--since", "3h", "--json"],
                          capture_output=True, text=True, env=run.env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_report_by_route_and_cost_by_namespace_match_the_hand_computation(served: Run) -> None:
    routes = {r["key"]: r for r in gpuflight(served, "report", "--by", "route")["rows"]}
    infer = routes["/infer"]
    assert infer["requests"] == 30 and infer["gpu_seconds"] == pytest.approx(5.0)
    assert infer["cost_usd"] == pytest.approx(0.005)
    assert infer["cost_per_1k_requests_usd"] == pytest.approx(0.005 / 30 * 1000)
    assert infer["latency_p99_ms"] == pytest.approx(20.0, rel=0.05)
    assert routes["/health"]["cost_per_request_usd"] == pytest.approx(0.00001)
    by_ns = gpuflight(served, "cost", "--by", "namespace")
    (ml,) = by_ns["rows"]
    assert ml["key"] == "ml" and ml["requests"] == 50
    assert ml["gpu_seconds"] == pytest.approx(6.2)
    assert ml["unattributed_share"] == pytest.approx(1 / 6.2)
    assert ml["cost_usd"] == pytest.approx(0.0062)
    assert ml["cost_per_hour_usd"] == pytest.approx(0.0062 / 3, rel=1e-3)
    assert gpuflight(served, "cost", "--by", "team")["rows"][0]["key"] == "search"
    table = subprocess.run([sys.executable, "-m", "gpuflight", "cost", "--influx", served.url,
                            "--host", served.host, "--since", "3h"],
                           capture_output=True, text=True, env=served.env, timeout=60,
                           check=False)
    assert table.returncode == 0 and served.job in table.stdout and "total" in table.stdout


def test_every_query_of_the_requests_dashboard(served: Run) -> None:
    board = json.loads((generate.DASHBOARD_DIR / "requests.json").read_text())
    variables: dict[str, list[str]] = {}
    for v in board["templating"]["list"]:
        if v["type"] != "query":
            continue
        query = interpolate(v["query"], variables, served.since_ns, served.until_ns, 1.0)
        offered = [str(row[1]) for s in influxql(served.url, DATABASE, query) for row in s.values]
        want = {"host": [served.host], "job": [served.job], "route": ["/health", "/infer"]}
        assert set(want[v["name"]]) <= set(offered), v["name"]
        variables[v["name"]] = want[v["name"]]
    seen: dict[str, Any] = {}
    for p in board["panels"]:
        for t in p["targets"]:
            query = interpolate(t["query"], variables, served.since_ns, served.until_ns, 1.0)
            seen[p["title"]] = influxql(served.url, DATABASE, query)
    ranked = {s.tags[Tags.ROUTE]: dict(zip(s.columns, s.values[0], strict=True))
              for s in seen["Routes ranked by GPU cost"]}
    assert ranked["/infer"]["cost_usd"] == pytest.approx(0.005)
    assert ranked["/infer"]["cost_per_1k_requests"] == pytest.approx(0.005 / 30 * 1000)
    assert ranked["/infer"]["gpu_seconds"] == pytest.approx(5.0)
    assert ranked["/infer"]["launches_per_request"] == 4.0
    per_1k = {s.tags[Tags.ROUTE]: present(s.numbers("cost_per_1k"))
              for s in seen["Cost per 1k requests by route"]}
    assert per_1k["/infer"] == pytest.approx([0.1, 0.3])  # baseline, then 3 times it
    assert per_1k["/health"] == pytest.approx([0.01, 0.01])
    requests_per_s = {s.tags[Tags.ROUTE]: sum(s.numbers("requests"))
                      for s in seen["Requests/s by route"]}
    assert requests_per_s == {"/infer": 30, "/health": 20}  # 1 s intervals
    latency = {s.tags[Tags.ROUTE]: max(present(s.numbers("p99")))
               for s in seen["Latency p50 and p99 by route"]}
    assert latency["/infer"] == pytest.approx(20e6, rel=0.05)
    work = {s.tags[Tags.ROUTE]: present(s.numbers("gpu_time"))
            for s in seen["GPU work per request by route"]}
    assert work["/infer"] == pytest.approx([0.1e9, 0.3e9])
    (share,) = seen["Share of GPU time no request explains"]
    assert present(share.numbers("unexplained")) == pytest.approx(
        [0.5 / 2.6, 0.5 / 3.6])
    (team,) = seen["Cost per hour by namespace and team"]
    assert team.tags == {Tags.NAMESPACE: "ml", Tags.TEAM: "search"}
    assert sum(team.numbers("usd_per_hour")) / 3600 == pytest.approx(0.0062)
    samples = [dict(zip(s.columns, row, strict=True))
               for s in seen["Slowest requests, with their traces"] for row in s.values]
    assert {r[Fields.TRACE_ID] for r in samples if r[Tags.ROUTE] == "/infer"} >= {TRACE}
    assert all(len(str(r[Fields.REQUEST_ID])) == 16 for r in samples)


def test_the_cost_rule_fires_for_the_route_that_got_costlier(served: Run) -> None:
    rules = {r["uid"]: r for g in generate.alerting()["groups"] for r in g["rules"]}
    rule = rules["gpuflight-route-cost"]
    evaluation = evaluate(rule, generate.DATASOURCE_UID, served.url, DATABASE,
                          served.recent_ns + 60 * W)
    mine = [f for f in evaluation.firing if dict(f)[Tags.HOST] == served.host]
    labels = ((Tags.HOST, served.host), (Tags.JOB, served.job), (Tags.ROUTE, "/infer"))
    assert mine == [labels]
    values = evaluation.values_for(labels)
    assert values["RATIO"] == pytest.approx(3.0)
    healthy = ((Tags.HOST, served.host), (Tags.JOB, served.job), (Tags.ROUTE, "/health"))
    assert evaluation.numbers["RATIO"][healthy] == pytest.approx(1.0)
    text = render(rule["annotations"]["summary"], labels, values)
    assert text.startswith(f"/infer of {served.job} on {served.host} costs 0.0003 USD")
    assert "3 times its baseline of 0.0001 USD" in text


def test_a_worker_killed_mid_stream_counts_every_request_once(
        kafka_bootstrap: str, influx_url: str, tmp_path: Path) -> None:
    names = f"requests-kill-{os.getpid()}-{time.time_ns() % 10**6}"
    feed = Feed(kafka_bootstrap, names)
    host, pid = f"{names}-node", 7
    feed.process(host, pid, 3, "serve:7")
    t0 = (time.time_ns() // W - 120) * W
    windows, messages_per_window, per_message = 40, 10, 50
    rid = 1
    for w in range(windows):
        for k in range(messages_per_window):
            end = t0 + w * W + k * (W // messages_per_window)
            batch = []
            for i in range(per_message):
                batch.append(request(rid, "/a" if i % 2 else "/b/{id}", end + i, gpu_s=0.001,
                                     latency_ns=1_000_000))
                rid += 1
            feed.raw(feed.topics.events, host, wire.encode_events(wire.EventBatch(
                host, pid, 3, launches([end], pid, 4, 64), requests=tuple(batch),
                unattributed={"gpu_ns": 1000.0})))
    feed.flush()
    total = windows * messages_per_window * per_message

    def written() -> int:
        found = rows(influx_url, f"SELECT sum(requests) FROM routes WHERE host = '{host}'")
        return int(found[0]["sum"]) if found else 0

    worker = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path)
    try:
        worker.start("first")
        wait_for(lambda: written() > 0, 90, "the first windows written", worker)
        worker.kill()
        assert 0 < written() < total, "the worker was not killed mid-stream"
        worker.start("second")
        wait_for(lambda: written() == total, 120, f"all {total} requests", worker)
        per_window = rows(influx_url, f"SELECT sum(requests) AS n, sum(gpu_ns) AS g FROM routes "
                                      f"WHERE host = '{host}' GROUP BY time(1s) fill(none)")
        assert len(per_window) == windows
        assert {r["n"] for r in per_window} == {messages_per_window * per_message}
        assert {round(r["g"]) for r in per_window} == {messages_per_window * per_message * 10**6}
        (cost,) = rows(influx_url, f"SELECT sum(unattributed_gpu_ns) AS u FROM job_cost "
                                   f"WHERE host = '{host}'")
        assert cost["u"] == windows * messages_per_window * 1000
    finally:
        worker.stop()
