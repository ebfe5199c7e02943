"""`gpuflight stack up|down|status`: the local services gpuflight publishes to, on loopback only.

Two services, each a process of its own (gpuflight/stack/service.py says what they share):
  - kafka.py: a single-node Apache Kafka 4 broker in KRaft mode;
  - influx.py: InfluxDB 1.8, which serves the v2 write API and InfluxQL.
A stack lives in one data directory (default ~/.local/share/gpuflight/stack, under
$XDG_DATA_HOME if set).

`up` on a service that already runs with the same ports is a no-op that returns the running one
(`KafkaHandle.already_running`, `InfluxHandle.already_running`); asking for other ports is a
StackError. Every failure is a StackError with a one-line message that says what to do.
"""

from __future__ import annotations

from pathlib import Path

from gpuflight.stack import influx, kafka
from gpuflight.stack.influx import (
    DEFAULT_INFLUX_PORT,
    InfluxHandle,
    create_database,
    find_influxd,
    influx_down,
    influx_status,
    influx_up,
)
from gpuflight.stack.kafka import (
    DEFAULT_KAFKA_PORT,
    KafkaHandle,
    check_kafka_runnable,
    create_topic,
    find_java,
    kafka_down,
    kafka_libs,
    kafka_status,
    kafka_up,
)
from gpuflight.stack.service import (
    HOST,
    Service,
    StackError,
    default_data_dir,
    free_port,
    port_free,
)

__all__ = [
    "DEFAULT_INFLUX_PORT",
    "DEFAULT_KAFKA_PORT",
    "HOST",
    "SERVICES",
    "InfluxHandle",
    "KafkaHandle",
    "Service",
    "StackError",
    "check_kafka_runnable",
    "create_database",
    "create_topic",
    "default_data_dir",
    "find_influxd",
    "find_java",
    "free_port",
    "influx_down",
    "influx_status",
    "influx_up",
    "kafka_down",
    "kafka_libs",
    "kafka_status",
    "kafka_up",
    "port_free",
    "stack_down",
    "stack_status",
    "stack_up",
]

SERVICES: tuple[Service, ...] = (kafka.SERVICE, influx.SERVICE)


def stack_up(data_dir: Path) -> None:
    for service in SERVICES:
        service.up(data_dir)


def stack_down(data_dir: Path) -> None:
    for service in reversed(SERVICES):
        service.down(data_dir)


def stack_status(data_dir: Path) -> list[str]:
    """One line per service: 'kafka: running on 127.0.0.1:9092 (pid N)', then 'influxdb: ...'."""
    return [f"{service.name}: {service.status(data_dir)}" for service in SERVICES]

