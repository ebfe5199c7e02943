"""The one counting core: what the trace summary and the stream windows count, and how
(a contract module: streams imports it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CopyStats:
    count: int = 0
    bytes: int = 0
    sync_count: int = 0
    sync_bytes: int = 0
    sync_ns: int = 0

    @property
    def sync_bandwidth(self) -> float | None:
        """Achieved bandwidth of synchronous copies, bytes per second."""
        return self.sync_bytes * 1e9 / self.sync_ns if self.sync_ns else None

    def add(self, other: CopyStats) -> None:
        self.count += other.count
        self.bytes += other.bytes
        self.sync_count += other.sync_count
        self.sync_bytes += other.sync_bytes
        self.sync_ns += other.sync_ns

    def as_list(self) -> list[int]:
        return [self.count, self.bytes, self.sync_count, self.sync_bytes, self.sync_ns]
