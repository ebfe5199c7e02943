"""The one InfluxQL client (streams/influxql.py) against real InfluxDB 1.8 servers: the tests'
open one, one with authentication (an admin user), one serving HTTPS; and the write path
(streams/sink.py, influxdb-client) with the same settings."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuflight import stack
from gpuflight.producer.contract.errors import ServiceError, UsageError
from gpuflight.streams import measurements as m
from gpuflight.streams.influxql import (
    CredentialsRefused,
    DatabaseNotFound,
    InfluxQL,
    InfluxUnreachable,
    QueryError,
    Row,
)
from gpuflight.streams.measurements import Point
from gpuflight.streams.settings import InfluxSettings
from gpuflight.streams.sink import Batch, InfluxSink
from tests.conftest import one_line, require
from tests.support.grafana_scenarios import write_points
from tests.support.influx_fixture import DATABASE, AuthInflux

pytestmark = pytest.mark.influx

T0 = 1_700_000_000_000_000_000


def worker_point(worker: str, messages: int, at_ns: int) -> Point:
    fields = {f.name: 0 for f in m.STREAMS.fields}
    return Point(m.STREAMS.name, {"worker": worker}, {**fields, "messages": messages}, at_ns)


# -- without a server ------------------------------------------------------------------------


# -- the open InfluxDB -----------------------------------------------------------------------


@pytest.fixture
def filled(influx_url: str) -> str:
    """A database of this module's own with six worker points of two workers."""
    db = "influxql_client"
    points = [worker_point(w, 10 * i + len(w), T0 + i * 10**9)
              for i in range(3) for w in ("w1", "w22")]
    write_points(influx_url, db, points)
    return db


def test_ping_and_typed_rows(influx_url: str, filled: str) -> None:
    db = InfluxQL(influx_url, filled)
    assert db.ping() == "1.8.10"
    rows = db.rows(f"SELECT sum(messages) AS n, last(messages) AS last, mean(messages) AS mean"
                   f" FROM {m.STREAMS.name} GROUP BY worker")
    assert [dict(r) for r in rows] == [
        {"worker": "w1", "time": 0, "n": 36, "last": 22, "mean": 12.0},
        {"worker": "w22", "time": 0, "n": 39, "last": 23, "mean": 13.0},
    ]
    first = rows[0]
    assert isinstance(first, Row)
    assert (first.text("worker"), first.integer("n"), first.number("mean"), first.time_ns) == (
        "w1", 36, 12.0, 0)
    assert first.series.name == m.STREAMS.name and first.series.tags == {"worker": "w1"}
    with pytest.raises(KeyError):
        first["nope"]
    with pytest.raises(ServiceError, match="worker = 'w1', not a number"):
        first.integer("worker")
    # Every statement's series, times in ns; an empty result is no series.
    found = db.series(f"SELECT messages FROM {m.STREAMS.name} WHERE worker = 'w1';"
                      f" SHOW MEASUREMENTS; SELECT * FROM {m.STREAMS.name} WHERE worker = 'x'")
    assert [s.name for s in found] == [m.STREAMS.name, "measurements"]
    assert found[0].column("time") == [T0, T0 + 10**9, T0 + 2 * 10**9]
    assert found[0].numbers("messages") == [2.0, 12.0, 22.0]
    assert found[1].column("name") == [m.STREAMS.name]
    assert filled in db.databases()


def test_query_errors_are_one_line_with_influxdbs_reason(influx_url: str, filled: str) -> None:
    db = InfluxQL(influx_url, filled)
    with pytest.raises(QueryError) as error:
        db.rows("SELEC * FROM streams")
    assert one_line(error).startswith(
        "InfluxDB refused the query (HTTP 400): error parsing query: found SELEC, expected")
    with pytest.raises(QueryError) as error:
        db.rows("SELECT messages FROM streams; SELECT * FROM streams GROUP BY time(1m)")
    assert one_line(error) == (
        "InfluxDB refused the query: GROUP BY requires at least one aggregate function")
    with pytest.raises(QueryError, match="retention policy conflicts"):
        db.execute(f'CREATE DATABASE "{filled}" WITH DURATION 1h')


def test_a_missing_database_names_the_fix(influx_url: str) -> None:
    with pytest.raises(DatabaseNotFound) as error:
        InfluxQL(influx_url, "nosuch").rows("SELECT * FROM launches")
    assert one_line(error) == (
        f'InfluxDB at {influx_url} has no database "nosuch": `gpuflight stack up` creates it on'
        ' the local stack; elsewhere run CREATE DATABASE "nosuch" (InfluxDB 1.8) or map a bucket'
        " to it (2.x: influx v1 dbrp create)")


def test_admin_statements_go_by_post(influx_url: str) -> None:
    db = InfluxQL(influx_url, "influxql_admin")
    db.create_database()
    db.create_database()  # exists: fine
    assert "influxql_admin" in db.databases()
    (policy,) = db.rows('SHOW RETENTION POLICIES ON "influxql_admin"')
    assert (policy.text("name"), policy["default"]) == ("autogen", True)
    write_points(influx_url, "influxql_admin", [worker_point("gone", 1, T0)])
    assert db.rows("SELECT * FROM streams")
    db.execute(f"DROP MEASUREMENT {m.STREAMS.name}")
    assert db.rows("SELECT * FROM streams") == []
    db.execute('DROP DATABASE "influxql_admin"')
    assert "influxql_admin" not in db.databases()


def test_proxies_are_never_used(influx_url: str, filled: str,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """As the sink's client: direct, whatever the environment says (loopback above all)."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert InfluxQL(influx_url, filled).rows("SELECT count(messages) FROM streams")


# -- an InfluxDB with authentication ---------------------------------------------------------


def test_credentials_that_work(influx_auth: AuthInflux) -> None:
    url, user, password = influx_auth.url, influx_auth.username, influx_auth.password
    basic = InfluxQL(url, DATABASE, username=user, password=password)
    token = InfluxQL(url, DATABASE, token=f"{user}:{password}")  # 1.8's token form
    settings = InfluxSettings(url=url, username=user, password=password)
    for client in (basic, token, InfluxQL.from_settings(settings)):
        assert DATABASE in client.databases()
        assert client.rows("SELECT * FROM launches") == []
    assert InfluxQL(url).ping() == "1.8.10"  # /ping needs no credentials


@pytest.mark.parametrize(
    ("credentials", "reason"),
    [({}, "unable to parse authentication credentials"),
     ({"username": "gpuflight-admin", "password": "wrong"}, "authorization failed"),
     ({"username": "nobody"}, "authorization failed"),
     ({"token": "gpuflight-admin:wrong"}, "authorization failed"),
     ({"token": "an-api-token"}, "unable to parse authentication credentials")],
    ids=["none", "wrong-password", "unknown-user", "wrong-token", "not-a-1.8-token"],
)
def test_credentials_refused_are_one_line(influx_auth: AuthInflux, credentials: dict[str, str],
                                          reason: str) -> None:
    client = InfluxQL(influx_auth.url, DATABASE, token=credentials.get("token", ""),
                      username=credentials.get("username", ""),
                      password=credentials.get("password", ""))
    with pytest.raises(CredentialsRefused) as error:
        client.rows("SELECT * FROM launches")
    assert one_line(error) == (
        f"InfluxDB at {influx_auth.url} refused the credentials (HTTP 401: {reason}): set"
        " GPUFLIGHT_INFLUX_TOKEN or GPUFLIGHT_INFLUX_USERNAME and _PASSWORD")
    assert error.value.exit_code == 4


def _sink_writes(settings: InfluxSettings, points: list[Point], *, until_retries: int = 0,
                 then: Any = None, timeout_s: float = 60.0) -> InfluxSink:
    """Run an InfluxSink until it has written `points`: when `until_retries`, first until it
    retried that often, then `then()` (which makes the writes possible)."""
    written = threading.Event()

    async def run() -> InfluxSink:
        sink = InfluxSink(settings, on_written=lambda _token: written.set())
        await sink.start()
        try:
            await sink.put(Batch(points, token="t"))
            deadline = time.monotonic() + timeout_s
            while until_retries and sink.stats.retries < until_retries:
                assert time.monotonic() < deadline, f"only {sink.stats.retries} retries"
                await asyncio.sleep(0.01)
            if then is not None:
                then()
            while not written.is_set():
                assert time.monotonic() < deadline, f"not written: {sink.stats}"
                await asyncio.sleep(0.01)
        finally:
            await sink.stop()
        return sink

    return asyncio.run(run())


def test_the_sink_writes_with_the_same_settings(influx_auth: AuthInflux) -> None:
    settings = InfluxSettings(url=influx_auth.url, username=influx_auth.username,
                              password=influx_auth.password)
    sink = _sink_writes(settings, [worker_point("auth-writer", 7, T0)])
    assert sink.stats.written_points == 1 and sink.stats.retries == 0
    (row,) = InfluxQL.from_settings(settings).rows(
        "SELECT messages FROM streams WHERE worker = 'auth-writer'")
    assert (row.time_ns, row.integer("messages")) == (T0, 7)


def test_the_sink_says_once_that_credentials_are_refused(
        influx_auth: AuthInflux, caplog: pytest.LogCaptureFixture) -> None:
    wrong = InfluxSettings(url=influx_auth.url, username=influx_auth.username, password="wrong",
                           retry_initial_s=0.01, retry_max_s=0.02)

    def stop_there() -> None:
        raise _EnoughError

    with (caplog.at_level(logging.WARNING, logger="gpuflight.streams.sink"),
          pytest.raises(_EnoughError)):
        _sink_writes(wrong, [worker_point("w", 1, T0)], until_retries=5, then=stop_there)
    said = [r.getMessage() for r in caplog.records if r.name == "gpuflight.streams.sink"]
    assert len([s for s in said if "refused the credentials" in s]) == 1, said
    assert not [s for s in said if "write failed" in s], said


class _EnoughError(Exception):
    pass


# -- HTTPS -----------------------------------------------------------------------------------


@pytest.fixture
def https_influx(tmp_path: Path) -> Iterator[stack.InfluxHandle]:
    openssl = shutil.which("openssl")
    require(None if openssl else "no openssl to make a certificate with (run scripts/setup)")
    assert openssl is not None
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    handle = stack.influx_up(tmp_path / "stack", stack.free_port(), tls=(cert, key))
    try:
        yield handle
    finally:
        stack.influx_down(tmp_path / "stack")


def test_https_with_a_ca_file(https_influx: stack.InfluxHandle) -> None:
    url, cert = https_influx.url, https_influx.certificate
    assert url.startswith("https://") and cert is not None
    settings = InfluxSettings(url=url, bucket="tls/autogen", ca_file=str(cert))
    client = InfluxQL.from_settings(settings)
    client.create_database()
    assert client.ping() == "1.8.10"
    sink = _sink_writes(settings, [worker_point("tls-writer", 3, T0)])
    assert sink.stats.written_points == 1
    (row,) = client.rows("SELECT messages FROM streams")
    assert row.integer("messages") == 3
    # Without the CA, the self-signed certificate is refused, in one line.
    with pytest.raises(InfluxUnreachable) as error:
        InfluxQL(url, "tls").rows("SELECT * FROM streams")
    assert "CERTIFICATE_VERIFY_FAILED" in one_line(error)
    with pytest.raises(UsageError, match="cannot read the CA file"):
        InfluxQL(url, ca_file=str(cert.parent / "missing.pem"))


def test_a_missing_database_is_said_once_and_written_once_created(
        influx_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """#17: a worker whose database does not exist logs one line with the fix (not one per
    retry), keeps the points, and writes them as soon as the database is there."""
    database = f"late_{time.time_ns()}"
    settings = InfluxSettings(url=influx_url, bucket=f"{database}/autogen",
                              retry_initial_s=0.01, retry_max_s=0.02)
    with caplog.at_level(logging.WARNING, logger="gpuflight.streams.sink"):
        sink = _sink_writes(settings, [worker_point("late", 5, T0)], until_retries=10,
                            then=lambda: InfluxQL.from_settings(settings).create_database())
    said = [r.getMessage() for r in caplog.records if r.name == "gpuflight.streams.sink"]
    missing = [s for s in said if "has no database" in s]
    assert missing == [f'InfluxDB at {influx_url} has no database "{database}": `gpuflight stack'
                       f' up` creates it on the local stack; elsewhere run CREATE DATABASE'
                       f' "{database}" (InfluxDB 1.8) or map a bucket to it (2.x: influx v1'
                       " dbrp create); the worker keeps the points and retries every 0.02 s"
                       " at most"], said
    assert [s for s in said if "takes the writes again" in s] == [
        f"InfluxDB at {influx_url} takes the writes again"]
    assert len(said) == 2, said
    assert sink.stats.retries >= 10 and sink.stats.written_points == 1
    (row,) = InfluxQL.from_settings(settings).rows("SELECT messages FROM streams")
    assert row.integer("messages") == 5


def test_report_on_the_command_line_with_credentials(
        influx_auth: AuthInflux, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpuflight import cli

    monkeypatch.delenv("GPUFLIGHT_INFLUX_TOKEN", raising=False)
    monkeypatch.setenv("GPUFLIGHT_INFLUX_USERNAME", influx_auth.username)
    monkeypatch.setenv("GPUFLIGHT_INFLUX_PASSWORD", "wrong")
    assert cli.main(["report", "--job", "j", "--influx", influx_auth.url]) == 4
    assert "refused the credentials (HTTP 401: authorization failed)" in capsys.readouterr().err
    monkeypatch.setenv("GPUFLIGHT_INFLUX_PASSWORD", influx_auth.password)
    assert cli.main(["report", "--job", "j", "--influx", influx_auth.url]) == 2
    assert "no data for job 'j' in the time range" in capsys.readouterr().err
    monkeypatch.setenv("GPUFLIGHT_INFLUX_TOKEN", "tok")
    assert cli.main(["report", "--job", "j", "--influx", influx_auth.url]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not both" in err
