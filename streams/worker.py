"""The stream worker: topics → job states (streams/windows.py) → InfluxDB (streams/sink.py).

`Worker` is what the Faust app (streams/app.py) hands each message to. One agent consumes,
co-partitioned (all keyed by host, with the same partition count):

  PREFIX.events.v1     raw events → the (host, job) states of a Faust table
  PREFIX.nvml.v1       GPU samples → gpu / gpu_process points, and utilisation for verdicts
                       (parked, as events are, while a process it names has no identity)
  PREFIX.metrics.v1    producer counters → pipeline points
  APP_ID.ticks         one message per partition per tick, sent by the leader worker's timer:
                       the wall-clock beat at which each partition's jobs are written and
                       closed, and its parked messages resolved

so every state is read and written by the worker that owns its partition, inside the agent,
and its changelog record lands in that partition. Several workers with the same app id share
the partitions (a Kafka consumer group); a restarted worker recovers the table from its
changelog and skips what it had already applied (windows.JobState.apply).

A job's time is its host's (streams/clock.py): the second latest time its messages say (their
latest event or request end) — so a replay of old data closes its windows at replay speed, not
at once, and no single message, however it is stamped, closes a host's windows — and, once the
host has been silent for `host_idle_s`, advanced by the wall clock beyond that, so the windows
of a host that stopped still close. Hence host time never runs ahead of the host's real time
by more than it takes its events to arrive: an event is late only when it arrives more than
host_idle_s + grace after it happened (a producer cut off from Kafka for longer, say). Events
and requests stamped more than `max_future_s` ahead of the wall clock are not counted at all.

A message whose process identity (processes topic, read by another thread) has not arrived
yet is parked in the table, never waited for in the agent (streams/parking.py): the other
hosts of the partition flow on, its host's later batches queue behind it in order; it is
resolved on the tick or by the host's next message, and goes to the job `unknown:PID` after
`identity_wait_s`. Its host's windows stay open from its earliest event until then.

Messages that are not gpuflight messages of this version, events of windows already closed
(late beyond grace), beyond the windows a message or a job may take (streams/windows.py), and
events and requests too far ahead of the clock, go to PREFIX.deadletter.v1 with the reason in a
header ("malformed", "late", "windows", "future"), and are counted. Anomalies and memory-bound
alerts go to PREFIX.alerts.v1 as JSON, keyed by host.

The table's values (job states, parked messages) go through streams/stored.py, so none is a
changelog record the broker refuses, whatever its size; a point that breaks the InfluxDB
contract is left out alone (streams/sink.py), and a job whose tick fails holds up no other.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from gpuflight.producer.contract import wire
from gpuflight.streams import measurements as m
from gpuflight.streams.aggregate import gpu_points, lost_points, pipeline_point
from gpuflight.streams.clock import HostClock
from gpuflight.streams.identities import UNKNOWN_JOB_FORMAT, Directory
from gpuflight.streams.measurements import Fields, Point, Tags
from gpuflight.streams.parking import EVENTS, METRICS, NVML, Parked, ParkingLot, is_parked_key
from gpuflight.streams.settings import StreamSettings
from gpuflight.streams.sink import Batch, InfluxSink
from gpuflight.streams.stalls import StallWatch
from gpuflight.streams.stored import Store
from gpuflight.streams.windows import JobState, state_key

log = logging.getLogger(__name__)

#: GPU samples kept per host (about ten minutes at NVML's 1 Hz per GPU).
GPU_SAMPLES_KEPT: Final = 4096
#: The largest dead letter the worker sends: under the broker's default message.max.bytes
#: (1 MiB), which the worker's uncompressed messages (and their headers) must fit; late events
#: are sent in as many events messages as it takes, a malformed message in parts.
DEAD_LETTER_MAX_BYTES: Final = 900_000
#: Kernel names (the `kernel` tag, and the keys of every window's counts) are cut to this.
MAX_KERNEL_CHARS: Final = 512
#: How long a partition read again after a gap may wait for the offset it awaits before it
#: is sought again. A seek can be undone by Faust's own loop: handing over what it fetched
#: before the seek, it moves its read offset on past the seek's, and then drops the messages
#: that come again below it. Sought again until the awaited offset comes (or stall_s gives it
#: up: the messages are gone).
RESEEK_S: Final = 1.0
#: A price above this (USD per GPU-hour) is no price: the job's GPU time is unpriced.
MAX_USD_PER_GPU_HOUR: Final = 1e6

Token = tuple[bytes, int, int, bool]


@dataclass(frozen=True)
class _Message:
    """A message taken again from where it was parked (what dead letters need of it)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


@dataclass
class WorkerStats:
    messages: int = 0
    events: int = 0
    duplicates: int = 0
    late_events: int = 0
    future_events: int = 0
    dead_letters: int = 0
    alerts: int = 0
    unknown_identities: int = 0
    requests: int = 0
    #: Requests of windows already closed (late beyond grace): not counted.
    late_requests: int = 0
    #: Requests ending more than max_future_s ahead of the wall clock: not counted.
    future_requests: int = 0
    #: Code paths counted, and those of windows closed (or stamped ahead): not counted.
    paths: int = 0
    late_paths: int = 0
    #: Jobs whose windows a tick could not write (logged; tried again on the next).
    tick_errors: int = 0
    #: Times a partition was read again from its first message not taken: a message past it
    #: came first (a gap in its offsets), or its messages waited untaken while the worker
    #: took others (streams/stalls.py).
    rereads: int = 0
    #: Messages of the events, NVML and metrics topics lost for good: gone from the log by
    #: the time they were read again (retention), or a partition that could not be read again.
    skipped_messages: int = 0
    #: Dead letters by reason ("malformed", "late", "windows", "future").
    dead_letters_by_reason: dict[str, int] = field(default_factory=dict)


class GpuUtilization:
    """Recent NVML samples per host, to judge memory-bound windows with."""

    def __init__(self) -> None:
        self._host: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self._job: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
        #: host → GPU index → its NVML name; (host, job) → the name of a GPU it ran on.
        self._names: dict[str, dict[int, str]] = defaultdict(dict)
        self._job_gpu: dict[tuple[str, str], str] = {}

    def add(self, record: wire.NvmlRecord, directory: Directory) -> None:
        host, t = record.host, record.ts_ns
        for gpu in record.gpus:
            if gpu.name:
                self._names[host][gpu.gpu] = gpu.name
                for proc in gpu.processes or ():
                    job = directory.latest_job(host, proc.pid)
                    if job is not None:
                        self._job_gpu[host, job] = gpu.name
            if gpu.utilization_gpu_pct is not None:
                _keep(self._host[host], (t, float(gpu.utilization_gpu_pct)))
            for proc in gpu.processes or ():
                job = directory.latest_job(host, proc.pid)
                if job is not None and proc.sm_util_pct is not None:
                    _keep(self._job[host, job], (t, float(proc.sm_util_pct)))

    def mean(self, host: str, job: str, start_ns: int, end_ns: int) -> float | None:
        """The job's GPU utilisation in [start, end): its processes' SM utilisation where NVML
        gave it, else the mean utilisation of the host's GPUs."""
        for samples in (self._job.get((host, job)), self._host.get(host)):
            values = [v for t, v in samples or () if start_ns <= t < end_ns]
            if values:
                return sum(values) / len(values)
        return None


    def forget(self, host: str, job: str) -> None:
        """A job forgotten by the worker: its samples and GPU go too."""
        self._job.pop((host, job), None)
        self._job_gpu.pop((host, job), None)

    def gpu_name(self, host: str, job: str) -> str | None:
        """The NVML name of the job's GPU: one NVML saw its processes on, else the host's
        when all its GPUs are one model."""
        name = self._job_gpu.get((host, job))
        if name is None:
            names = set(self._names.get(host, {}).values())
            name = names.pop() if len(names) == 1 else None
        return name


def gpu_price(settings: StreamSettings, gpu: GpuUtilization) -> Callable[[str, str], float | None]:
    """(host, job) → USD per GPU-hour of the job's GPU: NVML's name for it, else the
    configured model; None without a price book or a priced model."""
    prices = settings.prices

    def price(host: str, job: str) -> float | None:
        if prices is None:
            return None
        name = gpu.gpu_name(host, job) or settings.gpu_model
        usd = None if name is None else prices.per_hour(name)
        # Costs are GPU-seconds times this: one that is not a finite price would make every
        # cost point of the job one InfluxDB cannot take.
        return usd if usd is not None and 0 <= usd <= MAX_USD_PER_GPU_HOUR else None

    return price


#: Pids remembered as never identified (not waited for again), at most; beyond, forgotten
#: all at once (each is then waited for once more).
UNKNOWN_PIDS_KEPT: Final = 100_000


def _fetch_state(consumer: Any, tp: Any) -> str:
    """What Faust's consumer and aiokafka's fetcher say of partition `tp` (for the log)."""
    said = [f"paused by Faust: {tp in getattr(consumer, '_paused_partitions', ())}",
            f"flow active: {getattr(consumer, 'flow_active', '?')}"]
    try:
        fetcher = consumer._thread._ensure_consumer()._fetcher
        state = fetcher._subscriptions.subscription.assignment.state_value(tp)
        said += [f"fetch position: {state.position if state.has_valid_position else None}",
                 f"paused by aiokafka: {state.paused}"]
    except (AttributeError, AssertionError):  # another Faust or aiokafka
        pass
    return ", ".join(said)


def _remember(unknown: set[tuple[str, int]], more: Iterable[tuple[str, int]]) -> None:
    unknown.update(more)
    if len(unknown) > UNKNOWN_PIDS_KEPT:
        unknown.clear()


def _keep(samples: list[tuple[int, float]], sample: tuple[int, float]) -> None:
    samples.append(sample)
    if len(samples) > GPU_SAMPLES_KEPT:
        del samples[: len(samples) - GPU_SAMPLES_KEPT]


class Worker:
    """The stream app's logic around one Faust app (built by `build_app`)."""

    def __init__(self, settings: StreamSettings, app: Any, table: Any) -> None:
        self.settings = settings
        self.topics = wire.Topics.with_prefix(settings.topic_prefix)
        self.app = app
        self.table = table
        self.stats = WorkerStats()
        self.directory = Directory()
        self.gpu = GpuUtilization()
        self.price = gpu_price(settings, self.gpu)
        self.sink = InfluxSink(settings.influx, on_written=self._written)
        #: What ended the sink's writer, if a defect did (the worker then stops).
        self.sink_failure: BaseException | None = None
        self._states: dict[bytes, JobState] = {}
        self._by_partition: dict[int, set[bytes]] = defaultdict(set)
        self._indexed: set[int] = set()
        self._inflight: set[Token] = set()
        self._acked: dict[bytes, list[Token]] = defaultdict(list)
        #: Each host's time (streams/clock.py).
        self._clocks: dict[str, HostClock] = {}
        #: The table's values, of any size (streams/stored.py).
        self.store = Store(table)
        self._fallback_jobs: dict[tuple[str, int, int], str] = {}
        #: (host, pid) with drops and no identity after a wait: not waited for again.
        self._lossy_unknown: set[tuple[str, int]] = set()
        #: (host, pid) NVML named and no identity came for after a wait: not waited for again.
        self._gpu_unknown: set[tuple[str, int]] = set()
        #: Messages waiting for a process identity (also in the table).
        self._parking = ParkingLot()
        #: (topic, partition) → offset of the last message taken.
        self._positions: dict[tuple[str, int], int] = {}
        self._stalls = StallWatch(settings.stall_s)
        #: Partitions read again after a gap: (the offset awaited, since when (monotonic),
        #: the lowest offset past it left meanwhile, when it was last sought).
        self._awaiting: dict[tuple[str, int], tuple[int, float, int, float]] = {}
        self._watched = {self.topics.events, self.topics.nvml, self.topics.metrics}
        #: Where each partition's log began, for those the group never committed (read once
        #: per assignment: where the worker's reading of it starts).
        self._log_starts: dict[Any, int] = {}
        self._last_uncounted_ns = 0

    # -- the agent -----------------------------------------------------------------------------

    async def handle(self, message: Any) -> None:
        self.stats.messages += 1
        topic = message.topic
        where = (topic, message.partition)
        if topic in self._watched and not await self._in_order(where, message.offset):
            return  # it comes again, after the messages before it
        self._positions[where] = message.offset
        try:
            if topic == self.topics.events:
                await self._events(message)
            elif topic == self.settings.ticks_topic:
                await self._tick(message.partition)
            elif topic == self.topics.nvml:
                await self._nvml(message)
            elif topic == self.topics.metrics:
                await self._metrics(message)
        except (wire.WireError, KeyError, TypeError, ValueError) as exc:
            if topic == self.settings.ticks_topic:  # the worker's own beat: no bad input
                self.stats.tick_errors += 1
                log.exception("a tick of partition %d failed", message.partition)
                return
            await self._dead_letter(message, reason="malformed", detail=str(exc))

    async def _metrics(self, message: Any) -> None:
        """Pipeline counters now; the drops by pid once each pid's job is known (metrics name
        pids only: the latest process of each), parked while one is not, once per pid."""
        metrics = wire.decode_metrics(message.value)
        await self.sink.put(Batch([pipeline_point(metrics)]))
        self._index_partition(message.partition)
        if self._parking.contains(message.topic, message.partition, message.offset):
            return  # redelivered after a restart: its parked copy is resolved on the tick
        if self._unknown_lossy_pids(metrics):
            self._park(message, METRICS, (metrics.host, 0, 0), 0)
            return
        await self._lost(metrics)

    def _unknown_lossy_pids(self, record: wire.MetricsRecord) -> set[int]:
        return self._unidentified(record.host, (*record.dropped_kernel_by_pid,
                                                *record.dropped_user_by_pid,
                                                *record.dropped_agent_died_by_pid),
                                  self._lossy_unknown)

    def _unidentified(self, host: str, pids: Iterable[int],
                      given_up: set[tuple[str, int]]) -> set[int]:
        """Of `pids`, those with no job yet, but for those already waited for (`given_up`)."""
        return {p for p in pids
                if self.directory.latest_job(host, p) is None and (host, p) not in given_up}

    async def _lost(self, record: wire.MetricsRecord) -> None:
        host = record.host
        lost = lost_points(record, lambda pid: (self.directory.latest_job(host, pid)
                                                or UNKNOWN_JOB_FORMAT.format(pid=pid)))
        if lost:
            await self.sink.put(Batch(lost))

    async def _nvml(self, message: Any) -> None:
        """GPU samples now; parked while a process NVML names has no identity yet (its
        per-process figures would go to no job: a short job's every sample, often), once per
        pid: one that had none after the wait is not waited for again."""
        record = wire.decode_nvml(message.value)
        self._index_partition(message.partition)
        if self._parking.contains(message.topic, message.partition, message.offset):
            return  # redelivered after a restart: its parked copy is resolved on the tick
        if self._unknown_gpu_pids(record):
            self._park(message, NVML, (record.host, 0, 0), 0)
            return
        await self._gpu_samples(record)

    def _unknown_gpu_pids(self, record: wire.NvmlRecord) -> set[int]:
        return self._unidentified(
            record.host, (proc.pid for gpu in record.gpus for proc in gpu.processes or ()),
            self._gpu_unknown)

    async def _gpu_samples(self, record: wire.NvmlRecord) -> None:
        self.gpu.add(record, self.directory)
        await self.sink.put(Batch(gpu_points(record, self._nvml_job(record))))

    def _nvml_job(self, record: wire.NvmlRecord) -> Callable[[int], str | None]:
        return lambda pid: self.directory.latest_job(record.host, pid)

    async def _events(self, message: Any) -> None:
        batch = wire.decode_events(message.value)
        self._index_partition(message.partition)
        if self._parking.contains(message.topic, message.partition, message.offset):
            self.stats.duplicates += 1  # redelivered after a restart: its copy waits
            return
        process = (batch.host, batch.pid, batch.start_time)
        if self._parking.holds(batch.host):
            await self._resolve_host(batch.host)  # the host's parked batches first, in order
        job = self._job_of(process)
        if job is None or self._parking.holds(batch.host):
            min_ts = int(batch.events["ts_ns"].min()) if len(batch.events) else batch.first_ts_ns
            self._park(message, EVENTS, process, min_ts)
            return
        await self._apply(message, batch, job)

    def _job_of(self, process: tuple[str, int, int]) -> str | None:
        return self.directory.job(*process) or self._fallback_jobs.get(process)

    async def _apply(self, message: Any, batch: wire.EventBatch, job: str) -> None:
        key = state_key(batch.host, job)
        state = self._load(key, batch.host, job, message.partition)
        namespace = self.directory.namespace(batch.host, batch.pid, batch.start_time)
        if namespace and state.labels.namespace != namespace:
            state.labels = replace(state.labels, namespace=namespace)
        team = self.directory.team(batch.host, batch.pid, batch.start_time)
        if team and state.labels.team != team:
            state.labels = replace(state.labels, team=team)
        names = {handle: name.short[:MAX_KERNEL_CHARS] for handle, name in batch.kernels.items()}
        now = time.time_ns()
        # An event or a request stamped too far ahead of the wall clock (a forged message, a
        # broken clock) would move its host's time, and every real event after it would be
        # late: it is not counted, and never reaches the state (nor, through it, the changelog).
        limit = now + round(self.settings.max_future_s * 1e9)
        ahead = batch.events["ts_ns"] > limit
        future = batch.events[ahead] if ahead.any() else None
        events = batch.events[~ahead] if future is not None else batch.events
        requests = [r for r in batch.requests if r.end_ns <= limit]
        future_requests = len(batch.requests) - len(requests)
        # Aggregates (events the kernel counted, not recorded) stamped ahead: counted as future
        # events, in the events_uncounted point (they have no dead letter of their own).
        soon = batch.aggregates["ts_ns"] <= limit
        aggregates = batch.aggregates[soon]
        future_aggregated = int(batch.aggregates["count"][~soon].sum())
        # Code paths stamped ahead: left out (their calls' events are refused the same way).
        paths = tuple(p for p in batch.paths if p.ts_ns <= limit)
        applied = state.apply(events, message.partition, message.offset,
                              self.settings.windows, names, requests=requests,
                              unattributed=batch.unattributed, aggregates=aggregates,
                              paths=paths)
        clock = self._clock(batch.host)
        if applied.duplicate:
            self.stats.duplicates += 1
            clock.heard(None, now)
            return
        clock.heard(applied.time_ns, now)
        self.stats.events += applied.events
        self.stats.requests += len(requests) - applied.late_requests
        self.stats.late_requests += applied.late_requests
        self.stats.paths += len(paths) - applied.late_paths
        self.stats.late_paths += applied.late_paths + len(batch.paths) - len(paths)
        self.stats.future_requests += future_requests
        if applied.late_requests:
            log.warning("%d requests of %s on %s ended in windows already closed (or beyond"
                        " the windows a job holds): not counted", applied.late_requests, job,
                        batch.host)
        self._save(key, state)
        if future_requests:
            log.warning("%d requests of %s on %s end more than %g s ahead of the worker's"
                        " clock: not counted (dead letter, reason future)", future_requests,
                        job, batch.host, self.settings.max_future_s)
            await self._dead_letter(
                message, reason="future", detail=f"{future_requests} requests ending more than"
                f" {self.settings.max_future_s:g} s ahead of the worker's clock",
                value=wire.encode_events(replace(
                    batch, events=batch.events[:0], kernels={}, attribution=None,
                    unattributed={}, paths=(),
                    requests=tuple(r for r in batch.requests if r.end_ns > limit))))
        late, refused = applied.late, applied.refused
        if (late is None and future is None and refused is None and not applied.late_aggregated
                and not future_aggregated):
            return
        n_late = sum(0 if x is None else len(x) for x in (late, refused))
        n_late += applied.late_aggregated
        n_future = (0 if future is None else len(future)) + future_aggregated
        self.stats.late_events += n_late
        self.stats.future_events += n_future
        await self.sink.put(Batch([Point(
            m.EVENTS_UNCOUNTED.name, {Tags.HOST: batch.host, Tags.JOB: job},
            {Fields.LATE_EVENTS: n_late, Fields.FUTURE_EVENTS: n_future},
            self._uncounted_time(now))]))
        if late is not None:
            await self._dead_letter_events(message, batch, late, reason="late",
                                           detail=f"{len(late)} events of closed windows")
        if refused is not None:
            settings = self.settings.windows
            log.warning("%d events of %s on %s are beyond the windows a message (%d) or a job"
                        " (%d) takes: not counted (dead letter, reason windows)", len(refused),
                        job, batch.host, settings.max_windows_per_message,
                        settings.open_windows_limit)
            await self._dead_letter_events(
                message, batch, refused, reason="windows",
                detail=f"{len(refused)} events beyond the windows a message"
                       f" ({settings.max_windows_per_message}) or a job"
                       f" ({settings.open_windows_limit}) takes")
        if future is not None:
            await self._dead_letter_events(
                message, batch, future, reason="future",
                detail=f"{n_future} events more than {self.settings.max_future_s:g} s ahead of"
                       " the worker's clock")

    def _uncounted_time(self, now: int) -> int:
        """A time for an events_uncounted point: the wall clock, made unique per worker (two
        points of a job at one time would be one in InfluxDB)."""
        self._last_uncounted_ns = max(now, self._last_uncounted_ns + 1)
        return self._last_uncounted_ns

    # -- parked messages -----------------------------------------------------------------------

    def _park(self, message: Any, kind: str, process: tuple[str, int, int],
              min_ts_ns: int) -> None:
        host, pid, start_time = process
        parked = Parked(kind, host, pid, start_time, message.topic, message.partition,
                        message.offset, message.key, bytes(message.value), min_ts_ns,
                        time.monotonic_ns())
        self.store.put(parked.table_key, parked.to_bytes(), parked.partition)
        self._parking.add(parked)
        if kind == EVENTS:  # waiting, not silent
            self._clock(host).heard(None, time.time_ns())
        log.debug("parked %s of %s pid %d: no identity yet", kind, host, pid)

    async def _unpark(self, parked: Parked, job: str | None = None) -> None:
        """Apply a parked message (to `job`, for events), then delete its parked copy: a
        crash in between applies nothing twice (the job state's offset check: the host's
        batches are applied in order)."""
        message = _Message(parked.topic, parked.partition, parked.offset, parked.key,
                           parked.value)
        if parked.kind == EVENTS:
            assert job is not None
            await self._apply(message, wire.decode_events(parked.value), job)
        elif parked.kind == NVML:
            gpus = wire.decode_nvml(parked.value)
            _remember(self._gpu_unknown,
                      ((gpus.host, p) for p in self._unknown_gpu_pids(gpus)))
            await self._gpu_samples(gpus)
        else:
            record = wire.decode_metrics(parked.value)
            unknown = self._unknown_lossy_pids(record)
            _remember(self._lossy_unknown, ((record.host, p) for p in unknown))
            await self._lost(record)
        self.store.delete(parked.table_key)
        self._parking.remove(parked)

    async def _resolve_parked(self, partition: int) -> None:
        """Parked messages whose identities arrived, or whose wait is over."""
        wait_ns = round(self.settings.identity_wait_s * 1e9)
        for host in sorted({p.host for p in self._parking.of_partition(partition)
                            if p.kind == EVENTS}):
            await self._resolve_host(host)
        for parked in self._parking.of_partition(partition):
            if parked.kind == EVENTS:
                continue
            waited = time.monotonic_ns() - parked.since_ns >= wait_ns
            if waited or not self._still_unknown(parked):
                await self._unpark(parked)

    def _still_unknown(self, parked: Parked) -> set[int]:
        """The pids a parked metrics or NVML record still waits for."""
        if parked.kind == NVML:
            return self._unknown_gpu_pids(wire.decode_nvml(parked.value))
        return self._unknown_lossy_pids(wire.decode_metrics(parked.value))

    async def _resolve_host(self, host: str) -> None:
        """The host's parked batches, in order, up to the first whose identity is still
        awaited; one that waited `identity_wait_s` goes to the unknown-job fallback."""
        wait_ns = round(self.settings.identity_wait_s * 1e9)
        for parked in self._parking.of_host(host):
            process = parked.process
            job = self._job_of(process)
            if job is None and time.monotonic_ns() - parked.since_ns >= wait_ns:
                job = self._fallback_jobs[process] = UNKNOWN_JOB_FORMAT.format(pid=parked.pid)
                self.stats.unknown_identities += 1
                log.warning("no identity for %s pid %d after %.0f s; its job is %s",
                            parked.host, parked.pid, self.settings.identity_wait_s, job)
            if job is None:
                return
            await self._unpark(parked, job)

    async def _tick(self, partition: int) -> None:
        keys = self._keys_of(partition)
        await self._resolve_parked(partition)
        keys |= self._by_partition.get(partition, set())
        now = time.time_ns()
        for key in sorted(keys):
            state = self._states.get(key)
            if state is None:
                continue
            try:
                await self._tick_state(key, state, now)
            except (ArithmeticError, LookupError, TypeError, ValueError):
                # One job's fault (a bug, a value no check foresaw) stops neither the tick nor
                # the partition's other jobs; the job is tried again on the next tick.
                self.stats.tick_errors += 1
                log.exception("job %s on %s: its windows could not be written this tick",
                              state.job, state.host)

    async def _tick_state(self, key: bytes, state: JobState, now: int) -> None:
        changed = False
        for token in self._acked.pop(key, ()):
            changed |= state.acknowledge(token[1], token[2], token[3])
        host_now = self._host_now(state, now)
        writes, closed = state.due(host_now, self.settings.windows, self.gpu.mean, self.price)
        changed |= bool(closed.memory_bound)
        for write in writes:
            token = (key, write.window_start_ns, write.version, write.final)
            if token not in self._inflight:
                self._inflight.add(token)
                await self.sink.put(Batch(write.points, token))
        for anomaly in closed.anomalies:
            await self._alert(state.host, "bandwidth_anomaly", asdict(anomaly))
        for verdict in closed.memory_bound:
            if verdict.fired:
                await self._alert(state.host, "memory_bound", {
                    **asdict(verdict), "evidence": asdict(verdict.evidence)})
        idle_ns = now - self._clock(state.host).heard_ns
        if state.idle and (idle_ns > self.settings.forget_idle_s * 1e9
                           or self._ended(state, host_now)):
            self._forget(key, state)
        elif changed:
            self._save(key, state)

    def _ended(self, state: JobState, host_now: int) -> bool:
        """Whether the state is of a job that was one process, which exited long enough ago
        (in its host's time) for its last events to be in (settings.forget_ended_after_s)."""
        exited = self.directory.ended(state.host, state.job)
        return exited is not None and host_now >= exited + round(
            self.settings.forget_ended_after_s * 1e9)

    def _clock(self, host: str) -> HostClock:
        clock = self._clocks.get(host)
        if clock is None:
            clock = self._clocks[host] = HostClock(heard_ns=time.time_ns())
        return clock

    def _host_now(self, state: JobState, now: int) -> int:
        """The state's host's time (streams/clock.py), no further ahead of the wall clock than
        events may be (a state recovered from a changelog written before they were refused may
        hold such a time)."""
        clock = self._clock(state.host)
        ahead = now + round(self.settings.max_future_s * 1e9)
        if self._parking.holds(state.host):
            # Its batches wait for an identity: the host is not silent, and its windows from
            # the earliest waiting event on stay open.
            clock.heard(None, now)
            attested = min(clock.attested_ns or 0, ahead)
            held = self._parking.hold_ns(state.host)
            return attested if held is None else min(attested, held)
        return min(clock.now(now, round(self.settings.host_idle_s * 1e9)), ahead)

    def _written(self, token: Token) -> None:
        self._inflight.discard(token)
        self._acked[token[0]].append(token)

    # -- the table -----------------------------------------------------------------------------

    def _load(self, key: bytes, host: str, job: str, partition: int) -> JobState:
        state = self._states.get(key)
        if state is None:
            value = self.store.get(key)
            if value is None:
                state = JobState(host, job, partition)
                self._index(key, state)
            else:
                state = JobState.from_bytes(value, self.settings.windows)
                self._recovered(key, state)
        return state

    def _save(self, key: bytes, state: JobState) -> None:
        self.store.put(key, state.to_bytes(), state.partition)
        self._index(key, state)

    def _forget(self, key: bytes, state: JobState) -> None:
        self.store.delete(key)
        self._states.pop(key, None)
        self._acked.pop(key, None)
        self._by_partition[state.partition].discard(key)
        self.directory.forget_job(state.host, state.job)
        self.gpu.forget(state.host, state.job)
        if self._fallback_jobs:  # the processes that waited in vain for an identity
            for process in [p for p, job in self._fallback_jobs.items()
                            if job == state.job and p[0] == state.host]:
                del self._fallback_jobs[process]

    def _index(self, key: bytes, state: JobState) -> None:
        self._states[key] = state
        self._by_partition[state.partition].add(key)

    def _recovered(self, key: bytes, state: JobState) -> None:
        """A state read from the table (the changelog): its host's clock gets its times."""
        self._index(key, state)
        self._clock(state.host).merge(state.latest_ns)

    def _keys_of(self, partition: int) -> set[bytes]:
        self._index_partition(partition)
        return set(self._by_partition.get(partition, ()))

    def _index_partition(self, partition: int) -> None:
        if partition not in self._indexed:
            # First message since this partition was assigned: its states (and parked
            # messages) came from the changelog (recovery), not through this worker's agent.
            since = time.monotonic_ns()
            for key, value in self.store.items():
                if is_parked_key(key):
                    self._index_parked(key, value, partition, since)
                    continue
                if key in self._states:
                    continue
                try:
                    state = JobState.from_bytes(value, self.settings.windows)
                except ValueError as exc:
                    log.error("dropping unreadable job state %r: %s", key, exc)
                    continue
                if state.partition == partition:
                    self._recovered(key, state)
            self.store.sweep(partition)
            self._indexed.add(partition)

    def _index_parked(self, key: bytes, value: bytes, partition: int, since: int) -> None:
        try:
            parked = Parked.from_bytes(value, since)
        except ValueError as exc:
            log.error("dropping unreadable parked message %r: %s", key, exc)
            return
        if parked.partition == partition and not self._parking.contains(
                parked.topic, partition, parked.offset):
            self._parking.add(parked)

    def forget_partitions(self) -> None:
        """After a rebalance: states may have moved; read them again from the table (and
        their hosts' clocks with them)."""
        self._parking.clear()
        self._states.clear()
        self._clocks.clear()
        self._positions.clear()
        self._awaiting.clear()
        self._stalls.forget()
        self._log_starts.clear()
        self._by_partition.clear()
        self._indexed.clear()
        self._inflight.clear()
        self._acked.clear()

    # -- out -----------------------------------------------------------------------------------

    async def _dead_letter(self, message: Any, *, reason: str, detail: str,
                           value: bytes | None = None) -> None:
        """`value` (else the message's own) to the dead-letter topic; one over
        DEAD_LETTER_MAX_BYTES in parts (headers part and parts), so the broker takes it."""
        self.stats.dead_letters += 1
        by_reason = self.stats.dead_letters_by_reason
        by_reason[reason] = by_reason.get(reason, 0) + 1
        log.warning("dead letter (%s) from %s[%d]@%d: %s", reason, message.topic,
                    message.partition, message.offset, detail[:200])
        value = message.value if value is None else value
        headers = [("reason", reason.encode()), ("detail", detail[:1000].encode()),
                   ("topic", message.topic.encode()),
                   ("partition", str(message.partition).encode()),
                   ("offset", str(message.offset).encode())]
        size = DEAD_LETTER_MAX_BYTES
        parts = max(1, -(-len(value or b"") // size))
        for part in range(parts):
            await self.app.send(
                self.settings.dead_letter_topic, key=message.key,
                value=value[part * size:(part + 1) * size] if parts > 1 else value,
                headers=headers if parts == 1 else [
                    *headers, ("part", str(part).encode()), ("parts", str(parts).encode())],
            )

    async def _dead_letter_events(self, message: Any, batch: wire.EventBatch,
                                  events: npt.NDArray[np.void], *, reason: str,
                                  detail: str) -> None:
        """Events to the dead-letter topic in the wire format, as many messages as it takes to
        keep each under DEAD_LETTER_MAX_BYTES (each with the names of its own kernels)."""
        for value in encode_events_under(batch, events, DEAD_LETTER_MAX_BYTES):
            await self._dead_letter(message, reason=reason, detail=detail, value=value)

    async def _alert(self, host: str, kind: str, body: dict[str, Any]) -> None:
        self.stats.alerts += 1
        await self.app.send(self.settings.alerts_topic, key=host.encode(),
                            value=orjson.dumps({"schema": "gpuflight.alert", "v": 1,
                                                **body, "alert": kind}))

    async def send_ticks(self, partitions: int) -> None:
        for partition in range(partitions):
            await self.app.send(self.settings.ticks_topic, key=b"tick", value=b"",
                                partition=partition)

    async def _in_order(self, where: tuple[str, int], offset: int) -> bool:
        """Whether the message at `offset` of partition `where` is to be taken now. Offsets
        of the watched topics have no gaps (no transactions, no compaction): a message past
        one never taken means messages were lost between the broker and the agent. The
        partition is then read again from the first one missing, and what comes meanwhile
        past it is left (it comes again); if that one never comes (gone: retention) within
        stall_s, the partition goes on from the first message that did, and the loss is
        said and counted."""
        awaited = self._awaiting.get(where)
        if awaited is not None:
            start, since, lowest, sought = awaited
            if offset <= start:  # the read again began (or a seek went further back)
                del self._awaiting[where]
                return True
            if time.monotonic() - since < self.settings.stall_s:
                self._awaiting[where] = (start, since, min(lowest, offset), sought)
                return False
            del self._awaiting[where]
            lowest = min(lowest, offset)
            self.stats.skipped_messages += lowest - start
            log.warning("partition %d of %s: offsets %d-%d are gone (not in the log any more):"
                        " not counted; going on from offset %d", where[1], where[0], start,
                        lowest - 1, lowest)
            self._positions[where] = lowest - 1
            return not await self._seek(where, lowest)
        last = self._positions.get(where)
        if last is None or offset <= last + 1:
            return True
        log.warning("partition %d of %s: offsets %d-%d never reached the worker; reading it"
                    " again from offset %d", where[1], where[0], last + 1, offset - 1, last + 1)
        self.stats.rereads += 1
        now = time.monotonic()
        self._awaiting[where] = (last + 1, now, offset, now)
        if await self._seek(where, last + 1):
            return False
        del self._awaiting[where]  # could not: the loss is counted, and the stream goes on
        self.stats.skipped_messages += offset - last - 1
        return True

    async def _seek(self, where: tuple[str, int], offset: int) -> bool:
        """Read partition `where` again from `offset` (on the consumer's own thread, as
        Faust's recovery seeks); False where it could not be."""
        from aiokafka.errors import KafkaError

        consumer = getattr(self.app, "consumer", None)
        if consumer is None:
            return False  # none yet
        tp = next((tp for tp in consumer.assignment()
                   if (tp.topic, tp.partition) == where), None)
        if tp is None:
            return False  # revoked meanwhile: its new owner reads it
        try:
            await consumer.seek_wait({tp: offset})
        except (KafkaError, TimeoutError) as exc:
            log.warning("partition %d of %s could not be read again from offset %d: %s: %s",
                        where[1], where[0], offset, type(exc).__name__, exc)
            return False
        return True

    async def check_partitions(self) -> None:
        """Partitions of this worker whose messages wait untaken while it takes others
        (streams/stalls.py) are read again from their first message not taken."""
        consumer = getattr(self.app, "consumer", None)
        if consumer is None or getattr(self.app, "rebalancing", False):
            return
        now = time.monotonic()
        for where, (start, began, lowest, sought) in list(self._awaiting.items()):
            if now - sought >= RESEEK_S:  # its seek undone (RESEEK_S): sought again
                self._awaiting[where] = (start, began, lowest, now)
                log.debug("partition %d of %s: offset %d not come yet; sought again",
                          where[1], where[0], start)
                await self._seek(where, start)
        committed = getattr(consumer, "_committed_offset", {})
        assigned = [tp for tp in consumer.assignment() if tp.topic in self._watched]
        starts = await self._starts_of(consumer, [
            tp for tp in assigned
            if (tp.topic, tp.partition) not in self._positions and committed.get(tp) is None])
        for tp in assigned:
            last = self._positions.get((tp.topic, tp.partition))
            since = committed.get(tp)
            next_offset = (last + 1 if last is not None else
                           since if since is not None else starts.get(tp))
            highwater = consumer.highwater(tp)
            if next_offset is None or highwater is None:
                continue
            stall = self._stalls.check(tp, next_offset, highwater, self.stats.messages, now)
            if stall is None:
                continue
            self.stats.rereads += 1
            log.warning("partition %d of %s: %d messages waited %.0f s untaken (%s); reading it"
                        " again from offset %d", tp.partition, tp.topic,
                        stall.highwater - stall.next_offset, stall.waited_s,
                        _fetch_state(consumer, tp), next_offset)
            await self._seek((tp.topic, tp.partition), next_offset)  # else again in stall_s

    async def _starts_of(self, consumer: Any, tps: list[Any]) -> dict[Any, int]:
        """Where the logs of partitions `tps` begin: the worker's first message of a partition
        the group never committed (Faust's seek after an assignment leaves such a partition
        alone, so what its fetcher took and dropped before the partition was active never
        comes again: the stall watch must know where it starts). Nothing when the worker
        starts at the end of the logs (settings.from_beginning off)."""
        from aiokafka.errors import KafkaError

        if not self.settings.from_beginning:
            return {}
        unknown = [tp for tp in tps if tp not in self._log_starts]
        if unknown:
            try:
                found = await consumer.earliest_offsets(*unknown)
            except (KafkaError, TimeoutError) as exc:
                log.debug("where %d partitions begin is not known yet: %s", len(unknown), exc)
                found = {}
            self._log_starts.update({tp: int(o) for tp, o in found.items() if o is not None})
        return {tp: self._log_starts[tp] for tp in tps if tp in self._log_starts}

    def lag_by_partition(self) -> dict[int, int]:
        """Messages of the events topic not taken yet, per partition this worker holds."""
        lags: dict[int, int] = {}
        consumer = getattr(self.app, "consumer", None)
        if consumer is None:
            return lags
        for tp in consumer.assignment():
            if tp.topic != self.topics.events:
                continue
            highwater = consumer.highwater(tp)
            position = self._positions.get((tp.topic, tp.partition))
            if highwater is not None:
                lags[tp.partition] = max(
                    int(highwater) - (-1 if position is None else position) - 1, 0)
        return lags

    def jobs(self) -> int:
        """Jobs this worker holds state for."""
        return len(self._states)

    def windows_open(self) -> int:
        """Windows of this worker's jobs not closed yet."""
        return sum(len(state.windows) for state in self._states.values())

    def parked_messages(self) -> int:
        return len(self._parking)

    def metrics_point(self) -> Point:
        lag = sum(self.lag_by_partition().values())
        s, sink = self.stats, self.sink.stats
        return Point(m.STREAMS.name, {Tags.WORKER: self.settings.worker}, {
            Fields.MESSAGES: s.messages,
            Fields.EVENTS: s.events,
            Fields.DUPLICATES: s.duplicates,
            Fields.LATE_EVENTS: s.late_events,
            Fields.FUTURE_EVENTS: s.future_events,
            Fields.DEAD_LETTERS: s.dead_letters,
            Fields.ALERTS: s.alerts,
            Fields.POINTS_WRITTEN: sink.written_points,
            Fields.POINTS_REJECTED: sink.rejected_points,
            Fields.WRITE_RETRIES: sink.retries,
            Fields.PENDING_POINTS: sink.pending_points,
            Fields.LAG_MESSAGES: lag,
            Fields.JOBS: len(self._states),
            Fields.REQUESTS: s.requests,
            Fields.LATE_REQUESTS: s.late_requests,
        }, time.time_ns())


def encode_events_under(batch: wire.EventBatch, events: npt.NDArray[np.void],
                        max_bytes: int) -> list[bytes]:
    """`events` (of `batch`'s process) as events messages of at most `max_bytes` each (one
    event per message at the least), in order."""
    out: list[bytes] = []
    pending = [events]
    while pending:
        part = pending.pop()
        handles = set(part["handle"].tolist()) if batch.kernels else set()
        kernels = {h: n for h, n in batch.kernels.items() if h in handles}
        value = wire.encode_events(
            wire.EventBatch(batch.host, batch.pid, batch.start_time, part, kernels))
        if len(value) <= max_bytes or len(part) == 1:
            out.append(value)
            continue
        # Split where the size says, then again if a half is still too large.
        pieces = min(len(part), -(-len(value) // max_bytes) + 1)
        pending.extend(reversed(np.array_split(part, pieces)))
    return out
