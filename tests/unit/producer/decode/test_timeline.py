"""`--timeline`: the Perfetto trace parsed back with Perfetto's own protos — every event on
its thread's track at its time, calls with a duration as properly nested slices, waits marked,
requests on lanes with flows to their calls, aggregates counted."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import (
    AGGREGATE_DTYPE,
    API_IDS,
    F_ASYNC,
    F_HAS_RESULT,
    EventType,
)
from gpuflight.producer.decode.timeline import TimelineSink, request_flow
from tests.support.builders import T0, build_events, request_record

MS = 1_000_000


@dataclass
class _Answered:
    record: wire.RequestRecord


def _events() -> Any:
    launch = {"type": EventType.LAUNCH, "api": API_IDS["cudaLaunchKernel"], "flags": F_ASYNC,
              "dim": [64, 1, 1, 128, 1, 1], "handle": 0xA000, "stream": 7}
    return build_events([
        {**launch, "ts_ns": T0 + 1 * MS, "pid": 10, "tid": 11},
        {"type": EventType.MEMCPY, "api": API_IDS["cudaMemcpy"], "flags": F_HAS_RESULT,
         "ts_ns": T0 + 2 * MS, "duration_ns": 3 * MS, "bytes": 1 << 20,
         "dim": [1, 0, 0, 0, 0, 0], "pid": 10, "tid": 11},
        {**launch, "ts_ns": T0 + 6 * MS, "pid": 10, "tid": 12},
        {"type": EventType.SYNC, "api": API_IDS["cudaDeviceSynchronize"],
         "flags": F_HAS_RESULT, "ts_ns": T0 + 7 * MS, "duration_ns": 2 * MS, "pid": 10,
         "tid": 11},
        {**launch, "ts_ns": T0 + 8 * MS, "pid": 20, "tid": 20},
    ])


def _written(tmp_path: Path) -> tuple[Trace, TimelineSink]:
    path = tmp_path / "t.pftrace"
    sink = TimelineSink(path)
    events = _events()
    rid = np.zeros(len(events), dtype=np.uint64)
    rid[[0, 2]] = 5  # the first launches of pid 10 were made for request 5
    sink.write(events, wire.EventAttribution(rid, np.zeros(len(events), dtype=np.int64)))
    sink.write_requests(10, [
        _Answered(request_record(5, start_ns=T0, end_ns=T0 + 9 * MS)),
        _Answered(request_record(6, start_ns=T0 + 4 * MS, end_ns=T0 + 5 * MS)),  # overlaps 5
        _Answered(request_record(7, start_ns=T0 + 10 * MS, end_ns=T0 + 11 * MS)),
    ], {})
    aggregates = np.zeros(1, dtype=AGGREGATE_DTYPE)
    aggregates[0]["type"], aggregates[0]["api"] = EventType.LAUNCH, API_IDS["cudaLaunchKernel"]
    aggregates[0]["pid"], aggregates[0]["count"] = 20, 4000
    aggregates[0]["ts_ns"], aggregates[0]["last_ts_ns"] = T0 + 12 * MS, T0 + 13 * MS
    sink.write_aggregates(aggregates)
    sink.close()
    return Trace.FromString(path.read_bytes()), sink


def _args(event: TrackEvent) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in event.debug_annotations:
        out[a.name] = getattr(a, a.WhichOneof("value"))
    return out


def test_every_call_is_on_its_threads_track_at_its_time(tmp_path: Path) -> None:
    trace, sink = _written(tmp_path)
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet
              if p.HasField("track_descriptor")}
    threads = {(t.thread.pid, t.thread.tid): uuid for uuid, t in tracks.items()
               if t.HasField("thread")}
    assert set(threads) == {(10, 11), (10, 12), (20, 20)}
    processes = {t.process.pid for t in tracks.values() if t.HasField("process")}
    assert processes == {10, 20}
    assert all(tracks[threads[key]].parent_uuid in tracks for key in threads)
    starts = [(p.timestamp, p.track_event) for p in trace.packet if p.HasField("track_event")
              and p.track_event.type != TrackEvent.TYPE_SLICE_END
              and "cuda" in p.track_event.categories and p.track_event.track_uuid in
              set(threads.values())]
    got = sorted((ts - T0, e.name, e.type, e.track_uuid) for ts, e in starts)
    i, b = TrackEvent.TYPE_INSTANT, TrackEvent.TYPE_SLICE_BEGIN
    assert got == [
        (1 * MS, "cudaLaunchKernel", i, threads[(10, 11)]),
        (2 * MS, "cudaMemcpy", b, threads[(10, 11)]),
        (6 * MS, "cudaLaunchKernel", i, threads[(10, 12)]),
        (7 * MS, "cudaDeviceSynchronize", b, threads[(10, 11)]),
        (8 * MS, "cudaLaunchKernel", i, threads[(20, 20)]),
    ]
    assert sink.written == 5
    launch = next(e for _, e in starts if e.name == "cudaLaunchKernel")
    args = _args(launch)
    assert args["grid"] == "64x1x1" and args["block"] == "128x1x1" and args["stream"] == 7
    copy = next(e for _, e in starts if e.name == "cudaMemcpy")
    assert _args(copy)["bytes"] == 1 << 20 and _args(copy)["kind"] == "H2D"
    # The CPU waits in the sync and the synchronous copy; it only enqueues a launch.
    waits = {e.name for _, e in starts if "wait" in e.categories}
    assert waits == {"cudaMemcpy", "cudaDeviceSynchronize"}
    # All packets on one sequence, timestamps on the wall clock, tied to the trace's clock.
    assert {p.trusted_packet_sequence_id for p in trace.packet} == {1}
    (snapshot,) = [p.clock_snapshot for p in trace.packet if p.HasField("clock_snapshot")]
    assert {c.clock_id for c in snapshot.clocks} == {1, 6}  # REALTIME, BOOTTIME
    assert {p.timestamp_clock_id for p in trace.packet if p.HasField("track_event")} == {1}


def test_slices_nest_on_every_track(tmp_path: Path) -> None:
    trace, _ = _written(tmp_path)
    by_track: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for order, p in enumerate(trace.packet):
        if p.HasField("track_event") and p.track_event.type in (
                TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END):
            # Ends before begins at the same time, as a sorted trace reads them.
            end = p.track_event.type == TrackEvent.TYPE_SLICE_END
            by_track[p.track_event.track_uuid].append((p.timestamp, 0 if end else 1, order))
    durations = []
    for marks in by_track.values():
        depth, opened = 0, []
        for ts, begin, _ in sorted(marks):
            if begin:
                depth += 1
                opened.append(ts)
            else:
                depth -= 1
                assert depth >= 0
                durations.append(ts - opened.pop())
        assert depth == 0
    # Copy 3 ms, sync 2 ms; requests 9, 1 and 1 ms.
    assert sorted(durations) == [1 * MS, 1 * MS, 2 * MS, 3 * MS, 9 * MS]


def test_requests_are_on_lanes_with_flows_to_their_calls(tmp_path: Path) -> None:
    trace, sink = _written(tmp_path)
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet
              if p.HasField("track_descriptor")}
    begins = [(p.timestamp, p.track_event) for p in trace.packet if p.HasField("track_event")
              and "http" in p.track_event.categories]
    assert sink.requests_written == 3
    lanes = {e.track_uuid for _, e in begins}
    assert len(lanes) == 2  # 6 overlaps 5: a lane of its own; 7 comes after both
    assert all(tracks[lane].name == "HTTP requests" for lane in lanes)
    by_request = {_args(e)["request_id"]: (ts, e) for ts, e in begins}
    assert by_request[5][1].track_uuid == by_request[7][1].track_uuid
    assert by_request[5][1].name == "POST /v1/models/{id}"
    assert _args(by_request[5][1])["status"] == 200
    flow = request_flow(10, 5)
    assert list(by_request[5][1].flow_ids) == [flow]
    with_flow = Counter(p.timestamp - T0 for p in trace.packet if p.HasField("track_event")
                        and flow in p.track_event.flow_ids)
    assert with_flow == {0: 1, 1 * MS: 1, 6 * MS: 1}  # the request, and its two launches


def test_what_the_kernel_counted_instead_of_recording_is_an_instant_with_its_count(
        tmp_path: Path) -> None:
    trace, _ = _written(tmp_path)
    (shed,) = [p for p in trace.packet if p.HasField("track_event")
               and "counted" in p.track_event.name]
    assert shed.timestamp == T0 + 12 * MS
    assert shed.track_event.name.startswith("4000 x cudaLaunchKernel")
    assert _args(shed.track_event)["count"] == 4000


def test_nvmls_gauges_are_counter_tracks_per_gpu(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    sink = TimelineSink(path)
    for util, gpu in ((40, 0), (70, 0), (5, 1)):
        sink.add_gpu_samples([wire.GpuSample(
            gpu=gpu, uuid=None, name="NVIDIA H100", utilization_gpu_pct=util,
            utilization_memory_pct=None, memory_used_bytes=3 << 20, memory_total_bytes=None,
            power_w=None, temperature_c=None, sm_clock_mhz=None, pcie_rx_bytes_per_s=None,
            pcie_tx_bytes_per_s=None, processes=None)])
    sink.close()  # what came from NVML's thread is written by then
    trace = Trace.FromString(path.read_bytes())
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in trace.packet
             if p.HasField("track_descriptor") and p.track_descriptor.HasField("counter")}
    values: dict[str, list[float]] = defaultdict(list)
    for p in trace.packet:
        if p.HasField("track_event") and p.track_event.type == TrackEvent.TYPE_COUNTER:
            values[names[p.track_event.track_uuid]].append(p.track_event.double_counter_value)
    assert dict(values) == {"GPU 0 utilization %": [40.0, 70.0],
                            "GPU 0 memory used (MiB)": [3.0, 3.0],
                            "GPU 1 utilization %": [5.0], "GPU 1 memory used (MiB)": [3.0]}


def test_a_batch_numpy_packed_is_spooled_with_its_fields(tmp_path: Path) -> None:
    # np.concatenate (NumPy 2) drops struct gf_event's padding: the spool must lay it out again.
    events = _events()
    packed = np.concatenate([events[:2], events[2:]])
    assert packed.dtype.names == events.dtype.names
    path = tmp_path / "packed.pftrace"
    sink = TimelineSink(path)
    sink.write(packed)
    sink.close()
    calls = [(p.timestamp - T0, p.track_event.name, sorted(_args(p.track_event).items()))
             for p in Trace.FromString(path.read_bytes()).packet
             if p.HasField("track_event") and "cuda" in p.track_event.categories
             and p.track_event.type != TrackEvent.TYPE_SLICE_END]
    assert [(ts, name) for ts, name, _ in calls] == [
        (1 * MS, "cudaLaunchKernel"), (2 * MS, "cudaMemcpy"), (6 * MS, "cudaLaunchKernel"),
        (7 * MS, "cudaDeviceSynchronize"), (8 * MS, "cudaLaunchKernel")]
    assert ("bytes", 1 << 20) in calls[1][2] and ("grid", "64x1x1") in calls[0][2]
