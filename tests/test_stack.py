"""The local stack (gpuflight/stack/) against a real Kafka 4 broker started from the Maven jars."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflight import stack
from tests.conftest import one_line

MESSAGES = 1000


def test_messages_come_back_in_order_with_their_timestamps(kafka_bootstrap: str) -> None:
    from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, KafkaError, Message, Producer

    topic = f"roundtrip-{uuid.uuid4().hex[:8]}"
    assert stack.create_topic(kafka_bootstrap, topic, 1, {"compression.type": "zstd"})
    assert not stack.create_topic(kafka_bootstrap, topic, 1, {})  # exists: fine

    base_ms = int(time.time() * 1000) - 60_000
    failed: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failed.append(error)

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5,
                         "enable.idempotence": True})
    for i in range(MESSAGES):
        producer.produce(topic, value=f"event {i}".encode(), key=b"gpu0",
                         timestamp=base_ms + i, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert failed == []

    # A consumer group, so the offsets topic (one replica on one node) is exercised too.
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"test-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[tuple[int, bytes | None, tuple[int, int]]] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < MESSAGES and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=1.0):
                assert message.error() is None, message.error()
                offset = message.offset()
                assert offset is not None
                got.append((offset, message.value(), message.timestamp()))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()

    assert [offset for offset, _, _ in got] == list(range(MESSAGES))
    assert [value for _, value, _ in got] == [f"event {i}".encode() for i in range(MESSAGES)]
    assert [ts for _, _, ts in got] == [(TIMESTAMP_CREATE_TIME, base_ms + i)
                                        for i in range(MESSAGES)]


def test_topics_are_kept_and_made_on_purpose(kafka_bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource  # admin does not re-export it typed

    topic = f"kept-{uuid.uuid4().hex[:8]}"
    stack.create_topic(kafka_bootstrap, topic, 3, {})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = ConfigResource("topic", topic)
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    assert config["retention.ms"].value == "-1"
    assert config["retention.bytes"].value == "-1"
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3

    # No topic springs into being because someone asked for it.
    assert admin.list_topics("no-such-topic", timeout=10).topics["no-such-topic"].error is not None
    assert "no-such-topic" not in admin.list_topics(timeout=10).topics


@pytest.fixture
def own_stack(kafka_ready: None, tmp_path: Path) -> Iterator[Path]:
    """A data directory whose broker is stopped at the end, whatever the test did."""
    yield tmp_path
    stack.kafka_down(tmp_path)


def test_up_status_down_and_up_again_keeps_the_topics(own_stack: Path) -> None:
    from confluent_kafka.admin import AdminClient

    port = stack.free_port()
    handle = stack.kafka_up(own_stack, port)
    assert not handle.already_running and handle.bootstrap == f"127.0.0.1:{port}"
    assert handle.controller_port != port
    assert stack.kafka_status(own_stack) == f"running on 127.0.0.1:{port} (pid {handle.pid})"
    assert stack.stack_status(own_stack) == [
        f"kafka: {stack.kafka_status(own_stack)}", "influxdb: stopped"
    ]
    stack.create_topic(handle.bootstrap, "kept", 2, {})

    # A second `up` with the same ports is a no-op; other ports are a clear error.
    again = stack.kafka_up(own_stack, port)
    assert again.already_running and again.pid == handle.pid
    with pytest.raises(stack.StackError, match=r"already runs on .*stack down"):
        stack.kafka_up(own_stack, stack.free_port(frozenset({port})))

    assert stack.kafka_down(own_stack)
    assert stack.kafka_status(own_stack) == "stopped"
    assert not (own_stack / "kafka.pid").exists()
    assert not Path(f"/proc/{handle.pid}").exists()
    assert not stack.kafka_down(own_stack)  # nothing to stop: fine

    # The data outlives the process, and the ports may change between runs.
    port2 = stack.free_port(frozenset({port}))
    handle2 = stack.kafka_up(own_stack, port2)
    topics = AdminClient({"bootstrap.servers": handle2.bootstrap}).list_topics(timeout=10).topics
    assert len(topics["kept"].partitions) == 2
    assert (own_stack / "kafka.log.1").exists()  # the previous run's log is kept


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
