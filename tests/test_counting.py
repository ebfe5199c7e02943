"""The one counting core (producer/counting.py): its rule on hand-made events, and the trace
summary and the stream app agreeing on every figure they share — on a synthetic stream with
graphs, failures, syncs and copies, and on real captures of CUDA-graph workloads."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from producer import counting
from producer.counting import CopyStats, Counts
from producer.records import (
    API_IDS,
    EVENT_DTYPE,
    F_ASYNC,
    F_BYTES_KNOWN,
    F_CAPTURED,
    F_HAS_RESULT,
    EventType,
)
from producer.summary import Summary, render
from streams import measurements as m
from tests.conftest import bpf_unavailable_reason, require
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

Events = npt.NDArray[np.void]
T0 = 1_796_000_000_000_000_000
S = 1_000_000_000
OK = {"flags": F_HAS_RESULT, "result": 0}


def make(rows: list[dict[str, Any]]) -> Events:
    events = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, row in enumerate(rows):
        for key, value in {"ts_ns": T0 + i, "pid": 10, "tid": 11, **row}.items():
            events[i][key] = value
    return events


def launch(grid: int = 8, block: int = 32, api: str = "cudaLaunchKernel", **kw: Any
           ) -> dict[str, Any]:
    return {"type": EventType.LAUNCH, "api": API_IDS[api], "handle": 0xA0,
            "dim": [grid, 1, 1, block, 1, 1], **kw}


def graph(nodes: int, api: str = "cudaGraphLaunch", **kw: Any) -> dict[str, Any]:
    return {"type": EventType.GRAPH_LAUNCH, "api": API_IDS[api], "handle": 0xE0,
            "dim": [nodes, 0, 0, 0, 0, 0], **kw}


def copy(kind: int, nbytes: int, ns: int, api: str = "cudaMemcpy", **kw: Any
         ) -> dict[str, Any]:
    timed = {"duration_ns": ns, **OK} if "Async" not in api else {"flags": F_ASYNC}
    return {"type": EventType.MEMCPY, "api": API_IDS[api], "bytes": nbytes,
            "dim": [kind, 0, 0, 0, 0, 0], **timed, **kw}


def alloc(ptr: int, nbytes: int, **kw: Any) -> dict[str, Any]:
    return {"type": EventType.ALLOC, "api": API_IDS["cudaMalloc"], "handle": ptr,
            "bytes": nbytes, "dim": [1, 0, 0, 0, 0, 0], "duration_ns": 10, **OK, **kw}


def free(ptr: int, nbytes: int | None, **kw: Any) -> dict[str, Any]:
    known = {} if nbytes is None else {"bytes": nbytes, "flags": F_HAS_RESULT | F_BYTES_KNOWN}
    return {"type": EventType.FREE, "api": API_IDS["cudaFree"], "handle": ptr,
            "duration_ns": 10, **OK, **known, **kw}


def sync(scope: int, ns: int, **kw: Any) -> dict[str, Any]:
    api = {1: "cudaStreamSynchronize", 2: "cudaDeviceSynchronize", 3: "cudaEventSynchronize"}
    return {"type": EventType.SYNC, "api": API_IDS[api[scope]], "duration_ns": ns,
            "dim": [scope, 0, 0, 0, 0, 0], **OK, **kw}


def counted(rows: list[dict[str, Any]]) -> Counts:
    counts = Counts(shapes=Counter())
    counts.add(make(rows))
    return counts


# -- the rule --------------------------------------------------------------------------------


def test_a_captured_launch_ran_nothing() -> None:
    c = counted([launch(flags=F_CAPTURED), launch(flags=F_CAPTURED), launch(grid=4)])
    assert (c.captured, c.kernel_launches, c.all_launches) == (2, 1, 1)
    assert c.kernels == {"function@0xa0": 1}
    assert c.shapes == {((4, 1, 1), (32, 1, 1)): 1}
    assert sum(c.grid_blocks) == 1 and c.grid_blocks[2] == 1
    assert c.threads_launched == 4 * 32
    assert c.first_launch_ns == c.last_launch_ns == T0 + 2


def test_graph_launches_count_their_kernel_nodes_where_known() -> None:
    c = counted([graph(3), graph(3), graph(0), graph(5, api="cuGraphLaunch"), launch()])
    assert (c.kernel_launches, c.graph_launches, c.all_launches) == (1, 4, 5)
    assert c.graph_kernel_nodes == {("runtime", "cudaGraphLaunch"): 6,
                                    ("driver", "cuGraphLaunch"): 5}
    assert (c.graph_kernels, c.kernels_run) == (11, 12)
    assert c.launches_by_api() == {"cudaLaunchKernel": 1}
    assert c.launches_by_api(graphs=True) == {"cudaGraphLaunch": 3, "cuGraphLaunch": 1}
    assert sum(c.grid_blocks) == 1  # graph nodes have no shape we know
    graph_apis = {"cudaGraphLaunch", "cudaGraphLaunch_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz"}
    assert graph_apis == counting.GRAPH_LAUNCH_APIS


def test_a_failed_call_counts_only_as_a_failed_call_but_a_sync_still_waited() -> None:
    c = counted([
        alloc(0x0, 1 << 40, result=2),                   # out of memory: not an allocation
        alloc(0x1, 100),
        free(0x1, 100, result=1),                        # failed: not a free
        copy(1, 4096, 5_000, result=700),                # failed synchronous copy: no copy
        copy(1, 1000, 1_000),
        copy(2, 64, 0, api="cudaMemcpyAsync"),           # result not seen: done
        sync(1, 7_000, result=700),                      # failed, after waiting 7 µs
        sync(2, 3_000),
        launch(),                                        # an async launch: counts as launched
        {"type": EventType.MEMSET, "api": API_IDS["cudaMemset"], "bytes": 8, "result": 1,
         "flags": F_HAS_RESULT},                         # failed (were a result seen)
    ])
    assert c.errors == {"cudaMalloc": 1, "cudaFree": 1, "cudaMemcpy": 1,
                        "cudaStreamSynchronize": 1, "cudaMemset": 1}
    assert c.failed_calls == 5
    assert (c.alloc_count, c.alloc_bytes, c.free_count, c.free_bytes) == (1, 100, 0, 0)
    assert (c.memory_net_bytes, c.memory_peak_rise_bytes) == (100, 100)
    assert c.copies == {"H2D": CopyStats(1, 1000, 1, 1000, 1_000), "D2H": CopyStats(1, 64)}
    assert c.sync_count == {"stream": 1, "device": 1}
    assert c.sync_ns == {"stream": 7_000, "device": 3_000}
    assert (c.total_sync_ns, c.copy_sync_ns, c.blocked_ns) == (10_000, 1_000, 11_000)
    assert c.kernel_launches == 1 and c.memset_count == 0


def test_exact_shapes_beyond_64_bits_of_dims() -> None:
    huge = 0xFFFF_FFFF
    rows = [launch(grid=huge, block=huge), launch(grid=huge, block=huge), launch(grid=2),
            launch(grid=3), launch(grid=2)]
    c = counted(rows)
    assert c.shapes == {((huge, 1, 1), (huge, 1, 1)): 2, ((2, 1, 1), (32, 1, 1)): 2,
                        ((3, 1, 1), (32, 1, 1)): 1}
    small = counted(rows[2:])
    assert small.shapes == {((2, 1, 1), (32, 1, 1)): 2, ((3, 1, 1), (32, 1, 1)): 1}
    assert counted([launch(grid=5)] * 3).shapes == {((5, 1, 1), (32, 1, 1)): 3}


def test_merge_from_equals_adding_at_once_shapes_included() -> None:
    rows = [launch(grid=g) for g in (1, 2, 2, 4)] + [alloc(0x1, 10), free(0x1, 10), sync(1, 5)]
    events = make(rows)
    whole, a, b = (Counts(shapes=Counter()) for _ in range(3))
    whole.add(events)
    a.add(events[:3])
    b.add(events[3:])
    a.merge_from(b)
    assert a == whole and a.shapes == whole.shapes == {
        ((1, 1, 1), (32, 1, 1)): 1, ((2, 1, 1), (32, 1, 1)): 2, ((4, 1, 1), (32, 1, 1)): 1}


def test_names_are_the_influxdb_contracts() -> None:
    """The core names what it cannot name as the stream app's contract spells it."""
    assert counting.UNKNOWN == m.UNKNOWN_API == m.UNKNOWN_KIND == m.UNKNOWN_SCOPE
    assert counting.HISTOGRAM_BUCKETS == m.HISTOGRAM_BUCKETS
    c = counted([copy(9, 1, 1), {"type": EventType.LAUNCH, "api": 199, "dim": [1] * 6}])
    assert set(c.copies) == {m.UNKNOWN_KIND}
    assert c.launches == {("runtime", m.UNKNOWN_API): 1}


# -- one stream, both paths ------------------------------------------------------------------


def synthetic() -> Events:
    """Two processes over three seconds: kernel launches (some captured), a capture and its
    graph launches (nodes known and not), copies of every sort, failed allocations, copies
    and syncs, memsets, frees known, unknown and of null. Memory events are all one
    process's (a job's live bytes are its processes' together, in time order)."""
    rng = np.random.default_rng(17)
    rows: list[dict[str, Any]] = []
    for i in range(600):
        pid = 100 + i % 2
        rows.append(launch(grid=int(rng.choice([8, 64, 4096])), block=int(rng.choice([32, 256])),
                           api=str(rng.choice(["cudaLaunchKernel", "cuLaunchKernel"])),
                           handle=0xA0 + 0x10 * int(rng.integers(0, 5)), pid=pid))
        if i % 25 == 0:
            rows.append(launch(grid=16, flags=F_CAPTURED, pid=pid))
        if i % 10 == 0:
            rows.append(graph(3 if i % 20 else 0, pid=pid))
        if i % 7 == 0:
            rows.append(copy(int(rng.integers(0, 6)), int(rng.integers(1, 1 << 20)),
                             int(rng.integers(1, 10**6)), pid=pid,
                             result=700 if i % 49 == 0 else 0))
        if i % 9 == 0:
            rows.append(copy(2, 4096, 0, api="cudaMemcpyAsync", pid=pid))
        if i % 11 == 0:
            rows.append(sync(int(rng.integers(1, 4)), int(rng.integers(1, 10**6)), pid=pid,
                             result=4 if i % 33 == 0 else 0))
        if i % 13 == 0:
            rows.append({"type": EventType.MEMSET, "api": API_IDS["cudaMemsetAsync"],
                         "bytes": 256, "flags": F_ASYNC, "pid": pid})
        if i % 30 == 0:
            ptr = 0x1000 + i
            rows.append(alloc(ptr, 1 << 20, pid=100))
            rows.append(alloc(0, 1 << 40, result=2, pid=100))
            rows.append(free(ptr - 30 if i else 0, (1 << 20) if i else None, pid=100))
            rows.append(free(0x9, None, pid=100))  # allocated before the trace
    events = make(rows)
    events["ts_ns"] = T0 + np.arange(len(events), dtype=np.uint64) * (3 * S // len(events))
    return events


def test_the_trace_summary_and_the_stream_app_agree_on_every_shared_figure() -> None:
    events = synthetic()
    summary = Summary()
    for part in np.array_split(events, 7):  # batches as the capture loop hands them
        summary.add(part)
    streams = figures_of_points(stream_points(events))
    trace = figures_of_summary(summary)
    assert trace == streams
    # Both are right, not just equal (the synthetic script's own numbers).
    assert trace["kernel launches"] == 600 and trace["captured into graphs"] == 24
    assert trace["graph launches"] == 60 and trace["graph kernel nodes run"] == 30 * 3
    failed = {"allocations": 20, "copies": len(range(0, 600, 49)), "syncs": len(range(0, 600, 33))}
    assert sum(trace["failed calls"].values()) == summary.failed_calls == sum(failed.values())
    assert trace["failed calls"]["cudaMalloc"] == 20 and trace["allocations, frees"][0] == 20
    # The failed syncs still count as syncs, the failed copies as nothing but failures.
    assert sum(n for n, _ns in trace["syncs"].values()) == len(range(0, 600, 11))
    assert sum(c[0] for c in trace["copies"].values()) == (
        len(range(0, 600, 7)) - failed["copies"] + len(range(0, 600, 9)))
    assert trace["syncs"] and trace["CPU blocked on the GPU in synchronous copies"] > 0
    # What the trace prints is what it counted.
    text = render(summary, "synthetic", wall_s=3.0, drops=0)
    assert figures_of_text(text) == text_figures_of_summary(summary)
    assert "CPU blocked on the GPU" in text and "in synchronous copies" in text


# -- a real capture of CUDA graphs, both paths -----------------------------------------------


@pytest.fixture(scope="module")
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("counting-workloads")


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
    require(bpf_unavailable_reason())
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
