"""The stream worker's health on /metrics (`gpuflight streams --metrics-port PORT`).

The counters the worker already writes to InfluxDB as its `streams` point, as Prometheus
metrics: messages and events taken, late, future and duplicate events, dead letters by reason,
alerts, requests, consumer lag per partition, jobs and windows open, parked messages, and the
InfluxDB sink's points written, rejected and retried, its queue and its write errors by HTTP
status. A scrape takes them on the worker's event loop (never reading Faust's consumer or the
job states from the HTTP server's thread) and waits a little while for them; a loop too busy
to answer in time is served the previous figures, their age saying so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuflight.producer.contract.exposition import SNAPSHOT_WAIT_S

if TYPE_CHECKING:
    from gpuflight.streams.sink import SinkStats
    from gpuflight.streams.worker import Worker, WorkerStats

log = logging.getLogger(__name__)

PREFIX: Final = "gpuflight_worker"

#: Every dead-letter reason the worker gives (streams/worker.py), shown even at 0.
DEAD_LETTER_REASONS: Final = ("malformed", "late", "windows", "future")


@dataclass(frozen=True)
class WorkerHealth:
    started_unix_s: float
    stats: WorkerStats
    sink: SinkStats
    lag_by_partition: dict[int, int] = field(default_factory=dict)
    jobs: int = 0
    windows_open: int = 0
    parked_messages: int = 0


def take(worker: Worker, started_unix_s: float) -> WorkerHealth:
    """The worker's health now (on its event loop): copies, so nothing changes under a scrape."""
    stats = replace(worker.stats, dead_letters_by_reason=dict(worker.stats.dead_letters_by_reason))
    sink = replace(worker.sink.stats, errors_by_status=dict(worker.sink.stats.errors_by_status))
    return WorkerHealth(
        started_unix_s=started_unix_s,
        stats=stats,
        sink=sink,
        lag_by_partition=worker.lag_by_partition(),
        jobs=worker.jobs(),
        windows_open=worker.windows_open(),
        parked_messages=worker.parked_messages(),
    )


class WorkerCollector:
    """Renders the worker's health on each scrape, taken on the worker's loop (`attach`)."""

    def __init__(self, wait_s: float = SNAPSHOT_WAIT_S) -> None:
        self._worker: Worker | None = None
        self._wait_s = wait_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = time.time()
        self._last: WorkerHealth | None = None
        self._taken = 0.0

    def attach(self, worker: Worker, loop: asyncio.AbstractEventLoop) -> None:
        """The worker and its running loop: scrapes are answered from then on."""
        self._worker, self._loop = worker, loop

    def collect(self) -> Iterator[Metric]:
        worker, loop = self._worker, self._loop
        if worker is not None and loop is not None and not loop.is_closed():

            async def now() -> WorkerHealth:
                return take(worker, self._started)

            future = asyncio.run_coroutine_threadsafe(now(), loop)
            try:
                self._last, self._taken = future.result(self._wait_s), time.monotonic()
            except concurrent.futures.TimeoutError:
                future.cancel()
            except Exception:
                log.exception("metrics: cannot take the worker's figures")
        if self._last is None:
            return
        yield from families(self._last, time.monotonic() - self._taken)


def families(h: WorkerHealth, age_s: float = 0.0) -> Iterator[Metric]:
    """The metric families of one snapshot (`age_s`: how old it is when served)."""
    s, sink = h.stats, h.sink

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

    yield gauge("start_time_seconds", "When the worker started (Unix time).", h.started_unix_s)
    yield gauge("snapshot_age_seconds",
                "How old the figures served are: 0 unless the worker's loop was too busy to "
                "take new ones within the scrape's wait.", round(age_s, 3))
    yield counter("messages", "Kafka messages taken (events, NVML, agent metrics).", s.messages)
    yield counter("events", "CUDA events counted.", s.events)
    yield counter("duplicate_events", "Events seen before (a redelivery), not counted again.",
                  s.duplicates)
    yield counter("late_events",
                  "Events of windows closed already (late beyond grace): not counted.",
                  s.late_events)
    yield counter("future_events",
                  "Events too far ahead of the wall clock (--max-future): not counted.",
                  s.future_events)
    dead = CounterMetricFamily(f"{PREFIX}_dead_letters",
                               "Messages sent to the dead-letter topic, by reason.",
                               labels=["reason"])
    reasons = dict.fromkeys(DEAD_LETTER_REASONS, 0) | s.dead_letters_by_reason
    for reason, n in sorted(reasons.items()):
        dead.add_metric([reason], n)
    yield dead
    yield counter("alerts", "Alerts sent (bandwidth anomalies, memory-bound jobs).", s.alerts)
    yield counter("unknown_identities",
                  "Processes counted without an identity (their job unknown).",
                  s.unknown_identities)
    yield counter("requests", "HTTP requests counted.", s.requests)
    yield counter("late_requests", "Requests of windows closed already: not counted.",
                  s.late_requests)
    yield counter("future_requests",
                  "Requests ending too far ahead of the wall clock: not counted.",
                  s.future_requests)
    yield counter("code_paths", "Code paths counted (their sampled calls' costs).", s.paths)
    yield counter("late_code_paths",
                  "Code paths of windows closed already, or stamped too far ahead: not counted.",
                  s.late_paths)
    yield counter("tick_errors", "Jobs whose windows a tick could not write (tried again).",
                  s.tick_errors)
    yield counter("partition_rereads",
                  "Partitions read again from a message never taken (a gap, or a stall).",
                  s.rereads)
    yield counter("skipped_messages",
                  "Messages of the events, NVML and metrics topics lost: gone when read again.",
                  s.skipped_messages)
    lag = GaugeMetricFamily(f"{PREFIX}_consumer_lag_messages",
                            "Messages of the events topic not taken yet, per partition held.",
                            labels=["partition"])
    for partition, n in sorted(h.lag_by_partition.items()):
        lag.add_metric([str(partition)], n)
    yield lag
    yield gauge("jobs", "Jobs this worker holds state for.", h.jobs)
    yield gauge("windows_open", "Windows of those jobs not closed yet.", h.windows_open)
    yield gauge("parked_messages", "Messages waiting for their process's identity.",
                h.parked_messages)
    yield counter("influx_points_written", "Points InfluxDB took.", sink.written_points)
    yield counter("influx_points_rejected", "Points InfluxDB refused (logged).",
                  sink.rejected_points)
    yield counter("influx_write_retries", "InfluxDB writes tried again.", sink.retries)
    yield gauge("influx_pending_points", "Points waiting to be written to InfluxDB.",
                sink.pending_points)
    errors = CounterMetricFamily(f"{PREFIX}_influx_write_errors",
                                 "InfluxDB writes that failed, by HTTP status (0: no answer).",
                                 labels=["status"])
    for status, n in sorted(sink.errors_by_status.items()):
        errors.add_metric([str(status)], n)
    yield errors
