"""The Faust wiring of the stream worker (streams/worker.py): the app, its table, the topics its
one agent reads, its timers (the leader's tick, each worker's partition watch and metrics), the
partition revocation, and the services beside it (the processes directory reader, the InfluxDB
sink). No counting here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any, Final

from gpuflight.producer.contract import memtrim, wire
from gpuflight.producer.contract.kafkaconf import ClientSecurity
from gpuflight.producer.contract.wire import ensure_topics, topic_configs
from gpuflight.streams.identities import DirectoryReader
from gpuflight.streams.settings import StreamSettings
from gpuflight.streams.sink import Batch
from gpuflight.streams.worker import Worker
from gpuflight.streams.workermetrics import WorkerCollector

log = logging.getLogger(__name__)

#: The Faust table of job states and parked messages (its changelog: APP_ID-jobs-changelog).
TABLE: Final = "jobs"
#: Kafka messages a worker takes per poll (each up to ~28k events, ~2 MB decoded).
MAX_POLL_MESSAGES: Final = 32


def prepare_topics(settings: StreamSettings, timeout_s: float = 30.0) -> int:
    """Create the topics the worker reads and writes if missing; the events topic's partition
    count (every co-partitioned topic and the table have as many)."""
    from confluent_kafka.admin import AdminClient

    from gpuflight.producer.contract.errors import ServiceError

    topics = wire.Topics.with_prefix(settings.topic_prefix)
    admin = AdminClient({**settings.kafka_config, "bootstrap.servers": settings.kafka})
    deadline = time.monotonic() + timeout_s
    partitions = 0
    while time.monotonic() < deadline:
        try:
            metadata = admin.list_topics(timeout=5)
        except Exception as exc:  # KafkaException: the broker is not there (yet)
            log.debug("Kafka metadata: %s", exc)
            time.sleep(1)
            continue
        found = metadata.topics.get(topics.events)
        if found is not None and found.error is None and found.partitions:
            partitions = len(found.partitions)
            break
        ensure_topics(admin, topic_configs(topics), 6, timeout_s=5)
    if not partitions:
        raise ServiceError(f"Kafka at {settings.kafka} did not answer within {timeout_s:.0f} s")
    own = {
        settings.ticks_topic: {"retention.ms": str(3600 * 1000)},
        settings.dead_letter_topic: {"retention.ms": "-1"},
        settings.alerts_topic: {"retention.ms": str(90 * 24 * 3600 * 1000)},
        **topic_configs(topics),
    }
    if not ensure_topics(admin, own, partitions, timeout_s=10):
        raise ServiceError(f"cannot create the stream app's topics on {settings.kafka}")
    mismatched = []
    metadata = admin.list_topics(timeout=10)
    for name in (topics.nvml, topics.metrics, settings.ticks_topic):
        found = metadata.topics.get(name)
        if found is not None and len(found.partitions) != partitions:
            mismatched.append(f"{name} ({len(found.partitions)})")
    if mismatched:
        raise ServiceError(f"topics must have as many partitions as {topics.events}"
                         f" ({partitions}): {', '.join(mismatched)}")
    return partitions


def broker_credentials(security: ClientSecurity) -> Any:
    """What Faust takes for librdkafka's security settings (None: plaintext)."""
    import faust

    if security.sasl:
        return faust.SASLCredentials(username=security.username, password=security.password,
                                     ssl_context=security.ssl_context,
                                     mechanism=security.mechanism)
    if security.ssl_context is not None:
        return faust.SSLCredentials(security.ssl_context)
    return None


def build_app(settings: StreamSettings, partitions: int,
              collector: WorkerCollector | None = None) -> tuple[Any, Worker]:
    """The Faust app and its worker; `collector` (for /metrics) is given the worker's loop
    once it runs."""
    import faust
    import mode

    topics = wire.Topics.with_prefix(settings.topic_prefix)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{server}" for server in settings.kafka.split(",")],
        broker_credentials=broker_credentials(ClientSecurity.from_config(settings.kafka_config)),
        store="memory://",
        datadir=str(settings.data_dir / settings.app_id),
        web_enabled=False,
        topic_partitions=partitions,
        topic_replication_factor=1,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest" if settings.from_beginning else "latest",
        producer_acks=-1,
        broker_commit_interval=1.0,
        stream_recovery_delay=0.0,
        stream_buffer_maxsize=32,  # messages of up to ~2 MB each
        producer_max_request_size=8_000_000,
        consumer_max_fetch_size=4_000_000,
        # Faust's default takes whatever the fetcher holds in one poll: a worker started
        # on a 12M-event backlog (a replay) peaked at 405 MiB, growing with the backlog.
        # 32 messages a poll: 184 MiB, whatever the backlog (bench/RESULTS.md).
        broker_max_poll_records=MAX_POLL_MESSAGES,
    )
    # bytes keys and values: the "raw" codec, in the changelog and in its recovery.
    table = app.Table(TABLE, partitions=partitions, key_type=bytes, value_type=bytes)
    worker = Worker(settings, app, table)
    source = app.topic(
        topics.events, topics.nvml, topics.metrics, settings.ticks_topic,
        key_serializer="raw", value_serializer="raw",
    )

    @app.agent(source, name="windows")
    async def windows(stream: Any) -> None:
        async for event in stream.events():
            await worker.handle(event.message)

    # One worker (the group's leader) beats for every partition.
    @app.timer(settings.tick_s, on_leader=True)  # type: ignore[untyped-decorator]
    async def tick() -> None:
        await worker.send_ticks(partitions)

    # Every worker watches its own partitions (streams/stalls.py).
    @app.timer(settings.tick_s)  # type: ignore[untyped-decorator]
    async def watch() -> None:
        await worker.check_partitions()

    trimmer = memtrim.Trimmer()

    @app.timer(settings.metrics_s)  # type: ignore[untyped-decorator]
    async def metrics() -> None:
        await worker.sink.put(Batch([worker.metrics_point()]))
        trimmer.maybe()  # what a peak (an outage's backlog) freed goes back to the system

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def revoked(sender: Any, revoked: Any, **_: Any) -> None:
        worker.forget_partitions()

    @app.service
    class Services(mode.Service):
        async def on_start(self) -> None:
            if collector is not None:
                collector.attach(worker, asyncio.get_running_loop())
            # Its group (never joined: it assigns every partition) is named after the app, so
            # the app's group ACL covers it.
            reader = DirectoryReader(settings.kafka, topics.processes, worker.directory,
                                     {"group.id": f"{settings.app_id}-directory",
                                      **settings.kafka_config})
            reader.start()
            self._reader = reader
            # A writer that died would leave every point waiting, silently: the worker ends
            # instead (its supervisor restarts it; the points are recomputed from Kafka).
            await worker.sink.start(on_failure=self._writer_failed)

        def _writer_failed(self, exc: BaseException) -> None:
            worker.sink_failure = exc
            os.kill(os.getpid(), signal.SIGTERM)  # a graceful stop, as its supervisor's

        async def on_stop(self) -> None:
            await worker.sink.stop()
            self._reader.stop()

    _ = (windows, tick, watch, metrics, revoked, Services)
    return app, worker


def run(settings: StreamSettings, loglevel: str = "WARNING") -> None:
    """Run a worker until SIGTERM/SIGINT."""
    from gpuflight.producer.contract.exposition import serve

    collector = WorkerCollector() if settings.metrics is not None else None
    # Bound before Kafka is asked anything: a port in use is a one-line error, not a worker.
    stop_serving = (serve(settings.metrics, [collector])
                    if settings.metrics is not None and collector is not None else None)
    try:
        _run(settings, loglevel, collector)
    finally:
        if stop_serving is not None:
            try:
                stop_serving()
            except Exception as exc:  # never what the worker wrote for it
                log.warning("metrics: stopping the server: %s", exc)


def _run(settings: StreamSettings, loglevel: str, collector: WorkerCollector | None) -> None:
    import faust

    partitions = prepare_topics(settings)
    app, stream_worker = build_app(settings, partitions, collector)
    log.info("stream worker %s: %d partitions, window %g s, grace %g s, InfluxDB %s",
             settings.worker, partitions, settings.windows.window_s, settings.windows.grace_s,
             settings.influx.url)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    worker.spinner = None  # a terminal spinner: escape codes in every log file
    try:
        worker.execute_from_commandline()
    finally:
        if stream_worker.sink_failure is not None:
            failure = stream_worker.sink_failure
            raise RuntimeError(f"the InfluxDB writer stopped on {type(failure).__name__}:"
                               f" {failure}") from failure
