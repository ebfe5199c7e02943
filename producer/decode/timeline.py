"""`--timeline FILE`: the events as a Perfetto trace, written as they come (streamed).

Written with Perfetto's own Python builder and protos (`perfetto.trace_builder`): open it in
https://ui.perfetto.dev or trace_processor. One track per process and per thread that made a
CUDA call; each call a slice on its thread, with its CPU-side duration where the probe saw it
return (copies, syncs, allocations, graph capture and instantiation), an instant where it did
not (launches, asynchronous copies and memsets: the CPU only enqueued them). Its arguments are
the event's fields (kernel, grid, block, bytes, device, stream, result...). The waits — syncs
and synchronous copies, where the CPU sits until the GPU is done — are in category `wait`.
HTTP requests (with the HTTP capture) are slices of their own on the process's "HTTP requests"
tracks (lanes, so that overlapping requests do not nest), each with a flow to every call made
for it. Events the kernel counted under overload instead of recording are an instant each on
their process's track, with how many. Where NVML is there (trace), each GPU's utilization,
memory bandwidth, memory used and power are counter tracks, sampled every second.

Timestamps are the events' wall-clock ones (REALTIME), tied to the trace's clock by a clock
snapshot at the start. Memory is bounded: nothing is kept per event, only one track
descriptor per process and thread seen and, per process, the end of each request lane.
"""

from __future__ import annotations

import io
import logging
import queue
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

import numpy as np
import numpy.typing as npt
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    BuiltinClock,
    DebugAnnotation,
    TracePacket,
    TrackEvent,
)
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from gpuflight.producer.contract.files import open_output
from gpuflight.producer.contract.wire import EventAttribution
from gpuflight.producer.decode.enrich import Event, to_aggregate_events, to_events

if TYPE_CHECKING:
    from gpuflight.producer.contract.wire import GpuSample
    from gpuflight.producer.decode.kernels import KernelNames
    from gpuflight.producer.decode.sinks import WithRecord

log = logging.getLogger(__name__)

#: The one packet sequence this writer makes.
SEQUENCE: Final = 1
#: TracePacket.sequence_flags: SEQ_INCREMENTAL_STATE_CLEARED, on the first packet.
_STATE_CLEARED: Final = 1
#: Categories: each call is `cuda`; the ones the CPU waits in, `cuda,wait`; requests `http`.
CATEGORY_CALL: Final = "cuda"
CATEGORY_WAIT: Final = "wait"
CATEGORY_HTTP: Final = "http"
#: Track uuids by kind, in the top bits (a pid and a tid are below 2^22 each).
_PROCESS, _THREAD, _LANE, _COUNTER = 1 << 60, 2 << 60, 3 << 60, 4 << 60
#: NVML's gauges as counter tracks per GPU: (field of GpuSample, track name, scale).
GPU_COUNTERS: Final = (
    ("utilization_gpu_pct", "GPU {gpu} utilization %", 1.0),
    ("utilization_memory_pct", "GPU {gpu} memory bandwidth %", 1.0),
    ("memory_used_bytes", "GPU {gpu} memory used (MiB)", 1 / (1 << 20)),
    ("power_w", "GPU {gpu} power (W)", 1.0),
)
#: Fields every slice has in its own right (name, time, track), not as an argument.
_NOT_ARGS: Final = frozenset({"type", "ts_ns", "pid", "tid", "duration_ns", "requests"})
#: What is written at once, at most (the builder's packets are buffered up to this).
_BUFFER_BYTES: Final = 1 << 20


def process_uuid(pid: int) -> int:
    return _PROCESS | pid


def thread_uuid(pid: int, tid: int) -> int:
    return _THREAD | (pid << 22) | tid


def lane_uuid(pid: int, lane: int) -> int:
    return _LANE | (pid << 16) | lane


def request_flow(pid: int, request_id: int) -> int:
    """The flow from a request to the calls made for it (one id per request of a process)."""
    return ((pid & 0x3FFFFF) << 40) | (request_id & ((1 << 40) - 1)) | (1 << 62)


def _is_wait(event: Event) -> bool:
    """A call the CPU waits in until the GPU is done: a sync, or a copy that is not async."""
    kind = event["type"]
    return kind == "sync" or (kind == "memcpy" and not event.get("async", True))


def _name(event: Event) -> str:
    if event["type"] == "launch" and event.get("kernel"):
        return str(event["kernel"])
    return str(event["api"])


def _annotate(target: Any, name: str, value: Any) -> None:
    annotation: DebugAnnotation = target.debug_annotations.add()
    annotation.name = name
    if isinstance(value, bool):
        annotation.bool_value = value
    elif isinstance(value, int):
        annotation.int_value = value
    elif isinstance(value, float):
        annotation.double_value = value
    elif isinstance(value, (list, tuple)):
        annotation.string_value = "x".join(str(v) for v in value)
    elif isinstance(value, Mapping):
        annotation.string_value = ", ".join(f"{k}={v}" for k, v in value.items())
    else:
        annotation.string_value = str(value)


def _comm(pid: int, tid: int | None = None) -> str | None:
    path = f"/proc/{pid}/comm" if tid is None else f"/proc/{pid}/task/{tid}/comm"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


class TimelineSink:
    """Writes a Perfetto trace of what it is given, streaming (EventSink, decode/sinks.py)."""

    takes_attribution = True

    def __init__(self, path: Path | str, kernels: KernelNames | None = None,
                 name: str = "--timeline", *, read_names: bool = True) -> None:
        """`read_names`: name processes and threads from this machine's /proc (a capture's
        own); else "pid N"/"tid N" (a replay of another host's)."""
        self._kernels = kernels
        self._read_names = read_names
        self.name = f"{name} {path}"
        raw = open(open_output(path, name), "wb", buffering=0)  # noqa: SIM115
        self._file: BinaryIO = io.BufferedWriter(raw, buffer_size=_BUFFER_BYTES)
        self._builder = StreamingTraceProtoBuilder(self._file)
        self._tracks: set[int] = set()
        #: pid → the end of the last request of each lane.
        self._lanes: dict[int, list[int]] = {}
        self.written = 0
        self.requests_written = 0
        #: NVML samples from its own thread, written on the capture's (tick, close).
        self._gpu_samples: queue.SimpleQueue[tuple[int, list[GpuSample]]] = queue.SimpleQueue()
        self._packet_clock()

    # -- the EventSink side ------------------------------------------------------------------

    def write(self, events: npt.NDArray[np.void],
              attribution: EventAttribution | None = None) -> None:
        for event in to_events(events, self._kernels, attribution):
            self._call(event)
        self.written += len(events)

    def write_aggregates(self, aggregates: npt.NDArray[np.void]) -> None:
        for line in to_aggregate_events(aggregates, self._kernels):
            pid = int(line["pid"])
            self._process(pid)
            packet = self._packet(int(line["ts_ns"]))
            event = packet.track_event
            event.type = TrackEvent.TYPE_INSTANT
            event.track_uuid = process_uuid(pid)
            event.categories.append(CATEGORY_CALL)
            event.name = f"{line['count']} x {line.get('api')}: counted, details shed"
            for key, value in line.items():
                if key not in _NOT_ARGS and value is not None:
                    _annotate(event, key, value)
            self._builder.write_packet(packet)

    def write_requests(self, pid: int, answered: Sequence[WithRecord],
                       unattributed: Mapping[str, float]) -> None:
        for one in answered:
            r = one.record
            track = self._lane(pid, r.start_ns, r.end_ns)
            begin = self._packet(r.start_ns)
            event = begin.track_event
            event.type = TrackEvent.TYPE_SLICE_BEGIN
            event.track_uuid = track
            event.categories.append(CATEGORY_HTTP)
            event.name = f"{r.method} {r.route or r.path}"
            event.flow_ids.append(request_flow(pid, r.request_id))
            for key, value in (("request_id", r.request_id), ("path", r.path),
                               ("route", r.route), ("status", r.status),
                               ("bytes_in", r.bytes_in), ("bytes_out", r.bytes_out),
                               ("complete", r.complete), ("trace_id", r.trace_id),
                               ("cost", {k: v for k, v in r.cost.items() if v})):
                if value not in (None, "", {}):
                    _annotate(event, key, value)
            self._builder.write_packet(begin)
            end = self._packet(max(r.end_ns, r.start_ns))
            end.track_event.type = TrackEvent.TYPE_SLICE_END
            end.track_event.track_uuid = track
            self._builder.write_packet(end)
            self.requests_written += 1

    def add_gpu_samples(self, samples: list[GpuSample]) -> None:
        """NVML's gauges now (any thread): counter tracks per GPU, written on the next tick."""
        self._gpu_samples.put((time.time_ns(), samples))

    def tick(self) -> None:
        while not self._gpu_samples.empty():
            ts, samples = self._gpu_samples.get()
            for sample in samples:
                self._counters(ts, sample)

    def close(self) -> None:
        try:
            self.tick()
            self._file.flush()
        finally:
            self._file.close()

    def _counters(self, ts: int, sample: GpuSample) -> None:
        for i, (field, title, scale) in enumerate(GPU_COUNTERS):
            value = getattr(sample, field)
            if value is None:
                continue
            uuid = _COUNTER | (sample.gpu << 8) | i
            if uuid not in self._tracks:
                self._tracks.add(uuid)
                descriptor: TracePacket = self._builder.create_packet()
                descriptor.trusted_packet_sequence_id = SEQUENCE
                descriptor.track_descriptor.uuid = uuid
                descriptor.track_descriptor.name = title.format(gpu=sample.gpu)
                descriptor.track_descriptor.counter.SetInParent()
                self._builder.write_packet(descriptor)
            packet = self._packet(ts)
            packet.track_event.type = TrackEvent.TYPE_COUNTER
            packet.track_event.track_uuid = uuid
            packet.track_event.double_counter_value = float(value) * scale
            self._builder.write_packet(packet)

    # -- packets --------------------------------------------------------------------------

    def _packet(self, ts_ns: int) -> TracePacket:
        packet: TracePacket = self._builder.create_packet()
        packet.timestamp = ts_ns
        packet.timestamp_clock_id = BuiltinClock.BUILTIN_CLOCK_REALTIME
        packet.trusted_packet_sequence_id = SEQUENCE
        return packet

    def _packet_clock(self) -> None:
        """The first packet: the wall clock against the trace's own (BOOTTIME), so that the
        events' REALTIME timestamps convert."""
        packet: TracePacket = self._builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE
        packet.sequence_flags = _STATE_CLEARED
        boot = packet.clock_snapshot.clocks.add()
        boot.clock_id = BuiltinClock.BUILTIN_CLOCK_BOOTTIME
        boot.timestamp = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        wall = packet.clock_snapshot.clocks.add()
        wall.clock_id = BuiltinClock.BUILTIN_CLOCK_REALTIME
        wall.timestamp = time.time_ns()
        packet.clock_snapshot.primary_trace_clock = BuiltinClock.BUILTIN_CLOCK_BOOTTIME
        self._builder.write_packet(packet)

    def _process(self, pid: int) -> None:
        uuid = process_uuid(pid)
        if uuid in self._tracks:
            return
        self._tracks.add(uuid)
        packet: TracePacket = self._builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE
        packet.track_descriptor.uuid = uuid
        packet.track_descriptor.process.pid = pid
        name = _comm(pid) if self._read_names else None
        packet.track_descriptor.process.process_name = name or f"pid {pid}"
        self._builder.write_packet(packet)

    def _thread(self, pid: int, tid: int) -> int:
        uuid = thread_uuid(pid, tid)
        if uuid not in self._tracks:
            self._process(pid)
            self._tracks.add(uuid)
            packet: TracePacket = self._builder.create_packet()
            packet.trusted_packet_sequence_id = SEQUENCE
            packet.track_descriptor.uuid = uuid
            packet.track_descriptor.parent_uuid = process_uuid(pid)
            packet.track_descriptor.thread.pid = pid
            packet.track_descriptor.thread.tid = tid
            name = _comm(pid, tid) if self._read_names else None
            packet.track_descriptor.thread.thread_name = name or f"tid {tid}"
            self._builder.write_packet(packet)
        return uuid

    def _lane(self, pid: int, start_ns: int, end_ns: int) -> int:
        """The first of the process's request lanes free at `start_ns` (its last request ended
        by then), a new one if none is."""
        self._process(pid)
        lanes = self._lanes.setdefault(pid, [])
        for lane, last_end in enumerate(lanes):
            if last_end <= start_ns:
                lanes[lane] = end_ns
                return lane_uuid(pid, lane)
        lanes.append(end_ns)
        lane = len(lanes) - 1
        uuid = lane_uuid(pid, lane)
        self._tracks.add(uuid)
        packet: TracePacket = self._builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE
        packet.track_descriptor.uuid = uuid
        packet.track_descriptor.parent_uuid = process_uuid(pid)
        packet.track_descriptor.name = "HTTP requests"
        self._builder.write_packet(packet)
        return uuid

    def _call(self, event: Event) -> None:
        pid, tid, ts = int(event["pid"]), int(event["tid"]), int(event["ts_ns"])
        track = self._thread(pid, tid)
        duration = event.get("duration_ns")
        packet = self._packet(ts)
        slice_ = packet.track_event
        slice_.type = TrackEvent.TYPE_INSTANT if duration is None else TrackEvent.TYPE_SLICE_BEGIN
        slice_.track_uuid = track
        slice_.categories.append(CATEGORY_CALL)
        if _is_wait(event):
            slice_.categories.append(CATEGORY_WAIT)
        slice_.name = _name(event)
        for key, value in event.items():
            if key not in _NOT_ARGS and value is not None:
                _annotate(slice_, key, value)
        if "request_id" in event:
            slice_.flow_ids.append(request_flow(pid, int(event["request_id"])))
        for request_id, _share in event.get("requests") or ():
            slice_.flow_ids.append(request_flow(pid, int(request_id)))
        self._builder.write_packet(packet)
        if duration is not None:
            end = self._packet(ts + int(duration))
            end.track_event.type = TrackEvent.TYPE_SLICE_END
            end.track_event.track_uuid = track
            self._builder.write_packet(end)
