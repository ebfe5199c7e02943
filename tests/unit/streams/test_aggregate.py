"""Window aggregates: exact sums on hand-made events, histograms, top kernels, merging,
plain-dict round trips, points against the InfluxDB contract, and the memory ledger."""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import (
    API_IDS,
    EVENT_DTYPE,
    F_ASYNC,
    F_BYTES_KNOWN,
    F_CAPTURED,
    F_HAS_RESULT,
    EventType,
)
from gpuflight.producer.contract.counting import CopyStats
from gpuflight.streams import measurements as m
from gpuflight.streams.aggregate import (
    MAX_PIDS,
    MemoryLedger,
    MemoryLevel,
    StaleWindowError,
    WindowAggregate,
    add_events,
    bucket_of,
    gpu_points,
    kernel_key,
    lost_points,
    merge,
    percentile,
    pipeline_point,
    split_windows,
    to_points,
    top_kernels,
)
from tests.support.builders import T0, stamped_events

Events = npt.NDArray[np.void]
DONE = {"flags": F_HAS_RESULT, "result": 0}


def launch(grid: tuple[int, int, int], block: tuple[int, int, int], fn: int = 0xA0,
           api: str = "cudaLaunchKernel", **kw: Any) -> dict[str, Any]:
    return {"type": EventType.LAUNCH, "api": API_IDS[api], "handle": fn,
            "dim": [*grid, *block], **kw}


def copy(kind: int, nbytes: int, ns: int = 0, api: str = "cudaMemcpy", **kw: Any) -> dict[str, Any]:
    row = {"type": EventType.MEMCPY, "api": API_IDS[api], "bytes": nbytes,
           "dim": [kind, 0, 0, 0, 0, 0]}
    row.update({"duration_ns": ns, **DONE} if "Async" not in api else {"flags": F_ASYNC})
    return {**row, **kw}


def alloc(ptr: int, nbytes: int, **kw: Any) -> dict[str, Any]:
    return {"type": EventType.ALLOC, "api": API_IDS["cudaMalloc"], "handle": ptr,
            "bytes": nbytes, "dim": [1, 0, 0, 0, 0, 0], **DONE, **kw}


def free(ptr: int, nbytes: int | None, **kw: Any) -> dict[str, Any]:
    known = {} if nbytes is None else {"bytes": nbytes, "flags": F_HAS_RESULT | F_BYTES_KNOWN}
    return {"type": EventType.FREE, "api": API_IDS["cudaFree"], "handle": ptr, **DONE,
            **known, **kw}


def sync(scope: int, ns: int, **kw: Any) -> dict[str, Any]:
    api = {1: "cudaStreamSynchronize", 2: "cudaDeviceSynchronize", 3: "cudaEventSynchronize"}
    return {"type": EventType.SYNC, "api": API_IDS[api.get(scope, "cudaStreamSynchronize")],
            "duration_ns": ns, "dim": [scope, 0, 0, 0, 0, 0], **DONE, **kw}


def aggregate(events: Events, max_kernels: int = 256, **kw: Any) -> WindowAggregate:
    agg = WindowAggregate(0, "node1", "job1", max_kernels=max_kernels)
    add_events(agg, events, **kw)
    return agg


def mixed(n: int, seed: int, kernels: int = 40) -> Events:
    """A time-ordered stream of every event type, two pids, many kernels."""
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["ts_ns"] = T0 + np.cumsum(rng.integers(1, 1000, n))
    ev["pid"] = rng.choice([100, 200], n)
    ev["device"] = rng.choice([0, 1, 3], n)
    types = rng.choice([1, 1, 1, 1, 2, 2, 3, 4, 5, 6, 7], n)
    ev["type"] = types
    ev["api"] = API_IDS["cudaLaunchKernel"]
    ev["handle"] = 0x1000 + 0x10 * rng.integers(0, kernels, n)
    ev["dim"] = np.column_stack([rng.integers(0, 5000, n), rng.integers(1, 3, n),
                                 np.ones(n), rng.integers(1, 1025, n), np.ones(n), np.ones(n)])
    ev["bytes"] = rng.integers(0, 1 << 22, n)
    ev["duration_ns"] = rng.integers(0, 100_000, n)
    ev["flags"] = np.where(types == 1, 0, F_HAS_RESULT)
    ev["result"] = np.where(rng.random(n) < 0.05, 2, 0) * (types != 1)
    is_copy = types == 2
    ev["flags"][is_copy & (rng.random(n) < 0.5)] = F_ASYNC
    ev["dim"][is_copy, 0] = rng.integers(0, 6, int(is_copy.sum()))  # 5: an unknown kind
    ev["dim"][types == 6, 0] = rng.integers(1, 4, int((types == 6).sum()))
    frees = types == 5
    ev["handle"][frees] = rng.integers(0, 3, int(frees.sum()))  # some null pointers
    ev["flags"][frees & (rng.random(n) < 0.7)] |= F_BYTES_KNOWN
    return ev


# -- exact values ----------------------------------------------------------------------------


def test_hand_made_window_adds_up_exactly() -> None:
    events = stamped_events([
        launch((40, 1, 1), (256, 1, 1)),
        launch((40, 1, 1), (256, 1, 1)),
        launch((4096, 2, 1), (128, 2, 1), fn=0xB0, api="cudaLaunchKernel_ptsz"),
        {"type": EventType.GRAPH_LAUNCH, "api": API_IDS["cudaGraphLaunch"], "handle": 0x99},
        copy(1, 12_000_000, 1_000_000),                        # H2D, synchronous
        copy(1, 4_000, 0, result=35),                          # H2D, failed: moved nothing
        copy(2, 1 << 20, api="cudaMemcpyAsync"),               # D2H, async
        copy(9, 10, 5),                                        # an unknown kind
        {"type": EventType.MEMSET, "api": API_IDS["cudaMemsetAsync"], "bytes": 64,
         "flags": F_ASYNC},
        alloc(0x1, 100),
        alloc(0x2, 50),
        alloc(0x0, 1 << 40, result=2),                         # out of memory
        free(0x1, 100),
        free(0x7, None),                                       # allocated before capture
        free(0x0, None),                                       # cudaFree(NULL): not a free
        alloc(0x3, 20),
        sync(2, 2_000_000),
        sync(1, 300),
        sync(1, 700, result=4),                                # failed, but the CPU waited
        sync(7, 5),                                            # an unknown scope
    ])
    events[3]["pid"] = 11
    agg = aggregate(events)
    assert agg.events == 20
    assert agg.launches == {("runtime", "cudaLaunchKernel"): 2,
                            ("runtime", "cudaLaunchKernel_ptsz"): 1,
                            ("runtime", "cudaGraphLaunch"): 1}
    assert agg.kernels == {"function@0xa0": 2, "function@0xb0": 1}
    assert (agg.kernel_launches, agg.all_launches) == (3, 4)
    assert agg.grid_blocks[5] == 2 and agg.grid_blocks[13] == 1 and sum(agg.grid_blocks) == 3
    assert agg.block_threads[8] == 3 and sum(agg.block_threads) == 3
    assert agg.threads_launched == 2 * 40 * 256 + 8192 * 256
    # The failed copy is a failed call of cudaMemcpy, not a copy (the one counting rule).
    assert agg.copies == {
        "H2D": CopyStats(count=1, bytes=12_000_000, sync_count=1, sync_bytes=12_000_000,
                          sync_ns=1_000_000),
        "D2H": CopyStats(count=1, bytes=1 << 20),
        "unknown": CopyStats(count=1, bytes=10, sync_count=1, sync_bytes=10, sync_ns=5),
    }
    assert agg.copies["H2D"].sync_bandwidth == 12e9
    assert (agg.memset_count, agg.memset_bytes) == (1, 64)
    assert (agg.alloc_count, agg.alloc_bytes, agg.free_count, agg.free_bytes) == (3, 170, 2, 100)
    assert (agg.memory_net_bytes, agg.memory_peak_rise_bytes) == (70, 150)
    assert agg.sync_count == {"device": 1, "stream": 2, "unknown": 1}
    assert agg.sync_ns == {"device": 2_000_000, "stream": 1000, "unknown": 5}
    assert agg.errors == {"cudaMemcpy": 1, "cudaMalloc": 1, "cudaStreamSynchronize": 1}
    assert agg.pids == {10, 11}
    assert agg.copy_sync_ns == 1_000_005
    assert agg.host_device_bytes == 12_000_000 + (1 << 20)


def test_kernel_names_replace_addresses_when_known() -> None:
    events = stamped_events([launch((1, 1, 1), (32, 1, 1), fn=0xA0),
                             launch((1, 1, 1), (32, 1, 1), fn=0xB0)])
    agg = aggregate(events, kernel_names={0xA0: "gemm_kernel"})
    assert agg.kernels == {"gemm_kernel": 1, "function@0xb0": 1}
    assert kernel_key(0xBEEF) == "function@0xbeef"


def test_captured_launches_ran_nothing_and_graph_launches_count_their_kernels() -> None:
    graph = {"type": EventType.GRAPH_LAUNCH, "api": API_IDS["cudaGraphLaunch"], "handle": 0xE0}
    agg = aggregate(stamped_events([
        launch((4, 1, 1), (64, 1, 1), flags=F_CAPTURED),
        launch((4, 1, 1), (64, 1, 1), flags=F_CAPTURED),
        launch((8, 1, 1), (32, 1, 1)),
        {**graph, "dim": [2, 0, 0, 0, 0, 0]},
        {**graph, "dim": [2, 0, 0, 0, 0, 0]},
        graph,  # an exec instantiated before capture started: nodes unknown
    ]))
    assert agg.captured == 2 and agg.kernel_launches == 1
    assert agg.launches == {("runtime", "cudaLaunchKernel"): 1,
                            ("runtime", "cudaGraphLaunch"): 3}
    assert agg.graph_kernel_nodes == {("runtime", "cudaGraphLaunch"): 4}
    assert sum(agg.grid_blocks) == 1 and agg.grid_blocks[3] == 1
    back = WindowAggregate.from_dict(orjson.loads(orjson.dumps(agg.to_dict())))
    assert back == agg
    points = {(p.measurement, p.tags.get("api")): p.fields for p in to_points(agg, 10.0)}
    assert points["launches", "cudaGraphLaunch"][m.Fields.GRAPH_KERNEL_NODES] == 4
    assert m.Fields.GRAPH_KERNEL_NODES not in points["launches", "cudaLaunchKernel"]
    shape = points["launch_shape", None]
    assert shape[m.Fields.LAUNCHES] == 1 and shape[m.Fields.CAPTURED_LAUNCHES] == 2


def test_memory_peak_follows_time_not_array_order() -> None:
    events = stamped_events([free(0x1, 100), alloc(0x2, 30), alloc(0x1, 100)])
    events["ts_ns"] = [T0 + 3, T0 + 2, T0 + 1]  # the allocation of 0x1 came first
    agg = aggregate(events)
    assert (agg.memory_net_bytes, agg.memory_peak_rise_bytes) == (30, 130)


def test_empty_batch_changes_nothing() -> None:
    agg = aggregate(np.zeros(0, dtype=EVENT_DTYPE))
    assert agg == WindowAggregate(0, "node1", "job1")


# -- histograms and percentiles --------------------------------------------------------------


def test_histogram_bucket_edges() -> None:
    values = [0, 1, 2, 3, 4, 7, 8, 1 << 31]
    agg = aggregate(stamped_events([launch((v, 1, 1), (v, 1, 1)) for v in values]))
    expected = [0, 0, 1, 1, 2, 2, 3, 31]
    assert [bucket_of(v) for v in values] == expected
    for counts in (agg.grid_blocks, agg.block_threads):
        assert {i: n for i, n in enumerate(counts) if n} == {0: 2, 1: 2, 2: 2, 3: 1, 31: 1}
    assert (bucket_of((1 << 63) - 1), bucket_of(1 << 63), bucket_of(1 << 70)) == (62, 63, 63)


def test_histogram_is_exact_where_floats_round() -> None:
    # (2^27-1)(2^27+1) = 2^54-1 rounds up to 2^54 as a float; (2^31-1)^2 is just below 2^62.
    for grid, bucket in ((((1 << 27) - 1, (1 << 27) + 1, 1), 53), ((0x7FFF_FFFF,) * 2 + (1,), 61)):
        agg = aggregate(stamped_events([launch(grid, (1, 1, 1))]))
        assert {i: n for i, n in enumerate(agg.grid_blocks) if n} == {bucket: 1}
        assert agg.threads_launched == grid[0] * grid[1]
        assert bucket_of(grid[0] * grid[1]) == bucket


def test_invalid_huge_launches_saturate_and_stay_exact() -> None:
    big = (0xFFFF_FFFF, 0xFFFF_FFFF, 0xFFFF_FFFF)  # garbage from a failing launch
    agg = aggregate(stamped_events([launch(big, big), launch((2, 1, 1), (64, 1, 1))]))
    assert agg.grid_blocks[63] == 1 and agg.block_threads[63] == 1
    assert agg.grid_blocks[1] == 1 and agg.block_threads[6] == 1
    assert agg.threads_launched == (0xFFFF_FFFF ** 3) ** 2 + 128


def test_percentiles_interpolate_log_linearly_within_a_bucket() -> None:
    empty = [0] * m.HISTOGRAM_BUCKETS
    assert percentile(empty, 0.5) is None
    at_256 = list(empty)
    at_256[8] = 10  # ten launches of 256..511 (e.g. all 256)
    assert percentile(at_256, 0.5) == pytest.approx(2 ** 8.5)
    assert percentile(at_256, 0.9) == pytest.approx(2 ** 8.9)
    assert percentile(at_256, 0.0) == 256.0
    assert percentile(at_256, 1.0) == 511.0  # never past the bucket's last integer
    two = list(empty)
    two[4], two[10] = 5, 5
    assert percentile(two, 0.5) == 31.0  # the top of bucket 4
    assert percentile(two, 0.9) == pytest.approx(2 ** 10.8)
    assert percentile(two, 0.99) == pytest.approx(2 ** 10.98)
    ones = list(empty)
    ones[0] = 3
    assert percentile(ones, 0.5) == 1.0
    with pytest.raises(ValueError):
        percentile(two, 1.5)


# -- top kernels -----------------------------------------------------------------------------


def test_kernel_keys_are_bounded_and_counts_preserved() -> None:
    rng = np.random.default_rng(3)
    functions = rng.integers(0, 1000, 5000)
    events = stamped_events([launch((1, 1, 1), (32, 1, 1), fn=int(f)) for f in functions[:50]])
    agg = aggregate(events, max_kernels=8)
    big = np.zeros(5000, dtype=EVENT_DTYPE)
    big["type"] = EventType.LAUNCH
    big["handle"] = functions
    add_events(agg, big)
    assert len(agg.kernels) == 8
    assert agg.kernel_launches == 5050
    everything = {kernel_key(int(f)) for f in functions}
    expected = sorted(everything, key=lambda k: (zlib.crc32(k.encode()), k))[:8]
    assert sorted(agg.kernels) == sorted(expected)
    for key in expected:
        function = int(key.removeprefix("function@"), 16)
        seen = np.count_nonzero(functions[:50] == function)
        seen += np.count_nonzero(functions == function)
        assert agg.kernels[key] == seen
    shown = top_kernels(agg, top=3)
    assert len(shown) == 4 and shown[-1][0] == m.OTHER_KERNEL
    assert sum(n for _, n in shown) == 5050
    counts = [n for _, n in shown[:3]]
    assert counts == sorted(counts, reverse=True)
    points = [p for p in to_points(agg, 10.0, top=3) if p.measurement == m.KERNELS.name]
    assert len(points) == 4


def test_kernel_folding_ignores_order_and_splitting() -> None:
    rng = np.random.default_rng(5)
    events = np.zeros(3000, dtype=EVENT_DTYPE)
    events["type"] = EventType.LAUNCH
    events["handle"] = rng.integers(0, 200, 3000)
    whole = aggregate(events, max_kernels=16)
    shuffled = aggregate(events[rng.permutation(3000)], max_kernels=16)
    pieces = WindowAggregate(0, "node1", "job1", max_kernels=16)
    for part in np.array_split(events, 7):
        add_events(pieces, part)
    assert whole.kernels == shuffled.kernels == pieces.kernels
    assert whole.kernels_other == shuffled.kernels_other == pieces.kernels_other


def test_no_other_when_everything_fits() -> None:
    agg = aggregate(stamped_events([launch((1, 1, 1), (1, 1, 1), fn=f) for f in (1, 2, 2)]))
    assert top_kernels(agg) == [("function@0x2", 2), ("function@0x1", 1)]


# -- merging ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_merge_is_associative_and_equals_aggregating_at_once(seed: int) -> None:
    events = mixed(3000, seed)
    whole = aggregate(events, max_kernels=12)
    a, b, c = (aggregate(part, max_kernels=12) for part in np.array_split(events, [700, 1900]))
    left = merge(merge(a, b), c)
    right = merge(a, merge(b, c))
    assert left == right == whole
    assert whole.kernels_other > 0 and whole.errors and whole.memory_peak_rise_bytes > 0


def test_merge_does_not_change_its_inputs_and_checks_keys() -> None:
    events = mixed(500, 9)
    a = aggregate(events[:200])
    before = a.to_dict()
    merge(a, aggregate(events[200:]))
    assert a.to_dict() == before
    with pytest.raises(ValueError, match="cannot merge"):
        merge(a, WindowAggregate(10, "node1", "job1"))
    with pytest.raises(ValueError, match="cannot merge"):
        merge(a, WindowAggregate(0, "node1", "job2"))


def test_pids_are_bounded() -> None:
    events = np.zeros(MAX_PIDS + 10, dtype=EVENT_DTYPE)
    events["pid"] = np.arange(MAX_PIDS + 10)[::-1]
    agg = aggregate(events)
    assert agg.processes == MAX_PIDS and max(agg.pids) == MAX_PIDS - 1


# -- plain dicts -----------------------------------------------------------------------------


def test_dict_round_trip_through_json() -> None:
    agg = aggregate(mixed(2000, 4), max_kernels=10)
    data = orjson.loads(orjson.dumps(agg.to_dict()))
    back = WindowAggregate.from_dict(data)
    assert back == agg
    assert back.to_dict() == agg.to_dict()
    empty = WindowAggregate(5, "h", "j")
    assert WindowAggregate.from_dict(orjson.loads(orjson.dumps(empty.to_dict()))) == empty


def test_malformed_dicts_are_value_errors() -> None:
    good = aggregate(mixed(100, 4)).to_dict()
    with pytest.raises(ValueError, match="version"):
        WindowAggregate.from_dict({**good, "v": 99})
    for broken in ({**good, "memory": [1, 2]}, {**good, "copies": {"H2D": "x"}},
                   {k: v for k, v in good.items() if k != "host"},
                   {**good, "grid_blocks": [1] * 65}):
        with pytest.raises(ValueError):
            WindowAggregate.from_dict(broken)


# -- points ----------------------------------------------------------------------------------


def test_points_follow_the_contract() -> None:
    agg = aggregate(mixed(3000, 6), max_kernels=50)
    points = to_points(agg, 10.0, memory=MemoryLevel(live_bytes=5, peak_live_bytes=9))
    assert {p.measurement for p in points} == {
        "launches", "kernels", "grid_blocks", "block_threads", "launch_shape", "copies",
        "memset", "memory", "syncs", "cpu_blocked", "errors", "devices"}
    for point in points:
        assert point.measurement in m.ALL
        assert m.problems(point) == []
        assert point.time_ns == agg.window_start_ns


def test_point_values() -> None:
    events = stamped_events([
        launch((256, 1, 1), (128, 1, 1)),
        launch((256, 1, 1), (128, 1, 1)),
        copy(1, 8_000_000, 2_000_000),
        copy(1, 2_000_000, api="cudaMemcpyAsync"),
        sync(1, 500_000_000),
        alloc(0x1, 1000),
    ])
    agg = WindowAggregate(T0, "node1", "job1")
    add_events(agg, events)
    points = {(p.measurement, tuple(sorted(p.tags.items()))): p for p in to_points(agg, 2.0)}
    job = (("host", "node1"), ("job", "job1"))
    launches = points[("launches", (("api", "cudaLaunchKernel"), *job, ("layer", "runtime")))]
    assert launches.fields == {"count": 2, "rate_per_s": 1.0}
    assert launches.time_ns == T0
    shape = points[("launch_shape", job)].fields
    assert shape["launches"] == 2
    launched_at = [int(e["ts_ns"]) - T0 for e in events if e["type"] == EventType.LAUNCH]
    assert (shape["first_launch_offset_ns"], shape["last_launch_offset_ns"]) == (
        min(launched_at), max(launched_at))
    assert shape["threads_per_s"] == 2 * 256 * 128 / 2.0
    assert shape["p50_grid_blocks"] == pytest.approx(2 ** 8.5)
    assert shape["p99_block_threads"] == pytest.approx(2 ** 7.99)
    h2d = points[("copies", (*job, ("kind", "H2D")))].fields
    assert h2d == {"count": 2, "bytes": 10_000_000, "bytes_per_s": 5e6, "sync_count": 1,
                   "sync_bytes": 8_000_000, "sync_ns": 2_000_000,
                   "bandwidth_bytes_per_s": 4e9}
    blocked = points[("cpu_blocked", job)].fields
    assert blocked == {"sync_ns": 500_000_000, "copy_ns": 2_000_000,
                       "blocked_share": 502_000_000 / 2e9, "processes": 1}
    memory = points[("memory", job)].fields
    assert memory == {"alloc_count": 1, "alloc_bytes": 1000, "free_count": 0, "free_bytes": 0}
    assert points[("grid_blocks", (("bucket", "2^8"), *job))].fields == {"count": 2}
    assert ("copies", (*job, ("kind", "D2H"))) not in points


def test_device_points_split_the_window_by_the_callers_device() -> None:
    events = stamped_events([
        launch((1, 1, 1), (32, 1, 1), device=0),
        launch((1, 1, 1), (32, 1, 1), device=1),
        launch((1, 1, 1), (32, 1, 1), device=1),
        launch((1, 1, 1), (32, 1, 1), device=1, flags=F_CAPTURED),  # ran nothing
        {"type": EventType.GRAPH_LAUNCH, "api": API_IDS["cudaGraphLaunch"], "device": 1},
        copy(1, 1000, 10, device=0),                                 # H2D, synchronous
        copy(1, 4000, 0, result=35, device=0),                       # failed: moved nothing
        copy(3, 64, api="cudaMemcpyAsync", device=1),               # a peer copy: D2D
        copy(2, 500, 20, device=1),                                  # D2H, synchronous
        copy(9, 7, 3, device=1),                                     # an unknown kind
        sync(1, 300, device=1),
        sync(2, 700, result=4, device=0),                           # failed, the CPU waited
        alloc(0x1, 100, device=1),                                   # not per device
    ])
    agg = aggregate(events)
    assert agg.device_launches == {0: 1, 1: 2}
    assert agg.devices == [0, 1]
    assert agg.device_copy_stats(1) == {
        "D2D": CopyStats(count=1, bytes=64),
        "D2H": CopyStats(count=1, bytes=500, sync_count=1, sync_bytes=500, sync_ns=20),
        "unknown": CopyStats(count=1, bytes=7, sync_count=1, sync_bytes=7, sync_ns=3),
    }
    assert (agg.device_sync_count, agg.device_sync_ns) == ({0: 1, 1: 1}, {0: 700, 1: 300})
    assert (agg.device_blocked_ns(0), agg.device_blocked_ns(1)) == (710, 323)
    points = {p.tags["device"]: p for p in to_points(agg, 2.0) if p.measurement == "devices"}
    assert points["0"].fields == {"launches": 1, "rate_per_s": 0.5, "copies": 1, "bytes": 1000,
                                  "h2d_bytes": 1000, "syncs": 1, "sync_ns": 700, "copy_ns": 10}
    assert points["1"].fields == {"launches": 2, "rate_per_s": 1.0, "copies": 3, "bytes": 571,
                                  "d2d_bytes": 64, "d2h_bytes": 500, "unknown_bytes": 7,
                                  "syncs": 1, "sync_ns": 300, "copy_ns": 23}
    assert set(points) == {"0", "1"} and points["1"].tags == {
        "host": "node1", "job": "job1", "device": "1"}


@pytest.mark.parametrize("seed", [1, 5])
def test_device_points_sum_to_the_jobs_totals(seed: int) -> None:
    agg = aggregate(mixed(3000, seed))
    assert len(agg.devices) == 3
    devices = [p.fields for p in to_points(agg, 10.0) if p.measurement == "devices"]

    def total(name: str) -> int:
        return sum(int(f.get(name, 0)) for f in devices)

    assert total("launches") == agg.kernel_launches
    assert total("copies") == sum(c.count for c in agg.copies.values())
    assert total("bytes") == sum(c.bytes for c in agg.copies.values())
    for kind, c in agg.copies.items():
        assert total(m.BYTES_OF_KIND[kind]) == c.bytes
    assert total("syncs") == sum(agg.sync_count.values())
    assert total("sync_ns") == agg.total_sync_ns
    assert total("copy_ns") == agg.copy_sync_ns


def test_devices_out_of_range_are_one_other_series() -> None:
    agg = aggregate(stamped_events([launch((1, 1, 1), (32, 1, 1), device=d)
                                    for d in (-1, 3, 300, 300)]))
    points = {p.tags["device"]: p.fields["launches"] for p in to_points(agg, 1.0)
              if p.measurement == "devices"}
    assert points == {"3": 1, m.OTHER_DEVICE: 3}
    assert [m.device_label(d) for d in (0, 255, 256, -1)] == ["0", "255", "other", "other"]


def test_an_older_workers_window_has_its_work_on_device_0() -> None:
    """A window open across the upgrade (no per-device counts kept in the table) counts as
    device 0, as the wire has an older producer's events."""
    agg = aggregate(mixed(1000, 3))
    old = {k: v for k, v in agg.to_dict().items()
           if k not in ("device_launches", "device_copies", "device_syncs")}
    back = WindowAggregate.from_dict(old)
    assert back.devices == [0]
    assert back.device_launches == {0: agg.kernel_launches}
    assert back.device_copy_stats(0) == agg.copies
    assert back.device_sync_ns == {0: agg.total_sync_ns}
    (point,) = [p for p in to_points(back, 1.0) if p.measurement == "devices"]
    assert point.tags["device"] == "0" and point.fields["launches"] == agg.kernel_launches


def test_async_only_copies_have_no_bandwidth() -> None:
    agg = aggregate(stamped_events([copy(2, 100, api="cudaMemcpyAsync")]))
    (point,) = [p for p in to_points(agg, 1.0) if p.measurement == "copies"]
    assert "bandwidth_bytes_per_s" not in point.fields


def test_contract_checks_catch_mistakes() -> None:
    good = m.Point("memset", {"host": "h", "job": "j"}, {"count": 1, "bytes": 2}, 0)
    m.validate(good)
    assert m.problems(m.Point("nope", {}, {"x": 1}, 0)) == ["unknown measurement 'nope'"]
    bad = m.Point("memset", {"host": "h"}, {"count": 1.0, "colour": 2}, 0)
    found = m.problems(bad)
    assert len(found) == 3
    with pytest.raises(ValueError, match="not finite"):
        m.validate(m.Point("launches", {"host": "h", "job": "j", "layer": "l", "api": "a"},
                           {"rate_per_s": math.inf}, 0))
    assert m.bucket_label(5) == "2^5"
    with pytest.raises(ValueError):
        m.bucket_label(64)
    for spec in m.ALL.values():
        assert len(spec.field_names) == len(spec.fields)
        assert len(set(spec.tags)) == len(spec.tags)


# -- the memory ledger -----------------------------------------------------------------------


def window(start: int, rows: list[dict[str, Any]], job: str = "job1") -> WindowAggregate:
    agg = WindowAggregate(start, "node1", job)
    add_events(agg, stamped_events(rows))
    return agg


def test_memory_ledger_carries_live_bytes_across_windows() -> None:
    ledger = MemoryLedger()
    first = window(0, [alloc(0x1, 100), alloc(0x2, 50), free(0x1, 100)])
    assert ledger.close(first) == MemoryLevel(live_bytes=50, peak_live_bytes=150)
    second = window(10, [free(0x2, 50), alloc(0x3, 10)])
    assert ledger.close(second) == MemoryLevel(live_bytes=10, peak_live_bytes=50)
    quiet = window(20, [launch((1, 1, 1), (1, 1, 1))])
    assert ledger.close(quiet) == MemoryLevel(live_bytes=10, peak_live_bytes=10)
    # A replay of the latest window gives the same answer; an older one is refused.
    assert ledger.close(quiet) == MemoryLevel(live_bytes=10, peak_live_bytes=10)
    with pytest.raises(StaleWindowError):
        ledger.close(second)
    other = window(20, [alloc(0x9, 7)], job="job2")
    assert ledger.close(other) == MemoryLevel(live_bytes=7, peak_live_bytes=7)
    restored = MemoryLedger.from_dict(orjson.loads(orjson.dumps(ledger.to_dict())))
    later = window(30, [alloc(0x4, 5)])
    assert restored.close(later) == ledger.close(later) == MemoryLevel(15, 15)
    assert ledger.live_bytes("node1", "job2") == 7
    assert ledger.expire(older_than_ns=25) == [("node1", "job2")]
    assert ledger.live_bytes("node1", "job2") is None
    ledger.forget("node1", "job1")
    assert ledger.live_bytes("node1", "job1") is None


def test_memory_ledger_never_goes_below_zero() -> None:
    ledger = MemoryLedger()
    # Freed memory the stream app never saw allocated (it started later).
    assert ledger.close(window(0, [free(0x1, 500), alloc(0x2, 100)])) == MemoryLevel(0, 0)
    assert ledger.close(window(10, [alloc(0x3, 30)])) == MemoryLevel(30, 30)


def test_ledger_level_joins_the_memory_point() -> None:
    agg = window(0, [alloc(0x1, 100)])
    level = MemoryLedger().close(agg)
    (point,) = [p for p in to_points(agg, 1.0, memory=level) if p.measurement == "memory"]
    assert point.fields["live_bytes"] == 100 and point.fields["peak_live_bytes"] == 100


# -- windows ---------------------------------------------------------------------------------


def test_split_windows() -> None:
    events = stamped_events([launch((1, 1, 1), (1, 1, 1)) for _ in range(5)])
    events["ts_ns"] = [105, 99, 230, 100, 101]
    parts = split_windows(events, 100)
    assert [(start, part["ts_ns"].tolist()) for start, part in parts] == [
        (0, [99]), (100, [105, 100, 101]), (200, [230])]
    assert split_windows(events[:1], 1000) == [(0, events[:1])]
    assert split_windows(events[:0], 1000) == []
    with pytest.raises(ValueError):
        split_windows(events, 0)


# -- the other topics ------------------------------------------------------------------------


def test_gpu_points_sum_processes_per_job() -> None:
    gpu = wire.GpuSample(
        gpu=0, uuid="GPU-1", name="H200", utilization_gpu_pct=87, utilization_memory_pct=40,
        memory_used_bytes=5 << 30, memory_total_bytes=141 << 30, power_w=412, temperature_c=61,
        sm_clock_mhz=1980, pcie_rx_bytes_per_s=None, pcie_tx_bytes_per_s=1024,
        processes=(
            wire.GpuProcessSample(1, 30, 10, 1 << 30),
            wire.GpuProcessSample(2, 50, None, 2 << 30),
            wire.GpuProcessSample(3, None, None, None),
        ),
    )
    silent = wire.GpuSample(1, *[None] * 12)
    jobs = {1: "train", 2: "train"}
    points = gpu_points(wire.NvmlRecord("node1", 7, (gpu, silent)), jobs.get)
    for point in points:
        assert m.problems(point) == []
    gpus, train, unknown = points
    assert gpus.tags == {"host": "node1", "gpu": "0"}
    assert gpus.fields["power_w"] == 412.0 and "pcie_rx_bytes_per_s" not in gpus.fields
    assert set(gpus.fields) == set(m.GPU.field_names) - {"pcie_rx_bytes_per_s"}
    assert train.tags == {"host": "node1", "gpu": "0", "job": "train"}
    assert train.fields == {"processes": 2, "sm_util_pct": 80, "mem_util_pct": 10,
                            "used_memory_bytes": 3 << 30}
    assert unknown.tags["job"] == "unknown" and unknown.fields == {"processes": 1}


def metrics_record(kernel: dict[int, int], user: dict[int, int]) -> wire.MetricsRecord:
    return wire.MetricsRecord(
        host="node1", ts_ns=9, uptime_s=3.5, captured=10, produced=9, published=8,
        dropped_kernel=sum(kernel.values()), dropped_kernel_by_pid=kernel,
        dropped_user=sum(user.values()), dropped_user_by_pid=user, queue_messages=2,
        libraries_attached=1, requests=6, http_records_lost=1)


def test_pipeline_point() -> None:
    point = pipeline_point(metrics_record({}, {4: 1}))
    assert m.problems(point) == []
    assert point.fields == {"captured": 10, "produced": 9, "published": 8, "dropped_kernel": 0,
                            "dropped_user": 1, "dropped_agent_died": 0, "queue_messages": 2,
                            "requests": 6,
                            "http_records_lost": 1}
    assert set(point.fields) == set(m.PIPELINE.field_names)
    assert (point.tags, point.time_ns) == ({"host": "node1"}, 9)


def test_lost_events_are_summed_per_job_of_the_pids() -> None:
    record = metrics_record({11: 50, 12: 20, 13: 0}, {12: 3, 14: 2})
    jobs = {11: "train", 12: "train", 13: "eval"}
    points = lost_points(record, lambda pid: jobs.get(pid, f"unknown:{pid}"))
    assert all(m.problems(p) == [] for p in points)
    assert {p.tags["job"]: dict(p.fields) for p in points} == {
        "train": {"dropped_kernel": 70, "dropped_user": 3, "dropped_agent_died": 0},
        "unknown:14": {"dropped_kernel": 0, "dropped_user": 2, "dropped_agent_died": 0},
    }
    died = dataclasses.replace(record, dropped_agent_died=9,
                               dropped_agent_died_by_pid={13: 5, 15: 4})
    assert {p.tags["job"]: dict(p.fields) for p in lost_points(
        died, lambda pid: jobs.get(pid, f"unknown:{pid}"))}["eval"] == {
        "dropped_kernel": 0, "dropped_user": 0, "dropped_agent_died": 5}
    assert {p.time_ns for p in points} == {9} and {p.tags["host"] for p in points} == {"node1"}
    assert lost_points(metrics_record({}, {}), lambda pid: "x") == []
