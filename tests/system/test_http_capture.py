"""The HTTP capture (bpf/http.bpf.h through bpf/http_proto.bpf.c): its contract with user space,
the source bundling, the BTF offsets, and the programs on this kernel (root, bcc)."""

from __future__ import annotations

import ctypes
import http.client
import http.server
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuflight.producer.http import abi as hr
from gpuflight.producer.http.parser import HttpParser
from gpuflight.producer.probe.bpfsource import bundle
from gpuflight.producer.probe.btf import (
    Btf,
    socket_offsets,
)
from tests.conftest import REPO

pytestmark = pytest.mark.bpf

BPF_DIR = REPO / "bpf"
PROTO = BPF_DIR / "http_proto.bpf.c"
TRACE = "0af7651916cd43dd8448eb211c80319c"


# -- the contract ---------------------------------------------------------------------------


# -- one source for bcc ---------------------------------------------------------------------


# -- BTF ------------------------------------------------------------------------------------


# -- on the kernel --------------------------------------------------------------------------

class Capture:
    """bpf/http_proto.bpf.c loaded with bcc; the records it emits, decoded."""

    def __init__(self, cflags: list[str]) -> None:
        from bcc import BPF  # tests may import bcc; producer code goes through probes.py

        self.bpf: Any = BPF(text=bundle(PROTO).encode(), cflags=[f"-I{BPF_DIR}", *cflags])
        self.records: list[hr.HttpRecord] = []
        self.bpf[b"http_events"].open_ring_buffer(self._on_record)

    def _on_record(self, _ctx: Any, data: Any, size: int) -> None:
        self.records.append(hr.decode(ctypes.string_at(data, size)))

    def scope(self, table: str, pid: int, on: bool = True) -> None:
        t = self.bpf[table.encode()]
        if on:
            t[t.Key(pid)] = t.Leaf(1)
        else:
            del t[t.Key(pid)]

    def take(self, pid: int | None = None) -> list[hr.HttpRecord]:
        self.bpf.ring_buffer_consume()
        out = [r for r in self.records if pid is None or r.pid == pid]
        self.records.clear()
        return out

    def drops(self) -> list[int]:
        table = self.bpf[b"http_drops"]
        return [sum(int(v) for v in table[table.Key(slot)]) for slot in range(hr.SLOTS)]

    def close(self) -> None:
        self.bpf.cleanup()


@pytest.fixture(scope="class")
def filtered() -> Iterator[Capture]:
    """GF_FILTER_PIDS=1 with the socket walk; this process in scope."""
    cap = Capture(["-DGF_FILTER_PIDS=1", *socket_offsets(Btf.from_file()).cflags()])
    cap.scope("scope_pids", os.getpid())
    yield cap
    cap.close()


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    """(listener, client, the accepted server side) on loopback."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    return listener, client, server


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        assert chunk
        got += chunk
    return got


class TestFiltered:
    @pytest.fixture(autouse=True)
    def _fresh(self, filtered: Capture) -> None:
        filtered.take()  # what earlier tests left (their closes)
    def test_accept_reads_and_writes_of_every_kind(self, filtered: Capture) -> None:
        listener, client, server = _pair()
        pid, fd = os.getpid(), server.fileno()
        port = listener.getsockname()[1]
        with listener, client, server:
            accept, *rest = filtered.take(pid)
            assert rest == []
            assert (accept.op, accept.ret, accept.family, accept.flags) == (
                hr.HttpOp.ACCEPT, fd, hr.AF_INET, 0)
            assert (accept.lport, accept.rport, accept.peer) == (
                port, client.getsockname()[1], "127.0.0.1")
            inbound = [b"a" * 10, b"bb" * 10, b"c" * 30, b"d" * 40, b"e" * 50]
            for data in inbound:
                client.sendall(data)
            assert server.recv(10) == inbound[0]                         # recvfrom
            assert os.read(fd, 20) == inbound[1]                         # read
            bufs = [bytearray(5), bytearray(25)]
            assert os.readv(fd, bufs) == 30 and bytes(bufs[0] + bufs[1]) == inbound[2]
            assert server.recvmsg(40)[0] == inbound[3]                   # recvmsg
            peek = server.recv(50, socket.MSG_PEEK)                      # not recorded
            assert server.recv(50) == peek == inbound[4]
            outbound = [b"1" * 11, b"2" * 12, b"3" * 13, b"4" * 14]
            server.send(outbound[0])                                     # sendto
            os.write(fd, outbound[1])                                    # write
            os.writev(fd, [outbound[2][:3], outbound[2][3:]])            # writev
            server.sendmsg([outbound[3]])                                # sendmsg
            with tempfile.TemporaryFile() as f:
                f.write(b"F" * 3000)
                f.flush()
                assert os.sendfile(fd, f.fileno(), 0, 3000) == 3000      # sendfile64
            _recv_exactly(client, sum(map(len, outbound)) + 3000)
        got = filtered.take(pid)
        ops = [r.op for r in got]
        assert ops[:9] == [
            hr.HttpOp.RECVFROM, hr.HttpOp.READ, hr.HttpOp.READV, hr.HttpOp.RECVMSG,
            hr.HttpOp.RECVFROM, hr.HttpOp.SENDTO, hr.HttpOp.WRITE, hr.HttpOp.WRITEV,
            hr.HttpOp.SENDMSG]
        assert ops[9:] == [hr.HttpOp.SENDFILE, hr.HttpOp.CLOSE]
        moved = got[:9]
        assert [r.head for r in moved] == inbound + outbound
        assert all(r.fd == fd and r.conn_id == accept.conn_id and r.tid == threading.get_native_id()
                   and r.ts_enter_ns <= r.ts_exit_ns for r in got)
        # Offsets run on without a gap in each direction.
        assert [r.offset for r in moved[:5]] == [0, 10, 30, 60, 100]
        assert [r.offset for r in moved[5:]] == [0, 11, 23, 36]
        sent_file, closed = got[9], got[10]
        assert (sent_file.ret, sent_file.offset, sent_file.head) == (3000, 50, b"")
        assert (closed.offset, closed.ret) == (150, 3050)  # bytes in and out, in total

    def test_data_longer_than_the_head_keeps_its_last_bytes(self, filtered: Capture) -> None:
        listener, client, server = _pair()
        pid, fd = os.getpid(), server.fileno()
        with listener, client, server:
            filtered.take(pid)
            big = bytes(range(256)) * 20  # 5120 bytes
            server.sendall(big)
            _recv_exactly(client, len(big))
            parts = [b"x" * 700, b"y" * 700, b"z" * 100 + b"0\r\n\r\n" + b"END......."]
            os.writev(fd, parts)
            _recv_exactly(client, sum(map(len, parts)))
            client.sendall(big)
            got = _recv_exactly(server, len(big))
            records = filtered.take(pid)
        sends = [r for r in records if r.op == hr.HttpOp.SENDTO]
        assert sum(r.ret for r in sends) == len(big)
        first = sends[0]
        assert first.head == big[: len(first.head)] and len(first.head) == min(first.ret, 1024)
        if first.ret > 1024:
            assert first.tail == big[first.ret - 16 : first.ret]
        (vec,) = [r for r in records if r.op == hr.HttpOp.WRITEV]
        joined = b"".join(parts)
        assert (vec.ret, vec.head, vec.tail) == (len(joined), joined[:1024], joined[-16:])
        reads = [r for r in records if r.op == hr.HttpOp.RECVFROM]
        assert sum(r.ret for r in reads) == len(got) == len(big)

    def test_accept_without_an_address_is_walked_to_its_socket(self, filtered: Capture) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with listener, socket.create_connection(listener.getsockname()) as client:
            client_port = client.getsockname()[1]
            fd = libc.accept4(listener.fileno(), None, None, 0)
            assert fd >= 0, os.strerror(ctypes.get_errno())
            try:
                os.write(fd, b"hi")
                assert client.recv(2) == b"hi"
                accept, write = filtered.take(os.getpid())
            finally:
                os.close(fd)
        assert (accept.op, accept.family, accept.flags, accept.rport) == (
            hr.HttpOp.ACCEPT, hr.AF_INET, 0, client_port)
        assert write.op == hr.HttpOp.WRITE and write.head == b"hi"

    def test_unix_sockets_are_reported_once_and_not_tracked(
        self, filtered: Capture, tmp_path: Path
    ) -> None:
        path = str(tmp_path / "s")
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(path)
            listener.listen()
            for _ in range(2):
                with socket.socket(socket.AF_UNIX) as client:
                    client.connect(path)
                    server, _ = listener.accept()
                    with server:
                        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
                        server.recv(100)
                        server.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        records = filtered.take(os.getpid())
        assert [(r.op, r.family) for r in records] in ([], [(hr.HttpOp.UNIX, hr.AF_UNIX)])
        # Once per process, for the program's lifetime: an earlier test may have been first.
        assert all(r.op == hr.HttpOp.UNIX for r in records)

    def test_out_of_scope_processes_and_client_sockets_are_not_captured(
        self, filtered: Capture
    ) -> None:
        filtered.scope("scope_pids", os.getpid(), on=False)
        try:
            listener, client, server = _pair()
            with listener, client, server:
                client.sendall(b"x")
                server.recv(1)
                assert filtered.take(os.getpid()) == []
        finally:
            filtered.scope("scope_pids", os.getpid())
        listener, client, server = _pair()
        with listener, client, server:
            client.sendall(b"to the server")  # the client side was connected, not accepted
            server.recv(100)
        ops = [r.op for r in filtered.take(os.getpid())]
        assert ops == [hr.HttpOp.ACCEPT, hr.HttpOp.RECVFROM, hr.HttpOp.CLOSE]

    def test_a_closed_fd_is_forgotten(self, filtered: Capture) -> None:
        listener, client, server = _pair()
        fd = server.fileno()
        with listener, client:
            server.close()
            r, w = os.pipe()  # likely takes the fd number that was the socket's
            try:
                os.write(w, b"pipe")
                os.read(r, 4)
            finally:
                os.close(r)
                os.close(w)
            ops = [(x.op, x.fd) for x in filtered.take(os.getpid())]
        assert ops == [(hr.HttpOp.ACCEPT, fd), (hr.HttpOp.CLOSE, fd)]

    def test_a_real_threaded_server_end_to_end(self, filtered: Capture) -> None:
        """http.server with keep-alive clients on several threads: the records become the
        requests each handler thread served, with their traceparent."""
        served: dict[str, int] = {}

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                served[path] = threading.get_native_id()
                if path.startswith("/chunked"):
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for part in (b"a" * 3000, b"b" * 10):
                        self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                body = b"x" * (int(path.rsplit("/", 1)[1]) % 7 * 500)
                self.send_response(404 if path.endswith("/13") else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                served[self.path] = threading.get_native_id()
                length = int(self.headers["Content-Length"])
                self.rfile.read(length)
                self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = server.server_address[1]
        runner = threading.Thread(target=server.serve_forever, daemon=True)
        runner.start()

        def client(n: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port)
            for i in range(20):
                headers = {"traceparent": f"00-{TRACE}-{n:04x}{i:012x}-01"} if i % 2 else {}
                if i == 5:
                    conn.request("POST", f"/upload/{n}/{i}", body=b"p" * 5000, headers=headers)
                elif i == 7:
                    conn.request("GET", f"/chunked/{n}/{i}", headers=headers)
                else:
                    conn.request("GET", f"/items/{n}/{i}?secret=1", headers=headers)
                response = conn.getresponse()
                response.read()
            conn.close()

        threads = [threading.Thread(target=client, args=(n,)) for n in range(1, 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        server.shutdown()
        server.server_close()
        runner.join()
        parser = HttpParser()
        requests = parser.feed_all(filtered.take(os.getpid()))
        assert len(requests) == 60
        by_path = {r.path: r for r in requests}
        assert len(by_path) == 60
        stats = parser.stats(os.getpid())
        assert (stats.gaps, stats.garbage_connections, stats.parser_errors) == (0, 0, 0)
        for n in range(1, 4):
            for i in range(20):
                kind = "upload" if i == 5 else "chunked" if i == 7 else "items"
                r = by_path[f"/{kind}/{n}/{i}"]
                assert r.method == ("POST" if i == 5 else "GET")
                assert r.route == f"/{kind}/{{id}}/{{id}}"
                assert r.status == (201 if i == 5 else 404 if i == 13 else 200)
                assert r.complete and r.lport == port and r.start_ns < r.end_ns
                assert r.tid == served[f"/{kind}/{n}/{i}"]  # the handler thread read it
                if i % 2:
                    assert r.trace is not None and r.trace.trace_id == TRACE
                    assert r.trace.parent_id == f"{n:04x}{i:012x}"
                else:
                    assert r.trace is None
                if i == 5:
                    assert r.bytes_in > 5000
                if kind == "items":
                    assert r.bytes_out > i % 7 * 500


@pytest.fixture(scope="class")
def nodewide() -> Iterator[Capture]:
    """GF_FILTER_PIDS=0, no socket walk, a one-page ring."""
    cap = Capture(["-DGF_FILTER_PIDS=0", "-DGF_HTTP_RINGBUF_PAGES=1", "-DGF_HTTP_HEAD=64"])
    yield cap
    cap.close()


class TestNodeWide:
    @pytest.fixture(autouse=True)
    def _fresh(self, nodewide: Capture) -> None:
        nodewide.take()
    def test_scope_is_the_map_user_space_fills(self, nodewide: Capture) -> None:
        listener, client, server = _pair()
        with listener, client, server:
            client.sendall(b"x")
            server.recv(1)
        assert nodewide.take(os.getpid()) == []
        nodewide.scope("http_pids", os.getpid())
        try:
            listener, client, server = _pair()
            with listener, client, server:
                client.sendall(b"y")
                server.recv(1)
            ops = [r.op for r in nodewide.take(os.getpid())]
        finally:
            nodewide.scope("http_pids", os.getpid(), on=False)
        assert ops == [hr.HttpOp.ACCEPT, hr.HttpOp.RECVFROM, hr.HttpOp.CLOSE]

    def test_without_the_walk_the_address_decides(self, nodewide: Capture) -> None:
        nodewide.scope("http_pids", os.getpid())
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            listener, client, server = _pair()
            with listener, client, server:
                (accept,) = nodewide.take(os.getpid())
                assert (accept.family, accept.flags, accept.rport) == (
                    hr.AF_INET, hr.F_NO_WALK, client.getsockname()[1])
                assert accept.lport == 0  # only the walk knows the local port
                with socket.create_connection(listener.getsockname()) as other:
                    fd = libc.accept4(listener.fileno(), None, None, 0)
                    assert fd >= 0
                    os.close(fd)
                    _ = other
                unknown = [r for r in nodewide.take(os.getpid()) if r.op == hr.HttpOp.ACCEPT]
                assert [(r.family, r.flags) for r in unknown] == [(0, hr.F_NO_WALK)]
        finally:
            nodewide.scope("http_pids", os.getpid(), on=False)
        assert nodewide.drops()[hr.NO_WALK] >= 2

    def test_a_full_ring_is_counted_and_the_offsets_show_the_gap(
        self, nodewide: Capture
    ) -> None:
        nodewide.scope("http_pids", os.getpid())
        try:
            listener, client, server = _pair()
            with listener, client, server:
                nodewide.take(os.getpid())
                before = nodewide.drops()[hr.DROP_RING]
                for _ in range(200):  # ~170 bytes a record, 4 KiB of ring, not drained
                    server.send(b"z" * 100)
                _recv_exactly(client, 20_000)
                records = [r for r in nodewide.take(os.getpid()) if r.op == hr.HttpOp.SENDTO]
                lost = nodewide.drops()[hr.DROP_RING] - before
            (closed,) = nodewide.take(os.getpid())
        finally:
            nodewide.scope("http_pids", os.getpid(), on=False)
        assert lost > 0 and len(records) + lost == 200
        assert [r.offset for r in records] == [100 * i for i in range(len(records))]
        # The close says how much went out in all: user space knows what it missed.
        assert (closed.op, closed.ret) == (hr.HttpOp.CLOSE, 20_000)

    def test_a_seeded_connection_joins_mid_stream(self, nodewide: Capture) -> None:
        """A connection accepted before the program was loaded, added by user space."""
        listener, client, server = _pair()
        with listener, client, server:
            nodewide.scope("http_pids", os.getpid())
            try:
                conns = nodewide.bpf[b"http_conns"]
                key = conns.Key(os.getpid(), server.fileno())
                value = conns.Leaf(77, hr.SEED_OFFSET, hr.SEED_OFFSET, hr.AF_INET, 0, hr.C_SEEDED)
                conns[key] = value
                client.sendall(b"ly the end of a body")
                server.recv(100)
                (rec,) = nodewide.take(os.getpid())
            finally:
                nodewide.scope("http_pids", os.getpid(), on=False)
                del nodewide.bpf[b"http_conns"][key]
        assert (rec.conn_id, rec.offset, rec.head) == (77, hr.SEED_OFFSET, b"ly the end of a body")
