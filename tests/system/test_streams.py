"""The stream worker (`gpuflight streams`) against a real Kafka and a real InfluxDB: scripted
events in, exact points out; a worker killed mid-stream; late events; dead letters; alerts.

Event times are in the past, so windows close at the pace the worker reads them (a job's time
is its host's latest event time), and each test's hosts, topics and app id are its own.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import API_IDS, EVENT_DTYPE, F_HAS_RESULT, EventType
from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.decode.summary import Summary
from gpuflight.streams import aggregate
from gpuflight.streams import measurements as m
from gpuflight.streams.windows import JobState, WindowSettings
from tests.conftest import REPO
from tests.support.counting import SYNTHETIC_KERNEL_LAUNCHES, SYNTHETIC_PIDS, synthetic_events
from tests.support.streams_support import (
    Feed,
    Harness,
    StreamWorker,
    copies,
    group_assignment,
    hosts_on_every_partition,
    launches,
    read_topic,
    rows,
    wait_for,
)

pytestmark = pytest.mark.influx

W = 1_000_000_000  # the tests' window: 1 s
#: For a worker killed and started again: Kafka gives a killed member's partitions to the
#: group's others once its session times out (Faust's default: 60 s, read from this variable).
RESTARTS_SOON = {"BROKER_SESSION_TIMEOUT": "10"}
H2D, D2H = 1, 2


@pytest.fixture
def names(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name.removeprefix('test_')[:24]}-{os.getpid()}-{time.time_ns() % 10**6}"


@pytest.fixture
def worker(kafka_bootstrap: str, influx_url: str, names: str,
           tmp_path: Path) -> Iterator[StreamWorker]:
    running = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path)
    yield running
    running.stop()


def past_window(ago_s: int) -> int:
    return (time.time_ns() // W - ago_s) * W


def sum_of(url: str, measurement: str, field: str, job: str, since: int, **tags: str) -> int:
    where = "".join(f" AND {k} = '{v}'" for k, v in tags.items())
    found = rows(url, f"SELECT sum({field}) FROM {measurement} WHERE job = '{job}'"
                      f" AND time >= {since}{where}")
    return int(found[0]["sum"]) if found else 0


@pytest.mark.kafka
def test_a_scripted_stream_gives_exact_points(kafka_bootstrap: str, influx_url: str,
                                              names: str, worker: StreamWorker) -> None:
    feed = Feed(kafka_bootstrap, names)
    t0 = past_window(30)
    host = f"{names}-a"
    feed.process(host, 100, 7, "train:100")
    feed.process(host, 101, 7, "train:100")  # a second process of the same job
    # Window 0: 40 launches of 64 blocks, 10 H2D copies of 1 MiB taking 1 ms each (1 GB/s).
    feed.events(host, 100, 7, launches([t0 + i * 1000 for i in range(40)], 100, 64, 128),
                {0xA000: wire.KernelName("axpy", "axpy<float>(float*, float)")})
    feed.events(host, 101, 7, copies([t0 + 10**6 + i for i in range(10)], 101, H2D,
                                     1 << 20, 1_000_000))
    # Window 1: 5 launches of 4096 blocks; 2 D2H copies of 4 KiB.
    feed.events(host, 100, 7, launches([t0 + W + i for i in range(5)], 100, 4096, 256))
    feed.events(host, 101, 7, copies([t0 + W + 5, t0 + W + 6], 101, D2H, 4096, 10_000))
    # Window 5: one launch, so windows 0 and 1 close at the worker's pace.
    feed.events(host, 100, 7, launches([t0 + 5 * W], 100, 1, 32))
    feed.flush()
    worker.start()

    # A window's memory-bound verdict is written when it closes.
    wait_for(lambda: rows(influx_url, f"SELECT verdict FROM memory_bound WHERE host = '{host}'"
                                      f" AND time = {t0 + W}"), 90, "window 1 closed", worker)
    two = rows(influx_url, f"SELECT sum(count) FROM launches WHERE host = '{host}'"
                           f" AND time < {t0 + 2 * W}")
    assert two[0]["sum"] == 45
    first = rows(influx_url, f"SELECT count, rate_per_s FROM launches WHERE host = '{host}'"
                             f" AND time = {t0}")
    assert first == [{"time": t0, "count": 40, "rate_per_s": 40}]
    kernels = rows(influx_url, f"SELECT count FROM kernels WHERE host = '{host}'"
                               f" GROUP BY kernel")
    # Names come with each message; the later ones carried none.
    assert sorted((r["kernel"], r["count"]) for r in kernels if r["time"] < t0 + 2 * W) == [
        ("axpy", 40), ("function@0xa000", 5)]
    grid = rows(influx_url, f"SELECT count FROM grid_blocks WHERE host = '{host}'"
                            f" GROUP BY bucket")
    assert sorted((r["time"] - t0, r["bucket"], r["count"]) for r in grid
                  if r["time"] < t0 + 2 * W) == [(0, "2^6", 40), (W, "2^12", 5)]
    h2d = rows(influx_url, f"SELECT * FROM copies WHERE host = '{host}' AND kind = 'H2D'")
    assert len(h2d) == 1
    assert h2d[0]["count"] == 10 and h2d[0]["bytes"] == 10 << 20
    assert h2d[0]["sync_ns"] == 10_000_000
    assert h2d[0]["bandwidth_bytes_per_s"] == pytest.approx((10 << 20) / 0.01)
    d2h = rows(influx_url, f"SELECT bytes, sync_count FROM copies WHERE host = '{host}'"
                           f" AND kind = 'D2H'")
    assert [(r["time"] - t0, r["bytes"], r["sync_count"]) for r in d2h] == [(W, 8192, 2)]
    blocked = rows(influx_url, f"SELECT copy_ns, processes FROM cpu_blocked"
                               f" WHERE host = '{host}' AND time = {t0}")
    assert blocked == [{"time": t0, "copy_ns": 10_000_000, "processes": 2}]
    # Every point is what the pure aggregate math makes of the same events.
    state = JobState(host, "train:100", 0)
    settings = WindowSettings(window_s=1.0, grace_s=1.0)
    state.apply(launches([t0 + i * 1000 for i in range(40)], 100, 64, 128), 0, 0, settings,
                {0xA000: "axpy"})
    state.apply(copies([t0 + 10**6 + i for i in range(10)], 101, H2D, 1 << 20, 1_000_000),
                0, 1, settings)
    writes, _ = state.due(t0 + 3 * W, settings)
    (final,) = [w for w in writes if w.window_start_ns == t0]
    for point in final.points:
        if point.measurement == m.MEMORY_BOUND.name:
            continue
        tags = " AND ".join(f"{k} = '{v}'" for k, v in point.tags.items())
        stored = rows(influx_url, f"SELECT * FROM {point.measurement} WHERE {tags}"
                                  f" AND time = {t0}")
        assert len(stored) == 1, point
        for name, value in point.fields.items():
            assert stored[0][name] == pytest.approx(value), (point.measurement, name)


@pytest.mark.kafka
def test_a_worker_killed_mid_stream_loses_and_doubles_nothing(
        kafka_bootstrap: str, influx_url: str, names: str, worker: StreamWorker) -> None:
    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-k"
    t0 = past_window(120)
    feed.process(host, 200, 9, "job:200")
    windows, per_message, messages_per_window = 40, 500, 10
    for w in range(windows):
        for k in range(messages_per_window):
            base = t0 + w * W + k * (W // messages_per_window)
            feed.events(host, 200, 9, launches([base + i for i in range(per_message)], 200,
                                               32, 256))
    feed.flush()
    total = windows * messages_per_window * per_message
    worker.start("first")
    wait_for(lambda: sum_of(influx_url, "launches", "count", "job:200", t0, host=host) > 0,
             90, "the first windows written", worker)
    worker.kill()
    written = sum_of(influx_url, "launches", "count", "job:200", t0, host=host)
    assert 0 < written < total, "the worker was not killed mid-stream"
    worker.start("second")
    wait_for(lambda: sum_of(influx_url, "launches", "count", "job:200", t0, host=host) == total
             and len(rows(influx_url, f"SELECT count FROM launches WHERE host = '{host}'"))
             == windows, 120, f"all {total} launches in {windows} windows", worker)
    per_window = rows(influx_url, f"SELECT count FROM launches WHERE host = '{host}'")
    assert {r["count"] for r in per_window} == {messages_per_window * per_message}
    assert [r["time"] for r in per_window] == [t0 + w * W for w in range(windows)]


@pytest.mark.kafka
def test_late_events_within_grace_count_and_beyond_go_to_dead_letters(
        kafka_bootstrap: str, influx_url: str, names: str, tmp_path: Path) -> None:
    worker = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path,
                          window_s=1.0, grace_s=3.0)
    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-l"
    t0 = past_window(60)
    feed.process(host, 300, 1, "late:300")
    feed.events(host, 300, 1, launches([t0 + 1], 300, 8, 64))
    feed.events(host, 300, 1, launches([t0 + 2 * W], 300, 8, 64))  # window 0 ended, in grace
    feed.events(host, 300, 1, launches([t0 + 2, t0 + 3], 300, 8, 64))  # late, within grace
    feed.events(host, 300, 1, launches([t0 + 10 * W], 300, 8, 64))  # closes windows 0 and 2
    feed.flush()
    worker.start()
    try:
        wait_for(lambda: rows(influx_url, f"SELECT verdict FROM memory_bound"
                                          f" WHERE host = '{host}' AND time = {t0 + 2 * W}"),
                 90, "windows 0 and 2 closed", worker)
        feed.events(host, 300, 1, launches([t0 + 4, t0 + 2 * W + 1, t0 + 10 * W + 1], 300,
                                           8, 64))
        feed.flush()
        dead = read_topic(kafka_bootstrap, f"{names}.deadletter.v1", timeout_s=90, expect=1)
        assert len(dead) == 1
        headers = dict(dead[0].headers())
        assert headers["reason"] == b"late"
        late = wire.decode_events(dead[0].value())
        assert late.events["ts_ns"].tolist() == [t0 + 4, t0 + 2 * W + 1]
        wait_for(lambda: {r["time"] - t0: r["count"] for r in rows(
            influx_url, f"SELECT count FROM launches WHERE host = '{host}'")}.get(10 * W) == 2,
            30, "the last window", worker)
        counts = {r["time"] - t0: r["count"] for r in rows(
            influx_url, f"SELECT count FROM launches WHERE host = '{host}'")}
        assert counts == {0: 3, 2 * W: 1, 10 * W: 2}
    finally:
        worker.stop()


def uncounted(url: str, job: str) -> tuple[int, int]:
    found = rows(url, f"SELECT sum(late_events) AS late, sum(future_events) AS future"
                      f" FROM {m.EVENTS_UNCOUNTED.name} WHERE job = '{job}'")
    return (int(found[0]["late"]), int(found[0]["future"])) if found else (0, 0)


@pytest.mark.kafka
def test_a_late_batch_over_the_broker_limit_reaches_the_dead_letters_in_parts(
        kafka_bootstrap: str, influx_url: str, names: str, worker: StreamWorker) -> None:
    """60,000 late events (~2.6 MB re-encoded, over the broker's 1 MB message limit): every
    one reaches the dead-letter topic, in parts, and the job counts them as not counted."""
    from gpuflight.streams.worker import DEAD_LETTER_MAX_BYTES

    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-b"
    t0 = past_window(60)
    feed.process(host, 310, 1, "bulk:310")
    feed.events(host, 310, 1, launches([t0 + 1], 310, 8, 64))
    feed.events(host, 310, 1, launches([t0 + 10 * W], 310, 8, 64))  # closes window 0
    feed.flush()
    worker.start()
    wait_for(lambda: rows(influx_url, f"SELECT verdict FROM memory_bound"
                                      f" WHERE host = '{host}' AND time = {t0}"),
             90, "window 0 closed", worker)
    late_ts = [t0 + 2 + 7919 * i % (W - 2) for i in range(60_000)]
    late = launches(late_ts, 310, 8, 64, handle=0xA000)
    late["handle"] = 0xA000 + np.arange(len(late), dtype=np.uint64) % 5000  # named kernels
    kernel_names = {0xA000 + k: wire.KernelName(f"k{k}", f"void k{k}<{'T' * 40}>(float*)")
                    for k in range(5000)}
    assert len(wire.encode_events(wire.EventBatch(host, 310, 1, late, kernel_names))) > 2 << 20
    feed.events(host, 310, 1, late, kernel_names)
    feed.flush()
    wait_for(lambda: uncounted(influx_url, "bulk:310") == (60_000, 0), 90,
             "the late events counted as not counted", worker)
    dead = read_topic(kafka_bootstrap, f"{names}.deadletter.v1", timeout_s=90, expect=3)
    assert len(dead) >= 3
    assert all(len(d.value()) <= DEAD_LETTER_MAX_BYTES for d in dead)
    assert {dict(d.headers())["reason"] for d in dead} == {b"late"}
    batches = [wire.decode_events(d.value()) for d in dead]
    assert [t for b in batches for t in b.events["ts_ns"].tolist()] == late_ts
    for b in batches:  # each part names its own kernels
        assert set(b.kernels) == set(b.events["handle"].tolist())
    wait_for(lambda: sum_of(influx_url, "launches", "count", "bulk:310", t0, host=host) == 2,
             60, "the counted launches", worker)


@pytest.mark.kafka
def test_a_message_from_the_future_moves_no_clock(
        kafka_bootstrap: str, influx_url: str, names: str, tmp_path: Path) -> None:
    """One message stamped a day ahead: dead-lettered ("future") and counted as not counted;
    the host's windows close by its real events, none of which is late — before and after a
    worker restart."""
    from gpuflight.streams import report
    from gpuflight.streams.settings import InfluxSettings

    # --idle 60: the host is silent while the second worker starts and catches up; the wall
    # clock must not close its windows meanwhile (under load that took longer than 5 s + grace).
    worker = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path,
                          window_s=1.0, grace_s=1.0, env=RESTARTS_SOON, extra=("--idle", "60"))
    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-f"
    t0 = past_window(90)
    day = 86_400 * W
    feed.process(host, 320, 1, "clock:320")
    feed.process(host, 321, 1, "beside:321")  # another process of the host
    feed.events(host, 320, 1, launches([t0 + w * W for w in range(5)], 320, 8, 64))
    # Not first in its message: Kafka 4 refuses a message stamped (by its first event) over
    # an hour ahead, but the rest of a message is the producer's word alone.
    feed.events(host, 320, 1, launches([t0 + 5 * W, time.time_ns() + day], 320, 8, 64))
    feed.events(host, 320, 1, launches([t0 + w * W + 1 for w in range(6, 20)], 320, 8, 64))
    # The host's time is what two messages attest to (streams/clock.py): the other process's.
    feed.events(host, 321, 1, launches([t0 + 19 * W + 5], 321, 8, 64))
    feed.flush()
    worker.start("first")
    try:
        wait_for(lambda: sum_of(influx_url, "launches", "count", "clock:320", t0, host=host)
                 == 19, 90, "every real launch counted", worker)
        assert uncounted(influx_url, "clock:320") == (0, 1)
        dead = read_topic(kafka_bootstrap, f"{names}.deadletter.v1", timeout_s=30, expect=1)
        assert [dict(d.headers())["reason"] for d in dead] == [b"future"]
        assert wire.decode_events(dead[0].value()).events["ts_ns"].tolist()[0] > t0 + day // 2
        worker.kill()
        feed.events(host, 320, 1, launches([t0 + w * W + 2 for w in range(20, 40)], 320, 8, 64))
        feed.events(host, 321, 1, launches([t0 + 39 * W + 5], 321, 8, 64))
        feed.flush()
        worker.start("second")
        sums: list[int] = []

        def all_counted() -> bool:
            sums.append(sum_of(influx_url, "launches", "count", "clock:320", t0, host=host))
            return sums[-1] == 39

        try:
            wait_for(all_counted, 120, "the launches after the restart counted", worker)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\ncounted {sums[-1:]}, not counted (late, future) "
                                 f"{uncounted(influx_url, 'clock:320')}") from None
        assert uncounted(influx_url, "clock:320") == (0, 1)
        summary = report.job_summary(InfluxSettings(url=influx_url), "clock:320", t0,
                                     time.time_ns() + W)
        assert (summary.uncounted_late, summary.uncounted_future) == (0, 1)
        assert "1 events of this job were not counted" in report.render_job(summary)
    finally:
        worker.stop()


@pytest.mark.kafka
def test_malformed_messages_go_to_dead_letters_and_are_counted(
        kafka_bootstrap: str, influx_url: str, names: str, worker: StreamWorker) -> None:
    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-m"
    t0 = past_window(20)
    feed.process(host, 400, 1, "ok:400")
    feed.raw(feed.topics.events, host, b"\x00 not json")
    feed.raw(feed.topics.events, host, orjson.dumps({"schema": "gpuflight.events", "v": 99}))
    feed.raw(feed.topics.nvml, host, b'{"schema": "gpuflight.nvml", "v": 1}')
    for count in (b"1000000000000", b"5e6"):  # claims the message cannot hold
        feed.raw(feed.topics.events, host, b'{"schema": "gpuflight.events", "v": 1, "count": '
                 + count + b', "host": "h", "pid": 1, "start_time": 0, "ts0": 5, "columns": {}}')
    feed.events(host, 400, 1, launches([t0, t0 + 1], 400, 2, 2))
    feed.events(host, 400, 1, launches([t0 + 5 * W], 400, 2, 2))
    feed.flush()
    worker.start()
    dead = read_topic(kafka_bootstrap, f"{names}.deadletter.v1", timeout_s=90, expect=5)
    reasons = sorted((dict(d.headers())["topic"].decode(), d.value()[:8]) for d in dead)
    assert reasons == sorted([(feed.topics.events, b"\x00 not js"),
                              (feed.topics.events, b'{"schema'),
                              (feed.topics.events, b'{"schema'),
                              (feed.topics.events, b'{"schema'),
                              (feed.topics.nvml, b'{"schema')])
    assert all(dict(d.headers())["reason"] == b"malformed" for d in dead)
    # The good messages around them still count.
    wait_for(lambda: sum_of(influx_url, "launches", "count", "ok:400", t0, host=host) == 2,
             60, "the good launches", worker)
    def dead_letters() -> int:
        found = rows(influx_url, f"SELECT last(dead_letters) FROM streams"
                                 f" WHERE worker = 'w1' AND time >= {t0}")
        return int(found[0]["last"]) if found else 0

    assert wait_for(lambda: dead_letters() >= 5, 30, "worker metrics", worker)


@pytest.mark.kafka
def test_anomalies_and_memory_bound_fire_on_their_cases_only(
        kafka_bootstrap: str, influx_url: str, names: str, worker: StreamWorker) -> None:
    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-d"
    windows = 16
    t0 = past_window(windows + 10)
    feed.process(host, 500, 1, "loader:500")  # copies a lot, waits: memory-bound, then slower
    feed.process(host, 501, 1, "compute:501")  # many launches, few copies: steady
    for w in range(windows):
        base = t0 + w * W
        slow = w == 12
        feed.events(host, 500, 1, launches([base + i for i in range(10)], 500, 512, 256))
        # 20 H2D copies of 8 MiB, 25 ms each (half the window blocked); 4x slower once.
        feed.events(host, 500, 1, copies([base + 100 + i for i in range(20)], 500, H2D, 8 << 20,
                                         100_000_000 if slow else 25_000_000))
        feed.events(host, 501, 1, launches([base + i for i in range(1000)], 501, 1024, 256))
        feed.events(host, 501, 1, copies([base + 2000 + i for i in range(10)], 501, H2D,
                                         1 << 20, 400_000))
    feed.events(host, 501, 1, launches([t0 + (windows + 4) * W], 501, 1, 1))
    feed.flush()
    worker.start()
    wait_for(lambda: len(rows(influx_url, f"SELECT verdict FROM memory_bound"
                                          f" WHERE host = '{host}' AND job = 'loader:500'"))
             == windows, 90, "every window judged", worker)
    anomalies = rows(influx_url, f"SELECT * FROM bandwidth_anomaly WHERE host = '{host}'")
    assert [(r["time"] - t0, r["job"], r["kind"], r["direction_of_change"]) for r in anomalies] \
        == [(12 * W, "loader:500", "H2D", "low_bandwidth")]
    assert anomalies[0]["ratio"] == pytest.approx(0.25)
    verdicts = rows(influx_url, f"SELECT verdict, alert FROM memory_bound WHERE host = '{host}'"
                                f" GROUP BY job")
    loader = [r for r in verdicts if r["job"] == "loader:500"]
    compute = [r for r in verdicts if r["job"] == "compute:501"]
    assert all(r["verdict"] == 1 for r in loader) and len(loader) == windows
    assert [r["alert"] for r in loader][:4] == [0, 0, 1, 1]
    assert compute and all(r["verdict"] == 0 and r["alert"] == 0 for r in compute)
    alerts = read_topic(kafka_bootstrap, f"{names}.alerts.v1", timeout_s=30, expect=2)
    kinds = sorted((orjson.loads(a.value())["alert"], orjson.loads(a.value())["job"])
                   for a in alerts)
    assert kinds == [("bandwidth_anomaly", "loader:500"), ("memory_bound", "loader:500")]


@pytest.mark.kafka
def test_report_and_compare_read_back_a_job(kafka_bootstrap: str, influx_url: str,
                                            names: str, worker: StreamWorker) -> None:
    from gpuflight.streams import report
    from gpuflight.streams.settings import InfluxSettings

    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-r"
    t0 = past_window(40)
    feed.process(host, 600, 1, "unfused:600")
    feed.process(host, 601, 1, "fused:601")
    for w in range(4):
        base = t0 + w * W
        feed.events(host, 600, 1, launches([base + i for i in range(800)], 600, 32, 256))
        feed.events(host, 601, 1, launches([base + i for i in range(100)], 601, 512, 256))
    feed.events(host, 601, 1, launches([t0 + 10 * W], 601, 512, 256))
    feed.flush()
    worker.start()
    wait_for(lambda: sum_of(influx_url, "launches", "count", "fused:601", t0, host=host) == 401,
             90, "both jobs", worker)
    influx = InfluxSettings(url=influx_url)
    since, until = t0 - W, time.time_ns()
    a = report.job_summary(influx, "unfused:600", since, until)
    b = report.job_summary(influx, "fused:601", since, until)
    assert (a.launches, a.active_windows, a.window_s) == (3200, 4, 1.0)
    assert (b.launches, b.active_windows) == (401, 5)
    # Active time: the windows, less the idle end of the last (the bursts open each window).
    assert a.active_s == pytest.approx(3.0) and b.active_s == pytest.approx(4.0)
    assert a.launch_rate == pytest.approx(3200 / 3) and b.launch_rate == pytest.approx(100.25)
    assert aggregate.bucket_of(round(a.grid_blocks_p50 or 0)) == 5
    assert aggregate.bucket_of(round(b.grid_blocks_p50 or 0)) == 9
    table = report.render_compare(a, b)
    assert "0.09x" in table.splitlines()[4]  # the launch-rate row: 100.25 / 1066.7
    assert "32-63" in table and "512-1,023" in table
    assert orjson.loads(report.render_json([a]))[0]["launches"] == 3200
    with pytest.raises(UsageError, match="no data for job 'nobody'"):
        report.job_summary(influx, "nobody", since, until)


@pytest.mark.kafka
def test_the_report_counts_what_the_trace_summary_counts(kafka_bootstrap: str, influx_url: str,
                                                         names: str,
                                                         worker: StreamWorker) -> None:
    """One stream with captured launches, graph launches, failed calls, syncs and copies,
    published as the producer does: what `gpuflight report` reads back from InfluxDB is what
    the trace summary (the same counting core) counts of the same events."""
    from gpuflight.streams import report
    from gpuflight.streams.settings import InfluxSettings

    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-c"
    t0 = past_window(30)
    events = synthetic_events(t0)  # three windows
    job = "graphs:100"
    for pid in SYNTHETIC_PIDS:
        feed.process(host, pid, 1, job)
    slices = events["ts_ns"] // np.uint64(W // 4)
    for piece in np.unique(slices).tolist():  # a message per process and quarter second
        mine = events[slices == piece]
        for pid in np.unique(mine["pid"]).tolist():
            feed.events(host, pid, 1, mine[mine["pid"] == pid])
    feed.events(host, 100, 1, launches([t0 + 10 * W], 100, 1, 1))  # the others close
    feed.flush()
    worker.start()
    trace = Summary()
    trace.add(events)
    influx = InfluxSettings(url=influx_url)

    def read() -> report.JobSummary | None:
        try:
            got = report.job_summary(influx, job, t0, t0 + 5 * W)
        except UsageError:  # nothing of the job written yet
            return None
        # The report reads one measurement after another, each complete or not yet: done
        # when every one it is checked on below has all the windows.
        done = (got.launches, got.errors, sum(got.launches_by_api.values()),
                sum(d["launches"] for d in got.devices.values())) == (
            trace.launches, trace.failed_calls, trace.counts.all_launches, trace.launches)
        return got if done and got.peak_live_bytes is not None else None

    got = wait_for(read, 90, "the job's windows", worker)
    assert got.launches == trace.launches == SYNTHETIC_KERNEL_LAUNCHES
    assert got.captured_launches == trace.captured_launches > 0
    assert got.graph_launches == trace.graph_launches > 0
    assert got.graph_kernel_nodes == trace.graph_kernels > 0
    assert got.errors == trace.failed_calls > 0
    assert got.launches_by_api == {f"{layer}/{api}": n
                                   for (layer, api), n in trace.counts.launches.items()}
    assert (got.sync_ns, got.copy_ns) == (trace.counts.total_sync_ns, trace.counts.copy_sync_ns)
    assert got.copies == {kind: {"count": c.count, "bytes": c.bytes, "sync_bytes": c.sync_bytes,
                                 "sync_ns": c.sync_ns} for kind, c in trace.copies.items()}
    assert (got.alloc_bytes, got.peak_live_bytes) == (trace.alloc_bytes, trace.peak_live_bytes)
    # one device (the synthetic events name none: device 0), its sums the job's
    assert got.devices == {"0": {
        "launches": trace.launches, "copies": sum(c.count for c in trace.copies.values()),
        "bytes": sum(c.bytes for c in trace.copies.values()),
        "syncs": sum(trace.counts.sync_count.values()), "sync_ns": trace.counts.total_sync_ns,
        "copy_ns": trace.counts.copy_sync_ns, **{k: c.bytes for k, c in trace.copies.items()}}}
    shown = report.render_job(got)
    assert "CPU blocked on the GPU " not in shown.split("top kernels")[-1]  # no device table
    assert re.search(rf"^captured into graphs\s+{trace.captured_launches}$", shown, re.MULTILINE)
    assert re.search(rf"^failed calls\s+{trace.failed_calls}$", shown, re.MULTILINE)


def test_the_report_keeps_each_hosts_devices_apart(influx_url: str) -> None:
    """A job on two hosts: their device 0s are two GPUs, so the report keys devices by host."""
    from gpuflight.streams import report
    from gpuflight.streams.settings import InfluxSettings
    from tests.support.grafana_scenarios import write_points

    t0 = past_window(600)
    points: list[m.Point] = []
    for host, devices in (("node-a", (0,)), ("node-b", (0, 1))):
        agg = aggregate.WindowAggregate(t0, host, "mpi:7")
        for device in devices:
            batch = launches([t0 + 10 + device, t0 + 20 + device], 7, 8, 32)
            batch["device"] = device
            aggregate.add_events(agg, batch)
        points += aggregate.to_points(agg, 1.0)
    write_points(influx_url, "gpuflight", points)
    got = report.job_summary(InfluxSettings(url=influx_url), "mpi:7", t0, t0 + W)
    assert {d: c["launches"] for d, c in got.devices.items()} == {
        "node-a/0": 2, "node-b/0": 2, "node-b/1": 2}
    alone = report.job_summary(InfluxSettings(url=influx_url), "mpi:7", t0, t0 + W,
                               host="node-b")
    assert {d: c["launches"] for d, c in alone.devices.items()} == {"0": 2, "1": 2}


@pytest.mark.kafka
def test_lost_events_reach_their_job_and_its_report(kafka_bootstrap: str, influx_url: str,
                                                     names: str, worker: StreamWorker) -> None:
    """The producer's drops by pid become the job's `events_lost`, and the report counts the
    rise of the counters in its range: across a producer restart, and from before the range."""
    from gpuflight.streams import report
    from gpuflight.streams.settings import InfluxSettings

    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-l"
    t0 = past_window(40)
    feed.process(host, 700, 1, "lossy:700")
    feed.process(host, 701, 1, "lossy:701")  # another job; pid 777 is known to no one
    feed.events(host, 700, 1, launches([t0 + i for i in range(50)], 700, 32, 256))
    feed.events(host, 700, 1, launches([t0 + 10 * W], 700, 32, 256))  # closes the first

    def metrics(at_ns: int, kernel: dict[int, int], user: dict[int, int],
                died: dict[int, int] | None = None) -> None:
        feed.metrics(host, at_ns, kernel, user, died)

    metrics(t0 - 5 * W, {700: 100}, {})                   # before the report's range
    metrics(t0 + 1 * W, {700: 250, 701: 9, 777: 4}, {700: 2})
    metrics(t0 + 2 * W, {700: 400, 701: 9, 777: 4}, {700: 2})
    metrics(t0 + 3 * W, {700: 50}, {}, {700: 7})          # restarted: 7 the killed one held
    feed.flush()
    worker.start()
    query = f"SELECT * FROM {m.EVENTS_LOST.name} WHERE host = '{host}'"
    wait_for(lambda: len(rows(influx_url, query)) == 8, 90, "events_lost points", worker)
    wait_for(lambda: sum_of(influx_url, "launches", "count", "lossy:700", t0, host=host) == 51,
             90, "the job's launches", worker)
    found = rows(influx_url, query + " GROUP BY job")
    by_job: dict[str, list[tuple[int, int, int]]] = {}
    for r in found:
        by_job.setdefault(r["job"], []).append((r["dropped_kernel"], r["dropped_user"],
                                                r["dropped_agent_died"] or 0))
    assert by_job == {"lossy:700": [(100, 0, 0), (250, 2, 0), (400, 2, 0), (50, 0, 7)],
                      "lossy:701": [(9, 0, 0), (9, 0, 0)],
                      "unknown:777": [(4, 0, 0), (4, 0, 0)]}
    summary = report.job_summary(InfluxSettings(url=influx_url), "lossy:700", t0, time.time_ns())
    assert (summary.lost_kernel, summary.lost_user, summary.lost_agent_died) == (300 + 50, 2, 7)
    shown = report.render_job(summary)
    assert "lost 359 events of this job" in shown
    assert "7 captured by a producer that was killed" in shown
    whole = report.job_summary(InfluxSettings(url=influx_url), "lossy:700", t0 - 10 * W,
                               time.time_ns())
    assert whole.lost_kernel == 400 + 50 and whole.launches == 51
    only_lost = report.job_summary(InfluxSettings(url=influx_url), "unknown:777", t0,
                                   time.time_ns())
    assert (only_lost.launches, only_lost.lost_kernel) == (0, 4)


@pytest.mark.kafka
def test_a_process_without_identity_holds_up_no_other_job(kafka_bootstrap: str, influx_url: str,
                                                         names: str, tmp_path: Path) -> None:
    """A batch whose process has no identity yet is parked, not waited for: the next host of
    its partition is written and closed meanwhile; the batch reaches its job once the
    identity comes, exactly (not the unknown-job fallback, which comes only after the wait)."""
    feed = Feed(kafka_bootstrap, names)
    waiting, steady = hosts_on_every_partition(names, feed.partitions, 2)[:2]  # one partition
    t0 = past_window(30)
    feed.events(waiting, 999, 5, launches([t0 + i for i in range(7)], 999, 8, 32))  # first
    feed.events(waiting, 999, 5, launches([t0 + 5 * W], 999, 8, 32))
    feed.process(steady, 300, 1, "steady:300")
    feed.events(steady, 300, 1, launches([t0 + i for i in range(20)], 300, 8, 32))
    feed.events(steady, 300, 1, launches([t0 + 5 * W], 300, 8, 32))  # closes window 0
    feed.flush()
    assert feed.event_partitions[waiting] == feed.event_partitions[steady]
    worker = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path,
                          extra=("--identity-wait", "600"))  # a wait the test would notice
    try:
        worker.start()
        wait_for(lambda: rows(influx_url, f"SELECT verdict FROM memory_bound"
                                          f" WHERE host = '{steady}' AND time = {t0}"),
                 90, "the steady job's first window closed", worker)
        steady_first = rows(influx_url, f"SELECT count FROM launches WHERE host = '{steady}'"
                                        f" AND time = {t0}")
        assert [r["count"] for r in steady_first] == [20]
        assert rows(influx_url, f"SELECT * FROM launches WHERE host = '{waiting}'") == []
        feed.process(waiting, 999, 5, "late:999")
        feed.flush()
        wait_for(lambda: rows(influx_url, f"SELECT verdict FROM memory_bound"
                                          f" WHERE host = '{waiting}' AND time = {t0}"),
                 90, "the parked job's first window closed", worker)
        first = rows(influx_url, f"SELECT count FROM launches WHERE host = '{waiting}'"
                                 f" AND time = {t0} GROUP BY job")
        assert [(r["job"], r["count"]) for r in first] == [("late:999", 7)]
        assert "no identity for" not in worker.output()
    finally:
        worker.stop()


@pytest.mark.kafka
def test_event_types_reach_their_measurements(kafka_bootstrap: str, influx_url: str,
                                              names: str, worker: StreamWorker) -> None:
    """Allocations, frees, syncs and graph launches: memory, syncs, launches by api."""
    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-e"
    t0 = past_window(30)
    feed.process(host, 700, 1, "mem:700")
    events = np.zeros(4, dtype=EVENT_DTYPE)
    events["pid"] = 700
    events["ts_ns"] = [t0 + 1, t0 + 2, t0 + 3, t0 + 4]
    events["flags"] = F_HAS_RESULT
    events[0]["type"], events[0]["api"], events[0]["bytes"] = (
        EventType.ALLOC, API_IDS["cudaMalloc"], 1 << 30)
    events[0]["handle"] = 0xD000
    events[1]["type"], events[1]["api"], events[1]["duration_ns"] = (
        EventType.SYNC, API_IDS["cudaDeviceSynchronize"], 5_000_000)
    events[1]["dim"][0] = 2
    events[2]["type"], events[2]["api"] = EventType.GRAPH_LAUNCH, API_IDS["cudaGraphLaunch"]
    events[2]["flags"] = 0
    events[2]["dim"][0] = 12
    events[3]["type"], events[3]["api"], events[3]["bytes"] = (
        EventType.ALLOC, API_IDS["cudaMalloc"], 1 << 20)
    feed.events(host, 700, 1, events)
    feed.events(host, 700, 1, launches([t0 + 5 * W], 700, 1, 1))
    feed.flush()
    worker.start()
    memory = wait_for(lambda: rows(influx_url, f"SELECT * FROM memory WHERE host = '{host}'"
                                               f" AND time = {t0}"), 90, "memory", worker)
    assert memory[0]["alloc_count"] == 2 and memory[0]["live_bytes"] == (1 << 30) + (1 << 20)
    graph = rows(influx_url, f"SELECT count, graph_kernel_nodes FROM launches"
                             f" WHERE host = '{host}' AND api = 'cudaGraphLaunch'")
    assert [(r["count"], r["graph_kernel_nodes"]) for r in graph] == [(1, 12)]
    syncs = rows(influx_url, f"SELECT count, sync_ns FROM syncs WHERE host = '{host}'"
                             f" GROUP BY scope")
    assert [(r["scope"], r["count"], r["sync_ns"]) for r in syncs] == [("device", 1, 5_000_000)]


@pytest.mark.kafka
def test_two_workers_share_the_partitions_exactly(kafka_bootstrap: str, influx_url: str,
                                                  names: str, tmp_path: Path) -> None:
    feed = Feed(kafka_bootstrap, names)
    t0 = past_window(60)
    hosts = hosts_on_every_partition(names, feed.partitions, 2)  # each worker gets hosts
    windows, messages, per_message = 12, 4, 300

    def publish(first_window: int) -> None:
        for host in hosts:
            feed.process(host, 800, 1, "shared:800")
            for w in range(first_window, first_window + windows // 2):
                for k in range(messages):
                    base = t0 + w * W + k * 1000
                    feed.events(host, 800, 1, launches([base + i for i in range(per_message)],
                                                       800, 16, 64))
        feed.flush()

    first = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path,
                         extra=("--metrics-interval", "1"))
    second = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path,
                          extra=("--metrics-interval", "1"))
    publish(0)
    assert {p for parts in feed.event_partitions.values() for p in parts} == \
        set(range(feed.partitions)), f"a partition has no host: {feed.event_partitions}"
    first.start("one")
    second.start("two")  # joins while the first is at work: a rebalance mid-stream

    def took(name: str) -> int:
        found = rows(influx_url, f"SELECT max(messages) FROM streams WHERE worker = '{name}'"
                                 f" AND time >= {t0}")
        return int(found[0]["max"]) if found else 0

    try:
        wait_for(lambda: took("one") and took("two"), 90, "both workers running", second)
        events_topic = wire.Topics.with_prefix(names).events
        owned = wait_for(lambda: [m for m in group_assignment(
            kafka_bootstrap, f"{names}-app", events_topic) if m], 60,
            "the group settled: each worker owns partitions", second)
        assert len(owned) == 2, owned
        publish(windows // 2)  # every partition has hosts
        want = windows * messages * per_message

        def complete() -> bool:
            return all(sum_of(influx_url, "launches", "count", "shared:800", t0, host=host)
                       == want for host in hosts)

        wait_for(complete, 120, "all launches of every host", first)
        for host in hosts:
            per_window = rows(influx_url, f"SELECT count FROM launches WHERE host = '{host}'")
            assert [r["count"] for r in per_window] == [messages * per_message] * windows
        events = {name: rows(influx_url, f"SELECT max(events) FROM streams"
                                         f" WHERE worker = '{name}' AND time >= {t0}")
                  for name in ("one", "two")}
        assert all(found and found[0]["max"] > 0 for found in events.values()), events
    finally:
        first.stop()
        second.stop()


@pytest.mark.kafka
def test_influxdb_away_then_back_loses_nothing(kafka_bootstrap: str, names: str,
                                               tmp_path: Path) -> None:
    """InfluxDB is down when the worker starts: it retries with backoff, holds at most a few
    points, stops taking messages, and once InfluxDB is up everything arrives exactly."""
    from gpuflight import stack
    from tests.support.influx_fixture import DATABASE

    port = stack.free_port()
    url = f"http://127.0.0.1:{port}"
    worker = StreamWorker(kafka_bootstrap, url, names, f"{names}-app", tmp_path / "w",
                          extra=("--max-pending-points", "20"))
    (tmp_path / "w").mkdir()
    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-o"
    t0 = past_window(40)
    feed.process(host, 900, 1, "outage:900")
    windows = 20
    for w in range(windows):
        feed.events(host, 900, 1, launches([t0 + w * W + i for i in range(50)], 900, 4, 32))
    feed.flush()
    worker.start()
    try:
        # The worker is up, InfluxDB is not: its writes fail and are retried.
        wait_for(lambda: "unreachable" in worker.output(), 60, "a failed write", worker)
        assert worker.process is not None and worker.process.poll() is None, worker.output()
        stack.influx_up(tmp_path / "influx", port)
        stack.create_database(url, DATABASE)
        wait_for(lambda: sum_of(url, "launches", "count", "outage:900", t0, host=host)
                 == windows * 50, 120, "every launch after the outage", worker)
        per_window = rows(url, f"SELECT count FROM launches WHERE host = '{host}'")
        assert [r["count"] for r in per_window] == [50] * windows
        assert "unreachable" in worker.output()
    finally:
        worker.stop()
        stack.influx_down(tmp_path / "influx")


@pytest.mark.kafka
def test_a_writer_that_dies_on_a_defect_ends_the_worker_in_one_line(
        kafka_bootstrap: str, influx_url: str, names: str, tmp_path: Path) -> None:
    """A defect in the InfluxDB writer (an error it does not retry) ended its task and nothing
    else: the worker went on taking messages whose points waited for ever. It now stops, as a
    supervisor would stop it, and says why in one line."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "from gpuflight.streams import sink\n"
        "async def _write(self, write_api, lines):\n"
        "    raise RuntimeError('injected writer defect')\n"
        "sink.InfluxSink._write = _write\n")
    worker = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path,
                          extra=("--metrics-interval", "0.5"),
                          env={"PYTHONPATH": f"{inject}{os.pathsep}{REPO}"})
    worker.start()
    try:
        assert worker.process is not None
        code = worker.process.wait(120)
    finally:
        worker.stop()
    output = worker.output()
    assert code == 70, output[-3000:]
    assert "InfluxDB sink stopped on RuntimeError: injected writer defect" in output, output
    assert output.rstrip().splitlines()[-1] == (
        "gpuflight: internal error: RuntimeError: the InfluxDB writer stopped on RuntimeError:"
        " injected writer defect (rerun with -v)"), output[-3000:]
    assert "Traceback" not in output, output[-3000:]


@pytest.mark.kafka
@pytest.mark.parametrize("then", ["nothing", "another"])
def test_a_message_that_never_reaches_the_agent_is_read_again(
        then: str, kafka_bootstrap: str, influx_url: str, names: str, tmp_path: Path) -> None:
    """Faust's consumer hands the agent what its fetcher took; a message taken from the broker
    and never handed over (injected here: the second message of the events topic is dropped)
    was lost for good: its host's windows closed on the wall clock without its launches. Now,
    with `nothing` after it, the worker sees its partition's messages wait untaken while it
    takes others (ticks) and says so with what the consumer knows of the partition; with
    `another` after it, it sees the gap in the offsets at once. Either way it reads the
    partition again from the message lost."""
    worker = dropping_worker(kafka_bootstrap, influx_url, names, tmp_path, nth=2)
    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-s"
    t0 = past_window(120)
    feed.process(host, 410, 1, "stalled:410")
    feed.events(host, 410, 1, launches([t0 + w * W for w in range(3)], 410, 8, 64))
    feed.flush()
    worker.start()
    try:
        wait_for(lambda: sum_of(influx_url, "launches", "count", "stalled:410", t0, host=host)
                 == 3, 90, "the first message's launches counted", worker)
        feed.events(host, 410, 1, launches([t0 + w * W for w in range(3, 8)], 410, 8, 64))
        if then == "another":
            feed.events(host, 410, 1, launches([t0 + w * W for w in range(8, 10)], 410, 8, 64))
        feed.flush()
        total = 10 if then == "another" else 8
        wait_for(lambda: sum_of(influx_url, "launches", "count", "stalled:410", t0, host=host)
                 == total, 90, "the dropped message's launches counted", worker)
    finally:
        worker.stop()
    output = worker.output()
    dropped = re.search(r"injected: offset (\d+) dropped", output)
    assert dropped, output[-3000:]
    said = re.search(r"partition \d+ of .*\.events\.v1: 1 messages waited \d+ s untaken "
                     r"\(paused by Faust: False, .*\); reading it again from offset (\d+)"
                     if then == "nothing" else
                     r"partition \d+ of .*\.events\.v1: offsets (\d+)-\1 never reached the"
                     r" worker; reading it again from offset \1", output)
    assert said and said.group(1) == dropped.group(1), output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def dropping_worker(kafka_bootstrap: str, influx_url: str, names: str, tmp_path: Path,
                    nth: int) -> StreamWorker:
    """A worker whose Faust consumer never hands its agent the `nth` message it takes of the
    events topic (as Faust drops what its fetcher took for a partition not active yet)."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import sys\n"
        "from faust.transport import consumer\n"
        "_getmany = consumer.Consumer.getmany\n"
        "_seen = []\n"
        "async def getmany(self, timeout):\n"
        "    async for tp, message in _getmany(self, timeout):\n"
        "        if tp.topic.endswith('.events.v1'):\n"
        "            _seen.append(message.offset)\n"
        f"            if len(_seen) == {nth}:\n"
        "                print(f'injected: offset {message.offset} dropped', file=sys.stderr)\n"
        "                continue\n"
        "        yield tp, message\n"
        "consumer.Consumer.getmany = getmany\n")
    return StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path,
                        extra=("--stall-after", "3", "--idle", "2"),
                        env={"PYTHONPATH": f"{inject}{os.pathsep}{REPO}"})


@pytest.mark.kafka
def test_the_first_message_of_a_partition_never_committed_is_read_again(
        kafka_bootstrap: str, influx_url: str, names: str, tmp_path: Path) -> None:
    """A partition the group never committed: Faust's seek after the assignment leaves it
    where its fetcher got to, so a message the fetcher took before the partition was active
    (Faust drops those) never came again, and the stall watch, knowing no offset to expect,
    said nothing (a CI run lost a test's two messages so: test_secure_transport, 2026-12-06).
    The watch now expects the partition's log start, and reads the partition again from it."""
    worker = dropping_worker(kafka_bootstrap, influx_url, names, tmp_path, nth=1)
    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-f"
    t0 = past_window(120)
    feed.process(host, 411, 1, "first:411")
    feed.events(host, 411, 1, launches([t0 + w * W for w in range(3)], 411, 8, 64))
    feed.flush()
    worker.start()
    try:
        wait_for(lambda: sum_of(influx_url, "launches", "count", "first:411", t0, host=host)
                 == 3, 90, "the first message's launches counted", worker)
    finally:
        worker.stop()
    output = worker.output()
    dropped = re.search(r"injected: offset (\d+) dropped", output)
    assert dropped and dropped.group(1) == "0", output[-3000:]
    said = re.search(r"partition \d+ of .*\.events\.v1: 1 messages waited \d+ s untaken "
                     r"\(.*\); reading it again from offset (\d+)", output)
    assert said and said.group(1) == "0", output[-3000:]
    assert "Traceback" not in output, output[-3000:]


@pytest.mark.kafka
def test_a_job_that_was_one_process_is_forgotten_once_it_exited(
        kafka_bootstrap: str, influx_url: str, names: str, worker: StreamWorker) -> None:
    """Short-lived processes are as many COMM:PID jobs: once the agent says a process exited
    (its record again, with exited_ns) and its host's time is settings.forget_ended_after_s
    past that, its state is forgotten (a tombstone on the table's changelog) — after its
    windows are written. Kept for forget_idle_s (an hour) before, the soak's worker grew 96 MiB
    an hour with 3 processes a second. A process that lives on keeps its state."""
    from gpuflight.streams.app import TABLE
    from gpuflight.streams.windows import state_key

    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-x"
    t0 = past_window(300)
    feed.process(host, 901, 1, "short:901")
    feed.process(host, 902, 1, "long:902")
    feed.events(host, 901, 1, launches([t0 + i for i in range(5)], 901, 8, 32))
    feed.events(host, 902, 1, launches([t0 + i for i in range(3)], 902, 8, 32))
    feed.exited(host, 901, 1, "short:901", t0 + W)
    # The host's time goes on (the process that lives): past the exit by more than 60 s.
    feed.events(host, 902, 1, launches([t0 + 62 * W], 902, 8, 32))
    feed.flush()
    worker.start()
    changelog = f"{names}-app-{TABLE}-changelog"

    def tombstones() -> set[bytes]:
        return {msg.key() for msg in read_topic(kafka_bootstrap, changelog, timeout_s=2)
                if msg.value() is None}

    wait_for(lambda: state_key(host, "short:901") in tombstones(), 90,
             "the ended job's state forgotten", worker)

    def counts() -> dict[str, int]:
        return {r["job"]: r["n"] for r in rows(
            influx_url, f"SELECT sum(count) AS n FROM launches WHERE host = '{host}' GROUP BY job")}

    wait_for(lambda: counts() == {"short:901": 5, "long:902": 4}, 90,
             "every launch written", worker)
    assert state_key(host, "long:902") not in tombstones()


# -- the worker's logic, without services (tests/support/streams_support.py: Harness) -------


def request(request_id: int, end_ns: int, gpu_ns: float = 1000.0) -> wire.RequestRecord:
    return wire.RequestRecord(request_id, 1, "GET", "/infer", "/infer", 200, end_ns - 10**6,
                              end_ns, 100, 200, None, None, True, 8080, {"gpu_ns": gpu_ns})


def live_stream(harness: Harness, host: str, pid: int, t0: int, seconds: int, *,
                forged: dict[int, tuple[np.ndarray, list[wire.RequestRecord]]]) -> int:
    """A host's process as a producer sends it: a message every quarter second (each a
    launch every millisecond), the tick after each; at step i, `forged[i]` instead. Events
    of the real messages counted."""
    sent = 0
    for i in range(seconds * 4):
        start = t0 + i * W // 4
        events, requests = forged.get(i, (launches(
            [start + k * 1_000_000 for k in range(250)], pid, 8, 64), []))
        harness.events(host, pid, 1, events, requests=requests)
        harness.tick()
        sent += len(events) if i not in forged else 0
    return sent


@pytest.mark.kafka
@pytest.mark.parametrize("ahead_s", [86_400, 290])
def test_one_request_ending_ahead_closes_no_window_of_its_host(ahead_s: int) -> None:
    """A forged request end a day ahead moved its host's clock (only event times were
    checked): 75.5 % of the host's events were then late, and a job started on the host two
    minutes later lost 94.4 %. Now a request ending beyond --max-future (300 s) is not counted
    (dead letter, reason "future"), and one within it moves no clock on its own."""
    harness = Harness()
    host, t0 = "h-req", (time.time_ns() // W - 600) * W
    harness.process(host, 10, 1, "serve:10")
    harness.process(host, 11, 1, "later:11")
    forged = request(1, time.time_ns() + ahead_s * W)
    sent = live_stream(harness, host, 10, t0, 20, forged={
        8: (launches([t0 + 2 * W], 10, 8, 64), [forged, request(2, t0 + 2 * W)])})
    sent += live_stream(harness, host, 11, t0 + 120 * W, 20, forged={})  # 2 minutes later
    stats = harness.worker.stats
    assert (stats.late_events, stats.late_requests) == (0, 0)
    assert stats.events == sent + 1
    if ahead_s > harness.settings.max_future_s:
        assert stats.future_requests == 1 and stats.requests == 1
        ((reason, value),) = harness.dead_letters()
        assert reason == b"future"
        assert [r.request_id for r in wire.decode_events(value).requests] == [1]
    else:
        assert stats.requests == 2 and harness.dead_letters() == []


@pytest.mark.kafka
def test_one_event_just_under_the_future_bound_closes_no_window() -> None:
    """An event 290 s ahead (under --max-future, so counted) made 75.9 % of its host's events
    late: one message no longer moves its host's clock, whatever it is stamped — nor after a
    restart, when the host's clock comes back from the job states."""
    harness = Harness()
    host, t0 = "h-ev", (time.time_ns() // W - 600) * W
    harness.process(host, 20, 1, "train:20")
    ahead = time.time_ns() + 290 * W
    sent = live_stream(harness, host, 20, t0, 10, forged={
        12: (launches([t0 + 3 * W, ahead], 20, 8, 64), [])})
    assert harness.worker.stats.late_events == 0
    counted = harness.worker.stats.events
    assert counted == sent + 2
    harness = harness.restart()
    harness.process(host, 20, 1, "train:20")
    sent = live_stream(harness, host, 20, t0 + 10 * W, 20, forged={})
    stats = harness.worker.stats
    assert (stats.late_events, stats.future_events) == (0, 0)
    assert stats.events == sent


@pytest.mark.kafka
def test_one_bad_point_freezes_no_partition() -> None:
    """A message with an empty host, or a price that makes a cost infinite (`--prices` with
    inf), raised inside the tick: the tick was dead-lettered, and every later job of the
    partition was no longer written. The message is refused at decode now, a cost that is no
    number is no cost (the GPU time is written unpriced), and a point that still breaks the
    contract is not written, alone."""
    import math

    from gpuflight.producer.contract.pricing import PriceBook

    harness = Harness(prices=PriceBook({"H100": math.inf}), gpu_model="H100")
    t0 = (time.time_ns() // W - 60) * W
    empty = orjson.loads(wire.encode_events(wire.EventBatch("x", 1, 1, launches([t0], 1, 8, 8))))
    empty["host"] = ""
    harness.process("", 1, 1, "x:1")  # its identity is known: it reached a job state
    harness.raw(orjson.dumps(empty))
    harness.process("priced", 30, 1, "serve:30")
    harness.events("priced", 30, 1, launches([t0 + 1], 30, 8, 8), requests=[request(5, t0 + 2)])
    harness.process("plain", 31, 1, "train:31")
    for second in range(5):
        harness.events("plain", 31, 1, launches([t0 + second * W + 5], 31, 8, 8))
        harness.tick()
    for second in (3, 4):  # what closes its first window: two later messages
        harness.events("priced", 30, 1, launches([t0 + second * W], 30, 8, 8))
    for _ in range(3):
        harness.tick()
    launched = {(p.tags["host"], p.time_ns) for p in harness.points("launches")}
    assert {("plain", t0 + s * W) for s in range(3)} <= launched
    assert ("priced", t0) in launched
    assert [reason for reason, _ in harness.dead_letters()] == [b"malformed"]  # no tick
    assert harness.worker.stats.tick_errors == 0
    (cost,) = {p.fields["unpriced_gpu_ns"] for p in harness.points("job_cost")}
    assert cost == 1000.0
    assert all(p.tags["host"] for p in harness.points())


# -- what one message may cost the stream, with Kafka's limits ------------------------------


def varied_launches(t0: int, n: int, pid: int) -> np.ndarray:
    """`n` launches of a process spread over two seconds, with as varied columns as a real
    capture has (so its message is as large: ~30 bytes an event)."""
    rng = np.random.default_rng(pid)
    events = launches(sorted((t0 + rng.integers(0, 2 * W, n)).tolist()), pid, 8, 64)
    events["tid"] = pid + rng.integers(0, 64, n)
    events["handle"] = 0x7F00_0000_0000 + rng.integers(0, 1 << 24, n)
    events["dim"][:, 0] = rng.integers(1, 1 << 16, n)
    return events


@pytest.mark.kafka
def test_a_parked_message_over_the_broker_limit_survives_a_restart(
        kafka_bootstrap: str, influx_url: str, names: str, tmp_path: Path) -> None:
    """A message waiting for its identity is kept in the worker's table: it was one changelog
    record, which the broker refuses over 1 MB (a real 100k-event message is 6.5 MB). After a
    restart its 40,000 events were gone, and no dead letter said so."""
    from gpuflight.streams.app import TABLE
    from gpuflight.streams.parking import is_parked_key
    from tests.support.streams_support import all_committed

    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-p"
    t0 = past_window(60)
    events = varied_launches(t0, 40_000, 950)
    assert len(wire.encode_events(wire.EventBatch(host, 950, 5, events))) > 1_200_000
    feed.events(host, 950, 5, events)  # no identity yet: parked
    feed.flush()
    worker = StreamWorker(kafka_bootstrap, influx_url, names, f"{names}-app", tmp_path,
                          env=RESTARTS_SOON, extra=("--identity-wait", "600"))
    changelog = f"{names}-app-{TABLE}-changelog"
    try:
        worker.start("first")
        wait_for(lambda: all_committed(kafka_bootstrap, f"{names}-app", feed.topics.events),
                 90, "the parked message taken and committed", worker)
        wait_for(lambda: any(is_parked_key(msg.key()) and msg.value() for msg in read_topic(
            kafka_bootstrap, changelog, timeout_s=2)), 60, "the parked message kept", worker)
        worker.kill()
        worker.start("second")
        feed.process(host, 950, 5, "big:950")
        feed.flush()
        wait_for(lambda: sum_of(influx_url, "launches", "count", "big:950", t0, host=host)
                 == 40_000, 120, "every parked launch counted after the restart", worker)
        assert read_topic(kafka_bootstrap, f"{names}.deadletter.v1", timeout_s=2) == []
    finally:
        worker.stop()


@pytest.mark.kafka
def test_one_message_over_twenty_thousand_windows_stops_no_worker(
        kafka_bootstrap: str, influx_url: str, names: str, worker: StreamWorker) -> None:
    """One message spread over 20,000 windows made an 11.9 MB job state: its changelog record
    failed (ProducerSendError), the worker exited, and the message was not taken again. Now
    the message adds to max_windows_per_message windows, the rest of its events go to the
    dead letters (reason "windows"), and the job goes on."""
    from gpuflight.streams.windows import DEFAULT_MAX_WINDOWS_PER_MESSAGE as KEPT

    feed = Feed(kafka_bootstrap, names)
    host = f"{names}-s"
    t0 = past_window(25_000)
    feed.process(host, 960, 1, "spread:960")
    feed.events(host, 960, 1, launches([t0 + i * W for i in range(20_000)], 960, 8, 64))
    after = t0 + 20_010 * W
    for i in range(4):  # the job goes on
        feed.events(host, 960, 1, launches([after + i * W + k for k in range(10)], 960, 8, 64))
    feed.flush()
    worker.start()
    wait_for(lambda: sum_of(influx_url, "launches", "count", "spread:960", t0, host=host)
             == KEPT + 40, 120, "the kept windows and the job's next ones written", worker)

    def refused() -> int:
        dead = read_topic(kafka_bootstrap, f"{names}.deadletter.v1", timeout_s=2)
        assert {dict(d.headers())["reason"] for d in dead} <= {b"windows"}
        return sum(len(wire.decode_events(d.value()).events) for d in dead)

    wait_for(lambda: refused() == 20_000 - KEPT, 60, "the refused events dead-lettered", worker)
    wait_for(lambda: uncounted(influx_url, "spread:960") == (20_000 - KEPT, 0), 30,
             "the refused events counted as not counted", worker)
    assert worker.process is not None and worker.process.poll() is None, worker.output()[-3000:]
