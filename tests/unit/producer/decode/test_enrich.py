"""Decoding raw records into --output events, and the summary's arithmetic."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from gpuflight.producer.contract.abi import API_IDS, F_ASYNC, F_HAS_RESULT, EventType
from gpuflight.producer.contract.wire import KernelName
from gpuflight.producer.decode.enrich import Enricher, to_events
from gpuflight.producer.decode.summary import Summary, render
from tests.support.builders import build_events


def decode(events: npt.NDArray[np.void], offset: int = 0) -> list[dict[str, Any]]:
    return to_events(Enricher(clock_offset_ns=offset).enrich(events))


def launch(
    ts: int, grid: tuple[int, int, int], block: tuple[int, int, int], **kw: Any
) -> dict[str, Any]:
    return {"ts_ns": ts, "pid": 10, "tid": 11, "api": API_IDS[kw.pop("api", "cudaLaunchKernel")],
            "type": EventType.LAUNCH, "dim": [*grid, *block], **kw}


def test_launch_fields() -> None:
    events = build_events([launch(1000, (4, 2, 1), (128, 1, 1), bytes=256, stream=0x1000,
                                  handle=0xABC, device=1)])
    (event,) = decode(events, 5)
    assert event == {
        "type": "launch", "ts_ns": 1005, "pid": 10, "tid": 11, "api": "cudaLaunchKernel",
        "layer": "runtime", "device": 1, "grid": [4, 2, 1], "block": [128, 1, 1],
        "shared_mem_bytes": 256, "stream": 0x1000, "kernel": None, "kernel_full": None,
        "function": 0xABC, "captured": False,
    }


def test_sync_copy_has_duration_and_result_async_has_neither() -> None:
    events = build_events([
        {"type": EventType.MEMCPY, "api": API_IDS["cudaMemcpy"], "flags": F_HAS_RESULT,
         "result": 35, "duration_ns": 700, "bytes": 4096, "dim": [1, 0, 0, 0, 0, 0]},
        {"type": EventType.MEMCPY, "api": API_IDS["cudaMemcpyAsync"], "flags": F_ASYNC,
         "bytes": 1 << 20, "dim": [2, 0, 0, 0, 0, 0], "stream": 7},
    ])
    sync, copy_async = decode(events)
    assert (sync["kind"], sync["async"], sync["duration_ns"], sync["ok"], sync["result"]) == (
        "H2D", False, 700, False, 35)
    assert (copy_async["kind"], copy_async["async"], copy_async["duration_ns"],
            copy_async["ok"], copy_async["stream"]) == ("D2H", True, None, None, 7)
    assert "result" not in copy_async


def test_free_knows_bytes_from_the_allocation() -> None:
    done = {"flags": F_HAS_RESULT, "result": 0, "pid": 3}
    events = build_events([
        {"type": EventType.ALLOC, "api": API_IDS["cudaMalloc"], "handle": 0x7000, "bytes": 999,
         "dim": [1, 0, 0, 0, 0, 0], **done},
        {"type": EventType.FREE, "api": API_IDS["cudaFree"], "handle": 0x7000, **done},
        {"type": EventType.FREE, "api": API_IDS["cudaFree"], "handle": 0x9000, **done},
    ])
    alloc, freed, unknown = decode(events)
    assert (alloc["ptr"], alloc["alloc_kind"], alloc["ok"]) == (0x7000, "device", True)
    assert (freed["ptr"], freed["bytes"]) == (0x7000, 999)
    assert unknown["bytes"] is None  # allocated before capture began


def test_failed_allocation_has_no_pointer() -> None:
    events = build_events([{"type": EventType.ALLOC, "api": API_IDS["cudaMallocHost"], "handle": 0,
                    "flags": F_HAS_RESULT, "result": 2, "bytes": 64, "dim": [4, 0, 0, 0, 0, 0]}])
    (alloc,) = decode(events)
    assert (alloc["ptr"], alloc["ok"], alloc["alloc_kind"]) == (None, False, "host_pinned")


def test_sync_scopes() -> None:
    done = {"flags": F_HAS_RESULT, "result": 0, "duration_ns": 50}
    events = build_events([
        {"type": EventType.SYNC, "api": API_IDS["cudaStreamSynchronize"], "handle": 5,
         "dim": [1, 0, 0, 0, 0, 0], **done},
        {"type": EventType.SYNC, "api": API_IDS["cudaEventSynchronize"], "handle": 6,
         "dim": [3, 0, 0, 0, 0, 0], **done},
        {"type": EventType.SYNC, "api": API_IDS["cudaDeviceSynchronize"],
         "dim": [2, 0, 0, 0, 0, 0], **done},
    ])
    stream, event, device = decode(events)
    assert (stream["scope"], stream["stream"]) == ("stream", 5)
    assert (event["scope"], event["event"], event["stream"]) == ("event", 6, 0)
    assert (device["scope"], device["duration_ns"], device["ok"]) == ("device", 50, True)


def test_summary_counts_shapes_bandwidth_and_peak() -> None:
    done = {"flags": F_HAS_RESULT, "result": 0, "pid": 1}
    rows = [launch(t, (40, 1, 1), (256, 1, 1)) for t in range(8)]
    rows += [launch(9, (4096, 1, 1), (256, 1, 1), api="cudaLaunchKernel_ptsz")]
    rows += [
        {"ts_ns": 10, "type": EventType.MEMCPY, "api": API_IDS["cudaMemcpy"], "bytes": 12_000_000,
         "duration_ns": 1_000_000, "dim": [1, 0, 0, 0, 0, 0], **done},
        {"ts_ns": 11, "type": EventType.ALLOC, "api": API_IDS["cudaMalloc"], "handle": 1,
         "bytes": 100, "dim": [1, 0, 0, 0, 0, 0], **done},
        {"ts_ns": 12, "type": EventType.ALLOC, "api": API_IDS["cudaMalloc"], "handle": 2,
         "bytes": 50, "dim": [1, 0, 0, 0, 0, 0], **done},
        {"ts_ns": 13, "type": EventType.FREE, "api": API_IDS["cudaFree"], "handle": 1, **done},
        {"ts_ns": 14, "type": EventType.ALLOC, "api": API_IDS["cudaMalloc"], "handle": 3,
         "bytes": 20, "dim": [1, 0, 0, 0, 0, 0], **done},
        {"ts_ns": 15, "type": EventType.SYNC, "api": API_IDS["cudaDeviceSynchronize"],
         "duration_ns": 2_000_000, "dim": [2, 0, 0, 0, 0, 0], **done},
    ]
    summary = Summary()
    # As the capture loop hands them:
    events = Enricher(clock_offset_ns=0).enrich(build_events(rows))
    summary.add(events[:5])
    summary.add(events[5:])
    assert summary.launches == 9
    assert summary.launches_by_api == {"cudaLaunchKernel": 8, "cudaLaunchKernel_ptsz": 1}
    assert summary.shapes.most_common(1) == [(((40, 1, 1), (256, 1, 1)), 8)]
    assert summary.blocks_total == 8 * 40 + 4096
    assert summary.copies["H2D"].sync_bandwidth == 12e9
    assert (summary.peak_live_bytes, summary.live_bytes) == (150, 70)
    assert summary.sync_ns["device"] == 2_000_000
    text = render(summary, "job", wall_s=0.01, drops=0)
    assert "kernel launches" in text and "(40,1,1)" in text and "12.00 GB/s" in text
    assert "on device" not in text  # one device: no split


def test_summary_splits_launches_per_device_when_there_are_several() -> None:
    rows = [launch(t, (1, 1, 1), (32, 1, 1), device=t % 3) for t in range(7)]
    rows += [launch(9, (1, 1, 1), (32, 1, 1), device=2, flags=0x40)]  # captured: not run
    summary = Summary()
    summary.add(Enricher(clock_offset_ns=0).enrich(build_events(rows)))
    assert summary.counts.device_launches == {0: 3, 1: 2, 2: 2}
    lines = render(summary, "job", wall_s=1.0, drops=0).splitlines()
    assert [line.split() for line in lines if "on device" in line] == [
        ["3", "on", "device", "0"], ["2", "on", "device", "1"], ["2", "on", "device", "2"]]


def test_summary_splits_copies_and_blocked_time_per_device() -> None:
    def copy(t: int, kind: int, nbytes: int, device: int) -> dict[str, Any]:
        return {"type": EventType.MEMCPY, "api": API_IDS["cudaMemcpy"], "ts_ns": t,
                "bytes": nbytes, "dim": [kind, 0, 0, 0, 0, 0], "flags": F_HAS_RESULT,
                "result": 0, "duration_ns": 2_000_000, "device": device}

    rows = [launch(1, (1, 1, 1), (32, 1, 1), device=0), copy(2, 1, 4096, 0),
            copy(3, 2, 2048, 1), copy(4, 3, 1 << 20, 1), copy(5, 2, 2048, 1)]
    summary = Summary()
    summary.add(Enricher(clock_offset_ns=0).enrich(build_events(rows)))
    lines = render(summary, "job", wall_s=1.0, drops=0).splitlines()
    at = lines.index("  per device (the calling thread's):")
    assert lines[at + 1].split() == ["device", "kernel", "launches", "copies", "H2D", "D2H",
                                     "D2D", "CPU", "blocked"]
    assert lines[at + 2].split() == ["0", "1", "1", "4.00", "KiB", "-", "-", "2.000", "ms"]
    assert lines[at + 3].split() == ["1", "0", "3", "-", "4.00", "KiB", "1.00", "MiB",
                                     "6.000", "ms"]
    one = Summary()
    one.add(Enricher(clock_offset_ns=0).enrich(build_events(rows[:2])))
    assert "per device" not in render(one, "job", wall_s=1.0, drops=0)


def test_captured_launches_count_into_the_graph_and_its_replays() -> None:
    """Begin capture, launches (one on another stream), end, instantiate, launch, in
    two batches split mid-capture: the enricher keeps state across batches."""
    done = {"flags": F_HAS_RESULT, "result": 0, "pid": 10}
    first = build_events([
        {"type": EventType.GRAPH_CAPTURE, "api": API_IDS["cudaStreamBeginCapture"],
         "stream": 5, "pid": 10, "dim": [1, 0, 0, 0, 0, 0]},
        launch(1, (1, 1, 1), (32, 1, 1), stream=5),
        launch(2, (1, 1, 1), (32, 1, 1), stream=6),
    ])
    second = build_events([
        launch(3, (2, 1, 1), (32, 1, 1), stream=5),
        {"type": EventType.GRAPH_CAPTURE, "api": API_IDS["cudaStreamEndCapture"], "stream": 5,
         "handle": 0xA1, "dim": [2, 0, 0, 0, 0, 0], **done},
        {"type": EventType.GRAPH_INSTANTIATE, "api": API_IDS["cudaGraphInstantiate"],
         "handle": 0xB1, "bytes": 0xA1, **done},
        {"type": EventType.GRAPH_LAUNCH, "api": API_IDS["cudaGraphLaunch"], "handle": 0xB1,
         "stream": 6, "pid": 10},
        {"type": EventType.GRAPH_LAUNCH, "api": API_IDS["cudaGraphLaunch"], "handle": 0xB9,
         "stream": 6, "pid": 10},
        launch(4, (1, 1, 1), (32, 1, 1), stream=5),
    ])
    enricher = Enricher(clock_offset_ns=0)
    events = to_events(enricher.enrich(first)) + to_events(enricher.enrich(second))
    assert [e["captured"] for e in events if e["type"] == "launch"] == [True, False, True, False]
    end, made = events[4], events[5]
    assert (end["phase"], end["graph"], end["kernel_nodes"]) == ("end", 0xA1, 2)
    assert (made["graph_exec"], made["graph"], made["kernel_nodes"]) == (0xB1, 0xA1, 2)
    # A replay of a known exec carries its kernel nodes; an exec never seen made, none.
    assert [e["kernel_nodes"] for e in events if e["type"] == "graph_launch"] == [2, None]
    assert events[0] == {"type": "graph_capture", "ts_ns": 0, "pid": 10, "tid": 0,
                         "api": "cudaStreamBeginCapture", "layer": "runtime", "device": 0,
                         "phase": "begin",
                         "stream": 5, "graph": None, "kernel_nodes": None, "duration_ns": None,
                         "ok": None}


def test_summary_lists_each_probed_file_once_with_its_probes() -> None:
    from gpuflight.producer.decode.summary import ProbedFile

    probed = [
        ProbedFile("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "loader", 1),
        ProbedFile("/opt/sim/libcuda.so.1", "driver", 81),
        ProbedFile("/venv/nvidia/cu13/lib/libcudart.so.13", "runtime", 74),
    ]
    text = render(Summary(), "job", wall_s=1.0, drops=0, probed=probed)
    assert "probed library files: 3 (156 probes)" in text
    rows = [ln.split() for ln in text.splitlines() if ln.strip().endswith(".so.1")
            or ln.strip().endswith(".so.13") or ln.strip().endswith(".so.2")]
    # runtimes first, then drivers, then the loader; each file once
    assert rows == [["74", "runtime", "/venv/nvidia/cu13/lib/libcudart.so.13"],
                    ["81", "driver", "/opt/sim/libcuda.so.1"],
                    ["1", "loader", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"]]
    assert "probed library files" not in render(Summary(), "job", wall_s=1.0, drops=0)


def test_summary_says_which_probes_are_single_stepped_and_what_their_calls_cost() -> None:
    from gpuflight.producer.decode.summary import STEP_COST_S, ProbedFile

    probed = [ProbedFile("/opt/libcuda.so.1", "driver", 81, stepped=3),
              ProbedFile("/venv/libcudart.so.13", "runtime", 74)]
    text = render(Summary(), "job", wall_s=1.0, drops=0, probed=probed, stepped_calls=200_000)
    (driver,) = [ln for ln in text.splitlines() if "/opt/libcuda.so.1" in ln]
    assert driver.split("#")[1].strip() == "3 function(s) single-stepped"
    (runtime,) = [ln for ln in text.splitlines() if "libcudart.so.13" in ln]
    assert "single-stepped" not in runtime
    (calls,) = [ln for ln in text.splitlines() if "single-stepped calls" in ln]
    assert calls.split(":")[1].split()[0] == "200,000"
    assert f"~{200_000 * STEP_COST_S:.1f} s" in calls
    uncounted = render(Summary(), "job", wall_s=1.0, drops=0, probed=probed, stepped_calls=None)
    assert "single-stepped calls: not counted" in uncounted
    # nothing stepped: nothing said
    quiet = render(Summary(), "job", wall_s=1.0, drops=0, probed=probed[1:], stepped_calls=0)
    assert "single-stepped" not in quiet


def test_forget_drops_what_is_kept_of_exited_processes_only() -> None:
    """Node-wide, what the enricher keeps per process (sizes of allocations never freed,
    graphs and execs, kernel names) goes with the process (capture.Capture forgets a pid once
    a rescan found it gone and its events are handed on): thousands of short-lived processes
    an hour leave nothing behind (the soak's agent grew 130 MiB an hour before)."""
    enricher = Enricher(clock_offset_ns=0, proc_root=None)  # type: ignore[arg-type]
    done = {"flags": F_HAS_RESULT, "result": 0}
    for pid in range(100, 1100):
        enricher.enrich(build_events([
            {"type": EventType.ALLOC, "api": API_IDS["cudaMalloc"], "handle": 0x7000 + pid,
             "bytes": 64, "pid": pid, **done},  # never freed: the process just exits
            {"type": EventType.GRAPH_CAPTURE, "api": API_IDS["cudaStreamBeginCapture"],
             "stream": 5, "pid": pid, "dim": [1, 0, 0, 0, 0, 0]},
            {"type": EventType.GRAPH_CAPTURE, "api": API_IDS["cudaStreamEndCapture"],
             "stream": 5, "pid": pid, "handle": 0xA1, "dim": [2, 0, 0, 0, 0, 0], **done},
            {"type": EventType.GRAPH_INSTANTIATE, "api": API_IDS["cudaGraphInstantiate"],
             "handle": 0xB1, "bytes": 0xA1, "pid": pid, **done},
            {"type": EventType.GRAPH_CAPTURE, "api": API_IDS["cudaStreamBeginCapture"],
             "stream": 6, "pid": pid, "dim": [1, 0, 0, 0, 0, 0]},  # exits mid-capture
        ]))
        enricher.kernels.learn(pid, {0x1: KernelName("k", "k")})
    assert len(enricher.allocations) == 1000 and len(enricher.kernels) == 1000
    assert len(enricher.graphs.graphs) == len(enricher.graphs.execs) == 1000
    assert len(enricher.graphs.capturing) == 1000

    enricher.forget(set(range(100, 1099)))  # all but the last
    assert len(enricher.allocations) == 1 and len(enricher.kernels) == 1
    assert list(enricher.graphs.graphs) == [(1099, 0xA1)]
    assert list(enricher.graphs.execs) == [(1099, 0xB1)]
    assert list(enricher.graphs.capturing) == [(1099, 6)]
    # The one left is whole: its free is sized, its launches named.
    (freed,) = to_events(enricher.enrich(build_events([
        {"type": EventType.FREE, "api": API_IDS["cudaFree"], "handle": 0x7000 + 1099,
         "pid": 1099, **done}])))
    assert freed["bytes"] == 64
    assert enricher.kernels.name_of(1099, 0x1) == KernelName("k", "k")
    # A forgotten pid used again is a new process: nothing of the old one applies.
    (other,) = to_events(enricher.enrich(build_events([
        {"type": EventType.FREE, "api": API_IDS["cudaFree"], "handle": 0x7000 + 100,
         "pid": 100, **done}])))
    assert other["bytes"] is None


def test_summary_tables_align_counts_right_and_text_left() -> None:
    from gpuflight.producer.decode.summary import _table

    lines = _table([["(1,1,1)", "2", "100.0%"], ["(1024,1,1)", "12,345", "0.1%"]],
                   ["grid", "launches", "share"])
    assert lines == [
        "    grid        launches  share",
        "    (1,1,1)            2  100.0%",
        "    (1024,1,1)    12,345  0.1%",
    ]
    assert _table([], ["grid", "launches"]) == ["    grid  launches"]


def test_the_clock_offset_is_taken_from_the_tightest_of_its_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The wall clock is read between two monotonic reads; a read the thread was preempted in
    (here the first, 40 ms between its monotonic reads) is off by half of that, so the
    tightest of the tries is kept."""
    from gpuflight.producer.decode import enrich

    monotonic = iter([1_000, 40_001_000, 50_000_000, 50_000_100, 60_000_000, 60_000_300])
    wall = iter([9_000_000_000, 9_050_000_000, 9_060_000_000])
    monkeypatch.setattr("gpuflight.producer.decode.enrich.time.monotonic_ns",
                        lambda: next(monotonic))
    monkeypatch.setattr("gpuflight.producer.decode.enrich.time.time_ns", lambda: next(wall))
    assert enrich.monotonic_to_wall_offset_ns(tries=3) == 9_050_000_000 - 50_000_050
