"""Python mirror of bpf/http.h: the records of the HTTP capture, decoded one by one.

tests/unit/producer/http/test_abi.py compiles the header and checks every value here against it.
Records are variable-length (a fixed part, then the data kept), fewer than CUDA events (a
few per request), and read through bcc's ring buffer callback; `decode` turns one into an
`HttpRecord`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import numpy as np


class HttpOp(IntEnum):
    """enum gf_http_op."""

    ACCEPT = 1
    CLOSE = 2
    READ = 3
    RECVFROM = 4
    RECVMSG = 5
    READV = 6
    WRITE = 7
    SENDTO = 8
    SENDMSG = 9
    WRITEV = 10
    SENDFILE = 11
    UNIX = 12


#: Ops that carry request bytes (data in) and response bytes (data out).
INBOUND: Final = frozenset({HttpOp.READ, HttpOp.RECVFROM, HttpOp.RECVMSG, HttpOp.READV})
OUTBOUND: Final = frozenset(
    {HttpOp.WRITE, HttpOp.SENDTO, HttpOp.SENDMSG, HttpOp.WRITEV, HttpOp.SENDFILE}
)

F_FAULT: Final = 0x1
F_MORE_IOV: Final = 0x2
F_NO_WALK: Final = 0x4
C_SEEDED: Final = 0x1
#: Where the byte counts of a connection user space adds (seeds) start: mid-stream.
SEED_OFFSET: Final = 1 << 62

TAIL: Final = 16
MAX_IOV: Final = 8
#: The default of GF_HTTP_HEAD: bytes kept from the start of each read or write.
DEFAULT_HEAD: Final = 1024

AF_UNIX: Final = 1
AF_INET: Final = 2
AF_INET6: Final = 10

#: Slots of the `http_drops` per-CPU array.
DROP_RING: Final = 0
DROP_CONNS: Final = 1
DROP_FAULT: Final = 2
NO_WALK: Final = 3
SLOTS: Final = 4

#: struct gf_http_event (the fixed part; head_len bytes of data follow).
EVENT_DTYPE: Final = np.dtype(
    {
        "names": [
            "ts_enter_ns", "ts_exit_ns", "conn_id", "offset", "ret", "pid", "tid", "fd",
            "op", "flags", "head_len", "tail_len", "family", "lport", "rport", "raddr", "tail",
        ],
        "formats": [
            "<u8", "<u8", "<u8", "<u8", "<i8", "<u4", "<u4", "<i4",
            "<u2", "<u2", "<u2", "<u2", "<u2", "<u2", "<u2", ("u1", (16,)), ("u1", (TAIL,)),
        ],
        "offsets": [0, 8, 16, 24, 32, 40, 44, 48, 52, 54, 56, 58, 60, 62, 64, 68, 84],
        "itemsize": 104,
    }
)

#: struct gf_http_conn_key and struct gf_http_conn (the `http_conns` map).
CONN_KEY_DTYPE: Final = np.dtype([("pid", "<u4"), ("fd", "<i4")])
CONN_DTYPE: Final = np.dtype(
    {
        "names": ["conn_id", "bytes_in", "bytes_out", "family", "lport", "flags"],
        "formats": ["<u8", "<u8", "<u8", "<u2", "<u2", "<u2"],
        "offsets": [0, 8, 16, 24, 26, 28],
        "itemsize": 32,
    }
)


class RecordError(ValueError):
    """A record too short for its own header or data (counted by the reader, never raised out)."""


@dataclass(frozen=True, slots=True)
class HttpRecord:
    """One record of the `http_events` ring."""

    op: int
    pid: int
    tid: int
    fd: int
    conn_id: int
    ts_enter_ns: int
    ts_exit_ns: int
    #: Bytes of this direction before this record's (data records); close: bytes in.
    offset: int
    #: Bytes moved; accept: the new fd; close: bytes out.
    ret: int
    flags: int
    #: The first bytes of the data (up to GF_HTTP_HEAD).
    head: bytes
    #: The last bytes of the data, when it is longer than `head` (else empty).
    tail: bytes
    family: int = 0
    lport: int = 0
    rport: int = 0
    raddr: bytes = b""

    @property
    def inbound(self) -> bool:
        return self.op in INBOUND

    @property
    def outbound(self) -> bool:
        return self.op in OUTBOUND

    @property
    def peer(self) -> str:
        """The peer's address as text (accept records)."""
        if self.family == AF_INET:
            return str(ipaddress.IPv4Address(self.raddr[:4]))
        if self.family == AF_INET6:
            return str(ipaddress.IPv6Address(self.raddr[:16]))
        return ""


def decode(raw: bytes) -> HttpRecord:
    """One ring record (the bytes bcc's callback hands over) as an HttpRecord."""
    size = EVENT_DTYPE.itemsize
    if len(raw) < size:
        raise RecordError(f"HTTP record of {len(raw)} bytes, shorter than its {size}-byte header")
    fixed = np.frombuffer(raw, dtype=EVENT_DTYPE, count=1)[0]
    head_len = int(fixed["head_len"])
    if len(raw) < size + head_len:
        raise RecordError(f"HTTP record of {len(raw)} bytes lacks its {head_len} bytes of data")
    tail_len = min(int(fixed["tail_len"]), TAIL)
    return HttpRecord(
        op=int(fixed["op"]),
        pid=int(fixed["pid"]),
        tid=int(fixed["tid"]),
        fd=int(fixed["fd"]),
        conn_id=int(fixed["conn_id"]),
        ts_enter_ns=int(fixed["ts_enter_ns"]),
        ts_exit_ns=int(fixed["ts_exit_ns"]),
        offset=int(fixed["offset"]),
        ret=int(fixed["ret"]),
        flags=int(fixed["flags"]),
        head=bytes(raw[size : size + head_len]),
        tail=fixed["tail"][:tail_len].tobytes(),
        family=int(fixed["family"]),
        lport=int(fixed["lport"]),
        rport=int(fixed["rport"]),
        raddr=fixed["raddr"].tobytes(),
    )


def head_cflags(head: int = DEFAULT_HEAD) -> list[str]:
    """The cflag that sets how many bytes of each read or write are kept."""
    if head & (head - 1) or not 64 <= head <= 8192:
        raise ValueError(f"the HTTP head size must be a power of two from 64 to 8192, got {head}")
    return [f"-DGF_HTTP_HEAD={head}"]
