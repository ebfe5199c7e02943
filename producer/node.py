"""`gpuflight producer`: node-wide capture until SIGTERM or SIGINT.

Events go to a JSON-lines file, to Kafka, or both; with Kafka, the producer
also publishes its own metrics and (where NVML is there) GPU samples.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import signal
import socket
import time
from pathlib import Path
from types import FrameType

from gpuflight.producer import agentmetrics
from gpuflight.producer.capture import Capture
from gpuflight.producer.contract import memtrim, wire
from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.contract.exposition import MetricsEndpoint, SnapshotExchange, serve
from gpuflight.producer.contract.files import check_target
from gpuflight.producer.decode.enrich import Enricher
from gpuflight.producer.decode.sinks import EventSink, JsonLinesSink
from gpuflight.producer.nvml import NvmlSampler, UtilizationFeed
from gpuflight.producer.probe.preflight import check_can_probe
from gpuflight.producer.publish import deadagents
from gpuflight.producer.publish.deadagents import read_pinned_tally
from gpuflight.producer.publish.kafkasink import KafkaSettings, KafkaSink
from gpuflight.producer.settings import CaptureSettings
from gpuflight.producer.status import STATE_READY, STATE_STOPPED, StatusFile
from gpuflight.producer.top import FEED_PATH, TopFeed
from gpuflight.producer.toptable import TopTable

log = logging.getLogger(__name__)

#: The exit code when an output failed while capturing (sysexits' EX_IOERR); the others went on.
EXIT_OUTPUT_INCOMPLETE = 74
#: How often the producer logs its counters when it has no Kafka to publish them to.
LOG_INTERVAL_S = 30.0
NVML_INTERVAL_S = 1.0


def metrics_record(capture: Capture, kafka: KafkaSink | None, started: float,
                   ledger: deadagents.Ledger | None = None) -> wire.MetricsRecord:
    drops = capture.drops()
    http_lost, http_untracked = capture.http_drops()
    return wire.MetricsRecord(
        host=kafka.host if kafka else socket.gethostname(),
        ts_ns=time.time_ns(),
        uptime_s=round(time.monotonic() - started, 3),
        captured=capture.stats.events,
        produced=kafka.produced_events if kafka else 0,
        published=kafka.delivered_events if kafka else 0,
        dropped_kernel=drops.events,
        dropped_kernel_by_pid=dict(drops.by_pid),
        dropped_user=kafka.dropped_events if kafka else 0,
        dropped_user_by_pid=dict(kafka.dropped_by_pid) if kafka else {},
        queue_messages=kafka.queue_depth() if kafka else 0,
        libraries_attached=capture.probes.runtime_files(),
        driver_libraries_attached=capture.probes.driver_files(),
        dropped_names=drops.names,
        forwarded_driver_calls=drops.forwarded,
        requests=capture.stats.requests,
        http_records_lost=http_lost,
        http_connections_untracked=http_untracked,
        dropped_agent_died=ledger.dead_total if ledger else 0,
        dropped_agent_died_by_pid=dict(ledger.dead_by_pid) if ledger else {},
        events_aggregated=drops.aggregated,
    )


def _start_nvml(samples: queue.SimpleQueue[list[wire.GpuSample]] | None
                ) -> UtilizationFeed | None:
    """NVML on its own thread: GPU samples (into `samples`, with Kafka) and per-process
    utilisation for request cost and top's GPU-seconds; None (logged) without NVML."""
    try:
        sampler = NvmlSampler()
    except Exception as exc:  # NvmlUnavailable and anything the library throws
        log.info("NVML: %s; GPU samples are off, request GPU time is queued time, capture "
                 "goes on", exc)
        return None
    return UtilizationFeed(sampler, NVML_INTERVAL_S, samples.put if samples is not None else None)


def run(settings: CaptureSettings, output: Path | None, kafka: KafkaSettings | None = None,
        status_file: Path | None = None, *, metrics: MetricsEndpoint | None = None,
        top_feed: Path | None = FEED_PATH) -> int:
    if output is None and kafka is None:
        raise UsageError("producer needs a destination: --kafka HOST:PORT and/or --output FILE")
    # A FIFO or a symlink where a file goes is refused before anything starts.
    check_target(output, "--output")
    check_target(status_file, "--status-file", replaced=True)
    check_can_probe()
    exchange: SnapshotExchange[agentmetrics.AgentHealth] = SnapshotExchange()
    # Bound before anything starts: a port in use is a one-line error, not a running agent.
    stop_serving = (serve(metrics, [agentmetrics.AgentCollector(exchange)])
                    if metrics is not None else None)
    try:
        return _run(settings, output, kafka, status_file, exchange=exchange, top_feed=top_feed)
    finally:
        if stop_serving is not None:
            try:
                stop_serving()
            except Exception as exc:  # never the user's output for it
                log.warning("metrics: stopping the server: %s", exc)


def _run(settings: CaptureSettings, output: Path | None, kafka: KafkaSettings | None,
         status_file: Path | None, *,
         exchange: SnapshotExchange[agentmetrics.AgentHealth], top_feed: Path | None) -> int:
    stopping: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    sinks: list[EventSink] = []
    enricher = Enricher(proc_root=settings.proc_root)
    if output is not None:
        sinks.append(JsonLinesSink(output, enricher.kernels))
    kafka_sink = (
        KafkaSink(kafka, proc_root=settings.proc_root, kernels=enricher.kernels) if kafka else None
    )
    if kafka_sink is not None:
        sinks.append(kafka_sink)
    tally_dir = _tally_dir() if kafka_sink is not None else None
    if tally_dir is not None:
        settings = dataclasses.replace(settings, tally_dir=tally_dir)
    top: TopFeed | None = None
    if top_feed is not None:
        # What `gpuflight top` shows, for it to read rather than probe everything again.
        serving = TopFeed(TopTable(kernels=enricher.kernels, proc_root=settings.proc_root,
                                   http=settings.http), path=top_feed)
        if serving.start():
            sinks.append(serving)
            top = serving
    capture = Capture(settings, sinks, enricher)
    ledger = None
    if kafka_sink is not None:
        capture.process_observers.append(kafka_sink.observe)
        capture.exit_observers.append(kafka_sink.forget_processes)
        if tally_dir is not None:
            ledger = deadagents.Ledger(capture.probes, tally_dir)  # agents: the real /proc
            kafka_sink.on_delivered = ledger.delivered
            ledger.collect_dead(read_pinned_tally)
    capture.start()
    capture.probes.wait_loaded()  # ready means every program loaded (a failure ends here)
    status = StatusFile(status_file) if status_file is not None else None
    started = time.monotonic()
    started_unix = time.time()

    def health() -> agentmetrics.AgentHealth:
        record = metrics_record(capture, kafka_sink, started, ledger)
        return agentmetrics.take(capture, kafka_sink, record, started_unix)
    samples: queue.SimpleQueue[list[wire.GpuSample]] = queue.SimpleQueue()
    feed = None
    if kafka_sink is not None or capture.requests is not None or top is not None:
        feed = _start_nvml(samples if kafka_sink is not None else None)
        # Taken each turn, whoever uses it: its per-process windows never pile up.
        capture.utilization = feed
        if top is not None and feed is not None:
            # top's GPU-seconds a second, and the GPU model each is priced by (top's side).
            top.table.gpu_names = feed.gpu_names
            capture.utilization_observers.append(top.add_utilization)
    scope = "every process" if settings.pids is None else f"pids {sorted(settings.pids)}"
    destinations = ", ".join(
        ([str(output)] if output else []) + ([f"Kafka {kafka.bootstrap}"] if kafka else [])
    )
    skipped = capture.probes.skipped_cuda()
    log.info(
        "ready: capturing %s into %s, %d library file(s) attached%s",
        scope,
        destinations,
        capture.probes.runtime_files(),
        f", {len(skipped)} CUDA file(s) NOT probed (warned above)" if skipped else "",
    )
    _status(status, capture, STATE_READY, force=True)
    interval = kafka.metrics_interval_s if kafka else LOG_INTERVAL_S
    next_report = time.monotonic() + interval
    trimmer = memtrim.Trimmer()
    try:
        while not stopping:
            capture.step()
            if kafka_sink is not None:
                while not samples.empty():
                    kafka_sink.publish_nvml(wire.NvmlRecord(kafka_sink.host, time.time_ns(),
                                                            tuple(samples.get())))
            if time.monotonic() >= next_report:
                _report(capture, kafka_sink, kafka, started, ledger)
                if ledger is not None:
                    ledger.sweep(lambda pid: (settings.proc_root / str(pid)).exists())
                next_report += interval
                trimmer.maybe()
            _status(status, capture, STATE_READY)
            exchange.answer(health)
    finally:
        if feed is not None and capture.requests is None:  # no request waits for its word
            feed.stop()
        if ledger is not None:
            ledger.freeze()
        # Everything, held-back events included, before the last metrics (with requests, NVML
        # is read once more for the last batches, and stopped).
        capture.finish()
        if kafka_sink is not None and kafka is not None:
            # The last metrics say what was delivered, so deliver first.
            deadline = time.monotonic() + kafka.close_timeout_s
            kafka_sink.flush(kafka.close_timeout_s)
            _report(capture, kafka_sink, kafka, started, ledger)
            kafka_sink.flush(max(0.0, deadline - time.monotonic()))  # its ack settles drops
        else:
            _report(capture, kafka_sink, kafka, started)
        if ledger is not None:
            ledger.close()
        drops = capture.close()
        if feed is not None:
            feed.stop()
            feed.sampler.close()
    log.info(
        "stopped: captured %d events, dropped %d in the kernel%s%s",
        capture.stats.events,
        drops.events,
        f" (by pid: {drops.by_pid})" if drops.by_pid else "",
        f", {kafka_sink.dropped_events} beyond the Kafka buffer" if kafka_sink else "",
    )
    failed = capture.failed_sinks()
    for sink in failed:
        log.error("%s is incomplete: %s (%d events not written)", sink.name, sink.failure,
                  sink.lost)
    _status(status, capture, STATE_STOPPED, force=True, dropped=drops.events)
    return EXIT_OUTPUT_INCOMPLETE if failed else 0


def _status(status: StatusFile | None, capture: Capture, state: str, force: bool = False,
            dropped: int | None = None) -> None:
    if status is None or not (force or status.due(capture.probes.attached)):
        return
    status.update(
        state,
        attached=capture.probes.attached,
        skipped=capture.probes.failed,
        captured=capture.stats.events,
        aggregated=capture.stats.aggregated,
        dropped_kernel=capture.drops().events if dropped is None else dropped,
        requests=capture.stats.requests,
        outputs=[(s.name, s.failure, s.lost) for s in capture.sinks],
        force=force,
    )


def _tally_dir() -> Path | None:
    """This agent's tally directory, or None (logged once: a SIGKILL's losses go uncounted).
    Agents are this host's processes: the real /proc, whatever a `--proc` tree says."""
    try:
        return deadagents.prepare()
    except (deadagents.TallyUnavailable, OSError) as exc:
        log.warning("tally: %s; events a killed agent never published will not be counted",
                    exc)
        return None


def _report(
    capture: Capture, sink: KafkaSink | None, kafka: KafkaSettings | None, started: float,
    ledger: deadagents.Ledger | None = None,
) -> None:
    record = metrics_record(capture, sink, started, ledger)
    if sink is not None and kafka is not None:
        acknowledged = None
        if ledger is not None:
            dead = bool(record.dropped_agent_died_by_pid)
            acknowledged = lambda: ledger.published(record.dropped_user_by_pid, dead)  # noqa: E731
        sink.publish_metrics(record, acknowledged)
    else:
        log.info("captured %d events, dropped %d", record.captured, record.dropped_kernel)
