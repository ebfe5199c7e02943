"""A thread-per-request HTTP server on the simulated GPU (gpuflight/simgpu, real-time timing
model) whose routes keep the device busy for known, different times; run under `gpuflight
trace` with the simulated NVML by tests/system/test_request_gpu_time.py.

    python -m tests.workloads.nvml_server serve --runtime SIM/libcudart.so.12 --expect OUT.json
    python -m tests.workloads.nvml_server nvml --runtime SIM/libcudart.so.12

With GF_SIM_NS_PER_THREAD=1 a kernel of B blocks of 1024 threads runs B x 1.024 us + 0.6 us:

    POST /v1/heavy/{id}   a 2 ms kernel, 10 ms of host work (the kernel done, the process still
                          has work queued: nothing has synchronised), then a sync: queued time
                          ~12 ms, GPU time 2 ms
    POST /v1/light/{id}   two 0.5 ms kernels and a sync: queued time ~ GPU time ~ 1 ms
    GET  /v1/health/{id}  no GPU work

serve (with --hold, once a line comes on stdin): one keep-alive client sends them one at a
time in a fixed random order, pausing --pause-ms after each response (more than an NVML sample
period: no period holds the GPU work of two requests). --expect gets, per request, its
method, path, kind, status and its GPU time as the simulated driver counts it
(gfsim_thread_kernel_ns on the handler's thread, before and after its work), and the pid.

nvml: launches kernels, then reads the simulated NVML in this process (GPUFLIGHT_NVML_LIB) and
prints one JSON line: what the driver counted, and what NVML said (for tests/system/test_simgpu.py).
"""

from __future__ import annotations

import argparse
import ctypes
import http.server
import json
import os
import random
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuflight.demo.serve import Gpu

#: kind -> (blocks of 1024 threads per kernel, kernels, host work ms before the sync)
WORK: dict[str, tuple[int, int, float]] = {
    "heavy": (1953, 1, 10.0),
    "light": (488, 2, 0.0),
}
PATHS = {"heavy": "/v1/heavy/{}", "light": "/v1/light/{}", "health": "/v1/health/{}"}


def _kernel_ns(runtime: Path) -> Any:
    """The driver's gfsim_thread_kernel_ns (libcuda.so.1 beside the runtime)."""
    driver = ctypes.CDLL(str(runtime.parent / "libcuda.so.1"))
    fn = driver.gfsim_thread_kernel_ns
    fn.restype = ctypes.c_double
    return fn


def make_server(gpu: Gpu, kernel_ns: Any, truth: dict[str, float]) -> http.server.HTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            kind = self.path.strip("/").split("/")[1]
            blocks, kernels, host_ms = WORK[kind]
            before = kernel_ns()
            for _ in range(kernels):
                gpu.launch(blocks, 1024)
            if host_ms:
                time.sleep(host_ms / 1000)  # the handler's host-side work
            gpu.sync()
            truth[self.path] = kernel_ns() - before
            self._reply(b'{"ok":true}')

        def do_GET(self) -> None:
            self._reply(b"ok")

        def _reply(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def _response(sock: socket.socket, buf: bytearray) -> int:
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response")
        buf += chunk
    head, _, _ = bytes(buf).partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(buf) < len(head) + 4 + length:
        buf += sock.recv(65536)
    del buf[:len(head) + 4 + length]
    return int(head.split(b" ", 2)[1])


def serve(args: argparse.Namespace) -> int:
    gpu = Gpu(args.runtime)
    truth: dict[str, float] = {}
    server = make_server(gpu, _kernel_ns(args.runtime), truth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if args.hold:  # until told to go (node-wide: once the producer watches this process)
        sys.stdin.readline()
    kinds = ["heavy", "light", "health"] * (args.requests // 3)
    random.Random(16).shuffle(kinds)
    sent: list[dict[str, Any]] = []
    buf = bytearray()
    host, port = server.server_address[:2]
    with socket.create_connection((str(host), int(port))) as sock:
        for i, kind in enumerate(kinds):
            path = PATHS[kind].format(i)
            method = "GET" if kind == "health" else "POST"
            body = b"" if kind == "health" else b"x" * 64
            sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status = _response(sock, buf)
            sent.append({"method": method, "path": path, "kind": kind, "status": status})
            time.sleep(args.pause_ms / 1000)  # pacing: the next request comes later
    server.shutdown()
    server.server_close()
    for s in sent:
        s["gpu_ns"] = truth.get(s["path"], 0.0)
    args.expect.write_text(json.dumps({"pid": os.getpid(), "requests": sent}))
    return 0


def nvml(args: argparse.Namespace) -> int:
    """Kernels for 60 ms of device time, then NVML's view of this process."""
    from gpuflight.producer.nvml import NvmlSampler

    gpu = Gpu(args.runtime)
    kernel_ns = _kernel_ns(args.runtime)
    started = time.time_ns()
    for _ in range(20):
        gpu.launch(2929, 1024)  # 3 ms
        gpu.sync()
        time.sleep(0.005)
    truth = kernel_ns()
    ended = time.time_ns()
    with NvmlSampler() as sampler:
        sampler.sample()
        deadline = time.monotonic() + 10
        while (sampler.covered_ns() or 0) < ended and time.monotonic() < deadline:
            time.sleep(0.01)  # NVML samples a period once it is over
            sampler.sample()
        (sample,) = sampler.sample()
        report = sampler.take_utilization()
    mine = [w for w in report.windows if w.pid == os.getpid()]
    print(json.dumps({
        "pid": os.getpid(), "truth_ns": truth, "started_ns": started, "ended_ns": ended,
        "nvml_ns": sum(w.gpu_ns for w in mine), "windows": len(mine),
        "periods_ns": sorted({w.end_ns - w.start_ns for w in mine}),
        "first_start_ns": min(w.start_ns for w in mine),
        "last_end_ns": max(w.end_ns for w in mine),
        "name": sample.name, "uuid": sample.uuid, "power_w": sample.power_w,
        "temperature_c": sample.temperature_c, "memory_total_bytes": sample.memory_total_bytes,
        "processes": [p.pid for p in sample.processes or ()],
    }))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("serve", "nvml"))
    parser.add_argument("--runtime", required=True, type=Path)
    parser.add_argument("--expect", type=Path)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--pause-ms", type=float, default=30.0)
    parser.add_argument("--hold", action="store_true", help="serve once a line is read")
    args = parser.parse_args()
    return serve(args) if args.what == "serve" else nvml(args)


if __name__ == "__main__":
    sys.exit(main())
