"""Launch counts of a trace's --output, per kernel name, to hold against a ground truth.

The conformance suite (tests/system/test_conformance.py) holds them against what the simulated
driver counted; scripts/gpu-check (bench/gpu_check.py) against torch.profiler's CUPTI
kernel records on a real GPU. Both read the same JSON lines, the same way.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TracedLaunches:
    """What one process's events say about its kernel launches."""

    #: kernel_full -> launches that ran (not captured into a graph)
    launches: Counter[str] = field(default_factory=Counter)
    #: kernel_full -> launches recorded into a graph by stream capture
    captured: Counter[str] = field(default_factory=Counter)
    #: layer (runtime, driver) -> launch events
    by_layer: Counter[str] = field(default_factory=Counter)
    graph_launches: int = 0
    #: kernel nodes the graph launches ran (as the instantiate events reported them)
    graph_kernel_nodes: int = 0
    #: launch events with no name
    unnamed: int = 0
    #: the pids that launched anything
    pids: set[int] = field(default_factory=set)
    #: on_device(kernel_full, device) -> launches that ran on that device (the event's device)
    launches_on_device: Counter[str] = field(default_factory=Counter)


def on_device(name: str, device: int) -> str:
    """The key of `TracedLaunches.launches_on_device`: a kernel name on a device."""
    return f"{name} @ device {device}"


def read_events(path: Path) -> list[dict[str, Any]]:
    with path.open("rb") as f:
        return [json.loads(line) for line in f if line.strip()]


def traced_launches(
    events: Iterable[Mapping[str, Any]],
    pid: int | None = None,
    window: tuple[int, int] | None = None,
) -> TracedLaunches:
    """Launch counts of the events (of `pid` only, within `window` [lo, hi] ns, if given)."""
    out = TracedLaunches()
    for e in events:
        if pid is not None and e["pid"] != pid:
            continue
        if window is not None and not window[0] <= e["ts_ns"] <= window[1]:
            continue
        if e["type"] == "launch":
            out.pids.add(e["pid"])
            out.by_layer[e["layer"]] += 1
            name = e.get("kernel_full")
            if not name:
                out.unnamed += 1
                name = f"<unnamed {e.get('function')}>"
            if e.get("captured"):
                out.captured[name] += 1
            else:
                out.launches[name] += 1
                out.launches_on_device[on_device(name, int(e.get("device", 0)))] += 1
        elif e["type"] == "graph_launch":
            out.graph_launches += 1
            out.graph_kernel_nodes += e.get("kernel_nodes") or 0
    return out


def demangle_all(names: Iterable[str]) -> dict[str, str]:
    """Mangled name -> demangled, by binutils' c++filt (independent of the tracer's demangler);
    names that are not mangled (Triton's) map to themselves."""
    names = list(names)
    mangled = [n for n in names if n.startswith("_Z")]
    out = {n: n for n in names}
    if mangled:
        proc = subprocess.run(
            ["c++filt"], input="\n".join(mangled) + "\n", capture_output=True, text=True,
            check=True,
        )
        out.update(zip(mangled, proc.stdout.splitlines(), strict=True))
    return out


def differences(ours: Mapping[str, int], truth: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """name -> (ours, truth) where the two disagree (zeros left out of both)."""
    names = {n for n, v in ours.items() if v} | {n for n, v in truth.items() if v}
    return {n: (ours.get(n, 0), truth.get(n, 0)) for n in sorted(names)
            if ours.get(n, 0) != truth.get(n, 0)}
