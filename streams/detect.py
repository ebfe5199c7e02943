"""Judgements over closed windows: bandwidth anomalies and memory-bound jobs. Pure; every
piece of state round-trips through plain dicts (`to_dict`/`from_dict`) for a Faust table.

Bandwidth anomalies, per (host, job, copy kind), against a robust rolling baseline: the
median and the MAD of the last `history_windows` windows observed for that series, judged
once `min_history` of them are there. The spread is 1.4826·MAD (the standard deviation, for
normal noise), floored at `min_spread_ratio`·median so that a perfectly steady series does not
turn every wobble into an infinite z-score. Two directions:

  low_bandwidth  the achieved bandwidth of synchronous copies (bytes / CPU-side duration)
                 < low_ratio · baseline, and (baseline - observed) / spread ≥ min_zscore.
                 Judged only on evidence: ≥ min_sync_copies synchronous copies moving
                 ≥ min_sync_bytes; only such windows enter the bandwidth history.
  high_bytes     bytes copied per second (all copies of the kind) > high_ratio · baseline,
                 and (observed - baseline) / spread ≥ min_zscore, with ≥ min_bytes copied in
                 the window and a baseline above 0. A window where a kind the series knows
                 copied nothing counts as 0 bytes/s.

Achieved bandwidth is what the CPU saw: a synchronous cudaMemcpy also waits for the work
queued before it on its stream, and small copies are latency-bound, so a drop can mean longer
kernels before the copies or smaller copies, as well as a slower link.

Every observed value enters its history after it is judged, anomalous or not, so a lasting
change becomes the new baseline once it fills half the history (the median's breakdown
point): an alert for a step change lasts about history_windows / 2 windows.

A memory-bound window (the rule, with the thresholds of `DetectSettings`):

  blocked_share    = the CPU blocked on the GPU, per process of the window (aggregate.py):
                     (Σ sync ns + Σ synchronous-copy ns) / (window · processes)
  copy_sync_share  = Σ synchronous-copy ns / (window · processes)
  bytes_per_launch = bytes copied host↔device (H2D, D2H, default) / max(launches, 1),
                     launches counting kernel and graph launches

  memory-bound  ⇔  (blocked_share ≥ blocked_share_min  and  bytes_per_launch ≥
                    bytes_per_launch_min)
                   or (GPU utilisation is known  and  < gpu_utilization_max_pct  and
                       copy_sync_share ≥ copy_share_min)

That is: the CPU spends a good part of the window waiting while megabytes move per kernel,
or the GPU is idle while the CPU waits on copies. The first clause cannot tell a wait for
copies from a wait for long kernels, which the bytes-per-launch bound is there to temper;
NVML's utilisation, when the caller has it, settles the second. `MemoryBoundTracker` counts
consecutive windows that hold (a gap in the windows breaks the streak), alerts once when the
count reaches `alert_windows`, and re-arms after a window that does not hold.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from gpuflight.producer.contract.counting import CopyStats
from gpuflight.streams import measurements as m
from gpuflight.streams.aggregate import WindowAggregate, blocked_share
from gpuflight.streams.measurements import Fields, Point, Tags

DICT_VERSION: Final = 1
#: MAD · 1.4826 estimates the standard deviation of normally distributed noise.
MAD_TO_SIGMA: Final = 1.4826


@dataclass(frozen=True)
class DetectSettings:
    # -- bandwidth anomalies
    history_windows: int = 30
    min_history: int = 8
    low_ratio: float = 0.5
    high_ratio: float = 3.0
    min_zscore: float = 4.0
    min_spread_ratio: float = 0.05
    min_sync_copies: int = 8
    min_sync_bytes: int = 1 << 20
    min_bytes: int = 64 << 20
    # -- memory-bound jobs
    blocked_share_min: float = 0.3
    bytes_per_launch_min: float = float(1 << 20)
    gpu_utilization_max_pct: float = 50.0
    copy_share_min: float = 0.2
    alert_windows: int = m.MEMORY_BOUND_ALERT_WINDOWS

    def __post_init__(self) -> None:
        if not 1 <= self.min_history <= self.history_windows:
            raise ValueError(
                f"need 1 ≤ min_history ({self.min_history}) ≤ history_windows"
                f" ({self.history_windows})"
            )
        if not 0.0 < self.low_ratio < 1.0:
            raise ValueError(f"low_ratio must be in (0, 1), not {self.low_ratio}")
        if self.high_ratio <= 1.0:
            raise ValueError(f"high_ratio must exceed 1, not {self.high_ratio}")
        if self.min_zscore < 0 or self.min_spread_ratio <= 0:
            raise ValueError("min_zscore must be ≥ 0 and min_spread_ratio > 0")
        if self.alert_windows < 1:
            raise ValueError(f"alert_windows must be at least 1, not {self.alert_windows}")


# -- bandwidth anomalies ---------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    median: float
    spread: float


def baseline(values: list[float], settings: DetectSettings) -> Baseline:
    """Median and spread (1.4826·MAD, floored at min_spread_ratio·median) of `values`."""
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return Baseline(median, max(MAD_TO_SIGMA * mad, settings.min_spread_ratio * abs(median)))


@dataclass(frozen=True)
class BandwidthAnomaly:
    window_start_ns: int
    host: str
    job: str
    kind: str
    direction: str  # measurements.LOW_BANDWIDTH or HIGH_BYTES
    #: Bytes per second: achieved bandwidth (low_bandwidth) or bytes copied (high_bytes).
    baseline: float
    observed: float
    ratio: float
    zscore: float

    def to_point(self) -> Point:
        return Point(
            m.BANDWIDTH_ANOMALY.name,
            {Tags.HOST: self.host, Tags.JOB: self.job, Tags.KIND: self.kind,
             Tags.DIRECTION: self.direction},
            {Fields.BASELINE: self.baseline, Fields.OBSERVED: self.observed,
             Fields.RATIO: self.ratio, Fields.ZSCORE: self.zscore},
            self.window_start_ns,
        )


@dataclass
class SeriesState:
    """The history of one (host, job, kind): values of the last windows, oldest first."""

    last_window_ns: int | None = None
    bandwidth: list[float] = field(default_factory=list)
    bytes_per_s: list[float] = field(default_factory=list)


class Judgement(NamedTuple):
    direction: str  # measurements.LOW_BANDWIDTH or HIGH_BYTES
    baseline: float
    observed: float
    ratio: float
    zscore: float


def judge_copies(
    state: SeriesState,
    window_start_ns: int,
    window_s: float,
    totals: CopyStats | None,
    settings: DetectSettings,
) -> list[Judgement]:
    """Judge one window of one series, then add it to the history (in place).

    `totals`: the kind's copies in the window (None: it copied nothing). A window not newer
    than the last one judged (a replay) is neither judged nor added.
    """
    if state.last_window_ns is not None and window_start_ns <= state.last_window_ns:
        return []
    state.last_window_ns = window_start_ns
    totals = totals or CopyStats()
    found: list[Judgement] = []
    if (
        totals.sync_count >= settings.min_sync_copies
        and totals.sync_bytes >= settings.min_sync_bytes
        and totals.sync_ns > 0
    ):
        bandwidth = totals.sync_bytes * 1e9 / totals.sync_ns
        if len(state.bandwidth) >= settings.min_history:
            base = baseline(state.bandwidth, settings)
            if base.median > 0 and bandwidth < settings.low_ratio * base.median:
                z = (base.median - bandwidth) / base.spread
                if z >= settings.min_zscore:
                    found.append(Judgement(
                        m.LOW_BANDWIDTH, base.median, bandwidth, bandwidth / base.median, z
                    ))
        _push(state.bandwidth, bandwidth, settings.history_windows)
    rate = totals.bytes / window_s
    if len(state.bytes_per_s) >= settings.min_history and totals.bytes >= settings.min_bytes:
        base = baseline(state.bytes_per_s, settings)
        if base.median > 0 and rate > settings.high_ratio * base.median:
            z = (rate - base.median) / base.spread
            if z >= settings.min_zscore:
                found.append(Judgement(m.HIGH_BYTES, base.median, rate, rate / base.median, z))
    _push(state.bytes_per_s, rate, settings.history_windows)
    return found


def _push(values: list[float], value: float, limit: int) -> None:
    values.append(value)
    del values[: max(len(values) - limit, 0)]


class BandwidthDetector:
    """Bandwidth anomalies of every (host, job, kind) it is shown windows of."""

    def __init__(self, settings: DetectSettings | None = None) -> None:
        self.settings = settings or DetectSettings()
        self.series: dict[tuple[str, str, str], SeriesState] = {}

    def observe(self, agg: WindowAggregate, window_s: float) -> list[BandwidthAnomaly]:
        """Judge a closed window: each kind it copied, and each kind the job copied before."""
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, not {window_s}")
        anomalies: list[BandwidthAnomaly] = []
        for kind in m.COPY_KIND_VALUES:
            key = (agg.host, agg.job, kind)
            totals = agg.copies.get(kind)
            if totals is None and key not in self.series:
                continue
            state = self.series.setdefault(key, SeriesState())
            for j in judge_copies(state, agg.window_start_ns, window_s, totals, self.settings):
                anomalies.append(BandwidthAnomaly(
                    agg.window_start_ns, agg.host, agg.job, kind, j.direction,
                    j.baseline, j.observed, j.ratio, j.zscore,
                ))
        return anomalies

    def expire(self, older_than_ns: int) -> int:
        """Forget series last judged before `older_than_ns`; how many were forgotten."""
        gone = [
            k for k, s in self.series.items()
            if s.last_window_ns is None or s.last_window_ns < older_than_ns
        ]
        for key in gone:
            del self.series[key]
        return len(gone)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": DICT_VERSION,
            "series": [
                [host, job, kind, s.last_window_ns, list(s.bandwidth), list(s.bytes_per_s)]
                for (host, job, kind), s in sorted(self.series.items())
            ],
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], settings: DetectSettings | None = None
    ) -> BandwidthDetector:
        if data.get("v") != DICT_VERSION:
            raise ValueError(f"detector version {data.get('v')!r}, expected {DICT_VERSION}")
        detector = cls(settings)
        try:
            for row in data["series"]:
                host, job, kind, last, bandwidth, rates = row
                detector.series[(str(host), str(job), str(kind))] = SeriesState(
                    None if last is None else int(last),
                    [float(v) for v in bandwidth],
                    [float(v) for v in rates],
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed detector state: {exc!r}") from None
        return detector


# -- memory-bound jobs -----------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryBoundEvidence:
    blocked_share: float
    copy_sync_share: float
    bytes_per_launch: float
    launches: int
    host_device_bytes: int
    gpu_utilization_pct: float | None = None

    @classmethod
    def from_aggregate(
        cls, agg: WindowAggregate, window_s: float, gpu_utilization_pct: float | None = None
    ) -> MemoryBoundEvidence:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, not {window_s}")
        launches = agg.all_launches
        moved = agg.host_device_bytes
        return cls(
            blocked_share=blocked_share(agg, window_s),
            copy_sync_share=agg.copy_sync_ns / (window_s * 1e9 * max(agg.processes, 1)),
            bytes_per_launch=moved / max(launches, 1),
            launches=launches,
            host_device_bytes=moved,
            gpu_utilization_pct=gpu_utilization_pct,
        )


def is_memory_bound(evidence: MemoryBoundEvidence, settings: DetectSettings) -> bool:
    """The rule of the module docstring."""
    waits_on_transfers = (
        evidence.blocked_share >= settings.blocked_share_min
        and evidence.bytes_per_launch >= settings.bytes_per_launch_min
    )
    idle_gpu_copying = (
        evidence.gpu_utilization_pct is not None
        and evidence.gpu_utilization_pct < settings.gpu_utilization_max_pct
        and evidence.copy_sync_share >= settings.copy_share_min
    )
    return waits_on_transfers or idle_gpu_copying


@dataclass
class MemoryBoundTracker:
    """Consecutive memory-bound windows of one (host, job)."""

    consecutive: int = 0
    last_window_ns: int | None = None

    def update(
        self, window_start_ns: int, window_ns: int, holds: bool, alert_windows: int
    ) -> bool:
        """Count a closed window; True when this window makes the streak reach
        `alert_windows` (once per streak). A window not newer than the last (a replay)
        changes nothing; one that does not follow the last breaks the streak."""
        if self.last_window_ns is not None and window_start_ns <= self.last_window_ns:
            return False
        follows = self.last_window_ns is not None and (
            window_start_ns - self.last_window_ns <= window_ns
        )
        self.last_window_ns = window_start_ns
        if not holds:
            self.consecutive = 0
            return False
        self.consecutive = self.consecutive + 1 if follows else 1
        return self.consecutive == alert_windows

    def to_dict(self) -> dict[str, Any]:
        return {"v": DICT_VERSION, "consecutive": self.consecutive, "last": self.last_window_ns}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryBoundTracker:
        if data.get("v") != DICT_VERSION:
            raise ValueError(f"tracker version {data.get('v')!r}, expected {DICT_VERSION}")
        try:
            last = data["last"]
            return cls(int(data["consecutive"]), None if last is None else int(last))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed tracker state: {exc!r}") from None


@dataclass(frozen=True)
class MemoryBoundResult:
    window_start_ns: int
    host: str
    job: str
    evidence: MemoryBoundEvidence
    verdict: bool
    consecutive: int
    #: The streak is at least alert_windows long.
    alerting: bool
    #: This window made it so (the alert's first window).
    fired: bool

    def to_point(self) -> Point:
        e = self.evidence
        fields: dict[str, int | float] = {
            Fields.VERDICT: int(self.verdict),
            Fields.CONSECUTIVE_WINDOWS: self.consecutive,
            Fields.ALERT: int(self.alerting),
            Fields.BLOCKED_SHARE: e.blocked_share,
            Fields.COPY_SYNC_SHARE: e.copy_sync_share,
            Fields.BYTES_PER_LAUNCH: e.bytes_per_launch,
        }
        if e.gpu_utilization_pct is not None:
            fields[Fields.GPU_UTILIZATION_PCT] = float(e.gpu_utilization_pct)
        return Point(
            m.MEMORY_BOUND.name, {Tags.HOST: self.host, Tags.JOB: self.job}, fields,
            self.window_start_ns,
        )


def check_memory_bound(
    tracker: MemoryBoundTracker,
    agg: WindowAggregate,
    window_s: float,
    settings: DetectSettings,
    gpu_utilization_pct: float | None = None,
) -> MemoryBoundResult:
    """Judge a closed window of one job and count it on that job's tracker (in place).

    `gpu_utilization_pct`: the job's GPUs' mean NVML utilisation over the window, if known.
    """
    evidence = MemoryBoundEvidence.from_aggregate(agg, window_s, gpu_utilization_pct)
    verdict = is_memory_bound(evidence, settings)
    fired = tracker.update(
        agg.window_start_ns, round(window_s * 1e9), verdict, settings.alert_windows
    )
    return MemoryBoundResult(
        window_start_ns=agg.window_start_ns,
        host=agg.host,
        job=agg.job,
        evidence=evidence,
        verdict=verdict,
        consecutive=tracker.consecutive,
        alerting=tracker.consecutive >= settings.alert_windows,
        fired=fired,
    )
