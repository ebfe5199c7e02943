"""Code paths in the stream windows: folded to the user's function, bounded per window, the
costliest written and the rest as [other], kept across a restart (the job state)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from gpuflight.producer.contract.abi import EVENT_DTYPE
from gpuflight.producer.contract.userfunction import user_function
from gpuflight.producer.contract.wire import PathRecord
from gpuflight.streams import measurements as m
from gpuflight.streams import paths
from gpuflight.streams.paths import OTHER, PathWindow, to_points
from gpuflight.streams.windows import JobState, WindowSettings

W = 1_000_000_000
TORCH = "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py"
GEMM = ("at::native::gemm", "libtorch_cuda.so", None)
NO_EVENTS = np.zeros(0, dtype=EVENT_DTYPE)


def path(ts: int, *frames: tuple[str, str, int | None], **values: float) -> PathRecord:
    return PathRecord(ts, frames, values)


def test_the_user_function_is_the_innermost_frame_outside_library_code() -> None:
    frames = (("<module>", "/srv/train.py", 3), ("Model.forward", "/srv/model.py", 41),
              ("Linear.forward", TORCH, 125), ("_call", "/usr/lib/python3.11/ctypes/x.py", 9),
              GEMM)
    assert user_function(frames) == "Model.forward (srv/model.py)"
    assert user_function(frames[2:]) == "_call (ctypes/x.py)"
    assert user_function((GEMM,)) == "at::native::gemm (libtorch_cuda.so)"
    assert user_function(()) == "[none]"
    # A backward pass's launch (autograd's thread): the function that entered the pass.
    backward = (("train", "/srv/train.py", 9), ("backward", TORCH, 623),
                ("[autograd backward]", "", None), GEMM)
    assert user_function(backward) == "train (srv/train.py)"


def test_a_window_keeps_functions_apart_up_to_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "MAX_FUNCTIONS", 2)
    win = PathWindow()
    for name in ("a", "b", "c", "d"):
        win.add(path(1, (name, "/srv/x.py", 1), calls=1, gpu_ns=10))
    win.add(path(1, ("a", "/srv/x.py", 7), calls=1, launches=2))  # another line: same function
    assert win.functions == {"a (srv/x.py)": [2.0, 10.0, 0.0, 0.0, 2.0],
                             "b (srv/x.py)": [0.0, 10.0, 0.0, 0.0, 1.0],
                             OTHER: [0.0, 20.0, 0.0, 0.0, 2.0]}
    assert PathWindow.from_dict(win.to_dict()) == win


def test_the_costliest_functions_are_written_and_the_rest_is_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "TOP_FUNCTIONS", 2)
    win = PathWindow()
    for i, gpu_ns in enumerate((5e8, 3e9, 1e9, 2e8)):
        win.add(path(1, (f"f{i}", "/srv/x.py", 1), calls=10, gpu_ns=gpu_ns, bytes=1))
    tags = {m.Tags.HOST: "h", m.Tags.JOB: "j", m.Tags.NAMESPACE: "-", m.Tags.TEAM: "-"}
    points = to_points(win, 5 * W, tags=tags, window_s=10.0, usd_per_gpu_hour=3600.0)
    got = {p.tags[m.Tags.FUNCTION]: p.fields for p in points}
    assert list(got) == ["f1 (srv/x.py)", "f2 (srv/x.py)", OTHER]
    assert got[OTHER][m.Fields.GPU_NS] == 7e8 and got[OTHER][m.Fields.CALLS] == 20
    assert got["f1 (srv/x.py)"][m.Fields.COST_USD] == pytest.approx(3.0)  # $1 a GPU-second
    assert got["f1 (srv/x.py)"][m.Fields.COST_PER_HOUR_USD] == pytest.approx(3.0 * 360)
    assert all(not m.problems(p) for p in points) and all(p.time_ns == 5 * W for p in points)


def test_paths_reach_their_windows_and_survive_the_state_round_trip() -> None:
    settings = WindowSettings(window_s=1.0, grace_s=0.0)
    state = JobState("h", "j", 0)
    applied = state.apply(NO_EVENTS, 0, 1, settings, paths=(
        path(3 * W + 5, ("train", "/srv/t.py", 1), launches=4, calls=4, gpu_ns=100),
        path(4 * W + 5, ("train", "/srv/t.py", 1), launches=1, calls=1)))
    assert applied.late_paths == 0
    back = JobState.from_bytes(state.to_bytes(), settings)
    assert back.windows[3 * W].paths.functions == {"train (srv/t.py)": [4.0, 100.0, 0, 0, 4.0]}
    writes, _ = back.due(5 * W, settings)
    found = [p for w in writes for p in w.points if p.measurement == m.CODE_PATHS.name]
    assert [(p.time_ns, p.fields[m.Fields.LAUNCHES]) for p in found] == [(3 * W, 4.0),
                                                                        (4 * W, 1.0)]
    # A window closed: its paths are late, not counted.
    late = back.apply(NO_EVENTS, 0, 2, settings, paths=(path(3 * W + 9, ("x", "/a", 1)),))
    assert late.late_paths == 1



def test_a_function_that_leaves_the_top_is_written_as_zeros(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Written once while it was in the top, then pushed out by late events: its point is
    overwritten with zeros (else it would count twice, alone and in [other])."""
    monkeypatch.setattr(paths, "TOP_FUNCTIONS", 1)
    tags = {m.Tags.HOST: "h", m.Tags.JOB: "j", m.Tags.NAMESPACE: "-", m.Tags.TEAM: "-"}
    win = PathWindow()
    win.add(path(1, ("a", "/srv/x.py", 1), gpu_ns=5, calls=1))
    first = {p.tags[m.Tags.FUNCTION] for p in to_points(win, 0, tags=tags, window_s=1.0,
                                                          usd_per_gpu_hour=None)}
    assert first == {"a (srv/x.py)"}
    win.add(path(1, ("b", "/srv/x.py", 1), gpu_ns=50, calls=1))
    win = PathWindow.from_dict(win.to_dict())  # across a restart, too
    again = {p.tags[m.Tags.FUNCTION]: p.fields[m.Fields.GPU_NS]
             for p in to_points(win, 0, tags=tags, window_s=1.0, usd_per_gpu_hour=None)}
    assert again == {"b (srv/x.py)": 50.0, OTHER: 5.0, "a (srv/x.py)": 0.0}
    assert sum(float(v) for v in again.values()) == 55.0  # what the window did, once


def test_paths_of_requests_are_written_per_route_each_route_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A path with a route counts for its function (code_paths, whatever the route) and for
    (route, function) (route_code_paths): each route's costliest TOP_ROUTE_FUNCTIONS and
    [other], routes beyond MAX_ROUTES as [other], one that leaves a route's top zeroed."""
    monkeypatch.setattr(paths, "TOP_ROUTE_FUNCTIONS", 1)
    monkeypatch.setattr(paths, "MAX_ROUTES", 2)
    tags = {m.Tags.HOST: "h", m.Tags.JOB: "j", m.Tags.NAMESPACE: "-", m.Tags.TEAM: "-"}
    win = PathWindow()
    for route, name, gpu_ns in (("/a", "f", 30), ("/a", "g", 20), ("/b", "f", 5), ("/c", "g", 1),
                                (None, "f", 100)):
        win.add(PathRecord(1, ((name, "/srv/x.py", 1),), {"gpu_ns": gpu_ns, "calls": 1},
                           route=route))

    def written(window: PathWindow) -> dict[tuple[str, ...], float]:
        return {(p.measurement, p.tags.get(m.Tags.ROUTE, ""), p.tags[m.Tags.FUNCTION]):
                float(p.fields[m.Fields.GPU_NS])
                for p in to_points(window, 0, tags=tags, window_s=1.0, usd_per_gpu_hour=None)}

    by_route = m.ROUTE_CODE_PATHS.name
    assert written(win) == {
        (m.CODE_PATHS.name, "", "f (srv/x.py)"): 135.0,
        (m.CODE_PATHS.name, "", "g (srv/x.py)"): 21.0,
        (by_route, "/a", "f (srv/x.py)"): 30.0, (by_route, "/a", OTHER): 20.0,
        (by_route, "/b", "f (srv/x.py)"): 5.0,
        (by_route, OTHER, "g (srv/x.py)"): 1.0}  # /c: beyond two routes
    win.add(PathRecord(1, (("g", "/srv/x.py", 1),), {"gpu_ns": 50}, route="/a"))
    win = PathWindow.from_dict(orjson.loads(orjson.dumps(win.to_dict())))  # a restart
    again = written(win)
    assert {k: v for k, v in again.items() if k[:2] == (by_route, "/a")} == {
        (by_route, "/a", "g (srv/x.py)"): 70.0, (by_route, "/a", OTHER): 30.0,
        (by_route, "/a", "f (srv/x.py)"): 0.0}


def test_the_function_table_shows_each_functions_share_and_says_when_empty() -> None:
    from gpuflight.streams.costs import (
        FunctionRow,
        FunctionTable,
        render_functions,
        render_functions_json,
    )

    rows = [FunctionRow("Model.forward (srv/model.py)", 3000, 3.0, 1 << 20, 0.5, 3100, 0.003,
                        1.08),
            FunctionRow(OTHER, 10, 1.0, 0, 0.0, 12, 0.001, 0.36)]
    text = render_functions(FunctionTable(0, 10**13, rows))
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["function", "launches", "GPU-s", "GPU"]
    assert "Model.forward (srv/model.py)" in lines[2] and "75.0%" in lines[2]
    assert OTHER in lines[3] and "25.0%" in lines[3]
    back = orjson.loads(render_functions_json(FunctionTable(0, 10**13, rows)))
    assert back["by"] == "function" and back["rows"][0]["gpu_seconds"] == 3.0
    assert "route" not in back["rows"][0]
    empty = render_functions(FunctionTable(0, 10**13, []))
    assert empty.splitlines()[-1].startswith("no code paths in that time range")
    routed = [FunctionRow("f (srv/x.py)", 5, 2.0, route="/v1/a"),
              FunctionRow("g (srv/x.py)", 1, 1.0, route="/v1/b")]
    lines = render_functions(FunctionTable(0, 10**13, routed, by_route=True)).splitlines()
    assert lines[0].split()[:2] == ["route", "function"]
    assert lines[2].split()[:2] == ["/v1/a", "f"] and "66.7%" in lines[2]
    back = orjson.loads(render_functions_json(FunctionTable(0, 10**13, routed, by_route=True)))
    assert back["by"] == "route,function" and back["rows"][1]["route"] == "/v1/b"
    assert "routes need HTTP captured" in render_functions(
        FunctionTable(0, 10**13, [], by_route=True))
