"""Publish events to Kafka (wire.py): batched per process and flush interval.

Lossless within a bound: librdkafka keeps every message until the broker has it
(no delivery time-out, idempotent, acks=all), in a queue bounded by
`buffer_bytes`. When that queue is full — the broker has been away too long —
a batch is dropped, and its events are counted per process and published with
the producer's metrics: never lost silently, never a crash.

A fatal error of librdkafka's (what answers is no broker it can publish to, say) ends the
Kafka output, not the producer: its next write or tick raises (capture's Guarded switches it
off, and the agent ends with 74), and from then on what would be sent is counted dropped.
"""

from __future__ import annotations

import functools
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import EVENT_DTYPE, EventType
from gpuflight.producer.contract.errors import ServiceError, UsageError
from gpuflight.producer.contract.kafkaconf import ENV_PREFIX, load_config
from gpuflight.producer.decode.kernels import KernelNames
from gpuflight.producer.publish import identity
from gpuflight.producer.publish.redact import CmdlineMode

log = logging.getLogger(__name__)

__all__ = ["ENV_PREFIX", "KafkaSettings", "KafkaSink", "load_config", "make_client"]


class _Deduplicated(logging.Filter):
    """librdkafka repeats itself while a broker is away (a line per retry, hundreds a
    minute): each distinct message passes once per `interval_s`."""

    def __init__(self, interval_s: float = 60.0) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        # "…|FAIL|rdkafka#producer-1| [thrd:127.0.0.1:9/bootstrap]: …": the client's own name
        # and thread differ from client to client; the rest is the message.
        key = text.split("]: ", 1)[-1]
        now = time.monotonic()
        if now - self._last.get(key, -self._interval_s) < self._interval_s:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = now
        return True


#: The logger every librdkafka client of gpuflight logs through (`logger` in its settings).
LIBRDKAFKA_LOG = logging.getLogger("producer.librdkafka")
LIBRDKAFKA_LOG.addFilter(_Deduplicated())


def make_client(kind: Callable[[dict[str, Any]], Any], config: Mapping[str, Any]) -> Any:
    """A confluent-kafka Producer, Consumer or AdminClient with gpuflight's logger; a setting
    librdkafka does not know (from --kafka-config or GPUFLIGHT_KAFKA_*) is a UsageError."""
    from confluent_kafka import KafkaException

    try:
        return kind({**config, "logger": LIBRDKAFKA_LOG})
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        reason = error.str() if hasattr(error, "str") else str(error)
        raise UsageError(f"Kafka settings: {reason}") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"Kafka settings: {exc}") from None

#: librdkafka settings we rely on; a config file or the environment may override.
DEFAULT_CONFIG: Mapping[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "zstd",
    "linger.ms": 50,
    "batch.size": 1_000_000,
    "message.max.bytes": 8_000_000,
    "message.timeout.ms": 0,  # keep retrying while the broker is away
    "queue.buffering.max.messages": 2_000_000,
}


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str
    topic_prefix: str = wire.DEFAULT_PREFIX
    #: librdkafka properties passed through verbatim (security settings included; kept out of
    #: the repr, which would show the password).
    config: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Bound of the publish queue; beyond it batches are dropped and counted.
    buffer_bytes: int = 256 << 20
    #: A process's events wait at most this long before they are sent.
    flush_interval_s: float = 0.25
    max_batch_events: int = 100_000
    partitions: int = 6
    metrics_interval_s: float = 5.0
    #: How long shutdown waits for the broker to take what is still queued.
    close_timeout_s: float = 30.0
    #: What the processes topic carries of command lines (producer.publish.redact).
    cmdline: CmdlineMode = "redacted"

    @property
    def topics(self) -> wire.Topics:
        return wire.Topics.with_prefix(self.topic_prefix)


class KafkaSink:
    """An EventSink publishing enriched events to PREFIX.events.v1."""

    def __init__(
        self,
        settings: KafkaSettings,
        proc_root: Path = Path("/proc"),
        host: str | None = None,
        producer_factory: Callable[[dict[str, Any]], Any] | None = None,
        create_topics: bool = True,
        *,
        kernels: KernelNames | None = None,
    ) -> None:
        from confluent_kafka import KafkaException, Producer
        from confluent_kafka.admin import AdminClient

        #: What the client raises (imported here: confluent-kafka loads in ~30 ms).
        self._kafka_exception: type[Exception] = KafkaException
        self.settings = settings
        self.name = f"Kafka ({settings.bootstrap})"
        self.host = host or socket.gethostname()
        self._proc_root = proc_root
        self._topics = settings.topics
        config: dict[str, Any] = {
            **DEFAULT_CONFIG,
            "bootstrap.servers": settings.bootstrap,
            "queue.buffering.max.kbytes": max(1, settings.buffer_bytes // 1024),
            **settings.config,
            "error_cb": self._on_error,
        }
        self._producer = make_client(producer_factory or Producer, config)
        admin_config = {k: v for k, v in config.items() if k.startswith(("bootstrap", "security",
                                                                          "sasl", "ssl"))}
        self._admin = make_client(AdminClient, admin_config)
        self._wanted_topics = wire.topic_configs(self._topics) if create_topics else {}
        self._topics_ready = self.ensure_topics(self._wanted_topics)
        self._next_topic_try = time.monotonic() + 10
        self._pending: dict[int, list[npt.NDArray[np.void]]] = {}
        #: Names of the pending launches, taken at write time (while the process is alive).
        self._kernels = kernels
        self._pending_names: dict[int, dict[int, wire.KernelName]] = {}
        self._pending_events = 0
        self._pending_since: float | None = None
        #: With the HTTP capture: each pending part's attribution, and the requests answered.
        self._pending_attr: dict[int, list[wire.EventAttribution]] = {}
        self._pending_requests: dict[int, list[wire.RequestRecord]] = {}
        self._pending_unattributed: dict[int, dict[str, float]] = {}
        #: Code paths sampled (stack sampling on), per process.
        self._pending_paths: dict[int, list[wire.PathRecord]] = {}
        #: What the kernel counted under overload instead of recording, per process.
        self._pending_aggregates: dict[int, list[npt.NDArray[np.void]]] = {}
        self.requests_produced = 0
        self._identities: dict[int, wire.ProcessRecord] = {}
        self._last_error: str | None = None
        self.produced_events = 0
        self.delivered_events = 0
        self.failed_events = 0
        self.dropped_events = 0
        self.dropped_by_pid: Counter[int] = Counter()
        #: Told of every events message Kafka acknowledged: (pid, events) (the tally's ledger).
        self.on_delivered: Callable[[int, int], None] | None = None
        self.messages = 0
        self.message_bytes = 0
        #: librdkafka's fatal error, once it had one: nothing is sent from then on.
        self.fatal: str | None = None

    # -- EventSink ---------------------------------------------------------

    takes_attribution = True

    def write(self, events: npt.NDArray[np.void],
              attribution: wire.EventAttribution | None = None) -> None:
        if len(events) == 0:
            return
        pids = events["pid"]
        unique, inverse = np.unique(pids, return_inverse=True)
        for k, pid in enumerate(unique.tolist()):
            mine = None if len(unique) == 1 else inverse == k
            part = events if mine is None else events[mine]
            self._pending.setdefault(pid, []).append(part)
            if attribution is not None:
                self._pending_attr.setdefault(pid, []).append(
                    attribution if mine is None else attribution.take(mine))
            if self._kernels is not None:
                names = self._kernels.for_launches(pid, part)
                if names:
                    self._pending_names.setdefault(pid, {}).update(names)
        self._pending_events += len(events)
        if self._pending_since is None:
            self._pending_since = time.monotonic()
        if self._pending_events >= self.settings.max_batch_events:
            self.flush_pending()
        self._raise_fatal()

    def tick(self) -> None:
        """Send batches that waited a flush interval; serve delivery reports."""
        now = time.monotonic()
        if (
            self._pending_since is not None
            and now - self._pending_since >= self.settings.flush_interval_s
        ):
            self.flush_pending()
        if not self._topics_ready and now >= self._next_topic_try and self.fatal is None:
            self._topics_ready = self.ensure_topics(self._wanted_topics, timeout_s=2.0)
            self._next_topic_try = now + 10
        self._poll(0)
        self._raise_fatal()

    def flush(self, timeout_s: float) -> int:
        """Send what is pending and wait for delivery; the number of messages left (after a
        fatal error, at once: they will never go)."""
        self.flush_pending()
        if self.fatal is None:
            try:
                return int(self._producer.flush(timeout_s))
            except self._kafka_exception as exc:
                self._fail(exc)
        return len(self._producer)

    def _poll(self, timeout_s: float) -> None:
        if self.fatal is None:
            try:
                self._producer.poll(timeout_s)
            except self._kafka_exception as exc:
                self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        """librdkafka failed for good (remembered, and logged once); any other error of
        its is logged (a message it refused is counted dropped by `_produce`)."""
        error = exc.args[0] if exc.args else exc
        text = str(error.str()) if hasattr(error, "str") else str(error)
        fatal = getattr(error, "fatal", lambda: False)() or _code(error) == _FATAL
        if not fatal:
            log.error("Kafka: %s", text)
        elif self.fatal is None:
            self.fatal = text
            log.error("Kafka (%s): %s; nothing more is sent to it", self.settings.bootstrap,
                      text)

    def _raise_fatal(self) -> None:
        if self.fatal is not None:
            raise ServiceError(f"Kafka at {self.settings.bootstrap} failed for good: "
                               f"{self.fatal}")

    def close(self) -> None:
        timeout_s = self.settings.close_timeout_s
        left = self.flush(timeout_s)
        if self.fatal is not None:
            log.warning("%d Kafka message(s) never sent (%s); they are lost", left, self.fatal)
        elif left:
            log.warning("%d Kafka message(s) still unsent after %.0f s; they are lost", left,
                        timeout_s)
        else:
            log.info("Kafka: all %d messages delivered", self.messages)

    # -- publishing --------------------------------------------------------

    def ensure_topics(
        self, wanted: Mapping[str, Mapping[str, str]], timeout_s: float = 10.0
    ) -> bool:
        return not wanted or wire.ensure_topics(self._admin, wanted, self.settings.partitions,
                                           timeout_s)

    def produce_batch(self, topic: str, batch: wire.EventBatch) -> None:
        """One events message as it is (replay into another topic)."""
        self._produce(topic, key=wire.host_key(batch.host), value=wire.encode_events(batch),
                      timestamp_ms=batch.first_ts_ns // 1_000_000, events=len(batch.events),
                      pid=batch.pid)

    def write_aggregates(self, aggregates: npt.NDArray[np.void]) -> None:
        """Events the kernel counted instead of recording (records.AGGREGATE_DTYPE): they
        go out with their process's next events message (or one of their own)."""
        for pid in np.unique(aggregates["pid"]).tolist():
            mine = aggregates[aggregates["pid"] == pid]
            self._pending_aggregates.setdefault(pid, []).append(mine)
            if self._kernels is not None:
                launched = mine["handle"][mine["type"] == EventType.LAUNCH]
                named = {h: self._kernels.name_of(pid, h) for h in np.unique(launched).tolist()}
                self._pending_names.setdefault(pid, {}).update(
                    {h: n for h, n in named.items() if n is not None})
        if self._pending_since is None:
            self._pending_since = time.monotonic()

    def write_requests(self, pid: int, answered: Sequence[Any],
                       unattributed: Mapping[str, float]) -> None:
        """A process's requests answered (requesttrack.Answered) and the cost no request
        explains: they go out with its next events message (or one of their own)."""
        if answered:
            self._pending_requests.setdefault(pid, []).extend(a.record for a in answered)
        if unattributed:
            mine = self._pending_unattributed.setdefault(pid, {})
            for name, value in unattributed.items():
                mine[name] = mine.get(name, 0.0) + value
        if (answered or unattributed) and self._pending_since is None:
            self._pending_since = time.monotonic()

    def write_paths(self, pid: int, paths: Sequence[wire.PathRecord]) -> None:
        """A process's code paths since the last turn: they go out at its next flush, merged
        by stack, in messages of their own (count 0: no event)."""
        if paths:
            self._pending_paths.setdefault(pid, []).extend(paths)
            if self._pending_since is None:
                self._pending_since = time.monotonic()

    def flush_pending(self) -> None:
        pending, self._pending = self._pending, {}
        paths, self._pending_paths = self._pending_paths, {}
        names, self._pending_names = self._pending_names, {}
        attrs, self._pending_attr = self._pending_attr, {}
        requests, self._pending_requests = self._pending_requests, {}
        unattributed, self._pending_unattributed = self._pending_unattributed, {}
        counted, self._pending_aggregates = self._pending_aggregates, {}
        self._pending_events, self._pending_since = 0, None
        limit = self.settings.max_batch_events
        empty = np.zeros(0, dtype=EVENT_DTYPE)
        for pid in [*pending, *(p for p in {*requests, *unattributed, *counted, *paths}
                                if p not in pending)]:
            parts = pending.get(pid, [empty])
            events = parts[0] if len(parts) == 1 else np.concatenate(parts)
            attr_parts = attrs.get(pid)
            attribution = None
            if attr_parts is not None and len(attr_parts) == len(parts):
                attribution = (attr_parts[0] if len(attr_parts) == 1
                               else wire.EventAttribution.concat(attr_parts))
            answered = tuple(requests.get(pid, ()))
            spare = unattributed.get(pid, {})
            aggregated = counted.get(pid, [])
            aggregates = (aggregated[0] if len(aggregated) == 1 else np.concatenate(aggregated)
                          if aggregated else wire.no_aggregates())
            sampled = _merged_paths(paths.get(pid, ()))
            if sampled:  # in messages of their own, each well under the broker's limit
                who = self._identity(pid)
                for part in _path_messages(sampled):
                    only = wire.EventBatch(self.host, pid, who.start_time, empty, paths=part)
                    self._produce(self._topics.events, key=wire.host_key(self.host),
                                  value=wire.encode_events(only),
                                  timestamp_ms=only.first_ts_ns // 1_000_000, events=0, pid=pid)
            if len(events) == 0 and not answered and not len(aggregates):
                if spare:  # goes out with the process's next message
                    self._pending_unattributed[pid] = spare
                continue
            who = self._identity(pid)
            for start in range(0, max(len(events), 1), limit):
                chunk = events[start : start + limit]
                first = start == 0
                mine = aggregates if first else aggregates[:0]
                batch = wire.EventBatch(
                    self.host, pid, who.start_time, chunk,
                    _launch_names(chunk, names.get(pid), mine),
                    attribution=_slice(attribution, len(events), start, limit),
                    requests=answered if first else (),
                    unattributed=spare if first else {},
                    aggregates=mine,
                )
                if first:
                    self.requests_produced += len(answered)
                self._produce(
                    self._topics.events,
                    key=wire.host_key(self.host),
                    value=wire.encode_events(batch),
                    timestamp_ms=batch.first_ts_ns // 1_000_000,
                    events=len(chunk),
                    pid=pid,
                )

    def observe(self, pid: int) -> None:
        """Learn (and publish) a process's identity while it is alive."""
        self._identity(pid)

    def forget_processes(self, pids: Collection[int]) -> None:
        """Processes gone (capture.Capture.exit_observers): what is pending of theirs goes out
        first, then their records again with "exited_ns" (the worker forgets a job that was
        one process once its windows are closed), and their identities are dropped (a pid
        used again is another process)."""
        if any(p in self._pending or p in self._pending_requests
               or p in self._pending_unattributed or p in self._pending_aggregates
               or p in self._pending_paths for p in pids):
            self.flush_pending()
        now = time.time_ns()
        for pid in pids:
            who = self._identities.pop(pid, None)
            if who is None:
                continue
            self._produce(
                self._topics.processes,
                key=wire.process_key(self.host, pid, who.start_time),
                value=wire.encode_process(replace(who, exited_ns=now)),
            )

    @property
    def identities(self) -> int:
        """Processes whose identity is kept."""
        return len(self._identities)

    def _identity(self, pid: int) -> wire.ProcessRecord:
        who = self._identities.get(pid)
        if who is None:
            who = identity.resolve(self._proc_root, pid, self.host,
                                   cmdline=self.settings.cmdline)
            self._identities[pid] = who
            self._produce(
                self._topics.processes,
                key=wire.process_key(self.host, pid, who.start_time),
                value=wire.encode_process(who),
            )
        return who

    def publish_metrics(self, record: wire.MetricsRecord,
                        acknowledged: Callable[[], None] | None = None) -> None:
        """Publish the producer's counters; `acknowledged` is called once Kafka has them."""
        self._produce(self._topics.metrics, key=wire.host_key(record.host),
                      value=wire.encode_metrics(record), acknowledged=acknowledged)

    def publish_nvml(self, record: wire.NvmlRecord) -> None:
        self._produce(self._topics.nvml, key=wire.host_key(record.host),
                      value=wire.encode_nvml(record))

    def _produce(
        self,
        topic: str,
        *,
        key: bytes,
        value: bytes,
        timestamp_ms: int | None = None,
        events: int = 0,
        pid: int | None = None,
        acknowledged: Callable[[], None] | None = None,
    ) -> None:
        callback = functools.partial(self._on_delivery, events, pid, acknowledged)
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": callback}
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        for attempt in range(2):
            try:
                if self.fatal is None:
                    self._producer.produce(topic, **kwargs)
                    break
            except BufferError:
                if attempt == 0:
                    self._poll(0.05)  # let delivery reports free some room
                    continue
            except self._kafka_exception as exc:  # counted dropped, as beyond the buffer
                self._fail(exc)
            self.dropped_events += events
            if pid is not None:
                self.dropped_by_pid[pid] += events
            return
        self.produced_events += events
        self.messages += 1
        self.message_bytes += len(value)

    def _on_delivery(self, events: int, pid: int | None,
                     acknowledged: Callable[[], None] | None, error: Any,
                     _message: Any) -> None:
        if error is None:
            self.delivered_events += events
            if pid is not None and events and self.on_delivered is not None:
                self.on_delivered(pid, events)
            if acknowledged is not None:
                acknowledged()
        else:
            # Lost for good (librdkafka gave up): counted with the drops, by pid.
            self.failed_events += events
            self.dropped_events += events
            if pid is not None and events:
                self.dropped_by_pid[pid] += events
            log.error("Kafka delivery failed: %s", error)

    def _on_error(self, error: Any) -> None:
        if getattr(error, "fatal", lambda: False)():
            self._fail(self._kafka_exception(error))
            return
        text = str(error)
        if text != self._last_error:  # librdkafka repeats itself while a broker is away
            log.warning("Kafka: %s", text)
            self._last_error = text

    def queue_depth(self) -> int:
        return len(self._producer)


#: librdkafka's _FATAL: the client had a fatal error and produces nothing more.
_FATAL = -150


#: About the most bytes of paths one message carries (the broker takes 1 MiB by default).
PATH_MESSAGE_BYTES = 256 << 10


def _code(error: Any) -> int | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def _merged_paths(paths: Sequence[wire.PathRecord]) -> tuple[wire.PathRecord, ...]:
    """A process's paths of several turns, one per (stack, route) (values summed, the latest
    time)."""
    merged: dict[tuple[tuple[tuple[str, str, int | None], ...], str | None],
                 wire.PathRecord] = {}
    for path in paths:
        key = (path.frames, path.route)
        was = merged.get(key)
        merged[key] = path if was is None else wire.PathRecord(
            max(was.ts_ns, path.ts_ns), path.frames,
            {k: was.values.get(k, 0.0) + path.values.get(k, 0.0)
             for k in {*was.values, *path.values}}, path.route)
    return tuple(merged.values())


def _path_messages(paths: Sequence[wire.PathRecord]) -> list[tuple[wire.PathRecord, ...]]:
    """`paths` cut into messages of at most wire.MAX_PATHS paths and about PATH_MESSAGE_BYTES
    (a path of 128 frames of 2 KiB names would not fit a broker's 1 MiB alone: names are cut
    to MAX_FRAME_TEXT, and such a path goes out alone)."""
    out: list[tuple[wire.PathRecord, ...]] = []
    part: list[wire.PathRecord] = []
    size = 0
    for path in paths:
        weight = 64 + len(path.route or "") + sum(len(f[0]) + len(f[1]) + 16
                                                   for f in path.frames)
        if part and (size + weight > PATH_MESSAGE_BYTES or len(part) >= wire.MAX_PATHS):
            out.append(tuple(part))
            part, size = [], 0
        part.append(path)
        size += weight
    if part:
        out.append(tuple(part))
    return out


def _slice(attribution: wire.EventAttribution | None, n: int, start: int,
           limit: int) -> wire.EventAttribution | None:
    if attribution is None or n <= limit:
        return attribution
    keep = np.zeros(n, dtype=bool)
    keep[start : start + limit] = True
    return attribution.take(keep)


def _launch_names(
    events: npt.NDArray[np.void], names: Mapping[int, wire.KernelName] | None,
    aggregates: npt.NDArray[np.void] | None = None,
) -> dict[int, wire.KernelName]:
    """The names of the launch handles of `events` and `aggregates` (each message carries
    its own)."""
    if not names:
        return {}
    launched = set(np.unique(events["handle"][events["type"] == EventType.LAUNCH]).tolist())
    if aggregates is not None and len(aggregates):
        launched.update(aggregates["handle"][aggregates["type"] == EventType.LAUNCH].tolist())
    return {h: names[h] for h in launched if h in names}
