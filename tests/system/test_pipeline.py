"""The whole pipeline on the demo workloads (tests/pipeline_fixture.py), and on real PyTorch
across two simulated devices: what reaches InfluxDB is what the workloads did, exactly, per
device too."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuflight.simgpu.build import build, read_counts
from gpuflight.streams import measurements as m
from gpuflight.streams.measurements import Fields, Tags
from tests.conftest import REPO
from tests.support.capture import Producer, wait_for_probe_releases
from tests.support.frameworks import FRAMEWORKS, require_frameworks_python
from tests.support.influx_fixture import DATABASE
from tests.support.pipeline_fixture import GRACE_S, WINDOW_S, PipelineRun
from tests.support.streams_support import StreamWorker, rows, wait_for

pytestmark = [pytest.mark.bpf, pytest.mark.influx, pytest.mark.kafka]


def _sum(run: PipelineRun, query: str) -> int:
    found = rows(run.influx_url, query + f" AND time >= {run.start_ns} AND time <= {run.end_ns}")
    return int(found[0]["sum"]) if found else 0


def test_every_launch_and_byte_of_each_job_reaches_influxdb(pipeline: PipelineRun) -> None:
    for name, job in pipeline.jobs.items():
        want = pipeline.expected[name]
        where = f"WHERE job = '{job}' AND host = '{pipeline.host}'"
        assert _sum(pipeline, f"SELECT sum(count) FROM launches {where}") == want.launches
        assert _sum(pipeline, f"SELECT sum(bytes) FROM copies {where} AND kind = 'H2D'") \
            == want.h2d_bytes
        assert _sum(pipeline, f"SELECT sum(bytes) FROM copies {where} AND kind = 'D2H'") \
            == want.d2h_bytes
        bucket = f"2^{want.grid_blocks.bit_length() - 1}"
        assert _sum(pipeline, f"SELECT sum(count) FROM grid_blocks {where}"
                    f" AND bucket = '{bucket}'") == want.launches
        assert _sum(pipeline, f"SELECT sum(count) FROM syncs {where}") > 0
        # one device: device 0 has it all
        assert _sum(pipeline, f"SELECT sum(launches) FROM devices {where}"
                    " AND device = '0'") == want.launches
        assert _sum(pipeline, f"SELECT sum(h2d_bytes) FROM devices {where}"
                    " AND device = '0'") == want.h2d_bytes
        assert _sum(pipeline, f"SELECT sum(d2h_bytes) FROM devices {where}"
                    " AND device = '0'") == want.d2h_bytes
        assert _sum(pipeline, f"SELECT sum(launches) FROM devices {where}"
                    " AND device != '0'") == 0


def test_only_the_transfer_job_is_memory_bound(pipeline: PipelineRun) -> None:
    for name, job in pipeline.jobs.items():
        verdicts = _sum(pipeline, f"SELECT sum(verdict) FROM memory_bound WHERE job = '{job}'")
        alerts = _sum(pipeline, f"SELECT sum(alert) FROM memory_bound WHERE job = '{job}'")
        if pipeline.expected[name].memory_bound:
            assert verdicts >= 3 and alerts >= 1, (name, verdicts, alerts)
        else:
            assert verdicts == 0 and alerts == 0, (name, verdicts, alerts)


# -- two devices: real PyTorch on the simulated GPU, through the whole pipeline --------------

DEVICE_SUMS = ("launches", "copies", *m.COPY_KIND_VALUES, "syncs", "sync_ns", "copy_ns")


@dataclass(frozen=True)
class TwoDevicesRun:
    influx_url: str
    host: str
    job: str
    start_ns: int
    end_ns: int
    #: The simulated driver's kernel launches per device (its own count: the ground truth).
    driver_launches: dict[str, int]
    #: What the producer's --output has of the process, per device: launches, copies, bytes
    #: by copy kind (copies not known to have failed, as the counting core counts them),
    #: syncs and their CPU time, CPU time in synchronous copies that completed.
    output: dict[str, dict[str, int]]


def per_device_of_output(events: list[dict[str, Any]], pid: int) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for e in events:
        if e["pid"] != pid:
            continue
        sums = out.setdefault(str(e.get("device", 0)), dict.fromkeys(DEVICE_SUMS, 0))
        if e["type"] == "launch" and not e.get("captured"):
            sums["launches"] += 1
        elif e["type"] == "memcpy" and e.get("ok") is not False:
            sums["copies"] += 1
            sums[e["kind"] if e["kind"] in m.COPY_KIND_VALUES else m.UNKNOWN_KIND] += e["bytes"]
            if e.get("ok") and not e["async"]:
                sums["copy_ns"] += e["duration_ns"]
        elif e["type"] == "sync":
            sums["syncs"] += 1
            sums["sync_ns"] += e.get("duration_ns") or 0
    return {d: s for d, s in out.items() if any(s.values())}


def per_device_in_influxdb(run: TwoDevicesRun) -> dict[str, dict[str, int]]:
    columns = ", ".join([f'sum("{Fields.LAUNCHES}") AS "launches"',
                         f'sum("{Fields.COPIES}") AS "copies"',
                         *(f'sum("{m.BYTES_OF_KIND[k]}") AS "{k}"' for k in m.COPY_KIND_VALUES),
                         *(f'sum("{f}") AS "{f}"' for f in (Fields.SYNCS, Fields.SYNC_NS,
                                                             Fields.COPY_NS))])
    found = rows(run.influx_url, f'SELECT {columns} FROM "{m.DEVICES.name}" WHERE'
                 f" job = '{run.job}' AND host = '{run.host}' AND time >= {run.start_ns}"
                 f" AND time <= {run.end_ns} GROUP BY \"{Tags.DEVICE}\"")
    stored = {r[Tags.DEVICE]: {k: int(r[k] or 0) for k in DEVICE_SUMS} for r in found}
    return {d: s for d, s in stored.items() if any(s.values())}


@pytest.fixture(scope="module")
def two_devices(kafka_bootstrap: str, influx_url: str,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoDevicesRun]:
    """tests/frameworks/two_devices.py (the conformance suite's workload: real PyTorch on two
    simulated devices, a peer copy between them) while a node-wide producer publishes to Kafka
    and a stream worker writes InfluxDB; returns once the job's last window is closed."""
    python = require_frameworks_python()
    work = tmp_path_factory.mktemp("two-devices")
    sim = build(work / "simgpu")
    prefix = f"devices{os.getpid()}"
    (work / "streams").mkdir()
    worker = StreamWorker(kafka_bootstrap, influx_url, prefix, f"{prefix}-streams",
                          work / "streams", window_s=WINDOW_S, grace_s=GRACE_S)
    wait_for_probe_releases()
    start_ns = time.time_ns() - 60_000_000_000
    producer = Producer(work / "events.jsonl", "--kafka", kafka_bootstrap, "--topic-prefix",
                        prefix, ready_timeout_s=120, stop_timeout_s=120)
    try:
        worker.start()
        counts = work / "counts.json"
        env = sim.env(devices=2, counts=counts,
                      base={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        workload = subprocess.Popen([str(python), str(FRAMEWORKS / "two_devices.py")], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = workload.communicate(timeout=900)
        assert workload.returncode == 0, stderr[-3000:]
        assert json.loads(stdout.splitlines()[-1])["devices"] == 2
        events = producer.stop()
        (driver,) = [c for c in read_counts(counts) if c["pid"] == workload.pid]
        driver_launches = {str(d): sum(k["per_device"]["launches"][d]
                                       for k in driver["kernels"].values()) for d in (0, 1)}
        host = socket.gethostname()
        mine = [e["ts_ns"] for e in events if e["pid"] == workload.pid]
        last_window = max(mine) // int(WINDOW_S * 1e9) * int(WINDOW_S * 1e9)

        def job_of() -> str | None:
            found = rows(influx_url, f"SHOW TAG VALUES FROM \"{m.DEVICES.name}\" WITH KEY ="
                                     f" \"{Tags.JOB}\" WHERE host = '{host}'")
            jobs = [r["value"] for r in found if r["value"].endswith(f":{workload.pid}")]
            return jobs[0] if len(jobs) == 1 else None

        job = wait_for(job_of, 120, "the workload's job in InfluxDB", worker)

        def closed() -> bool:  # a window's verdict is written when it closes, in order
            return bool(rows(influx_url, f"SELECT {Fields.VERDICT} FROM {m.MEMORY_BOUND.name}"
                                         f" WHERE job = '{job}' AND time = {last_window}"))

        wait_for(closed, 120, "the workload's last window closed", worker)
        yield TwoDevicesRun(influx_url, host, job, start_ns, time.time_ns() + 60_000_000_000,
                            driver_launches, per_device_of_output(events, workload.pid))
    finally:
        producer.kill()
        worker.stop()


@pytest.mark.frameworks
@pytest.mark.simgpu
def test_each_devices_launches_and_bytes_reach_influxdb(two_devices: TwoDevicesRun) -> None:
    truth = two_devices.driver_launches
    assert all(truth.values()), truth  # the workload ran kernels on both devices
    stored = per_device_in_influxdb(two_devices)
    # per device: the driver's own launch count, and the producer's copies and bytes by kind
    assert {d: s["launches"] for d, s in stored.items()} == truth
    assert stored == two_devices.output
    assert stored["0"]["H2D"] > 0 and stored["1"]["D2H"] > 0  # to cuda:0; back from cuda:1
    assert stored["0"]["syncs"] and stored["1"]["syncs"]  # torch.cuda.synchronize(0), (1)
    # Σ over devices = the job's totals in the measurements without a device
    where = f"WHERE job = '{two_devices.job}' AND time >= {two_devices.start_ns}"
    (launches,) = rows(two_devices.influx_url, f"SELECT sum(launches) FROM launch_shape {where}")
    assert launches["sum"] == sum(truth.values())
    for kind, series in ((r["kind"], r) for r in rows(
            two_devices.influx_url, f"SELECT sum(bytes) FROM copies {where} GROUP BY kind")):
        assert series["sum"] == sum(s[kind] for s in stored.values()), kind


@pytest.mark.frameworks
@pytest.mark.simgpu
def test_the_report_splits_the_job_by_device(two_devices: TwoDevicesRun) -> None:
    from gpuflight.streams import report
    from gpuflight.streams.settings import InfluxSettings

    got = report.job_summary(InfluxSettings(url=two_devices.influx_url), two_devices.job,
                             two_devices.start_ns, two_devices.end_ns)
    assert {d: c[Fields.LAUNCHES] for d, c in got.devices.items()} == \
        two_devices.driver_launches
    for device, want in two_devices.output.items():
        assert {k: got.devices[device].get(k, 0) for k in m.COPY_KIND_VALUES} == {
            k: want[k] for k in m.COPY_KIND_VALUES}
    shown = report.render_job(got).replace(",", "")
    for device, n in two_devices.driver_launches.items():
        assert re.search(rf"^{device}\s+{n}\s+{two_devices.output[device]['copies']}\s",
                         shown, re.M), shown


@pytest.mark.frameworks
@pytest.mark.simgpu
def test_the_device_panels_show_each_device(two_devices: TwoDevicesRun) -> None:
    """The job dashboard's device panels, as Grafana runs them, on the two devices' job."""
    from gpuflight.grafana import generate
    from tests.support.grafana_eval import influxql, interpolate

    board = json.loads((REPO / "grafana" / "dashboards" / "job.json").read_text())
    panels = {p["title"]: p for p in board["panels"]}
    variables = {"host": [two_devices.host], "job": [two_devices.job]}

    def per_device(title: str) -> dict[str, dict[str, float]]:
        query = interpolate(panels[title]["targets"][0]["query"], variables,
                            two_devices.start_ns, two_devices.end_ns, WINDOW_S)
        return {s.tags[Tags.DEVICE]: {c: math.fsum(s.numbers(c)) * WINDOW_S
                                      for c in s.columns[1:]}
                for s in influxql(two_devices.influx_url, DATABASE, query)}

    launches = per_device(generate.DEVICE_LAUNCHES_TITLE)
    assert {d: round(c["launches"]) for d, c in launches.items()} == \
        two_devices.driver_launches
    moved = per_device(generate.DEVICE_BYTES_TITLE)
    assert {d: {k: round(v) for k, v in c.items()} for d, c in moved.items()} == {
        d: {k: s[k] for k in m.COPY_KIND_VALUES} for d, s in two_devices.output.items()}
    blocked = per_device(generate.DEVICE_BLOCKED_TITLE)  # seconds per second, times 1e9
    assert {d: (round(c["in_syncs"] * 1e9), round(c["in_synchronous_copies"] * 1e9))
            for d, c in blocked.items()} == {
        d: (s["sync_ns"], s["copy_ns"]) for d, s in two_devices.output.items()}
