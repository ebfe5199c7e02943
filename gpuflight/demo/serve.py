"""`gpuflight demo --serve`: a small inference-like HTTP server on the simulated GPU, loaded by
a generator, traced: the per-route table with the cost of 1,000 requests of each route.

The server (this module run as a program, `python -m gpuflight.demo.serve`) is a stdlib
ThreadingHTTPServer whose handlers call the simulated CUDA runtime (gpuflight/simgpu's
libcudart.so.12, on the wall clock) through ctypes, as an inference server calls its framework:

  POST /v1/embed/{id}     cheap: a 16 KiB input copied in, 2 small kernels, 4 KiB copied out
  POST /v1/generate/{id}  expensive: a 256 KiB input, 24 large kernels (a decode loop),
                          a stream sync, 64 KiB copied out
  GET  /healthz           no GPU work

The same process runs the load generator: keep-alive clients on several threads, a mix of
both routes, then the server shuts down and the program exits. `Gpu` and `Handler` are what the
tests' servers are built from too.
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import http.server
import json
import os
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

H2D, D2H = 1, 2


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class Gpu:
    """The CUDA runtime (here the simulated one) called through ctypes."""

    def __init__(self, runtime: str | os.PathLike[str]) -> None:
        self.lib = ctypes.CDLL(os.fspath(runtime))
        self.lib.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3,
                                              ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_int]
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        # Kernels are functions of the process: a libc function's address stands for one.
        self._kernel = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
        self._device = ctypes.c_void_p()
        self._size = 1 << 20
        if self.lib.cudaMalloc(ctypes.byref(self._device), self._size) != 0:
            raise RuntimeError("cudaMalloc failed on the simulated GPU")
        self._host = ctypes.create_string_buffer(self._size)

    def launch(self, blocks: int, threads: int) -> None:
        self.lib.cudaLaunchKernel(self._kernel, Dim3(blocks, 1, 1), Dim3(threads, 1, 1),
                                  None, 0, None)

    def copy(self, nbytes: int, kind: int) -> None:
        nbytes = min(nbytes, self._size)
        dst, src = ((self._device, self._host) if kind == H2D else (self._host, self._device))
        self.lib.cudaMemcpy(dst, src, nbytes, kind)

    def sync(self) -> None:
        self.lib.cudaStreamSynchronize(None)


#: route → (h2d bytes, launches of (blocks, threads), syncs, d2h bytes)
WORK: dict[str, tuple[int, int, tuple[int, int], int, int]] = {
    "embed": (16 << 10, 2, (64, 128), 0, 4 << 10),
    "generate": (256 << 10, 24, (1024, 256), 1, 64 << 10),
}


def serve_work(gpu: Gpu, kind: str) -> bytes:
    h2d, launches, (blocks, threads), syncs, d2h = WORK[kind]
    gpu.copy(h2d, H2D)
    for _ in range(launches):
        gpu.launch(blocks, threads)
    for _ in range(syncs):
        gpu.sync()
    gpu.copy(d2h, D2H)
    return json.dumps({"route": kind, "launches": launches}).encode()


def make_handler(gpu: Gpu) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # The head and the body go out in two writes: without this, Nagle's algorithm and
            # the client's delayed ACK hold the body back ~40 ms.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            if len(parts) == 3 and parts[0] == "v1" and parts[1] in WORK:
                self._reply(200, serve_work(gpu, parts[1]))
            else:
                self._reply(404, b"not found\n")

        def do_GET(self) -> None:
            self._reply(200 if self.path == "/healthz" else 404, b"ok\n")

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def load(port: int, clients: int, requests: int,
         plan: Callable[[int, int], str]) -> dict[str, int]:
    """`clients` keep-alive clients, `requests` each; plan(client, i) gives the path.
    Returns the statuses seen, counted."""
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    body = b"x" * 512

    def client(c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for i in range(requests):
            path = plan(c, i)
            if path.startswith("GET "):
                conn.request("GET", path[4:])
            else:
                conn.request("POST", path, body=body)
            response = conn.getresponse()
            response.read()
            with lock:
                key = str(response.status)
                statuses[key] = statuses.get(key, 0) + 1
        conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


#: The simulated GPU has no model of its own: the demo prices it as this one.
PRICED_AS = "H100"


def run(clients: int = 4, requests: int = 100, gpu_model: str = PRICED_AS) -> int:
    """`gpuflight demo --serve`: trace the server under load, print its per-route table."""
    from gpuflight.demo.build import REAL_TIME, build_demo
    from gpuflight.demo.showcase import environment
    from gpuflight.producer import trace
    from gpuflight.producer.contract.pricing import DEFAULT_PRICES, PriceBook
    from gpuflight.producer.http.routes import render
    from gpuflight.producer.settings import CaptureSettings

    built = build_demo()
    print(f"gpuflight demo --serve: an inference-like HTTP server on a simulated GPU "
          f"({built.runtime}), {clients} keep-alive clients x {requests} requests, priced as "
          f"an {gpu_model}", file=sys.stderr)
    options = trace.RequestOptions(prices=PriceBook.load(DEFAULT_PRICES),
                                   gpu_model=gpu_model)
    with environment(REAL_TIME):
        result = trace.run(
            [sys.executable, "-m", "gpuflight.demo.serve", "--runtime", str(built.runtime),
             "--clients", str(clients), "--requests", str(requests)],
            settings=CaptureSettings(http=True), print_summary=False, requests=options)
    if result.exit_code != 0:
        print(f"gpuflight demo --serve: the server failed (exit {result.exit_code})",
              file=sys.stderr)
        return 1
    if result.routes is None or not result.routes.rows:
        print("gpuflight demo --serve: no request was captured", file=sys.stderr)
        return 1
    print(render(result.routes, gpu_model))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuflight.demo.serve")
    parser.add_argument("--runtime", required=True, type=Path, help="the libcudart.so.12")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=100, help="per client")
    parser.add_argument("--hold", action="store_true",
                        help="launch a warm-up kernel every 20 ms until a line comes on stdin, "
                        "then load (what a node-wide capture waits to see first)")
    parser.add_argument("--serve-only", type=Path, metavar="PORT_FILE",
                        help="no load: write the port to this file and serve until stdin ends "
                        "(bench/http_overhead.py)")
    args = parser.parse_args(argv)
    gpu = Gpu(args.runtime)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(gpu))
    runner = threading.Thread(target=server.serve_forever, daemon=True)
    runner.start()
    if args.serve_only is not None:
        args.serve_only.write_text(str(server.server_address[1]))
        sys.stdin.read()
        server.shutdown()
        server.server_close()
        return 0
    if args.hold:
        go = threading.Event()

        def wait_for_go() -> None:
            sys.stdin.readline()
            go.set()

        threading.Thread(target=wait_for_go, daemon=True).start()
        while not go.wait(0.02):
            gpu.launch(1, 1)

    def plan(c: int, i: int) -> str:
        if i % 25 == 24:
            return "GET /healthz"
        kind = "generate" if (c + i) % 4 == 0 else "embed"
        return f"/v1/{kind}/{1000 * c + i}"

    statuses = load(server.server_address[1], args.clients, args.requests, plan)
    server.shutdown()
    server.server_close()
    print(json.dumps({"statuses": statuses}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
