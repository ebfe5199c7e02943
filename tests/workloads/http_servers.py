"""Real HTTP servers whose handlers call the simulated GPU, loaded by raw keep-alive clients
that know every byte they sent and got; run under `gpuflight trace` by
tests/system/test_requests.py.

    python -m tests.workloads.http_servers threaded --runtime LIBCUDART --expect OUT.json
    python -m tests.workloads.http_servers aiohttp  --runtime LIBCUDART --expect OUT.json

threaded: a ThreadingHTTPServer and a threaded wsgiref server in one process; before the
servers start and after the clients are done, BACKGROUND launches are made with no request in
flight (unattributed); some requests carry a traceparent; some connections send malformed HTTP
or binary garbage; some end their stream before their head's blank line (the server answers
them all the same: `cut` in --expect). aiohttp: one event loop thread serves concurrent
requests (shared).

Routes (a request's GPU work is known from its kind):
    POST /v1/small/{id}   1 launch, 1 H2D copy
    POST /v1/big/{id}     5 launches, 2 copies (H2D, D2H), 1 sync
    GET  /v1/items        no GPU work
    GET  /missing         404, no GPU work

--expect gets, per request, what the client sent and got: method, path, status, the bytes
in and out on the wire, its traceparent, the GPU work its handler did; and the counts of the
background launches and of the garbage connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import socketserver
import sys
import threading
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gpuflight.demo.serve import D2H, H2D, Gpu

#: kind → (launches, H2D copies, D2H copies, syncs)
WORK: dict[str, tuple[int, int, int, int]] = {
    "small": (1, 1, 0, 0),
    "big": (5, 1, 1, 1),
    "items": (0, 0, 0, 0),
    "missing": (0, 0, 0, 0),
}
BACKGROUND = 7
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def do_work(gpu: Gpu, kind: str) -> None:
    launches, h2d, d2h, syncs = WORK[kind]
    for _ in range(h2d):
        gpu.copy(4096, H2D)
    for _ in range(launches):
        gpu.launch(32, 64)
    for _ in range(syncs):
        gpu.sync()
    for _ in range(d2h):
        gpu.copy(2048, D2H)


def kind_of(path: str) -> str:
    parts = path.split("?", 1)[0].strip("/").split("/")
    if len(parts) == 3 and parts[0] == "v1" and parts[1] in ("small", "big"):
        return parts[1]
    return "items" if path.startswith("/v1/items") else "missing"


# -- servers ------------------------------------------------------------------------------

def threading_server(gpu: Gpu) -> socketserver.TCPServer:
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            kind = kind_of(self.path)
            do_work(gpu, kind)
            body = (b"{}" if kind != "missing" else b"no") * (3 if kind == "big" else 1)
            self.send_response(404 if kind == "missing" else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def log_message(self, *args: Any) -> None:
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)


class _ThreadingWsgi(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietWsgiHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def wsgi_server(gpu: Gpu) -> socketserver.TCPServer:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            environ["wsgi.input"].read(length)
        kind = kind_of(environ["PATH_INFO"])
        do_work(gpu, kind)
        body = b"wsgi:" + kind.encode()
        start_response("404 Not Found" if kind == "missing" else "200 OK",
                       [("Content-Length", str(len(body)))])
        return [body]

    return make_server("127.0.0.1", 0, app, server_class=_ThreadingWsgi,
                       handler_class=_QuietWsgiHandler)


# -- raw clients ------------------------------------------------------------------------------

def _read_response(sock: socket.socket, buf: bytearray) -> tuple[int, int]:
    """(status, bytes) of one response read off `sock` (Content-Length framed)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response head")
        buf += chunk
    head, _, _ = bytes(buf).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    total = len(head) + 4 + length
    while len(buf) < total:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        buf += chunk
    del buf[:total]
    return status, total


def client(port: int, server: str, n: int, *, requests: int, keep_alive: bool,
           out: list[dict[str, Any]], lock: threading.Lock) -> None:
    rng = random.Random(n)
    sock: socket.socket | None = None
    buf = bytearray()
    for i in range(requests):
        kind = rng.choice(["small", "small", "big", "items", "missing"])
        rid = 100_000 * n + i
        path = {"small": f"/v1/small/{rid}?q=1", "big": f"/v1/big/{rid}",
                "items": f"/v1/items?page={rid}", "missing": f"/missing?x={rid}"}[kind]
        method = "POST" if kind in ("small", "big") else "GET"
        body = b"b" * (100 + i % 50) if method == "POST" else b""
        traceparent = f"00-{TRACE_ID}-{n + 1:04x}{i:012x}-01" if i % 3 == 0 else None
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if traceparent:
            head += f"traceparent: {traceparent}\r\n"
        if body:
            head += f"Content-Length: {len(body)}\r\n"
        if not keep_alive:
            head += "Connection: close\r\n"
        raw = head.encode() + b"\r\n" + body
        if sock is None:
            sock = socket.create_connection(("127.0.0.1", port))
            buf = bytearray()
        sock.sendall(raw)
        status, got = _read_response(sock, buf)
        if not keep_alive:
            sock.close()
            sock = None
        with lock:
            out.append({"server": server, "method": method, "path": path.split("?")[0],
                        "kind": kind, "status": status, "bytes_in": len(raw),
                        "bytes_out": got, "traceparent": traceparent})
    if sock is not None:
        sock.close()


def garbage(port: int) -> int:
    """Connections that are not HTTP/1.1: binary, a bad request line, a head that never ends."""
    payloads = [bytes(range(256)) * 8, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64,
                b"GET / HTTP/9.9\r\n\r\n", b"NOT-HTTP AT ALL\r\n\r\n", b"\xff\xfe\r\n\r\n"]
    for payload in payloads:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
    return len(payloads)


def cut_heads(port: int, out: list[dict[str, Any]]) -> None:
    """Requests whose head the client ends with its end of stream (shutdown(SHUT_WR)) before
    the blank line: without it or half of it, with the request line alone, with the line not
    even ended. http.server takes what came as the whole head, does the work and answers."""
    heads = [
        ("POST", "/v1/small/{}", "Host: 127.0.0.1\r\ntraceparent: {}\r\n"),
        ("POST", "/v1/big/{}", "Host: 127.0.0.1\r\n"),
        ("GET", "/v1/small/{}", "Host: 127.0.0.1\r\n\r"),  # the blank line cut short
        ("GET", "/v1/small/{}", ""),
        ("GET", "/v1/big/{}", None),
        ("GET", "/v1/items", None),
    ]
    for i, (method, path_form, rest) in enumerate(heads):
        path = path_form.format(900_000 + i)
        traceparent = f"00-{TRACE_ID}-{0xC0DE:04x}{i:012x}-01" if rest and "{}" in rest else None
        line = f"{method} {path} HTTP/1.1"
        raw = (line if rest is None else f"{line}\r\n{rest.format(traceparent)}").encode()
        buf = bytearray()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
            status, got = _read_response(sock, buf)
        out.append({"server": "stdlib", "method": method, "path": path, "kind": kind_of(path),
                    "status": status, "bytes_in": len(raw), "bytes_out": got,
                    "traceparent": traceparent, "cut": True})


def run_load(port: int, server: str, *, clients: int, requests: int, keep_alive: bool,
             out: list[dict[str, Any]]) -> None:
    lock = threading.Lock()
    threads = [threading.Thread(target=client, args=(port, server, n + (0 if keep_alive else 50)),
                                kwargs={"requests": requests, "keep_alive": keep_alive,
                                        "out": out, "lock": lock})
               for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def threaded(gpu: Gpu, clients: int, requests: int) -> dict[str, Any]:
    for _ in range(BACKGROUND):
        gpu.launch(8, 8)  # start-up work: no request in flight
    out: list[dict[str, Any]] = []
    servers = {"stdlib": threading_server(gpu), "wsgi": wsgi_server(gpu)}
    for s in servers.values():
        threading.Thread(target=s.serve_forever, daemon=True).start()
    bad = garbage(servers["stdlib"].server_address[1])
    cut_heads(servers["stdlib"].server_address[1], out)
    loads = [
        threading.Thread(target=run_load, args=(servers["stdlib"].server_address[1], "stdlib"),
                         kwargs={"clients": clients, "requests": requests, "keep_alive": True,
                                 "out": out}),
        threading.Thread(target=run_load, args=(servers["wsgi"].server_address[1], "wsgi"),
                         kwargs={"clients": 2, "requests": requests // 2, "keep_alive": False,
                                 "out": out}),
    ]
    for t in loads:
        t.start()
    for t in loads:
        t.join()
    for s in servers.values():
        s.shutdown()
        s.server_close()
    for _ in range(BACKGROUND):
        gpu.launch(8, 8)  # after the last response: no request in flight
    return {"requests": out, "background_launches": 2 * BACKGROUND, "garbage": bad}


def aio(gpu: Gpu, clients: int, requests: int) -> dict[str, Any]:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        if request.can_read_body:
            await request.read()
        kind = kind_of(request.path)
        launches, h2d, d2h, syncs = WORK[kind]
        for _ in range(h2d):
            gpu.copy(4096, H2D)
        for _ in range(launches):
            gpu.launch(32, 64)
            await asyncio.sleep(0)  # other requests go on meanwhile
        for _ in range(syncs):
            gpu.sync()
        for _ in range(d2h):
            gpu.copy(2048, D2H)
        return web.Response(status=404 if kind == "missing" else 200, body=b"aio")

    out: list[dict[str, Any]] = []
    ready = threading.Event()
    state: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state["loop"], state["runner"] = loop, runner
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(30)
    run_load(state["port"], "aiohttp", clients=clients, requests=requests, keep_alive=True,
             out=out)
    state["loop"].call_soon_threadsafe(state["loop"].stop)
    thread.join(30)
    return {"requests": out, "background_launches": 0, "garbage": 0}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("threaded", "aiohttp"))
    parser.add_argument("--runtime", required=True, type=Path)
    parser.add_argument("--expect", required=True, type=Path)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=60)
    args = parser.parse_args()
    gpu = Gpu(args.runtime)
    run = threaded if args.kind == "threaded" else aio
    result = run(gpu, args.clients, args.requests)
    result["work"] = WORK
    args.expect.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
