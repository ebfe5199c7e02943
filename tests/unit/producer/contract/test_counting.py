"""The one counting core (producer/contract/counting.py): its rule on hand-made events, and the
trace
summary and the stream app agreeing on every figure they share — on a synthetic stream with
graphs, failures, syncs and copies, and on real captures of CUDA-graph workloads."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np

from gpuflight.demo import showcase
from gpuflight.grafana import generate
from gpuflight.producer.contract import counting
from gpuflight.producer.contract.abi import (
    API_IDS,
    F_CAPTURED,
    F_HAS_RESULT,
    EventType,
)
from gpuflight.producer.contract.counting import CopyStats, Counts
from gpuflight.producer.decode.summary import Summary, render
from gpuflight.streams import measurements as m
from gpuflight.streams import report
from tests.support.builders import T0, stamped_events
from tests.support.counting import (
    SYNTHETIC_CAPTURED,
    SYNTHETIC_FAILED,
    SYNTHETIC_GRAPH_KERNEL_NODES,
    SYNTHETIC_GRAPH_LAUNCHES,
    SYNTHETIC_KERNEL_LAUNCHES,
    S,
    aggregates_of,
    alloc,
    copy,
    figures_of_points,
    figures_of_summary,
    figures_of_text,
    free,
    graph,
    launch,
    stream_points,
    sync,
    synthetic_events,
    text_figures_of_summary,
)


def counted(rows: list[dict[str, Any]]) -> Counts:
    counts = Counts(shapes=Counter())
    counts.add(stamped_events(rows))
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
    rows = [launch(grid=g, device=g % 3) for g in (1, 2, 2, 4)]
    rows += [alloc(0x1, 10), free(0x1, 10), sync(1, 5)]
    events = stamped_events(rows)
    whole, a, b = (Counts(shapes=Counter()) for _ in range(3))
    whole.add(events)
    a.add(events[:3])
    b.add(events[3:])
    a.merge_from(b)
    assert a == whole and a.shapes == whole.shapes == {
        ((1, 1, 1), (32, 1, 1)): 1, ((2, 1, 1), (32, 1, 1)): 2, ((4, 1, 1), (32, 1, 1)): 1}
    assert a.device_launches == whole.device_launches == {1: 2, 2: 2}


def test_per_device_sums_stay_exact_beyond_64_bits() -> None:
    """Sums of a (device, kind) group that pass 2^64 are exact, as the totals are."""
    big = (1 << 63) + 5
    rows = [copy(1, big, 1 << 62, device=d) for d in (0, 1, 1)]
    rows += [copy(2, 7, 3, device=0), sync(1, 1 << 63, device=1), sync(1, 1 << 63, device=1)]
    c = counted(rows)
    assert c.device_copies == {
        (0, "H2D"): CopyStats(1, big, 1, big, 1 << 62),
        (0, "D2H"): CopyStats(1, 7, 1, 7, 3),
        (1, "H2D"): CopyStats(2, 2 * big, 2, 2 * big, 1 << 63),
    }
    assert c.copies["H2D"] == CopyStats(3, 3 * big, 3, 3 * big, 3 << 62)
    assert (c.device_sync_count, c.device_sync_ns) == ({1: 2}, {1: 1 << 64})
    assert c.sync_ns == {"stream": 1 << 64}


def test_names_are_the_influxdb_contracts() -> None:
    """The core names what it cannot name as the stream app's contract spells it."""
    assert counting.UNKNOWN == m.UNKNOWN_API == m.UNKNOWN_KIND == m.UNKNOWN_SCOPE
    assert counting.HISTOGRAM_BUCKETS == m.HISTOGRAM_BUCKETS
    c = counted([copy(9, 1, 1), {"type": EventType.LAUNCH, "api": 199, "dim": [1] * 6}])
    assert set(c.copies) == {m.UNKNOWN_KIND}
    assert c.launches == {("runtime", m.UNKNOWN_API): 1}


# -- one stream, both paths ------------------------------------------------------------------


def test_the_trace_summary_and_the_stream_app_agree_on_every_shared_figure() -> None:
    events = synthetic_events(T0)
    summary = Summary()
    for part in np.array_split(events, 7):  # batches as the capture loop hands them
        summary.add(part)
    streams = figures_of_points(stream_points(events))
    trace = figures_of_summary(summary)
    assert trace == streams
    # Both are right, not just equal (the synthetic script's own numbers).
    assert trace["kernel launches"] == SYNTHETIC_KERNEL_LAUNCHES
    assert trace["captured into graphs"] == SYNTHETIC_CAPTURED == 24
    assert trace["graph launches"] == SYNTHETIC_GRAPH_LAUNCHES == 60
    assert trace["graph kernel nodes run"] == SYNTHETIC_GRAPH_KERNEL_NODES == 90
    failed = SYNTHETIC_FAILED
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


# -- under overload: what the kernel counted instead of recording ------------------------------

#: The kinds of event the kernel sheds under pressure (bpf/cudart.bpf.c gf_sheddable).
SHED_TYPES = (EventType.LAUNCH, EventType.GRAPH_LAUNCH, EventType.MEMCPY, EventType.MEMSET,
              EventType.SYNC)


def test_aggregates_count_every_figure_as_their_events_do() -> None:
    """Events the kernel counted in aggregates (by process, api, kernel, shape, kind, device,
    failure and 100 ms slot) rather than recorded count, in the trace summary and through the
    wire in the stream windows, exactly as the events would have: all of them, or some."""
    events = synthetic_events(T0)
    shed = events[np.isin(events["type"], SHED_TYPES) & ((events["flags"] & F_CAPTURED) == 0)]
    aggregates = aggregates_of(shed)
    assert len(aggregates) < len(shed) and aggregates["count"].max() > 1  # fewer rows
    recorded = Summary()
    recorded.add(shed)
    counted = Summary()
    counted.add_aggregates(aggregates)
    assert counted.counts == recorded.counts  # every field: shapes, kernels, devices, times
    assert counted.aggregated == len(shed) and counted.events == len(shed)
    # Part recorded, part counted, as under pressure: the same again, in both paths.
    kept = shed[::3]
    mixed = Summary()
    mixed.add(kept)
    mixed.add_aggregates(aggregates_of(np.delete(shed, np.s_[::3])))
    assert figures_of_summary(mixed) == figures_of_summary(recorded)
    streams = figures_of_points(stream_points(shed))
    assert figures_of_points(stream_points(shed[:0], aggregates=aggregates)) == streams
    assert figures_of_points(stream_points(
        kept, aggregates=aggregates_of(np.delete(shed, np.s_[::3])))) == streams
    assert streams == figures_of_summary(recorded)
    text = render(counted, "overloaded", wall_s=3.0, drops=0)
    assert f"events counted in the kernel: {len(shed):,}" in text
    assert figures_of_text(text) == text_figures_of_summary(recorded)


# -- one term, one meaning -------------------------------------------------------------------


TERMS = ("kernel launches", "captured into graphs", "graph launches", "graph kernel nodes run",
         "failed calls", "CPU blocked on the GPU", "in syncs", "in synchronous copies")


def test_the_trace_the_demo_the_report_and_grafana_use_the_same_words() -> None:
    summary = Summary()
    summary.add(synthetic_events(T0))
    trace = render(summary, "synthetic", wall_s=3.0, drops=0)
    job = report.JobSummary("train:1", 0, 1, window_s=1.0, active_windows=3, launches=600,
                            captured_launches=24, graph_launches=60, graph_kernel_nodes=90,
                            sync_ns=2 * S, copy_ns=S // 2, errors=52)
    shown = report.render_job(job)
    compared = report.render_compare(job, job)
    for term in TERMS:
        assert term in trace and term in shown and term in compared, term
    assert "CPU blocked on the GPU (% of active time)" in shown
    assert re.search(r"CPU blocked on the GPU \(% of active time\)\s+83\.3%", shown)  # 2.5/3
    assert re.search(r"^CPU blocked on the GPU in synchronous copies\s+0\.500 s$", shown,
                     re.MULTILINE)
    assert re.search(r"^graph kernel nodes run\s+90$", shown, re.MULTILINE)
    demo = showcase.comparison({mode: {**summary.as_dict(3.0), "top_grid": "-", "gpu_util": None}
                                for mode in showcase.MODES})
    assert "CPU blocked on the GPU (% of wall)" in demo
    share = f"{100 * summary.blocked_share(3.0):.1f}% of wall"
    assert share in trace and f"{100 * summary.blocked_share(3.0):.1f}%" in demo
    titles = [p["title"] for board in (generate.fleet(), generate.job())
              for p in board["panels"]]
    assert [t for t in titles if generate.BLOCKED_TERM in t] == [
        generate.BLOCKED_SHARE_TITLE, generate.DEVICE_BLOCKED_TITLE, generate.BLOCKED_PARTS_TITLE]
    assert generate.BLOCKED_TERM == "CPU blocked on the GPU"


# -- a real capture of CUDA graphs, both paths -----------------------------------------------
