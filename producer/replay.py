"""`gpuflight replay`: re-emit exactly the events of a time range, for a postmortem; and
`gpuflight profile`: the code paths of a range (the "paths" the node agent published with
`--stack-sampling`), of a job's processes (found on the processes topic), as pprof.

Offsets are found by time. A message holds a flush interval of one process's
events and is stamped with its first event, so reading starts one
`slack` earlier than the range, and each event is then kept only if its own time
is in [from, to). Reading stops once every partition is past the range or at
the end it had when replay began. Messages that are not gpuflight events of
this version are skipped and counted.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.errors import ServiceError, UsageError
from gpuflight.producer.contract.kafkaconf import REFUSED_CODES
from gpuflight.producer.decode.codepaths import PathFrame, PathSample, write_profile
from gpuflight.producer.decode.kernels import KernelNames
from gpuflight.producer.decode.sinks import JsonLinesSink
from gpuflight.producer.decode.timeline import TimelineSink
from gpuflight.producer.publish.kafkasink import KafkaSettings, KafkaSink, make_client

log = logging.getLogger(__name__)

#: How far before `from` to start reading (a batch spans at most a flush interval).
DEFAULT_SLACK_S = 10.0
#: Errors on a fetch that no retry mends: TOPIC_AUTHORIZATION_FAILED, and the broker's word
#: that the credentials or TLS were refused (kafkaconf.REFUSED_CODES).
DENIED = frozenset({29, *REFUSED_CODES})


@dataclass
class ReplayStats:
    messages: int = 0
    events: int = 0
    skipped_malformed: int = 0
    requests: int = 0
    paths: int = 0


@dataclass(frozen=True)
class _Replayed:
    """A request read back from Kafka, as the --output sink takes it."""

    record: wire.RequestRecord


def processes_of_job(kafka: KafkaSettings, job: str, host: str | None = None,
                     timeout_s: float = 30.0) -> frozenset[tuple[str, int, int]]:
    """(host, pid, start_time) of every process of `job` the processes topic knows (the
    compacted topic: each process the node agents saw, exited or not)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    topic = kafka.topics.processes
    consumer = make_client(Consumer, {
        **kafka.config, "bootstrap.servers": kafka.bootstrap,
        "group.id": f"gpuflight-profile-{uuid.uuid4()}", "enable.auto.commit": False})
    found: set[tuple[str, int, int]] = set()
    try:
        metadata = consumer.list_topics(topic, timeout=min(timeout_s, 10.0))
        partitions = metadata.topics[topic].partitions if topic in metadata.topics else {}
        ends = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=timeout_s)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            if (message.offset() or 0) + 1 >= ends.get(message.partition() or 0, 0):
                ends.pop(message.partition() or 0, None)
            try:
                record = wire.decode_process(message.value())
            except wire.WireError:
                continue  # a tombstone, or not ours
            if record.job == job and (host is None or record.host == host):
                found.add((record.host, record.pid, record.start_time))
    finally:
        consumer.close()
    return frozenset(found)


def replay(
    kafka: KafkaSettings,
    *,
    from_ns: int,
    to_ns: int,
    host: str | None = None,
    pid: int | None = None,
    output: Path | None = None,
    to_topic: str | None = None,
    timeline: Path | None = None,
    profile: Path | None = None,
    processes: frozenset[tuple[str, int, int]] | None = None,
    slack_s: float = DEFAULT_SLACK_S,
    timeout_s: float = 30.0,
) -> ReplayStats:
    """`processes`: only these (host, pid, start_time); `profile`: write the range's code
    paths there (pprof), merged by (stack, route): a sample of a route's requests is labelled
    with it (`route`, what `go tool pprof -tagfocus` picks)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    if sum(x is not None for x in (output, to_topic, timeline, profile)) != 1:
        raise UsageError("replay needs exactly one of --output FILE, --to-topic TOPIC or "
                         "--timeline FILE")
    if to_ns <= from_ns:
        raise UsageError("--to must be after --from")
    topic = kafka.topics.events
    consumer = make_client(Consumer, {
        **kafka.config,
        "bootstrap.servers": kafka.bootstrap,
        "group.id": f"gpuflight-replay-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
    })
    stats = ReplayStats()
    # Names come from each message (the node named them); none is guessed here.
    names = KernelNames(proc_root=None)
    writer: JsonLinesSink | TimelineSink | None = None
    if output is not None:
        writer = JsonLinesSink(output, names)
    elif timeline is not None:
        # Process and thread names are the host's, which this machine cannot read.
        writer = TimelineSink(timeline, names, read_names=False)
    paths: dict[tuple[tuple[tuple[str, str, int | None], ...], str | None],
                dict[str, float]] = {}
    republisher = None
    if to_topic is not None:
        republisher = KafkaSink(kafka, create_topics=False)
        republisher.ensure_topics({to_topic: {"retention.ms": "-1"}})
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=min(timeout_s, 10.0))
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            reason = error.str() if hasattr(error, "str") else str(error)
            raise ServiceError(f"cannot reach Kafka at {kafka.bootstrap}: {reason}") from None
        partitions = metadata.topics[topic].partitions if topic in metadata.topics else {}
        if not partitions or metadata.topics[topic].error is not None:
            raise UsageError(f"topic {topic} does not exist on {kafka.bootstrap}")
        start_ms = int((from_ns / 1e9 - slack_s) * 1000)
        wanted = [TopicPartition(topic, p, max(0, start_ms)) for p in partitions]
        starts = consumer.offsets_for_times(wanted, timeout=timeout_s)
        ends: dict[int, int] = {}
        assignment = []
        for tp in starts:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                        timeout=timeout_s)
            if tp.offset >= 0 and tp.offset < high:
                ends[tp.partition] = high
                assignment.append(TopicPartition(topic, tp.partition, tp.offset))
        consumer.assign(assignment)
        stop_ms = int((to_ns / 1e9 + slack_s) * 1000)
        idle_since = time.monotonic()
        while ends and time.monotonic() - idle_since < timeout_s:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                error = message.error()
                if error.code() in DENIED:
                    raise ServiceError(f"Kafka at {kafka.bootstrap} does not let this user read"
                                       f" {topic}: {error.str()} (the ACLs replay needs: "
                                       "README, Kafka)")
                log.warning("Kafka: %s", error)
                continue
            idle_since = time.monotonic()
            part, offset = message.partition() or 0, message.offset() or 0
            if offset + 1 >= ends.get(part, 0) or message.timestamp()[1] > stop_ms:
                ends.pop(part, None)
                consumer.incremental_unassign([TopicPartition(topic, part)])
                if message.timestamp()[1] > stop_ms:
                    continue
            stats.messages += 1
            try:
                batch = wire.decode_events(message.value())
            except wire.WireError as exc:
                stats.skipped_malformed += 1
                log.debug("skipping offset %d of %s[%d]: %s", offset, topic, part, exc)
                continue
            if (host is not None and batch.host != host) or (pid is not None and batch.pid != pid):
                continue
            if processes is not None and (batch.host, batch.pid, batch.start_time) not in processes:
                continue
            ts = batch.events["ts_ns"]
            keep = (ts >= from_ns) & (ts < to_ns)
            events = batch.events[keep]
            attribution = batch.attribution.take(keep) if batch.attribution else None
            # A request is in the range when its response went out in it.
            requests = tuple(r for r in batch.requests if from_ns <= r.end_ns < to_ns)
            first = batch.aggregates["ts_ns"]
            aggregates = batch.aggregates[(first >= from_ns) & (first < to_ns)]
            in_range = tuple(p for p in batch.paths if from_ns <= p.ts_ns < to_ns)
            if len(events) == 0 and not requests and not len(aggregates) and not in_range:
                continue
            stats.events += len(events)
            stats.requests += len(requests)
            stats.paths += len(in_range)
            if profile is not None:
                for path in in_range:
                    sums = paths.setdefault((path.frames, path.route), {})
                    for name, value in path.values.items():
                        sums[name] = sums.get(name, 0.0) + value
            elif writer is not None:
                names.learn(batch.pid, batch.kernels)
                if len(events):
                    writer.write(events, attribution)
                if len(aggregates):
                    writer.write_aggregates(aggregates)
                if requests:
                    writer.write_requests(batch.pid, [_Replayed(r) for r in requests], {})
            elif republisher is not None and to_topic is not None:
                whole = len(events) == len(batch.events)
                kept = wire.EventBatch(
                    batch.host, batch.pid, batch.start_time, events, batch.kernels,
                    attribution=attribution, requests=requests,
                    # the unattributed cost is the message's: kept only with all its events
                    unattributed=batch.unattributed if whole else {},
                    aggregates=aggregates, paths=in_range,
                )
                republisher.produce_batch(to_topic, kept)
        if profile is not None:
            write_profile(profile, [
                PathSample(tuple(PathFrame(*frame) for frame in frames), values, route)
                for (frames, route), values in paths.items()],
                time_ns=from_ns, duration_ns=to_ns - from_ns,
                comments=[f"gpuflight replay of {kafka.topics.events}"])
    finally:
        consumer.close()
        if writer is not None:
            writer.close()
        if republisher is not None:
            republisher.close()
    if stats.skipped_malformed:
        log.warning("skipped %d message(s) that are not gpuflight events v%d",
                    stats.skipped_malformed, wire.VERSION)
    return stats

