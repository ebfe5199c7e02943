"""Producer → Kafka: sustained events/s, messages and bytes per event on the wire.

    .venv/bin/python bench/kafka_publish.py [--events N] [--processes P]

Feeds launch-heavy enriched events (as the capture loop hands them over, 65,536
per batch) to KafkaSink against a real local broker, then reads the broker's
log segments: what a topic really stores per event (zstd-compressed record
batches) next to the uncompressed JSON we serialise.
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tabulate import tabulate

from gpuflight import stack
from gpuflight.producer.contract.abi import API_IDS, EVENT_DTYPE, F_ASYNC, EventType
from gpuflight.producer.publish.kafkasink import KafkaSettings, KafkaSink

BATCH = 65536


def workload(n: int, processes: int, seed: int = 1) -> np.ndarray:
    """90% launches of 8 kernels in 3 shapes, 10% async copies; 4 threads a process."""
    rng = np.random.default_rng(seed)
    events = np.zeros(n, dtype=EVENT_DTYPE)
    events["ts_ns"] = 1_796_000_000_000_000_000 + np.cumsum(rng.integers(300, 1500, n))
    events["pid"] = 10_000 + rng.integers(0, processes, n)
    events["tid"] = events["pid"] + rng.integers(0, 4, n)
    launch = rng.random(n) < 0.9
    events["type"] = np.where(launch, EventType.LAUNCH, EventType.MEMCPY)
    events["api"] = np.where(launch, API_IDS["cudaLaunchKernel"], API_IDS["cudaMemcpyAsync"])
    events["flags"] = np.where(launch, 0, F_ASYNC)
    events["handle"] = np.where(launch, 0x5555_0000_1000 + 0x40 * rng.integers(0, 8, n),
                                0x7F00_0000_0000)
    events["stream"] = rng.choice([0, 0x5555_1234_0000], n)
    events["bytes"] = np.where(launch, 0, 1 << 20)
    shapes = np.array([[40, 1, 1, 256, 1, 1], [4096, 1, 1, 128, 1, 1], [8, 8, 1, 16, 16, 1]])
    events["dim"] = np.where(launch[:, None], shapes[rng.integers(0, 3, n)], [2, 0, 0, 0, 0, 0])
    return events


def topic_bytes(data_dir: Path, topic: str) -> int:
    return sum(f.stat().st_size for f in (data_dir / "kafka" / "data").glob(f"{topic}-*/*.log"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    events = workload(args.events, args.processes)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        broker = stack.kafka_up(data, port=stack.free_port())
        try:
            settings = KafkaSettings(broker.bootstrap, topic_prefix="bench")
            sink = KafkaSink(settings, host="bench-node")
            wall0, cpu0 = time.monotonic(), time.process_time()
            for start in range(0, len(events), BATCH):
                sink.write(events[start : start + BATCH].copy())
                sink.tick()
            left = sink.flush(120)
            wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
            assert left == 0 and sink.delivered_events == len(events), "not all delivered"
            time.sleep(1)  # segments reach the disk
            stored = topic_bytes(data, settings.topics.events)
            rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        finally:
            stack.kafka_down(data)
    n = len(events)
    print(f"machine: {platform.node()} {platform.machine()}, kernel {platform.release()}, "
          f"{time.strftime('%Y-%m-%d')}; {n:,} events from {args.processes} processes")
    print(tabulate([
        ["events/s (wall)", f"{n / wall:,.0f}"],
        ["events per CPU-second (all threads)", f"{n / cpu:,.0f}"],
        ["messages", f"{sink.messages:,} ({n / sink.messages:,.0f} events each)"],
        ["JSON bytes/event (before compression)", f"{sink.message_bytes / n:.2f}"],
        ["bytes/event stored by the broker (zstd batches)", f"{stored / n:.2f}"],
        ["producer RSS (max)", f"{rss_mib:.0f} MiB"],
    ], tablefmt="plain"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
