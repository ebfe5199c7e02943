"""The stack's InfluxDB (gpuflight/stack/) against a real influxd 1.8 (scripts/setup-influxdb).

Points go in the way the stream app writes them (influxdb-client, v2 write API) and come back
the way Grafana reads them (InfluxQL over HTTP).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuflight import stack
from gpuflight.streams.influxql import CredentialsRefused, InfluxQL
from gpuflight.streams.settings import InfluxSettings
from tests.conftest import one_line
from tests.support.influx_fixture import BUCKET, DATABASE
from tests.support.streams_support import influxql

pytestmark = pytest.mark.influx

DB = DATABASE
T0 = 1_700_000_000_000_000_000  # ns


@pytest.fixture
def own_influx(tmp_path: Path) -> Iterator[Path]:
    """A data directory whose InfluxDB is stopped at the end, whatever the test did."""
    yield tmp_path
    stack.influx_down(tmp_path)


def kernel(gpu: str, name: str, calls: int, seconds: float, ns: int) -> dict[str, Any]:
    """A point as influxdb-client takes it (Point's methods are not typed)."""
    return {"measurement": "kernel", "tags": {"gpu": gpu, "name": name},
            "fields": {"calls": calls, "seconds": seconds}, "time": ns}


def write(url: str, records: list[Any]) -> None:
    """Write with influxdb-client's v2 API, synchronously, times in ns."""
    from influxdb_client.client.influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.domain.write_precision import WritePrecision

    with InfluxDBClient(url=url, token="", org="-") as client:
        client.write_api(write_options=SYNCHRONOUS).write(
            bucket=BUCKET, record=records, write_precision=WritePrecision.NS)


def test_points_written_with_the_v2_api_come_back_by_influxql(
        own_influx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # influxd would take this over its configuration file: it must not reach it.
    monkeypatch.setenv("INFLUXDB_HTTP_BIND_ADDRESS", "127.0.0.1:1")
    handle = stack.influx_up(own_influx, stack.free_port())
    environ = Path(f"/proc/{handle.pid}/environ").read_bytes().split(b"\0")
    assert not any(var.startswith(b"INFLUXDB_") for var in environ)
    stack.create_database(handle.url, DB)
    stack.create_database(handle.url, DB)  # exists: fine

    write(handle.url, [
        kernel("0", "sgemm", 3, 0.25, T0),
        kernel("1", "sgemm", 7, 1.5, T0 + 1),
        f"kernel,gpu=0,name=memcpy calls=1i,seconds=0.125 {T0 + 2}",  # line protocol too
    ])
    (series,) = influxql(handle.url, 'SELECT "calls", "seconds", "gpu", "name" FROM "kernel"')
    assert series.columns == ["time", "calls", "seconds", "gpu", "name"]
    assert series.values == [
        [T0, 3, 0.25, "0", "sgemm"],
        [T0 + 1, 7, 1.5, "1", "sgemm"],
        [T0 + 2, 1, 0.125, "0", "memcpy"],
    ]

    # The same measurement, tags and time again: the point is replaced, not added.
    write(handle.url, [kernel("0", "sgemm", 4, 0.5, T0)])
    (series,) = influxql(handle.url, "SELECT \"calls\", \"seconds\" FROM \"kernel\" "
                                     "WHERE \"gpu\" = '0' AND \"name\" = 'sgemm'")
    assert series.values == [[T0, 4, 0.5]]
    (series,) = influxql(handle.url, 'SELECT COUNT("calls") FROM "kernel"')
    assert series.values == [[0, 3]]


def test_up_status_down_and_up_again_keeps_the_points(own_influx: Path) -> None:
    port = stack.free_port()
    handle = stack.influx_up(own_influx, port)
    assert not handle.already_running and handle.url == f"http://127.0.0.1:{port}"
    assert handle.rpc_port not in {port, 8088}
    status = f"running on 127.0.0.1:{port} (pid {handle.pid})"
    assert stack.influx_status(own_influx) == status
    assert f"influxdb: {status}" in stack.stack_status(own_influx)
    stack.create_database(handle.url, DB)
    write(handle.url, [f"kept value=42i {T0}"])

    # A second `up` with the same port is a no-op; another port is a clear error.
    again = stack.influx_up(own_influx, port)
    assert again.already_running and again.pid == handle.pid
    assert again.rpc_port == handle.rpc_port
    with pytest.raises(stack.StackError, match=r"already runs on .*stack down"):
        stack.influx_up(own_influx, stack.free_port(frozenset({port})))

    assert stack.influx_down(own_influx)
    assert stack.influx_status(own_influx) == "stopped"
    assert not (own_influx / "influxdb.pid").exists()
    assert not Path(f"/proc/{handle.pid}").exists()
    assert not stack.influx_down(own_influx)  # nothing to stop: fine

    # The data outlives the process, and the port may change between runs.
    handle2 = stack.influx_up(own_influx, stack.free_port(frozenset({port})))
    (series,) = influxql(handle2.url, 'SELECT "value" FROM "kept"')
    assert series.values == [[T0, 42]]
    assert (own_influx / "influxdb.log.1").exists()  # the previous run's log is kept


def test_stack_up_creates_the_default_database(own_influx: Path) -> None:
    """#17: `gpuflight stack up` gives a worker started with the defaults its database
    (gpuflight, retention policy autogen), every time, whether it existed or not."""
    assert stack.influx.SERVICE.up is stack.influx.up_with_database
    port = stack.free_port()
    handle = stack.influx.up_with_database(own_influx, port)
    db = InfluxQL(handle.url, DATABASE)
    assert DATABASE in db.databases()
    assert InfluxSettings().bucket == BUCKET  # the worker's default bucket: this database
    (policy,) = db.rows(f'SHOW RETENTION POLICIES ON "{DATABASE}"')
    assert (policy.text("name"), policy["default"]) == ("autogen", True)
    write(handle.url, [f"kept value=1i {T0}"])  # the default bucket takes writes
    again = stack.influx.up_with_database(own_influx, port)  # running, database there: fine
    assert again.already_running
    stack.influx_down(own_influx)
    stack.influx.up_with_database(own_influx, port)  # and after a restart
    assert db.rows('SELECT "value" FROM "kept"')[0].integer("value") == 1


def test_an_auth_enabled_influxdb_keeps_its_admin(own_influx: Path) -> None:
    port = stack.free_port()
    handle = stack.influx_up(own_influx, port, admin=("root", "first-pass"))
    with pytest.raises(CredentialsRefused):
        InfluxQL(handle.url).databases()
    assert InfluxQL(handle.url, username="root", password="first-pass").databases() == []
    stack.influx_down(own_influx)
    stack.influx_up(own_influx, port, admin=("root", "first-pass"))  # checked, not re-made
    stack.influx_down(own_influx)
    with pytest.raises(stack.StackError) as error:
        stack.influx_up(own_influx, port, admin=("root", "another"))
    assert "has users, and root cannot sign in: " in one_line(error)
