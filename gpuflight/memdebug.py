"""Opt-in memory diagnostics for long-running commands (the node agent, the stream worker).

With GPUFLIGHT_MEMDEBUG=DIR in the environment, the command traces Python allocations
(tracemalloc, GPUFLIGHT_MEMDEBUG_FRAMES frames, default 8) and every
GPUFLIGHT_MEMDEBUG_INTERVAL seconds (default 60) writes DIR/COMMAND-PID.txt: RSS, glibc's
malloc counters (what native code holds: bcc, librdkafka, numpy buffers), the traced Python
heap, and the allocation sites (by traceback) and object types that grew most since the
first dump. Python-heap growth and native growth are told apart that way. Off (and free)
without the variable; slow with it (tracemalloc roughly doubles allocation costs; with
GPUFLIGHT_MEMDEBUG_FRAMES=0 it is off, and only RSS, malloc counters and object types are
written). GPUFLIGHT_MEMDEBUG_TRIM=1 also calls glibc's malloc_trim(0) after each dump and
writes RSS before and after: how much is memory malloc holds free (fragmentation, a past
peak) rather than memory in use.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path

log = logging.getLogger(__name__)

ENV_DIR = "GPUFLIGHT_MEMDEBUG"
ENV_INTERVAL = "GPUFLIGHT_MEMDEBUG_INTERVAL"
ENV_FRAMES = "GPUFLIGHT_MEMDEBUG_FRAMES"
ENV_TRIM = "GPUFLIGHT_MEMDEBUG_TRIM"
TOP = 25


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _malloc_counters() -> str:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return "malloc: unavailable"
    mib = 1 << 20
    return (f"malloc: arena {info.arena / mib:.1f} MiB (in use {info.uordblks / mib:.1f}, "
            f"free {info.fordblks / mib:.1f}), mmapped {info.hblkhd / mib:.1f} MiB")


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _types() -> Counter[str]:
    return Counter(type(o).__name__ for o in gc.get_objects())


def start_from_environment(command: str) -> None:
    """Start the diagnostics if GPUFLIGHT_MEMDEBUG names a directory (else nothing)."""
    directory = os.environ.get(ENV_DIR)
    if not directory:
        return
    interval = float(os.environ.get(ENV_INTERVAL, "60"))
    frames = int(os.environ.get(ENV_FRAMES, "8"))
    path = Path(directory) / f"{command}-{os.getpid()}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    if frames > 0:
        tracemalloc.start(frames)
    trim = os.environ.get(ENV_TRIM) == "1"
    thread = threading.Thread(target=_run, args=(path, interval, trim), name="memdebug",
                              daemon=True)
    thread.start()
    log.info("memory diagnostics every %.0f s into %s", interval, path)


def _run(path: Path, interval: float, trim: bool) -> None:
    first: tracemalloc.Snapshot | None = None
    first_types: Counter[str] | None = None
    started = time.monotonic()
    while True:
        time.sleep(interval)
        types = _types()
        lines = [f"=== t={time.monotonic() - started:.0f} s  RSS {_rss_mib():.1f} MiB  "
                 f"{_malloc_counters()}"]
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot().filter_traces(
                (tracemalloc.Filter(False, tracemalloc.__file__),))
            current, peak = tracemalloc.get_traced_memory()
            lines[0] += f"  traced {current / 2**20:.1f} MiB (peak {peak / 2**20:.1f})"
            if first is None:
                first = snapshot
            else:
                lines.append(f"-- allocation sites grown most since the first dump (top {TOP}):")
                for stat in snapshot.compare_to(first, "traceback")[:TOP]:
                    lines.append(f"{stat.size_diff / 1024:+.1f} KiB {stat.count_diff:+d} blocks "
                                 f"(now {stat.size / 1024:.1f} KiB)")
                    lines.extend(f"    {frame}" for frame in stat.traceback.format()[-12:])
        if first_types is None:
            first_types = types
        else:
            grown = Counter(types)
            grown.subtract(first_types)
            lines.append("-- object types grown most: " + ", ".join(
                f"{name} {n:+d}" for name, n in grown.most_common(TOP) if n > 0))
        if trim:
            before = _rss_mib()
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            lines.append(f"-- malloc_trim(0): RSS {before:.1f} -> {_rss_mib():.1f} MiB")
        with contextlib.suppress(OSError), path.open("a") as out:
            out.write("\n".join(lines) + "\n")
