"""A host's time: what the stream worker writes and closes a host's windows by. Pure: no Faust,
no I/O.

Each message applied from a host says when it was on the host: its latest event, or the latest
end of its requests (`message_time`). The host's time is the second latest of those times: what
two messages attest to. No single message moves it, however far ahead of the others it is
stamped (a forged one, one from a broken clock: it would close the host's windows, and every
real event after it would be late); one stamped further ahead of the worker's wall clock than
--max-future is not applied at all (streams/worker.py). A host sends a message per process every
flush interval (a quarter of a second), so its time lags its latest message by about one.

A replay of old data moves it at the replay's pace, not the wall clock's. Once the host has been
silent for `idle_ns` (no message at all), its time goes on with the wall clock beyond that, so
the windows of a host that stopped still close; and its latest message then counts alone, up
to the wall clock when the host was last heard from (so the last message of a replay closes
its windows, and a forged one closes nothing the wall clock would not close of a silent host).
A host with one message so far has the earlier of that message's time and the wall clock when
it came.

Each job state keeps the two latest times of its own messages (`keep_latest`), so a restarted
worker gets its hosts' times back from the states it recovers (`HostClock.merge`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

#: Message times kept: the host's time is the last of them.
KEPT: Final = 2


def keep_latest(latest: Sequence[int], time_ns: int) -> list[int]:
    """The KEPT latest of `latest` (latest first) and `time_ns`."""
    return sorted([*latest, time_ns], reverse=True)[:KEPT]


@dataclass
class HostClock:
    #: The KEPT latest message times (ns), latest first.
    latest: list[int] = field(default_factory=list)
    #: Wall clock (ns) when the host was last heard from: a message, or one parked.
    heard_ns: int = 0

    def heard(self, time_ns: int | None, wall_ns: int) -> None:
        """A message from the host, at `time_ns` on it (None: it says no time)."""
        if time_ns is not None:
            self.latest = keep_latest(self.latest, time_ns)
        self.heard_ns = max(self.heard_ns, wall_ns)

    def merge(self, times: Iterable[int]) -> None:
        """The latest message times of a job state recovered (each message is of one job)."""
        for t in times:
            self.latest = keep_latest(self.latest, t)

    @property
    def attested_ns(self) -> int | None:
        """The host's time by its messages alone (None: no message yet)."""
        if len(self.latest) >= KEPT:
            return self.latest[KEPT - 1]
        return min(self.latest[0], self.heard_ns) if self.latest else None

    def now(self, wall_ns: int, idle_ns: int) -> int:
        """The host's time at `wall_ns` (0 before any message)."""
        attested = self.attested_ns
        if attested is None:
            return 0
        silent_ns = wall_ns - self.heard_ns - idle_ns
        if silent_ns < 0:
            return attested
        # Silent: its latest message counts alone now, up to the wall clock when it was heard
        # from last (as far as a silent host's time goes anyway); on with the wall clock.
        return max(attested, min(self.latest[0], self.heard_ns)) + silent_ns
