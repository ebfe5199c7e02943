"""What every service of the local stack shares: a process of its own, in its own session,
started and stopped under a lock on its data directory, and found again by a pid file and a
marker among its arguments (so a recycled pid is never taken for it).

    Service(name, up, down, status)      one service of the stack (kafka.SERVICE, influx.SERVICE)
    spawn / stop / running_pid / alive   its process
    locked(data_dir)                     one `up` or `down` at a time per data directory
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuflight.producer.contract.errors import GpuflightError

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
#: The checkout: scripts/setup puts the services' jars and binaries under REPO/.cache.
REPO = Path(__file__).resolve().parents[2]

# Brokers this process started: waited for, so a stopped one leaves no zombie that looks alive.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class StackError(GpuflightError):
    """A local service cannot be set up, started or stopped; the message says why, in one line."""


@dataclass(frozen=True)
class Service:
    """One service of the stack; `up` starts it with its default ports (InfluxDB goes beside)."""

    name: str
    up: Callable[[Path], object]
    down: Callable[[Path], bool]
    status: Callable[[Path], str]


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "gpuflight" / "stack"


# -- ports -----------------------------------------------------------------------------------

def port_free(port: int) -> bool:
    """Whether a server could listen on HOST:port now (what Java does: SO_REUSEADDR set)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(avoid: frozenset[int] = frozenset()) -> int:
    """A port of HOST that nothing listens on now, chosen by the kernel."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if port not in avoid:
            return port


# -- processes -------------------------------------------------------------------------------

@contextlib.contextmanager
def locked(data_dir: Path) -> Iterator[None]:
    """One `up` or `down` at a time per data directory."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def start_failed(name: str, where: str, *, pid: int, marker: str, pid_file: Path,
                  log_file: Path, last_line: Callable[[Path], str], timeout: float) -> StackError:
    """The error of a service that exited while starting or never answered (then stopped)."""
    if not alive(pid, marker):
        pid_file.unlink(missing_ok=True)
        return StackError(f"{name} exited while starting: {last_line(log_file)} "
                          f"(all in {log_file})")
    stop(pid, marker, STOP_TIMEOUT_S)
    pid_file.unlink(missing_ok=True)
    return StackError(f"{name} did not answer on {where} within {timeout:.0f} s, "
                      f"stopped it: {last_line(log_file)} (all in {log_file})")


def stop_service(data_dir: Path, name: str, pid_file: Path, marker: str,
                  timeout: float) -> bool:
    with locked(data_dir):
        pid = running_pid(pid_file, marker)
        if pid is None:
            return False
        stop(pid, marker, timeout)
        pid_file.unlink(missing_ok=True)
        log.info("%s (pid %d) stopped", name, pid)
        return True


def service_status(pid_file: Path, marker: str, ports: tuple[int, int] | None) -> str:
    pid = running_pid(pid_file, marker)
    if pid is None or ports is None:
        return "stopped"
    return f"running on {HOST}:{ports[0]} (pid {pid})"


def alive(pid: int, marker: str) -> bool:
    """Whether pid is running (not a zombie) with marker among its arguments."""
    child = _CHILDREN.get(pid)
    if child is not None:  # ours: poll() also reaps it
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[0]
    return state not in {"Z", "X"} and marker.encode() in args


def running_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in pid_file if that process still runs; a stale file is removed."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if pid > 0 and alive(pid, marker):
        return pid
    pid_file.unlink(missing_ok=True)
    return None


def spawn(command: list[str], cwd: Path, log_file: Path, pid_file: Path,
           env: dict[str, str] | None = None) -> int:
    """Start command in its own session, output to log_file (the previous one kept as .1)."""
    if log_file.exists():
        log_file.replace(log_file.with_name(log_file.name + ".1"))
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _CHILDREN[proc.pid] = proc
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def stop(pid: int, marker: str, timeout: float) -> None:
    """SIGTERM, then SIGKILL after timeout seconds; returns once the process is gone."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        if sig == signal.SIGKILL:
            log.warning("pid %d did not stop within %.0f s of SIGTERM: killing it", pid, timeout)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid, marker):
                return
            time.sleep(0.1)
    raise StackError(f"pid {pid} is still running after SIGKILL")
