"""The local stack (gpuflight/stack/) against a real Kafka 4 broker started from the Maven jars."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gpuflight import stack
from tests.conftest import one_line


def test_up_on_a_busy_port_isone_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(stack.StackError) as error:
            stack.kafka_up(tmp_path, port)
        assert f"port 127.0.0.1:{port} is busy" in one_line(error)
        with pytest.raises(stack.StackError) as error:
            stack.kafka_up(tmp_path, stack.free_port(frozenset({port})), controller_port=port)
        assert f"controller port 127.0.0.1:{port} is busy" in one_line(error)
    assert stack.kafka_status(tmp_path) == "stopped"


def test_missing_jars_say_run_setup(tmp_path: Path) -> None:
    with pytest.raises(stack.StackError) as error:
        stack.kafka_up(tmp_path, stack.free_port(), libs=tmp_path / "libs")
    assert one_line(error).endswith("run scripts/setup")


def test_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(stack.StackError) as error:
        stack.find_java()
    assert one_line(error).endswith(
        "install a Java 17+ runtime (apt-get install default-jre-headless)")


def test_old_java_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text('#!/bin/sh\necho \'openjdk version "1.8.0_402"\' >&2\n')
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(stack.StackError) as error:
        stack.find_java()
    assert "is Java 8, Kafka 4 needs 17 or later" in one_line(error)


def test_a_stale_pid_file_is_not_trusted(tmp_path: Path) -> None:
    # The pid of a live process that is not this stack's broker (this very test): left alone.
    (tmp_path / "kafka.pid").write_text(f"{os.getpid()}\n")
    assert stack.kafka_status(tmp_path) == "stopped"
    assert not stack.kafka_down(tmp_path)
    assert not (tmp_path / "kafka.pid").exists()


def test_a_secured_broker_takes_only_passwords_it_can_write(tmp_path: Path) -> None:
    from gpuflight.stack.kafka import BrokerSecurity

    for file in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / file).write_text("-----BEGIN-----\n")
    security = BrokerSecurity(tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem",
                              {"producer": 'pa"ss word'})
    with pytest.raises(stack.StackError) as error:
        stack.kafka_up(tmp_path / "data", stack.free_port(), security=security)
    assert "names and passwords may hold only" in one_line(error)
    assert 'pa"ss' not in str(error.value)


def test_a_secured_broker_is_plaintext_on_loopback_only(tmp_path: Path) -> None:
    from gpuflight.stack.kafka import BrokerSecurity, _server_properties

    security = BrokerSecurity(tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem",
                              {"producer": "pw1"}, mtls_port=9300, authorizer=True)
    text = _server_properties(tmp_path, 9100, 9101, security, local_port=9200)
    props = dict(line.split("=", 1) for line in text.splitlines()
                 if line and not line.startswith("#"))
    protocols = dict(p.split(":") for p in props["listener.security.protocol.map"].split(","))
    bound = {item.split("://")[0]: item.split("://")[1]
             for item in props["listeners"].split(",")}
    assert {name: protocols[name] for name in bound} == {
        "CLIENT": "SASL_SSL", "MTLS": "SSL", "LOCAL": "PLAINTEXT", "CONTROLLER": "PLAINTEXT"}
    assert all(address.startswith("127.0.0.1:") for address in bound.values())
    assert props["listener.name.mtls.ssl.client.auth"] == "required"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:ANONYMOUS;User:admin"
    assert props["inter.broker.listener.name"] == "LOCAL"
