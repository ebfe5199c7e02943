"""User-space cost of code paths in the capture loop: each process's events priced (the busy
model) and each sampled call's head joined to its event (producer/decode/pysamples.py), with
no HTTP, and with the requests each event was made for (per route and per request: issue 28).

    .venv/bin/python bench/path_join.py [--events N] [--batch N]

One process, N events on 8 threads (80 % launches, 10 % copies, 10 % syncs), in batches as
the capture hands them on; 8 stacks. Requests: 5 ms each on threads 1-7 (exact), thread 8 an
engine whose calls are shared by 3 requests in flight; 4 routes. Every call sampled, and 1 in
100. Medians of 5 runs; the cost is per event and per sampled call.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from gpuflight.producer.contract.abi import EVENT_DTYPE, F_ASYNC, F_HAS_RESULT, EventType  # noqa: E402
from gpuflight.producer.decode.pysamples import StackSamples, head_dtype, stack_dtype  # noqa: E402
from gpuflight.producer.http.attribution import call_shares  # noqa: E402

PID = 4242
DEPTH = 8


def events(n: int) -> np.ndarray:
    rng = np.random.default_rng(28)
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["pid"] = PID
    ev["ts_ns"] = np.arange(n, dtype=np.uint64) * 1000 + 10**9  # distinct: the join's key
    ev["tid"] = rng.integers(1, 9, n)
    kinds = rng.choice([EventType.LAUNCH, EventType.MEMCPY, EventType.SYNC], n, p=[.8, .1, .1])
    ev["type"] = kinds
    ev["flags"] = np.where(kinds == EventType.LAUNCH, F_ASYNC, F_HAS_RESULT)
    ev["duration_ns"] = np.where(kinds == EventType.SYNC, 20_000, 0)
    ev["dim"] = 1
    return ev


def shares(batch: np.ndarray) -> object:
    slot = (batch["ts_ns"].astype(np.int64) // 5_000_000) * 8
    tid = batch["tid"].astype(np.int64)
    request_id = np.where(tid < 8, slot + tid, 0).astype(np.uint64)
    request_set = np.where(tid == 8, 1, 0).astype(np.int64)
    first = int(slot[0]) + 1
    sets = (((first, 1 / 3), (first + 1, 1 / 3), (first + 2, 1 / 3)),)
    rids = {*np.unique(request_id[request_id > 0]).tolist(), first, first + 1, first + 2}
    return call_shares(request_id, request_set, sets, {r: f"/v1/r{r % 4}/{{id}}" for r in rids})


def run(ev: np.ndarray, batch: int, every: int, mode: str) -> float:
    samples = StackSamples(DEPTH, lambda pid: None, lambda pid: None)
    if mode != "trace":
        samples.publish()
    samples.per_request = mode == "requests"
    frames = np.zeros(8, stack_dtype(DEPTH))
    frames["pid"], frames["stack_id"], frames["depth"] = PID, np.arange(1, 9), 2
    frames["code"][:, :2] = 0x1000
    samples.add_frames(frames)
    calls = [shares(ev[i:i + batch]) if mode == "requests" else None
             for i in range(0, len(ev), batch)]
    heads = []
    for i in range(0, len(ev), batch):
        part = ev[i:i + batch][::every]
        h = np.zeros(len(part), head_dtype())
        h["pid"], h["tid"], h["ts_ns"] = PID, part["tid"], part["ts_ns"]
        h["stack_id"], h["weight"] = part["tid"], every
        heads.append(h)
    t = time.perf_counter()
    for k, i in enumerate(range(0, len(ev), batch)):
        samples.add_events(ev[i:i + batch], calls[k])  # type: ignore[arg-type]
        samples.add_samples(heads[k])
        samples.end_turn()
    samples.settle()
    if mode == "trace":
        samples.samples()
    else:
        samples.take_paths()
    elapsed = time.perf_counter() - t
    assert samples.unjoined == 0
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--batch", type=int, default=16_384)
    args = parser.parse_args()
    ev = events(args.events)
    print(f"{platform.node()} {platform.release()}, {platform.python_version()}, "
          f"{args.events:,} events in batches of {args.batch:,}")
    for every in (1, 100):
        for mode in ("trace", "publish", "requests"):
            took = statistics.median(run(ev, args.batch, every, mode) for _ in range(5))
            sampled = len(range(0, args.events, every)) if every == 1 else sum(
                len(range(0, min(args.batch, args.events - i), every))
                for i in range(0, args.events, args.batch))
            print(f"1 in {every:>3}, {mode:<8}: {took / args.events * 1e9:6.0f} ns an event, "
                  f"{took / sampled * 1e6:6.2f} us a sampled call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
