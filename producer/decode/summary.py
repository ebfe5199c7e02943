"""The `perf stat`-like summary of a trace: a view of the counting core
(producer/contract/counting.py,
the same counts as the stream windows), added batch by batch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.abi import COPY_KINDS
from gpuflight.producer.contract.counting import CopyStats, Counts, Shape


@dataclass(frozen=True)
class ProbedFile:
    """A library file the trace attached probes to (once per file, however many processes
    mapped it): its path, its kind (runtime, driver, loader; autograd, exit with code paths),
    its number of probes, and how many of its functions are probed at an instruction the
    kernel single-steps."""

    path: str
    kind: str
    probes: int
    stepped: int = 0


#: What a single-stepped probe hit costs the traced process, on the VMs we measured (Linux
#: 6.18; bench/emulation.py): an emulated one costs ~0.4 us.
STEP_COST_S = 15e-6


def _trace_counts() -> Counts:
    # A trace keeps every pid and the exact launch shapes (for the top-shapes table).
    return Counts(shapes=Counter(), max_pids=None)


@dataclass
class Summary:
    """Everything the trace summary prints: a view of the counting core's `Counts` (the same
    rule as the stream windows); `add` takes one batch of enriched events."""

    counts: Counts = field(default_factory=_trace_counts)

    #: Events the kernel counted under overload instead of recording them (in `counts`
    #: all the same, through their aggregates).
    aggregated: int = 0

    def add(self, ev: npt.NDArray[np.void]) -> None:
        self.counts.add(ev)

    def add_aggregates(self, aggregates: npt.NDArray[np.void]) -> None:
        """Events the kernel counted instead of recording (records.AGGREGATE_DTYPE)."""
        self.counts.add_aggregates(aggregates)
        self.aggregated += int(aggregates["count"].sum())

    # -- views ---------------------------------------------------------------------------------

    @property
    def events(self) -> int:
        return self.counts.events

    @property
    def launches(self) -> int:
        """Kernel launches that ran (not those captured into graphs)."""
        return self.counts.kernel_launches

    @property
    def launches_by_api(self) -> dict[str, int]:
        return self.counts.launches_by_api()

    @property
    def captured_launches(self) -> int:
        return self.counts.captured

    @property
    def graph_launches(self) -> int:
        return self.counts.graph_launches

    @property
    def graph_kernels(self) -> int:
        """Kernel nodes the graph launches ran, where their exec was instantiated while traced."""
        return self.counts.graph_kernels

    @property
    def kernels_run(self) -> int:
        return self.counts.kernels_run

    @property
    def shapes(self) -> Counter[Shape]:
        return self.counts.shapes if self.counts.shapes is not None else Counter()

    @property
    def blocks_total(self) -> int:
        return sum(g[0] * g[1] * g[2] * n for (g, _b), n in self.shapes.items())

    @property
    def threads_total(self) -> int:
        return self.counts.threads_launched

    @property
    def copies(self) -> dict[str, CopyStats]:
        return self.counts.copies

    @property
    def memset_count(self) -> int:
        return self.counts.memset_count

    @property
    def memset_bytes(self) -> int:
        return self.counts.memset_bytes

    @property
    def alloc_count(self) -> int:
        return self.counts.alloc_count

    @property
    def alloc_bytes(self) -> int:
        return self.counts.alloc_bytes

    @property
    def free_count(self) -> int:
        return self.counts.free_count

    @property
    def live_bytes(self) -> int:
        """Allocated and not freed (known frees) since the trace began."""
        return self.counts.memory_net_bytes

    @property
    def peak_live_bytes(self) -> int:
        return self.counts.memory_peak_rise_bytes

    @property
    def sync_count(self) -> dict[str, int]:
        return self.counts.sync_count

    @property
    def sync_ns(self) -> dict[str, int]:
        return self.counts.sync_ns

    @property
    def failed_calls(self) -> int:
        return self.counts.failed_calls

    @property
    def pids(self) -> set[int]:
        return self.counts.pids

    def blocked_share(self, wall_s: float) -> float:
        """CPU blocked on the GPU (in syncs and synchronous copies) over the wall time of the
        traced command: summed over its threads, so it can pass 1 when several wait at once."""
        return self.counts.blocked_ns / 1e9 / wall_s if wall_s else 0.0

    def as_dict(self, wall_s: float) -> dict[str, Any]:
        """The summary as data (the demo compares two of these)."""
        c = self.counts
        return {
            "wall_s": wall_s,
            "launches": self.launches,
            "launch_rate": self.launches / wall_s if wall_s else 0.0,
            "captured_launches": c.captured,
            "graph_launches": c.graph_launches,
            "graph_kernels": c.graph_kernels,
            "mean_grid_blocks": self.blocks_total / self.launches if self.launches else 0.0,
            "threads_launched": c.threads_launched,
            "copies": sum(s.count for s in c.copies.values()),
            "copy_bytes": sum(s.bytes for s in c.copies.values()),
            "sync_s": c.total_sync_ns / 1e9,
            "copy_sync_s": c.copy_sync_ns / 1e9,
            "blocked_s": c.blocked_ns / 1e9,
            "blocked_share": self.blocked_share(wall_s),
            "failed_calls": c.failed_calls,
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


def _seconds(value: float) -> str:
    for factor, unit in ((1.0, "s"), (1e-3, "ms")):
        if value >= factor:
            return f"{value / factor:.1f} {unit}"
    return f"{value * 1e6:.0f} us"


def _dim(d: tuple[int, int, int]) -> str:
    return "({},{},{})".format(*d)


def _table(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> list[str]:
    """`rows` under `headers`, indented, columns two spaces apart: a column of counts
    right-aligned, any other left. Made here rather than by tabulate, whose import (it asks
    importlib.metadata for its own version) cost ~13 ms of the moment between the command's
    end and `trace`'s, for tables of a few short rows."""
    columns = list(zip(headers, *rows, strict=True))
    widths = [max(map(len, column)) for column in columns]
    counts = [bool(rows) and all(_is_count(cell) for cell in column[1:]) for column in columns]

    def line(cells: Sequence[str]) -> str:
        return "    " + "  ".join(
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(cells, widths, counts, strict=True)).rstrip()

    return [line(headers), *map(line, rows)]


def _is_count(cell: str) -> bool:
    """A whole number as the summary writes one ("12,345")."""
    digits = cell.replace(",", "")
    return digits.isdigit() and digits.isascii()


def render(summary: Summary, title: str, wall_s: float, drops: int, top: int = 5, *,
           probed: Sequence[ProbedFile] = (), stepped_calls: int | None = None) -> str:
    """Human summary, in the spirit of `perf stat`; its words are the counting core's terms,
    as `gpuflight report` uses them (docs/commands.md, "What is counted"). `probed`: the library
    files the trace attached to, listed once each with their probe counts (and how many of their
    functions are single-stepped); `stepped_calls`: the calls that hit one of those (None:
    not counted, a kernel without attach cookies)."""
    c = summary.counts
    lines = [f" gpuflight trace of '{title}' ({wall_s:.3f} s, {len(summary.pids)} process(es),"
             f" {summary.events:,} events):", ""]
    rate = summary.launches / wall_s if wall_s else 0.0
    lines.append(f"  {summary.launches:>14,}  kernel launches   # {_si(rate, '/s')}")
    for api, n in summary.launches_by_api.items():
        lines.append(f"  {n:>14,}    {api}")
    if len(c.device_launches) > 1:
        for device, n in sorted(c.device_launches.items()):
            lines.append(f"  {n:>14,}    on device {device}")
    if summary.launches:
        threads_rate = summary.threads_total / wall_s if wall_s else 0.0
        lines.append(f"  {summary.blocks_total / summary.launches:>14,.1f}  blocks per launch"
                     f" (mean)   # {_si(threads_rate, 'threads/s')}")
    if summary.captured_launches:
        lines.append(f"  {summary.captured_launches:>14,}  captured into graphs"
                     "   # launches recorded as graph nodes, not run")
    if summary.graph_launches:
        lines.append(f"  {summary.graph_launches:>14,}  graph launches")
        for api, n in c.launches_by_api(graphs=True).items():
            lines.append(f"  {n:>14,}    {api}")
        if summary.graph_kernels:
            lines.append(f"  {summary.graph_kernels:>14,}  graph kernel nodes run"
                         "   # of the execs instantiated while traced")
        else:
            lines.append(f"  {'-':>14}  graph kernel nodes run"
                         "   # not known: the execs were instantiated before the trace")
    if summary.shapes:
        rows = [
            [_dim(g), _dim(b), f"{n:,}", f"{100 * n / summary.launches:.1f}%"]
            for (g, b), n in summary.shapes.most_common(top)
        ]
        lines += ["", "  top launch shapes:"]
        lines += _table(rows, ["grid", "block", "launches", "share"])
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
        lines += _table(rows, ["dir", "calls", "bytes", "sync bandwidth", "sync time"])
    if len(c.devices) > 1:
        rows = []
        for device in c.devices:
            by_kind = c.device_copy_stats(device)
            rows.append([str(device), f"{c.device_launches.get(device, 0):,}",
                         f"{sum(s.count for s in by_kind.values()):,}",
                         *(_bytes(by_kind[k].bytes) if k in by_kind else "-"
                           for k in ("H2D", "D2H", "D2D")),
                         f"{c.device_blocked_ns(device) / 1e6:.3f} ms"])
        lines += ["", "  per device (the calling thread's):"]
        lines += _table(rows, ["device", "kernel launches", "copies", "H2D", "D2H", "D2D",
                               "CPU blocked"])
    if summary.memset_count:
        lines.append(f"  memsets: {summary.memset_count:,} calls, {_bytes(summary.memset_bytes)}")
    lines += ["", f"  allocations: {summary.alloc_count:,} ({_bytes(summary.alloc_bytes)}),"
                  f" frees: {summary.free_count:,}, peak live: {_bytes(summary.peak_live_bytes)}"]
    if c.sync_count or c.copy_sync_ns:
        share = 100 * summary.blocked_share(wall_s)
        lines.append(f"  CPU blocked on the GPU: {c.blocked_ns / 1e6:.3f} ms ({share:.1f}% of"
                     f" wall) — in syncs {c.total_sync_ns / 1e6:.3f} ms, in synchronous"
                     f" copies {c.copy_sync_ns / 1e6:.3f} ms")
    if summary.sync_count:
        parts = ", ".join(
            f"{scope} {summary.sync_count[scope]:,} ({summary.sync_ns[scope] / 1e6:.3f} ms)"
            for scope in sorted(summary.sync_count)
        )
        lines.append(f"    syncs: {parts}")
    if summary.failed_calls:
        worst = sorted(c.errors.items(), key=lambda kv: (-kv[1], kv[0]))
        apis = ", ".join(f"{api} {n:,}" for api, n in worst[:top])
        more = f", {len(worst) - top} more apis" if len(worst) > top else ""
        lines.append(f"  failed calls: {summary.failed_calls:,} ({apis}{more})"
                     "   # non-zero cudaError_t/CUresult")
    if probed:
        total = sum(p.probes for p in probed)
        lines += ["", f"  probed library files: {len(probed):,} ({total:,} probes)"]
        order = {"runtime": 0, "driver": 1, "loader": 2}
        for p in sorted(probed, key=lambda p: (order.get(p.kind, 3), p.path)):
            note = f"   # {p.stepped:,} function(s) single-stepped" if p.stepped else ""
            lines.append(f"  {p.probes:>14,}  {p.kind:<8} {p.path}{note}")
        if any(p.stepped for p in probed):
            if stepped_calls is None:
                lines.append("  single-stepped calls: not counted (a kernel without attach"
                             " cookies, before Linux 5.15)")
            else:
                lines.append(f"  single-stepped calls: {stepped_calls:,}   # ~"
                             f"{_seconds(stepped_calls * STEP_COST_S)} of the command's time at"
                             " ~15 us each: their probes are on instructions the kernel"
                             " cannot emulate")
    lines.append(f"  events dropped: {drops:,}")
    if summary.aggregated:
        lines.append(f"  events counted in the kernel: {summary.aggregated:,}"
                     "   # the ring was under pressure: counted in every figure above,"
                     " their details not recorded")
    return "\n".join(lines)
