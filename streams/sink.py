"""InfluxDB sink: batches points, writes them with influxdb-client (v2 write API), retries with
backoff while InfluxDB is away, and pushes back on the worker when too much is waiting.

`put` returns at once while fewer than `max_pending_points` wait; beyond that it waits for
room, so the Faust agent stops taking messages (Faust then pauses the partitions once its
stream buffer is full) instead of piling points up or dropping them. A batch is retried until
InfluxDB takes it, except when InfluxDB answers that it can never take it (HTTP 400, e.g. a
field type conflict): those points are counted as rejected and logged, so one bad point
cannot stall the pipeline. A point that breaks the contract (streams/measurements.py: an empty
tag, a value that is not finite or not an int64) is not sent at all: it is counted as rejected
and logged, and the rest of its batch goes on. Each `Batch` may carry a token;
`on_written(token)` runs once InfluxDB has the batch's points (the worker marks windows written
with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpuflight.streams.influxql import missing_database
from gpuflight.streams.measurements import Point, problems
from gpuflight.streams.settings import InfluxSettings

log = logging.getLogger(__name__)

#: HTTP statuses after which a write is not retried: the data itself was refused.
REFUSED_STATUSES: Final = frozenset({400, 422})


@dataclass(frozen=True)
class Batch:
    points: Sequence[Point]
    token: Any = None


@dataclass
class SinkStats:
    written_points: int = 0
    rejected_points: int = 0
    write_requests: int = 0
    retries: int = 0
    pending_points: int = 0
    #: Time the oldest waiting batch has waited (s), at the last look.
    last_error: str = ""
    last_write_s: float = 0.0
    #: Failed writes by HTTP status; 0: no answer (refused connection, timeout).
    errors_by_status: dict[int, int] = field(default_factory=dict)


def line(point: Point) -> str:
    """The point in line protocol (ns precision), fields typed as the contract says."""
    from influxdb_client.client.write.point import Point as InfluxPoint

    out: Any = InfluxPoint(point.measurement)  # type: ignore[no-untyped-call]
    for tag, text in sorted(point.tags.items()):
        out.tag(tag, text)
    for name, value in point.fields.items():
        out.field(name, value)
    out.time(point.time_ns)
    return str(out.to_line_protocol())


class InfluxSink:
    def __init__(
        self,
        settings: InfluxSettings,
        on_written: Callable[[Any], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.stats = SinkStats()
        self._on_written = on_written
        self._queue: deque[Batch] = deque()
        self._room = asyncio.Condition()
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._clock = clock
        #: HTTP statuses of the failures already logged (cleared by a write that succeeds).
        self._said: set[int] = set()

    async def start(self, on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Start writing; `on_failure` is told if the writer ever ends on an error it does not
        retry (a defect): the points would wait for ever, so the worker must not go on."""
        from influxdb_client.client.influxdb_client_async import InfluxDBClientAsync

        self._client = InfluxDBClientAsync(
            url=self.settings.url, token=self.settings.write_token, org=self.settings.org,
            timeout=round(self.settings.timeout_s * 1000), ssl_ca_cert=self.settings.ca_file,
        )
        self._task = asyncio.get_running_loop().create_task(self._run(), name="influx-sink")
        self._task.add_done_callback(lambda task: self._ended(task, on_failure))

    def _ended(self, task: asyncio.Task[None],
               on_failure: Callable[[BaseException], None] | None) -> None:
        if task.cancelled() or task.exception() is None:
            return  # stopped
        exc = task.exception()
        assert exc is not None
        log.error("InfluxDB sink stopped on %s: %s (%d points unwritten)",
                  type(exc).__name__, exc, self.stats.pending_points)
        if on_failure is not None:
            on_failure(exc)

    async def stop(self, drain_s: float = 10.0) -> None:
        """Write what waits (for up to `drain_s`), then close the client."""
        deadline = self._clock() + drain_s
        while self._queue and self._clock() < deadline and self._task and not self._task.done():
            await asyncio.sleep(0.05)
        if self._queue:
            log.warning("InfluxDB sink stopped with %d points unwritten (they are recomputed"
                        " from Kafka on restart)", self.stats.pending_points)
        if self._task and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.close()

    async def put(self, batch: Batch) -> None:
        checked = [(p, problems(p)) for p in batch.points]
        bad = [(p, found) for p, found in checked if found]
        if bad:
            self.stats.rejected_points += len(bad)
            for point, found in bad[:3]:
                log.error("not writing a %s point that breaks the contract: %s",
                          point.measurement, "; ".join(found)[:300])
            batch = Batch([p for p, found in checked if not found], batch.token)
        if not batch.points:
            if self._on_written and batch.token is not None:
                self._on_written(batch.token)
            return
        async with self._room:
            await self._room.wait_for(
                lambda: self.stats.pending_points < self.settings.max_pending_points
            )
            self._queue.append(batch)
            self.stats.pending_points += len(batch.points)
        self._work.set()

    @property
    def full(self) -> bool:
        return self.stats.pending_points >= self.settings.max_pending_points

    async def _run(self) -> None:
        write_api = self._client.write_api()
        backoff = self.settings.retry_initial_s
        while True:
            await self._work.wait()
            if not self._queue:
                self._work.clear()
                continue
            batches = self._take()
            lines = [line(p) for b in batches for p in b.points]
            while True:
                outcome = await self._write(write_api, lines)
                if outcome != "retry":
                    break
                self.stats.retries += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.retry_max_s)
            backoff = self.settings.retry_initial_s
            n = sum(len(b.points) for b in batches)
            if outcome == "written":
                self.stats.written_points += n
            else:
                self.stats.rejected_points += n
            self.stats.last_write_s = self._clock()
            for batch in batches:
                if self._on_written and batch.token is not None:
                    self._on_written(batch.token)
            async with self._room:
                self.stats.pending_points -= n
                self._room.notify_all()

    def _take(self) -> list[Batch]:
        taken: list[Batch] = []
        points = 0
        while self._queue and (not taken or points + len(self._queue[0].points)
                               <= self.settings.batch_points):
            batch = self._queue.popleft()
            taken.append(batch)
            points += len(batch.points)
        return taken

    async def _write(self, write_api: Any, lines: list[str]) -> str:
        from influxdb_client.rest import ApiException

        self.stats.write_requests += 1
        try:
            await write_api.write(bucket=self.settings.bucket, org=self.settings.org,
                                  record=lines, write_precision="ns")
        except ApiException as exc:
            status = int(exc.status or 0)
            self.stats.errors_by_status[status] = self.stats.errors_by_status.get(status, 0) + 1
            message = (exc.message or exc.reason or str(exc)).strip().splitlines()[0:1]
            self.stats.last_error = f"HTTP {status}: {message[0] if message else ''}"
            if status in REFUSED_STATUSES:
                log.error("InfluxDB refused %d points (%s); they are dropped and counted",
                          len(lines), self.stats.last_error)
                return "refused"
            if status == 404 or status in {401, 403}:
                # Not transient: said once, in one line with the fix, until a write succeeds.
                if status not in self._said:
                    self._said.add(status)
                    log.error("%s; the worker keeps the points and retries every %g s at most",
                              missing_database(self.settings.url, self.settings.database)
                              if status == 404 else
                              f"InfluxDB at {self.settings.url} refused the credentials"
                              f" ({self.stats.last_error}): set GPUFLIGHT_INFLUX_TOKEN or"
                              " GPUFLIGHT_INFLUX_USERNAME and _PASSWORD",
                              self.settings.retry_max_s)
                return "retry"
            log.warning("InfluxDB write failed (%s); retrying", self.stats.last_error)
            return "retry"
        except (TimeoutError, OSError) as exc:
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            self.stats.errors_by_status[0] = self.stats.errors_by_status.get(0, 0) + 1
            if self.stats.retries % 20 == 0:
                log.warning("InfluxDB at %s unreachable (%s); retrying with backoff",
                            self.settings.url, self.stats.last_error)
            return "retry"
        except Exception as exc:  # aiohttp's ClientError tree is not an OSError
            if type(exc).__module__.startswith("aiohttp"):
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                if self.stats.retries % 20 == 0:
                    log.warning("InfluxDB at %s unreachable (%s); retrying with backoff",
                                self.settings.url, self.stats.last_error)
                return "retry"
            raise
        if self._said:
            log.warning("InfluxDB at %s takes the writes again", self.settings.url)
            self._said.clear()
        return "written"
