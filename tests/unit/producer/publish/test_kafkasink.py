"""The Kafka sink (producer/publish/kafkasink.py) at the client's boundary, without a broker: what
librdkafka's fatal error does to the agent (a real broker's are in tests/system/test_kafka.py)."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import EVENT_DTYPE, EventType
from gpuflight.producer.decode.sinks import Guarded
from gpuflight.producer.publish.kafkasink import KafkaSettings, KafkaSink

#: What librdkafka says of a port that answers but is no broker (a KRaft controller's).
UNSUPPORTED = ("Idempotent producer not supported by any of the 1 connected broker(s): "
               "requires Apache Kafka broker version >= 0.11.0")


class FatalProducer:
    """A client that had a fatal error: every call raises it, as confluent-kafka does."""

    def __init__(self, _config: dict[str, Any]) -> None:
        pass

    @staticmethod
    def _fatal() -> KafkaException:
        return KafkaException(KafkaError(KafkaError._UNSUPPORTED_FEATURE, UNSUPPORTED,
                                         fatal=True))

    def produce(self, _topic: str, **_kw: Any) -> None:
        raise self._fatal()

    def poll(self, _timeout: float) -> int:
        raise self._fatal()

    def flush(self, _timeout: float) -> int:
        raise self._fatal()

    def __len__(self) -> int:
        return 3


def test_a_fatal_kafka_error_switches_kafka_off_and_never_ends_the_agent(
        caplog: pytest.LogCaptureFixture) -> None:
    """A producer pointed at a port that is no broker said "ready", then died with 70 at its
    first metrics record (and its --output with it): librdkafka's fatal error came out of
    every call. Now the Kafka output is off (Guarded: the agent ends with 74), and what would
    be sent is counted dropped."""
    pid = os.getpid()
    sink = KafkaSink(KafkaSettings(bootstrap="127.0.0.1:1", flush_interval_s=0.0),
                     producer_factory=FatalProducer, create_topics=False, host="h")
    sink._identities[pid] = wire.ProcessRecord(  # no /proc read for this pid
        "h", pid, 5, None, None, (), None, None, None, None, None, None, "x:1")
    guarded = Guarded(sink, sink.name)
    events = np.zeros(10, dtype=EVENT_DTYPE)
    events["pid"] = pid
    events["type"] = EventType.LAUNCH
    with caplog.at_level(logging.ERROR):
        guarded.write(events)
        guarded.tick()  # sends them: the client's fatal error
        assert guarded.failure is not None and UNSUPPORTED in guarded.failure
        guarded.write(events)
        assert guarded.lost == len(events)
        # The agent's own records do not end it either, nor its last flush.
        sink.publish_metrics(wire.MetricsRecord(host="h", ts_ns=1, uptime_s=1.0, captured=20,
                                                produced=0, published=0, dropped_kernel=0,
                                                dropped_kernel_by_pid={}, dropped_user=0,
                                                dropped_user_by_pid={}, queue_messages=0,
                                                libraries_attached=0))
        sink.forget_processes([pid])
        assert sink.flush(1.0) == 3
        guarded.close()
    assert sink.fatal == UNSUPPORTED
    assert sink.dropped_by_pid[pid] == len(events)
    assert sink.produced_events == 0
    said = [r.getMessage() for r in caplog.records if UNSUPPORTED in r.getMessage()]
    assert len([m for m in said if "nothing more is sent" in m]) == 1, said
