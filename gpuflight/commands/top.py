"""`gpuflight top`: the node's GPU processes, live (gpuflight/topscreen.py), or once / as JSON
for scripts."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from gpuflight.commands.options import add_capture_options, add_price_options, positive
from gpuflight.producer.contract.errors import SetupError, UsageError
from gpuflight.producer.settings import CaptureSettings

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpuflight.commands.options import Subparsers
    from gpuflight.producer.toptable import ProcessRow


def add_parser(sub: Subparsers) -> None:
    from gpuflight.topcolumns import KEYS

    parser = sub.add_parser(
        "top", help="the node's GPU processes, live: launches, copies, waits, requests, cost")
    parser.add_argument("--interval", type=positive, default=1.0, metavar="S",
                        help="refresh every S seconds (default %(default)s; the node agent's "
                        "feed, when one serves, refreshes every second)")
    parser.add_argument("--once", action="store_true",
                        help="print the table of one interval and exit")
    parser.add_argument("--json", action="store_true",
                        help="JSON rows, a line per interval (with --once: one)")
    parser.add_argument("--sort", choices=KEYS, default="launches_per_s",
                        help="the column to sort by (default %(default)s)")
    parser.add_argument("--filter", default="", metavar="TEXT",
                        help="only processes whose pod, namespace, job or command holds TEXT")
    parser.add_argument("--top-feed", type=Path, default=None, metavar="SOCKET",
                        help="read the feed at SOCKET, and only it (default: the node "
                        "agent's, /run/gpuflight/top.sock, if an agent serves it; else top "
                        "captures on its own)")
    add_price_options(parser)
    add_capture_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    interactive = not (args.once or args.json)
    if interactive:
        check_terminal(instead="for scripts: --once or --json")
        return _top(args, interactive)
    _stop_on_signals()
    try:
        return _top(args, interactive)
    except _Stopped as stopped:
        return 128 + stopped.signum


def _top(args: argparse.Namespace, interactive: bool) -> int:
    from gpuflight.commands.options import price_book
    from gpuflight.producer.top import FEED_PATH, FeedEnded, open_source

    settings = CaptureSettings(ringbuf_pages=args.ring_buffer_pages,
                               cpu_slots=args.cpu_buffer_slots, http=args.http)
    source = open_source(settings, args.interval, price_book(args.prices),
                         feed=args.top_feed or FEED_PATH, feed_only=args.top_feed is not None)
    try:
        if interactive:
            return _live(source.next_rows, source.description, args)
        while True:
            try:
                rows = source.next_rows()
            except FeedEnded:
                return 0
            with _signals_held():  # a line is written whole, the stop comes after it
                _print(rows, source.interval_s, source.description, args)
            if args.once:
                return 0
    finally:
        source.close()


class _Stopped(Exception):  # noqa: N818 (a stop asked for, not an error)
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_STOPPING = (signal.SIGTERM, signal.SIGINT)


class _Stops:
    """Whether a line is being written (a stop then waits for its end), and the stop asked
    for meanwhile. (Blocking the signals would not do: CPython runs a handler in the main
    thread whichever thread the kernel gave the signal to.)"""

    writing = False
    pending: int | None = None


def _stop_on_signals() -> None:
    """--once/--json: SIGTERM or SIGINT ends top (its probes released), even where it was
    started with SIGINT ignored (a background job), as the node agent does; a second one is
    ignored, so that nothing cuts the closing short."""
    def stop(signum: int, _frame: object) -> None:
        for sig in _STOPPING:
            signal.signal(sig, signal.SIG_IGN)
        if _Stops.writing:
            _Stops.pending = signum
            return
        raise _Stopped(signum)

    _Stops.writing, _Stops.pending = False, None
    for sig in _STOPPING:
        signal.signal(sig, stop)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """A stop asked for while the block runs comes at its end."""
    _Stops.writing = True
    try:
        yield
    finally:
        _Stops.writing = False
        if _Stops.pending is not None:
            raise _Stopped(_Stops.pending)


def _print(rows: list[ProcessRow], interval_s: float, description: str,
           args: argparse.Namespace) -> None:
    if args.json:
        from gpuflight.topcolumns import sorted_rows

        shown = sorted_rows(rows, args.sort, args.filter)
        sys.stdout.buffer.write(orjson.dumps(
            {"ts": time.time(), "interval_s": interval_s, "source": description,
             "rows": [r.as_dict() for r in shown]}, option=orjson.OPT_APPEND_NEWLINE))
        sys.stdout.flush()
        return
    from rich.console import Console

    from gpuflight.topcolumns import plain_table

    Console(soft_wrap=False).print(plain_table(rows, args.sort, args.filter,
                                               title=f"gpuflight top — {description}"))


def check_terminal(what: str = "top", instead: str = "--once or --json") -> None:
    """A terminal big enough for top's screen, else a UsageError saying what to use instead."""
    from gpuflight.topcolumns import MIN_COLUMNS, MIN_LINES

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(f"{what} needs a terminal; {instead}")
    size = shutil.get_terminal_size()
    if size.columns < MIN_COLUMNS or size.lines < MIN_LINES:
        raise UsageError(f"the terminal is {size.columns}x{size.lines}; {what} needs at least "
                         f"{MIN_COLUMNS}x{MIN_LINES} ({instead})")


def _live(next_rows: object, description: str, args: argparse.Namespace) -> int:
    from gpuflight.topscreen import TopApp

    app = TopApp(next_rows, description, key=args.sort, text=args.filter)  # type: ignore[arg-type]
    failure = app.run()
    if failure:
        raise SetupError(failure)
    return 0
