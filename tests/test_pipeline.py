"""The whole pipeline on the demo workloads (tests/pipeline_fixture.py): what reaches InfluxDB
is what the workloads did, exactly."""

from __future__ import annotations

from tests.support.pipeline_fixture import PipelineRun
from tests.support.streams_support import rows


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


def test_only_the_transfer_job_is_memory_bound(pipeline: PipelineRun) -> None:
    for name, job in pipeline.jobs.items():
        verdicts = _sum(pipeline, f"SELECT sum(verdict) FROM memory_bound WHERE job = '{job}'")
        alerts = _sum(pipeline, f"SELECT sum(alert) FROM memory_bound WHERE job = '{job}'")
        if pipeline.expected[name].memory_bound:
            assert verdicts >= 3 and alerts >= 1, (name, verdicts, alerts)
        else:
            assert verdicts == 0 and alerts == 0, (name, verdicts, alerts)
