"""The stream app's state for one (host, job): its open windows, what InfluxDB has of them,
and what carries over from window to window. Pure: no Faust, no I/O.

One `JobState` is one value of the worker's Faust table, so every change to a job is one
changelog record — a crash leaves a job either before or after a message, never between:

- `apply(batch, partition, offset)` adds a message's events to their windows, once: a message
  whose offset is not beyond the last one applied from its partition (a redelivery after a
  restart) changes nothing, so a worker killed mid-stream and restarted neither loses nor
  double counts. Events of windows already closed are returned (late beyond grace), and so
  are those beyond what one state holds (`refused`): a message adds to at most
  `max_windows_per_message` windows (those it has the most events in; a real one spans a
  flush interval, and the calls that took long before it), and a job has at most
  `open_windows_limit` windows open, so one message cannot make a state of any size.
- `due(host_now_ns)` says what to write: a window is written as soon as its end has passed
  (a provisional point; written again whenever late events change it) and closed at end +
  grace: then the memory ledger, the bandwidth detector and the memory-bound tracker see it,
  in window order, and its final points wait in `pending` until InfluxDB has acknowledged
  them (`acknowledge`), so a crash between closing and writing loses nothing either.

Points are stamped at the window start and carry whole-window values, so writing a window
again overwrites it in InfluxDB instead of adding to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from gpuflight.producer.contract.wire import PathRecord, RequestRecord
from gpuflight.streams import aggregate as agg_math
from gpuflight.streams import measurements as m
from gpuflight.streams import paths as path_math
from gpuflight.streams import requests as req_math
from gpuflight.streams.aggregate import MemoryLedger, WindowAggregate
from gpuflight.streams.clock import keep_latest
from gpuflight.streams.detect import (
    BandwidthAnomaly,
    BandwidthDetector,
    DetectSettings,
    MemoryBoundResult,
    MemoryBoundTracker,
    check_memory_bound,
)
from gpuflight.streams.measurements import Point
from gpuflight.streams.paths import PathWindow
from gpuflight.streams.requests import Labels, RequestWindow

STATE_VERSION: Final = 1
DEFAULT_MAX_WINDOWS_PER_MESSAGE: Final = 64
DEFAULT_MAX_OPEN_WINDOWS: Final = 256

Events = npt.NDArray[np.void]
#: (host, job, window start ns, window end ns) → the job's mean GPU utilisation, if known.
GpuUtilization = Callable[[str, str, int, int], float | None]
#: (host, job) → the price of the job's GPU, USD per GPU-hour (None: not in the price book).
GpuPrice = Callable[[str, str], float | None]


@dataclass(frozen=True)
class WindowSettings:
    window_s: float = m.DEFAULT_WINDOW_S
    #: How long after a window's end its events may still arrive and count.
    grace_s: float = 5.0
    top_kernels: int = agg_math.DEFAULT_TOP_KERNELS
    max_kernels: int = agg_math.DEFAULT_MAX_KERNELS
    detect: DetectSettings = field(default_factory=DetectSettings)
    #: The most windows one message adds events to (the rest of its events are refused).
    max_windows_per_message: int = DEFAULT_MAX_WINDOWS_PER_MESSAGE
    #: The most windows a job holds open, at the least (see `open_windows_limit`).
    max_open_windows: int = DEFAULT_MAX_OPEN_WINDOWS

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.grace_s < 0:
            raise ValueError(
                f"window must be > 0 and grace ≥ 0 seconds, not {self.window_s}, {self.grace_s}"
            )
        if self.max_windows_per_message < 1 or self.max_open_windows < 1:
            raise ValueError("a message and a job take at least one window each")

    @property
    def open_windows_limit(self) -> int:
        """Windows a job may hold open: max_open_windows, or more where the grace alone keeps
        more open (a long --grace with short windows)."""
        return max(self.max_open_windows,
                   math.ceil(self.grace_s / self.window_s) + 2 * self.max_windows_per_message)

    @property
    def window_ns(self) -> int:
        return round(self.window_s * 1e9)

    @property
    def grace_ns(self) -> int:
        return round(self.grace_s * 1e9)


@dataclass
class Window:
    agg: WindowAggregate
    #: Bumped by every change; `written` is the version InfluxDB has acknowledged.
    version: int = 1
    written: int = 0
    #: The requests that ended in the window, and its GPU time of no request.
    requests: RequestWindow = field(default_factory=RequestWindow)
    #: What the code paths of its sampled calls cost.
    paths: PathWindow = field(default_factory=PathWindow)


@dataclass(frozen=True)
class Write:
    """Points to write for one window of a job, and how to acknowledge them."""

    window_start_ns: int
    version: int
    final: bool
    points: list[Point]


@dataclass
class Closed:
    """What closing windows found, besides their points."""

    anomalies: list[BandwidthAnomaly] = field(default_factory=list)
    memory_bound: list[MemoryBoundResult] = field(default_factory=list)


@dataclass
class Applied:
    events: int
    #: Events of windows closed before the message came (late beyond grace).
    late: Events | None = None
    duplicate: bool = False
    #: Requests of windows closed before the message came (late beyond grace), or beyond the
    #: windows the state holds: not counted.
    late_requests: int = 0
    #: Code paths likewise.
    late_paths: int = 0
    #: Events beyond the windows a message or a job may take (see the module's docstring).
    refused: Events | None = None
    #: When the message was on its host: its latest event or request end (None: neither).
    time_ns: int | None = None
    #: Events of its aggregates (counted in the kernel) that no open window took: not counted.
    late_aggregated: int = 0


@dataclass
class JobState:
    host: str
    job: str
    #: The source partition the job's messages come from (its Faust table partition).
    partition: int
    #: partition → offset of the last message applied from it.
    offsets: dict[int, int] = field(default_factory=dict)
    windows: dict[int, Window] = field(default_factory=dict)
    #: Windows starting before this are closed: final, written or pending.
    closed_before_ns: int = 0
    #: window start → (version, final points) not yet acknowledged by InfluxDB.
    pending: dict[int, tuple[int, list[Point]]] = field(default_factory=dict)
    #: The latest event time seen (ns).
    max_ts_ns: int = 0
    #: The latest times of the job's messages, latest first: its part of its host's clock
    #: (streams/clock.py).
    latest_ns: list[int] = field(default_factory=list)
    ledger: MemoryLedger = field(default_factory=MemoryLedger)
    bandwidth: BandwidthDetector = field(default_factory=BandwidthDetector)
    tracker: MemoryBoundTracker = field(default_factory=MemoryBoundTracker)
    #: Who the job is, for cost (its processes' namespace and team).
    labels: Labels = field(default_factory=Labels)

    # -- events --------------------------------------------------------------------------------

    def apply(
        self,
        events: Events,
        partition: int,
        offset: int,
        settings: WindowSettings,
        kernel_names: Mapping[int, str] | None = None,
        *,
        requests: Sequence[RequestRecord] = (),
        unattributed: Mapping[str, float] | None = None,
        aggregates: Events | None = None,
        paths: Sequence[PathRecord] = (),
    ) -> Applied:
        """Add one message's events, its requests, its cost of no request and its aggregates
        (events the kernel counted instead of recording them; all of this job) to their
        windows, unless already done."""
        if offset <= self.offsets.get(partition, -1):
            return Applied(0, duplicate=True)
        self.offsets[partition] = offset
        late: list[Events] = []
        refused: list[Events] = []
        parts = agg_math.split_windows(events, settings.window_ns)
        kept: set[int] | None = None
        if len(parts) > settings.max_windows_per_message:
            # The windows it has the most events in (the latest of equals) take the message.
            ranked = sorted(parts, key=lambda sp: (-len(sp[1]), -sp[0]))
            kept = {start for start, _ in ranked[: settings.max_windows_per_message]}
        for start, part in parts:
            window = None if kept is not None and start not in kept else self._window(
                start, settings)
            if window is None:
                (late if start < self.closed_before_ns else refused).append(part)
                continue
            agg_math.add_events(window.agg, part, kernel_names)
        aggregated = late_aggregated = 0
        if aggregates is not None and len(aggregates):
            for start, part in agg_math.split_windows(aggregates, settings.window_ns):
                window = self._window(start, settings)
                if window is None:
                    late_aggregated += int(part["count"].sum())
                    continue
                agg_math.add_aggregates(window.agg, part, kernel_names)
                aggregated += int(part["count"].sum())

        # Its requests, too, add to at most max_windows_per_message windows (its events' first).
        touched = {start for start, _ in parts if kept is None or start in kept}

        def window_of(start: int) -> RequestWindow | None:
            if start not in touched:
                if len(touched) >= settings.max_windows_per_message:
                    return None
                touched.add(start)
            window = self._window(start, settings)
            return None if window is None else window.requests

        late_requests = req_math.add_requests(requests, settings.window_ns, window_of)

        def paths_of(start: int) -> PathWindow | None:
            return None if window_of(start) is None else self.windows[start].paths

        late_paths = path_math.add_paths(paths, settings.window_ns, paths_of)
        at_ns = (int(events["ts_ns"][0]) if len(events)
                 else min((r.end_ns for r in requests), default=None))
        if unattributed and at_ns is not None:
            req_math.add_unattributed(unattributed, at_ns, settings.window_ns, window_of)
        times = [int(events["ts_ns"].max())] if len(events) else []
        times += [r.end_ns for r in requests]
        if aggregates is not None and len(aggregates):
            times.append(int(aggregates["last_ts_ns"].max()))
        time_ns = max(times) if times else None
        if time_ns is not None:
            self.max_ts_ns = max(self.max_ts_ns, time_ns)
            self.latest_ns = keep_latest(self.latest_ns, time_ns)
        late_events = np.concatenate(late) if late else None
        refused_events = np.concatenate(refused) if refused else None
        applied = len(events) - sum(len(x) for x in (*late, *refused)) + aggregated
        return Applied(applied, late_events, late_requests=len(late_requests),
                       late_paths=late_paths,
                       refused=refused_events, time_ns=time_ns, late_aggregated=late_aggregated)

    def _window(self, start: int, settings: WindowSettings) -> Window | None:
        """The open window starting at `start`, made if new, its version bumped (it is about
        to change); None when it is closed, or new beyond `open_windows_limit`."""
        if start < self.closed_before_ns:
            return None
        window = self.windows.get(start)
        if window is None:
            if len(self.windows) >= settings.open_windows_limit:
                return None
            window = self.windows[start] = Window(
                WindowAggregate(start, self.host, self.job, settings.max_kernels)
            )
        else:
            window.version += 1
        return window

    # -- windows -------------------------------------------------------------------------------

    def due(
        self,
        host_now_ns: int,
        settings: WindowSettings,
        gpu_utilization: GpuUtilization | None = None,
        gpu_price: GpuPrice | None = None,
    ) -> tuple[list[Write], Closed]:
        """Close the windows whose grace has passed at `host_now_ns` (in time order), and say
        what to write: pending final points, and provisional points of ended windows that
        changed since InfluxDB last acknowledged them."""
        closed = Closed()
        window_s = settings.window_s
        price = gpu_price(self.host, self.job) if gpu_price else None

        def request_points(start: int, window: Window) -> list[Point]:
            tags = {m.Tags.HOST: self.host, m.Tags.JOB: self.job,
                    m.Tags.NAMESPACE: self.labels.namespace or m.NO_LABEL,
                    m.Tags.TEAM: self.labels.team or m.NO_LABEL}
            return [*req_math.to_points(window.requests, start, host=self.host, job=self.job,
                                        labels=self.labels, window_s=window_s,
                                        usd_per_gpu_hour=price),
                    *path_math.to_points(window.paths, start, tags=tags, window_s=window_s,
                                         usd_per_gpu_hour=price)]
        for start in sorted(self.windows):
            end = start + settings.window_ns
            if host_now_ns < end + settings.grace_ns:
                break
            window = self.windows.pop(start)
            points = agg_math.to_points(
                window.agg, window_s, memory=self.ledger.close(window.agg),
                top=settings.top_kernels,
            )
            anomalies = self.bandwidth.observe(window.agg, window_s)
            utilization = (
                gpu_utilization(self.host, self.job, start, end) if gpu_utilization else None
            )
            verdict = check_memory_bound(
                self.tracker, window.agg, window_s, settings.detect, utilization
            )
            points += [a.to_point() for a in anomalies]
            points.append(verdict.to_point())
            points += request_points(start, window)
            closed.anomalies += anomalies
            closed.memory_bound.append(verdict)
            self.pending[start] = (window.version, points)
            self.closed_before_ns = max(self.closed_before_ns, end)
        writes = [
            Write(start, version, True, points)
            for start, (version, points) in sorted(self.pending.items())
        ]
        preview = MemoryLedger.from_dict(self.ledger.to_dict()) if self.windows else None
        for start, window in sorted(self.windows.items()):
            assert preview is not None
            level = preview.close(window.agg)  # in order: each open window carries the last
            if host_now_ns < start + settings.window_ns or window.written >= window.version:
                continue
            points = agg_math.to_points(window.agg, window_s, memory=level,
                                        top=settings.top_kernels)
            points += request_points(start, window)
            writes.append(Write(start, window.version, False, points))
        return writes, closed

    def acknowledge(self, window_start_ns: int, version: int, final: bool) -> bool:
        """InfluxDB has the points of `Write(window_start_ns, version, final)`; True when
        that changed the state."""
        if final:
            pending = self.pending.get(window_start_ns)
            if pending is None or pending[0] != version:
                return False
            del self.pending[window_start_ns]
            return True
        window = self.windows.get(window_start_ns)
        if window is None or window.written >= version:
            return False
        window.written = version
        return True

    @property
    def idle(self) -> bool:
        """Nothing open and nothing to write: the state only carries baselines."""
        return not self.windows and not self.pending

    # -- table values --------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        return orjson.dumps({
            "v": STATE_VERSION,
            "host": self.host,
            "job": self.job,
            "partition": self.partition,
            "offsets": [[p, o] for p, o in sorted(self.offsets.items())],
            "windows": [
                [w.agg.to_dict(), w.version, w.written, w.requests.to_dict(),
                 w.paths.to_dict()]
                for _, w in sorted(self.windows.items())
            ],
            "closed_before_ns": self.closed_before_ns,
            "pending": [
                [start, version, [_point_to_list(p) for p in points]]
                for start, (version, points) in sorted(self.pending.items())
            ],
            "max_ts_ns": self.max_ts_ns,
            "latest_ns": self.latest_ns,
            "ledger": self.ledger.to_dict(),
            "bandwidth": self.bandwidth.to_dict(),
            "tracker": self.tracker.to_dict(),
            "labels": [self.labels.namespace, self.labels.team],
        })

    @classmethod
    def from_bytes(cls, value: bytes, settings: WindowSettings) -> JobState:
        """ValueError when `value` is not a state of this version."""
        try:
            data = orjson.loads(value)
            if data.get("v") != STATE_VERSION:
                raise ValueError(f"job state version {data.get('v')!r}, expected {STATE_VERSION}")
            windows = {}
            for agg_dict, version, written, *more in data["windows"]:
                agg = WindowAggregate.from_dict(agg_dict)
                requests = RequestWindow.from_dict(more[0]) if more else RequestWindow()
                paths = PathWindow.from_dict(more[1]) if len(more) > 1 else PathWindow()
                windows[agg.window_start_ns] = Window(agg, int(version), int(written), requests,
                                                      paths)
            namespace, team = data.get("labels", [m.NO_LABEL, m.NO_LABEL])
            max_ts = int(data["max_ts_ns"])
            # A state from before the host clock (streams/clock.py): its latest event, alone.
            latest = [int(t) for t in data.get("latest_ns", [max_ts] if max_ts else [])]
            return cls(
                host=str(data["host"]),
                job=str(data["job"]),
                partition=int(data["partition"]),
                offsets={int(p): int(o) for p, o in data["offsets"]},
                windows=windows,
                closed_before_ns=int(data["closed_before_ns"]),
                pending={
                    int(start): (int(version), [_point_from_list(p) for p in points])
                    for start, version, points in data["pending"]
                },
                max_ts_ns=max_ts,
                latest_ns=latest,
                ledger=MemoryLedger.from_dict(data["ledger"]),
                bandwidth=BandwidthDetector.from_dict(data["bandwidth"], settings.detect),
                tracker=MemoryBoundTracker.from_dict(data["tracker"]),
                labels=Labels(str(namespace), str(team)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed job state: {exc!r}") from None


def state_key(host: str, job: str) -> bytes:
    return f"{host}\x00{job}".encode()


def _point_to_list(point: Point) -> list[Any]:
    return [point.measurement, dict(point.tags), dict(point.fields), point.time_ns]


def _point_from_list(row: list[Any]) -> Point:
    measurement, tags, fields, time_ns = row
    return Point(str(measurement), dict(tags), dict(fields), int(time_ns))
