"""The one InfluxQL client (streams/influxql.py) against real InfluxDB 1.8 servers: the tests'
open one, one with authentication (an admin user), one serving HTTPS; and the write path
(streams/sink.py, influxdb-client) with the same settings."""

from __future__ import annotations

import socket

import pytest

from gpuflight import stack
from gpuflight.producer.contract.errors import ServiceError, UsageError
from gpuflight.streams.influxql import (
    InfluxQL,
    InfluxUnreachable,
)
from gpuflight.streams.settings import InfluxSettings
from tests.conftest import one_line
from tests.support.influx_fixture import DATABASE

# -- without a server ------------------------------------------------------------------------


def test_settings_carry_one_kind_of_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLIGHT_INFLUX_USERNAME", "grafana")
    monkeypatch.setenv("GPUFLIGHT_INFLUX_PASSWORD", "s3cret")
    monkeypatch.setenv("GPUFLIGHT_INFLUX_CA_FILE", "/etc/ssl/influx.pem")
    monkeypatch.delenv("GPUFLIGHT_INFLUX_TOKEN", raising=False)
    settings = InfluxSettings.from_environment("https://influx.example:8086")
    assert (settings.username, settings.password, settings.ca_file) == (
        "grafana", "s3cret", "/etc/ssl/influx.pem")
    assert settings.write_token == "grafana:s3cret"  # InfluxDB 1.8's token for the v2 API
    assert "s3cret" not in repr(settings)
    assert InfluxSettings(token="tok").write_token == "tok"
    assert "tok" not in repr(InfluxSettings(token="tok"))
    assert InfluxSettings().write_token == ""
    monkeypatch.setenv("GPUFLIGHT_INFLUX_TOKEN", "tok")
    with pytest.raises(UsageError) as error:
        InfluxSettings.from_environment()
    assert "not both" in one_line(error)
    with pytest.raises(UsageError, match="PASSWORD needs GPUFLIGHT_INFLUX_USERNAME"):
        InfluxSettings(password="x")
    with pytest.raises(UsageError, match="is not http:// or https://"):
        InfluxQL("influx:8086")


def test_nothing_listening_is_one_line() -> None:
    url = f"http://127.0.0.1:{stack.free_port()}"
    with pytest.raises(InfluxUnreachable) as error:
        InfluxQL(url).ping()
    assert one_line(error).startswith(f"cannot reach InfluxDB at {url}: ")
    assert "refused" in one_line(error)
    with pytest.raises(ServiceError) as service_error:
        InfluxQL(url, DATABASE).rows("SELECT * FROM launches")
    assert service_error.value.exit_code == 4


def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(InfluxUnreachable) as error:
            InfluxQL(url, DATABASE, timeout_s=0.3).rows("SELECT * FROM launches")
    assert one_line(error) == f"InfluxDB at {url} did not answer within 0.3 s"


# -- the open InfluxDB -----------------------------------------------------------------------


# -- an InfluxDB with authentication ---------------------------------------------------------


# -- HTTPS -----------------------------------------------------------------------------------
