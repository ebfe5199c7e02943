"""The whole pipeline, for real, once per session: the demo workloads on the simulated GPU →
`gpuflight producer` (uprobes) → Kafka → `gpuflight streams` (Faust) → InfluxDB.

`pipeline` runs three jobs while a node-wide producer and a stream worker run:

  unfused   the fusion chain unfused: 8 launches of 32 blocks per step
  fused     the same fused: 1 launch of 512 blocks per step
  transfer  fused, with 4 synchronous H2D copies of 512 KiB per step on a slow link
            (the simulated GPU at 0.5 GB/s): memory-bound by the rule of streams/detect.py

on the simulated GPU's real-time model with its defaults (gpuflight.demo.build.REAL_TIME; the
transfer job's link slowed). The producer is not given the simulated GPU's NVML (GPU figures
come only from a GPU of the machine, if it has one), so the memory-bound rule goes by the CPU.

and returns once InfluxDB holds every launch of each (the windows closed), with what the
workload code says each job did (`expected`), for tests to compare with what was written.
Needs root and bcc (the producer), Kafka and InfluxDB: skips locally without them, fails in CI.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuflight.demo.build import REAL_TIME, build_demo
from gpuflight.demo.pipeline import warm_up
from gpuflight.producer import status
from gpuflight.streams import measurements as m
from gpuflight.streams.measurements import Fields
from tests.conftest import bpf_unavailable_reason, require
from tests.support.influx_fixture import DATABASE
from tests.support.streams_support import StreamWorker, rows, wait_for

WINDOW_S = 1.0
GRACE_S = 1.0
BATCH_BYTES = 512 * 1024
RESULT_BYTES = 4096
TRANSFER_COPIES = 4


@dataclass(frozen=True)
class ExpectedJob:
    launches: int
    #: Blocks per launch (every launch of the job has the same grid) and threads per block.
    grid_blocks: int
    block_threads: int
    h2d_bytes: int
    d2h_bytes: int
    memory_bound: bool


@dataclass(frozen=True)
class PipelineRun:
    influx_url: str
    database: str
    host: str
    #: "unfused", "fused", "transfer" → the job tag the stream app gave each run.
    jobs: Mapping[str, str]
    #: A time range covering every point of the run (ns).
    start_ns: int
    end_ns: int
    window_s: float
    expected: Mapping[str, ExpectedJob]
    kafka_bootstrap: str
    topic_prefix: str


#: (mode, steps, H2D copies per step, extra environment)
RUNS: Mapping[str, tuple[str, int, int, Mapping[str, str]]] = {
    "unfused": ("unfused", 20_000, 1, {}),
    "fused": ("fused", 20_000, 1, {}),
    "transfer": ("fused", 1_000, TRANSFER_COPIES, {"GF_SIM_H2D_GBPS": "0.5"}),
}


def expected_of(name: str) -> ExpectedJob:
    mode, steps, copies, _ = RUNS[name]
    fused = mode == "fused"
    return ExpectedJob(
        launches=steps * (1 if fused else 8),
        grid_blocks=512 if fused else 32,
        block_threads=256,
        h2d_bytes=steps * copies * BATCH_BYTES,
        d2h_bytes=steps * RESULT_BYTES,
        memory_bound=name == "transfer",
    )


def launches_of(influx_url: str, job: str, since_ns: int) -> int | None:
    found = rows(influx_url, f"SELECT sum(count) FROM launches WHERE job = '{job}'"
                 f" AND time >= {since_ns}")
    return int(found[0]["sum"]) if found else None


def _next_window() -> None:
    """Until the wall clock enters the next stream window (the clock is what is waited on)."""
    now = time.time()
    time.sleep((now // WINDOW_S + 1) * WINDOW_S - now)


def _all_windows_closed(influx_url: str, job: str, since_ns: int) -> bool:
    """Each window of the job with launches has its memory-bound verdict (written at close)."""
    where = f"WHERE job = '{job}' AND time >= {since_ns}"
    shapes = rows(influx_url, f"SELECT count({Fields.LAUNCHES}) FROM {m.LAUNCH_SHAPE.name} "
                              f"{where}")
    verdicts = rows(influx_url, f"SELECT count({Fields.VERDICT}) FROM {m.MEMORY_BOUND.name} "
                                f"{where}")
    return bool(shapes) and bool(verdicts) and verdicts[0]["count"] >= shapes[0]["count"]


class _Producer:
    def __init__(self, bootstrap: str, prefix: str, log: Path) -> None:
        self.log = log
        self.status_file = log.with_suffix(".status")
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuflight", "-v", "producer", "--kafka", bootstrap,
                 "--topic-prefix", prefix, "--status-file", str(self.status_file)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

        def ready() -> bool:
            current = status.read(self.status_file)
            return bool(current and current["state"] == status.STATE_READY) or (
                self.proc.poll() is not None)

        wait_for(ready, 120, "the producer to be ready")
        assert self.proc.poll() is None, log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture(scope="session")
def pipeline(kafka_bootstrap: str, influx_url: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[PipelineRun]:
    require(bpf_unavailable_reason())
    from tests.support.capture import wait_for_probe_releases

    work = tmp_path_factory.mktemp("pipeline")
    demo = build_demo(work / "demo")
    prefix = f"pipeline{os.getpid()}"
    worker = StreamWorker(kafka_bootstrap, influx_url, prefix, f"{prefix}-streams",
                          work / "streams", window_s=WINDOW_S, grace_s=GRACE_S)
    (work / "streams").mkdir()
    wait_for_probe_releases()
    start_ns = time.time_ns()
    producer = _Producer(kafka_bootstrap, prefix, work / "producer.log")
    jobs: dict[str, str] = {}
    try:
        worker.start()
        warm_up(demo, producer.status_file)
        for name, (mode, steps, copies, env) in RUNS.items():
            run = subprocess.Popen(demo.command(mode, steps, copies),
                                   env=demo.env(device={**REAL_TIME, **env}))
            assert run.wait(120) == 0, f"{name} failed"
            jobs[name] = f"{demo.fusion.name}:{run.pid}"
            _next_window()  # each run in windows of its own
        producer.stop()
        producer_log = (work / "producer.log").read_text(errors="replace")
        assert producer.proc.returncode == 0, producer_log
        since = start_ns - 60_000_000_000
        for name, job in jobs.items():
            want = expected_of(name).launches

            def complete(job: str = job, want: int = want) -> bool:
                return launches_of(influx_url, job, since) == want

            wait_for(complete, 120, f"all {want} launches of {name} in InfluxDB", worker)
        # Every window is closed: its memory-bound verdict is written then.
        for name, job in jobs.items():

            def closed(job: str = job) -> bool:
                return _all_windows_closed(influx_url, job, since)

            wait_for(closed, 120, f"every window of {name} closed", worker)
        yield PipelineRun(
            influx_url=influx_url,
            database=DATABASE,
            host=socket.gethostname(),
            jobs=jobs,
            start_ns=since,
            end_ns=time.time_ns() + 60_000_000_000,
            window_s=WINDOW_S,
            expected={name: expected_of(name) for name in RUNS},
            kafka_bootstrap=kafka_bootstrap,
            topic_prefix=prefix,
        )
    finally:
        producer.stop()
        worker.stop()
