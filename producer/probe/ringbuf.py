"""Bulk reader for a BPF ring buffer map, mapped straight into this process.

bcc's per-event Python callback tops out near 200k events/s. Every record in
our event ring has the same size, so a committed span of the ring is a plain
array: this reader maps the ring (the kernel maps the data area twice in a
row, so a span that wraps is still contiguous), finds how far the records are
committed, copies that span out with numpy in one go and moves the consumer
position past it.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from typing import Final

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.abi import EVENT_DTYPE, RINGBUF_HEADER_BYTES

_BUSY_BIT: Final = 1 << 31
_DISCARD_BIT: Final = 1 << 30
_LEN_MASK: Final = ~(_BUSY_BIT | _DISCARD_BIT) & 0xFFFFFFFF


def record_dtype(payload: np.dtype[np.void]) -> np.dtype[np.void]:
    """A ring buffer record holding one `payload`: the kernel's 8-byte header, then the
    payload, padded to 8 bytes as the kernel places records."""
    return np.dtype({
        "names": ["len", "pg_off", "event"],
        "formats": ["<u4", "<u4", payload],
        "offsets": [0, 4, RINGBUF_HEADER_BYTES],
        "itemsize": (RINGBUF_HEADER_BYTES + payload.itemsize + 7) & ~7,
    })


class RingBufferReader:
    """Drains a BPF_MAP_TYPE_RINGBUF whose records are all one struct (`dtype`: by default
    `struct gf_event`); a record of another size is skipped and counted."""

    def __init__(self, map_fd: int, data_bytes: int,
                 dtype: np.dtype[np.void] = EVENT_DTYPE) -> None:
        if data_bytes <= 0 or data_bytes & (data_bytes - 1):
            raise ValueError(f"ring buffer size must be a power of two, got {data_bytes}")
        page = mmap.PAGESIZE
        self._size = data_bytes
        self._mask = data_bytes - 1
        self._consumer_map = mmap.mmap(
            map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0
        )
        self._producer_map = mmap.mmap(
            map_fd, page + 2 * data_bytes, mmap.MAP_SHARED, mmap.PROT_READ, offset=page
        )
        self._consumer_pos = np.frombuffer(self._consumer_map, dtype=np.uint64, count=1)
        self._producer_pos = np.frombuffer(self._producer_map, dtype=np.uint64, count=1)
        self._data = np.frombuffer(self._producer_map, dtype=np.uint8, offset=page)
        self._fd = map_fd
        self._dtype = dtype
        self._record_dtype = record_dtype(dtype)
        self._record = self._record_dtype.itemsize
        self.foreign_records = 0  # records of another size: skipped, counted
        #: The fullest a drain found the ring (0..1) since `take_fill_max` last ran.
        self._fill_max = 0.0
        #: After a drain: the earliest end (`ts_ns` + `duration_ns`) of the committed records
        #: it left in the ring (behind one still being written, or past `max_events`); 0 when
        #: it cannot tell; None when it left none (producer/probe/cpubuffers.py).
        self.untaken_min_ts: int | None = None

    def fileno(self) -> int:
        """The map's fd: readable (epoll) when a record was committed to an empty ring."""
        return self._fd

    @property
    def capacity_events(self) -> int:
        return self._size // self._record

    def take_fill_max(self) -> float:
        """The fullest (0..1) a drain found the ring since the last call."""
        fill, self._fill_max = self._fill_max, 0.0
        return fill

    def pending_bytes(self) -> int:
        return int(self._producer_pos[0]) - int(self._consumer_pos[0])

    def drain(self, max_events: int | None = None) -> npt.NDArray[np.void]:
        """Return the committed records (the reader's dtype), oldest first, and free their
        space."""
        consumer = int(self._consumer_pos[0])
        producer = int(self._producer_pos[0])
        self._fill_max = max(self._fill_max, (producer - consumer) / self._size)
        self.untaken_min_ts = None
        present = (producer - consumer) // self._record
        available = present if max_events is None else min(present, max_events)
        if available <= 0:
            return np.empty(0, dtype=self._dtype)
        start = consumer & self._mask
        span = self._data[start : start + present * self._record].view(self._record_dtype)
        lengths = span["len"][:present].copy()  # one snapshot of the headers
        busy = (lengths & _BUSY_BIT) != 0
        committed = min(int(np.argmax(busy)) if busy.any() else present, available)
        if producer - consumer != present * self._record:
            self.untaken_min_ts = 0  # a record of another size: where records lie is not known
        elif committed < present:
            self._note_untaken(span, lengths, committed)
        if committed == 0:
            return np.empty(0, dtype=self._dtype)
        head = lengths[:committed]
        if np.any((head & _LEN_MASK) != self._dtype.itemsize):
            return self._drain_walking(consumer, producer, max_events)
        keep = (head & _DISCARD_BIT) == 0
        events = span["event"][:committed]
        out = events[keep].copy() if not keep.all() else events.copy()
        self._consumer_pos[0] = consumer + committed * self._record
        return out

    def _note_untaken(self, span: npt.NDArray[np.void], lengths: npt.NDArray[np.uint32],
                      taken: int) -> None:
        """`untaken_min_ts` from the records past the first `taken` of `span` (headers as
        `lengths` read them): the committed ones' earliest time."""
        rest = lengths[taken:]
        done = (rest & _BUSY_BIT) == 0
        if np.any((rest[done] & _LEN_MASK) != self._dtype.itemsize) or \
                "ts_ns" not in (self._dtype.names or ()):
            self.untaken_min_ts = 0  # records of another size: positions unknown past them
            return
        done &= (rest & _DISCARD_BIT) == 0
        if done.any():
            left = span["event"][taken:][done]
            self.untaken_min_ts = int(left["ts_ns"].min() if "duration_ns" not in (
                self._dtype.names or ()) else (left["ts_ns"] + left["duration_ns"]).min())

    def _committed(self, consumer: int, producer: int) -> Iterator[tuple[int, int, bool, int]]:
        """Each committed record from `consumer` on, as far as `producer` or the first one
        still being written: (where its data starts, its length, whether it was discarded,
        the position after it)."""
        position = consumer
        while position < producer:
            offset = position & self._mask
            header = int(self._data[offset : offset + 4].view(np.uint32)[0])
            if header & _BUSY_BIT:
                return
            length = header & _LEN_MASK
            position += (8 + length + 7) & ~7
            yield offset + 8, length, bool(header & _DISCARD_BIT), position

    def _drain_walking(
        self, consumer: int, producer: int, max_events: int | None
    ) -> npt.NDArray[np.void]:
        """Slow path for a span holding a record of another size."""
        out: list[npt.NDArray[np.void]] = []
        end = consumer
        for start, length, discarded, after in self._committed(consumer, producer):
            if max_events is not None and len(out) >= max_events:
                break
            end = after
            if discarded:
                continue
            if length == self._dtype.itemsize:
                out.append(self._data[start : start + length].view(self._dtype).copy())
            else:
                self.foreign_records += 1
        self._consumer_pos[0] = end
        if end < producer:
            self.untaken_min_ts = 0  # what is past `end` is not known here: all of it waits
        if not out:
            return np.empty(0, dtype=self._dtype)
        return np.concatenate(out)

    def drain_bytes(self) -> list[bytes]:
        """Every committed record as bytes, whatever its size (a ring of records of many
        sizes: the HTTP capture's), oldest first, and free their space."""
        out: list[bytes] = []
        end = consumer = int(self._consumer_pos[0])
        for start, length, discarded, after in self._committed(consumer,
                                                               int(self._producer_pos[0])):
            end = after
            if not discarded:
                out.append(self._data[start : start + length].tobytes())
        self._consumer_pos[0] = end
        return out

    def close(self) -> None:
        # The numpy views keep the maps referenced; drop them first.
        del self._consumer_pos, self._producer_pos, self._data
        self._consumer_map.close()
        self._producer_map.close()
