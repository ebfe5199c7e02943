"""`gpuflight demo --pipeline`: the kernel-fusion showcase through the whole pipeline.

A private Kafka and InfluxDB (the stack's, on free ports in a temporary directory), a
node-wide `gpuflight producer` (reading the simulated GPU's NVML, as a node agent reads a
GPU's), one `gpuflight streams` worker, then the fusion workload unfused and fused on the
simulated GPU; once InfluxDB holds every launch of both (and NVML's word on each), the
comparison as `gpuflight compare` prints it from InfluxDB. Everything stops at the end.

The node agent reads NVML once a second, each process's newest sample (one sampling period,
10 ms here): a job of a second or less is a sample or two, the last one over a period it ran
only part of. Longer runs (--steps) give steadier figures.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gpuflight import stack
from gpuflight.demo.build import REAL_TIME, DemoBuild, build_demo
from gpuflight.producer import status
from gpuflight.producer.contract.errors import GpuflightError, ServiceError
from gpuflight.streams import measurements as m
from gpuflight.streams import report
from gpuflight.streams.influxql import InfluxQL, quote_string
from gpuflight.streams.measurements import Fields
from gpuflight.streams.settings import DEFAULT_DATABASE, InfluxSettings

WINDOW_S = 1.0
DEFAULT_STEPS = 10_000
_COMMAND = [sys.executable, "-m", "gpuflight"]


def _say(text: str) -> None:
    print(f"gpuflight demo: {text}", file=sys.stderr, flush=True)


@contextmanager
def _service(command: list[str], log: Path, ready: Callable[[], bool] | None = None,
             timeout_s: float = 120, env: Mapping[str, str] | None = None,
             ) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})
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


def _nvml_samples(influx: InfluxSettings, job: str) -> int:
    """How many of the node agent's NVML samples of the job InfluxDB holds."""
    try:
        found = InfluxQL.from_settings(influx).rows(
            f"SELECT count({Fields.SM_UTIL_PCT}) FROM {m.GPU_PROCESS.name}"
            f" WHERE job = {quote_string(job)}")
    except ServiceError:
        return 0
    return found[0].integer("count") if found else 0


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
    activity = data / "nvml"  # the workloads' kernels, for the simulated GPU's NVML
    activity.mkdir()
    producer = [*_COMMAND, "producer", "--kafka", bootstrap, "--topic-prefix", "demo",
                "--status-file", str(producer_status)]
    worker = [*_COMMAND, "streams", "--kafka", bootstrap, "--topic-prefix", "demo",
              "--influx", influx.url, "--window", str(WINDOW_S), "--grace", "1", "--idle", "1",
              "--data-dir", str(data / "streams"), "--app-id", "gpuflight-demo"]
    jobs: dict[str, str] = {}
    _say("starting the node agent (gpuflight producer) and a stream worker")
    with _service(producer, producer_log, lambda: _ready(producer_status),
                  env=built.nvml_env(activity)), _service(worker, streams_log):
        warm_up(built, producer_status)
        for mode in ("unfused", "fused"):
            _say(f"running the {mode} workload ({steps:,} steps)")
            run = subprocess.Popen(built.command(mode, steps), env=built.env(nvml_dir=activity))
            if run.wait() != 0:
                _say(f"the {mode} workload failed (exit {run.returncode})")
                return 1
            jobs[mode] = f"{built.fusion.name}:{run.pid}"
            time.sleep(WINDOW_S)
        expected = {"unfused": 8 * steps, "fused": steps}
        _say("waiting for InfluxDB to hold every launch (producer → Kafka → streams)")
        deadline = time.monotonic() + 120
        while any(_launches(influx, jobs[mode]) != n for mode, n in expected.items()):
            if time.monotonic() > deadline:
                got = {mode: _launches(influx, jobs[mode]) for mode in expected}
                raise GpuflightError(f"InfluxDB holds {got} launches, expected {expected};"
                                     f" see {streams_log}")
            time.sleep(0.5)
        # NVML's word on the last job: the agent's next sample (within a second), then its window.
        deadline = time.monotonic() + 3 * WINDOW_S + 10
        while not all(_nvml_samples(influx, job) for job in jobs.values()):
            if time.monotonic() > deadline:
                _say("InfluxDB holds no NVML sample of a job: its GPU utilization is -")
                break
            time.sleep(0.5)
        time.sleep(2 * WINDOW_S)  # any later sample of the last job
    since, until = time.time_ns() - 3600 * 10**9, time.time_ns() + 60 * 10**9
    a = report.job_summary(influx, jobs["unfused"], since, until)
    b = report.job_summary(influx, jobs["fused"], since, until)
    print(report.render_compare(a, b))
    return 0
