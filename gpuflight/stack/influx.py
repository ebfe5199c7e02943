"""InfluxDB 1.8 (influxd, built by scripts/setup-influxdb into .cache/influxdb), which serves
both the v2 write API (/api/v2/write, influxdb-client's) and InfluxQL (/query); database "db"
with retention policy "rp" is the v2 bucket "db/rp". `stack up` (`SERVICE`) also creates the
database of the default bucket (gpuflight, retention policy autogen), so a stream worker
started with the defaults can write at once. It talks to InfluxDB through streams/influxql.py.

Without `admin`, InfluxDB runs without authentication (loopback only). With `admin=(user,
password)` it runs with auth-enabled and that admin user (created on the first start, checked
on later ones): what tests of credentials need.

Its files, under the stack's data directory:

    influxdb.log         influxd's output (the previous run's: influxdb.log.1)
    influxdb.pid         while it runs
    influxdb/            influxdb.conf, rewritten at each `up`
    influxdb/{meta,data,wal}/  the databases, kept across down/up (autogen keeps points forever)
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuflight.producer.contract.errors import ServiceError
from gpuflight.stack.service import (
    HOST,
    REPO,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    Service,
    StackError,
    alive,
    free_port,
    locked,
    port_free,
    running_pid,
    service_status,
    spawn,
    start_failed,
    stop_service,
)
from gpuflight.streams.influxql import CredentialsRefused, InfluxQL, quote_identifier, quote_string

log = logging.getLogger(__name__)

DEFAULT_INFLUX_PORT = 8086
# Where scripts/setup-influxdb builds influxd; GPUFLIGHT_INFLUXD overrides it.
DEFAULT_INFLUXD = REPO / ".cache" / "influxdb" / "influxd"


@dataclass(frozen=True)
class InfluxHandle:
    data_dir: Path
    port: int
    rpc_port: int
    pid: int
    log_file: Path
    already_running: bool = False
    #: Serving HTTPS with this certificate (PEM), which is also the CA to verify it with.
    certificate: Path | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.certificate else 'http'}://{HOST}:{self.port}"


def find_influxd(binary: Path | None = None) -> Path:
    """The influxd to run; StackError when scripts/setup has not built it."""
    if binary is None:
        binary = Path(os.environ.get("GPUFLIGHT_INFLUXD") or DEFAULT_INFLUXD)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise StackError(f"no influxd at {binary}: run scripts/setup")
    return binary


def _influx_dir(data_dir: Path) -> Path:
    return data_dir / "influxdb"


def _influx_pid_file(data_dir: Path) -> Path:
    return data_dir / "influxdb.pid"


def _influx_log_file(data_dir: Path) -> Path:
    return data_dir / "influxdb.log"


def _influx_conf(data_dir: Path) -> Path:
    return _influx_dir(data_dir) / "influxdb.conf"


def _influx_config(data_dir: Path, port: int, rpc_port: int, auth: bool = False,
                   tls: tuple[Path, Path] | None = None) -> str:
    def path(name: str | Path) -> str:  # a TOML basic string: JSON's escapes are TOML's
        return json.dumps(str(_influx_dir(data_dir) / name))

    https = (f"\n  https-enabled = true\n  https-certificate = {path(tls[0])}"
             f"\n  https-private-key = {path(tls[1])}") if tls else ""

    return f"""\
# Written by gpuflight (gpuflight/stack/) at each `stack up`: edits here are lost.
# One node on loopback only, {"with authentication" if auth else "no authentication"}.
reporting-disabled = true
# The RPC service (backup and restore); its default, 8088, is a popular port.
bind-address = "{HOST}:{rpc_port}"

[meta]
  dir = {path("meta")}

[data]
  dir = {path("data")}
  wal-dir = {path("wal")}
  query-log-enabled = false

[monitor]
  # No _internal database growing beside ours every 10 s.
  store-enabled = false

[http]
  bind-address = "{HOST}:{port}"
  auth-enabled = {"true" if auth else "false"}{https}
  flux-enabled = true
  # No line per request in influxdb.log (failed writes are answered to the writer).
  log-enabled = false

[logging]
  suppress-logo = true
"""


def _read_influx_ports(data_dir: Path) -> tuple[int, int] | None:
    """(HTTP port, RPC port) from the influxdb.conf of the last `up`, if any."""
    try:
        config = tomllib.loads(_influx_conf(data_dir).read_text())
        http = str(config["http"]["bind-address"]).rpartition(":")[2]
        rpc = str(config["bind-address"]).rpartition(":")[2]
        return int(http), int(rpc)
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError):
        return None


def _read_influx_certificate(data_dir: Path) -> Path | None:
    """The HTTPS certificate of the last `up`, if it served HTTPS."""
    try:
        http = tomllib.loads(_influx_conf(data_dir).read_text())["http"]
        return Path(http["https-certificate"]) if http.get("https-enabled") else None
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return None


def _last_influx_log_line(path: Path) -> str:
    """The line of influxd's log that says most: the last error, else the last line.

    influxd logs logfmt (`ts=... lvl=info msg="..."`); what makes it exit comes last, as a
    plain line ("run: open server: listen: ... address already in use").
    """
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return f"no log at {path}"
    lines = [line for line in lines if line]
    if not lines:
        return f"nothing in {path}"
    for line in reversed(lines):
        if line.startswith("run: ") or re.search(r"\blvl=(error|fatal)\b", line):
            return line[:400]
    return lines[-1][:400]


def _wait_for_ping(url: str, alive: Callable[[], bool], deadline: float,
                   ca_file: Path | None = None) -> bool:
    """Wait until url/ping answers; False if the server died or the deadline passed."""
    client = InfluxQL(url, timeout_s=1.0, ca_file=None if ca_file is None else str(ca_file))
    while time.monotonic() < deadline and alive():
        try:
            client.ping()
            return True
        except ServiceError:  # refused until it listens
            pass
        time.sleep(0.1)
    return False


def influx_up(data_dir: Path, port: int = DEFAULT_INFLUX_PORT, *, rpc_port: int | None = None,
              binary: Path | None = None, timeout: float = START_TIMEOUT_S,
              admin: tuple[str, str] | None = None,
              tls: tuple[Path, Path] | None = None) -> InfluxHandle:
    """Start the InfluxDB of data_dir on HOST:port and return once /ping answers.

    rpc_port (backup and restore only) defaults to any free port. A running InfluxDB with
    this HTTP port is returned as it is. `admin` (user, password): run with authentication,
    with that admin user. `tls` (certificate, private key; PEM): serve HTTPS only.
    """
    data_dir = data_dir.expanduser().resolve()
    conf = _influx_conf(data_dir)
    marker = str(conf)
    with locked(data_dir):
        pid = running_pid(_influx_pid_file(data_dir), marker)
        if pid is not None:
            running = _read_influx_ports(data_dir) or (0, 0)
            if running[0] != port or rpc_port not in {None, running[1]}:
                raise StackError(
                    f"InfluxDB of {data_dir} already runs on {HOST}:{running[0]} (RPC "
                    f"{running[1]}, pid {pid}): run `gpuflight stack down` first to change ports")
            return InfluxHandle(data_dir, running[0], running[1], pid,
                                _influx_log_file(data_dir), already_running=True,
                                certificate=_read_influx_certificate(data_dir))

        if not port_free(port):
            raise StackError(f"port {HOST}:{port} is busy: another InfluxDB or program listens "
                             f"there (ss -ltnp 'sport = :{port}'); stop it or choose another port")
        if rpc_port is None:
            rpc_port = free_port(frozenset({port}))
        elif rpc_port == port or not port_free(rpc_port):
            raise StackError(f"RPC port {HOST}:{rpc_port} is busy"
                             f"{' (it is the HTTP port)' if rpc_port == port else ''}: "
                             "choose another")
        influxd = find_influxd(binary)

        _influx_dir(data_dir).mkdir(parents=True, exist_ok=True)
        conf.write_text(_influx_config(data_dir, port, rpc_port, auth=admin is not None,
                                       tls=tls))
        # influxd lets INFLUXDB_* variables override its configuration file: none of those.
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("INFLUXDB_")}
        log_file = _influx_log_file(data_dir)
        started = time.monotonic()
        pid = spawn([str(influxd), "run", "-config", marker], _influx_dir(data_dir), log_file,
                     _influx_pid_file(data_dir), env)
        certificate = None if tls is None else tls[0].resolve()
        handle = InfluxHandle(data_dir, port, rpc_port, pid, log_file, certificate=certificate)
        if _wait_for_ping(handle.url, lambda: alive(pid, marker), started + timeout,
                          certificate):
            log.info("InfluxDB up on %s (pid %d) in %.1f s", handle.url, pid,
                     time.monotonic() - started)
            if admin is not None:
                _ensure_admin(handle.url, *admin)
            return handle
        raise start_failed("InfluxDB", f"{handle.url}/ping", pid=pid, marker=marker,
                            pid_file=_influx_pid_file(data_dir), log_file=log_file,
                            last_line=_last_influx_log_line, timeout=timeout)


def influx_down(data_dir: Path, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the InfluxDB of data_dir (SIGTERM, SIGKILL after timeout); False if none ran."""
    data_dir = data_dir.expanduser().resolve()
    return stop_service(data_dir, "InfluxDB", _influx_pid_file(data_dir),
                         str(_influx_conf(data_dir)), timeout)


def influx_status(data_dir: Path) -> str:
    """'running on 127.0.0.1:8086 (pid N)' or 'stopped'."""
    data_dir = data_dir.expanduser().resolve()
    return service_status(_influx_pid_file(data_dir), str(_influx_conf(data_dir)),
                           _read_influx_ports(data_dir))


def _ensure_admin(url: str, username: str, password: str) -> None:
    """Create the admin user of an auth-enabled InfluxDB that has none yet (InfluxDB takes
    that one statement without credentials), else check that the user's credentials work."""
    statement = (f"CREATE USER {quote_identifier(username)} WITH PASSWORD"
                 f" {quote_string(password)} WITH ALL PRIVILEGES")
    try:
        InfluxQL(url).execute(statement)
        return
    except CredentialsRefused:
        pass  # users exist already
    except ServiceError as exc:
        raise StackError(f"cannot create the InfluxDB admin user {username}: {exc}") from None
    try:
        InfluxQL(url, username=username, password=password).series("SHOW USERS")
    except ServiceError as exc:
        raise StackError(f"InfluxDB at {url} has users, and {username} cannot sign in: {exc}"
                         ) from None


def create_database(url: str, name: str, *, timeout: float = 30.0,
                    username: str = "", password: str = "") -> None:
    """CREATE DATABASE name (with its retention policy autogen): a database that exists is left
    as it is."""
    try:
        InfluxQL(url, username=username, password=password, timeout_s=timeout).create_database(
            name)
    except ServiceError as exc:
        raise StackError(f"cannot create database {name}: {exc}") from None


def up_with_database(data_dir: Path, port: int = DEFAULT_INFLUX_PORT) -> InfluxHandle:
    """`stack up`'s InfluxDB: started (or found running) with the default bucket's database,
    gpuflight (retention policy autogen), created if missing."""
    from gpuflight.streams.settings import DEFAULT_DATABASE  # (its import takes ~0.2 s: only here)

    handle = influx_up(data_dir, port)
    create_database(handle.url, DEFAULT_DATABASE)
    return handle


SERVICE = Service("influxdb", up_with_database, influx_down, influx_status)
