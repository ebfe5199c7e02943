"""Capture commands run as a user would run them: `gpuflight trace` and `gpuflight producer`
as subprocesses, and what they wrote."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from producer.probes import RELEASER_NAME

GPUFLIGHT = [sys.executable, "-m", "gpuflight"]


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class Producer:
    """`gpuflight producer --output OUT ...`, started and stopped like a service."""

    def __init__(self, out: Path, *extra: str, ready_timeout_s: float = 60,
                 stop_timeout_s: float = 60) -> None:
        self.out = out
        self.stop_timeout_s = stop_timeout_s
        self.proc = subprocess.Popen(
            [*GPUFLIGHT, "producer", "--output", str(out), *extra],
            stderr=subprocess.PIPE, text=True,
        )
        self.log: list[str] = []
        deadline = time.monotonic() + ready_timeout_s
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            if "ready" in line:
                self.started_ns = time.time_ns()
                return
        self.proc.kill()
        raise AssertionError("producer never became ready: " + "".join(self.log))

    def stop(self) -> list[dict[str, Any]]:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=self.stop_timeout_s)
        self.log.append(err)
        assert self.proc.returncode == 0, "".join(self.log)
        assert "Traceback" not in err, err
        return read_events(self.out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


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
