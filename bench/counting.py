"""The counting core: events/s of the stream app's `add_events` and of the trace summary.

    .venv/bin/python bench/counting.py [--events N] [--rounds R] [--baseline REV]

Synthetic, deterministic event arrays (records.EVENT_DTYPE), counted in memory: no Kafka, no
InfluxDB, no BPF. Three workloads:

  streams launches  `add_events` on messages of 28,000 launches of one kernel, one process
                    (what bench/streams_worker.py feeds the worker), one window per 10 messages
  streams mixed     `add_events` on messages of 28,000 events of every type (40 kernels, 4 %
                    captured launches, graph launches, copies of every kind, memsets, allocations
                    and frees, syncs, 2 % failed calls)
  streams 8 devices the same mix, each event on one of 8 CUDA devices at random (a multi-GPU
                    job's threads: kernel launches, copies and syncs are counted per device)
  trace mixed       `Summary.add` on batches of 65,536 of the same mix (the capture loop's batch)

Each round times each workload 3 times in a fresh interpreter, in CPU time of its thread,
and keeps the best (timeit's rule); the table gives the median over rounds. With
`--baseline REV`, the same workloads run against a `git archive` of REV too, in separate
interpreters, interleaved round by round (alternating which goes first), and the table gives
the ratio of the medians (this tree / REV): measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MESSAGE = 28_000
BATCH = 65_536
WORKLOADS = ("streams launches", "streams mixed", "streams 8 devices", "trace mixed")
DEVICES = 8


def _events(n: int, mixed: bool, devices: int = 1) -> Any:
    import numpy as np

    from gpuflight.producer.contract.abi import (
        API_IDS,
        EVENT_DTYPE,
        F_ASYNC,
        F_BYTES_KNOWN,
        F_CAPTURED,
        F_HAS_RESULT,
        EventType,
    )

    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["ts_ns"] = 1_796_000_000_000_000_000 + np.arange(n, dtype=np.uint64) * 1000
    ev["pid"] = 1000
    ev["tid"] = 1000
    ev["type"] = EventType.LAUNCH
    ev["api"] = API_IDS["cudaLaunchKernel"]
    ev["handle"] = 0xA000
    ev["dim"] = [40, 1, 1, 256, 1, 1]
    if not mixed:
        return ev
    rng = np.random.default_rng(7)
    kinds = np.array([EventType.LAUNCH] * 14 + [EventType.GRAPH_LAUNCH, EventType.MEMCPY,
                     EventType.MEMCPY, EventType.MEMSET, EventType.ALLOC, EventType.FREE,
                     EventType.SYNC, EventType.SYNC], dtype=np.uint8)
    types = rng.choice(kinds, n)
    ev["type"] = types
    ev["handle"] = 0xA000 + 0x10 * rng.integers(0, 40, n)
    ev["dim"] = np.column_stack([rng.choice([40, 128, 512, 4096], n), np.ones(n), np.ones(n),
                                 rng.choice([128, 256], n), np.ones(n), np.ones(n)])
    ev["flags"][(types == EventType.LAUNCH) & (rng.random(n) < 0.04)] = F_CAPTURED
    graph = types == EventType.GRAPH_LAUNCH
    ev["api"][graph] = API_IDS["cudaGraphLaunch"]
    ev["dim"][graph] = [3, 0, 0, 0, 0, 0]
    copy = types == EventType.MEMCPY
    ev["api"][copy] = API_IDS["cudaMemcpy"]
    ev["dim"][copy] = np.column_stack([rng.integers(0, 5, int(copy.sum())),
                                       *[np.zeros(int(copy.sum()))] * 5])
    ev["bytes"][copy] = rng.integers(1 << 10, 1 << 24, int(copy.sum()))
    ev["flags"][copy] = np.where(rng.random(int(copy.sum())) < 0.5, F_ASYNC, F_HAS_RESULT)
    memset = types == EventType.MEMSET
    ev["api"][memset] = API_IDS["cudaMemsetAsync"]
    ev["flags"][memset] = F_ASYNC
    ev["bytes"][memset] = 1 << 16
    alloc, free = types == EventType.ALLOC, types == EventType.FREE
    ev["api"][alloc] = API_IDS["cudaMalloc"]
    ev["api"][free] = API_IDS["cudaFree"]
    ev["dim"][alloc] = [1, 0, 0, 0, 0, 0]
    ev["bytes"][alloc | free] = rng.integers(1 << 10, 1 << 26, int((alloc | free).sum()))
    ev["flags"][alloc] = F_HAS_RESULT
    ev["flags"][free] = F_HAS_RESULT | F_BYTES_KNOWN
    sync = types == EventType.SYNC
    ev["api"][sync] = API_IDS["cudaStreamSynchronize"]
    ev["dim"][sync] = np.column_stack([rng.integers(1, 4, int(sync.sum())),
                                       *[np.zeros(int(sync.sum()))] * 5])
    ev["flags"][sync] = F_HAS_RESULT
    timed = copy | alloc | free | sync
    ev["duration_ns"][timed] = rng.integers(1_000, 1_000_000, int(timed.sum()))
    ev["result"][timed & (rng.random(n) < 0.02)] = 2
    if devices > 1:
        ev["device"] = np.random.default_rng(8).integers(0, devices, n)
    return ev


def _best(repeat: int, run: Any) -> float:
    """The shortest of `repeat` timings of run() (timeit's rule: the others were disturbed),
    in CPU time of this thread: the machine is shared, and counting is one thread's work."""
    times = []
    for _ in range(repeat):
        started = time.thread_time()
        run()
        times.append(time.thread_time() - started)
    return min(times)


def inner(events: int, tree: Path, repeat: int = 3) -> dict[str, float]:
    """Events/s of each workload (best of `repeat`), timed in this interpreter against
    `tree`'s modules."""
    sys.path.insert(0, str(tree))
    from gpuflight.producer.decode import summary
    from gpuflight.streams import aggregate

    for module in (summary, aggregate):
        if not Path(module.__file__ or "").resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"{module.__name__} came from {module.__file__}, not {tree}")
    rates: dict[str, float] = {}
    for name, mixed, devices in (("streams launches", False, 1), ("streams mixed", True, 1),
                                 ("streams 8 devices", True, DEVICES)):
        ev = _events(events, mixed, devices)
        messages = [ev[i : i + MESSAGE] for i in range(0, len(ev), MESSAGE)]

        def windows(messages: list[Any] = messages) -> None:
            for i, message in enumerate(messages):
                if i % 10 == 0:
                    agg = aggregate.WindowAggregate(i, "bench", "bench:1")
                aggregate.add_events(agg, message)

        rates[name] = len(ev) / _best(repeat, windows)
    ev = _events(events, True)
    batches = [ev[i : i + BATCH].copy() for i in range(0, len(ev), BATCH)]

    def trace() -> None:
        total = summary.Summary()
        for batch in batches:
            total.add(batch)

    rates["trace mixed"] = len(ev) / _best(repeat, trace)
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="a git revision to measure side by side")
    parser.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(inner(args.events, args.inner)))
        return 0
    with tempfile.TemporaryDirectory(prefix="gpuflight-bench-") as tmp:
        trees = {"this tree": ROOT}
        if args.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            trees[args.baseline] = base
        results: dict[str, dict[str, list[float]]] = {t: {w: [] for w in WORKLOADS}
                                                      for t in trees}
        for i in range(args.rounds):
            for label, tree in list(trees.items())[:: 1 if i % 2 == 0 else -1]:
                out = subprocess.run(
                    [sys.executable, __file__, "--events", str(args.events),
                     "--inner", str(tree)], check=True, capture_output=True, text=True).stdout
                for workload, rate in json.loads(out).items():
                    results[label][workload].append(rate)
    print(f"{platform.node()} · {platform.platform()} · {time.strftime('%Y-%m-%d')} · "
          f"{args.events:,} events, {args.rounds} rounds, median events/s")
    labels = list(trees)
    header = ["workload", *labels] + ([f"ratio (this tree / {labels[1]})"] if args.baseline
                                      else [])
    print(" | ".join(header))
    for workload in WORKLOADS:
        medians = [statistics.median(results[label][workload]) for label in labels]
        row = [workload, *(f"{m:,.0f}" for m in medians)]
        if args.baseline:
            row.append(f"{medians[0] / medians[1]:.3f}")
        print(" | ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
