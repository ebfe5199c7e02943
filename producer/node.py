"""`gpuflight producer`: node-wide capture until SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from types import FrameType

from producer.capture import Capture
from producer.decode import Decoder
from producer.environment import check_can_probe
from producer.errors import UsageError
from producer.settings import CaptureSettings
from producer.sinks import EventSink, JsonLinesSink

log = logging.getLogger(__name__)

#: How often the producer logs its counters.
STATS_INTERVAL_S = 30.0


def run(settings: CaptureSettings, output: Path | None) -> int:
    if output is None:
        raise UsageError("producer needs a destination: --output FILE (--kafka comes later)")
    check_can_probe()
    stopping: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    sinks: list[EventSink] = [JsonLinesSink(output, Decoder())]
    capture = Capture(settings, sinks)
    capture.start()
    scope = "every process" if settings.pids is None else f"pids {sorted(settings.pids)}"
    log.info(
        "ready: capturing %s, %d library file(s) attached",
        scope,
        sum(1 for a in capture.probes.attached.values() if a.library.kind == "runtime"),
    )
    next_stats = time.monotonic() + STATS_INTERVAL_S
    try:
        while not stopping:
            capture.step()
            if time.monotonic() >= next_stats:
                drops = capture.drops()
                log.info("captured %d events, dropped %d", capture.stats.events, drops.events)
                next_stats += STATS_INTERVAL_S
    finally:
        drops = capture.close()
    log.info(
        "stopped: captured %d events, dropped %d in the kernel%s",
        capture.stats.events,
        drops.events,
        f" (by pid: {drops.by_pid})" if drops.by_pid else "",
    )
    return 0
