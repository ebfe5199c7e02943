"""A real single-node Kafka broker for tests: `kafka_bootstrap` ("127.0.0.1:PORT"), one per session.

Use it with `pytest_plugins = ["tests.support.kafka_fixture"]`. Without Java 17+ or the jars of
scripts/setup-kafka the tests that ask for it skip locally, and fail under CI=true.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from gpuflight import stack
from tests.conftest import require


def kafka_unavailable_reason() -> str | None:
    if importlib.util.find_spec("confluent_kafka") is None:
        return "confluent-kafka is not installed (run scripts/setup)"
    try:
        stack.check_kafka_runnable()
    except stack.StackError as exc:
        return str(exc)
    return None


@pytest.fixture
def kafka_ready() -> None:
    """For tests that start brokers of their own."""
    require(kafka_unavailable_reason())


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require(kafka_unavailable_reason())
    data_dir = tmp_path_factory.mktemp("kafka-stack")
    port = stack.free_port()
    handle = stack.kafka_up(data_dir, port, stack.free_port(frozenset({port})))
    try:
        yield handle.bootstrap
    finally:
        stack.kafka_down(data_dir)
