"""producer/http/parser.py: HTTP/1.1 requests rebuilt from the syscall records (pure, no BPF)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuflight.producer.http.abi import HttpOp, HttpRecord
from gpuflight.producer.http.parser import (
    OTHER_ROUTE,
    HttpParser,
    Notice,
    Request,
    parse_traceparent,
    path_of,
    route_of,
)
from tests.support.httpsim import Wire, chunked, response

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def feed(parser: HttpParser, wire: Wire) -> list[Request]:
    out = parser.feed_all(wire.records)
    wire.records.clear()
    return out


def test_keep_alive_requests_with_times_bytes_and_thread() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    got = []
    for i in range(3):
        req = f"GET /items/{i}?q=secret HTTP/1.1\r\nHost: a\r\n\r\n".encode()
        read = w.read(req, tid=100 + i)
        resp = response(200, b"x" * (10 + i))
        write = w.write(resp)
        (done,) = feed(p, w)
        got.append(done)
        assert (done.method, done.path, done.route, done.status) == (
            "GET", f"/items/{i}", "/items/{id}", 200)
        assert done.start_ns == read.ts_exit_ns and done.end_ns == write.ts_exit_ns
        assert (done.bytes_in, done.bytes_out) == (len(req), len(resp))
        assert done.tid == 100 + i and done.fd == w.fd and done.lport == 8000
        assert done.complete and done.trace is None
    assert len({r.request_id for r in got}) == 3
    assert p.stats(w.pid).requests == 3 and p.stats(w.pid).connections == 1


def test_pipelined_requests_pair_with_responses_in_order() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyzGET /c HTTP/1.1"
           b"\r\n\r\n")
    assert [o.tid for o in p.open_requests(w.pid)] == []  # not fed yet
    feed(p, w)
    assert len(p.open_requests(w.pid)) == 3
    w.write(response(200, b"a") + response(201, b"bb"))
    w.write(response(404, b""))
    done = feed(p, w)
    assert [(r.path, r.method, r.status) for r in done] == [
        ("/a", "GET", 200), ("/b", "POST", 201), ("/c", "GET", 404)]
    assert done[1].bytes_in == len(b"POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyz")
    assert p.open_requests(w.pid) == []


def test_bodies_larger_than_the_capture_are_skipped_by_count() -> None:
    p, w = HttpParser(), Wire(head=512)
    w.accept()
    body = bytes(range(256)) * 300  # 76,800 bytes, binary
    head = f"POST /infer HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    w.read(head + body[:20_000])
    w.read(body[20_000:50_000])
    w.read(body[50_000:] + b"GET /next HTTP/1.1\r\n\r\n")  # the next request's start is lost
    big = b"r" * 100_000
    w.write(response(200, big))
    done = feed(p, w)
    assert [(r.path, r.status, r.bytes_in) for r in done] == [
        ("/infer", 200, len(head) + len(body))]
    assert done[0].bytes_out == len(response(200, big))
    # The pipelined "/next" sat past the captured head of that read: found again at the next
    # record that starts with a request line.
    w.read(b"GET /after HTTP/1.1\r\n\r\n")
    w.write(response(200, b"1"))
    w.write(response(200, b"2"))
    later = feed(p, w)
    assert [r.path for r in later] == ["/after"]


def test_chunked_bodies_both_ways_across_records() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    body = chunked(b"hello world, " * 20, 7)
    req = b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    for i in range(0, len(req), 50):
        w.read(req[i : i + 50])
    resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked(b"z" * 500, 64)
    for i in range(0, len(resp), 33):
        w.write(resp[i : i + 33])
    (done,) = feed(p, w)
    assert (done.path, done.status, done.bytes_in, done.bytes_out) == (
        "/c", 200, len(req), len(resp))
    assert done.complete


def test_a_chunked_response_past_the_capture_ends_at_its_last_chunk() -> None:
    """The chunk sizes lie in bytes never captured: the record's last 16 bytes show its end."""
    p, w = HttpParser(), Wire(head=256)
    w.accept()
    w.read(b"GET /stream HTTP/1.1\r\n\r\n")
    resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"t" * 5000, 100)
    w.write(resp[:3000])
    assert feed(p, w) == []
    last = w.write(resp[3000:])
    (done,) = feed(p, w)
    assert done.end_ns == last.ts_exit_ns and done.status == 200
    w.read(b"GET /two HTTP/1.1\r\n\r\n")
    w.write(response(200, b"k"))
    assert [r.path for r in feed(p, w)] == ["/two"]


def test_expect_100_continue() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"PUT /up HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    w.read(b"12345")
    final = w.write(response(201, b"done"))
    (done,) = feed(p, w)
    assert (done.status, done.end_ns, done.bytes_out) == (
        201, final.ts_exit_ns, len(b"HTTP/1.1 100 Continue\r\n\r\n") + len(response(201, b"done")))


@pytest.mark.parametrize(("method", "status"), [("HEAD", 200), ("GET", 204), ("GET", 304)])
def test_responses_without_bodies(method: str, status: int) -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(f"{method} /h HTTP/1.1\r\n\r\n".encode())
    # A Content-Length that describes the body a GET would get: no body follows.
    w.write(f"HTTP/1.1 {status} X\r\nContent-Length: 1234\r\n\r\n".encode())
    w.read(b"GET /next HTTP/1.1\r\n\r\n")
    w.write(response(200, b"n"))
    done = feed(p, w)
    assert [(r.path, r.status) for r in done] == [("/h", status), ("/next", 200)]


def test_a_body_until_close_ends_with_the_last_write() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"GET /old HTTP/1.0\r\n\r\n")
    w.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    last = w.write(b"all of it")
    assert feed(p, w) == []
    w.close()
    (done,) = feed(p, w)
    assert (done.status, done.end_ns, done.complete) == (200, last.ts_exit_ns, True)


def test_a_lost_record_inside_a_body_costs_nothing() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"POST /p HTTP/1.1\r\nContent-Length: 3000\r\n\r\n" + b"a" * 1000)
    w.read(b"b" * 1000, lost=True)
    w.read(b"c" * 1000)
    w.read(b"GET /q HTTP/1.1\r\n\r\n")
    w.write(response(200, b"1") + response(200, b"2"))
    assert [r.path for r in feed(p, w)] == ["/p", "/q"]
    assert p.stats(w.pid).gaps == 1 and p.stats(w.pid).gap_bytes == 1000


def test_a_lost_message_boundary_resyncs_at_the_next_request_line() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"GET /1 HTTP/1.1\r\n\r\n")
    w.write(response(200, b"1"))
    w.read(b"GET /2 HTTP/1.1\r\n\r\n", lost=True)
    w.write(response(200, b"2"), lost=True)
    w.read(b"GET /3 HTTP/1.1\r\n\r\n")
    w.write(response(500, b"3"))
    done = feed(p, w)
    assert [(r.path, r.status) for r in done] == [("/1", 200), ("/3", 500)]
    assert p.stats(w.pid).resyncs >= 1


def test_a_head_longer_than_the_capture() -> None:
    p, w = HttpParser(), Wire(head=128)
    w.accept()
    cookie = "c" * 600
    w.read(f"POST /big/123 HTTP/1.1\r\nCookie: {cookie}\r\nContent-Length: 10\r\n\r\n0123456789"
           .encode())
    w.write(response(200, b"ok"))
    w.read(b"GET /small HTTP/1.1\r\n\r\n")
    w.write(response(200, b"ok"))
    done = feed(p, w)
    assert [(r.path, r.route, r.status) for r in done] == [
        ("/big/123", "/big/{id}", 200), ("/small", "/small", 200)]


def test_a_request_line_longer_than_the_capture() -> None:
    p, w = HttpParser(), Wire(head=64)
    w.accept()
    w.read(b"GET /search/" + b"x" * 300 + b"?q=1 HTTP/1.1\r\n\r\n")
    w.write(response(200, b"ok"))
    (done,) = feed(p, w)
    assert done.method == "GET" and done.path.startswith("/search/xxx") and done.status == 200


def test_close_with_requests_unanswered() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"GET /slow HTTP/1.1\r\n\r\n")
    assert len(p.open_requests()) == 0 or True
    feed(p, w)
    (open_,) = p.open_requests(w.pid)
    assert open_.tid == w.tid
    closed = w.close()
    (done,) = feed(p, w)
    assert (done.status, done.complete, done.end_ns) == (0, False, closed.ts_exit_ns)
    assert p.stats(w.pid).incomplete == 1


def test_expire_closes_stale_requests() -> None:
    p, w = HttpParser(max_age_ns=1000), Wire()
    w.accept()
    read = w.read(b"GET /hang HTTP/1.1\r\n\r\n")
    feed(p, w)
    assert p.expire(read.ts_exit_ns + 500) == []
    (done,) = p.expire(read.ts_exit_ns + 5000)
    assert done.path == "/hang" and not done.complete
    assert p.open_requests() == []


def test_traceparent_is_parsed_and_validated() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(f"GET / HTTP/1.1\r\ntraceparent: 00-{TRACE}-{PARENT}-01\r\n\r\n".encode())
    w.write(response())
    (done,) = feed(p, w)
    assert done.trace is not None
    assert (done.trace.trace_id, done.trace.parent_id, done.trace.sampled) == (TRACE, PARENT, True)
    w.read(f"GET / HTTP/1.1\r\ntraceparent: 00-{TRACE}-{PARENT}-01\r\n"
           f"Traceparent: 00-{TRACE}-{PARENT}-00\r\n\r\n".encode())
    w.write(response())
    (twice,) = feed(p, w)
    assert twice.trace is None  # two values: not one trace


@pytest.mark.parametrize("value", [
    f"00-{TRACE}-{PARENT}-01",
    f" 00-{TRACE}-{PARENT}-00\t",
    f"01-{TRACE}-{PARENT}-01-what-comes-next",  # a later version may add fields
    f"cc-{TRACE}-{PARENT}-09",
])
def test_valid_traceparents(value: str) -> None:
    ctx = parse_traceparent(value)
    assert ctx is not None and ctx.trace_id == TRACE and ctx.parent_id == PARENT


@pytest.mark.parametrize("value", [
    "",
    f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
    f"00-{TRACE}-{PARENT}-01-extra",  # version 00 has four fields
    f"00-{TRACE.upper()}-{PARENT}-01",  # uppercase hex
    f"00-{'0' * 32}-{PARENT}-01",
    f"00-{TRACE}-{'0' * 16}-01",
    f"00-{TRACE[:-1]}-{PARENT}-01",
    f"00-{TRACE}-{PARENT}-1",
    f"00_{TRACE}_{PARENT}_01",
    f"0g-{TRACE}-{PARENT}-01",
    f"01-{TRACE}-{PARENT}-01x",
])
def test_invalid_traceparents(value: str) -> None:
    assert parse_traceparent(value) is None


@pytest.mark.parametrize(("path", "route"), [
    ("/v1/models/42/infer", "/v1/models/{id}/infer"),
    ("/users/deadbeef/avatar", "/users/{id}/avatar"),
    ("/users/dead/avatar", "/users/dead/avatar"),  # 4 hex digits: a word
    ("/jobs/123e4567-e89b-12d3-a456-426614174000", "/jobs/{id}"),
    ("/jobs/123E4567-E89B-12D3-A456-426614174000/logs", "/jobs/{id}/logs"),
    ("/", "/"),
    ("/v2", "/v2"),
    ("/a//1/", "/a//{id}/"),
])
def test_routes(path: str, route: str) -> None:
    assert route_of(path) == route


@pytest.mark.parametrize(("target", "path"), [
    ("/a?b=c", "/a"), ("/a#frag", "/a"), ("http://host:8/x/y?z", "/x/y"), ("http://host", "/"),
    ("*", "*"), ("/", "/"),
])
def test_paths(target: str, path: str) -> None:
    assert path_of(target) == path


def test_routes_are_capped_per_process_with_an_other_bucket() -> None:
    p = HttpParser(max_routes=3)
    for pid in (1, 2):
        w = Wire(pid=pid, conn_id=pid)
        w.accept()
        for name in ("a", "b", "c", "d", "e", "a"):
            w.read(f"GET /{name}/7 HTTP/1.1\r\n\r\n".encode())
            w.write(response())
        done = feed(p, w)
        assert [r.route for r in done] == [
            "/a/{id}", "/b/{id}", "/c/{id}", OTHER_ROUTE, OTHER_ROUTE, "/a/{id}"]
        assert p.stats(pid).routes_capped == 2


def test_http2_tls_garbage_and_unix_are_counted_and_noticed_once_per_process() -> None:
    p = HttpParser()
    kinds = {
        Notice.HTTP2: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04",
        Notice.TLS: bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03]),
        Notice.GARBAGE: b"\x00\x01binary protocol\xff\xfe\n\n",
    }
    for n, data in enumerate(kinds.values()):
        for again in range(2):
            w = Wire(conn_id=10 * n + again)
            w.accept()
            w.read(data)
            w.read(b"more bytes")
            w.write(b"whatever the server says")
            assert feed(p, w) == []
    unix = HttpRecord(op=HttpOp.UNIX, pid=4242, tid=1, fd=3, conn_id=0, ts_enter_ns=0,
                      ts_exit_ns=0, offset=0, ret=3, flags=0, head=b"", tail=b"")
    p.feed(unix)
    p.feed(unix)
    stats = p.stats(4242)
    assert (stats.http2_connections, stats.tls_connections, stats.garbage_connections,
            stats.unix_sockets) == (2, 2, 2, 2)
    assert sorted(k.value for _, k in p.take_notices()) == ["garbage", "http2", "tls", "unix"]
    assert p.take_notices() == []
    assert stats.parser_errors == 0


def test_garbage_then_http_on_a_new_record_is_parsed() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"\x16\x17 not http at all\r\n\r\n")
    w.read(b"GET /ok HTTP/1.1\r\n\r\n")
    w.write(response(200, b"fine"))
    assert [r.path for r in feed(p, w)] == ["/ok"]


def test_a_connection_joined_mid_stream() -> None:
    """No accept seen (a seeded connection): nothing is parsed until a message starts."""
    p, w = HttpParser(), Wire()
    w.bytes_in = w.bytes_out = 1 << 62
    w.read(b"dy of something we never saw the start of")
    w.write(b"nse body")
    w.read(b"GET /fresh HTTP/1.1\r\n\r\n")
    w.write(response(200, b"!"))
    assert [r.path for r in feed(p, w)] == ["/fresh"]
    assert p.stats(w.pid).garbage_connections == 0


def test_request_ids_are_unique_across_connections_and_hosts() -> None:
    ids = set()
    for salt in (b"host-a", b"host-b"):
        p = HttpParser(host_salt=salt)
        for conn in range(20):
            w = Wire(conn_id=conn)
            w.accept()
            for _ in range(10):
                w.read(b"GET / HTTP/1.1\r\n\r\n")
                w.write(response())
            for r in feed(p, w):
                assert 0 < r.request_id < 1 << 63
                ids.add(r.request_id)
    assert len(ids) == 400


def test_forget_pid_closes_its_connections() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"GET /x HTTP/1.1\r\n\r\n")
    feed(p, w)
    (done,) = p.forget_pid(w.pid)
    assert not done.complete and p.open_requests() == []


# -- never an exception, whatever the bytes ------------------------------------------------

VALID = (
    b"GET /a/1?x HTTP/1.1\r\nHost: h\r\ntraceparent: 00-" + TRACE.encode() + b"-"
    + PARENT.encode() + b"-01\r\n\r\n"
    + b"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
    + chunked(b"payload" * 30, 11)
    + b"PUT /c HTTP/1.1\r\nContent-Length: 12\r\n\r\nhello world!"
)
RESPONSES = (
    response(200, b"abc") + b"HTTP/1.1 100 Continue\r\n\r\n"
    + b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"r" * 300, 40)
    + response(204, b"")
)


def _run(parser: HttpParser, wire: Wire, inbound: bytes, outbound: bytes,
         rng: random.Random) -> list[Request]:
    wire.accept()
    i = o = 0
    while i < len(inbound) or o < len(outbound):
        if i < len(inbound) and (o >= len(outbound) or rng.random() < 0.5):
            n = rng.randint(1, 300)
            wire.read(inbound[i : i + n], tid=rng.randint(1, 4), lost=rng.random() < 0.05)
            i += n
        else:
            n = rng.randint(1, 300)
            wire.write(outbound[o : o + n], lost=rng.random() < 0.05)
            o += n
    if rng.random() < 0.7:
        wire.close()
    return feed(parser, wire)


def _check(parser: HttpParser, done: list[Request]) -> None:
    for r in done:
        assert r.start_ns <= r.end_ns
        assert r.status == 0 or 100 <= r.status <= 999
        assert r.bytes_in >= 0 and r.bytes_out >= 0
    assert all(s.parser_errors == 0 for s in parser.all_stats().values())


def test_seeded_random_mutations_of_real_traffic_never_raise() -> None:
    rng = random.Random(16)
    parser = HttpParser(max_routes=20)
    for case in range(400):
        inbound, outbound = bytearray(VALID), bytearray(RESPONSES)
        for buf in (inbound, outbound):
            for _ in range(rng.randint(0, 8)):
                where = rng.randrange(len(buf))
                action = rng.random()
                if action < 0.4:
                    buf[where] = rng.randrange(256)
                elif action < 0.7:
                    del buf[where : where + rng.randint(1, 40)]
                else:
                    buf[where:where] = rng.randbytes(rng.randint(1, 40))
        wire = Wire(conn_id=case, head=rng.choice([64, 128, 1024]))
        _check(parser, _run(parser, wire, bytes(inbound), bytes(outbound), rng))
    assert sum(s.requests for s in parser.all_stats().values()) > 400


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inbound=st.binary(max_size=3000), outbound=st.binary(max_size=3000),
       seed=st.integers(0, 2**32 - 1))
def test_random_bytes_never_raise(inbound: bytes, outbound: bytes, seed: int) -> None:
    parser = HttpParser()
    _check(parser, _run(parser, Wire(head=128), inbound, outbound, random.Random(seed)))


@settings(max_examples=200, deadline=None)
@given(cut=st.lists(st.integers(1, 64), min_size=1, max_size=60),
       head=st.sampled_from([64, 256, 1024]))
def test_any_split_of_valid_traffic_gives_the_same_requests(cut: list[int], head: int) -> None:
    """Where every byte was captured, how they were split over syscalls does not matter."""
    parser, wire = HttpParser(), Wire(head=head)
    wire.accept()
    i = 0
    for n in cut * (len(VALID) // sum(cut) + 1):
        if i >= len(VALID):
            break
        wire.read(VALID[i : i + n])
        i += n
    o = 0
    for n in reversed(cut * (len(RESPONSES) // sum(cut) + 1)):
        if o >= len(RESPONSES):
            break
        wire.write(RESPONSES[o : o + n])
        o += n
    done = feed(parser, wire)
    assert [(r.method, r.path, r.status) for r in done] == [
        ("GET", "/a/1", 200), ("POST", "/b", 200), ("PUT", "/c", 204)]
    if head >= 128:  # the traceparent header lies within the first 128 bytes
        assert done[0].trace is not None and done[0].trace.trace_id == TRACE


def test_a_body_sent_with_sendfile_is_counted_not_read() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"GET /static/model.bin HTTP/1.1\r\n\r\n")
    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n", op=HttpOp.WRITEV)
    last = w.write(b"\0" * 1_000_000, op=HttpOp.SENDFILE)
    (done,) = feed(p, w)
    assert (done.status, done.end_ns, done.complete) == (200, last.ts_exit_ns, True)
    assert done.bytes_out == len(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n") + 1_000_000


@pytest.mark.parametrize(("head", "method", "path"), [
    (f"POST /v1/small/7 HTTP/1.1\r\nHost: a\r\ntraceparent: 00-{TRACE}-{PARENT}-01\r\n".encode(),
     "POST", "/v1/small/7"),
    (b"GET /v1/big/8?q=1 HTTP/1.1\r\n", "GET", "/v1/big/8"),  # the request line alone
    (b"GET /v1/big/9 HTTP/1.1", "GET", "/v1/big/9"),  # not even the line ended
    (b"GET /v1/items HTTP/1.0\nHost: a\n", "GET", "/v1/items"),  # bare line feeds
])
def test_a_head_the_client_ends_without_its_blank_line_is_a_request_never_complete(
    head: bytes, method: str, path: str
) -> None:
    """The client ends its stream (shutdown(SHUT_WR)) before its head's blank line; Python's
    http.server takes what came as the whole head, does the work and answers. The request is
    what was seen of it, in flight from its first byte (its GPU work is its own), and is
    flagged incomplete."""
    p, w = HttpParser(), Wire()
    w.accept()
    first = w.read(head[:9], tid=31)
    w.read(head[9:], tid=31)
    w.read(b"", tid=31)  # the end of stream
    assert feed(p, w) == []
    (open_,) = p.open_requests(w.pid)
    assert (open_.tid, open_.start_ns) == (31, first.ts_exit_ns)
    answer = response(200, b"{}")
    w.write(answer)
    (done,) = feed(p, w)
    assert (done.method, done.path, done.status, done.complete) == (method, path, 200, False)
    assert (done.request_id, done.bytes_in, done.bytes_out) == (
        open_.request_id, len(head), len(answer))
    assert (done.trace is not None) == (b"traceparent" in head)
    stats = p.stats(w.pid)
    assert (stats.heads_cut, stats.incomplete, stats.orphan_responses) == (1, 1, 0)
    assert stats.garbage_connections == 0
    w.close()
    assert feed(p, w) == []


def test_an_answer_to_a_head_without_its_blank_line_is_its_request() -> None:
    """The server answers a head that has not ended (a 408 once it waited long enough): the
    answer is that request's, and what the client sends next is framed from its request line.
    A head still being read behind a pipelined request is not cut by the earlier answer."""
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"GET /slow HTTP/1.1\r\nHost: a\r\n")
    w.write(response(408, b""))
    (cut,) = feed(p, w)
    assert (cut.path, cut.status, cut.complete) == ("/slow", 408, False)
    w.read(b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nHo")
    w.write(response(200, b"a"))
    (a,) = feed(p, w)
    assert (a.path, a.status, a.complete) == ("/a", 200, True)
    w.read(b"st: a\r\n")
    w.read(b"")
    w.write(response(200, b"b"))
    (b,) = feed(p, w)
    assert (b.path, b.status, b.complete) == ("/b", 200, False)
    assert p.stats(w.pid).heads_cut == 2 and p.stats(w.pid).orphan_responses == 0


def test_bytes_that_are_no_request_at_the_end_of_stream_stay_garbage() -> None:
    p, w = HttpParser(), Wire()
    w.accept()
    w.read(b"HELLO THERE")
    w.read(b"")
    w.write(response(400, b""))
    assert feed(p, w) == []
    stats = p.stats(w.pid)
    assert (stats.heads_cut, stats.requests, stats.garbage_connections) == (0, 0, 1)
