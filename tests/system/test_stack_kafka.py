"""The local stack (gpuflight/stack/) against a real Kafka 4 broker started from the Maven jars."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflight import stack

pytestmark = pytest.mark.kafka

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
