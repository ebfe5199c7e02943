"""`gpuflight trace --top`: `top`'s screen on the traced command, live.

The trace serves its own rows on a private feed (producer/top.py's TopFeed, in a 0700 directory
of its own) and runs `gpuflight top` on it as a process of its own, on the terminal: the screen
never competes with the capture loop for the interpreter, and reads exactly what an agent's
feed gives. The command's output goes to a file meanwhile (the screen owns the terminal), its
stdin is /dev/null. When the command exits the feed says so, the screen closes and the summary
is printed as without --top. Quitting the screen early (q) leaves the trace running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.contract.files import open_output

if TYPE_CHECKING:
    from gpuflight.producer.contract.pricing import PriceBook
    from gpuflight.producer.decode.kernels import KernelNames
    from gpuflight.producer.decode.sinks import EventSink
    from gpuflight.producer.top import TopFeed

log = logging.getLogger(__name__)

#: How long the screen has to close once told the command ended, before it is stopped.
CLOSE_TIMEOUT_S = 10.0


class LiveTop:
    """The feed, the screen and where the command's output goes, for one `trace --top`."""

    def __init__(self, argv: Sequence[str], command_output: Path | None,
                 prices: PriceBook | None, http: bool) -> None:
        self._title = " ".join(argv)
        self._prices = prices
        self._http = http
        self._dir = Path(tempfile.mkdtemp(prefix="gpuflight-top-"))  # 0700, ours
        self._feed: TopFeed | None = None
        self._screen: subprocess.Popen[bytes] | None = None
        self._made = command_output is None
        if command_output is None:
            fd, name = tempfile.mkstemp(prefix="gpuflight-trace-", suffix=".log")
            self.output_path = Path(name)
            self._output = os.fdopen(fd, "wb")
        else:
            self.output_path = command_output
            self._output = open(open_output(command_output, "--command-output"), "wb")  # noqa: SIM115
        self._null = open(os.devnull, "rb")  # noqa: SIM115
        self._held_logs = _HeldLogs()

    @property
    def command_stdio(self) -> tuple[int, int, int]:
        return self._null.fileno(), self._output.fileno(), self._output.fileno()

    def watchers(self, kernels: KernelNames) -> list[EventSink]:
        """The feed (a sink of the trace's capture), serving, and the screen reading it."""
        from gpuflight.producer.top import TopFeed
        from gpuflight.producer.toptable import TopTable

        table = TopTable(kernels=kernels, prices=self._prices, http=self._http)
        feed = TopFeed(table, path=self._dir / "top.sock",
                       source=f"trace of {self._title} (its output: {self.output_path})",
                       ends_with_capture=False)  # it ends in `end`, with the reason
        if not feed.start():
            raise SetupError(f"trace --top: cannot serve its rows on {feed.path}")
        self._feed = feed
        self._held_logs.start()  # the screen owns the terminal: this run's lines come after it
        self._screen = subprocess.Popen(
            [sys.executable, "-m", "gpuflight", "top", "--top-feed", str(feed.path)])
        return [feed]

    def end(self, exit_code: int | None = None) -> None:
        """The command is over: the screen closes (stopped if it will not), the feed too.
        Safe to call again."""
        if self._feed is not None:
            self._feed.shutdown(end=f"{self._title} exited ({exit_code})"
                             if exit_code is not None else "the trace ended")
            self._feed = None
        if self._screen is not None:
            try:
                self._screen.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("top's screen did not close; stopping it")
                self._screen.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._screen.wait(CLOSE_TIMEOUT_S)
            self._screen = None
        self._held_logs.let_out()

    def close(self) -> None:
        """End the view; the command's output file stays (one we made, left empty, goes)."""
        self.end()
        self._output.close()
        self._null.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        if self._made and self.output_path.stat().st_size == 0:
            self.output_path.unlink()

    def output_note(self) -> str:
        if not self.output_path.exists():
            return "the command wrote nothing to its stdout or stderr"
        return f"the command's output: {self.output_path}"


class _HeldLogs(logging.Handler):
    """While the screen is up, the root logger's lines wait here (on the terminal they would
    be drawn over the screen and gone when it closes), then go out as they would have."""

    def __init__(self) -> None:
        super().__init__()
        self._records: list[logging.LogRecord] = []
        self._handlers: list[logging.Handler] = []

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)

    def start(self) -> None:
        root = logging.getLogger()
        self._handlers = [h for h in root.handlers if h is not self]
        for handler in self._handlers:
            root.removeHandler(handler)
        root.addHandler(self)

    # Not `release`/`acquire`: those are Handler's own lock.
    def let_out(self) -> None:
        root = logging.getLogger()
        if self not in root.handlers:
            return
        root.removeHandler(self)
        for handler in self._handlers:
            root.addHandler(handler)
        for record in self._records:
            for handler in self._handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
        self._records.clear()
