"""Per-request overhead of gpuflight on an HTTP server: client-side p50 (and p99) latency of the
demo's inference-like server (gpuflight/demo/serve.py, a ThreadingHTTPServer calling the
simulated GPU) run plainly and under `gpuflight trace` (HTTP capture and attribution on),
alternating, in one run. The clients run here, outside the traced process.

    python bench/http_overhead.py [--rounds 3] [--clients 4] [--requests 300]

Prints one JSON line per round and mode, then the medians and the ratio.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuflight.demo.build import REAL_TIME, build_demo  # noqa: E402


def _load(port: int, clients: int, requests: int) -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        for i in range(requests):
            kind = "generate" if (c + i) % 4 == 0 else "embed"
            start = time.perf_counter()
            conn.request("POST", f"/v1/{kind}/{c * 100000 + i}", body=b"x" * 512)
            conn.getresponse().read()
            mine.append(time.perf_counter() - start)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def _round(traced: bool, runtime: Path, clients: int, requests: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        server = [sys.executable, "-m", "gpuflight.demo.serve", "--runtime", str(runtime),
                  "--serve-only", str(port_file)]
        cmd = [sys.executable, "-m", "gpuflight", "trace", "--", *server] if traced else server
        # The simulated GPU on the wall clock, as `gpuflight demo --serve` runs it.
        env = {**os.environ, **REAL_TIME, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                cwd=REPO)
        while not port_file.exists() or not port_file.read_text():
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise SystemExit(f"the server exited: {err[-2000:]}")
            time.sleep(0.05)
        port = int(port_file.read_text())
        _load(port, clients, 20)  # warm-up
        latencies = _load(port, clients, requests)
        assert proc.stdin is not None
        proc.stdin.close()
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.wait(timeout=300) != 0:
            raise SystemExit(f"the server failed: {err[-2000:]}")
        if traced and "requests by route" not in err:
            raise SystemExit(f"the trace saw no request: {err[-2000:]}")
    ms = sorted(x * 1e3 for x in latencies)
    return {"p50_ms": statistics.median(ms), "p99_ms": ms[int(0.99 * (len(ms) - 1))],
            "requests": len(ms)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=300, help="per client and round")
    args = parser.parse_args()
    runtime = build_demo().runtime
    results: dict[str, list[dict[str, float]]] = {"plain": [], "traced": []}
    for r in range(args.rounds):
        order = ("plain", "traced") if r % 2 == 0 else ("traced", "plain")
        for mode in order:
            one = _round(mode == "traced", runtime, args.clients, args.requests)
            results[mode].append(one)
            print(json.dumps({"round": r, "mode": mode, **one}), flush=True)
    plain = statistics.median(x["p50_ms"] for x in results["plain"])
    traced = statistics.median(x["p50_ms"] for x in results["traced"])
    print(json.dumps({"p50_ms_plain": plain, "p50_ms_traced": traced,
                      "overhead_pct": 100 * (traced / plain - 1),
                      "p99_ms_plain": statistics.median(x["p99_ms"] for x in results["plain"]),
                      "p99_ms_traced": statistics.median(x["p99_ms"] for x in results["traced"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
