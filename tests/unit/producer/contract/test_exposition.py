"""--metrics-port's endpoint: the snapshot handed from the service's thread to a scrape, and
the server's bounds."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from prometheus_client.core import CounterMetricFamily, Metric

from gpuflight.producer.contract.errors import ServiceError, UsageError
from gpuflight.producer.contract.exposition import MetricsEndpoint, SnapshotExchange, serve
from tests.support.promlint import samples, scrape


def test_a_scrape_gets_the_snapshot_the_services_thread_takes_when_asked() -> None:
    exchange: SnapshotExchange[int] = SnapshotExchange(wait_s=30)
    taken: list[str] = []
    stop = threading.Event()

    turns = [0]

    def snapshot() -> int:
        taken.append(threading.current_thread().name)
        return turns[0]

    def service() -> None:  # the service's loop: answers while a scrape waits, else nothing
        while not stop.is_set():
            turns[0] += 1
            exchange.answer(snapshot)

    thread = threading.Thread(target=service, name="service")
    thread.start()
    try:
        first, age = exchange.latest()
        second, _ = exchange.latest()
    finally:
        stop.set()
        thread.join()
    assert first is not None and second is not None and second > first
    assert age < 30
    assert taken == ["service", "service"]  # taken on its thread, once per scrape


def test_a_service_too_busy_to_answer_serves_its_last_snapshot_with_its_age() -> None:
    exchange: SnapshotExchange[str] = SnapshotExchange(wait_s=0.05)
    assert exchange.latest() == (None, 0.0)  # nothing yet: nothing served
    exchange.offer("at start")
    snapshot, age = exchange.latest()  # nobody answers
    assert snapshot == "at start" and age >= 0.05
    assert exchange.wanted  # still asked for: the loop's next turn takes one


def test_a_snapshot_that_fails_leaves_the_last_one_served() -> None:
    exchange: SnapshotExchange[str] = SnapshotExchange(wait_s=30)
    exchange.offer("good")

    def broken() -> str:
        raise RuntimeError("a map went away")

    answered = threading.Thread(target=lambda: _answer_when_wanted(exchange, broken))
    answered.start()
    snapshot, _ = exchange.latest()
    answered.join()
    assert snapshot == "good"


def _answer_when_wanted(exchange: SnapshotExchange[str], take: object) -> None:
    while not exchange.wanted:
        threading.Event().wait(0.001)
    exchange.answer(take)  # type: ignore[arg-type]


class _Fixed:
    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("gpuflight_test_things", "Things.", value=3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_endpoint_serves_its_collectors_and_nothing_else() -> None:
    endpoint = MetricsEndpoint(_free_port())
    stop = serve(endpoint, [_Fixed()])
    try:
        text = scrape(endpoint.url())
    finally:
        stop()
    assert samples(text) == {("gpuflight_test_things_total", ()): 3.0}  # no process_*, python_*


def test_a_port_in_use_is_one_line_before_anything_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServiceError, match=f"cannot serve metrics on 127.0.0.1:{port}: in use"):
            serve(MetricsEndpoint(port), [_Fixed()])


@pytest.mark.parametrize("port, address", [(0, "127.0.0.1"), (65536, "127.0.0.1"),
                                           (9400, "localhost"), (9400, "1.2.3")])
def test_an_endpoint_out_of_bounds_is_a_usage_error(port: int, address: str) -> None:
    with pytest.raises(UsageError):
        MetricsEndpoint(port, address)


def test_an_ipv6_endpoint_has_its_address_in_brackets() -> None:
    assert MetricsEndpoint(9400, "::1").url() == "http://[::1]:9400/metrics"
