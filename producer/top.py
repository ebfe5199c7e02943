"""`gpuflight top`'s engine: rows of the node's processes each interval, from the node agent's
local feed when an agent runs here, else from a capture of its own.

Two captures on one node would probe every CUDA function twice (each call paying both): so the
node agent serves what `top` shows on a local socket (FEED_PATH, root only), and `top` reads it
when it can connect. The agent counts for it only while someone reads (TopFeed). A reader gets
a line saying whose feed it is, then one JSON line per interval, and a last line when the feed
ends for good (`trace --top`: the command exited):

    {"v": 1, "source": "the node agent's feed (/run/gpuflight/top.sock)"}
    {"v": 1, "interval_s": S, "rows": [ProcessRow as a dict, ...]}
    {"v": 1, "end": "the command exited (0)"}

Without an agent, `top` captures node-wide itself (as the agent would) into a TopTable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import select
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from gpuflight.producer.contract.errors import SetupError, UsageError
from gpuflight.producer.toptable import (
    KernelRow,
    ProcessRow,
    RouteRow,
    ShapeRow,
    TopTable,
    priced,
)

log = logging.getLogger(__name__)

#: The node agent's feed for `top`: a Unix socket only root may connect to.
FEED_PATH: Final = Path("/run/gpuflight/top.sock")
FEED_VERSION: Final = 1
#: The longest line a reader takes from the feed (a node's rows, ~1-5 KB each).
MAX_LINE_BYTES: Final = 64 << 20
#: How long the feed waits for a reader to take a line before it drops it.
SEND_TIMEOUT_S: Final = 1.0


class FeedEnded(Exception):  # noqa: N818 (an end, like StopIteration: not an error)
    """The feed ended for good (its `end` line): what it watched is over, not a failure."""


class RowSource(Protocol):
    """Where `top` gets its rows: `next_rows` blocks until the next interval's;
    `interval_s` is how long that interval lasted."""

    description: str
    interval_s: float

    def next_rows(self) -> list[ProcessRow]: ...

    def close(self) -> None: ...


# -- the agent's side ----------------------------------------------------------------------------


class TopFeed:
    """In the node agent: counts for `top` while a reader is connected, and sends each reader
    the rows of every interval. Never fails the agent: a socket that cannot be made is logged
    (top then captures on its own), a reader gone is dropped."""

    def __init__(self, table: TopTable, interval_s: float = 1.0,
                 path: Path = FEED_PATH, source: str | None = None, *,
                 ends_with_capture: bool = True) -> None:
        """`ends_with_capture`: the capture's close (this is its sink) ends the feed (the
        agent's); else only `shutdown` does (`trace --top`: with the reason, once the command
        is over)."""
        self.table = table
        self.path = path
        self.source = source or f"the node agent's feed ({path})"
        self._interval_s = interval_s
        self._ends_with_capture = ends_with_capture
        self._readers: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def reading(self) -> bool:
        """Whether anyone reads: the table is given events only then."""
        return bool(self._readers)

    # The agent's sink (decode/sinks.py): events reach the table only while someone reads.
    name = "top feed"
    takes_attribution = False

    def write(self, events: Any) -> None:
        if self._readers:
            self.table.write(events)

    def write_aggregates(self, aggregates: Any) -> None:
        if self._readers:
            self.table.write_aggregates(aggregates)

    def write_requests(self, pid: int, answered: Any, unattributed: Any) -> None:
        if self._readers:
            self.table.write_requests(pid, answered, unattributed)

    def add_utilization(self, report: Any) -> None:
        """NVML's per-process windows (Capture.utilization_observers): each process's GPU
        time, while someone reads."""
        if self._readers:
            for window in report.windows:
                self.table.add_gpu_time(window.pid, window.gpu, window.gpu_ns)

    def tick(self) -> None:
        pass

    def start(self) -> bool:
        """Serve on `path`: in a directory of ours that no one else may write to (made 0700
        when we make it; one that exists is only used, never changed), in place of a socket
        left there (anything else there is refused, not removed)."""
        parent = self.path.parent
        try:
            try:
                parent.mkdir(mode=0o700, parents=True)
                made = True
            except FileExistsError:
                made = False
            owner = parent.lstat()
            if not stat.S_ISDIR(owner.st_mode) or owner.st_uid != os.getuid():
                raise OSError(errno.EPERM, f"{parent} is not a directory of ours")
            if made:
                os.chmod(parent, 0o700)  # mkdir's mode went through the umask
            elif owner.st_mode & 0o022:
                raise OSError(errno.EPERM, f"{parent} may be written by others")
            if _serving(self.path):  # another agent serves it: its to keep
                log.warning("top feed: another agent serves %s; this one does not", self.path)
                return False
            try:
                left = self.path.lstat()
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISSOCK(left.st_mode):
                    raise OSError(errno.EEXIST, f"{self.path} exists and is not a socket")
                os.unlink(self.path)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            server.bind(str(self.path))
            os.chmod(self.path, 0o600)
            server.listen(8)
        except OSError as exc:
            log.warning("top feed: cannot serve on %s (%s); `gpuflight top` will capture on "
                        "its own", self.path, exc.strerror or exc)
            return False
        self._server = server
        self._thread = threading.Thread(target=self._serve, name="gf-top-feed", daemon=True)
        self._thread.start()
        return True

    def _serve(self) -> None:
        try:
            self._serve_readers()
        except Exception as exc:  # a reader must see the feed end, not hang on a dead thread
            log.error("top feed failed (%s): its readers are let go", exc)
            log.debug("the top feed's failure", exc_info=exc)
            self._drop_readers(None)

    def _serve_readers(self) -> None:
        assert self._server is not None
        next_at = time.monotonic() + self._interval_s
        while not self._stop.is_set():
            wait = max(0.0, next_at - time.monotonic())
            ready, _, _ = select.select([self._server], [], [], wait)
            if ready:
                try:
                    reader, _ = self._server.accept()
                except OSError:
                    continue
                try:
                    # A line is a whole interval (~5 KB a busy process): sent whole, the reader
                    # given a second to take it, else dropped (a reader that does not read).
                    reader.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                    reader.settimeout(SEND_TIMEOUT_S)
                    reader.sendall(_line({"source": self.source}))
                except OSError:  # gone at once (an agent checking whether we serve)
                    reader.close()
                    continue
                with self._lock:
                    if not self._readers:
                        self.table.snapshot()  # a fresh interval for the first reader
                        next_at = time.monotonic() + self._interval_s  # and a whole one
                    self._readers.append(reader)
                continue
            next_at += self._interval_s
            with self._lock:
                readers = list(self._readers)
            if not readers:
                continue
            rows = self.table.snapshot()
            line = encode_rows(rows, self.table.last_interval_s)
            for reader in readers:
                try:
                    reader.sendall(line)
                except OSError:  # gone, or too slow to take a line: dropped
                    with self._lock:
                        self._readers.remove(reader)
                    reader.close()

    def _drop_readers(self, end: str | None) -> None:
        with self._lock:
            for reader in self._readers:
                if end is not None:
                    with contextlib.suppress(OSError):
                        reader.sendall(_line({"end": end}))
                reader.close()
            self._readers.clear()

    def close(self) -> None:
        """The capture's close (this is its sink): the agent's feed ends with it."""
        if self._ends_with_capture:
            self.shutdown()

    def shutdown(self, end: str | None = None) -> None:
        """Stop serving; `end`: why the feed is over for good, told to every reader (its view
        then ends as the user quitting it would), else they see a feed that closed. Safe to
        call again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._drop_readers(end)
        if self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _line(message: dict[str, Any]) -> bytes:
    return orjson.dumps({"v": FEED_VERSION, **message}, option=orjson.OPT_APPEND_NEWLINE)


def encode_rows(rows: list[ProcessRow], interval_s: float) -> bytes:
    return _line({"interval_s": interval_s, "rows": [r.as_dict() for r in rows]})


def _message(line: bytes) -> dict[str, Any]:
    message = orjson.loads(line)
    if not isinstance(message, dict) or message.get("v") != FEED_VERSION:
        raise ValueError("not a top feed line of this version")
    return message


def decode_rows(line: bytes) -> tuple[list[ProcessRow], float]:
    """The rows of one feed line and how long their interval lasted (ValueError if it is not
    one of this version; FeedEnded if it is the feed's last)."""
    message = _message(line)
    if "end" in message:
        raise FeedEnded(str(message["end"]))
    return [_row(r) for r in message["rows"]], float(message["interval_s"])


def _row(r: dict[str, Any]) -> ProcessRow:
    # A field this top does not know (a newer agent's) is left out, not an error.
    return ProcessRow(**{
        **{k: v for k, v in r.items() if k in _ROW_FIELDS},
        "devices": tuple(r["devices"]),
        "kernels": tuple(KernelRow(**k) for k in r["kernels"]),
        "shapes": tuple(ShapeRow(**s) for s in r["shapes"]),
        "routes": tuple(RouteRow(**x) for x in r["routes"]),
    })


_ROW_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(ProcessRow))


# -- top's side ------------------------------------------------------------------------------


class FeedSource:
    """The node agent's feed."""

    def __init__(self, connection: socket.socket, path: Path) -> None:
        self._socket = connection
        self._lines = _lines(connection)
        self.description = f"the feed at {path}"
        self.interval_s = 0.0
        #: What $/h is priced by (PriceBook): the agent's rows carry GPU-seconds a second and
        #: the GPU's model, not a price.
        self.prices: Any = None

    def hello(self, timeout_s: float = 10.0) -> None:
        """Read whose feed it is (its first line)."""
        self._socket.settimeout(timeout_s)
        try:
            line = next(self._lines, None)
        except TimeoutError:
            line = None
        finally:
            self._socket.settimeout(None)
        try:
            if line is None:
                raise ValueError("it said nothing")
            self.description = str(_message(line)["source"])
        except (ValueError, KeyError) as exc:
            raise SetupError(f"{self.description} is not a top feed of this version "
                             f"({exc})") from None

    def next_rows(self) -> list[ProcessRow]:
        line = next(self._lines, None)
        if line is None:
            raise SetupError("the node agent stopped serving top (its feed closed)")
        rows, self.interval_s = decode_rows(line)
        return [row if row.usd_per_h is not None else
                replace(row, usd_per_h=priced(self.prices, row.gpu_s_per_s, row.gpu))
                for row in rows]

    def close(self) -> None:
        self._socket.close()


def _lines(connection: socket.socket) -> Iterator[bytes]:
    buffer = b""
    while True:
        chunk = connection.recv(1 << 20)
        if not chunk:
            return
        buffer += chunk
        if len(buffer) > MAX_LINE_BYTES:
            raise SetupError("the node agent's feed sent a line over 64 MiB")
        *lines, buffer = buffer.split(b"\n")
        yield from lines


def _serving(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def connect_feed(path: Path = FEED_PATH) -> FeedSource | None:
    """The agent's feed if one serves at `path` and lets us in, else None."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        connection.connect(str(path))
    except OSError:
        connection.close()
        return None
    source = FeedSource(connection, path)
    try:
        source.hello()
    except BaseException:
        source.close()
        raise
    return source


class CaptureSource:
    """A node-wide capture of top's own (no agent here): the events into a TopTable, on a
    thread; NVML's per-process GPU time where NVML is there."""

    def __init__(self, settings: Any, interval_s: float, prices: Any = None) -> None:
        from gpuflight.producer.capture import Capture
        from gpuflight.producer.decode.enrich import Enricher
        from gpuflight.producer.probe.preflight import check_can_probe

        check_can_probe()
        self.description = "a capture of its own (no node agent serving top here)"
        self._interval_s = interval_s
        self.interval_s = 0.0
        enricher = Enricher(proc_root=settings.proc_root)
        self._feed = self._nvml()
        self.table = TopTable(kernels=enricher.kernels, proc_root=settings.proc_root,
                              prices=prices, http=settings.http,
                              gpu_names=self._feed.gpu_names if self._feed is not None else None)
        self._capture = Capture(replace(settings, pids=None), [self.table], enricher)
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._capture.start()
        self._capture.probes.wait_loaded()
        self._thread = threading.Thread(target=self._run, name="gf-top-capture", daemon=True)
        self._thread.start()
        self.table.snapshot()  # the first interval starts now, once the probes are there
        self._next = time.monotonic() + interval_s

    def _nvml(self) -> Any:
        from gpuflight.producer.nvml import NvmlSampler, UtilizationFeed

        try:
            sampler = NvmlSampler()
        except Exception as exc:  # NvmlUnavailable, and whatever the library throws
            log.info("NVML: %s; no GPU-seconds or cost", exc)
            return None
        return UtilizationFeed(sampler, min(self._interval_s, 1.0))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._capture.step()
        except BaseException as exc:
            self._failure = exc

    def next_rows(self) -> list[ProcessRow]:
        while True:
            left = self._next - time.monotonic()
            if left <= 0:
                break
            if self._stop.wait(min(left, 0.1)) or self._failure is not None:
                break
        if self._failure is not None:
            raise SetupError(f"capture failed: {self._failure}")
        self._next += self._interval_s
        if self._feed is not None:
            for window in self._feed.take().windows:
                self.table.add_gpu_time(window.pid, window.gpu, window.gpu_ns)
        rows = self.table.snapshot()
        self.interval_s = self.table.last_interval_s
        return rows

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self._feed is not None:
            self._feed.stop()
            self._feed.sampler.close()
        try:
            self._capture.finish()
        finally:
            self._capture.close()


def open_source(settings: Any, interval_s: float, prices: Any = None,
                feed: Path = FEED_PATH,
                connect: Callable[[Path], FeedSource | None] = connect_feed,
                *, feed_only: bool = False) -> RowSource:
    """The agent's feed when one serves here, else a capture of our own (`feed_only`: a feed
    named, and nothing serving it, is an error)."""
    if interval_s <= 0:
        raise UsageError("--interval must be positive")
    found = connect(feed)
    if found is not None:
        found.prices = prices  # the agent's rows say which GPU: priced here, by ours
        return found
    if feed_only:
        raise SetupError(f"nothing serves top's rows at {feed}")
    return CaptureSource(settings, interval_s, prices)
