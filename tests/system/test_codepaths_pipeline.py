"""Code paths through the pipeline: the node agent walks every call's Python stack
(`producer --stack-sampling 1`, exact), publishes each process's paths with what their calls
cost to a real Kafka, `gpuflight streams` folds them to user functions into a real InfluxDB
(`code_paths`), and `gpuflight report --by function`, `gpuflight profile` (from Kafka, as
pprof) and every query of the "Code paths" dashboard read them back: each function's
launches, bytes and calls exactly what the workload did, and what the agent recorded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuflight.grafana import generate
from gpuflight.producer.contract import wire
from gpuflight.producer.contract.costs import busy_gpu_ns
from gpuflight.producer.decode.codepaths import read_profile
from gpuflight.streams.measurements import Fields, Tags
from tests.conftest import REPO
from tests.support.capture import GPUFLIGHT, read_events, wait_for_probe_releases
from tests.support.counting import events_from_json
from tests.support.grafana_eval import influxql, interpolate, present
from tests.support.influx_fixture import DATABASE
from tests.support.promlint import lint, samples, scrape
from tests.support.streams_support import StreamWorker, read_topic, rows, wait_for
from tests.workloads.build import build_simgpu
from tests.workloads.pylaunch import UPLOAD

pytestmark = [pytest.mark.bpf, pytest.mark.kafka, pytest.mark.influx]

CALLS = 400
W = 1_000_000_000
#: pylaunch, started once the agent has attached to the library it loaded first.
GATED = ("import ctypes, runpy, sys; ctypes.CDLL(sys.argv[1]); sys.stdin.readline();"
         " sys.argv = ['pylaunch', *sys.argv[1:]];"
         " runpy.run_module('tests.workloads.pylaunch', run_name='__main__')")
#: The user function's file: its last directory and name.
SERVE = "demo/serve.py"


def test_each_user_function_gets_what_its_calls_did(kafka_bootstrap: str, influx_url: str,
                                                     tmp_path: Path) -> None:
    lib = build_simgpu(tmp_path / "gpu") / "libcudart.so.12"
    prefix = f"paths{os.getpid()}{time.time_ns() % 10**6}"
    slurm = f"p{time.time_ns() % 10**9}"
    streams = StreamWorker(kafka_bootstrap, influx_url, prefix, f"{prefix}-app", tmp_path)
    streams.start()
    wait_for_probe_releases()
    log, out = tmp_path / "producer.log", tmp_path / "node.jsonl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with log.open("wb") as log_out:
        producer = subprocess.Popen(
            [*GPUFLIGHT, "-v", "producer", "--kafka", kafka_bootstrap, "--topic-prefix", prefix,
             "--output", str(out), "--stack-sampling", "1", "--metrics-port", str(port)],
            stdout=log_out, stderr=subprocess.STDOUT, start_new_session=True)
    workload = None
    try:
        wait_for(lambda: "ready" in log.read_text(errors="replace")
                 or producer.poll() is not None, 120, "the producer to be ready")
        assert producer.poll() is None, log.read_text(errors="replace")[-3000:]
        workload = subprocess.Popen(
            [sys.executable, "-c", GATED, str(lib), str(CALLS)], stdin=subprocess.PIPE,
            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO),
                                      "SLURM_JOB_ID": slurm})
        wait_for(lambda: any("attached" in line and str(lib) in line
                             for line in log.read_text(errors="replace").splitlines()),
                 120, "the producer to attach to the simulated GPU")
        assert workload.stdin is not None
        workload.stdin.write("go\n")
        workload.stdin.close()
        assert workload.wait(120) == 0
        # cudaMalloc, the launches, the uploads and their syncs, the last copy.
        calls = 1 + CALLS + CALLS // 4 + 2 * (CALLS // 10) + 1
        wait_for(lambda: len([e for e in read_events(out) if e.get("pid") == workload.pid])
                 == calls, 60, "the calls in --output")
        # Every recorded call walked (1 in 1), and what the walks took, on the agent's /metrics.
        text = scrape(f"http://127.0.0.1:{port}/metrics")
        assert lint(text) == []
        got = samples(text)
        walks = got[("gpuflight_agent_code_path_walks_total", ())]
        assert got[("gpuflight_agent_code_path_calls_total", ())] == walks >= calls, text
        assert got[("gpuflight_agent_code_path_walk_seconds_total", ())] > 0
        assert got[("gpuflight_agent_code_path_period_max", ())] == 1
        assert got[("gpuflight_agent_code_path_cost_budget_seconds", ())] == 0
    finally:
        if workload is not None and workload.poll() is None:
            workload.kill()
        os.killpg(producer.pid, signal.SIGTERM)
        producer.wait(120)
    assert producer.returncode == 0, log.read_text(errors="replace")[-3000:]
    recorded = [e for e in read_events(out) if e.get("pid") == workload.pid]
    job = f"slurm:{slurm}"
    launch, copy = f"Gpu.launch ({SERVE})", f"Gpu.copy ({SERVE})"

    def functions() -> dict[str, dict[str, float]]:
        found = rows(influx_url, f"SELECT sum({Fields.LAUNCHES}) AS launches,"
                                 f" sum({Fields.BYTES}) AS bytes, sum({Fields.CALLS}) AS calls,"
                                 f" sum({Fields.BLOCKED_NS}) AS blocked FROM code_paths"
                                 f" WHERE {Tags.JOB} = '{job}' GROUP BY {Tags.FUNCTION}")
        return {r[Tags.FUNCTION]: r for r in found}

    try:
        got = wait_for(lambda: (f := functions()) and sum(r["calls"] for r in f.values())
                       == len(recorded) and f, 120, "every call's path in InfluxDB", streams)
    finally:
        streams.stop()
    # Every path goes through serve.py's Gpu (the repository's, not site-packages): that is
    # the user function, whichever of the workload's functions called it.
    assert got[launch]["launches"] == CALLS + CALLS // 4
    assert got[copy]["bytes"] == (CALLS // 10) * UPLOAD + 4096
    syncs = sum(e["duration_ns"] for e in recorded if e["api"] == "cudaStreamSynchronize")
    assert abs(got[f"Gpu.sync ({SERVE})"]["blocked"] - syncs) <= 1
    # What the agent recorded is what the paths say: one call each.
    assert sum(r["calls"] for r in got.values()) == len(recorded)

    report = subprocess.run(
        [*GPUFLIGHT, "report", "--by", "function", "--job", job, "--influx", influx_url,
         "--bucket", "gpuflight/autogen", "--since", "1h", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "GPUFLIGHT_INFLUX_TOKEN": ""})
    assert report.returncode == 0, report.stderr
    table = {r["function"]: r for r in json.loads(report.stdout)["rows"]}
    assert table[launch]["launches"] == CALLS + CALLS // 4
    assert table[copy]["bytes_copied"] == (CALLS // 10) * UPLOAD + 4096
    assert sum(r["calls"] for r in table.values()) == len(recorded)

    # A replay into another topic carries the paths of the range too.
    target = f"{prefix}.replayed"
    replayed = subprocess.run(
        [*GPUFLIGHT, "replay", "--kafka", kafka_bootstrap, "--topic-prefix", prefix, "--from",
         str(min(e["ts_ns"] for e in recorded) / 1e9 - 1), "--to", str(time.time()),
         "--pid", str(workload.pid), "--to-topic", target],
        capture_output=True, text=True, timeout=120, check=False)
    assert replayed.returncode == 0, replayed.stderr
    again = [wire.decode_events(m.value()) for m in read_topic(kafka_bootstrap, target)]
    assert sum(p.values.get("calls", 0) for b in again for p in b.paths) == len(recorded)

    # The job's paths back from Kafka as pprof: every call, each launch through Gpu.launch.
    profile = tmp_path / "job.pb.gz"
    done = subprocess.run(
        [*GPUFLIGHT, "profile", "--kafka", kafka_bootstrap, "--topic-prefix", prefix, "--job",
         job, "--output", str(profile)], capture_output=True, text=True, timeout=120,
        check=False)
    assert done.returncode == 0, done.stderr
    got_profile = read_profile(profile)
    strings = list(got_profile.string_table)
    kinds = [strings[t.type] for t in got_profile.sample_type]
    names = {f.id: strings[f.name] for f in got_profile.function}
    where = {loc.id: names[loc.line[0].function_id] for loc in got_profile.location}
    value = {k: 0 for k in kinds}
    through_launch = 0
    for sample in got_profile.sample:
        for kind, v in zip(kinds, sample.value, strict=True):
            value[kind] += v
        if "Gpu.launch" in (where[i] for i in sample.location_id):
            through_launch += sample.value[kinds.index("launches")]
    assert value["calls"] == len(recorded) and through_launch == CALLS + CALLS // 4
    nobody = subprocess.run(
        [*GPUFLIGHT, "profile", "--kafka", kafka_bootstrap, "--topic-prefix", prefix, "--job",
         "slurm:none", "--output", str(tmp_path / "none.pb.gz")], capture_output=True,
        text=True, timeout=120, check=False)
    assert nobody.returncode == 2 and "no process of job slurm:none" in nobody.stderr
    assert len(nobody.stderr.strip().splitlines()) == 1

    # The dashboard's queries, as Grafana runs them (its variables from their own queries).
    board = json.loads((generate.DASHBOARD_DIR / "paths.json").read_text())
    since, until = min(e["ts_ns"] for e in recorded) - 60 * W, time.time_ns()
    chosen: dict[str, list[str]] = {}
    for v in board["templating"]["list"]:
        offered = [str(row[1]) for s in influxql(influx_url, DATABASE, interpolate(
            v["query"], chosen, since, until, 1.0)) for row in s.values]
        want = {"host": socket.gethostname(), "job": job}[v["name"]]
        assert want in offered, (v["name"], offered)
        chosen[v["name"]] = [want]
    seen = {p["title"]: influxql(influx_url, DATABASE, interpolate(
        t["query"], chosen, since, until, 1.0)) for p in board["panels"] for t in p["targets"]}
    ranked: dict[str, dict[str, Any]] = {
        s.tags[Tags.FUNCTION]: dict(zip(s.columns, s.values[0], strict=True))
        for s in seen[generate.CODE_PATHS_TITLE]}
    assert ranked[launch]["launches"] == CALLS + CALLS // 4
    assert ranked[copy]["bytes_copied"] == (CALLS // 10) * UPLOAD + 4096
    assert sum(r["calls"] for r in ranked.values()) == len(recorded)
    per_s = {s.tags[Tags.FUNCTION]: sum(present(s.numbers("launches")))
             for s in seen["Kernel launches/s by function"]}
    assert per_s[launch] == CALLS + CALLS // 4  # 1 s intervals: the sum is the count
    copied = {s.tags[Tags.FUNCTION]: sum(present(s.numbers("bytes")))
              for s in seen["Bytes copied/s by function"]}
    assert copied[copy] == (CALLS // 10) * UPLOAD + 4096
    blocked = {s.tags[Tags.FUNCTION]: sum(present(s.numbers("blocked_share")))
               for s in seen[f"{generate.BLOCKED_TERM} by function"]}
    assert blocked[f"Gpu.sync ({SERVE})"] == pytest.approx(syncs / 1e9)
    # GPU time: the busy model over every call the agent recorded, whole — however its reads
    # cut the process's busy spans — split over the functions.
    busy_s = busy_gpu_ns(events_from_json(recorded)).total_ns / 1e9
    assert busy_s > 0
    assert sum(r["gpu_seconds"] for r in ranked.values()) == pytest.approx(busy_s, rel=1e-6)
    gpu = {s.tags[Tags.FUNCTION]: sum(present(s.numbers("gpu_seconds_per_s")))
           for s in seen["GPU time/s by function"]}
    assert sum(gpu.values()) == pytest.approx(busy_s, rel=1e-6)  # 1 s intervals


#: The function of each call the demo server makes (gpuflight/demo/serve.py's Gpu).
SERVED_BY = {"cudaLaunchKernel": f"Gpu.launch ({SERVE})", "cudaMemcpy": f"Gpu.copy ({SERVE})",
             "cudaStreamSynchronize": f"Gpu.sync ({SERVE})"}


def test_each_route_gets_what_its_functions_calls_did(kafka_bootstrap: str, influx_url: str,
                                                      tmp_path: Path) -> None:
    """A real HTTP server (gpuflight.demo.serve: a thread per connection) under the node agent
    with every call walked: each call's path goes to the route of the request it was made for
    (route_code_paths), exactly what the agent attributed; the warm-up calls made for no
    request count for their functions (code_paths) and for no route. `report --by
    route,function` and the dashboard's table read the same."""
    lib = build_simgpu(tmp_path / "gpu") / "libcudart.so.12"
    prefix = f"routes{os.getpid()}{time.time_ns() % 10**6}"
    slurm = f"r{time.time_ns() % 10**9}"
    streams = StreamWorker(kafka_bootstrap, influx_url, prefix, f"{prefix}-app", tmp_path)
    streams.start()
    wait_for_probe_releases()
    log, out = tmp_path / "producer.log", tmp_path / "node.jsonl"
    with log.open("wb") as log_out:
        producer = subprocess.Popen(
            [*GPUFLIGHT, "-v", "producer", "--kafka", kafka_bootstrap, "--topic-prefix", prefix,
             "--output", str(out), "--stack-sampling", "1"],
            stdout=log_out, stderr=subprocess.STDOUT, start_new_session=True)
    server = None
    try:
        wait_for(lambda: "ready" in log.read_text(errors="replace")
                 or producer.poll() is not None, 120, "the producer to be ready")
        assert producer.poll() is None, log.read_text(errors="replace")[-3000:]
        server = subprocess.Popen(
            [sys.executable, "-m", "gpuflight.demo.serve", "--runtime", str(lib), "--clients",
             "3", "--requests", "40", "--hold"], stdin=subprocess.PIPE, text=True, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "SLURM_JOB_ID": slurm})
        wait_for(lambda: any("attached" in line and str(lib) in line
                             for line in log.read_text(errors="replace").splitlines()),
                 120, "the producer to attach to the simulated GPU")
        assert server.stdin is not None
        server.stdin.write("go\n")
        server.stdin.close()
        assert server.wait(300) == 0
        wait_for(lambda: len([e for e in read_events(out) if e.get("pid") == server.pid
                              and e["type"] == "request"]) == 120, 60, "the requests")
    finally:
        if server is not None and server.poll() is None:
            server.kill()
        os.killpg(producer.pid, signal.SIGTERM)
        producer.wait(120)
    assert producer.returncode == 0, log.read_text(errors="replace")[-3000:]
    mine = [e for e in read_events(out) if e.get("pid") == server.pid]
    route_of = {r["request_id"]: r["route"] for r in mine if r["type"] == "request"}
    calls = [e for e in mine if e["type"] != "request"]
    # What the agent attributed, by (route, function): a call shared by requests in flight
    # gives each its share.
    want: dict[tuple[str, str], list[float]] = {}
    for e in calls:
        shares = ([(e["request_id"], 1.0)] if "request_id" in e else
                  [(rid, share) for rid, share in e.get("requests", ())])
        for rid, share in shares:
            sums = want.setdefault((route_of[rid], SERVED_BY[e["api"]]), [0.0, 0.0])
            sums[0] += share
            sums[1] += share * (e["type"] == "launch")
    assert {route for route, _ in want} == {"/v1/embed/{id}", "/v1/generate/{id}"}
    made_for_requests = sum(v[0] for v in want.values())
    warm_up = [e for e in calls if "request_id" not in e and "requests" not in e]
    assert warm_up and len(warm_up) + made_for_requests == pytest.approx(len(calls))
    job = f"slurm:{slurm}"

    def by_route() -> dict[tuple[str, str], dict[str, float]]:
        found = rows(influx_url, f"SELECT sum({Fields.LAUNCHES}) AS launches,"
                                 f" sum({Fields.CALLS}) AS calls FROM route_code_paths"
                                 f" WHERE {Tags.JOB} = '{job}'"
                                 f" GROUP BY {Tags.ROUTE}, {Tags.FUNCTION}")
        return {(r[Tags.ROUTE], r[Tags.FUNCTION]): r for r in found}

    def every_call() -> float:
        found = rows(influx_url, f"SELECT sum({Fields.CALLS}) AS calls FROM code_paths"
                                 f" WHERE {Tags.JOB} = '{job}'")
        return found[0]["calls"] if found else 0.0

    try:
        got = wait_for(lambda: (g := by_route()) and sum(r["calls"] for r in g.values())
                       == pytest.approx(made_for_requests) and every_call() == len(calls)
                       and g, 120, "every call's path in InfluxDB", streams)
    finally:
        assert streams.stop() == 0, streams.output()[-3000:]
    assert set(got) == set(want)
    for key, (n, launched) in want.items():
        assert got[key]["calls"] == pytest.approx(n), key
        assert got[key]["launches"] == pytest.approx(launched), key
    generate_launches = want["/v1/generate/{id}", SERVED_BY["cudaLaunchKernel"]][1]
    assert generate_launches == 29 * 24  # the server's plan: 29 /generate requests, 24 each
    # Each request names its functions: Gpu.launch with exactly the launches made for it.
    requests = {r["request_id"]: r for r in mine if r["type"] == "request"}
    for rid, r in requests.items():
        named = {f: n for f, n, _ in r.get("code_paths", ())}
        launched = sum(e["type"] == "launch" and e.get("request_id") == rid for e in calls)
        assert named.get(SERVED_BY["cudaLaunchKernel"], 0.0) == launched, r
        assert bool(named) == (r["route"] != "/healthz"), r
    # The slowest requests of each window name the function that cost them most.
    slowest = rows(influx_url, f"SELECT {Fields.TOP_FUNCTION}, {Fields.REQUEST_ID} FROM"
                               f" request_samples WHERE {Tags.JOB} = '{job}'")
    by_hex = {f"{rid:016x}": r for rid, r in requests.items()}
    named_slowest = [s for s in slowest if s.get(Fields.TOP_FUNCTION)]
    assert named_slowest
    for s in slowest:
        r = by_hex[s[Fields.REQUEST_ID]]
        assert s.get(Fields.TOP_FUNCTION) == (r["code_paths"][0][0] if "code_paths" in r
                                              else None), (s, r)

    report = subprocess.run(
        [*GPUFLIGHT, "report", "--by", "route,function", "--job", job, "--influx", influx_url,
         "--bucket", "gpuflight/autogen", "--since", "1h", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "GPUFLIGHT_INFLUX_TOKEN": ""})
    assert report.returncode == 0, report.stderr
    table = {(r["route"], r["function"]): r for r in json.loads(report.stdout)["rows"]}
    assert {k: pytest.approx(r["launches"]) for k, r in table.items()} == {
        k: v[1] for k, v in want.items()}
    routes = [route for route, _ in table]
    assert routes == sorted(routes, key=routes.index)  # each route's functions together

    # The job's profile from Kafka: each sample of a route's requests labelled with it.
    profile = tmp_path / "job.pb.gz"
    done = subprocess.run(
        [*GPUFLIGHT, "profile", "--kafka", kafka_bootstrap, "--topic-prefix", prefix, "--job",
         job, "--output", str(profile)], capture_output=True, text=True, timeout=120,
        check=False)
    assert done.returncode == 0, done.stderr
    got_profile = read_profile(profile)
    strings = list(got_profile.string_table)
    launches_at = [strings[t.type] for t in got_profile.sample_type].index("launches")
    labelled: dict[str | None, int] = {}
    for sample in got_profile.sample:
        route = {strings[x.key]: strings[x.str] for x in sample.label}.get("route")
        labelled[route] = labelled.get(route, 0) + sample.value[launches_at]
    per_route: dict[str | None, float] = {}
    for (route, _), (_, launched) in want.items():
        per_route[route] = per_route.get(route, 0.0) + launched
    per_route[None] = sum(e["type"] == "launch" for e in warm_up)
    assert labelled == per_route

    board = json.loads((generate.DASHBOARD_DIR / "paths.json").read_text())
    since, until = min(e["ts_ns"] for e in calls) - 60 * W, time.time_ns()
    chosen = {"host": [socket.gethostname()], "job": [job]}
    (panel,) = [p for p in board["panels"] if p["title"] == generate.ROUTE_CODE_PATHS_TITLE]
    series = influxql(influx_url, DATABASE, interpolate(panel["targets"][0]["query"], chosen,
                                                        since, until, 1.0))
    shown = {(s.tags[Tags.ROUTE], s.tags[Tags.FUNCTION]):
             dict(zip(s.columns, s.values[0], strict=True)) for s in series}
    assert {k: pytest.approx(r["launches"]) for k, r in shown.items()} == {
        k: v[1] for k, v in want.items()}
