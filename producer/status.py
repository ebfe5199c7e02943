"""`gpuflight producer --status-file FILE`: what the agent is doing, for whoever waits on it.

A JSON object, replaced atomically (written beside under a random name made with O_EXCL,
then renamed: producer/contract/files.py) when the producer is ready, whenever the set of probed
library files changes, at most every `interval_s` otherwise, and when it stops:

    {"v": 1, "state": "ready" | "stopped", "pid": AGENT PID, "started_ns", "updated_ns",
     "libraries": [{"path", "kind": "runtime" | "driver" | "loader" | "autograd", "probes": N,
                    "unprobed": {FUNCTION: "why", ...},
                    "stepped": N (functions probed where the kernel single-steps)}, ...],
     "skipped": [{"file": "MAJOR:MINOR:INODE", "path", "kind", "reason"}, ...],
     "captured": N (events recorded), "aggregated": N (events counted in the kernel under
     overload instead, their details shed), "dropped_kernel": N,
     "outputs": [{"name", "failure": null | "why", "lost": N}, ...]}

Tests and scripts wait on this instead of reading log lines; monitoring can read it too.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from gpuflight.producer.contract.files import replace_file

log = logging.getLogger(__name__)

VERSION: Final = 1
STATE_READY: Final = "ready"
STATE_STOPPED: Final = "stopped"


class _Library(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def kind(self) -> str: ...


class _Attached(Protocol):
    @property
    def library(self) -> _Library: ...
    @property
    def probes(self) -> int: ...
    @property
    def unprobed(self) -> Mapping[str, str]: ...
    @property
    def stepped(self) -> frozenset[str]: ...


class _Skipped(Protocol):
    @property
    def library(self) -> _Library: ...
    @property
    def reason(self) -> str: ...


class StatusFile:
    """Writes the status of one producer; a failure to write is logged once, never fatal."""

    def __init__(self, path: Path, interval_s: float = 1.0) -> None:
        self.path = path
        self._interval_s = interval_s
        self._started_ns = time.time_ns()
        self._next = 0.0
        self._libraries: tuple[tuple[str, str, int, tuple[tuple[str, str], ...], int], ...] = ()
        self._failed = False

    def due(self, attached: Mapping[Any, _Attached]) -> bool:
        """Whether `update` would write now (the probed files changed, or the interval passed):
        cheap, so the capture loop asks every turn."""
        return time.monotonic() >= self._next or len(attached) != len(self._libraries)

    def update(
        self,
        state: str,
        *,
        attached: Mapping[Any, _Attached],
        skipped: Mapping[Any, _Skipped],
        captured: int,
        dropped_kernel: int,
        outputs: list[tuple[str, str | None, int]],
        force: bool = False,
        requests: int = 0,
        aggregated: int = 0,
    ) -> None:
        """Write the status now when forced, when the probed files changed, or when due."""
        libraries = tuple(sorted((a.library.path, a.library.kind, a.probes,
                                  tuple(sorted(a.unprobed.items())), len(a.stepped))
                                 for a in attached.values()))
        now = time.monotonic()
        if not force and libraries == self._libraries and now < self._next:
            return
        self._libraries = libraries
        self._next = now + self._interval_s
        status = {
            "v": VERSION,
            "state": state,
            "pid": os.getpid(),
            "started_ns": self._started_ns,
            "updated_ns": time.time_ns(),
            "libraries": [{"path": p, "kind": k, "probes": n, "unprobed": dict(u),
                           "stepped": stepped}
                          for p, k, n, u, stepped in libraries],
            "skipped": [{"file": _file(key), "path": s.library.path, "kind": s.library.kind,
                         "reason": s.reason}
                        for key, s in sorted(skipped.items(), key=lambda kv: str(kv[0]))],
            "captured": captured,
            "aggregated": aggregated,
            "dropped_kernel": dropped_kernel,
            "requests": requests,
            "outputs": [{"name": n, "failure": f, "lost": lost} for n, f, lost in outputs],
        }
        try:
            # Beside it under a random name, then renamed: nothing planted is written through.
            replace_file(self.path, orjson.dumps(status, option=orjson.OPT_APPEND_NEWLINE))
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.error("cannot write the status file %s: %s", self.path, exc.strerror)


def _file(key: Any) -> str:
    if isinstance(key, tuple) and len(key) == 2:
        dev, inode = key
        return f"{os.major(dev)}:{os.minor(dev)}:{inode}"
    return str(key)


def read(path: Path) -> dict[str, Any] | None:
    """The status a producer wrote at `path`, or None while there is none (or half of one)."""
    try:
        status = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return status if isinstance(status, dict) and status.get("v") == VERSION else None
