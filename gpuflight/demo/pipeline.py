"""`gpuflight demo --pipeline`: the kernel-fusion showcase through the whole pipeline.

A private Kafka and InfluxDB (the stack's, on free ports in a temporary directory), a
node-wide `gpuflight producer`, one `gpuflight streams` worker, then the fusion workload
unfused and fused on the simulated GPU; once InfluxDB holds every launch of both, the
comparison as `gpuflight compare` prints it from InfluxDB. Everything stops at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuflight import stack
from gpuflight.demo.build import REAL_TIME, DemoBuild, build_demo
from gpuflight.producer import status
from gpuflight.producer.contract.errors import GpuflightError, ServiceError
from gpuflight.streams import report
from gpuflight.streams.influxql import InfluxQL, quote_string
from gpuflight.streams.settings import DEFAULT_DATABASE, InfluxSettings

WINDOW_S = 1.0
DEFAULT_STEPS = 10_000
_COMMAND = [sys.executable, "-m", "gpuflight"]


def _say(text: str) -> None:
    print(f"gpuflight demo: {text}", file=sys.stderr, flush=True)


@contextmanager
def _service(command: list[str], log: Path, ready: Callable[[], bool] | None = None,
             timeout_s: float = 120) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while ready is not None and not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:]
                name = next(part for part in command[3:] if not part.startswith("-"))
                raise GpuflightError(f"{name} did not start: {tail[0] if tail else '?'}")
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def warm_up(built: DemoBuild, status_file: Path, timeout_s: float = 120) -> None:
    """Have a node-wide producer (run with --status-file) attach to the simulated GPU before a
    workload runs: it covers a library file once a process maps it (within a second, or more
    while other probes are being released), and every later process from its first call."""
    holder = subprocess.Popen(built.command("fused", 10**9), env=built.env(device=REAL_TIME))
    try:
        deadline = time.monotonic() + timeout_s
        while not _probes(status_file, str(built.runtime)):
            if time.monotonic() > deadline:
                raise GpuflightError(f"the producer did not attach to {built.runtime}")
            time.sleep(0.05)
    finally:
        holder.kill()
        holder.wait()


def _probes(status_file: Path, path_part: str) -> bool:
    """Whether the producer's status says it probes a library file under `path_part`."""
    current = status.read(status_file)
    return any(path_part in lib["path"] for lib in (current or {}).get("libraries", ()))


def _ready(status_file: Path) -> bool:
    current = status.read(status_file)
    return current is not None and current["state"] == status.STATE_READY


def _launches(influx: InfluxSettings, job: str) -> int:
    try:
        found = InfluxQL.from_settings(influx).rows(
            f"SELECT sum(count) FROM launches WHERE job = {quote_string(job)}")
    except ServiceError:
        return 0
    return found[0].integer("sum") if found else 0


def run(steps: int | None = None) -> int:
    steps = DEFAULT_STEPS if steps is None else steps
    built = build_demo()
    data = Path(tempfile.mkdtemp(prefix="gpuflight-demo-pipeline-"))
    _say("starting Kafka and InfluxDB (private, on free ports)")
    kafka = stack.kafka_up(data, stack.free_port())
    try:
        influx_handle = stack.influx_up(data, stack.free_port())
        stack.create_database(influx_handle.url, DEFAULT_DATABASE)
        influx = InfluxSettings(url=influx_handle.url)
        status = _pipeline(built, data, kafka.bootstrap, influx, steps)
    finally:
        stack.influx_down(data)
        stack.kafka_down(data)
    if status == 0:
        shutil.rmtree(data, ignore_errors=True)
    else:
        _say(f"logs kept in {data}")
    return status


def _pipeline(built: DemoBuild, data: Path, bootstrap: str, influx: InfluxSettings,
              steps: int) -> int:
    producer_log, streams_log = data / "producer.log", data / "streams.log"
    producer_status = data / "gpuflight.producer.status"
    producer = [*_COMMAND, "producer", "--kafka", bootstrap, "--topic-prefix", "demo",
                "--status-file", str(producer_status)]
    worker = [*_COMMAND, "streams", "--kafka", bootstrap, "--topic-prefix", "demo",
              "--influx", influx.url, "--window", str(WINDOW_S), "--grace", "1", "--idle", "1",
              "--data-dir", str(data / "streams"), "--app-id", "gpuflight-demo"]
    jobs: dict[str, str] = {}
    utilization: dict[str, float | None] = {}
    _say("starting the node agent (gpuflight producer) and a stream worker")
    with _service(producer, producer_log, lambda: _ready(producer_status)), \
            _service(worker, streams_log):
        warm_up(built, producer_status)
        for mode in ("unfused", "fused"):
            sim = data / f"{mode}.json"
            env = built.env(GF_SIM_REPORT=str(sim))
            _say(f"running the {mode} workload ({steps:,} steps)")
            run = subprocess.Popen(built.command(mode, steps), env=env)
            if run.wait() != 0:
                _say(f"the {mode} workload failed (exit {run.returncode})")
                return 1
            jobs[mode] = f"{built.fusion.name}:{run.pid}"
            utilization[mode] = _simulated_utilization(sim)
            time.sleep(WINDOW_S)
        expected = {"unfused": 8 * steps, "fused": steps}
        _say("waiting for InfluxDB to hold every launch (producer → Kafka → streams)")
        deadline = time.monotonic() + 120
        while any(_launches(influx, jobs[m]) != n for m, n in expected.items()):
            if time.monotonic() > deadline:
                got = {m: _launches(influx, jobs[m]) for m in expected}
                raise GpuflightError(f"InfluxDB holds {got} launches, expected {expected};"
                                     f" see {streams_log}")
            time.sleep(0.5)
    since, until = time.time_ns() - 3600 * 10**9, time.time_ns() + 60 * 10**9
    a = report.job_summary(influx, jobs["unfused"], since, until)
    b = report.job_summary(influx, jobs["fused"], since, until)
    print(report.render_compare(a, b))
    shown = {m: "-" if u is None else f"{100 * u:.0f}%" for m, u in utilization.items()}
    print(f"\nsimulated GPU utilization (the simulator's own counter): unfused {shown['unfused']},"
          f" fused {shown['fused']}")
    return 0


def _simulated_utilization(sim_report: Path) -> float | None:
    try:
        return float(json.loads(sim_report.read_text().splitlines()[-1])["utilization"])
    except (OSError, IndexError, KeyError, ValueError):
        return None
