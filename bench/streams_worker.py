"""Stream worker: events/s into InfluxDB per worker, and event-to-queryable delay.

    .venv/bin/python bench/streams_worker.py [--events N] [--live-s S]

Against a real local Kafka and InfluxDB (the stack's, on free ports in a temporary directory),
one `gpuflight streams` worker (window 1 s, grace 1 s):

1. Throughput: N launch-heavy events (as the producer publishes them: one message per
   process and flush, ~28k events each) over 60 past windows are in Kafka before the worker
   starts; the worker's own counter (the `streams` measurement, every second) gives the rate
   at which it took them, from its first report with events to the one with all of them.
2. Delay: a live feed (4 processes, a message each every 0.25 s, events stamped now); for each
   window, when its first point becomes queryable in InfluxDB, against the window's end. An
   event at a window's start is queryable window + that delay after it happened.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuflight import stack
from tests.support.streams_support import Feed, StreamWorker, launches, rows

W = 1_000_000_000
PER_MESSAGE = 28_000
PROCESSES = 4


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def throughput(feed: Feed, worker: StreamWorker, url: str, events: int) -> dict[str, float]:
    t0 = (time.time_ns() // W - 90) * W
    for p in range(PROCESSES):
        feed.process("bench-a", 1000 + p, 1, f"bench:{1000 + p}")
    sent = 0
    per_window = events // 60
    while sent < events:
        n = min(PER_MESSAGE, events - sent)
        p = (sent // PER_MESSAGE) % PROCESSES
        ts = t0 + (np.arange(sent, sent + n, dtype=np.int64) * W) // per_window
        feed.events("bench-a", 1000 + p, 1, launches(ts.tolist(), 1000 + p, 40, 256))
        sent += n
    feed.flush()
    worker.start("bench")
    assert worker.process is not None
    reports: list[tuple[int, int]] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        reports = [(r["time"], r["events"]) for r in rows(
            url, "SELECT events FROM streams WHERE worker = 'bench'")]
        if reports and reports[-1][1] >= events:
            break
        time.sleep(0.5)
    busy = [(t, n) for t, n in reports if n > 0]
    (t_first, n_first), (t_last, n_last) = busy[0], busy[-1]
    rate = (n_last - n_first) / ((t_last - t_first) / 1e9) if t_last > t_first else float("nan")
    return {"events": n_last, "events_per_s": rate, "rss_mib": _rss_mib(worker.process.pid)}


def delay(feed: Feed, url: str, live_s: float) -> list[float]:
    for p in range(PROCESSES):
        feed.process("bench-live", 2000 + p, 1, f"live:{2000 + p}")
    first_seen: dict[int, float] = {}
    windows: set[int] = set()
    end = time.monotonic() + live_s
    next_send = time.monotonic()
    while time.monotonic() < end + 4:
        now = time.monotonic()
        if now < end and now >= next_send:
            t = time.time_ns()
            for p in range(PROCESSES):
                feed.events("bench-live", 2000 + p, 1,
                            launches([t + i for i in range(1000)], 2000 + p, 40, 256))
            feed.flush()
            windows.add(t // W * W)
            next_send += 0.25
        for r in rows(url, "SELECT sum(count) FROM launches WHERE host = 'bench-live'"
                           " GROUP BY time(1s) fill(none)"):
            first_seen.setdefault(r["time"], time.time_ns() / 1e9)
        time.sleep(0.02)
    # Whole windows only (the first and last were fed in part).
    full = sorted(windows)[1:-1]
    return [first_seen[w] - (w + W) / 1e9 for w in full if w in first_seen]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3_000_000)
    parser.add_argument("--live-s", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuflight-bench-") as tmp:
        data = Path(tmp)
        kafka = stack.kafka_up(data, stack.free_port())
        influx = stack.influx_up(data, stack.free_port())
        stack.create_database(influx.url, "gpuflight")
        prefix = f"bench{time.time_ns() % 10**8}"
        feed = Feed(kafka.bootstrap, prefix, partitions=6)
        (data / "streams").mkdir()
        worker = StreamWorker(kafka.bootstrap, influx.url, prefix, f"{prefix}-app",
                              data / "streams", extra=("--metrics-interval", "1"))
        try:
            result = throughput(feed, worker, influx.url, args.events)
            delays = delay(feed, influx.url, args.live_s)
        finally:
            worker.stop()
            stack.influx_down(data)
            stack.kafka_down(data)
    print(f"{platform.node()} · {platform.platform()} · {time.strftime('%Y-%m-%d')}")
    print(tabulate([
        ["events taken by the worker", f"{result['events']:,.0f}"],
        ["events/s, one worker (its own counter)", f"{result['events_per_s']:,.0f}"],
        ["worker RSS (max)", f"{result['rss_mib']:,.0f} MiB"],
        ["windows measured live", f"{len(delays)}"],
        ["window end → first point queryable, median", f"{statistics.median(delays):.2f} s"
         if delays else "-"],
        ["… max", f"{max(delays):.2f} s" if delays else "-"],
    ], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
