"""The worker's table values, of any size, as changelog records a broker takes. Pure: no Faust,
no I/O.

A value of the worker's Faust table is one record of the table's changelog topic, and a broker
refuses a record over its message.max.bytes (1 MiB by default): a larger value was not durable
(a parked message of 6.5 MB was gone after a restart), and one over the producer's
max.request.size stopped the worker (Faust's ProducerSendError). So the worker keeps its job
states and parked messages through a `Store`:

- a value of at most `max_record_bytes` is one record: itself, under its key (as before);
- a larger one is compressed (zlib) and cut into parts of at most `max_record_bytes`, each under
  a key of its own (PART_PREFIX, the partition, the parts' digest, the part's index, the
  value's key), written first; then the value's key gets a head naming them (HEAD_PREFIX, then
  JSON). The parts of the value it replaces go once the head is written, so a worker stopped
  at any point recovers either value whole. One stopped between the two leaves parts no head
  names: `sweep` deletes a partition's.

Faust sends a table change to the changelog partition of the message being handled, so every
value is written and deleted while handling a message of the value's own partition.
"""

from __future__ import annotations

import hashlib
import logging
import zlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Final

import orjson

log = logging.getLogger(__name__)

#: The largest record written: under the broker's default message.max.bytes (1 MiB), with room
#: for the key and the record's overhead.
MAX_RECORD_BYTES: Final = 900_000
#: Keys of parts start with this (job states' keys start with their host, parked messages'
#: with "\x00parked\x00").
PART_PREFIX: Final = b"\x00part\x00"
#: A value in parts: its key holds this, then the head's JSON (values are JSON, or a parked
#: message's JSON line: they start with "{").
HEAD_PREFIX: Final = b"\x00parts\x00"


@dataclass(frozen=True)
class Head:
    """Where a value in parts is: its partition, the digest and number of its parts, and its
    size (uncompressed)."""

    partition: int
    digest: str
    parts: int
    size: int

    def part_key(self, key: bytes, index: int) -> bytes:
        return PART_PREFIX + f"{self.partition}\x00{self.digest}\x00{index}\x00".encode() + key

    def part_keys(self, key: bytes) -> list[bytes]:
        return [self.part_key(key, i) for i in range(self.parts)]

    def to_bytes(self) -> bytes:
        return HEAD_PREFIX + orjson.dumps({"partition": self.partition, "digest": self.digest,
                                           "parts": self.parts, "size": self.size})

    @classmethod
    def from_bytes(cls, value: bytes) -> Head:
        """ValueError when `value` is not a head."""
        try:
            data = orjson.loads(value[len(HEAD_PREFIX):])
            return cls(int(data["partition"]), str(data["digest"]), int(data["parts"]),
                       int(data["size"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed head of a value in parts: {exc!r}") from None


def is_part_key(key: bytes) -> bool:
    return key.startswith(PART_PREFIX)


def partition_of_part(key: bytes) -> int | None:
    """The partition a part's key names (None: not a part's key)."""
    if not is_part_key(key):
        return None
    number, _, _ = key[len(PART_PREFIX):].partition(b"\x00")
    try:
        return int(number)
    except ValueError:
        return None


class Store:
    """Values of any size in `table` (a Faust table of bytes, or any mapping of bytes)."""

    def __init__(self, table: MutableMapping[bytes, bytes],
                 max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        if max_record_bytes < 1:
            raise ValueError("a record holds at least one byte")
        self.table = table
        self.max_record_bytes = max_record_bytes

    def get(self, key: bytes) -> bytes | None:
        """The value under `key` (None: none); ValueError when its parts are not all there."""
        raw = self.table.get(key)
        if raw is None or not raw.startswith(HEAD_PREFIX):
            return raw
        return self._assemble(key, Head.from_bytes(raw))

    def put(self, key: bytes, value: bytes, partition: int) -> None:
        """`value` under `key`, of `partition` (that of the message being handled)."""
        old = self._head(key)
        new: Head | None = None
        if len(value) <= self.max_record_bytes:
            self.table[key] = value
        else:
            packed = zlib.compress(value, 1)
            size = self.max_record_bytes
            new = Head(partition, hashlib.blake2b(packed, digest_size=8).hexdigest(),
                       -(-len(packed) // size), len(value))
            if new == old:
                return  # the same value, whole already
            for i, part_key in enumerate(new.part_keys(key)):
                self.table[part_key] = packed[i * size:(i + 1) * size]
            self.table[key] = new.to_bytes()
            log.debug("stored %d bytes under %r in %d parts", len(value), key, new.parts)
        if old is not None and old != new:
            self._drop(old.part_keys(key))

    def delete(self, key: bytes) -> None:
        old = self._head(key)
        if key in self.table:
            del self.table[key]
        if old is not None:
            self._drop(old.part_keys(key))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value), values in parts put together; a value whose parts are not all
        there is logged and left out."""
        for key, raw in list(self.table.items()):
            if is_part_key(key):
                continue
            value = raw
            if raw.startswith(HEAD_PREFIX):
                try:
                    value = self._assemble(key, Head.from_bytes(raw))
                except ValueError as exc:
                    log.error("cannot read the value of %r: %s", key, exc)
                    continue
            yield key, value

    def sweep(self, partition: int) -> int:
        """Delete the parts of `partition` that no head names (a worker stopped while writing
        a value in parts); how many."""
        named: set[bytes] = set()
        orphans: list[bytes] = []
        for key, raw in list(self.table.items()):
            if is_part_key(key):
                if partition_of_part(key) == partition:
                    orphans.append(key)
            elif raw.startswith(HEAD_PREFIX):
                try:
                    named.update(Head.from_bytes(raw).part_keys(key))
                except ValueError:
                    continue
        gone = [k for k in orphans if k not in named]
        self._drop(gone)
        if gone:
            log.warning("deleted %d parts of values no longer stored (a worker stopped while"
                        " writing them)", len(gone))
        return len(gone)

    def _head(self, key: bytes) -> Head | None:
        raw = self.table.get(key)
        if raw is None or not raw.startswith(HEAD_PREFIX):
            return None
        try:
            return Head.from_bytes(raw)
        except ValueError:
            return None

    def _assemble(self, key: bytes, head: Head) -> bytes:
        parts = [self.table.get(k) for k in head.part_keys(key)]
        missing = [i for i, part in enumerate(parts) if part is None]
        if missing:
            raise ValueError(f"{len(missing)} of its {head.parts} parts are missing")
        packed = b"".join(p for p in parts if p is not None)
        if hashlib.blake2b(packed, digest_size=8).hexdigest() != head.digest:
            raise ValueError("its parts do not match their digest")
        try:
            value = zlib.decompress(packed)
        except zlib.error as exc:
            raise ValueError(f"its parts do not decompress: {exc}") from None
        if len(value) != head.size:
            raise ValueError(f"{len(value)} bytes, not {head.size}")
        return value

    def _drop(self, keys: list[bytes]) -> None:
        for key in keys:
            if key in self.table:
                del self.table[key]
