"""The stack's InfluxDB (gpuflight/stack/) against a real influxd 1.8 (scripts/setup-influxdb).

Points go in the way the stream app writes them (influxdb-client, v2 write API) and come back
the way Grafana reads them (InfluxQL over HTTP).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from gpuflight import stack
from tests.conftest import one_line
from tests.support.influx_fixture import BUCKET


def write(url: str, records: list[Any]) -> None:
    """Write with influxdb-client's v2 API, synchronously, times in ns."""
    from influxdb_client.client.influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.domain.write_precision import WritePrecision

    with InfluxDBClient(url=url, token="", org="-") as client:
        client.write_api(write_options=SYNCHRONOUS).write(
            bucket=BUCKET, record=records, write_precision=WritePrecision.NS)


def test_up_on_a_busy_port_isone_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(stack.StackError) as error:
            stack.influx_up(tmp_path, port)
        assert f"port 127.0.0.1:{port} is busy" in one_line(error)
        with pytest.raises(stack.StackError) as error:
            stack.influx_up(tmp_path, stack.free_port(frozenset({port})), rpc_port=port)
        assert f"RPC port 127.0.0.1:{port} is busy" in one_line(error)
    assert stack.influx_status(tmp_path) == "stopped"


def test_missing_influxd_says_run_setup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(stack.StackError) as error:
        stack.influx_up(tmp_path, stack.free_port(), binary=tmp_path / "influxd")
    assert one_line(error) == f"no influxd at {tmp_path / 'influxd'}: run scripts/setup"
    monkeypatch.setenv("GPUFLIGHT_INFLUXD", str(tmp_path / "elsewhere"))
    with pytest.raises(stack.StackError) as error:
        stack.find_influxd()
    assert one_line(error).endswith("run scripts/setup")


def test_a_start_that_fails_says_why_inone_line(tmp_path: Path) -> None:
    # What influxd prints when it cannot start, from a stand-in that exits at once.
    fake = tmp_path / "influxd"
    fake.write_text('#!/bin/sh\n'
                    'echo \'ts=2026-01-01T00:00:00Z lvl=info msg="InfluxDB starting"\' >&2\n'
                    'echo "run: open server: open meta: permission denied" >&2\n'
                    'exit 1\n')
    fake.chmod(0o755)
    with pytest.raises(stack.StackError) as error:
        stack.influx_up(tmp_path / "stack", stack.free_port(), binary=fake)
    message = one_line(error)
    assert message.startswith(
        "InfluxDB exited while starting: run: open server: open meta: permission denied")
    assert message.endswith(f"(all in {tmp_path / 'stack' / 'influxdb.log'})")
    assert stack.influx_status(tmp_path / "stack") == "stopped"
    assert not (tmp_path / "stack" / "influxdb.pid").exists()


def test_a_start_that_hangs_is_stopped(tmp_path: Path) -> None:
    fake = tmp_path / "influxd"
    fake.write_text('#!/bin/sh\necho \'lvl=info msg="Go runtime"\' >&2\nexec sleep 60\n')
    fake.chmod(0o755)
    with pytest.raises(stack.StackError) as error:
        stack.influx_up(tmp_path / "stack", stack.free_port(), binary=fake, timeout=0.5)
    assert re.match(r"InfluxDB did not answer on http://127\.0\.0\.1:\d+/ping within 0 s, "
                    r'stopped it: lvl=info msg="Go runtime" \(all in ', one_line(error))
    assert stack.influx_status(tmp_path / "stack") == "stopped"


def test_a_stale_pid_file_is_not_trusted(tmp_path: Path) -> None:
    # The pid of a live process that is not this stack's InfluxDB (this very test): left alone.
    (tmp_path / "influxdb.pid").write_text(f"{os.getpid()}\n")
    assert stack.influx_status(tmp_path) == "stopped"
    assert not stack.influx_down(tmp_path)
    assert not (tmp_path / "influxdb.pid").exists()
