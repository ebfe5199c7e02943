"""A real InfluxDB 1.8 for tests: `influx_url` ("http://127.0.0.1:PORT"), one per session, with
the database "gpuflight" created; and `influx_auth`, another one with authentication on (an
admin user, the same database). Without the influxd of scripts/setup-influxdb the tests that
ask for them skip locally, and fail under CI=true."""

from __future__ import annotations

import importlib.util
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpuflight import stack
from tests.conftest import require

DATABASE = "gpuflight"
BUCKET = f"{DATABASE}/autogen"


def influx_unavailable_reason() -> str | None:
    if importlib.util.find_spec("influxdb_client") is None:
        return "influxdb-client is not installed (run scripts/setup)"
    try:
        stack.find_influxd()
    except stack.StackError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session")
def influx_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require(influx_unavailable_reason())
    data_dir = tmp_path_factory.mktemp("influx-stack")
    handle = stack.influx_up(data_dir, stack.free_port())
    try:
        stack.create_database(handle.url, DATABASE)
        yield handle.url
    finally:
        stack.influx_down(data_dir)


@dataclass(frozen=True)
class AuthInflux:
    """An InfluxDB with auth-enabled = true and one admin user."""

    url: str
    username: str
    password: str


@pytest.fixture(scope="session")
def influx_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthInflux]:
    require(influx_unavailable_reason())
    data_dir = tmp_path_factory.mktemp("influx-auth-stack")
    admin = AuthInflux("", "gpuflight-admin", secrets.token_urlsafe(12))
    handle = stack.influx_up(data_dir, stack.free_port(), admin=(admin.username, admin.password))
    try:
        stack.create_database(handle.url, DATABASE, username=admin.username,
                              password=admin.password)
        yield AuthInflux(handle.url, admin.username, admin.password)
    finally:
        stack.influx_down(data_dir)
