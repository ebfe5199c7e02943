"""The processes, metrics and NVML records of the Kafka contract (producer/contract/wire.py).

The fixtures are messages exactly as the v1 producer wrote them before the records were typed
(made by that code: identity.resolve + to_record, node.metrics_record, GpuSample.to_dict, then
encode_record): today's code must read them and write them back byte for byte.
"""

from __future__ import annotations

import dataclasses
import random
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuflight.producer import node
from gpuflight.producer.contract import wire
from gpuflight.producer.publish import identity
from tests.conftest import one_line
from tests.support.fakeproc import write_proc

PROCESS_V1 = (
    b'{"schema":"gpuflight.process","v":1,"host":"gpu-node-1","pid":77,"start_time":123456,'
    b'"started_at_ns":1700001234560000000,"comm":"python3 train",'
    b'"cmdline":["python3","train.py","--fused"],"exe":null,'
    b'"container_id":"abababababababababababababababababababababababababababababababab",'
    b'"pod_uid":"1c2d3e4f-aaaa-bbbb-cccc-0123456789ab","pod":"trainer-0",'
    b'"namespace":"ml-team","slurm_job_id":null,"job":"k8s:ml-team/trainer-0",'
    b'"team":"search"}'
)
METRICS_V1 = (
    b'{"schema":"gpuflight.metrics","v":1,"host":"gpu-node-1","ts_ns":1796000000123456789,'
    b'"uptime_s":12.346,"captured":1000000,"produced":999930,"published":999900,'
    b'"dropped_kernel":70,"dropped_kernel_by_pid":{"4242":50,"4343":20},"dropped_user":5,'
    b'"dropped_user_by_pid":{"4242":5},"queue_messages":3,"libraries_attached":2,'
    b'"driver_libraries_attached":1,"dropped_names":3,"forwarded_driver_calls":12,'
    b'"requests":120,"http_records_lost":2,"http_connections_untracked":1,'
    b'"dropped_agent_died":0,"dropped_agent_died_by_pid":{}}'
)
NVML_V1 = (
    b'{"schema":"gpuflight.nvml","v":1,"host":"gpu-node-1","ts_ns":1796000000123456789,'
    b'"gpus":[{"gpu":0,"uuid":"GPU-5e5c1f4a-0000-1111-2222-333344445555",'
    b'"name":"NVIDIA H100 80GB HBM3","utilization_gpu_pct":87,"utilization_memory_pct":40,'
    b'"memory_used_bytes":5368709120,"memory_total_bytes":85899345920,"power_w":412.337,'
    b'"temperature_c":61,"sm_clock_mhz":1980,"pcie_rx_bytes_per_s":7340032,'
    b'"pcie_tx_bytes_per_s":1024,"processes":[{"pid":4242,"sm_util_pct":30,"mem_util_pct":10,'
    b'"used_memory_bytes":1073741824},{"pid":4343,"sm_util_pct":null,"mem_util_pct":null,'
    b'"used_memory_bytes":null}]},{"gpu":1,"uuid":null,"name":"Tesla T4",'
    b'"utilization_gpu_pct":null,"utilization_memory_pct":null,"memory_used_bytes":null,'
    b'"memory_total_bytes":null,"power_w":null,"temperature_c":null,"sm_clock_mhz":null,'
    b'"pcie_rx_bytes_per_s":null,"pcie_tx_bytes_per_s":null,"processes":null}]}'
)

PROCESS = wire.ProcessRecord(
    host="gpu-node-1", pid=77, start_time=123456, started_at_ns=1_700_001_234_560_000_000,
    comm="python3 train", cmdline=("python3", "train.py", "--fused"), exe=None,
    container_id="ab" * 32, pod_uid="1c2d3e4f-aaaa-bbbb-cccc-0123456789ab", pod="trainer-0",
    namespace="ml-team", slurm_job_id=None, job="k8s:ml-team/trainer-0", team="search",
)
METRICS = wire.MetricsRecord(
    host="gpu-node-1", ts_ns=1_796_000_000_123_456_789, uptime_s=12.346, captured=1_000_000,
    produced=999_930, published=999_900, dropped_kernel=70,
    dropped_kernel_by_pid={4242: 50, 4343: 20}, dropped_user=5, dropped_user_by_pid={4242: 5},
    queue_messages=3, libraries_attached=2, driver_libraries_attached=1, dropped_names=3,
    forwarded_driver_calls=12, requests=120, http_records_lost=2, http_connections_untracked=1,
)
H100 = wire.GpuSample(
    gpu=0, uuid="GPU-5e5c1f4a-0000-1111-2222-333344445555", name="NVIDIA H100 80GB HBM3",
    utilization_gpu_pct=87, utilization_memory_pct=40, memory_used_bytes=5 << 30,
    memory_total_bytes=80 << 30, power_w=412.337, temperature_c=61, sm_clock_mhz=1980,
    pcie_rx_bytes_per_s=7_340_032, pcie_tx_bytes_per_s=1024,
    processes=(wire.GpuProcessSample(4242, 30, 10, 1 << 30),
               wire.GpuProcessSample(4343, None, None, None)),
)
T4 = wire.GpuSample(1, None, "Tesla T4", *[None] * 10)
NVML = wire.NvmlRecord("gpu-node-1", 1_796_000_000_123_456_789, (H100, T4))

Decoder = Callable[[bytes | None], object]
CASES: list[tuple[str, bytes, object, Decoder, Callable[[Any], bytes]]] = [
    ("process", PROCESS_V1, PROCESS, wire.decode_process, wire.encode_process),
    ("metrics", METRICS_V1, METRICS, wire.decode_metrics, wire.encode_metrics),
    ("nvml", NVML_V1, NVML, wire.decode_nvml, wire.encode_nvml),
]
DECODERS = {name: decode for name, _, _, decode, _ in CASES}
FIXTURES = {name: fixture for name, fixture, _, _, _ in CASES}


@pytest.mark.parametrize(("name", "fixture", "record", "decode", "encode"), CASES,
                         ids=[c[0] for c in CASES])
def test_todays_messages_decode_and_encode_back_byte_for_byte(
        name: str, fixture: bytes, record: object, decode: Decoder,
        encode: Callable[[Any], bytes]) -> None:
    decoded = decode(fixture)
    assert decoded == record
    assert encode(decoded) == fixture
    assert decode(encode(record)) == record


def test_the_producer_builds_the_same_messages(tmp_path: Path) -> None:
    """What the producer's own code makes now (identity, metrics, NVML) is byte for byte the
    v1 message."""
    cgroup = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
              f"1c2d3e4f_aaaa_bbbb_cccc_0123456789ab.slice/cri-containerd-{'ab' * 32}.scope\n")
    write_proc(tmp_path, 77, cgroup, {"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                                      "HOSTNAME": "trainer-0", "POD_NAMESPACE": "ml-team",
                                      "GPUFLIGHT_TEAM": "search"})
    assert wire.encode_process(identity.resolve(tmp_path, 77, "gpu-node-1")) == PROCESS_V1

    drops = types.SimpleNamespace(events=70, by_pid={4242: 50, 4343: 20}, names=3, forwarded=12,
                                  aggregated=0)
    capture: Any = types.SimpleNamespace(
        drops=lambda: drops, stats=types.SimpleNamespace(events=1_000_000, requests=120),
        http_drops=lambda: (2, 1),
        probes=types.SimpleNamespace(runtime_files=lambda: 2, driver_files=lambda: 1))
    sink: Any = types.SimpleNamespace(
        host="gpu-node-1", produced_events=999_930, delivered_events=999_900, dropped_events=5,
        dropped_by_pid=Counter({4242: 5}), queue_depth=lambda: 3)
    record = node.metrics_record(capture, sink, started=0.0)
    assert record.uptime_s > 0 and record.ts_ns > METRICS.ts_ns
    fixed = dataclasses.replace(record, ts_ns=METRICS.ts_ns, uptime_s=12.346)
    assert wire.encode_metrics(fixed) == METRICS_V1

    assert wire.encode_nvml(NVML) == NVML_V1


def test_unknown_fields_are_ignored_at_every_level() -> None:
    message = orjson.loads(NVML_V1)
    message["future"] = {"x": 1}
    message["gpus"][0]["future_gauge"] = 5
    message["gpus"][0]["processes"][0]["future"] = [1]
    assert wire.decode_nvml(orjson.dumps(message)) == NVML
    process = {**orjson.loads(PROCESS_V1), "cgroup_path": "/kubepods"}
    assert wire.decode_process(orjson.dumps(process)) == PROCESS


def test_fields_added_within_v1_are_optional() -> None:
    metrics = orjson.loads(METRICS_V1)
    later = ("driver_libraries_attached", "dropped_names", "forwarded_driver_calls",
             "requests", "http_records_lost", "http_connections_untracked",
             "dropped_agent_died", "dropped_agent_died_by_pid")
    for name in later:
        del metrics[name]
    old = wire.decode_metrics(orjson.dumps(metrics))
    assert old == dataclasses.replace(
        METRICS, driver_libraries_attached=0, dropped_names=0, forwarded_driver_calls=0,
        requests=0, http_records_lost=0, http_connections_untracked=0)


def test_fields_of_the_first_v1_are_required_even_when_null() -> None:
    with pytest.raises(wire.WireError, match=r"missing required field `sm_clock_mhz` - at "
                                             r"`\$\.gpus\[1\]`$"):
        wire.decode_nvml(_changed("nvml", _set("gpus.1.sm_clock_mhz", _DELETE)))
    with pytest.raises(wire.WireError, match="missing required field `exe`"):
        wire.decode_process(_changed("process", _set("exe", _DELETE)))
    with pytest.raises(wire.WireError, match="missing required field `queue_messages`"):
        wire.decode_metrics(_changed("metrics", _set("queue_messages", _DELETE)))


def _changed(name: str, change: Callable[[dict[str, Any]], None]) -> bytes:
    message = orjson.loads(FIXTURES[name])
    change(message)
    return orjson.dumps(message)


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(message: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = message
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
    return change


_DELETE = object()
MALFORMED = [
    ("process", _set("pid", "77"), "Expected `int`, got `str` - at `$.pid`"),
    ("process", _set("job", _DELETE), "missing required field `job`"),
    ("process", _set("job", ""), "length >= 1 - at `$.job`"),
    ("process", _set("host", None), "got `null` - at `$.host`"),
    ("process", _set("cmdline", "python3 train.py"), "Expected `array`, got `str`"),
    ("process", _set("start_time", -1), "`int` >= 0 - at `$.start_time`"),
    ("process", _set("pod", "p" * 70_000), "length <= 16384 - at `$.pod`"),
    ("metrics", _set("captured", _DELETE), "missing required field `captured`"),
    # A metrics record of no host gives no pipeline or events_lost point: it is refused.
    ("metrics", _set("host", None), "Expected `str`, got `null` - at `$.host`"),
    ("metrics", _set("host", ""), "length >= 1 - at `$.host`"),
    ("metrics", _set("captured", 1.5), "Expected `int`, got `float` - at `$.captured`"),
    ("metrics", _set("captured", True), "Expected `int`, got `bool`"),
    ("metrics", _set("published", 2**63), "<= 9223372036854775807"),
    ("metrics", _set("dropped_kernel", -5), "`int` >= 0 - at `$.dropped_kernel`"),
    ("metrics", _set("dropped_kernel_by_pid", {"init": 3}), "Expected `int`, got `str`"),
    ("metrics", _set("dropped_user_by_pid", [1, 2]), "Expected `object`, got `array`"),
    ("metrics", _set("uptime_s", "12"), "Expected `float`, got `str`"),
    ("nvml", _set("gpus", {"gpu": 0}), "Expected `array`, got `object` - at `$.gpus`"),
    ("nvml", _set("gpus.0.gpu", None), "got `null` - at `$.gpus[0].gpu`"),
    ("nvml", _set("gpus.0.gpu", _DELETE), "missing required field `gpu` - at `$.gpus[0]`"),
    ("nvml", _set("gpus.0.power_w", "412 W"), "at `$.gpus[0].power_w`"),
    ("nvml", _set("gpus.0.temperature_c", "64"), "at `$.gpus[0].temperature_c`"),
    ("nvml", _set("gpus.0.processes", {"pid": 1}), "at `$.gpus[0].processes`"),
    ("nvml", _set("gpus.0.processes.1.pid", "4343"), "at `$.gpus[0].processes[1].pid`"),
    ("nvml", _set("ts_ns", _DELETE), "missing required field `ts_ns`"),
    ("nvml", _set("schema", "gpuflight.metrics"), "not a gpuflight.nvml message"),
    ("nvml", _set("v", 2), "gpuflight.nvml version 2, this reader knows 1"),
]


@pytest.mark.parametrize(("name", "change", "reason"), MALFORMED)
def test_malformed_records_are_one_line_wire_errors(
        name: str, change: Callable[[dict[str, Any]], None], reason: str) -> None:
    with pytest.raises(wire.WireError) as error:
        DECODERS[name](_changed(name, change))
    assert reason in one_line(error)


@pytest.mark.parametrize("name", sorted(DECODERS))
@pytest.mark.parametrize(
    ("value", "reason"),
    [(None, "empty message"), (b"", "empty message"), (b"\xff\x00", "not JSON"),
     (b"[1, 2]", "not a gpuflight."), (b'"text"', "not a gpuflight."),
     (b"{" + b" " * wire.MAX_RECORD_BYTES + b"}", "bytes, more than 8000000")],
)
def test_what_is_no_record_at_all(name: str, value: bytes | None, reason: str) -> None:
    with pytest.raises(wire.WireError) as error:
        DECODERS[name](value)
    assert reason in one_line(error)


def test_events_messages_of_absurd_size_are_refused() -> None:
    value = orjson.dumps({"schema": "gpuflight.events", "v": 1, "host": "h", "pid": 1,
                          "start_time": 0, "count": 10**12, "ts0": 5, "columns": {}})
    with pytest.raises(wire.WireError, match=r"^1000000000000 events in one message, more"):
        wire.decode_events(value)


_JSON_VALUES: list[object] = [None, True, 0, -1, 2**64 - 1, 1.5, "", "x", [], [1], {},
                              {"a": None}, [{"pid": "1"}]]


def _mutate(value: Any, rng: random.Random) -> Any:
    """`value` with one field or element somewhere replaced, removed or added."""
    if isinstance(value, dict) and value:
        key = rng.choice(sorted(value))
        roll = rng.random()
        if roll < 0.2:
            return {k: v for k, v in value.items() if k != key}
        if roll < 0.5:
            return {**value, key: rng.choice(_JSON_VALUES)}
        return {**value, key: _mutate(value[key], rng)}
    if isinstance(value, list) and value:
        i = rng.randrange(len(value))
        return [*value[:i], _mutate(value[i], rng), *value[i + 1:]]
    return rng.choice(_JSON_VALUES)


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_any_mutation_decodes_or_is_a_wire_error(name: str) -> None:
    """Thousands of random mutations of a valid message: each one decodes or raises WireError
    with one line; no KeyError, TypeError or ValueError ever escapes."""
    rng = random.Random(name)
    original = orjson.loads(FIXTURES[name])
    outcomes: Counter[str] = Counter()
    for _ in range(3000):
        value = orjson.dumps(_mutate(original, rng))
        try:
            DECODERS[name](value)
        except wire.WireError as exc:
            assert "\n" not in str(exc) and str(exc)
            outcomes["refused"] += 1
        else:
            outcomes["decoded"] += 1
    assert outcomes["refused"] > 500 and outcomes["decoded"] > 100, outcomes


def test_a_process_message_from_before_team_decodes_with_none() -> None:
    older = PROCESS_V1.replace(b',"team":"search"', b"")
    assert older != PROCESS_V1
    assert wire.decode_process(older) == dataclasses.replace(PROCESS, team=None)


def test_an_exited_process_message_adds_only_its_exit() -> None:
    """The agent publishes a process's record again, under the same key, once it is gone:
    the v1 message plus "exited_ns" (an older reader ignores it; a live one's is unchanged)."""
    exited = dataclasses.replace(PROCESS, exited_ns=1_796_000_000_000_000_000)
    encoded = wire.encode_process(exited)
    assert encoded == PROCESS_V1[:-1] + b',"exited_ns":1796000000000000000}'
    assert wire.decode_process(encoded) == exited
    assert wire.decode_process(PROCESS_V1).exited_ns is None
    assert not PROCESS.own_job and wire.decode_process(encoded).job == PROCESS.job
    assert dataclasses.replace(PROCESS, pod=None, job="python3 train:77").own_job
