"""`--timeline`: events/s the Perfetto writer takes, and that its memory does not grow with the
trace.

    .venv/bin/python bench/timeline.py [--events N] [--threads T] [--requests R]

Synthetic, deterministic batches of 65,536 events (the capture loop's batch; launches, copies
and syncs of T threads of 4 processes, a request every 1,000 events with flows to its calls)
written by TimelineSink to a file in a fresh interpreter. Reported, in CPU time of the thread:
events/s of the spool's writes (what the capture's thread pays) and of the conversion at close;
bytes per event in the file; the peak RSS after 1/4 of the events and after all of them and
the conversion (the bound: equal within noise when nothing per event is kept).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = 65_536

_WORKER = r'''
import json, resource, sys, time
from dataclasses import dataclass
import numpy as np
sys.path.insert(0, sys.argv[1])
from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import API_IDS, EVENT_DTYPE, F_ASYNC, F_HAS_RESULT, EventType
from gpuflight.producer.decode.timeline import TimelineSink

events, threads, every, out = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
BATCH = 65536
T0 = 1_796_000_000_000_000_000

@dataclass
class Answered:
    record: wire.RequestRecord

def batch(start):
    n = min(BATCH, events - start)
    i = np.arange(start, start + n)
    b = np.zeros(n, dtype=EVENT_DTYPE)
    b["ts_ns"] = T0 + i * 1000
    b["pid"] = 100 + i % 4
    b["tid"] = 1000 + i % threads
    kind = i % 10
    launch = kind < 7
    copy = kind < 9
    b["type"] = np.where(launch, EventType.LAUNCH,
                         np.where(copy, EventType.MEMCPY, EventType.SYNC))
    b["api"] = np.where(launch, API_IDS["cudaLaunchKernel"],
                        np.where(copy, API_IDS["cudaMemcpy"], API_IDS["cudaDeviceSynchronize"]))
    b["flags"] = np.where(launch, F_ASYNC, F_HAS_RESULT)
    b["duration_ns"] = np.where(launch, 0, 500)
    b["bytes"] = np.where(kind == 7, 1 << 20, 0)
    b["handle"] = 0xA000 + (i % 40)
    b["dim"][:, 0] = np.where(launch, 64, 1)
    b["dim"][:, 3] = np.where(launch, 128, 0)
    rid = np.where(i % every < every // 2, 1 + i // every, 0).astype(np.uint64)
    return b, wire.EventAttribution(rid, np.zeros(n, dtype=np.int64))

sink = TimelineSink(out, read_names=False)
peaks = []
spool_cpu = 0.0
for start in range(0, events, BATCH):
    b, attribution = batch(start)
    began = time.thread_time()
    sink.write(b, attribution)
    first = start // every + 1
    last = (start + len(b)) // every
    for pid in range(100, 104):
        sink.write_requests(pid, [Answered(wire.RequestRecord(
            request_id=r, tid=1000, method="GET", path=f"/x/{r}", route="/x/{id}", status=200,
            start_ns=T0 + r * every * 1000, end_ns=T0 + r * every * 1000 + every * 500,
            bytes_in=10, bytes_out=10, trace_id=None, parent_span_id=None, complete=True,
            port=80, cost={})) for r in range(first, last + 1) if r % 4 == pid - 100], {})
    spool_cpu += time.thread_time() - began
    if start + len(b) >= events // 4 and len(peaks) == 0:
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
began = time.thread_time()
sink.close()
convert_cpu = time.thread_time() - began
peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
print(json.dumps({"spool_cpu_s": spool_cpu, "convert_cpu_s": convert_cpu,
                  "rss_quarter_kb": peaks[0], "rss_end_kb": peaks[-1]}))
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--requests", type=int, default=1_000, metavar="EVERY",
                        help="a request every EVERY events")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t.pftrace"
        done = subprocess.run(
            [sys.executable, "-c", _WORKER, str(ROOT), str(args.events), str(args.threads),
             str(args.requests), str(out)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        result = json.loads(done.stdout)
        size = out.stat().st_size
    print(f"bench/timeline.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{platform.node()} ({platform.machine()}, {platform.python_version()})")
    print(f"  events               {args.events:,} ({args.threads} threads, 4 processes, "
          f"a request every {args.requests:,})")
    print(f"  capture side         {args.events / result['spool_cpu_s']:,.0f} events/s "
          "(the spool's writes, on the capture's thread)")
    print(f"  conversion at close  {args.events / result['convert_cpu_s']:,.0f} events/s")
    print(f"  bytes per event      {size / args.events:.1f} ({size / 2**20:,.1f} MiB)")
    print(f"  peak RSS             {result['rss_quarter_kb'] / 1024:,.1f} MiB after a quarter, "
          f"{result['rss_end_kb'] / 1024:,.1f} MiB after all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
