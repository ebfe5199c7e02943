"""producer/http/conns.py: a process's accepted TCP connections, from /proc (pure)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np

from gpuflight.producer.http.abi import AF_INET, AF_INET6, C_SEEDED, CONN_DTYPE, SEED_OFFSET
from gpuflight.producer.http.conns import ServerConn, seed_value, server_connections

TCP_HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
              "  timeout inode\n")


def _line(n: int, local: int, remote: int, state: str, inode: int) -> str:
    return (f"   {n}: 0100007F:{local:04X} 0100007F:{remote:04X} {state} 00000000:00000000 "
            f"00:00000000 00000000     0        0 {inode} 1 0000000000000000 100 0 0 10 0\n")


def test_a_fake_proc_tree(tmp_path: Path) -> None:
    pid = tmp_path / "42"
    (pid / "fd").mkdir(parents=True)
    (pid / "net").mkdir()
    for fd, target in ((3, "socket:[100]"), (4, "socket:[101]"), (5, "socket:[102]"),
                       (6, "/dev/null"), (7, "socket:[200]"), (8, "socket:[999]")):
        os.symlink(target, pid / "fd" / str(fd))
    (pid / "net" / "tcp").write_text(
        TCP_HEADER
        + _line(0, 8000, 0, "0A", 100)          # the listener
        + _line(1, 8000, 51000, "01", 101)      # accepted
        + _line(2, 40000, 6379, "01", 102)      # a client connection to redis
        + _line(3, 8000, 51001, "06", 103)      # TIME_WAIT, not ours
        + "   garbage line\n")
    (pid / "net" / "tcp6").write_text(TCP_HEADER + _line(0, 9000, 0, "0A", 555)
                                      + _line(1, 9000, 52000, "01", 200))
    assert server_connections(tmp_path, 42) == [
        ServerConn(42, 4, 101, AF_INET, 8000, 51000), ServerConn(42, 7, 200, AF_INET6, 9000, 52000)]
    assert server_connections(tmp_path, 43) == []  # gone


def test_this_process_on_the_live_proc() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    with listener, socket.create_connection(listener.getsockname()) as client:
        server, _ = listener.accept()
        with server:
            conns = server_connections(Path("/proc"), os.getpid())
            mine = [c for c in conns if c.lport == listener.getsockname()[1]]
            assert [(c.fd, c.rport) for c in mine] == [(server.fileno(), client.getsockname()[1])]
            assert all(c.fd != client.fileno() for c in conns)


def test_seed_value_is_a_struct_gf_http_conn() -> None:
    raw = seed_value(ServerConn(1, 4, 9, AF_INET, 8000, 5), conn_id=77)
    value = np.frombuffer(raw, dtype=CONN_DTYPE)[0]
    assert len(raw) == CONN_DTYPE.itemsize
    assert (int(value["conn_id"]), int(value["bytes_in"]), int(value["bytes_out"])) == (
        77, SEED_OFFSET, SEED_OFFSET)
    assert (int(value["lport"]), int(value["family"]), int(value["flags"])) == (
        8000, AF_INET, C_SEEDED)
