"""`--metrics-port`: a service's own health as Prometheus metrics, on GET /metrics.

Both long-running services serve it, the node agent (producer/agentmetrics.py) and the stream
worker (streams/workermetrics.py), with prometheus-client's HTTP server on a registry of one
collector. The collector never reads the service's state from the HTTP server's thread: a
scrape asks the service's own thread for a snapshot (`SnapshotExchange`) and waits for it a
little while, so BPF maps, librdkafka handles and the Faust consumer are touched only where
they live, and only when someone scrapes. A service too busy to answer in time is served its
previous snapshot, with its age (`*_snapshot_age_seconds`) saying so.

Names follow Prometheus' conventions: `gpuflight_agent_…`/`gpuflight_worker_…`, counters end in
`_total`, units in the name (`_seconds`, `_bytes`, `_ratio`), checked by promtool's linter
(scripts/promlint) and client_python's parser in the tests.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Generic, TypeVar

from gpuflight.producer.contract.errors import ServiceError, UsageError

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

#: Where /metrics listens unless told otherwise: this host only (a node's agent runs as root).
DEFAULT_ADDRESS: Final = "127.0.0.1"
#: How long a scrape waits for the service's thread to take a fresh snapshot.
SNAPSHOT_WAIT_S: Final = 2.0

T = TypeVar("T")


@dataclass(frozen=True)
class MetricsEndpoint:
    """`--metrics-port PORT` and `--metrics-address ADDR`."""

    port: int
    address: str = DEFAULT_ADDRESS

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise UsageError(f"--metrics-port must be 1-65535, not {self.port}")
        try:
            ipaddress.ip_address(self.address)
        except ValueError:
            raise UsageError(
                f"--metrics-address must be an IP address (127.0.0.1, 0.0.0.0, ::), "
                f"not {self.address!r}"
            ) from None

    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"


class SnapshotExchange(Generic[T]):
    """A scrape's request for a snapshot, answered on the service's own thread.

    The HTTP server's thread calls `latest()`: it asks, waits up to `wait_s` for `answer` to be
    called by the service's loop (which checks `wanted` every turn: a flag, nothing more), and
    returns the fresh snapshot with its age, or the last one (older) if none came in time.
    """

    def __init__(self, wait_s: float = SNAPSHOT_WAIT_S) -> None:
        self._wait_s = wait_s
        self._cond = threading.Condition()
        self._wanted = False
        self._snapshot: T | None = None
        self._taken = 0.0
        self._generation = 0

    @property
    def wanted(self) -> bool:
        return self._wanted

    def answer(self, take: Callable[[], T]) -> None:
        """On the service's thread: take a snapshot if a scrape is waiting for one. A snapshot
        that fails to be taken is logged; the scrape gets the previous one."""
        if not self._wanted:
            return
        try:
            snapshot = take()
        except Exception:
            log.exception("metrics: cannot take a snapshot")
            snapshot = None
        with self._cond:
            self._wanted = False
            if snapshot is not None:
                self._snapshot = snapshot
                self._taken = time.monotonic()
                self._generation += 1
            self._cond.notify_all()

    def offer(self, snapshot: T) -> None:
        """On the service's thread: a snapshot taken anyway (at start, at stop)."""
        with self._cond:
            self._snapshot = snapshot
            self._taken = time.monotonic()
            self._generation += 1
            self._cond.notify_all()

    def latest(self) -> tuple[T | None, float]:
        """On the scraping thread: (snapshot, its age in seconds); (None, 0) before the first."""
        with self._cond:
            generation = self._generation
            self._wanted = True
            self._cond.wait_for(lambda: self._generation != generation or not self._wanted,
                                timeout=self._wait_s)
            return self._snapshot, (time.monotonic() - self._taken if self._snapshot else 0.0)


def serve(endpoint: MetricsEndpoint, collectors: Iterable[Collector]) -> Callable[[], None]:
    """Serve /metrics on `endpoint` from a registry of `collectors` (and nothing else: no
    process or platform metrics of the client's own), on a daemon thread. Returns what stops
    it. A port that cannot be bound is a ServiceError (one line), before the service starts."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    try:
        server, thread = start_http_server(endpoint.port, endpoint.address, registry)
    except OSError as exc:
        reason = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise ServiceError(
            f"cannot serve metrics on {endpoint.address}:{endpoint.port}: {reason}"
        ) from None
    log.info("metrics: %s", endpoint.url())

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
