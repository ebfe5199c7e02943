"""Helpers for the stream worker tests: deterministic event scripts published to a real Kafka,
a worker run as the `gpuflight streams` command, and InfluxQL reads of what it wrote."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import API_IDS, EVENT_DTYPE, F_HAS_RESULT, EventType
from gpuflight.producer.contract.wire import ensure_topics, topic_configs
from gpuflight.streams.influxql import InfluxQL, Series

Events = npt.NDArray[np.void]


def launches(ts_ns: Sequence[int], pid: int, grid: int, block: int,
             handle: int = 0xA000) -> Events:
    events = np.zeros(len(ts_ns), dtype=EVENT_DTYPE)
    events["ts_ns"] = ts_ns
    events["pid"] = pid
    events["tid"] = pid
    events["type"] = EventType.LAUNCH
    events["api"] = API_IDS["cudaLaunchKernel"]
    events["handle"] = handle
    events["dim"] = [grid, 1, 1, block, 1, 1]
    return events


def copies(ts_ns: Sequence[int], pid: int, kind: int, nbytes: int, duration_ns: int) -> Events:
    events = np.zeros(len(ts_ns), dtype=EVENT_DTYPE)
    events["ts_ns"] = ts_ns
    events["pid"] = pid
    events["tid"] = pid
    events["type"] = EventType.MEMCPY
    events["api"] = API_IDS["cudaMemcpy"]
    events["flags"] = F_HAS_RESULT
    events["bytes"] = nbytes
    events["duration_ns"] = duration_ns
    events["dim"][:, 0] = kind
    return events


@dataclass
class Feed:
    """Publishes to the topics of one prefix, as a producer would (keyed by host)."""

    bootstrap: str
    prefix: str
    partitions: int = 3
    #: librdkafka security properties (a secured broker).
    config: Mapping[str, str] = field(default_factory=dict, repr=False)
    topics: wire.Topics = field(init=False)
    _producer: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient

        self.topics = wire.Topics.with_prefix(self.prefix)
        admin = AdminClient({**self.config, "bootstrap.servers": self.bootstrap})
        assert ensure_topics(admin, topic_configs(self.topics), self.partitions)
        self._producer = Producer({**self.config, "bootstrap.servers": self.bootstrap,
                                   "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 5,
                                   "compression.type": "zstd",  # as the producer sends
                                   "message.max.bytes": 8_000_000})
        self._failed: list[str] = []
        #: host → the events partitions Kafka put its batches on (from delivery reports)
        self.event_partitions: dict[str, set[int]] = {}

    def process(self, host: str, pid: int, start_time: int, job: str) -> None:
        record = wire.ProcessRecord(host, pid, start_time, None, job.split(":", maxsplit=1)[0],
                                    (), None, None, None, None, None, None, job)
        self._producer.produce(self.topics.processes, key=wire.process_key(host, pid, start_time),
                               value=wire.encode_process(record))

    def exited(self, host: str, pid: int, start_time: int, job: str, exited_ns: int) -> None:
        """The process's record again, with its exit (as the agent sends it once it is gone)."""
        record = wire.ProcessRecord(host, pid, start_time, None, job.split(":", maxsplit=1)[0],
                                    (), None, None, None, None, None, None, job,
                                    exited_ns=exited_ns)
        self._producer.produce(self.topics.processes, key=wire.process_key(host, pid, start_time),
                               value=wire.encode_process(record))

    def events(self, host: str, pid: int, start_time: int, events: Events,
               kernels: dict[int, wire.KernelName] | None = None) -> None:
        batch = wire.EventBatch(host, pid, start_time, events, kernels or {})
        self._producer.produce(self.topics.events, key=wire.host_key(host),
                               value=wire.encode_events(batch),
                               timestamp=batch.first_ts_ns // 1_000_000,
                               on_delivery=self._delivered)

    def raw(self, topic: str, host: str, value: bytes) -> None:
        self._producer.produce(topic, key=wire.host_key(host), value=value)

    def nvml(self, host: str, ts_ns: int, utilization: int) -> None:
        gpu = wire.GpuSample(0, None, None, utilization, *[None] * 9)
        self.raw(self.topics.nvml, host, wire.encode_nvml(wire.NvmlRecord(host, ts_ns, (gpu,))))

    def metrics(self, host: str, ts_ns: int, kernel: dict[int, int],
                user: dict[int, int], agent_died: dict[int, int] | None = None) -> None:
        """A producer's counters, with what it lost by pid (the rest of its counters made up)."""
        died = agent_died or {}
        record = wire.MetricsRecord(host, ts_ns, 1.0, 1, 1, 1, sum(kernel.values()), kernel,
                                    sum(user.values()), user, 0, 1,
                                    dropped_agent_died=sum(died.values()),
                                    dropped_agent_died_by_pid=died)
        self.raw(self.topics.metrics, host, wire.encode_metrics(record))

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self._failed.append(str(error))
        else:
            self.event_partitions.setdefault(message.key().decode(), set()).add(
                message.partition())

    def flush(self) -> None:
        assert self._producer.flush(60) == 0, "Kafka did not take the test's messages"
        assert not self._failed, f"Kafka refused messages: {self._failed[:3]}"


def hosts_on_every_partition(prefix: str, partitions: int, per_partition: int) -> list[str]:
    """Host names whose batches land on every partition, `per_partition` hosts each.

    librdkafka's default partitioner (consistent_random) puts a keyed message on
    CRC-32(key) % partitions; random names would leave a partition empty one run in four.
    """
    chosen: dict[int, list[str]] = {p: [] for p in range(partitions)}
    names = (f"{prefix}-{i}" for i in itertools.count())
    while any(len(hosts) < per_partition for hosts in chosen.values()):
        host = next(names)
        slot = chosen[zlib.crc32(wire.host_key(host)) % partitions]
        if len(slot) < per_partition:
            slot.append(host)
    return [host for hosts in chosen.values() for host in hosts]


def read_topic(bootstrap: str, topic: str, timeout_s: float = 10.0,
               expect: int | None = None, config: Mapping[str, str] | None = None) -> list[Any]:
    """Every message of `topic` (from the start), waiting up to `timeout_s` for `expect`."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({**(config or {}), "bootstrap.servers": bootstrap,
                         "group.id": f"read-{time.time_ns()}", "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + timeout_s
        partitions: Any = None
        while not partitions and time.monotonic() < deadline:  # the worker may create it
            found_topic = consumer.list_topics(topic, timeout=10).topics.get(topic)
            partitions = found_topic.partitions if found_topic and not found_topic.error else None
            if not partitions:
                time.sleep(0.5)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions or ()])
        found: list[Any] = []
        while time.monotonic() < deadline and (expect is None or len(found) < expect):
            for message in consumer.consume(100, timeout=0.5):
                if message.error() is None:
                    found.append(message)
        return found
    finally:
        consumer.close()


@dataclass
class StreamWorker:
    """`gpuflight streams` as a subprocess (so it can be killed like a real one)."""

    bootstrap: str
    influx_url: str
    prefix: str
    app_id: str
    data_dir: Path
    window_s: float = 1.0
    grace_s: float = 1.0
    log: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    extra: Sequence[str] = ()
    #: More environment (GPUFLIGHT_KAFKA_SASL_PASSWORD, say).
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: A command the worker runs under (compose/from-secrets, say).
    launcher: Sequence[str] = ()

    def start(self, name: str = "w1") -> None:
        self.log = self.data_dir / f"{name}.log"
        command = [
            *self.launcher, sys.executable, "-m", "gpuflight", "streams", "--kafka",
            self.bootstrap,
            "--topic-prefix", self.prefix, "--influx", self.influx_url,
            "--bucket", "gpuflight/autogen", "--window", str(self.window_s),
            "--grace", str(self.grace_s), "--app-id", self.app_id, "--worker", name,
            "--data-dir", str(self.data_dir / name), "--identity-wait", "2", "--tick", "0.5",
            # Faust's joins, assignments and recoveries: what a worker that never wrote did.
            "--log-level", "info",
            *self.extra,
        ]
        env = {**os.environ, "GPUFLIGHT_INFLUX_TOKEN": "", **self.env}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            env=env, start_new_session=True)

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log else ""


def influxql(url: str, query: str, database: str = "gpuflight") -> list[Series]:
    """The series of `query` (times in ns), through the product's InfluxQL client."""
    return InfluxQL(url, database).series(query)


def rows(url: str, query: str) -> list[dict[str, Any]]:
    """The rows of a query as dicts (tags of GROUP BY included)."""
    return [dict(row) for row in InfluxQL(url, "gpuflight").rows(query)]


def wait_for(check: Callable[[], Any], timeout_s: float, what: str,
             worker: StreamWorker | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.25)
    detail = f"\n--- worker log ---\n{worker.output()[-4000:]}" if worker else ""
    raise AssertionError(f"timed out waiting for {what} (last: {last!r}){detail}")


def windows_of(start_ns: int, count: int, window_ns: int) -> Iterator[int]:
    return iter(range(start_ns, start_ns + count * window_ns, window_ns))


def all_committed(bootstrap: str, group: str, topic: str) -> bool:
    """Whether `group` committed every message of `topic` (so a restarted member takes none
    of them again)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        found = consumer.list_topics(topic, timeout=10).topics[topic]
        partitions = [TopicPartition(topic, p) for p in found.partitions]
        committed = {tp.partition: tp.offset for tp in consumer.committed(partitions, 10)}
        ends = {tp.partition: consumer.get_watermark_offsets(tp, 10)[1] for tp in partitions}
        return all(end == 0 or committed[p] >= end for p, end in ends.items())
    finally:
        consumer.close()


def group_assignment(bootstrap: str, group: str, topic: str) -> list[set[int]]:
    """The partitions of `topic` each member of a settled (Stable) consumer group owns, one
    set per member ([] while the group rebalances)."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.describe_consumer_groups([group], request_timeout=10).values()
    found = future.result()
    if found.state != ConsumerGroupState.STABLE:
        return []
    return [{tp.partition for tp in member.assignment.topic_partitions if tp.topic == topic}
            for member in found.members]


# -- the worker without services -------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """What the worker reads of a Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


class RecordingApp:
    """What the worker asks of its Faust app: sends, recorded (dead letters, alerts)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes, dict[str, bytes]]] = []

    async def send(self, topic: str, *, key: bytes | None = None, value: bytes = b"",
                   headers: Sequence[tuple[str, bytes]] | None = None,
                   partition: int | None = None) -> None:
        self.sent.append((topic, key, value, dict(headers or ())))


class Harness:
    """`streams.worker.Worker` on a dict for its table, a recording app for its sends, and a sink
    that is never started (what it would write waits in its queue): the worker's logic, message
    by message, without Kafka or InfluxDB."""

    def __init__(self, **settings: Any) -> None:
        from gpuflight.streams.settings import StreamSettings
        from gpuflight.streams.windows import WindowSettings
        from gpuflight.streams.worker import Worker

        self.settings = StreamSettings(**{"topic_prefix": "t", "app_id": "t-app",
                                          "windows": WindowSettings(window_s=1.0, grace_s=1.0),
                                          **settings})
        self.topics = wire.Topics.with_prefix(self.settings.topic_prefix)
        self.app = RecordingApp()
        self.table: dict[bytes, bytes] = {}
        self.worker = Worker(self.settings, self.app, self.table)
        self._offsets: dict[tuple[str, int], int] = {}

    def restart(self) -> Harness:
        """A new worker on the same table (what it recovers from the changelog)."""
        again = Harness.__new__(Harness)
        again.__dict__.update(self.__dict__)
        from gpuflight.streams.worker import Worker

        again.app = RecordingApp()
        again.worker = Worker(self.settings, again.app, self.table)
        return again

    def process(self, host: str, pid: int, start_time: int, job: str) -> None:
        self.worker.directory.add(wire.ProcessRecord(host, pid, start_time, None, "c", (), None,
                                                     None, None, None, None, None, job))

    def _message(self, topic: str, partition: int, value: bytes) -> Message:
        offset = self._offsets.get((topic, partition), -1) + 1
        self._offsets[topic, partition] = offset
        return Message(topic, partition, offset, b"k", value)

    def events(self, host: str, pid: int, start_time: int, events: Events, *,
               requests: Sequence[wire.RequestRecord] = (), partition: int = 0) -> None:
        batch = wire.EventBatch(host, pid, start_time, events, requests=tuple(requests))
        self.raw(wire.encode_events(batch), partition)

    def raw(self, value: bytes, partition: int = 0) -> None:
        asyncio.run(self.worker.handle(self._message(self.topics.events, partition, value)))

    def nvml(self, host: str, ts_ns: int, processes: Mapping[int, int],
             partition: int = 0) -> None:
        """An NVML record of GPU 0: `processes`, pid → SM utilization %."""
        procs = tuple(wire.GpuProcessSample(pid, util, None, None) for pid, util in
                      processes.items())
        gpu = wire.GpuSample(
            gpu=0, uuid=None, name="NVIDIA H100", utilization_gpu_pct=50,
            utilization_memory_pct=None, memory_used_bytes=None, memory_total_bytes=None,
            power_w=None, temperature_c=None, sm_clock_mhz=None, pcie_rx_bytes_per_s=None,
            pcie_tx_bytes_per_s=None, processes=procs)
        record = wire.NvmlRecord(host, ts_ns, (gpu,))
        asyncio.run(self.worker.handle(self._message(self.topics.nvml, partition,
                                                     wire.encode_nvml(record))))

    def tick(self, partition: int = 0) -> None:
        asyncio.run(self.worker.handle(
            self._message(self.settings.ticks_topic, partition, b"")))

    def points(self, measurement: str | None = None) -> list[Any]:
        """What the worker gave its sink, in order."""
        return [p for batch in self.worker.sink._queue for p in batch.points
                if measurement is None or p.measurement == measurement]

    def dead_letters(self) -> list[tuple[bytes, bytes]]:
        """(reason, value) of each dead letter sent."""
        return [(headers["reason"], value) for topic, _, value, headers in self.app.sent
                if topic == self.settings.dead_letter_topic]
