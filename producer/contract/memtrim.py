"""Giving memory the process freed back to the system.

glibc keeps what a peak freed (a burst of name records, a Kafka outage's backlog, a big
library file classified) in its arenas, and a long-running process's RSS then steps up at
each peak and stays: the soak's agent and worker grew ~20-90 MiB an hour that way with
their own data flat (bench/results/soak.md, issue 17). `Trimmer` calls glibc's malloc_trim(0)
every interval from the process's own loop (a few milliseconds for a few hundred MiB).
Where the C library has no malloc_trim (musl), it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

#: How often the agent and the stream worker trim by default.
INTERVAL_S: Final = 60.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class Trimmer:
    """`maybe()` trims when `interval_s` has passed since the last time (monotonic clock)."""

    def __init__(self, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_s
        self._clock = clock
        self._next = clock() + interval_s
        self._trim = _malloc_trim()
        self.trims = 0

    def maybe(self) -> bool:
        """Trim if due; whether it did."""
        now = self._clock()
        if self._trim is None or self._interval < 0 or now < self._next:
            return False
        self._next = now + self._interval
        self._trim(0)
        self.trims += 1
        return True
