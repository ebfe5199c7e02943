"""The `perf stat`-like summary of a trace, aggregated batch by batch with numpy."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from tabulate import tabulate

from producer.counting import CopyStats
from producer.records import (
    ALLOC_KINDS,
    API_NAMES,
    COPY_KINDS,
    F_ASYNC,
    F_BYTES_KNOWN,
    F_CAPTURED,
    F_HAS_RESULT,
    GRAPH_KERNEL_NODES,
    SYNC_SCOPES,
    EventType,
)

Shape = tuple[tuple[int, int, int], tuple[int, int, int]]


@dataclass
class Summary:
    """Everything the trace summary prints; `add` takes one batch of enriched events."""

    events: int = 0
    launches_by_api: Counter[str] = field(default_factory=Counter)
    shapes: Counter[Shape] = field(default_factory=Counter)
    blocks_total: int = 0
    threads_total: int = 0
    copies: dict[str, CopyStats] = field(default_factory=dict)
    memset_count: int = 0
    memset_bytes: int = 0
    alloc_count: int = 0
    alloc_bytes: int = 0
    alloc_by_kind: Counter[str] = field(default_factory=Counter)
    free_count: int = 0
    live_bytes: int = 0
    peak_live_bytes: int = 0
    sync_count: Counter[str] = field(default_factory=Counter)
    sync_ns: Counter[str] = field(default_factory=Counter)
    graph_launches: int = 0
    #: Kernel nodes of the graph launches whose exec was instantiated while observed.
    graph_kernels: int = 0
    #: Launches recorded into a graph being captured (F_CAPTURED): they ran nothing.
    captured_launches: int = 0
    failed_calls: int = 0
    first_ts_ns: int | None = None
    last_ts_ns: int | None = None
    pids: set[int] = field(default_factory=set)

    def add(self, ev: npt.NDArray[np.void]) -> None:
        if len(ev) == 0:
            return
        self.events += len(ev)
        ts = ev["ts_ns"]
        lo, hi = int(ts.min()), int(ts.max())
        self.first_ts_ns = lo if self.first_ts_ns is None else min(self.first_ts_ns, lo)
        self.last_ts_ns = hi if self.last_ts_ns is None else max(self.last_ts_ns, hi)
        self.pids.update(np.unique(ev["pid"]).tolist())
        types = ev["type"]
        has_result = (ev["flags"] & F_HAS_RESULT) != 0
        self.failed_calls += int(np.count_nonzero(has_result & (ev["result"] != 0)))
        self._add_launches(ev[types == EventType.LAUNCH])
        self._add_copies(ev[types == EventType.MEMCPY])
        memsets = ev[types == EventType.MEMSET]
        self.memset_count += len(memsets)
        self.memset_bytes += int(memsets["bytes"].sum())
        self._add_memory(ev[(types == EventType.ALLOC) | (types == EventType.FREE)])
        self._add_syncs(ev[types == EventType.SYNC])
        graphs = ev[types == EventType.GRAPH_LAUNCH]
        self.graph_launches += len(graphs)
        self.graph_kernels += int(graphs["dim"][:, GRAPH_KERNEL_NODES].astype(np.int64).sum())

    def _add_launches(self, launches: npt.NDArray[np.void]) -> None:
        if len(launches) == 0:
            return
        self.captured_launches += int(np.count_nonzero(launches["flags"] & F_CAPTURED))
        apis, counts = np.unique(launches["api"], return_counts=True)
        for api, n in zip(apis.tolist(), counts.tolist(), strict=True):
            self.launches_by_api[API_NAMES.get(api, str(api))] += n
        dims = launches["dim"].astype(np.int64)
        blocks = dims[:, 0] * dims[:, 1] * dims[:, 2]
        threads = dims[:, 3] * dims[:, 4] * dims[:, 5]
        self.blocks_total += int(blocks.sum())
        self.threads_total += int((blocks * threads).sum())
        shapes, counts = np.unique(dims, axis=0, return_counts=True)
        for row, n in zip(shapes.tolist(), counts.tolist(), strict=True):
            self.shapes[((row[0], row[1], row[2]), (row[3], row[4], row[5]))] += n

    def _add_copies(self, copies: npt.NDArray[np.void]) -> None:
        if len(copies) == 0:
            return
        kinds = copies["dim"][:, 0]
        sync = (copies["flags"] & F_ASYNC) == 0
        done = (copies["flags"] & F_HAS_RESULT) != 0
        for kind in np.unique(kinds).tolist():
            name = COPY_KINDS[kind] if kind < len(COPY_KINDS) else f"unknown_{kind}"
            stats = self.copies.setdefault(name, CopyStats())
            mine = kinds == kind
            stats.count += int(np.count_nonzero(mine))
            stats.bytes += int(copies["bytes"][mine].sum())
            timed = mine & sync & done & (copies["result"] == 0)
            stats.sync_count += int(np.count_nonzero(timed))
            stats.sync_bytes += int(copies["bytes"][timed].sum())
            stats.sync_ns += int(copies["duration_ns"][timed].sum())

    def _add_memory(self, events: npt.NDArray[np.void]) -> None:
        # Rare events; order matters for the peak, so walk them one by one.
        for e in events[np.argsort(events["ts_ns"], kind="stable")].tolist():
            _ts, _pid, _tid, _api, etype, flags, result, _d, _handle, _s, nbytes, dim = e
            ok = bool(flags & F_HAS_RESULT) and result == 0
            if etype == EventType.ALLOC:
                self.alloc_count += 1
                if ok:
                    self.alloc_bytes += nbytes
                    self.alloc_by_kind[ALLOC_KINDS.get(dim[0], "unknown")] += nbytes
                    self.live_bytes += nbytes
                    self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
            else:
                self.free_count += 1
                if ok and flags & F_BYTES_KNOWN:  # the enricher knew its allocation
                    self.live_bytes -= nbytes

    def _add_syncs(self, syncs: npt.NDArray[np.void]) -> None:
        for scope in np.unique(syncs["dim"][:, 0]).tolist():
            mine = syncs["dim"][:, 0] == scope
            name = SYNC_SCOPES.get(scope, "unknown")
            self.sync_count[name] += int(np.count_nonzero(mine))
            self.sync_ns[name] += int(syncs["duration_ns"][mine].sum())

    # -- views -------------------------------------------------------------

    @property
    def launches(self) -> int:
        return sum(self.launches_by_api.values())

    def copy_blocked_ns(self) -> int:
        return sum(s.sync_ns for s in self.copies.values())

    def as_dict(self, wall_s: float) -> dict[str, Any]:
        """The summary as data (the demo compares two of these)."""
        return {
            "wall_s": wall_s,
            "launches": self.launches,
            "launch_rate": self.launches / wall_s if wall_s else 0.0,
            "mean_grid_blocks": self.blocks_total / self.launches if self.launches else 0.0,
            "threads_launched": self.threads_total,
            "copies": sum(s.count for s in self.copies.values()),
            "copy_bytes": sum(s.bytes for s in self.copies.values()),
            "sync_s": sum(self.sync_ns.values()) / 1e9,
            "blocked_share": (
                (sum(self.sync_ns.values()) + self.copy_blocked_ns()) / 1e9 / wall_s
                if wall_s
                else 0.0
            ),
            "peak_live_bytes": self.peak_live_bytes,
        }


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}" if unit else f"{value:.0f}"


def _bytes(value: float) -> str:
    for factor, prefix in ((1 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}B"
    return f"{value:.0f} B"


def _dim(d: tuple[int, int, int]) -> str:
    return "({},{},{})".format(*d)


def render(summary: Summary, title: str, wall_s: float, drops: int, top: int = 5) -> str:
    """Human summary, in the spirit of `perf stat`."""
    lines = [f" gpuflight trace of '{title}' ({wall_s:.3f} s, {len(summary.pids)} process(es),"
             f" {summary.events:,} events):", ""]
    rate = summary.launches / wall_s if wall_s else 0.0
    lines.append(f"  {summary.launches:>14,}  kernel launches   # {_si(rate, '/s')}")
    for api, n in summary.launches_by_api.most_common():
        lines.append(f"  {n:>14,}    {api}")
    if summary.launches:
        threads_rate = summary.threads_total / wall_s if wall_s else 0.0
        lines.append(f"  {summary.blocks_total / summary.launches:>14,.1f}  blocks per launch"
                     f" (mean)   # {_si(threads_rate, 'threads/s')}")
    if summary.captured_launches:
        lines.append(f"  {summary.captured_launches:>14,}    of them captured into graphs"
                     " (recorded, not run)")
    if summary.graph_launches:
        kernels = (f"   # {summary.graph_kernels:,} kernels in graphs instantiated while traced"
                   if summary.graph_kernels else "")
        lines.append(f"  {summary.graph_launches:>14,}  graph launches{kernels}")
    if summary.shapes:
        rows = [
            [_dim(g), _dim(b), f"{n:,}", f"{100 * n / summary.launches:.1f}%"]
            for (g, b), n in summary.shapes.most_common(top)
        ]
        lines += ["", "  top launch shapes:"]
        lines += ["    " + r for r in tabulate(rows, headers=["grid", "block", "launches", "share"],
                                              tablefmt="plain").splitlines()]
    if summary.copies:
        rows = []
        for kind in (*COPY_KINDS, *sorted(set(summary.copies) - set(COPY_KINDS))):
            s = summary.copies.get(kind)
            if s is None:
                continue
            bw = s.sync_bandwidth
            rows.append([kind, f"{s.count:,}", _bytes(s.bytes),
                         _si(bw, "B/s") if bw is not None else "-",
                         f"{s.sync_ns / 1e6:.3f} ms"])
        lines += ["", "  copies:"]
        lines += ["    " + r for r in tabulate(
            rows, headers=["dir", "calls", "bytes", "sync bandwidth", "sync time"],
            tablefmt="plain").splitlines()]
    if summary.memset_count:
        lines.append(f"  memsets: {summary.memset_count:,} calls, {_bytes(summary.memset_bytes)}")
    lines += ["", f"  allocations: {summary.alloc_count:,} ({_bytes(summary.alloc_bytes)}),"
                  f" frees: {summary.free_count:,}, peak live: {_bytes(summary.peak_live_bytes)}"]
    if summary.sync_count:
        blocked = sum(summary.sync_ns.values()) / 1e9
        share = 100 * blocked / wall_s if wall_s else 0.0
        parts = ", ".join(
            f"{scope} {summary.sync_count[scope]:,} ({summary.sync_ns[scope] / 1e6:.3f} ms)"
            for scope in sorted(summary.sync_count)
        )
        lines.append(
            f"  CPU blocked in syncs: {blocked * 1e3:.3f} ms ({share:.1f}% of wall) — {parts}"
        )
    if summary.failed_calls:
        lines.append(f"  failed calls (non-zero cudaError_t): {summary.failed_calls:,}")
    lines.append(f"  events dropped: {drops:,}")
    return "\n".join(lines)
