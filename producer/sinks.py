"""Where captured events go: a JSON-lines file, a summary, or memory (tests)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np
import numpy.typing as npt
import orjson

from producer.decode import Event, to_events
from producer.kernels import KernelNames
from producer.summary import Summary


class EventSink(Protocol):
    """Takes batches of enriched events (records.EVENT_DTYPE) in ring order."""

    def write(self, events: npt.NDArray[np.void]) -> None: ...

    def tick(self) -> None:
        """Called every loop turn, events or not (time-based flushing)."""

    def close(self) -> None: ...


class JsonLinesSink:
    """`--output FILE`: one JSON object per event and line ('-' is stdout)."""

    def __init__(self, path: Path | str, kernels: KernelNames | None = None) -> None:
        self._kernels = kernels
        self._own = str(path) != "-"
        self._file: BinaryIO = open(path, "wb") if self._own else sys.stdout.buffer  # noqa: SIM115
        self.written = 0

    def write(self, events: npt.NDArray[np.void]) -> None:
        decoded = to_events(events, self._kernels)
        if decoded:
            self._file.write(b"".join(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE)
                                      for e in decoded))
            self.written += len(decoded)

    def tick(self) -> None:
        pass

    def close(self) -> None:
        self._file.flush()
        if self._own:
            self._file.close()


class SummarySink:
    def __init__(self, summary: Summary | None = None) -> None:
        self.summary = summary or Summary()

    def write(self, events: npt.NDArray[np.void]) -> None:
        self.summary.add(events)

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
