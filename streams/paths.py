"""Code paths in a window of a job: what the sampled calls of each path cost (events.v1
"paths", `gpuflight producer --stack-sampling N`), folded to the path's user function. Pure:
no Faust, no I/O.

A path's **user function** is its innermost Python frame that is neither in site-packages
(dist-packages) nor in Python's own library ("function (dir/file.py)": the line and all but
the file's last directory left out, so that one function is one series whichever release
directory it ran from): the function the user wrote that led to the call, whatever library
code it went through. A path with no such frame takes its innermost Python frame; one with no
Python frame at all (a process without CPython), its native caller.

A window keeps at most MAX_FUNCTIONS functions (more: "[other]"), and writes the
TOP_FUNCTIONS costliest by GPU time (then calls) as points of `code_paths`, the rest summed as
"[other]", so the series stay bounded whatever the code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpuflight.producer.contract.wire import PATH_VALUES, PathRecord
from gpuflight.streams import measurements as m
from gpuflight.streams.measurements import Fields, FieldValue, Point, Tags
from gpuflight.streams.requests import usd

#: Functions a window keeps apart, and writes.
MAX_FUNCTIONS: Final = 1000
TOP_FUNCTIONS: Final = 10
OTHER: Final = "[other]"
#: The longest user function kept (a tag value).
MAX_FUNCTION_CHARS: Final = 512
#: Library code: a frame in one of these is not the user's.
_LIBRARY: Final = re.compile(r"/(site|dist)-packages/|/lib(64)?/python3\.\d+t?/|^<frozen ")
_FIELD_OF: Final = {"launches": Fields.LAUNCHES, "gpu_ns": Fields.GPU_NS,
                    "bytes": Fields.BYTES, "blocked_ns": Fields.BLOCKED_NS,
                    "calls": Fields.CALLS}
_GPU: Final = PATH_VALUES.index("gpu_ns")
_CALLS: Final = PATH_VALUES.index("calls")

Frame = tuple[str, str, int | None]


def user_function(frames: Sequence[Frame]) -> str:
    """The path's user function (see the module's docstring)."""
    python = [(name, file) for name, file, line in frames if line is not None]
    mine = [f for f in python if not _LIBRARY.search(f[1])]
    name, file = (mine or python or [(f[0], f[1]) for f in frames[-1:]] or [("[none]", "")])[-1]
    file = "/".join(file.split("/")[-2:])  # not where a release was unpacked this time
    return (f"{name} ({file})" if file else name)[:MAX_FUNCTION_CHARS]


@dataclass
class PathWindow:
    """A window's code paths: per user function, PATH_VALUES summed; and the functions its
    points named so far (a window is written again while late events come: one that left the
    top since is written as zeros, so that its earlier point does not count twice)."""

    functions: dict[str, list[float]] = field(default_factory=dict)
    shown: set[str] = field(default_factory=set)

    def add(self, path: PathRecord) -> None:
        key = user_function(path.frames)
        if key not in self.functions and len(self.functions) >= MAX_FUNCTIONS:
            key = OTHER
        sums = self.functions.setdefault(key, [0.0] * len(PATH_VALUES))
        for i, name in enumerate(PATH_VALUES):
            sums[i] += float(path.values.get(name, 0.0))

    def to_dict(self) -> dict[str, Any]:
        """By value name: a state keeps its meaning if PATH_VALUES grows."""
        return {"functions": {k: dict(zip(PATH_VALUES, v, strict=True))
                              for k, v in self.functions.items()},
                "shown": sorted(self.shown)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PathWindow:
        return cls({str(k): [float(values.get(name, 0.0)) for name in PATH_VALUES]
                    for k, values in data.get("functions", {}).items()},
                   {str(k) for k in data.get("shown", ())})


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
    not among them now (noted in `win.shown`). `tags`: host, job, namespace and team."""
    ranked = sorted(win.functions.items(), key=lambda kv: (-kv[1][_GPU], -kv[1][_CALLS], kv[0]))
    kept = [(k, v) for k, v in ranked[:TOP_FUNCTIONS] if k != OTHER]
    rest = [v for k, v in ranked if k == OTHER or (k, v) not in kept]
    if rest:
        kept.append((OTHER, [sum(column) for column in zip(*rest, strict=True)]))
    names = {function for function, _ in kept}
    # Named by an earlier write of this window, out of the top now: zeros over that point.
    kept += [(function, [0.0] * len(PATH_VALUES)) for function in sorted(win.shown - names)]
    win.shown |= names
    points = []
    for function, sums in kept:
        gpu_ns = sums[_GPU]
        cost = usd(gpu_ns, usd_per_gpu_hour)
        fields: dict[str, FieldValue] = {_FIELD_OF[name]: sums[i]
                                         for i, name in enumerate(PATH_VALUES)}
        fields[Fields.COST_USD] = cost
        fields[Fields.COST_PER_HOUR_USD] = cost * 3600.0 / window_s
        points.append(Point(m.CODE_PATHS.name, {**tags, Tags.FUNCTION: function}, fields,
                            window_start_ns))
    return points
