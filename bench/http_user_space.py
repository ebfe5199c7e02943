"""User-space cost of request tracing: the HTTP parser per record, attribution per event.

    .venv/bin/python bench/http_user_space.py [--requests N] [--events N]

Parser: keep-alive connections of GET requests with a traceparent and a 2 KiB JSON response
(one read and one write each), built as the probes would report them. Attribution: one
process, N events on 8 threads, requests of 5 ms on those threads (exact) and an engine thread
(shared); attribute + event_costs (busy GPU time) + rollup, in one batch. Medians of 5 runs.
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
from gpuflight.producer.contract.costs import event_costs  # noqa: E402
from gpuflight.producer.http.attribution import RequestTable, attribute, rollup  # noqa: E402
from gpuflight.producer.http.parser import HttpParser  # noqa: E402
from tests.support.httpsim import Wire, response  # noqa: E402


def parser_run(n: int) -> tuple[float, int]:
    wires = []
    for c in range(max(1, n // 100)):
        w = Wire(conn_id=c, fd=10 + c)
        w.accept()
        for i in range(100):
            w.read(f"GET /v1/items/{i}?x=1 HTTP/1.1\r\nHost: a\r\ntraceparent: 00-"
                   f"4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\r\n".encode())
            w.write(response(200, b"{" + b'"k": 1, ' * 256 + b"}"))
        wires.append(w)
    records = [r for w in wires for r in w.records]
    parser = HttpParser()
    t = time.perf_counter()
    done = parser.feed_all(records)
    elapsed = time.perf_counter() - t
    assert len(done) == len(wires) * 100
    return elapsed / len(records), len(records)


def attribution_run(n: int) -> tuple[float, int]:
    rng = np.random.default_rng(16)
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["ts_ns"] = np.sort(rng.integers(0, 10**10, n))
    ev["tid"] = rng.integers(1, 10, n)
    kinds = rng.choice([EventType.LAUNCH, EventType.MEMCPY, EventType.SYNC], n, p=[.8, .1, .1])
    ev["type"] = kinds
    ev["flags"] = np.where(kinds == EventType.LAUNCH, F_ASYNC, F_HAS_RESULT)
    ev["duration_ns"] = np.where(kinds == EventType.SYNC, 20_000, 0)
    ev["dim"] = 1
    starts = np.arange(0, 10**10, 5_000_000)
    reqs = RequestTable(np.arange(1, len(starts) + 1), starts, starts + 4_000_000,
                        (np.arange(len(starts)) % 8) + 1)
    t = time.perf_counter()
    attr = attribute(reqs, ev)
    r = rollup(attr, event_costs(ev))
    elapsed = time.perf_counter() - t
    assert np.allclose(r.per_request.sum(axis=0) + r.unattributed, r.total)
    return elapsed / n, len(reqs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    per_record = statistics.median(parser_run(args.requests)[0] for _ in range(5))
    per_event, n_requests = attribution_run(args.events)
    per_event = statistics.median([per_event] + [attribution_run(args.events)[0]
                                                 for _ in range(4)])
    print(f"{platform.node()} {platform.release()}, {platform.python_version()}")
    print(f"HTTP parser: {per_record * 1e6:.1f} us per record "
          f"({1 / per_record / 2:,.0f} requests/s of 1 read + 1 write, one core)")
    print(f"attribution: {per_event * 1e9:.0f} ns per event ({args.events:,} events, "
          f"{n_requests:,} requests; attribute + costs + rollup)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
