"""Server-side TCP connections a process already holds, from /proc: the HTTP capture tracks the
fds accept() returns from the moment it is loaded, so the keep-alive connections a server had
accepted before (a load balancer's, open for hours) are added to its `http_conns` map by user
space, as seeded connections that join their streams mid-way (bpf/http.h).

A connection is server-side when its local port is one that a socket of the process's network
namespace listens on (a client connection's local port is an ephemeral one, never a listening
port). Pure: reads an injectable /proc root.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from gpuflight.producer.http.abi import AF_INET, AF_INET6, C_SEEDED, CONN_DTYPE, SEED_OFFSET

_SOCKET_LINK: Final = re.compile(r"socket:\[(\d+)\]")
_LISTEN: Final = "0A"
_ESTABLISHED: Final = "01"


@dataclass(frozen=True)
class ServerConn:
    pid: int
    fd: int
    inode: int
    family: int
    lport: int
    rport: int


def _sockets(proc_root: Path, pid: int) -> dict[int, int]:
    """socket inode → fd, for the fds of `pid`."""
    out: dict[int, int] = {}
    fd_dir = proc_root / str(pid) / "fd"
    with contextlib.suppress(OSError):
        for entry in os.scandir(fd_dir):
            with contextlib.suppress(OSError, ValueError):
                match = _SOCKET_LINK.fullmatch(os.readlink(entry.path))
                if match:
                    out[int(match.group(1))] = int(entry.name)
    return out


def _table(path: Path) -> list[tuple[int, str, int, int]]:
    """(local port, state, remote port, inode) of each line of /proc/net/tcp or tcp6."""
    rows = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10:
                continue
            with contextlib.suppress(ValueError, IndexError):
                local = int(fields[1].rsplit(":", 1)[1], 16)
                remote = int(fields[2].rsplit(":", 1)[1], 16)
                rows.append((local, fields[3], remote, int(fields[9])))
    return rows


def server_connections(proc_root: Path, pid: int) -> list[ServerConn]:
    """The established TCP connections `pid` holds that it accepted, by fd."""
    owned = _sockets(proc_root, pid)
    if not owned:
        return []
    net = proc_root / str(pid) / "net"
    found: list[ServerConn] = []
    for family, name in ((AF_INET, "tcp"), (AF_INET6, "tcp6")):
        rows = _table(net / name)
        listening = {local for local, state, _, _ in rows if state == _LISTEN}
        found.extend(
            ServerConn(pid, owned[inode], inode, family, local, remote)
            for local, state, remote, inode in rows
            if state == _ESTABLISHED and inode in owned and local in listening
        )
    return sorted(found, key=lambda c: c.fd)


def seed_value(conn: ServerConn, conn_id: int) -> bytes:
    """The `http_conns` map value (struct gf_http_conn) that adds `conn` as a seeded
    connection: its byte counts start at SEED_OFFSET, so its records say mid-stream."""
    value = np.zeros(1, dtype=CONN_DTYPE)
    value["conn_id"] = conn_id
    value["bytes_in"] = value["bytes_out"] = SEED_OFFSET
    value["family"] = conn.family
    value["lport"] = conn.lport
    value["flags"] = C_SEEDED
    return value.tobytes()
