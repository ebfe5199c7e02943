"""Bandwidth anomalies on synthetic series, and the memory-bound rule and its tracker."""

from __future__ import annotations

import dataclasses

import numpy as np
import orjson
import pytest

from gpuflight.producer.contract.counting import CopyStats
from gpuflight.streams import measurements as m
from gpuflight.streams.aggregate import WindowAggregate
from gpuflight.streams.detect import (
    BandwidthAnomaly,
    BandwidthDetector,
    DetectSettings,
    MemoryBoundEvidence,
    MemoryBoundTracker,
    baseline,
    check_memory_bound,
    is_memory_bound,
)

WINDOW_S = 10.0
WINDOW_NS = 10_000_000_000
MIB = 1 << 20
SETTINGS = DetectSettings()


def window(
    i: int,
    bandwidth: float = 10e9,
    nbytes: float = 1e9,
    *,
    sync_count: int = 20,
    sync_bytes: int = 256 * MIB,
    kind: str = "H2D",
) -> WindowAggregate:
    """Window i of node1/job1: `nbytes` copied of `kind`, `sync_bytes` of it synchronously
    at `bandwidth` bytes/s."""
    return WindowAggregate(
        i * WINDOW_NS, "node1", "job1",
        copies={kind: CopyStats(
            count=sync_count * 2, bytes=max(int(nbytes), sync_bytes), sync_count=sync_count,
            sync_bytes=sync_bytes, sync_ns=round(sync_bytes * 1e9 / bandwidth))},
        pids={1},
    )


def run(detector: BandwidthDetector, windows: list[WindowAggregate]) -> list[BandwidthAnomaly]:
    found: list[BandwidthAnomaly] = []
    for agg in windows:
        found += detector.observe(agg, WINDOW_S)
    return found


# -- bandwidth anomalies ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("noise", [0.02, 0.2])
def test_steady_noisy_series_never_fire(seed: int, noise: float) -> None:
    rng = np.random.default_rng(seed)
    n = 500
    bandwidth = 10e9 * np.exp(noise * rng.standard_normal(n))
    nbytes = 2e9 * np.exp(noise * rng.standard_normal(n))
    windows = [window(i, float(bw), float(b)) for i, (bw, b) in enumerate(zip(bandwidth, nbytes,
                                                                           strict=True))]
    assert run(BandwidthDetector(), windows) == []


def test_a_bandwidth_drop_fires_until_it_becomes_the_baseline() -> None:
    rng = np.random.default_rng(1)
    steady = [window(i, 10e9 * (1 + 0.03 * rng.standard_normal())) for i in range(40)]
    dropped = [window(40 + i, 3e9) for i in range(60)]
    detector = BandwidthDetector()
    assert run(detector, steady) == []
    first = detector.observe(dropped[0], WINDOW_S)
    assert len(first) == 1
    anomaly = first[0]
    assert (anomaly.direction, anomaly.kind, anomaly.host, anomaly.job) == (
        "low_bandwidth", "H2D", "node1", "job1")
    assert anomaly.baseline == pytest.approx(10e9, rel=0.03)
    assert anomaly.observed == pytest.approx(3e9, rel=1e-6)
    assert anomaly.ratio == pytest.approx(0.3, rel=0.03)
    assert anomaly.zscore >= SETTINGS.min_zscore
    assert anomaly.window_start_ns == 40 * WINDOW_NS
    later = [len(detector.observe(agg, WINDOW_S)) for agg in dropped[1:]]
    # The median breaks down once half the history holds the new level.
    assert later[: SETTINGS.history_windows // 2 - 2] == [1] * (SETTINGS.history_windows // 2 - 2)
    assert sum(later[SETTINGS.history_windows:]) == 0


def test_a_byte_spike_fires_high_bytes() -> None:
    rng = np.random.default_rng(2)
    windows = [window(i, nbytes=1e9 * (1 + 0.05 * rng.standard_normal())) for i in range(30)]
    detector = BandwidthDetector()
    assert run(detector, windows) == []
    (anomaly,) = detector.observe(window(30, nbytes=5e9), WINDOW_S)
    assert anomaly.direction == "high_bytes"
    assert anomaly.observed == 5e9 / WINDOW_S
    assert anomaly.baseline == pytest.approx(1e8, rel=0.05)
    assert anomaly.ratio == pytest.approx(5.0, rel=0.05)
    assert detector.observe(window(31, nbytes=1e9), WINDOW_S) == []


def test_ratio_thresholds_both_sides() -> None:
    def last(bw: float, nbytes: float) -> list[str]:
        detector = BandwidthDetector()
        run(detector, [window(i) for i in range(20)])
        return [a.direction for a in detector.observe(window(20, bw, nbytes), WINDOW_S)]

    # A steady series has the floor spread (5%): these are all far beyond 4 spreads.
    assert last(10e9 * 0.49, 1e9) == ["low_bandwidth"]
    assert last(10e9 * 0.51, 1e9) == []
    assert last(10e9, 1e9 * 3.01) == ["high_bytes"]
    assert last(10e9, 1e9 * 2.99) == []


def test_the_zscore_guards_noisy_series() -> None:
    rng = np.random.default_rng(3)
    noisy = [window(i, 10e9 * float(np.exp(0.5 * rng.standard_normal()))) for i in range(30)]
    detector = BandwidthDetector()
    run(detector, noisy)
    spread = baseline(detector.series[("node1", "job1", "H2D")].bandwidth, SETTINGS)
    observed = 0.45 * spread.median
    assert (spread.median - observed) / spread.spread < SETTINGS.min_zscore
    assert detector.observe(window(30, observed), WINDOW_S) == []


def test_thin_evidence_is_not_judged() -> None:
    detector = BandwidthDetector()
    run(detector, [window(i) for i in range(20)])
    few = window(20, 1e9, sync_count=SETTINGS.min_sync_copies - 1)
    small = window(21, 1e9, sync_bytes=SETTINGS.min_sync_bytes - 1)
    assert detector.observe(few, WINDOW_S) == detector.observe(small, WINDOW_S) == []
    assert len(detector.series[("node1", "job1", "H2D")].bandwidth) == 20  # not in the history
    assert [a.direction for a in detector.observe(window(22, 1e9), WINDOW_S)] == ["low_bandwidth"]


def test_nothing_is_judged_before_min_history() -> None:
    detector = BandwidthDetector()
    run(detector, [window(i) for i in range(SETTINGS.min_history - 1)])
    assert detector.observe(window(99, 1e8, 1e12), WINDOW_S) == []


def test_a_kind_that_stops_copying_counts_zero_bytes() -> None:
    detector = BandwidthDetector()
    run(detector, [window(i) for i in range(10)])
    quiet = WindowAggregate(10 * WINDOW_NS, "node1", "job1", pids={1})
    assert detector.observe(quiet, WINDOW_S) == []
    state = detector.series[("node1", "job1", "H2D")]
    assert state.bytes_per_s[-1] == 0.0 and len(state.bandwidth) == 10
    # Other jobs and kinds have series of their own.
    run(detector, [window(i, kind="D2H") for i in range(11, 13)])
    assert ("node1", "job1", "D2H") in detector.series


def test_replayed_windows_are_ignored() -> None:
    detector = BandwidthDetector()
    run(detector, [window(i) for i in range(20)])
    drop = window(20, 1e9)
    assert len(detector.observe(drop, WINDOW_S)) == 1
    assert detector.observe(drop, WINDOW_S) == []
    assert len(detector.series[("node1", "job1", "H2D")].bandwidth) == 21


def test_detector_state_round_trips_mid_series() -> None:
    rng = np.random.default_rng(4)
    levels = [10e9] * 30 + [2e9] * 10 + [10e9] * 10
    windows = [window(i, bw * (1 + 0.02 * rng.standard_normal()),
                      nbytes=1e9 * (8 if i == 45 else 1)) for i, bw in enumerate(levels)]
    straight = BandwidthDetector()
    expected = run(straight, windows)
    first = BandwidthDetector()
    run(first, windows[:35])
    resumed = BandwidthDetector.from_dict(orjson.loads(orjson.dumps(first.to_dict())))
    assert resumed.series == first.series
    assert run(first, windows[:35]) == []  # (replays)
    found = run(BandwidthDetector(), windows[:35]) + run(resumed, windows[35:])
    assert found == expected
    assert {a.direction for a in expected} == {"low_bandwidth", "high_bytes"}
    with pytest.raises(ValueError):
        BandwidthDetector.from_dict({"v": 2, "series": []})
    with pytest.raises(ValueError):
        BandwidthDetector.from_dict({"v": 1, "series": [["h", "j"]]})


def test_expire_forgets_idle_series() -> None:
    detector = BandwidthDetector()
    run(detector, [window(i) for i in range(3)])
    assert detector.expire(older_than_ns=2 * WINDOW_NS) == 0
    assert detector.expire(older_than_ns=3 * WINDOW_NS) == 1
    assert detector.series == {}


def test_anomaly_points_follow_the_contract() -> None:
    anomaly = BandwidthAnomaly(5, "node1", "job1", "D2H", m.LOW_BANDWIDTH, 1e10, 3e9, 0.3, 9.0)
    point = anomaly.to_point()
    assert m.problems(point) == []
    assert point.tags == {"host": "node1", "job": "job1", "kind": "D2H",
                          "direction_of_change": "low_bandwidth"}
    assert point.fields == {"baseline": 1e10, "observed": 3e9, "ratio": 0.3, "zscore": 9.0}


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        DetectSettings(min_history=40, history_windows=30)
    with pytest.raises(ValueError):
        DetectSettings(low_ratio=1.5)
    with pytest.raises(ValueError):
        DetectSettings(high_ratio=0.9)
    with pytest.raises(ValueError):
        DetectSettings(alert_windows=0)


# -- memory-bound jobs -----------------------------------------------------------------------

def holds(
    blocked_share: float = 0.3,
    bytes_per_launch: float = float(MIB),
    copy_sync_share: float = 0.0,
    gpu_utilization_pct: float | None = None,
) -> bool:
    evidence = MemoryBoundEvidence(
        blocked_share=blocked_share, copy_sync_share=copy_sync_share,
        bytes_per_launch=bytes_per_launch, launches=10, host_device_bytes=10 * MIB,
        gpu_utilization_pct=gpu_utilization_pct,
    )
    return is_memory_bound(evidence, SETTINGS)


def test_memory_bound_rule_at_each_threshold() -> None:
    # Clause 1: blocked while megabytes move per launch.
    assert holds()
    assert not holds(blocked_share=0.2999)
    assert not holds(bytes_per_launch=MIB - 1.0)
    assert holds(blocked_share=0.9, bytes_per_launch=64.0 * MIB)
    # Clause 2: an idle GPU while the CPU waits on copies (only when utilisation is known).
    idle = {"blocked_share": 0.0, "bytes_per_launch": 0.0, "copy_sync_share": 0.2}
    assert not holds(**idle)
    assert holds(**idle, gpu_utilization_pct=49.9)
    assert not holds(**idle, gpu_utilization_pct=50.0)
    assert not holds(**{**idle, "copy_sync_share": 0.1999}, gpu_utilization_pct=10.0)
    # Clause 1 holds whatever the GPU says.
    assert holds(gpu_utilization_pct=99.0)


def test_evidence_from_an_aggregate() -> None:
    agg = WindowAggregate(
        0, "node1", "job1",
        launches={("runtime", "cudaLaunchKernel"): 8, ("runtime", "cudaGraphLaunch"): 2},
        copies={
            "H2D": CopyStats(count=4, bytes=16 * MIB, sync_count=4, sync_bytes=16 * MIB,
                              sync_ns=100_000_000),
            "D2H": CopyStats(count=2, bytes=4 * MIB),
            "D2D": CopyStats(count=1, bytes=1 << 30),  # stays on the GPU: not counted
        },
        sync_count={"device": 3}, sync_ns={"device": 300_000_000},
        pids={1, 2},
    )
    evidence = MemoryBoundEvidence.from_aggregate(agg, 1.0, gpu_utilization_pct=30.0)
    assert evidence == MemoryBoundEvidence(
        blocked_share=0.2, copy_sync_share=0.05, bytes_per_launch=2.0 * MIB, launches=10,
        host_device_bytes=20 * MIB, gpu_utilization_pct=30.0)
    assert not is_memory_bound(evidence, SETTINGS)
    assert is_memory_bound(evidence, dataclasses.replace(SETTINGS, blocked_share_min=0.2))
    idle = MemoryBoundEvidence.from_aggregate(WindowAggregate(0, "h", "j"), 1.0)
    assert (idle.blocked_share, idle.bytes_per_launch, idle.launches) == (0.0, 0.0, 0)


def test_tracker_alerts_once_per_streak_and_rearms() -> None:
    tracker = MemoryBoundTracker()
    pattern = [True, True, True, True, False, True, True, True]
    fired = [tracker.update(i * WINDOW_NS, WINDOW_NS, h, 3) for i, h in enumerate(pattern)]
    assert fired == [False, False, True, False, False, False, False, True]
    assert tracker.consecutive == 3


def test_tracker_gap_breaks_the_streak_and_replays_change_nothing() -> None:
    tracker = MemoryBoundTracker()
    assert not tracker.update(0, WINDOW_NS, True, 2)
    assert not tracker.update(0, WINDOW_NS, True, 2)  # a replay
    assert tracker.consecutive == 1
    assert not tracker.update(5 * WINDOW_NS, WINDOW_NS, True, 2)  # windows 1-4 missing
    assert tracker.consecutive == 1
    assert tracker.update(6 * WINDOW_NS, WINDOW_NS, True, 2)
    restored = MemoryBoundTracker.from_dict(orjson.loads(orjson.dumps(tracker.to_dict())))
    assert restored == tracker
    with pytest.raises(ValueError):
        MemoryBoundTracker.from_dict({"v": 1, "consecutive": "x", "last": None})


def test_check_memory_bound_counts_and_writes_points() -> None:
    settings = DetectSettings(alert_windows=2)
    tracker = MemoryBoundTracker()

    def bound(i: int) -> WindowAggregate:
        return WindowAggregate(
            i * WINDOW_NS, "node1", "job1",
            launches={("runtime", "cudaLaunchKernel"): 10},
            copies={"H2D": CopyStats(count=10, bytes=100 * MIB, sync_count=10,
                                      sync_bytes=100 * MIB, sync_ns=4_000_000_000)},
            pids={1},
        )

    results = [check_memory_bound(tracker, bound(i), WINDOW_S, settings) for i in range(3)]
    assert [(r.verdict, r.consecutive, r.alerting, r.fired) for r in results] == [
        (True, 1, False, False), (True, 2, True, True), (True, 3, True, False)]
    idle = check_memory_bound(tracker, WindowAggregate(3 * WINDOW_NS, "node1", "job1"),
                              WINDOW_S, settings, gpu_utilization_pct=5.0)
    assert (idle.verdict, idle.consecutive, idle.alerting, idle.fired) == (False, 0, False, False)
    point = results[1].to_point()
    assert m.problems(point) == [] and m.problems(idle.to_point()) == []
    assert point.time_ns == WINDOW_NS
    assert point.fields == {"verdict": 1, "consecutive_windows": 2, "alert": 1,
                            "blocked_share": 0.4, "copy_sync_share": 0.4,
                            "bytes_per_launch": 10.0 * MIB}
    assert idle.to_point().fields["gpu_utilization_pct"] == 5.0
