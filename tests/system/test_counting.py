"""The one counting core (producer/contract/counting.py): its rule on hand-made events, and the
trace
summary and the stream app agreeing on every figure they share — on a synthetic stream with
graphs, failures, syncs and copies, and on real captures of CUDA-graph workloads."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuflight.producer.decode.summary import Summary
from tests.support.capture import GPUFLIGHT, read_events
from tests.support.counting import (
    events_from_json,
    figures_of_points,
    figures_of_summary,
    figures_of_text,
    stream_points,
    text_figures_of_summary,
)
from tests.workloads import build, expected

pytestmark = pytest.mark.bpf

# -- the rule --------------------------------------------------------------------------------


# -- one stream, both paths ------------------------------------------------------------------


# -- under overload: what the kernel counted instead of recording ------------------------------


# -- one term, one meaning -------------------------------------------------------------------


# -- a real capture of CUDA graphs, both paths -----------------------------------------------


def _nvccstyle(bindir: Path) -> tuple[list[str], dict[str, int]]:
    iters, replays = 30, 7
    want = expected.nvccstyle_events(iters, replays)
    launches = [e for e in want if e["type"] == "launch"]
    return ([str(build.build_nvccstyle(bindir)), "--iters", str(iters), "--replays",
             str(replays)],
            {"kernel launches": sum(not e["captured"] for e in launches),
             "captured into graphs": sum(bool(e["captured"]) for e in launches),
             "graph launches": replays, "graph kernel nodes run": 3 * replays,
             "failed calls": 0})


def _failing_runtime(bindir: Path) -> tuple[list[str], dict[str, int]]:
    """NVIDIA's own libcudart.so.12 without a driver: every call that returns fails."""
    threads, iters = 2, 5
    want = expected.capture_events(threads, iters, all_apis=True)
    completed = [e for e in want if e["type"] in {"alloc", "free", "sync"}
                 or (e["type"] == "memcpy" and not e["async"])]
    return ([str(build.build_capture(bindir, "cu12")), "--threads", str(threads), "--iters",
             str(iters), "--all-apis"],
            {"kernel launches": sum(e["type"] == "launch" for e in want),
             "captured into graphs": 0,
             "graph launches": sum(e["type"] == "graph_launch" for e in want),
             "graph kernel nodes run": 0, "failed calls": len(completed)})


@pytest.mark.bpf
@pytest.mark.parametrize("workload", [_nvccstyle, _failing_runtime],
                         ids=["graph-capture-and-replays", "failing-runtime"])
def test_a_real_trace_and_the_stream_app_agree(workload: Any, bindir: Path,
                                               tmp_path: Path) -> None:
    """`gpuflight trace --output` of a workload: what it printed, the Summary of the events
    it wrote, and the stream app's points of the same events give the same figures."""
    cmd, oracle = workload(bindir)
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([*GPUFLIGHT, "trace", "--output", str(out), "--", *cmd],
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "events dropped: 0" in proc.stderr
    events = events_from_json(read_events(out))
    summary = Summary()
    summary.add(events)
    printed = figures_of_text(proc.stderr)
    assert printed == text_figures_of_summary(summary)
    assert {k: printed[k] for k in oracle} == oracle
    assert figures_of_summary(summary) == figures_of_points(stream_points(events))
