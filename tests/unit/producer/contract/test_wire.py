"""The Kafka wire contract: exact round trips, compactness, malformed input."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import (
    AGG_F_FAILED,
    AGGREGATE_DTYPE,
    API_IDS,
    EVENT_DTYPE,
    F_ASYNC,
    F_BYTES_KNOWN,
    F_HAS_RESULT,
    EventType,
)
from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.decode.enrich import request_event, to_events
from gpuflight.producer.publish import identity
from gpuflight.producer.publish.kafkasink import KafkaSettings, KafkaSink, load_config
from tests.conftest import one_line
from tests.support.builders import attribution, request_record
from tests.support.fakeproc import write_proc


def sample(n: int = 1000) -> np.ndarray:
    rng = np.random.default_rng(7)
    events = np.zeros(n, dtype=EVENT_DTYPE)
    events["ts_ns"] = 1_796_000_000_000_000_000 + np.cumsum(rng.integers(0, 2000, n))
    events["ts_ns"][5] -= 10_000  # another CPU's event, earlier in time: negative delta
    events["pid"] = 4242
    events["tid"] = 4242 + rng.integers(0, 3, n)
    events["type"] = EventType.LAUNCH
    events["api"] = API_IDS["cudaLaunchKernel"]
    events["handle"] = 0x7F00_0000_1000
    events["dim"] = [40, 1, 1, 256, 1, 1]
    events["device"] = rng.integers(0, 2, n)
    events[10]["type"] = EventType.FREE
    events[10]["api"] = API_IDS["cudaFree"]
    events[10]["flags"] = F_HAS_RESULT | F_BYTES_KNOWN
    events[10]["bytes"] = 1 << 40
    events[11]["type"] = EventType.MEMCPY
    events[11]["api"] = API_IDS["cudaMemcpy"]
    events[11]["flags"] = F_HAS_RESULT
    events[11]["result"] = 35
    events[11]["duration_ns"] = 1234
    events[11]["handle"] = 2**64 - 1  # survives the int64 columns
    return events


def test_round_trip_is_exact() -> None:
    events = sample()
    batch = wire.EventBatch("node-a", 4242, 987, events)
    back = wire.decode_events(wire.encode_events(batch))
    assert (back.host, back.pid, back.start_time) == ("node-a", 4242, 987)
    assert back.events.tobytes() == events.tobytes()
    assert to_events(back.events) == to_events(events)


def test_kernel_names_round_trip_with_their_batch() -> None:
    events = sample()
    names = {0x7F00_0000_1000: wire.KernelName("gemm", "gemm<float, 128>(float*, int)")}
    back = wire.decode_events(wire.encode_events(wire.EventBatch("h", 4242, 1, events, names)))
    assert back.kernels == names
    unnamed = wire.EventBatch("h", 4242, 1, events)
    assert wire.decode_events(wire.encode_events(unnamed)).kernels == {}


@pytest.mark.parametrize(
    ("kernels", "reason"),
    [([1], "kernels is not an object"), ({"12": ["only-short"]}, "kernel 12: not a"),
     ({"12": ["", "full"]}, "kernel 12: not a"), ({"x": ["a", "b"]}, "malformed")],
)
def test_malformed_kernel_names_raise_wire_errors(kernels: object, reason: str) -> None:
    message = orjson.loads(wire.encode_events(wire.EventBatch("h", 4242, 1, sample(20))))
    message["kernels"] = kernels
    with pytest.raises(wire.WireError, match=reason):
        wire.decode_events(orjson.dumps(message))


def test_zero_columns_are_left_out_and_launches_are_compact() -> None:
    events = sample()
    events = events[events["type"] == EventType.LAUNCH]
    value = wire.encode_events(wire.EventBatch("node-a", 4242, 987, events))
    columns = orjson.loads(value)["columns"]
    assert "result" not in columns and "duration_ns" not in columns and "bytes" not in columns
    # Uncompressed JSON; Kafka compresses batches on top of this (bench/ measures it).
    assert len(value) / len(events) < 60


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "empty"),
        (b"\x00\x01garbage", "not JSON"),
        (b'{"schema": "something.else", "v": 1}', "not a gpuflight.events"),
        (b'{"schema": "gpuflight.events", "v": 2}', "version 2"),
        (b'{"schema": "gpuflight.events", "v": 1, "count": 2, "host": "h", "pid": 1,'
         b' "start_time": 0, "ts0": 5, "columns": {"tid": [1]}}', "column tid has 1"),
        (b'{"schema": "gpuflight.events", "v": 1, "count": 1, "host": "h", "pid": 1,'
         b' "start_time": 0, "ts0": 5, "columns": {"tid": ["x"]}}', "malformed"),
        (b'{"schema": "gpuflight.events", "v": 1}', "malformed"),
    ],
)
def test_malformed_messages_raise_wire_errors(value: bytes, reason: str) -> None:
    with pytest.raises(wire.WireError, match=reason):
        wire.decode_events(value)


@pytest.mark.parametrize("count", ["1000000000000", "5e6", "1000000", "999999"])
def test_a_count_the_message_does_not_hold_is_refused_before_allocating(count: str) -> None:
    """A few bytes claiming a million events (or 10**12, or 5e6): one WireError, and no memory
    allocated for the claim (the issue's worker went from 216 to 635 MB on one)."""
    import tracemalloc

    value = (b'{"schema": "gpuflight.events", "v": 1, "count": ' + count.encode()
             + b', "host": "h", "pid": 1, "start_time": 0, "ts0": 5, "columns": {}}')
    assert len(value) < 140
    tracemalloc.start()
    try:
        with pytest.raises(wire.WireError):
            wire.decode_events(value)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_one_event_needs_no_column() -> None:
    value = (b'{"schema": "gpuflight.events", "v": 1, "count": 1, "host": "h", "pid": 1,'
             b' "start_time": 0, "ts0": 5, "columns": {}}')
    assert wire.decode_events(value).events["ts_ns"].tolist() == [5]


def test_unknown_columns_are_ignored_additive_changes() -> None:
    events = sample()
    message = orjson.loads(wire.encode_events(wire.EventBatch("h", 4242, 1, events)))
    message["columns"]["future_column"] = list(range(len(events)))
    message["future_field"] = "x"
    assert wire.decode_events(orjson.dumps(message)).events.tobytes() == events.tobytes()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Field by field (a copy need not keep the struct's padding bytes)."""
    return all(np.array_equal(a[f], b[f]) for f in EVENT_DTYPE.names or ())


def test_the_device_column_is_additive_within_v1(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message of a producer before "device" decodes as device 0; a reader before it (whose
    COLUMNS lack it) reads a newer message as before, without the devices."""
    events = sample()
    assert set(events["device"].tolist()) == {0, 1}
    message = orjson.loads(wire.encode_events(wire.EventBatch("h", 4242, 1, events)))
    assert len(message["columns"]["device"]) == len(events)
    on_device_0 = events.copy()
    on_device_0["device"] = 0
    older_message = {**message, "columns": {
        k: v for k, v in message["columns"].items() if k != "device"}}
    older = wire.decode_events(orjson.dumps(older_message)).events
    assert _same(older, on_device_0)
    assert {e["device"] for e in to_events(older)} == {0}
    # All on device 0: the column is left out, like every column of zeros.
    value = wire.encode_events(wire.EventBatch("h", 4242, 1, on_device_0))
    assert "device" not in orjson.loads(value)["columns"]
    monkeypatch.setattr(wire, "COLUMNS", tuple(c for c in wire.COLUMNS if c != "device"))
    older_reader = wire.decode_events(orjson.dumps(message)).events
    assert _same(older_reader, on_device_0)


def test_topic_names_carry_the_major_version() -> None:
    topics = wire.Topics.with_prefix("prod")
    assert (topics.events, topics.processes, topics.metrics, topics.nvml) == (
        "prod.events.v1", "prod.processes.v1", "prod.metrics.v1", "prod.nvml.v1")


def test_kafka_config_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "kafka.properties"
    path.write_text("# TLS and SASL\nsecurity.protocol = SASL_SSL\nsasl.mechanism=PLAIN\n\n")
    config = load_config(path, {"GPUFLIGHT_KAFKA_SASL_PASSWORD": "s3cret", "HOME": "/root"})
    assert config == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                      "sasl.password": "s3cret"}
    path.write_text("no equals sign\n")
    with pytest.raises(UsageError, match=r"kafka\.properties:1: expected key=value"):
        load_config(path, {})
    with pytest.raises(UsageError, match="cannot read Kafka config"):
        load_config(tmp_path / "missing", {})


def test_identity_of_a_kubernetes_pod(tmp_path: Path) -> None:
    cid = "ab" * 32
    cgroup = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
              f"1c2d3e4f_aaaa_bbbb_cccc_0123456789ab.slice/cri-containerd-{cid}.scope\n")
    write_proc(tmp_path, 77, cgroup, {"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                                      "HOSTNAME": "trainer-0"})
    ns = tmp_path / "77" / "root" / "var/run/secrets/kubernetes.io/serviceaccount"
    ns.mkdir(parents=True)
    (ns / "namespace").write_text("ml-team\n")
    who = identity.resolve(tmp_path, 77, "node-a")
    assert (who.comm, who.cmdline, who.start_time) == ("python3 train",
                                                       ("python3", "train.py", "--fused"), 123456)
    assert who.started_at_ns == 1700000000 * 10**9 + 1234560 * 10**6
    assert (who.container_id, who.pod_uid) == (cid, "1c2d3e4f-aaaa-bbbb-cccc-0123456789ab")
    assert who.job == "k8s:ml-team/trainer-0"


def test_identity_of_slurm_and_plain_processes(tmp_path: Path) -> None:
    write_proc(tmp_path, 5, "0::/user.slice\n", {"SLURM_JOB_ID": "9001"})
    write_proc(tmp_path, 6, "0::/user.slice\n", {})
    assert identity.resolve(tmp_path, 5, "h").job == "slurm:9001"
    assert identity.resolve(tmp_path, 6, "h").job == "python3 train:6"
    gone = identity.resolve(tmp_path, 999, "h")
    assert (gone.comm, gone.start_time, gone.job) == (None, 0, "unknown:999")


def test_replay_times() -> None:
    from gpuflight.timeparse import parse_time

    assert parse_time("1796225714176683439ns") == 1796225714176683439
    assert parse_time("1796225714176ms") == 1796225714176 * 10**6
    assert parse_time("1700000000.5") == 1700000000_500_000_000
    assert parse_time("2023-11-14T22:13:20Z") == 1700000000 * 10**9
    assert parse_time("2023-11-14T22:13:20") == 1700000000 * 10**9  # naive: UTC
    with pytest.raises(UsageError, match="not a time"):
        parse_time("yesterday")


# -- requests (additive within v1) -------------------------------------------------------------

def test_requests_and_attribution_round_trip_exactly() -> None:
    events = sample(50)
    attr = attribution(50)
    batch = wire.EventBatch("h", 4242, 1, events, attribution=attr,
                            requests=(request_record(11), request_record(12, trace_id=None,
                                                             parent_span_id=None, status=0,
                                                             complete=False)),
                            unattributed={"launches": 41.0, "gpu_ns": 7.5})
    back = wire.decode_events(wire.encode_events(batch))
    assert back.events.tobytes() == events.tobytes()
    assert back.requests == batch.requests
    assert back.unattributed == batch.unattributed
    assert back.attribution is not None
    assert back.attribution.request_id.tolist() == attr.request_id.tolist()
    assert back.attribution.request_set.tolist() == attr.request_set.tolist()
    assert back.attribution.sets == attr.sets
    assert back.attribution.of(0) == {"request_id": 11}
    assert back.attribution.of(8) == {"requests": [[11, 1 / 3], [12, 1 / 3], [13, 1 / 3]]}
    assert back.attribution.of(20) == {}
    # --output writes the same fields
    lines = to_events(back.events, attribution=back.attribution)
    assert lines[0]["request_id"] == 11 and "requests" not in lines[0]
    assert lines[5]["requests"] == [[11, 0.5], [12, 0.5]] and "request_id" not in lines[5]
    assert "request_id" not in lines[20] and "requests" not in lines[20]
    # A request's code paths (additive): round trip, and left out when it has none.
    named = dataclasses.replace(request_record(11), code_paths=(
        ("Model.forward (srv/model.py)", 24.0, 5.5e5), ("tokenize (srv/text.py)", 0.0, 0.0)))
    again = wire.decode_events(wire.encode_events(wire.EventBatch(
        "h", 4242, 1, events[:0], requests=(named, request_record(12)))))
    assert again.requests == (named, request_record(12))
    message = orjson.loads(wire.encode_events(wire.EventBatch(
        "h", 4242, 1, events[:0], requests=(named, request_record(12)))))
    assert "code_paths" in message["requests"][0] and "code_paths" not in message["requests"][1]
    assert request_event(4242, named)["code_paths"] == [
        ["Model.forward (srv/model.py)", 24.0, 5.5e5], ["tokenize (srv/text.py)", 0.0, 0.0]]
    assert "code_paths" not in request_event(4242, request_record(12))
    # A message without them decodes as before: no attribution, no requests.
    plain = wire.decode_events(wire.encode_events(wire.EventBatch("h", 4242, 1, events)))
    assert (plain.attribution, plain.requests, plain.unattributed) == (None, (), {})


def test_requests_without_events_and_a_selection() -> None:
    only = wire.EventBatch("h", 4242, 1, sample(20)[:0], requests=(request_record(7),))
    back = wire.decode_events(wire.encode_events(only))
    assert len(back.events) == 0 and back.requests == only.requests
    assert back.first_ts_ns == request_record(7).end_ns
    with pytest.raises(ValueError):
        wire.encode_events(wire.EventBatch("h", 4242, 1, sample(20)[:0]))
    attr = attribution(50)
    keep = np.zeros(50, dtype=bool)
    keep[[0, 8, 30]] = True
    part = attr.take(keep)
    assert part.request_id.tolist() == [11, 0, 0] and part.request_set.tolist() == [0, 1, 0]
    assert part.sets == (attr.sets[1],)
    both = wire.EventAttribution.concat([part, attr])
    assert both.request_set.tolist()[:3] == [0, 1, 0] and both.request_set[3 + 5] == 2
    assert both.sets == (attr.sets[1], *attr.sets)


@pytest.mark.parametrize("change", [
    lambda m: m["requests"][0].update(status=1000),
    lambda m: m["requests"][0].update(request_id=0),
    lambda m: m["requests"][0].update(trace_id="XYZ"),
    lambda m: m["requests"][0].update(cost={"dollars": 1}),
    lambda m: m["requests"][0].update(cost={"launches": -1}),
    lambda m: m["requests"][0].pop("route"),
    lambda m: m["requests"][0].update(code_paths=[["f", 1.0, 2.0]] * 6),
    lambda m: m["requests"][0].update(code_paths=[["f", -1.0, 2.0]]),
    lambda m: m["requests"][0].update(code_paths=[["", 1.0, 2.0]]),
    lambda m: m.update(requests={"a": 1}),
    lambda m: m.update(request_sets=[[[11, 0.5]], [[11, 1.0]]]),
    lambda m: m.update(request_sets=[[]]),
    lambda m: m["columns"].update(request_set=[3] * 50),
    lambda m: m["columns"].update(request_id=[1] * 49),
    lambda m: m["columns"].update(request_id=[11] * 50),  # exact and shared at once
    lambda m: m.update(unattributed={"launches": "x"}),
    lambda m: m.update(count=0, columns={}, requests=[]),
])
def test_malformed_requests_are_refused_in_one_line(change: object) -> None:
    batch = wire.EventBatch("h", 4242, 1, sample(50), attribution=attribution(50),
                            requests=(request_record(11),))
    message = orjson.loads(wire.encode_events(batch))
    change(message)  # type: ignore[operator]
    with pytest.raises(wire.WireError):
        wire.decode_events(orjson.dumps(message))


def test_request_costs_are_the_attribution_costs() -> None:
    from gpuflight.producer.contract.costs import COST_FIELDS

    assert wire.REQUEST_COST_FIELDS == COST_FIELDS


def test_absurd_amounts_read_as_the_bound_and_values_out_of_range_are_refused() -> None:
    """A failed cudaMalloc((size_t)-1) is 2^64 - 1 bytes, and a forged message may claim any
    duration: read as they came, their sums wrapped in InfluxQL (`report` showed -0.00 GB/s
    and -9,223,372,036 s blocked). Bytes and durations read as at most MAX_AMOUNT (2^48); an
    empty host, or a value outside its field's range, is a WireError."""
    events = sample(20)
    events[3]["bytes"] = 2**64 - 1
    events[4]["duration_ns"] = 2**63 + 5
    events[5]["bytes"] = wire.MAX_AMOUNT + 1
    back = wire.decode_events(wire.encode_events(wire.EventBatch("h", 4242, 1, events)))
    assert back.events["bytes"][3:6].tolist() == [wire.MAX_AMOUNT, 0, wire.MAX_AMOUNT]
    assert back.events["duration_ns"][4] == wire.MAX_AMOUNT
    rest = np.ones(len(events), dtype=bool)
    rest[[3, 4, 5]] = False
    assert to_events(back.events[rest]) == to_events(events[rest])
    good = orjson.loads(wire.encode_events(wire.EventBatch("h", 4242, 1, sample(20))))

    def spoiled(name: str, value: int) -> dict[str, object]:
        column = list(good["columns"][name])
        column[1] = value
        return {"columns": {**good["columns"], name: column}}

    for change, reason in (
            ({"host": ""}, "host must be 1 to 255"), ({"host": "h" * 256}, "host must be"),
            ({"pid": -1}, "out of range"), ({"ts0": -5}, "out of range"),
            (spoiled("ts", -(2**62)), "column ts"), (spoiled("tid", 2**32), "column tid"),
            (spoiled("api", -1), "column api"), (spoiled("dim", 2**32), "column dim")):
        with pytest.raises(wire.WireError, match=reason):
            wire.decode_events(orjson.dumps({**good, **change}))


@pytest.mark.parametrize("change", [{"bytes_in": 2**62}, {"cost": {"gpu_ns": 1e300}}])
def test_request_amounts_that_would_overflow_their_sums_are_refused(change: object) -> None:
    """Two requests of 1e308 GPU-ns summed to infinity, which no InfluxDB point can hold."""
    batch = wire.EventBatch("h", 4242, 1, sample(20), requests=(request_record(11),))
    message = orjson.loads(wire.encode_events(batch))
    message["requests"][0].update(change)
    with pytest.raises(wire.WireError, match="malformed request"):
        wire.decode_events(orjson.dumps(message))


# -- aggregates: what the kernel counted under overload (additive within v1) ----------------


def counted_sample() -> np.ndarray:
    """Aggregates of every kind the kernel makes, with values at the edges of their widths."""
    a = np.zeros(4, dtype=AGGREGATE_DTYPE)
    a["ts_ns"] = 1_796_000_000_000_000_000 + np.arange(4) * 1000
    a["last_ts_ns"] = a["ts_ns"] + 999
    a["pid"] = 4242
    a["api"] = [API_IDS["cudaLaunchKernel"], API_IDS["cudaMemcpy"],
                API_IDS["cudaStreamSynchronize"], API_IDS["cudaGraphLaunch"]]
    a["type"] = [EventType.LAUNCH, EventType.MEMCPY, EventType.SYNC, EventType.GRAPH_LAUNCH]
    a["flags"] = [0, F_HAS_RESULT | AGG_F_FAILED, F_HAS_RESULT, F_ASYNC]
    a["device"] = [0, 1, -1, 3]
    a["handle"] = [2**64 - 1, 0, 0, 0x3000]
    a["dim"][0] = [4096, 2, 3, 256, 1, 1]
    a["dim"][1, 0] = 1
    a["dim"][3, 0] = 5
    a["count"] = [2**40, 1, 3, 7]
    a["bytes"] = [0, 2**63, 0, 0]
    a["duration_ns"] = [0, 12, 2**40, 0]
    return a


def test_aggregates_round_trip_exactly_with_or_without_events() -> None:
    counted = counted_sample()
    events = sample()
    back = wire.decode_events(wire.encode_events(
        wire.EventBatch("h", 4242, 1, events, aggregates=counted)))
    assert back.aggregates.tobytes() == counted.tobytes()
    assert back.events.tobytes() == events.tobytes()
    # Aggregates alone make a message: no event, at the first aggregate's time.
    alone = wire.EventBatch("h", 4242, 1, events[:0], aggregates=counted)
    value = wire.encode_events(alone)
    assert orjson.loads(value)["count"] == 0 and alone.first_ts_ns == counted["ts_ns"][0]
    assert wire.decode_events(value).aggregates.tobytes() == counted.tobytes()
    # A message of a producer before them has none; a reader before them ignores them.
    assert len(wire.decode_events(wire.encode_events(
        wire.EventBatch("h", 4242, 1, events))).aggregates) == 0


@pytest.mark.parametrize(("aggregates", "reason"), [
    ([], "aggregates is not an object"),
    ({"count": 0, "columns": {}}, "a count of 1"),
    ({"count": 2, "columns": {"count": [1]}}, "does not have 2 values"),
    ({"count": 1, "columns": {"count": [0]}}, "of no event"),
    ({"count": 1, "columns": {"count": [1], "bytes": [-1]}}, "not a count"),
    ({"count": 1, "columns": {"count": [1], "api": [1 << 20]}}, "beyond its width"),
    ({"count": 1, "columns": {"count": [1], "dim": [1, 2]}}, "does not have 6 values"),
    ({"count": 1, "columns": {"count": [True]}}, "not a count"),
])
def test_malformed_aggregates_are_refused_in_one_line(aggregates: object, reason: str) -> None:
    message = orjson.loads(wire.encode_events(wire.EventBatch("h", 1, 1, sample()[:2])))
    message["aggregates"] = aggregates
    with pytest.raises(wire.WireError) as error:
        wire.decode_events(orjson.dumps(message))
    assert reason in one_line(error)


def fake_sink(sent: list[tuple[str, bytes, Any]], *pids: int) -> KafkaSink:
    """A KafkaSink whose Kafka client only records what it is handed (the client boundary:
    what it is handed is decoded by the test); `pids`' identities known (no /proc read)."""

    class FakeProducer:
        def __init__(self, _config: dict[str, Any]) -> None:
            pass

        def produce(self, topic: str, value: bytes, **kw: Any) -> None:
            sent.append((topic, value, kw["on_delivery"]))

        def poll(self, _t: float) -> int:
            return 0

        def flush(self, _t: float) -> int:
            return 0

        def __len__(self) -> int:
            return 0

    sink = KafkaSink(KafkaSettings(bootstrap="127.0.0.1:1"), producer_factory=FakeProducer,
                     create_topics=False, host="h")
    for pid in pids:
        sink._identities[pid] = wire.ProcessRecord(
            "h", pid, 5, None, None, (), None, None, None, None, None, None, f"x:{pid}")
    return sink


def test_the_kafka_sink_sends_aggregates_with_their_process_s_events() -> None:
    """Aggregates go out in their process's next events message, or in one of their own (no
    event of it pending), and are counted as no event delivered (the tally counts the ring's)."""
    sent: list[tuple[str, bytes, Any]] = []
    sink = fake_sink(sent, 4242, 4243)
    events = sample()[:5]
    counted = counted_sample()
    other = counted_sample()[:2]
    other["pid"] = 4243
    sink.write(events)
    sink.write_aggregates(np.concatenate([counted, other]))
    sink.flush_pending()
    batches = {b.pid: b for b in (wire.decode_events(v) for t, v, _ in sent
                                  if t.endswith(".events.v1"))}
    assert batches[4242].events.tobytes() == events.tobytes()
    assert batches[4242].aggregates.tobytes() == counted.tobytes()
    assert len(batches[4243].events) == 0
    assert batches[4243].aggregates.tobytes() == other.tobytes()
    for _, _, delivered in sent:
        delivered(None, None)
    assert sink.delivered_events == len(events)


PATHS = (
    wire.PathRecord(1_796_000_000_000_002_000,
                    (("train", "/m/train.py", 10), ("Model.forward", "/m/model.py", 41),
                     ("at::native::gemm", "libtorch_cuda.so", None)),
                    {"launches": 300.0, "gpu_ns": 5.5e6, "bytes": 0.0, "blocked_ns": 0.0,
                     "calls": 300.0}),
    wire.PathRecord(1_796_000_000_000_001_000, (("+0x6f7a", "libffi.so.8", None),),
                    {"calls": 100.0, "bytes": 65536.0}),
    wire.PathRecord(1_796_000_000_000_001_500, (("+0x6f7a", "libffi.so.8", None),),
                    {"calls": 7.0}, route="/v1/generate/{id}"),
)


def test_code_paths_round_trip_with_or_without_events() -> None:
    batch = wire.EventBatch("h", 4242, 1, sample(20), paths=PATHS)
    back = wire.decode_events(wire.encode_events(batch))
    assert back.events.tobytes() == batch.events.tobytes()
    # Zero values are left out on the wire, as request costs are.
    assert back.paths == (PATHS[0].__class__(PATHS[0].ts_ns, PATHS[0].frames,
                                             {k: v for k, v in PATHS[0].values.items() if v}),
                          *PATHS[1:])
    assert back.paths[2].route == "/v1/generate/{id}" and back.paths[1].route is None
    only = wire.EventBatch("h", 4242, 1, sample(20)[:0], paths=PATHS[1:])
    back = wire.decode_events(wire.encode_events(only))
    assert len(back.events) == 0 and back.paths == PATHS[1:]
    assert back.first_ts_ns == PATHS[1].ts_ns
    # An older message (no "paths") reads as no paths.
    assert wire.decode_events(wire.encode_events(wire.EventBatch("h", 1, 1, sample(20)))).paths \
        == ()


@pytest.mark.parametrize("change", [
    lambda m: m["paths"][0].update(values={"watts": 1}),
    lambda m: m["paths"][0].update(values={"calls\n": 1}),
    lambda m: m["paths"][0].update(values={"launches": -1}),
    lambda m: m["paths"][0].update(frames=[["f", "file", 1]] * (wire.MAX_PATH_FRAMES + 1)),
    lambda m: m["paths"][0].update(frames=[["f" * (wire.MAX_FRAME_TEXT + 1), "file", 1]]),
    lambda m: m["paths"][0].update(frames=[["f", "file", -3]]),
    lambda m: m["paths"][0].update(frames=[["f", "file"]]),
    lambda m: m["paths"][0].pop("ts_ns"),
    lambda m: m["paths"][2].update(route=""),
    lambda m: m["paths"][2].update(route=7),
    lambda m: m.update(paths={"a": 1}),
    lambda m: m.update(paths=[m["paths"][0]] * (wire.MAX_PATHS + 1)),
])
def test_malformed_code_paths_are_refused_in_one_line(change: Any) -> None:
    message = orjson.loads(wire.encode_events(wire.EventBatch("h", 4242, 1, sample(20),
                                                              paths=PATHS)))
    change(message)
    with pytest.raises(wire.WireError) as caught:
        wire.decode_events(orjson.dumps(message))
    assert "path" in one_line(caught) or "malformed" in one_line(caught)


def test_the_kafka_sink_sends_paths_merged_in_messages_of_their_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process's paths of several turns go out merged by stack, in messages of their own
    cut well under the broker's limit, none dropped, its events' messages unchanged."""
    from gpuflight.producer.publish import kafkasink

    monkeypatch.setattr(kafkasink, "PATH_MESSAGE_BYTES", 600)
    sent: list[tuple[str, bytes, Any]] = []
    sink = fake_sink(sent, 4242)
    many = [wire.PathRecord(1_796_000_000_000_000_000 + i, ((f"f{i}", "/srv/x.py", i),),
                            {"calls": 1.0}) for i in range(20)]
    sink.write(sample()[:5])
    sink.write_paths(4242, [PATHS[0], *many])
    sink.write_paths(4242, [PATHS[0]])  # the same stack again, a turn later: summed
    sink.write_paths(4242, [PATHS[1], PATHS[2]])  # one stack, two routes: kept apart
    sink.flush_pending()
    batches = [wire.decode_events(v) for t, v, _ in sent if t.endswith(".events.v1")]
    with_events = [b for b in batches if len(b.events)]
    assert len(with_events) == 1 and with_events[0].paths == ()
    paths = [p for b in batches for p in b.paths]
    assert len(batches) > 3 and all(len(b.events) == 0 for b in batches if b.paths)
    assert sorted(p.frames for p in paths) == sorted(p.frames for p in (*PATHS, *many))
    (twice,) = [p for p in paths if p.frames == PATHS[0].frames]
    assert twice.values["launches"] == 600.0 and twice.values["calls"] == 600.0
    by_route = {p.route: p.values for p in paths if p.frames == PATHS[1].frames}
    assert by_route == {None: PATHS[1].values, "/v1/generate/{id}": {"calls": 7.0}}
    for _, _, delivered in sent:
        delivered(None, None)
    assert sink.delivered_events == 5  # paths are no events
