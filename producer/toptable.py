"""`gpuflight top`'s table: per process, what it did with the GPU over the last interval.

An event sink (decode/sinks.py) that counts each process's events with the one counting core
(contract/counting.py) into the current interval, and requests (with the HTTP capture) with
their latencies; `snapshot()` closes the interval and turns it into rows of rates: launches/s,
blocks per launch, the top kernel, H2D and D2H GB/s, the share of the interval the CPU was
blocked on the GPU, GPU-seconds per second and USD per hour where NVML and a price say,
requests/s and their p99. Each row carries who the process is (pod and namespace, container,
job, command: producer/publish/identity.py, read once). A process with no event in an interval
keeps its row (at zero) until it is gone from /proc.

Thread-safe: the capture's thread adds, a reader (the screen, the agent's local feed) snapshots.
Memory is bounded by the processes alive and, per process, the kernels (the core's bound), the
shapes and routes kept (SHAPES_KEPT, ROUTES_KEPT) and the latencies of one interval
(LATENCIES_KEPT, a uniform sample beyond it).
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.abi import EventType
from gpuflight.producer.contract.counting import Counts

if TYPE_CHECKING:
    from gpuflight.producer.contract.pricing import PriceBook
    from gpuflight.producer.contract.wire import ProcessRecord
    from gpuflight.producer.decode.kernels import KernelNames
    from gpuflight.producer.decode.sinks import WithRecord

#: Per process and interval: the launch shapes and routes kept (the rest fold into "other").
SHAPES_KEPT: Final = 64
ROUTES_KEPT: Final = 64
#: Request latencies kept per process and interval for the p99 (a uniform sample beyond).
LATENCIES_KEPT: Final = 10_000
OTHER: Final = "other"


@dataclass(frozen=True)
class KernelRow:
    name: str
    launches_per_s: float
    share: float


@dataclass(frozen=True)
class RouteRow:
    route: str
    requests_per_s: float
    p99_ms: float | None


@dataclass(frozen=True)
class ShapeRow:
    grid: str
    block: str
    launches_per_s: float


@dataclass(frozen=True)
class ProcessRow:
    """One process over one interval (rates per second of it)."""

    pid: int
    command: str
    job: str
    pod: str  # namespace/pod, or "-"
    container: str  # the first 12 characters of its id, or "-"
    devices: tuple[int, ...]
    launches_per_s: float
    blocks_per_launch: float | None
    top_kernel: str | None
    h2d_gb_per_s: float
    d2h_gb_per_s: float
    blocked_pct: float
    gpu_s_per_s: float | None
    usd_per_h: float | None
    requests_per_s: float | None
    p99_ms: float | None
    kernels: tuple[KernelRow, ...] = ()
    shapes: tuple[ShapeRow, ...] = ()
    routes: tuple[RouteRow, ...] = ()
    #: The model of the GPU it ran on, as NVML names it (what its $/h is priced by).
    gpu: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Interval:
    counts: Counts = field(default_factory=lambda: Counts(shapes=Counter(), max_pids=None))
    requests: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    seen_requests: int = 0
    routes: Counter[str] = field(default_factory=Counter)
    route_latencies_ns: dict[str, list[int]] = field(default_factory=dict)
    gpu_ns: float = 0.0

    def add_latency(self, route: str, ns: int, rng: random.Random) -> None:
        self.seen_requests += 1
        _reservoir(self.latencies_ns, ns, self.seen_requests, rng, LATENCIES_KEPT)
        # A uniform sample per route too (its first requests alone lean to the interval's
        # start): self.routes counts the route's requests, this one included.
        _reservoir(self.route_latencies_ns.setdefault(route, []), ns, self.routes[route], rng,
                   LATENCIES_KEPT // 10)


def _reservoir(kept: list[int], value: int, seen: int, rng: random.Random, size: int) -> None:
    if len(kept) < size:
        kept.append(value)
        return
    slot = rng.randrange(seen)
    if slot < size:
        kept[slot] = value


def priced(prices: PriceBook | None, gpu_s_per_s: float | None, model: str | None
           ) -> float | None:
    """USD an hour for `gpu_s_per_s` GPU-seconds a second of a `model` GPU, where the price
    book has one."""
    if prices is None or gpu_s_per_s is None or model is None:
        return None
    per_hour = prices.per_hour(model)
    return None if per_hour is None else gpu_s_per_s * per_hour


def p99_ms(latencies_ns: Sequence[int]) -> float | None:
    """The 99th percentile (nearest rank) in ms; None without requests."""
    if not latencies_ns:
        return None
    ordered = sorted(latencies_ns)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] / 1e6


def _dim(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)


class TopTable:
    """Per-process figures of the current interval; `snapshot()` ends it (see the module)."""

    takes_attribution = False

    def __init__(self, *, kernels: KernelNames | None = None, proc_root: Path = Path("/proc"),
                 identify: Callable[[int], ProcessRecord | None] | None = None,
                 prices: PriceBook | None = None,
                 gpu_names: Callable[[], Mapping[int, str]] | None = None,
                 http: bool = False) -> None:
        self.name = "top"
        self._kernels = kernels
        self._proc_root = proc_root
        self._identify = identify or self._resolve
        self._prices = prices
        #: The NVML names of the GPUs, by index (None: no NVML: no GPU-seconds, not 0).
        self.gpu_names = gpu_names
        #: Whether requests are captured (else the request columns say "-", not 0).
        self.http = http
        self._lock = threading.Lock()
        self._current: dict[int, _Interval] = {}
        self._started = time.monotonic()
        self._who: dict[int, ProcessRecord | None] = {}
        self._devices: dict[int, set[int]] = {}
        #: pid → the GPU it ran on, by NVML index, for the price (from NVML's windows).
        self._gpus: dict[int, int] = {}
        self._rng = random.Random(0)
        #: How long the interval the last snapshot ended lasted, in seconds.
        self.last_interval_s = 0.0

    # -- the EventSink side ------------------------------------------------------------------

    def write(self, events: npt.NDArray[np.void]) -> None:
        if len(events) == 0:
            return
        pids = events["pid"]
        with self._lock:
            for pid in np.unique(pids).tolist():
                mine = events[pids == pid]
                interval = self._interval(pid)
                interval.counts.add(mine, self._names(pid, mine))
                self._devices.setdefault(pid, set()).update(np.unique(mine["device"]).tolist())

    def write_aggregates(self, aggregates: npt.NDArray[np.void]) -> None:
        if len(aggregates) == 0:
            return
        pids = aggregates["pid"]
        with self._lock:
            for pid in np.unique(pids).tolist():
                mine = aggregates[pids == pid]
                self._interval(pid).counts.add_aggregates(mine, self._names(pid, mine))

    def write_requests(self, pid: int, answered: Sequence[WithRecord],
                       unattributed: Mapping[str, float]) -> None:
        with self._lock:
            interval = self._interval(pid)
            for one in answered:
                r = one.record
                route = r.route or r.path
                interval.requests += 1
                if len(interval.routes) < ROUTES_KEPT or route in interval.routes:
                    interval.routes[route] += 1
                else:
                    route = OTHER
                    interval.routes[OTHER] += 1
                interval.add_latency(route, max(0, r.end_ns - r.start_ns), self._rng)

    def add_gpu_time(self, pid: int, gpu: int, gpu_ns: float) -> None:
        """NVML's word: the process kept `gpu` busy `gpu_ns` of this interval."""
        with self._lock:
            self._interval(pid).gpu_ns += gpu_ns
            self._gpus[pid] = gpu

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass

    # -- the rows ------------------------------------------------------------------------------

    def snapshot(self, now: float | None = None) -> list[ProcessRow]:
        """End the interval: one row per process alive or seen in it."""
        now = time.monotonic() if now is None else now
        with self._lock:
            current, self._current = self._current, {}
            seconds = max(now - self._started, 1e-9)
            self._started = now
            self.last_interval_s = seconds
            alive = {pid for pid in self._who if (self._proc_root / str(pid)).exists()}
            for pid in list(self._who):
                if pid not in alive and pid not in current:
                    self._forget(pid)
            gpu_names = self.gpu_names() if self.gpu_names is not None else {}
            rows = []
            for pid in sorted(set(current) | alive):
                if pid not in self._who:
                    self._who[pid] = self._identify(pid)
                rows.append(self._row(pid, current.get(pid) or _Interval(), seconds,
                                      gpu_names))
            return rows

    def _row(self, pid: int, interval: _Interval, seconds: float,
             gpu_names: Mapping[int, str]) -> ProcessRow:
        counts = interval.counts
        launches = counts.kernel_launches
        who = self._who.get(pid)
        kernels = sorted(counts.kernels.items(), key=lambda kv: (-kv[1], kv[0]))
        h2d, d2h = counts.copies.get("H2D"), counts.copies.get("D2H")
        gpu_s = interval.gpu_ns / 1e9 / seconds if self.gpu_names is not None else None
        model = gpu_names.get(self._gpus[pid]) if pid in self._gpus else None
        usd = priced(self._prices, gpu_s, model)
        shapes = (counts.shapes or Counter()).most_common(SHAPES_KEPT)
        return ProcessRow(
            pid=pid,
            command=(who.comm if who else None) or f"pid {pid}",
            job=who.job if who else "-",
            pod=f"{who.namespace or 'default'}/{who.pod}" if who and who.pod else "-",
            container=who.container_id[:12] if who and who.container_id else "-",
            devices=tuple(sorted(self._devices.get(pid, ()))),
            launches_per_s=launches / seconds,
            blocks_per_launch=_blocks(counts) / launches if launches else None,
            top_kernel=kernels[0][0] if kernels else None,
            h2d_gb_per_s=(h2d.bytes if h2d else 0) / 1e9 / seconds,
            d2h_gb_per_s=(d2h.bytes if d2h else 0) / 1e9 / seconds,
            blocked_pct=100.0 * counts.blocked_ns / 1e9 / seconds,
            gpu_s_per_s=gpu_s,
            usd_per_h=usd,
            gpu=model,
            requests_per_s=interval.requests / seconds if self.http else None,
            p99_ms=p99_ms(interval.latencies_ns) if self.http else None,
            kernels=tuple(KernelRow(name, n / seconds, n / launches if launches else 0.0)
                          for name, n in kernels[:20]),
            shapes=tuple(ShapeRow(_dim(g), _dim(b), n / seconds) for (g, b), n in shapes[:20]),
            routes=tuple(RouteRow(route, n / seconds,
                                  p99_ms(interval.route_latencies_ns.get(route, ())))
                         for route, n in interval.routes.most_common(20)),
        )

    # -- helpers -------------------------------------------------------------------------------

    def _interval(self, pid: int) -> _Interval:
        interval = self._current.get(pid)
        if interval is None:
            interval = self._current[pid] = _Interval()
        return interval

    def _names(self, pid: int, events: npt.NDArray[np.void]) -> dict[int, str] | None:
        if self._kernels is None:
            return None
        names: dict[int, str] = {}
        for handle in np.unique(events["handle"][events["type"] == EventType.LAUNCH]).tolist():
            name = self._kernels.name_of(pid, handle)
            if name is not None:
                names[handle] = name.short
        return names

    def _resolve(self, pid: int) -> ProcessRecord | None:
        from gpuflight.producer.publish import identity

        if not (self._proc_root / str(pid)).exists():
            return None
        return identity.resolve(self._proc_root, pid, os.uname().nodename)

    def _forget(self, pid: int) -> None:
        self._who.pop(pid, None)
        self._devices.pop(pid, None)
        self._gpus.pop(pid, None)


def _blocks(counts: Counts) -> float:
    """Σ blocks of the launches, from the exact shapes the counts keep."""
    shapes = counts.shapes or Counter()
    return float(sum(math.prod(g) * n for (g, _b), n in shapes.items()))
