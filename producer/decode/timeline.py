"""`--timeline FILE`: the events as a Perfetto trace (spooled as they come, written at close).

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
snapshot at the start. The capture's thread only spools what it is given (TimelineSink); the
trace is written from the spool at close, a slice of events at a time. Memory is bounded:
nothing is kept per event, only the names of the processes and threads seen, one track
descriptor each and, per process, the end of each request lane (bench/timeline.py).
"""

from __future__ import annotations

import io
import logging
import queue
import struct
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

import numpy as np
import numpy.typing as npt
import orjson
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    BuiltinClock,
    DebugAnnotation,
    TracePacket,
    TrackEvent,
)
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from gpuflight.producer.contract.abi import AGGREGATE_DTYPE, EVENT_DTYPE
from gpuflight.producer.contract.files import open_output
from gpuflight.producer.contract.wire import EventAttribution, RequestRecord
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
#: Events converted at a time at close (each a dict and a packet meanwhile).
_CONVERT_EVENTS: Final = 4096


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


class _Writer:
    """The Perfetto trace of what the spool holds, written packet by packet."""

    def __init__(self, file: BinaryIO, kernels: KernelNames | None,
                 names: Mapping[tuple[int, int | None], str]) -> None:
        self._kernels = kernels
        #: (pid, None) → the process's name, (pid, tid) → the thread's, as seen at the time.
        self._names = names
        self._file = file
        self._builder = StreamingTraceProtoBuilder(self._file)
        self._tracks: set[int] = set()
        #: pid → the end of the last request of each lane.
        self._lanes: dict[int, list[int]] = {}
        self._packet_clock()

    # -- what the spool holds ------------------------------------------------------------------

    def write(self, events: npt.NDArray[np.void],
              attribution: EventAttribution | None = None) -> None:
        for at in range(0, len(events), _CONVERT_EVENTS):  # a few thousand dicts at a time
            part = slice(at, at + _CONVERT_EVENTS)
            keep = np.zeros(len(events), dtype=np.bool_)
            keep[part] = True
            for event in to_events(events[part], self._kernels,
                                   attribution.take(keep) if attribution is not None else None):
                self._call(event)

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

    def write_requests(self, pid: int, records: Sequence[RequestRecord]) -> None:
        for r in records:
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

    def write_gpu_samples(self, ts: int, samples: Sequence[GpuSample]) -> None:
        for sample in samples:
            self._counters(ts, sample)

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
        packet.track_descriptor.process.process_name = self._names.get((pid, None), f"pid {pid}")
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
            packet.track_descriptor.thread.thread_name = self._names.get((pid, tid), f"tid {tid}")
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


# -- the spool ---------------------------------------------------------------------------------

#: Spool frames: a kind byte, the payload's length (u64), the payload.
_EVENTS, _AGGREGATES, _REQUESTS, _GPU = b"E", b"A", b"R", b"G"
_FRAME: Final = struct.Struct("<cQ")


class TimelineSink:
    """`--timeline FILE` (EventSink, decode/sinks.py). The capture's thread only appends what
    it is given, as it is, to a spool beside FILE (a write of the batch's bytes: the capture
    never waits for the conversion, ~60k events/s here); at `close` the spool is read back a
    frame at a time and written as the Perfetto trace, and deleted. Memory: one batch, and the
    names of the processes and threads seen (read from /proc when first seen, as they run)."""

    takes_attribution = True

    def __init__(self, path: Path | str, kernels: KernelNames | None = None,
                 name: str = "--timeline", *, read_names: bool = True) -> None:
        """`read_names`: name processes and threads from this machine's /proc (a capture's
        own); else "pid N"/"tid N" (a replay of another host's)."""
        self._kernels = kernels
        self._read_names = read_names
        self.name = f"{name} {path}"
        self._out = open(open_output(path, name), "wb", buffering=0)  # noqa: SIM115
        target = Path(path)
        # Beside it (its filesystem, its space), under a name no one else can have planted,
        # and gone from the directory at once: only this descriptor reaches it.
        self._spool = tempfile.TemporaryFile(dir=target.parent)  # noqa: SIM115
        self._names: dict[tuple[int, int | None], str] = {}
        self._gpu_samples: queue.SimpleQueue[tuple[int, list[GpuSample]]] = queue.SimpleQueue()
        self.written = 0
        self.requests_written = 0

    def _frame(self, kind: bytes, *parts: bytes) -> None:
        self._spool.write(_FRAME.pack(kind, sum(len(p) for p in parts)))
        for part in parts:
            self._spool.write(part)

    def _seen(self, pids: npt.NDArray[Any], tids: npt.NDArray[Any] | None) -> None:
        if not self._read_names:
            return
        for pid in np.unique(pids).tolist():
            if (pid, None) not in self._names:
                self._names[pid, None] = _comm(pid) or f"pid {pid}"
        if tids is not None:
            for pid, tid in set(zip(pids.tolist(), tids.tolist(), strict=True)):
                if (pid, tid) not in self._names:
                    self._names[pid, tid] = _comm(pid, tid) or f"tid {tid}"

    def write(self, events: npt.NDArray[np.void],
              attribution: EventAttribution | None = None) -> None:
        if len(events) == 0:
            return
        self._seen(events["pid"], events["tid"])
        # The spool holds struct gf_event's layout: a batch np.concatenate made is packed (NumPy
        # 2 drops the padding of a structured dtype it promotes), so it is laid out again here.
        events = np.ascontiguousarray(events.astype(EVENT_DTYPE, copy=False))
        n = len(events)
        rid = (attribution.request_id if attribution is not None
               else np.zeros(n, dtype=np.uint64)).astype("<u8")
        rset = (attribution.request_set if attribution is not None
                else np.zeros(n, dtype=np.int64)).astype("<i8")
        sets = orjson.dumps(attribution.sets if attribution is not None else [])
        self._frame(_EVENTS, struct.pack("<QQ", n, len(sets)), sets, rid.tobytes(),
                    rset.tobytes(), events.tobytes())
        self.written += n

    def write_aggregates(self, aggregates: npt.NDArray[np.void]) -> None:
        if len(aggregates):
            self._seen(aggregates["pid"], None)
            aggregates = np.ascontiguousarray(aggregates.astype(AGGREGATE_DTYPE, copy=False))
            self._frame(_AGGREGATES, aggregates.tobytes())

    def write_requests(self, pid: int, answered: Sequence[WithRecord],
                       unattributed: Mapping[str, float]) -> None:
        if answered:
            self._seen(np.array([pid]), None)
            self._frame(_REQUESTS, orjson.dumps(
                {"pid": pid, "requests": [asdict(a.record) for a in answered]}))
            self.requests_written += len(answered)

    def add_gpu_samples(self, samples: list[GpuSample]) -> None:
        """NVML's gauges now (any thread): counter tracks per GPU, spooled on the next tick."""
        self._gpu_samples.put((time.time_ns(), samples))

    def tick(self) -> None:
        while not self._gpu_samples.empty():
            ts, samples = self._gpu_samples.get()
            self._frame(_GPU, orjson.dumps({"ts": ts, "gpus": [asdict(s) for s in samples]}))

    def close(self) -> None:
        """Write the trace from the spool (a frame at a time), then let the spool go."""
        try:
            self.tick()
            out = io.BufferedWriter(self._out, buffer_size=_BUFFER_BYTES)
            writer = _Writer(out, self._kernels, self._names)
            self._spool.seek(0)
            for kind, payload in _frames(self._spool):
                _replay(writer, kind, payload)
            out.flush()
        finally:
            self._spool.close()
            self._out.close()


def _frames(spool: BinaryIO) -> Iterator[tuple[bytes, bytes]]:
    while True:
        head = spool.read(_FRAME.size)
        if len(head) < _FRAME.size:
            return
        kind, size = _FRAME.unpack(head)
        yield kind, spool.read(size)


def _replay(writer: _Writer, kind: bytes, payload: bytes) -> None:
    if kind == _EVENTS:
        n, sets_len = struct.unpack_from("<QQ", payload)
        at = 16
        sets = orjson.loads(payload[at:at + sets_len])
        at += sets_len
        rid = np.frombuffer(payload, dtype="<u8", count=n, offset=at)
        at += 8 * n
        rset = np.frombuffer(payload, dtype="<i8", count=n, offset=at)
        at += 8 * n
        events = np.frombuffer(payload, dtype=EVENT_DTYPE, count=n, offset=at)
        attribution = EventAttribution(
            rid, rset, tuple(tuple((int(r), float(share)) for r, share in one) for one in sets))
        writer.write(events, attribution)
    elif kind == _AGGREGATES:
        writer.write_aggregates(np.frombuffer(payload, dtype=AGGREGATE_DTYPE))
    elif kind == _REQUESTS:
        message = orjson.loads(payload)
        writer.write_requests(int(message["pid"]),
                              [RequestRecord(**r) for r in message["requests"]])
    elif kind == _GPU:
        message = orjson.loads(payload)
        writer.write_gpu_samples(int(message["ts"]), [_gpu_sample(g) for g in message["gpus"]])


def _gpu_sample(fields: dict[str, Any]) -> GpuSample:
    from gpuflight.producer.contract.wire import GpuProcessSample, GpuSample

    processes = fields.get("processes")
    return GpuSample(**{**fields, "processes": None if processes is None else tuple(
        GpuProcessSample(**p) for p in processes)})
