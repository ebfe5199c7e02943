"""Capture commands run as a user would run them: `gpuflight trace` and `gpuflight producer`
as subprocesses, and what they wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuflight.producer import status
from gpuflight.producer.probe.fds import RELEASER_NAME

GPUFLIGHT = [sys.executable, "-m", "gpuflight"]


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def counted(events: list[dict[str, Any]]) -> int:
    """How many events an --output holds: each event line one, each `aggregate` line (what the
    kernel counted instead of recording, under overload) its count."""
    return sum(e["count"] if e.get("type") == "aggregate" else 1 for e in events)


class Producer:
    """`gpuflight producer --output OUT ...`, started and stopped like a service; ready when
    its status file says so (`status`), its log in OUT.log (`log`, the lines so far);
    `wrapper` runs it (e.g. setpriv with fewer capabilities)."""

    def __init__(self, out: Path, *extra: str, ready_timeout_s: float = 60,
                 stop_timeout_s: float = 60, wrapper: Sequence[str] = ()) -> None:
        self.out = out
        self.stop_timeout_s = stop_timeout_s
        self.status_file = out.with_name(out.name + ".status")
        self.log_file = out.with_name(out.name + ".log")
        with self.log_file.open("wb") as log_out:
            self.proc = subprocess.Popen(
                [*wrapper, *GPUFLIGHT, "producer", "--output", str(out), "--status-file",
                 str(self.status_file), *extra],
                stderr=log_out,
            )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            current = status.read(self.status_file)
            if current is not None and current["state"] == status.STATE_READY:
                self.started_ns = time.time_ns()
                return
            time.sleep(0.05)
        self.kill()
        raise AssertionError("producer never became ready: " + "".join(self.log))

    @property
    def log(self) -> list[str]:
        try:
            return self.log_file.read_text(errors="replace").splitlines(keepends=True)
        except OSError:
            return []

    def status(self) -> dict[str, Any]:
        current = status.read(self.status_file)
        assert current is not None, "no status"
        return current

    def wait_for_library(self, path_part: str, timeout_s: float = 60) -> dict[str, Any]:
        """Wait until the producer probes a library file whose path contains `path_part`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            current = status.read(self.status_file)
            for library in (current or {}).get("libraries", ()):
                if path_part in library["path"]:
                    return dict(library)
            assert self.proc.poll() is None, "".join(self.log)
            time.sleep(0.05)
        raise AssertionError(f"the producer did not attach to {path_part}: {''.join(self.log)}")

    def wait_for_captured(self, events: int, timeout_s: float = 60) -> None:
        """Wait until the producer has captured at least `events` events (its status says):
        recorded, or counted in the kernel under overload (a loaded machine's reader may fall
        behind enough for a flood's details to be shed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            current = status.read(self.status_file)
            if current is not None and current["captured"] + current["aggregated"] >= events:
                return
            assert self.proc.poll() is None, "".join(self.log)
            time.sleep(0.05)
        raise AssertionError(f"the producer did not capture {events} events: {self.status()}")

    def stop(self) -> list[dict[str, Any]]:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=self.stop_timeout_s)
        err = "".join(self.log)
        assert self.proc.returncode == 0, err
        assert "Traceback" not in err, err
        assert self.status()["state"] == status.STATE_STOPPED
        return read_events(self.out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def wait_for_probe_releases(timeout_s: float = 60) -> None:
    """Earlier captures release their probes in the background, and while they do,
    attaching new probes is ~20x slower: the node-wide timing tests start after."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = [p for p in Path("/proc").iterdir() if p.name.isdigit()
                and _comm(p) == RELEASER_NAME]
        if not busy:
            return
        time.sleep(0.2)


def _comm(proc_dir: Path) -> str:
    try:
        return (proc_dir / "comm").read_text().strip()
    except OSError:
        return ""


def start_calls(pid: int, timeout_s: float = 60) -> None:
    """End a capture workload's start delay (SIGUSR1) once it catches the signal: sent before
    its main installs the handler, SIGUSR1 would end the process instead (its default action).
    The process must be running (a stopped one installs nothing)."""
    bit = 1 << (signal.SIGUSR1 - 1)
    deadline = time.monotonic() + timeout_s
    while True:
        caught = next((int(line.split()[1], 16) for line in
                       Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("SigCgt:")), 0)
        if caught & bit:
            os.kill(pid, signal.SIGUSR1)
            return
        assert time.monotonic() < deadline, f"{pid} never caught SIGUSR1"
        time.sleep(0.005)  # nothing to wait on: the handler is installed by its own main
