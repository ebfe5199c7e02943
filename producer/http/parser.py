"""HTTP/1.1 requests and their responses, rebuilt from what the syscall probes saw.

The probes (bpf/http.bpf.h) report every read and write on a server-side TCP connection: the
bytes moved, their offset in the connection's stream, the first GF_HTTP_HEAD bytes and the
last 16. `HttpParser.feed` takes those records (producer.http.abi.HttpRecord) one by one,
per connection and direction frames the byte stream into messages (Content-Length and chunked
bodies, skipped by count where they were not captured; HEAD, 1xx, 204 and 304 responses
without bodies; bodies that last until close), pairs each response with the oldest request
not yet answered (keep-alive, pipelining), and returns each request once its response has
gone out: method, path (query dropped), a bounded route, status, start (the read that
returned its first byte), end (the write that sent the last byte of the response), bytes in
and out, the thread that read it, and the W3C `traceparent` it carried.

Where a record was lost (its offset jumps) or a head was longer than what was captured, the
framing of that message is unknown: the stream is marked lost until a record starts with a
request line (inbound) or a status line (outbound), or, in a chunked body, until a record ends
with the last chunk. A request head that never ends (no blank line) before the client's end
of stream, or before the server answers it, is a request all the same (Python's http.server
serves it): what was seen of it, never complete (`ProcessStats.heads_cut`); what follows is
framed from the next request line. HTTP/2, TLS and bytes that are not HTTP are not parsed:
counted per process, and each kind is noticed once per process (`take_notices`). Nothing a
client or a server sends makes `feed` raise.

Pure: no BPF, no I/O.
"""

from __future__ import annotations

import hashlib
import logging
import re
import struct
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from gpuflight.producer.http.abi import HttpOp, HttpRecord

log = logging.getLogger(__name__)

#: A request head longer than this is not HTTP we parse (the stream is marked lost).
MAX_HEAD_BYTES: Final = 64 * 1024
#: Distinct routes kept per process; requests of further routes count as OTHER_ROUTE.
DEFAULT_MAX_ROUTES: Final = 200
OTHER_ROUTE: Final = "other"
ID_SEGMENT: Final = "{id}"
#: Routes longer than this are cut (a path is attacker-controlled text).
MAX_ROUTE_CHARS: Final = 200
#: A request still unanswered after this long is closed as incomplete (`expire`).
DEFAULT_MAX_AGE_NS: Final = 15 * 60 * 1_000_000_000

_REQUEST_LINE: Final = re.compile(
    rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]{1,32}) ([\x21-\x7e\x80-\xff]{1,16384}) HTTP/1\.([01])\r?\n"
)
_CUT_REQUEST_LINE: Final = re.compile(
    rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]{1,32}) ([\x21-\x7e\x80-\xff]+)"
)
_STATUS_LINE: Final = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9]{2})(?:[ \t][^\r\n]*)?\r?\n")
_HEAD_END: Final = re.compile(rb"\r?\n\r?\n")
_H2_PREFACE: Final = b"PRI * HTTP/2.0\r\n"
_LAST_CHUNK: Final = b"0\r\n\r\n"
#: Path segments that are ids: numeric, hex of 8 digits or more, or a UUID.
_ID: Final = re.compile(
    r"[0-9]+|[0-9a-fA-F]{8,}"
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
#: The headers the parser reads (the rest of a head is skipped).
_HEADER: Final = re.compile(
    rb"\n(content-length|transfer-encoding|traceparent)[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?(?=\n)",
    re.IGNORECASE,
)
_TRACEPARENT: Final = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S
)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A valid W3C `traceparent`: the caller's trace and the span that called us."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    parent_id: str  # 16 lowercase hex digits, not all zero
    flags: int  # trace-flags; bit 0: sampled

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)


def parse_traceparent(value: str) -> TraceContext | None:
    """A `traceparent` header value per W3C Trace Context level 1, or None when invalid."""
    value = value.strip(" \t")
    match = _TRACEPARENT.fullmatch(value)
    if not match:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff":
        return None
    if version == "00" and rest is not None:
        return None  # version 00 has exactly four fields
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceContext(trace_id, parent_id, int(flags, 16))


def route_of(path: str) -> str:
    """A path's route: numeric, hex (8 digits or more) and UUID segments become `{id}`."""
    out = [ID_SEGMENT if s and _ID.fullmatch(s) else s for s in path.split("/")]
    route = "/".join(out)
    return route if len(route) <= MAX_ROUTE_CHARS else route[:MAX_ROUTE_CHARS] + "…"


def path_of(target: str) -> str:
    """The path of a request target: the query and fragment dropped, an absolute URI's
    scheme and authority too."""
    if target == "*":
        return "*"
    if "://" in target.split("?", 1)[0]:
        after = target.split("://", 1)[1]
        slash = after.find("/")
        target = after[slash:] if slash >= 0 else "/"
    for mark in ("?", "#"):
        target = target.split(mark, 1)[0]
    return target or "/"


class Notice(Enum):
    """What a process does that is not parsed: reported once per process."""

    HTTP2 = "http2"
    TLS = "tls"
    GARBAGE = "garbage"
    UNIX = "unix"


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request and its response."""

    request_id: int  # unique per host (a hash of the connection and the request's place on it)
    pid: int
    tid: int  # the thread that read the request's first bytes
    fd: int
    conn_id: int
    method: str
    path: str
    route: str
    status: int  # 0: no response was seen (closed, lost or expired first)
    start_ns: int  # CLOCK_MONOTONIC: the return of the read that brought its first byte
    end_ns: int  # the return of the write that sent the response's last byte (or the close)
    bytes_in: int
    bytes_out: int
    trace: TraceContext | None
    #: False when the response was not seen whole (connection closed or lost, expired).
    complete: bool
    lport: int = 0


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """A request read and not yet answered (in flight)."""

    request_id: int
    pid: int
    tid: int
    start_ns: int
    route: str = ""


@dataclass
class ProcessStats:
    """Counts per process; none of these is an error in gpuflight."""

    requests: int = 0
    incomplete: int = 0
    connections: int = 0
    http2_connections: int = 0
    tls_connections: int = 0
    garbage_connections: int = 0
    unix_sockets: int = 0
    upgraded_connections: int = 0
    #: Responses with no request to pair with (its head was never seen).
    orphan_responses: int = 0
    #: Records missing from a stream (offsets jumped), and the bytes they held.
    gaps: int = 0
    gap_bytes: int = 0
    #: Times a lost stream found a message start again.
    resyncs: int = 0
    #: Requests whose route went to OTHER_ROUTE (the per-process cap was reached).
    routes_capped: int = 0
    #: Requests whose head never ended (no blank line) before the client's end of stream or
    #: the server's response: taken as what was seen of it, and incomplete.
    heads_cut: int = 0
    malformed_records: int = 0
    #: Internal errors caught at the boundary (a bug if ever non-zero).
    parser_errors: int = 0


class _State(Enum):
    IDLE = 0  # between messages
    HEAD = 1
    BODY = 2
    CHUNK_SIZE = 3
    CHUNK_DATA = 4
    CHUNK_CRLF = 5
    TRAILER = 6
    UNTIL_CLOSE = 7
    LOST = 8  # framing unknown until a message start is seen again
    DEAD = 9  # not HTTP/1.x any more (HTTP/2, TLS, an upgrade): not parsed


@dataclass
class _Head:
    first_line: bytes
    headers: dict[str, list[str]]
    truncated: bool

    def one(self, name: str) -> str | None:
        values = self.headers.get(name)
        return values[-1] if values else None


def _parse_head(raw: bytes, truncated: bool) -> _Head:
    """A message head's first line and the headers the parser reads (names lowercased)."""
    line_end = raw.find(b"\n")
    headers: dict[str, list[str]] = {}
    for name, value in _HEADER.findall(raw, max(line_end, 0)):
        headers.setdefault(name.decode("ascii").lower(), []).append(value.decode("latin-1"))
    return _Head(raw[: line_end + 1] if line_end >= 0 else raw, headers, truncated)


@dataclass
class _Pending:
    request_id: int
    tid: int
    method: str
    path: str
    route: str
    start_ns: int
    trace: TraceContext | None
    bytes_in: int = 0
    status: int = 0
    #: Its head never ended: what was seen of it is all it has (never complete).
    head_cut: bool = False


@dataclass
class _Framer:
    """Frames one direction of a connection into messages."""

    inbound: bool
    state: _State = _State.IDLE
    expected: int = 0  # the stream offset of the next byte
    buf: bytearray = field(default_factory=bytearray)
    remaining: int = 0
    lost_chunked: bool = False
    msg_bytes: int = 0
    msg_start_ns: int = 0
    msg_tid: int = 0
    last_ns: int = 0  # exit time of the last record of this direction
    informational: bool = False  # the last message was a 1xx response


@dataclass
class _Conn:
    pid: int
    fd: int
    conn_id: int
    lport: int
    inbound: _Framer
    outbound: _Framer
    pending: deque[_Pending] = field(default_factory=deque)
    #: The pending request being read (its body may still be coming).
    reading: _Pending | None = None
    seq: int = 0
    kind: Notice | None = None  # what made it DEAD or garbage, once
    response_status: int = 0
    response_for: _Pending | None = None


class _Routes:
    """Distinct routes of one process, capped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.seen: set[str] = set()

    def bound(self, route: str) -> tuple[str, bool]:
        if route in self.seen:
            return route, False
        if len(self.seen) >= self.cap:
            return OTHER_ROUTE, True
        self.seen.add(route)
        return route, False


class HttpParser:
    """Turns the HTTP capture's records into requests, incrementally, for every process."""

    def __init__(
        self,
        host_salt: bytes = b"",
        max_routes: int = DEFAULT_MAX_ROUTES,
        max_age_ns: int = DEFAULT_MAX_AGE_NS,
    ) -> None:
        self._salt = host_salt
        self._max_routes = max_routes
        self._max_age_ns = max_age_ns
        self._conns: dict[tuple[int, int], _Conn] = {}
        self._routes: dict[int, _Routes] = {}
        self._stats: dict[int, ProcessStats] = {}
        self._noticed: set[tuple[int, Notice]] = set()
        self._notices: list[tuple[int, Notice]] = []
        self._done: list[Request] = []

    # -- the public face -------------------------------------------------------

    def feed(self, record: HttpRecord) -> list[Request]:
        """Take one record; return the requests it completed (oldest first)."""
        try:
            self._feed(record)
        except Exception:  # a bug must never cost the capture: count it, drop the connection
            log.debug("HTTP parser error on pid %d fd %d", record.pid, record.fd, exc_info=True)
            self.stats(record.pid).parser_errors += 1
            self._conns.pop((record.pid, record.conn_id), None)
        done, self._done = self._done, []
        return done

    def feed_all(self, records: list[HttpRecord]) -> list[Request]:
        out: list[Request] = []
        for record in records:
            out.extend(self.feed(record))
        return out

    def stats(self, pid: int) -> ProcessStats:
        stats = self._stats.get(pid)
        if stats is None:
            stats = self._stats[pid] = ProcessStats()
        return stats

    def all_stats(self) -> dict[int, ProcessStats]:
        return dict(self._stats)

    def take_notices(self) -> list[tuple[int, Notice]]:
        """(pid, what) for each kind of unparsed traffic seen first since the last call."""
        notices, self._notices = self._notices, []
        return notices

    def open_requests(self, pid: int | None = None) -> list[OpenRequest]:
        """Requests read and not yet answered, of one process or of all."""
        out: list[OpenRequest] = []
        for conn in self._conns.values():
            if pid is not None and conn.pid != pid:
                continue
            out.extend(OpenRequest(p.request_id, conn.pid, p.tid, p.start_ns, p.route)
                       for p in conn.pending)
        return out

    def expire(self, now_ns: int) -> list[Request]:
        """Close, as incomplete, the requests unanswered for longer than max_age_ns."""
        for conn in self._conns.values():
            while conn.pending and now_ns - conn.pending[0].start_ns > self._max_age_ns:
                pending = conn.pending.popleft()
                if conn.response_for is pending:
                    conn.response_for = None
                if conn.reading is pending:
                    conn.reading = None
                self._finish(conn, pending, 0, now_ns, sent=0, complete=False)
                if conn.outbound.state != _State.DEAD:
                    conn.outbound.state = _State.LOST
        done, self._done = self._done, []
        return done

    def forget_pid(self, pid: int) -> list[Request]:
        """A process exited: close its connections (their requests as incomplete)."""
        for key in [k for k in self._conns if k[0] == pid]:
            conn = self._conns.pop(key)
            self._close(conn, max(conn.inbound.last_ns, conn.outbound.last_ns))
        self._routes.pop(pid, None)
        done, self._done = self._done, []
        return done

    # -- records ---------------------------------------------------------------

    def _notice(self, pid: int, kind: Notice) -> None:
        if (pid, kind) not in self._noticed:
            self._noticed.add((pid, kind))
            self._notices.append((pid, kind))

    def _feed(self, rec: HttpRecord) -> None:
        op = rec.op
        if op == HttpOp.UNIX:
            self.stats(rec.pid).unix_sockets += 1
            self._notice(rec.pid, Notice.UNIX)
            return
        key = (rec.pid, rec.conn_id)
        if op == HttpOp.ACCEPT:
            old = self._conns.pop(key, None)
            if old is not None:
                self._close(old, rec.ts_exit_ns)
            self._conns[key] = self._new_conn(rec)
            return
        conn = self._conns.get(key)
        if op == HttpOp.CLOSE:
            if conn is not None:
                del self._conns[key]
                self._close(conn, rec.ts_exit_ns)
            return
        if not (rec.inbound or rec.outbound) or rec.ret < 0:
            self.stats(rec.pid).malformed_records += 1
            return
        if conn is None:  # its accept was lost, or it was seeded: start where we are
            conn = self._conns[key] = self._new_conn(rec)
            conn.inbound.expected = conn.outbound.expected = -1
        framer = conn.inbound if rec.inbound else conn.outbound
        if framer.expected < 0:
            framer.expected = rec.offset
            if rec.offset:
                framer.state = _State.LOST
        if rec.offset > framer.expected:
            stats = self.stats(rec.pid)
            stats.gaps += 1
            stats.gap_bytes += rec.offset - framer.expected
            self._gap(conn, framer, rec, rec.offset - framer.expected)
        elif rec.offset < framer.expected:
            # Overlapping data (a record from before a reset?): skip what was seen.
            self.stats(rec.pid).malformed_records += 1
            return
        framer.expected = rec.offset + rec.ret
        self._record(conn, framer, rec)
        framer.last_ns = rec.ts_exit_ns

    def _new_conn(self, rec: HttpRecord) -> _Conn:
        self.stats(rec.pid).connections += 1
        return _Conn(rec.pid, rec.fd, rec.conn_id, rec.lport, _Framer(True), _Framer(False))

    def _record(self, conn: _Conn, framer: _Framer, rec: HttpRecord) -> None:
        if framer.state == _State.DEAD:
            return
        if rec.ret == 0:  # the peer's end of stream (reads only)
            if framer.inbound and framer.state == _State.HEAD:
                # Nothing more comes: servers (Python's http.server among them) take a head
                # the stream ended in as whole, answer it, and may do GPU work for it first.
                self._cut_head(conn, framer, rec)
            return
        if framer.state == _State.LOST and self._starts_message(framer, rec.head):
            self.stats(conn.pid).resyncs += 1
            self._end_lost(conn, framer)
        head = rec.head[: rec.ret]
        missing = rec.ret - len(head)
        tail = b""
        if missing > 0 and rec.tail:
            tail = rec.tail[-min(missing, len(rec.tail)) :]
            missing -= len(tail)
        self._bytes(conn, framer, rec, head)
        if missing > 0:
            self._gap(conn, framer, rec, missing)
        if tail:
            if framer.state == _State.LOST and framer.lost_chunked and tail.endswith(_LAST_CHUNK):
                self._message_done(conn, framer, rec)
            else:
                self._bytes(conn, framer, rec, tail)
        elif (
            framer.state == _State.LOST
            and framer.lost_chunked
            and missing == 0
            and head.endswith(_LAST_CHUNK)
        ):
            self._message_done(conn, framer, rec)

    def _starts_message(self, framer: _Framer, head: bytes) -> bool:
        line = head[: head.find(b"\n") + 1] if b"\n" in head else b""
        if framer.inbound:
            return bool(_REQUEST_LINE.fullmatch(line))
        return bool(_STATUS_LINE.fullmatch(line))

    def _end_lost(self, conn: _Conn, framer: _Framer) -> None:
        """A lost stream found a message start: what was lost ends before it."""
        if not framer.inbound:
            if conn.pending and conn.response_for is conn.pending[0]:
                pending = conn.pending.popleft()
                self._finish(conn, pending, conn.response_status, framer.last_ns,
                             sent=framer.msg_bytes, complete=False)
            # Responses lost whole: the one starting now answers the newest request.
            while len(conn.pending) > 1:
                self._finish(conn, conn.pending.popleft(), 0, framer.last_ns, sent=0,
                             complete=False)
        elif framer.inbound and conn.reading is not None:
            conn.reading.bytes_in = framer.msg_bytes
            conn.reading = None
        conn.response_for = None
        framer.state = _State.IDLE
        framer.lost_chunked = False
        framer.buf.clear()

    # -- framing ---------------------------------------------------------------

    def _gap(self, conn: _Conn, framer: _Framer, rec: HttpRecord, n: int) -> None:
        """`n` bytes of the stream that were not captured."""
        while n > 0:
            state = framer.state
            if state in (_State.BODY, _State.CHUNK_DATA) and framer.remaining > 0:
                take = min(n, framer.remaining)
                framer.remaining -= take
                framer.msg_bytes += take
                n -= take
                if framer.remaining == 0:
                    if state == _State.BODY:
                        self._message_done(conn, framer, rec)
                    else:
                        framer.state = _State.CHUNK_CRLF
                continue
            framer.msg_bytes += n
            if state in (_State.UNTIL_CLOSE, _State.LOST, _State.DEAD):
                return
            if state == _State.HEAD:
                # The head runs past what was captured: take what it says, frame nothing more.
                self._head_done(conn, framer, rec, bytes(framer.buf), truncated=True)
                if framer.state == _State.DEAD:
                    return
            chunked = state in (_State.CHUNK_SIZE, _State.CHUNK_DATA, _State.CHUNK_CRLF,
                                _State.TRAILER)
            self._lose(conn, framer, chunked=chunked)
            return

    def _bytes(self, conn: _Conn, framer: _Framer, rec: HttpRecord, data: bytes) -> None:
        i = 0
        n = len(data)
        while i < n:
            state = framer.state
            if state in (_State.UNTIL_CLOSE, _State.LOST, _State.DEAD):
                framer.msg_bytes += n - i
                return
            if state == _State.IDLE:
                if data[i] in b"\r\n":  # empty lines between messages are allowed
                    i += 1
                    continue
                framer.state = _State.HEAD
                framer.buf.clear()
                if framer.informational:  # a 1xx's bytes count with the final response
                    framer.informational = False
                else:
                    framer.msg_bytes = 0
                framer.msg_start_ns = rec.ts_exit_ns
                framer.msg_tid = rec.tid
                continue
            if state == _State.HEAD:
                i = self._head_bytes(conn, framer, rec, data, i)
            elif state in (_State.BODY, _State.CHUNK_DATA):
                take = min(framer.remaining, n - i)
                framer.remaining -= take
                framer.msg_bytes += take
                i += take
                if framer.remaining == 0:
                    if state == _State.BODY:
                        self._message_done(conn, framer, rec)
                    else:
                        framer.state = _State.CHUNK_CRLF
            elif state == _State.CHUNK_CRLF:
                byte = data[i]
                i += 1
                framer.msg_bytes += 1
                if byte == 0x0A:  # \n ends it (a bare \n is tolerated)
                    framer.state = _State.CHUNK_SIZE
                    framer.buf.clear()
                elif byte != 0x0D:
                    self._lose(conn, framer, chunked=True)
            else:  # CHUNK_SIZE, TRAILER: lines
                end = data.find(b"\n", i)
                stop = n if end < 0 else end + 1
                framer.buf += data[i:stop]
                framer.msg_bytes += stop - i
                i = stop
                if len(framer.buf) > 4096:
                    self._lose(conn, framer, chunked=True)
                elif end >= 0:
                    self._line(conn, framer, rec)

    def _line(self, conn: _Conn, framer: _Framer, rec: HttpRecord) -> None:
        line = bytes(framer.buf).strip()
        framer.buf.clear()
        if framer.state == _State.TRAILER:
            if not line:
                self._message_done(conn, framer, rec)
            return
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            self._lose(conn, framer, chunked=True)
            return
        if size < 0 or not size_text.isalnum():
            self._lose(conn, framer, chunked=True)
        elif size == 0:
            framer.state = _State.TRAILER
        else:
            framer.state = _State.CHUNK_DATA
            framer.remaining = size

    def _lose(self, conn: _Conn, framer: _Framer, chunked: bool) -> None:
        framer.state = _State.LOST
        framer.lost_chunked = chunked
        framer.buf.clear()

    def _head_bytes(
        self, conn: _Conn, framer: _Framer, rec: HttpRecord, data: bytes, i: int
    ) -> int:
        before = len(framer.buf)
        framer.buf += data[i:]
        if before < 24:
            kind = self._sniff(framer, bytes(framer.buf[:24]))
            if kind is not None:
                self._dead(conn, framer, kind)
                framer.msg_bytes += len(data) - i
                return len(data)
        if not self._first_line_ok(framer):
            self._garbage(conn, framer)
            framer.msg_bytes += len(data) - i
            return len(data)
        match = _HEAD_END.search(framer.buf, max(0, before - 3))
        if match is None:
            if len(framer.buf) > MAX_HEAD_BYTES:
                self._garbage(conn, framer)
            framer.msg_bytes += len(data) - i
            return len(data)
        used = match.end() - before
        framer.msg_bytes += used
        raw = bytes(framer.buf[: match.end()])
        framer.buf.clear()
        self._head_done(conn, framer, rec, raw, truncated=False)
        return i + used

    @staticmethod
    def _first_line_ok(framer: _Framer) -> bool:
        """False once the first line is complete and is not a request (status) line, or is
        too long to be one."""
        end = framer.buf.find(b"\n")
        if end < 0:
            return len(framer.buf) <= 16384 + 64
        pattern = _REQUEST_LINE if framer.inbound else _STATUS_LINE
        return pattern.fullmatch(framer.buf, 0, end + 1) is not None

    def _sniff(self, framer: _Framer, start: bytes) -> Notice | None:
        """HTTP/2's preface or a TLS ClientHello at the start of a request stream."""
        if not framer.inbound or not start:
            return None
        if _H2_PREFACE.startswith(start[: len(_H2_PREFACE)]) and start.startswith(b"PRI "):
            return Notice.HTTP2
        if (
            len(start) >= 6
            and start[0] == 0x16
            and start[1] == 0x03
            and start[2] <= 0x04
            and start[5] == 0x01
        ):
            return Notice.TLS
        return None

    def _dead(self, conn: _Conn, framer: _Framer, kind: Notice) -> None:
        stats = self.stats(conn.pid)
        if kind == Notice.HTTP2:
            stats.http2_connections += 1
        elif kind == Notice.TLS:
            stats.tls_connections += 1
        self._notice(conn.pid, kind)
        conn.kind = kind
        conn.inbound.state = conn.outbound.state = _State.DEAD
        framer.buf.clear()

    def _garbage(self, conn: _Conn, framer: _Framer) -> None:
        if conn.kind is None:
            conn.kind = Notice.GARBAGE
            self.stats(conn.pid).garbage_connections += 1
            self._notice(conn.pid, Notice.GARBAGE)
        self._lose(conn, framer, chunked=False)

    def _head_done(
        self, conn: _Conn, framer: _Framer, rec: HttpRecord, raw: bytes, truncated: bool
    ) -> None:
        if framer.inbound:
            self._request_head(conn, framer, rec, raw, truncated)
        else:
            self._response_head(conn, framer, rec, raw, truncated)

    def _request_head(
        self, conn: _Conn, framer: _Framer, rec: HttpRecord, raw: bytes, truncated: bool
    ) -> None:
        line_end = raw.find(b"\n")
        if line_end >= 0:
            match = _REQUEST_LINE.fullmatch(raw[: line_end + 1])
        elif truncated:  # a target longer than what was captured: its start is the path
            match = _CUT_REQUEST_LINE.fullmatch(raw)
        else:
            match = None
        if match is None:
            self._garbage(conn, framer)
            return
        head = _parse_head(raw, truncated)
        method = match.group(1).decode("ascii")
        path = path_of(match.group(2).decode("latin-1"))
        routes = self._routes.get(conn.pid)
        if routes is None:
            routes = self._routes[conn.pid] = _Routes(self._max_routes)
        route, capped = routes.bound(route_of(path))
        if capped:
            self.stats(conn.pid).routes_capped += 1
        values = head.headers.get("traceparent", [])
        trace = parse_traceparent(values[0]) if len(values) == 1 else None
        pending = _Pending(
            request_id=self._request_id(conn),
            tid=framer.msg_tid,
            method=method,
            path=path,
            route=route,
            start_ns=framer.msg_start_ns,
            trace=trace,
        )
        conn.pending.append(pending)
        conn.reading = pending
        if truncated:
            framer.state = _State.LOST
            return
        framing = self._body_framing(head, request=True)
        if framing is None:
            self._garbage(conn, framer)
            return
        self._start_body(conn, framer, rec, framing)

    def _cut_head(self, conn: _Conn, framer: _Framer, rec: HttpRecord) -> None:
        """The request head being read ends here without its blank line (the client's end of
        stream, or the server answered it): what was seen of it is a request, never complete.
        Bytes that follow are framed from the next request line on."""
        raw = bytes(framer.buf)
        if b"\n" not in raw:  # the request line itself was not ended: whole, or no request
            raw += b"\r\n"
            if not _REQUEST_LINE.fullmatch(raw):
                self._garbage(conn, framer)
                return
        before = len(conn.pending)
        self._request_head(conn, framer, rec, raw, truncated=True)
        framer.buf.clear()
        if len(conn.pending) == before:  # not a request: counted as garbage
            return
        pending = conn.pending[-1]
        pending.head_cut = True
        pending.bytes_in = framer.msg_bytes
        conn.reading = None
        self.stats(conn.pid).heads_cut += 1

    def _response_head(
        self, conn: _Conn, framer: _Framer, rec: HttpRecord, raw: bytes, truncated: bool
    ) -> None:
        line_end = raw.find(b"\n")
        match = _STATUS_LINE.fullmatch(raw[: line_end + 1]) if line_end >= 0 else None
        if match is None:
            self._garbage(conn, framer)
            return
        head = _parse_head(raw, truncated)
        status = int(match.group(2))
        if 100 <= status < 200 and status != 101:
            # 100 Continue and friends: informational, the final response follows.
            framer.informational = True
            if truncated:
                framer.state = _State.LOST
            else:
                framer.state = _State.IDLE
            return
        if not conn.pending and conn.inbound.state == _State.HEAD:
            # An answer to a head still without its blank line: the server took it as whole.
            self._cut_head(conn, conn.inbound, rec)
        if not conn.pending:
            self.stats(conn.pid).orphan_responses += 1
            conn.response_for = None
            framer.state = _State.LOST
            return
        pending = conn.pending[0]
        conn.response_for = pending
        conn.response_status = status
        if status == 101 or (pending.method == "CONNECT" and 200 <= status < 300):
            self.stats(conn.pid).upgraded_connections += 1
            self._message_done(conn, framer, rec)
            conn.inbound.state = conn.outbound.state = _State.DEAD
            return
        if truncated:
            framer.state = _State.LOST
            return
        if pending.method == "HEAD" or status in (204, 304):
            self._message_done(conn, framer, rec)
            return
        framing = self._body_framing(head, request=False)
        if framing is None:
            self._garbage(conn, framer)
            return
        self._start_body(conn, framer, rec, framing)

    @staticmethod
    def _body_framing(head: _Head, request: bool) -> tuple[_State, int] | None:
        """How the body of a message is delimited (None: contradictory framing)."""
        coding = head.one("transfer-encoding")
        if coding is not None:
            if coding.lower().rsplit(",", 1)[-1].strip() == "chunked":
                return _State.CHUNK_SIZE, 0
            return None if request else (_State.UNTIL_CLOSE, 0)
        lengths = {v.strip() for values in head.headers.get("content-length", [])
                   for v in values.split(",")}
        if len(lengths) > 1:
            return None
        if lengths:
            text = lengths.pop()
            if not text.isdigit():
                return None
            return _State.BODY, int(text)
        return (_State.BODY, 0) if request else (_State.UNTIL_CLOSE, 0)

    def _start_body(
        self, conn: _Conn, framer: _Framer, rec: HttpRecord, framing: tuple[_State, int]
    ) -> None:
        state, length = framing
        if state == _State.BODY and length == 0:
            self._message_done(conn, framer, rec)
            return
        framer.state = state
        framer.remaining = length
        framer.buf.clear()

    def _message_done(self, conn: _Conn, framer: _Framer, rec: HttpRecord) -> None:
        framer.state = _State.IDLE
        framer.lost_chunked = False
        framer.buf.clear()
        if framer.inbound:
            if conn.reading is not None:
                conn.reading.bytes_in = framer.msg_bytes
                conn.reading = None
            return
        pending = conn.response_for
        conn.response_for = None
        if pending is not None and conn.pending and conn.pending[0] is pending:
            conn.pending.popleft()
            self._finish(conn, pending, conn.response_status, rec.ts_exit_ns,
                         sent=framer.msg_bytes, complete=True)

    def _close(self, conn: _Conn, ts_ns: int) -> None:
        """The connection closed: a body until close ends; unanswered requests end here."""
        out = conn.outbound
        if conn.reading is not None:
            conn.reading.bytes_in = conn.inbound.msg_bytes
            conn.reading = None
        if out.state == _State.UNTIL_CLOSE and conn.response_for is not None:
            pending = conn.response_for
            if conn.pending and conn.pending[0] is pending:
                conn.pending.popleft()
                self._finish(conn, pending, conn.response_status, out.last_ns or ts_ns,
                             sent=out.msg_bytes, complete=True)
        answered = conn.response_for
        while conn.pending:
            pending = conn.pending.popleft()
            status = conn.response_status if pending is answered else 0
            sent = out.msg_bytes if pending is answered else 0
            end = out.last_ns if pending is answered else ts_ns
            self._finish(conn, pending, status, end, sent=sent, complete=False)

    def _finish(
        self, conn: _Conn, p: _Pending, status: int, end_ns: int, *, sent: int, complete: bool
    ) -> None:
        if conn.reading is p:  # answered before its body was read whole
            p.bytes_in = conn.inbound.msg_bytes
            conn.reading = None
        complete = complete and not p.head_cut
        stats = self.stats(conn.pid)
        stats.requests += 1
        if not complete:
            stats.incomplete += 1
        self._done.append(
            Request(
                request_id=p.request_id,
                pid=conn.pid,
                tid=p.tid,
                fd=conn.fd,
                conn_id=conn.conn_id,
                method=p.method,
                path=p.path,
                route=p.route,
                status=status,
                start_ns=p.start_ns,
                end_ns=max(end_ns, p.start_ns),
                bytes_in=p.bytes_in,
                bytes_out=sent,
                trace=p.trace,
                complete=complete,
                lport=conn.lport,
            )
        )

    def _request_id(self, conn: _Conn) -> int:
        """63 bits, never 0: a hash of the host salt, pid, connection and sequence number."""
        conn.seq += 1
        digest = hashlib.blake2b(
            struct.pack("<IQQ", conn.pid, conn.conn_id, conn.seq),
            digest_size=8,
            key=self._salt[:64],
        ).digest()
        return (int.from_bytes(digest, "little") & ((1 << 63) - 1)) or 1
