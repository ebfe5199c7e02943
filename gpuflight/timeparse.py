"""Times on the command line: one parser for every command (a contract module: streams
imports it too).

    parse_time("2026-12-04T10:00:00Z")     ISO 8601, naive = UTC
    parse_time("1796225714.5")             seconds since the epoch
    parse_time("1796225714176683439ns")    an integer with a unit: exact
    time_range("6h", None)                 [now - 6 h, now)
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import Final

from gpuflight.producer.contract.errors import UsageError

_UNITS: Final = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_DURATION: Final = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$")
_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: Times are int64 ns on the wire and in InfluxDB: nothing beyond this is a time.
MAX_NS: Final = (1 << 63) - 1


def parse_time(text: str) -> int:
    """Wall-clock ns from ISO 8601 (naive = UTC), or a time since the epoch: seconds,
    or an integer with a unit (`1796225714176683439ns`, `1796225714176ms`) — exact.

    UsageError (one line) for anything else, and for times outside 0 .. 2^63-1 ns."""
    value = _parse(text.strip())
    if not 0 <= value <= MAX_NS:
        raise UsageError(f"not a time: {text!r} is outside the years 1970-2262")
    return value


def _parse(text: str) -> int:
    for unit, factor in sorted(_UNITS.items(), key=lambda u: -len(u[0])):
        number = text.removesuffix(unit)
        if number != text and number.isdigit():
            return int(number) * factor
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise UsageError(f"not a time: {text!r} (ISO 8601 or seconds since the epoch)")
        return int(seconds * 1e9) if abs(seconds) < 1e10 else MAX_NS + 1
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"not a time: {text!r} (ISO 8601 or seconds since the epoch)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1e9)


def time_range(since: str, until: str | None, now_ns: int | None = None) -> tuple[int, int]:
    """[since, until) in ns: `since` a duration back from now (90s, 30m, 6h, 7d, 2w) or a
    time as `parse_time` takes it; `until` a time (default now)."""
    now = time.time_ns() if now_ns is None else now_ns
    end = parse_time(until) if until else now
    match = _DURATION.match(since.strip())
    if match:
        back = float(match[1]) * _SECONDS[match[2]] * 1e9
        start = max(now - int(min(back, float(MAX_NS))), 0)
    else:
        start = parse_time(since)
    if start >= end:
        raise UsageError(f"empty time range: since {since} is not before until {until or 'now'}")
    return start, end
