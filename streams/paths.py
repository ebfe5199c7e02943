"""Code paths in a window of a job: what the sampled calls of each path cost (events.v1
"paths", `gpuflight producer --stack-sampling N`), folded to the path's user function. Pure:
no Faust, no I/O.

A path's **user function** (producer/contract/userfunction.py) is its innermost Python frame
outside site-packages and Python's own library, "function (dir/file.py)": the function the
user wrote that led to the call, whatever library code it went through.

A window keeps at most MAX_FUNCTIONS functions (more: "[other]"), and writes the
TOP_FUNCTIONS costliest by GPU time (then calls) as points of `code_paths`, the rest summed as
"[other]", so the series stay bounded whatever the code.

A path made for requests names their route (events.v1 paths' "route"): per (route, user
function) likewise, in `route_code_paths`: at most MAX_ROUTES routes a window (more:
"[other]"), MAX_FUNCTIONS functions a route, and the TOP_ROUTE_FUNCTIONS costliest of each
route written, the rest as "[other]".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpuflight.producer.contract.userfunction import user_function
from gpuflight.producer.contract.wire import PATH_VALUES, PathRecord
from gpuflight.streams import measurements as m
from gpuflight.streams.measurements import Fields, FieldValue, Point, Tags
from gpuflight.streams.requests import usd

#: Functions a window keeps apart, and writes.
MAX_FUNCTIONS: Final = 1000
TOP_FUNCTIONS: Final = 10
#: Routes a window keeps apart, and the functions written per route.
MAX_ROUTES: Final = 100
TOP_ROUTE_FUNCTIONS: Final = 5
OTHER: Final = "[other]"
_FIELD_OF: Final = {"launches": Fields.LAUNCHES, "gpu_ns": Fields.GPU_NS,
                    "bytes": Fields.BYTES, "blocked_ns": Fields.BLOCKED_NS,
                    "calls": Fields.CALLS}
_GPU: Final = PATH_VALUES.index("gpu_ns")
_CALLS: Final = PATH_VALUES.index("calls")


@dataclass
class PathWindow:
    """A window's code paths: per user function, PATH_VALUES summed, and per (route, user
    function) for the paths made for requests; and the functions (route, function) its points
    named so far (a window is written again while late events come: one that left the top
    since is written as zeros, so that its earlier point does not count twice)."""

    functions: dict[str, list[float]] = field(default_factory=dict)
    shown: set[str] = field(default_factory=set)
    routes: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    shown_routes: set[tuple[str, str]] = field(default_factory=set)

    def add(self, path: PathRecord) -> None:
        function = user_function(path.frames)
        _add_to(self.functions, function, path)
        if path.route is None:
            return
        route = path.route
        if route not in self.routes and len(self.routes) >= MAX_ROUTES:
            route = OTHER
        _add_to(self.routes.setdefault(route, {}), function, path)

    def to_dict(self) -> dict[str, Any]:
        """By value name: a state keeps its meaning if PATH_VALUES grows."""
        return {"functions": _sums_dict(self.functions), "shown": sorted(self.shown),
                "routes": {r: _sums_dict(f) for r, f in self.routes.items()},
                "shown_routes": sorted([r, f] for r, f in self.shown_routes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PathWindow:
        return cls(_sums_of(data.get("functions", {})),
                   {str(k) for k in data.get("shown", ())},
                   {str(r): _sums_of(f) for r, f in data.get("routes", {}).items()},
                   {(str(r), str(f)) for r, f in data.get("shown_routes", ())})


def _add_to(functions: dict[str, list[float]], function: str, path: PathRecord) -> None:
    if function not in functions and len(functions) >= MAX_FUNCTIONS:
        function = OTHER
    sums = functions.setdefault(function, [0.0] * len(PATH_VALUES))
    for i, name in enumerate(PATH_VALUES):
        sums[i] += float(path.values.get(name, 0.0))


def _sums_dict(functions: Mapping[str, list[float]]) -> dict[str, dict[str, float]]:
    return {k: dict(zip(PATH_VALUES, v, strict=True)) for k, v in functions.items()}


def _sums_of(data: Mapping[str, Mapping[str, float]]) -> dict[str, list[float]]:
    return {str(k): [float(values.get(name, 0.0)) for name in PATH_VALUES]
            for k, values in data.items()}


def add_paths(paths: Iterable[PathRecord], window_ns: int,
              window_of: Callable[[int], PathWindow | None]) -> int:
    """Each path to the window of its time; how many found no window (closed, or beyond what
    the job holds): not counted."""
    late = 0
    for path in paths:
        window = window_of(path.ts_ns - path.ts_ns % window_ns)
        if window is None:
            late += 1
        else:
            window.add(path)
    return late


def to_points(win: PathWindow, window_start_ns: int, *, tags: Mapping[str, str],
              window_s: float, usd_per_gpu_hour: float | None) -> list[Point]:
    """The window's `code_paths` points: the TOP_FUNCTIONS costliest functions (GPU time, then
    calls) and "[other]" for the rest, and zeros for those an earlier write named that are
    not among them now (noted in `win.shown`); and its `route_code_paths` points likewise,
    per route (TOP_ROUTE_FUNCTIONS each). `tags`: host, job, namespace and team."""
    points = []
    shown = win.shown
    for function, sums in _top(win.functions, TOP_FUNCTIONS, shown):
        points.append(Point(m.CODE_PATHS.name, {**tags, Tags.FUNCTION: function},
                            _fields(sums, window_s, usd_per_gpu_hour), window_start_ns))
    win.shown = shown
    for route in sorted({*win.routes, *(r for r, _ in win.shown_routes)}):
        was = {f for r, f in win.shown_routes if r == route}
        for function, sums in _top(win.routes.get(route, {}), TOP_ROUTE_FUNCTIONS, was):
            points.append(Point(m.ROUTE_CODE_PATHS.name,
                                {**tags, Tags.ROUTE: route, Tags.FUNCTION: function},
                                _fields(sums, window_s, usd_per_gpu_hour), window_start_ns))
        win.shown_routes |= {(route, f) for f in was}
    return points


def _top(functions: Mapping[str, list[float]], top: int,
         shown: set[str]) -> list[tuple[str, list[float]]]:
    """The `top` costliest functions (GPU time, then calls), "[other]" for the rest, and zeros
    for those of `shown` (named by an earlier write) not among them now; `shown` gains those
    named."""
    ranked = sorted(functions.items(), key=lambda kv: (-kv[1][_GPU], -kv[1][_CALLS], kv[0]))
    kept = [(k, v) for k, v in ranked[:top] if k != OTHER]
    rest = [v for k, v in ranked if k == OTHER or (k, v) not in kept]
    if rest:
        kept.append((OTHER, [sum(column) for column in zip(*rest, strict=True)]))
    names = {function for function, _ in kept}
    # Named by an earlier write of this window, out of the top now: zeros over that point.
    kept += [(function, [0.0] * len(PATH_VALUES)) for function in sorted(shown - names)]
    shown |= names
    return kept


def _fields(sums: list[float], window_s: float,
            usd_per_gpu_hour: float | None) -> dict[str, FieldValue]:
    cost = usd(sums[_GPU], usd_per_gpu_hour)
    fields: dict[str, FieldValue] = {_FIELD_OF[name]: sums[i]
                                     for i, name in enumerate(PATH_VALUES)}
    fields[Fields.COST_USD] = cost
    fields[Fields.COST_PER_HOUR_USD] = cost * 3600.0 / window_s
    return fields
