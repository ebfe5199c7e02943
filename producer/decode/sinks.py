"""Where captured events go: a JSON-lines file, a summary, or memory (tests).

Capture wraps every sink in `Guarded`: a sink that fails (a full disk under --output, say) is
switched off with one line in the log and its loss counted, and the other sinks go on.
"""

from __future__ import annotations

import errno
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

import numpy as np
import numpy.typing as npt
import orjson

from gpuflight.producer.contract.files import open_output
from gpuflight.producer.contract.wire import EventAttribution, PathRecord, RequestRecord
from gpuflight.producer.decode.enrich import Event, request_event, to_aggregate_events, to_events
from gpuflight.producer.decode.kernels import KernelNames
from gpuflight.producer.decode.summary import Summary

if TYPE_CHECKING:
    from gpuflight.producer.http.requesttrack import Answered

log = logging.getLogger(__name__)


class WithRecord(Protocol):
    """A request as sinks take it (requesttrack.Answered; replay's requests read back)."""

    @property
    def record(self) -> RequestRecord: ...


class EventSink(Protocol):
    """Takes batches of enriched events (records.EVENT_DTYPE) in ring order.

    With the HTTP capture on, a sink that has `write_requests` also gets, per loop turn, each
    process's requests answered (with their cost) and the cost no request explains; one whose
    `write` takes `attribution` (`takes_attribution = True`) gets each event's request(s). One
    that has `write_aggregates` gets what the kernel counted under overload instead of
    recording (records.AGGREGATE_DTYPE, enriched): the rest never see those events. One that
    has `write_paths` gets, per loop turn, each process's code paths sampled since the last
    (wire.PathRecord; with stack sampling on)."""

    def write(self, events: npt.NDArray[np.void]) -> None: ...

    def tick(self) -> None:
        """Called every loop turn, events or not (time-based flushing)."""

    def close(self) -> None: ...


#: What JsonLinesSink holds before it writes, whatever the flush interval.
FLUSH_BYTES = 1 << 20


class JsonLinesSink:
    """`--output FILE`: one JSON object per event and line ('-' is stdout).

    What is written reaches the file (the page cache) within `flush_interval_s`, so a quiet
    node's events survive a SIGKILL of the agent. It keeps its own buffer (not Python's), so
    that when a write fails (a full disk) it knows exactly which events never reached the
    file: `unwritten_events`, counted lost by Guarded, and dropped rather than tried again."""

    def __init__(self, path: Path | str, kernels: KernelNames | None = None,
                 flush_interval_s: float = 0.2) -> None:
        self._kernels = kernels
        self._own = str(path) != "-"
        self.name = f"--output {path}"
        # Unbuffered: this sink's own buffer (below) is the one, so a failed write says which
        # events did not get out (stdout stays buffered: shared with the process). The file is
        # a regular one, never reached through a symlink nor waited on (producer/contract/files.py).
        self._file: BinaryIO = (
            open(open_output(path, "--output"), "wb", buffering=0)  # noqa: SIM115
            if self._own else sys.stdout.buffer
        )
        self.written = 0
        self.requests_written = 0
        self.aggregates_written = 0
        self._flush_interval_s = flush_interval_s
        self._unflushed_since: float | None = None
        #: Encoded lines not written yet, each chunk with the events it holds.
        self._chunks: list[tuple[bytes, int]] = []
        self._chunk_bytes = 0
        #: After a failed write: the events of it that did not reach the file (else None).
        self.unwritten_events: int | None = None

    takes_attribution = True

    def write(self, events: npt.NDArray[np.void],
              attribution: EventAttribution | None = None) -> None:
        decoded = to_events(events, self._kernels, attribution)
        if decoded:
            self.written += len(decoded)
            self._lines(decoded, len(decoded))

    def write_aggregates(self, aggregates: npt.NDArray[np.void]) -> None:
        """One line per aggregate ("type": "aggregate", decode.to_aggregate_events): the
        events the kernel counted instead of recording them."""
        decoded = to_aggregate_events(aggregates, self._kernels)
        if decoded:
            self.aggregates_written += len(decoded)
            self._lines(decoded, int(aggregates["count"].sum()))

    def write_requests(self, pid: int, answered: Sequence[WithRecord],
                       unattributed: Mapping[str, float]) -> None:
        """One line per request ("type": "request"); the unattributed cost is what the
        events without `request_id` or `requests` add up to, so it needs no line."""
        if answered:
            self._lines([request_event(pid, a.record) for a in answered], 0)
            self.requests_written += len(answered)

    def _lines(self, decoded: list[Event], events: int) -> None:
        data = b"".join(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE) for e in decoded)
        self._chunks.append((data, events))
        self._chunk_bytes += len(data)
        if self._unflushed_since is None:
            self._unflushed_since = time.monotonic()
        if self._chunk_bytes >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        """Write what is held. On failure the lines not written whole are dropped, their
        events in `unwritten_events`, and the error raised."""
        self._unflushed_since = None
        chunks, self._chunks, self._chunk_bytes = self._chunks, [], 0
        done = 0
        try:
            for data, _ in chunks:
                view = memoryview(data)
                while view:  # a raw file may take part of it
                    taken = self._file.write(view)
                    if not taken:
                        raise OSError(errno.EIO, "the output took nothing")
                    view = view[taken:]
                done += 1
        except OSError:
            # The chunk that failed, and those after it: their events did not all get out
            # (a chunk cut short counts whole: lost is never less than what went missing).
            self.unwritten_events = sum(n for _, n in chunks[done:])
            raise
        try:
            self._file.flush()  # stdout's own buffer
        except OSError:
            self.unwritten_events = sum(n for _, n in chunks)
            raise

    def tick(self) -> None:
        since = self._unflushed_since
        if since is not None and time.monotonic() - since >= self._flush_interval_s:
            self._flush()

    def close(self) -> None:
        try:
            self._flush()
        finally:
            if self._own:
                self._file.close()


class SummarySink:
    def __init__(self, summary: Summary | None = None) -> None:
        self.summary = summary or Summary()
        #: The requests answered (trace's route table), and the cost no request explains.
        self.requests: list[Answered] = []
        self.unattributed: dict[str, float] = {}

    def write(self, events: npt.NDArray[np.void]) -> None:
        self.summary.add(events)

    def write_aggregates(self, aggregates: npt.NDArray[np.void]) -> None:
        self.summary.add_aggregates(aggregates)

    def write_requests(self, pid: int, answered: Sequence[Answered],
                       unattributed: Mapping[str, float]) -> None:
        self.requests.extend(answered)
        for name, value in unattributed.items():
            self.unattributed[name] = self.unattributed.get(name, 0.0) + value

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass


class MemorySink:
    """Keeps decoded events in memory; for tests and small tools."""

    def __init__(self, kernels: KernelNames | None = None) -> None:
        self._kernels = kernels
        self.events: list[Event] = []

    def write(self, events: npt.NDArray[np.void]) -> None:
        self.events.extend(to_events(events, self._kernels))

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass


class Guarded:
    """A sink whose failure costs only itself: the first exception from write, tick or close
    is logged in one line, the sink is off from then on, and the events it did not take are
    counted (`lost`)."""

    def __init__(self, sink: EventSink, name: str) -> None:
        self.sink = sink
        self.name = name
        #: Why the sink stopped (None while it works).
        self.failure: str | None = None
        #: Events handed to it after it failed (or in the batch that failed).
        self.lost = 0

    def write(self, events: npt.NDArray[np.void],
              attribution: EventAttribution | None = None) -> None:
        if self.failure is not None:
            self.lost += len(events)
            return
        try:
            if attribution is not None and getattr(self.sink, "takes_attribution", False):
                self.sink.write(events, attribution)  # type: ignore[call-arg]
            else:
                self.sink.write(events)
        except Exception as exc:
            # A sink that knows which of its events never reached it says so (JsonLinesSink:
            # this batch and the ones it held); else this batch is what is lost.
            unwritten = getattr(self.sink, "unwritten_events", None)
            self.lost += len(events) if unwritten is None else unwritten
            self._fail(exc)

    def write_aggregates(self, aggregates: npt.NDArray[np.void]) -> None:
        """To the sink if it takes aggregates (and works); a failure is the sink's as in
        `write`, its events counted lost."""
        take = getattr(self.sink, "write_aggregates", None)
        if take is None:
            return
        if self.failure is not None:
            self.lost += int(aggregates["count"].sum())
            return
        try:
            take(aggregates)
        except Exception as exc:
            self.lost += int(aggregates["count"].sum())
            self._fail(exc)

    def write_requests(self, pid: int, answered: Sequence[Answered],
                       unattributed: Mapping[str, float]) -> None:
        take = getattr(self.sink, "write_requests", None)
        if self.failure is not None or take is None:
            return
        try:
            take(pid, answered, unattributed)
        except Exception as exc:
            self._fail(exc)

    def takes_paths(self) -> bool:
        return getattr(self.sink, "write_paths", None) is not None

    def write_paths(self, pid: int, paths: Sequence[PathRecord]) -> None:
        """A process's code paths since the last turn, to the sink if it takes them."""
        take = getattr(self.sink, "write_paths", None)
        if self.failure is not None or take is None:
            return
        try:
            take(pid, paths)
        except Exception as exc:
            self._fail(exc)

    def tick(self) -> None:
        if self.failure is None:
            try:
                self.sink.tick()
            except Exception as exc:
                self.lost += getattr(self.sink, "unwritten_events", None) or 0
                self._fail(exc)

    def close(self) -> None:
        if self.failure is None:
            try:
                self.sink.close()
            except Exception as exc:
                self.lost += getattr(self.sink, "unwritten_events", None) or 0
                self._fail(exc)
            return
        # Release what it holds (a file descriptor); its error is known already.
        try:
            self.sink.close()
        except Exception as exc:
            log.debug("closing %s after its failure: %s", self.name, exc)

    def _fail(self, exc: Exception) -> None:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        self.failure = f"{type(exc).__name__}: {reason}" if not isinstance(exc, OSError) else reason
        log.error("%s failed (%s): it is off from here on, the other outputs go on",
                  self.name, self.failure)
        log.debug("the failure of %s", self.name, exc_info=exc)
