"""`gpuflight trace -- CMD`: run a command under capture and summarise it.

The command starts only once the probes are loaded and it is in scope, and
every library it maps (at start-up, by dlopen, after exec) is attached while
it is held, so not even its first call is missed.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from producer.capture import Capture
from producer.decode import Enricher
from producer.environment import check_can_probe
from producer.errors import UsageError
from producer.settings import CaptureSettings
from producer.sinks import EventSink, JsonLinesSink, SummarySink
from producer.summary import Summary, render

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceResult:
    exit_code: int
    wall_s: float
    summary: Summary
    dropped: int
    events: int


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def _spawn_held(argv: Sequence[str]) -> tuple[int, int]:
    """Fork a child that execs argv once we write to the returned pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(write_end)
            os.read(read_end, 1)
            os.closerange(3, 65536)  # BPF maps and perf events stay with us
            os.execvp(argv[0], list(argv))
        except OSError as exc:
            os.write(2, f"gpuflight: cannot run {argv[0]}: {exc.strerror}\n".encode())
        os._exit(127)
    os.close(read_end)
    return pid, write_end


def run(
    argv: Sequence[str],
    output: Path | None = None,
    settings: CaptureSettings | None = None,
    print_summary: bool = True,
) -> TraceResult:
    if not argv:
        raise UsageError("trace needs a command: gpuflight trace [--output FILE] -- CMD [ARGS...]")
    if shutil.which(argv[0]) is None:
        raise UsageError(f"command not found: {argv[0]}")
    check_can_probe()
    base = settings or CaptureSettings()
    settings = replace(base, pids=frozenset(), follow_forks=True, hold_on_load=True)
    summary_sink = SummarySink()
    sinks: list[EventSink] = [summary_sink]
    enricher = Enricher(proc_root=settings.proc_root)
    if output is not None:
        sinks.append(JsonLinesSink(output, enricher.kernels))
    capture = Capture(settings, sinks, enricher)
    pid, release = _spawn_held(argv)
    capture.probes.add_to_scope([pid])
    # With exec watched, the child is held at exec and scanned then. Without,
    # scan it now, while it is still a copy of us: that attaches our own loader
    # (usually the command's too), and the loader probe reports the rest.
    capture.start(initial_scan=not capture.settings.watch_exec)
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)}
    forward = signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
    started = time.monotonic()
    os.write(release, b"x")
    os.close(release)
    status = 0
    try:
        while True:
            capture.step()
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
    finally:
        wall_s = time.monotonic() - started
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGTERM, forward)
        drops = capture.close()
    result = TraceResult(
        exit_code=_exit_code(status),
        wall_s=wall_s,
        summary=summary_sink.summary,
        dropped=drops.events,
        events=capture.stats.events,
    )
    if print_summary:
        title = " ".join(argv)
        print("\n" + render(result.summary, title, wall_s, drops.events) + "\n", file=sys.stderr)
    if drops.events:
        log.warning("%d events were dropped in the kernel (ring buffer full)", drops.events)
    return result
