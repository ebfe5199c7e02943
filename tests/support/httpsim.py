"""The records the HTTP probes (bpf/http.bpf.h) would emit for a connection, built in Python:
each read or write keeps its first `head` bytes and, when longer, its last 16, with the
stream offsets and times the kernel gives. For the parser's tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuflight.producer.http.abi import AF_INET, TAIL, HttpOp, HttpRecord


@dataclass
class Wire:
    pid: int = 4242
    fd: int = 7
    conn_id: int = 1_000_000
    head: int = 1024
    lport: int = 8000
    tid: int = 4243
    now: int = 1_000_000_000
    bytes_in: int = 0
    bytes_out: int = 0
    step: int = 1000
    records: list[HttpRecord] = field(default_factory=list)

    def _tick(self) -> tuple[int, int]:
        enter = self.now
        self.now += self.step
        return enter, self.now

    def _emit(self, rec: HttpRecord) -> HttpRecord:
        self.records.append(rec)
        return rec

    def accept(self) -> HttpRecord:
        enter, exit_ = self._tick()
        return self._emit(HttpRecord(
            op=HttpOp.ACCEPT, pid=self.pid, tid=self.tid, fd=self.fd, conn_id=self.conn_id,
            ts_enter_ns=enter, ts_exit_ns=exit_, offset=0, ret=self.fd, flags=0, head=b"",
            tail=b"", family=AF_INET, lport=self.lport, rport=50000,
            raddr=bytes([127, 0, 0, 1]) + bytes(12),
        ))

    def _data(self, op: HttpOp, data: bytes, offset: int, tid: int | None) -> HttpRecord:
        enter, exit_ = self._tick()
        tail = data[-TAIL:] if len(data) > self.head else b""
        head = data[: self.head]
        if op == HttpOp.SENDFILE:  # bytes only: the data is in a file
            head = tail = b""
        return HttpRecord(
            op=op, pid=self.pid, tid=self.tid if tid is None else tid, fd=self.fd,
            conn_id=self.conn_id, ts_enter_ns=enter, ts_exit_ns=exit_, offset=offset,
            ret=len(data), flags=0, head=head, tail=tail,
        )

    def read(self, data: bytes, tid: int | None = None, op: HttpOp = HttpOp.RECVFROM,
             lost: bool = False) -> HttpRecord:
        """The server read `data`; with `lost`, its record never reached user space."""
        rec = self._data(op, data, self.bytes_in, tid)
        self.bytes_in += len(data)
        return rec if lost else self._emit(rec)

    def write(self, data: bytes, tid: int | None = None, op: HttpOp = HttpOp.SENDTO,
              lost: bool = False) -> HttpRecord:
        rec = self._data(op, data, self.bytes_out, tid)
        self.bytes_out += len(data)
        return rec if lost else self._emit(rec)

    def close(self) -> HttpRecord:
        enter, exit_ = self._tick()
        return self._emit(HttpRecord(
            op=HttpOp.CLOSE, pid=self.pid, tid=self.tid, fd=self.fd, conn_id=self.conn_id,
            ts_enter_ns=enter, ts_exit_ns=exit_, offset=self.bytes_in, ret=self.bytes_out,
            flags=0, head=b"", tail=b"",
        ))


def response(status: int = 200, body: bytes = b"ok", extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def chunked(body: bytes, size: int) -> bytes:
    """`body` as a chunked message body in chunks of `size` bytes."""
    out = b""
    for i in range(0, len(body), size):
        part = body[i : i + size]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"
