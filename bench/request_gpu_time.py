"""What request GPU time costs the capture loop: RequestTracker.attribute + take_answered per
batch (producer/http/requesttrack.py), GPU time from queued time and from NVML windows, side by
side.

    .venv/bin/python bench/request_gpu_time.py [--rounds 5] [--threads 8] [--seconds 1]

One process, `--threads` server threads serving requests of 5 ms back to back (HTTP records
built as the probes would report them), each request 10 launches and a sync; events in
batches of 100 ms, as the capture hands them on. With NVML: windows of a 10 ms sample period
(50 % SM) fed before each batch, NVML reported up to the batch's end. Rounds interleave the two
set-ups; medians. Prints one Markdown table row per set-up.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from gpuflight.producer.contract.abi import EVENT_DTYPE, F_ASYNC, F_HAS_RESULT, EventType  # noqa: E402
from gpuflight.producer.http.abi import HttpRecord  # noqa: E402
from gpuflight.producer.http.requesttrack import RequestTracker  # noqa: E402
from gpuflight.producer.nvml import UtilWindow  # noqa: E402
from tests.support.httpsim import Wire, response  # noqa: E402

PID = 4242
REQUEST_NS = 5_000_000
BATCH_NS = 100_000_000
PERIOD_NS = 10_000_000
T0 = 1_000_000_000


def workload(threads: int, seconds: float) -> tuple[list[HttpRecord], npt.NDArray[np.void]]:
    records: list[HttpRecord] = []
    rows = []
    per_thread = int(seconds * 1e9 // REQUEST_NS)
    for t in range(threads):
        w = Wire(pid=PID, tid=100 + t, conn_id=t + 1, fd=10 + t, now=T0, step=1000)
        w.accept()
        for i in range(per_thread):
            start = T0 + i * REQUEST_NS + 10_000
            w.now = start
            w.read(f"POST /v1/infer/{i} HTTP/1.1\r\nContent-Length: 0\r\n\r\n".encode())
            for k in range(10):
                rows.append((start + 10_000 + k * 100_000, 100 + t, EventType.LAUNCH, F_ASYNC, 0))
            rows.append((start + 1_200_000, 100 + t, EventType.SYNC, F_HAS_RESULT, 300_000))
            w.now = start + REQUEST_NS - 100_000
            w.write(response(200, b"{}"))
        records += w.records
    events = np.zeros(len(rows), dtype=EVENT_DTYPE)
    rows.sort()
    for i, (ts, tid, kind, flags, duration) in enumerate(rows):
        events[i]["ts_ns"], events[i]["tid"], events[i]["type"] = ts, tid, kind
        events[i]["flags"], events[i]["duration_ns"], events[i]["pid"] = flags, duration, PID
        events[i]["dim"] = [64, 1, 1, 256, 1, 1]
    return records, events


def run(records: list[HttpRecord], events: npt.NDArray[np.void], nvml: bool) -> float:
    """Seconds spent in the tracker for all the batches."""
    tracker = RequestTracker(0)
    tracker.feed(records)
    end = int(events["ts_ns"].max()) + 1
    spent = 0.0
    handed = 0
    for lo in range(T0, end, BATCH_NS):
        batch = events[(events["ts_ns"] >= lo) & (events["ts_ns"] < lo + BATCH_NS)]
        started = time.perf_counter()
        if nvml:
            windows = [UtilWindow(0, PID, s, s + PERIOD_NS, 50)
                       for s in range(lo, lo + BATCH_NS, PERIOD_NS)]
            tracker.feed_utilization(windows, lo + BATCH_NS)
        tracker.attribute(batch)
        for answered, _ in tracker.take_answered(before_ns=lo + BATCH_NS).values():
            handed += len(answered)
        spent += time.perf_counter() - started
    tracker.close()
    tracker.settle(force=True)
    handed += sum(len(a) for a, _ in tracker.take_answered().values())
    requests = sum(1 for r in records if r.head.startswith(b"POST"))
    assert handed == requests, (handed, requests)
    return spent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    records, events = workload(args.threads, args.seconds)
    times: dict[str, list[float]] = {"queued": [], "nvml": []}
    for _ in range(args.rounds):
        for name, values in times.items():
            values.append(run(records, events, name == "nvml"))
    print(f"{platform.node()} {platform.machine()} python {platform.python_version()}, "
          f"{len(events):,} events, {args.threads} threads, {args.rounds} rounds")
    print("| GPU time from | ms in the tracker per second of traffic | ns per event |")
    print("|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        per_event_ns = median * 1e9 / len(events)
        print(f"| {name} | {median * 1e3 / args.seconds:,.1f} | {per_event_ns:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
