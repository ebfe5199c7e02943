"""The stream worker's /metrics: taken on the worker's event loop, names Prometheus' linter
accepts, each figure the worker's own counter."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from gpuflight.streams.sink import SinkStats
from gpuflight.streams.worker import WorkerStats
from gpuflight.streams.workermetrics import WorkerCollector
from tests.support.promlint import lint, samples


class _Worker:
    """What the collector reads of a Worker (streams/worker.py), recording the thread."""

    def __init__(self) -> None:
        self.stats = WorkerStats(messages=40, events=120_000, duplicates=5, late_events=9,
                                 future_events=2, dead_letters=4, alerts=1, requests=30,
                                 late_requests=1, future_requests=0, tick_errors=0,
                                 paths=7, late_paths=2, rereads=1, skipped_messages=3,
                                 dead_letters_by_reason={"late": 3, "future": 1})
        self.sink = type("Sink", (), {})()
        self.sink.stats = SinkStats(written_points=800, rejected_points=2, retries=3,
                                    pending_points=17, errors_by_status={0: 2, 503: 1})
        self.threads: list[str] = []

    def lag_by_partition(self) -> dict[int, int]:
        self.threads.append(threading.current_thread().name)
        return {0: 12, 3: 0}

    def jobs(self) -> int:
        return 6

    def windows_open(self) -> int:
        return 14

    def parked_messages(self) -> int:
        return 1


@contextmanager
def _loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="worker-loop")
    thread.start()
    try:
        yield loop
    finally:
        # What is queued on it (a cancelled scrape's task) runs out before it stops.
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def _text(collector: WorkerCollector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def test_figures_are_taken_on_the_workers_loop_and_pass_promtools_linter() -> None:
    worker = _Worker()
    collector = WorkerCollector(wait_s=30)
    with _loop() as loop:
        collector.attach(worker, loop)  # type: ignore[arg-type]
        text = _text(collector)
    assert worker.threads == ["worker-loop"]
    got = samples(text)
    p = "gpuflight_worker_"
    want: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {
        (f"{p}messages_total", ()): 40,
        (f"{p}events_total", ()): 120_000,
        (f"{p}duplicate_events_total", ()): 5,
        (f"{p}late_events_total", ()): 9,
        (f"{p}future_events_total", ()): 2,
        (f"{p}dead_letters_total", (("reason", "late"),)): 3,
        (f"{p}dead_letters_total", (("reason", "future"),)): 1,
        (f"{p}dead_letters_total", (("reason", "malformed"),)): 0,
        (f"{p}dead_letters_total", (("reason", "windows"),)): 0,
        (f"{p}alerts_total", ()): 1,
        (f"{p}requests_total", ()): 30,
        (f"{p}late_requests_total", ()): 1,
        (f"{p}code_paths_total", ()): 7,
        (f"{p}late_code_paths_total", ()): 2,
        (f"{p}partition_rereads_total", ()): 1,
        (f"{p}skipped_messages_total", ()): 3,
        (f"{p}consumer_lag_messages", (("partition", "0"),)): 12,
        (f"{p}consumer_lag_messages", (("partition", "3"),)): 0,
        (f"{p}jobs", ()): 6,
        (f"{p}windows_open", ()): 14,
        (f"{p}parked_messages", ()): 1,
        (f"{p}influx_points_written_total", ()): 800,
        (f"{p}influx_points_rejected_total", ()): 2,
        (f"{p}influx_write_retries_total", ()): 3,
        (f"{p}influx_pending_points", ()): 17,
        (f"{p}influx_write_errors_total", (("status", "0"),)): 2,
        (f"{p}influx_write_errors_total", (("status", "503"),)): 1,
    }
    assert {k: got.get(k) for k in want} == want
    assert got[(f"{p}snapshot_age_seconds", ())] == 0
    assert lint(text) == []  # last: without promlint built, it skips (fails under CI)


def test_a_loop_too_busy_to_answer_is_served_the_last_figures_with_their_age() -> None:
    worker = _Worker()
    collector = WorkerCollector(wait_s=0.2)
    with _loop() as loop:
        collector.attach(worker, loop)  # type: ignore[arg-type]
        _text(collector)
        worker.stats.events = 999_999
        busy, scraped = threading.Event(), threading.Event()

        def block() -> None:  # the loop busy until the scrape is over
            busy.set()
            scraped.wait(60)

        loop.call_soon_threadsafe(block)
        busy.wait()
        try:
            got = samples(_text(collector))
        finally:
            scraped.set()
    assert got[("gpuflight_worker_events_total", ())] == 120_000  # the figures before
    assert got[("gpuflight_worker_snapshot_age_seconds", ())] >= 0.2


def test_nothing_is_served_before_the_worker_runs() -> None:
    assert _text(WorkerCollector(wait_s=0)) == ""
