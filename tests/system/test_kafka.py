"""Producer → real Kafka → replay, against a real Apache Kafka broker (KRaft, from its jars).

Exact round trip, a broker outage within and beyond the buffer bound, malformed
messages on the topic. The broker is started from the jars scripts/setup fetched.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from gpuflight import stack
from gpuflight.producer.contract import wire
from gpuflight.producer.decode.enrich import to_events
from gpuflight.producer.decode.kernels import KernelNames
from tests.support.capture import Producer as NodeProducer
from tests.support.capture import counted, read_events, wait_for_probe_releases
from tests.workloads import build, expected

pytestmark = pytest.mark.bpf

GPUFLIGHT = [sys.executable, "-m", "gpuflight"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.KafkaHandle]:
    data = tmp_path_factory.mktemp("kafka")
    handle = stack.kafka_up(data, port=stack.free_port())
    yield handle
    stack.kafka_down(data)


def decode_named(value: bytes) -> list[dict[str, Any]]:
    """An events message as --output writes it, names from the message itself."""
    batch = wire.decode_events(value)
    names = KernelNames(proc_root=None)
    names.learn(batch.pid, batch.kernels)
    return to_events(batch.events, names)


def key(event: dict[str, Any]) -> str:
    return json.dumps(event, sort_keys=True)


def node_producer(bootstrap: str, prefix: str, out: Path, *extra: str) -> NodeProducer:
    """`gpuflight producer --kafka ... --output ...`, once earlier probes are released."""
    wait_for_probe_releases()
    return NodeProducer(out, "--kafka", bootstrap, "--topic-prefix", prefix, *extra,
                    ready_timeout_s=90, stop_timeout_s=120)


def run_workloads(bindir: Path, count: int = 3) -> list[int]:
    pids = []
    runtimes: tuple[build.Runtime, ...] = ("stub", "cu12", "cu13")
    for runtime in runtimes[:count]:
        binary = build.build_capture(bindir, runtime)
        proc = subprocess.Popen([str(binary), "--threads", "2", "--iters", "200",
                                 "--start-delay-ms", "1200"])
        pids.append(proc.pid)
        assert proc.wait(timeout=60) == 0
    return pids


def replay(bootstrap: str, prefix: str, out: Path, start_ns: int, end_ns: int,
           *extra: str) -> tuple[list[dict[str, Any]], str]:
    proc = subprocess.run(
        [*GPUFLIGHT, "replay", "--kafka", bootstrap, "--topic-prefix", prefix,
         "--from", f"{start_ns}ns", "--to", f"{end_ns}ns", *extra, "--output", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return read_events(out), proc.stderr


def consume_all(bootstrap: str, topic: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": str(uuid.uuid4()),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    metadata = consumer.list_topics(topic, timeout=10)
    partitions = list(metadata.topics[topic].partitions)
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions}
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions if ends[p] > 0])
    values: list[bytes] = []
    remaining = {p for p in partitions if ends[p] > 0}
    deadline = time.monotonic() + 60
    while remaining and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        values.append(message.value() or b"")
        if (message.offset() or 0) + 1 >= ends[message.partition() or 0]:
            remaining.discard(message.partition() or 0)
    consumer.close()
    return values


@pytest.mark.kafka
def test_round_trip_through_kafka_is_exact(broker: stack.KafkaHandle, bindir: Path,
                                           tmp_path: Path) -> None:
    prefix = f"rt{uuid.uuid4().hex[:8]}"
    node = node_producer(broker.bootstrap, prefix, tmp_path / "node.jsonl")
    try:
        pids = run_workloads(bindir)
        recorded = node.stop()
    finally:
        node.kill()
    end_ns = time.time_ns()
    for pid in pids:  # the workloads' own calls are all there
        assert len([e for e in recorded if e["pid"] == pid]) == len(expected.capture_events(2, 200))
    replayed, _ = replay(broker.bootstrap, prefix, tmp_path / "replay.jsonl",
                         node.started_ns - 5 * 10**9, end_ns)
    assert Counter(map(key, replayed)) == Counter(map(key, recorded))
    # A narrower range and filters give exactly the matching subset.
    one = pids[1]
    middle = sorted(e["ts_ns"] for e in recorded if e["pid"] == one)
    lo, hi = middle[len(middle) // 4], middle[3 * len(middle) // 4]
    subset, _ = replay(broker.bootstrap, prefix, tmp_path / "subset.jsonl", lo, hi,
                       "--pid", str(one))
    want = [e for e in recorded if e["pid"] == one and lo <= e["ts_ns"] < hi]
    assert want and Counter(map(key, subset)) == Counter(map(key, want))
    # Each process's identity was published once, with the job it belongs to.
    identities = [wire.decode_process(v)
                  for v in consume_all(broker.bootstrap, f"{prefix}.processes.v1")]
    by_pid = {r.pid: r for r in identities}
    assert all(by_pid[p].job == f"{by_pid[p].comm}:{p}" for p in pids)
    # The producer's metrics say what it captured and published.
    metrics = [wire.decode_metrics(v)
               for v in consume_all(broker.bootstrap, f"{prefix}.metrics.v1")]
    last = max(metrics, key=lambda m: m.ts_ns)
    assert last.captured == len(recorded) == last.published
    assert last.dropped_kernel == 0 and last.dropped_user == 0


@pytest.mark.kafka
def test_overload_is_counted_per_process_and_published(
        broker: stack.KafkaHandle, bindir: Path, tmp_path: Path) -> None:
    """Two processes overrun a one-page ring buffer (behind CPU buffers of 16 slots, which a
    burst fills at once): what each could not record is counted in
    the kernel and published with its events (its messages' aggregates, --output's aggregate
    lines), and what fit nowhere is counted lost against its pid in the metrics topic: per pid,
    recorded + counted + lost is every call; what was recorded reaches Kafka."""
    prefix = f"ov{uuid.uuid4().hex[:8]}"
    node = node_producer(broker.bootstrap, prefix, tmp_path / "node.jsonl",
                         "--ring-buffer-pages", "1", "--cpu-buffer-slots", "16")
    threads, iters = 2, 4000
    try:
        binary = build.build_capture(bindir, "stub")
        procs = [subprocess.Popen([str(binary), "--threads", str(threads), "--iters", str(iters),
                                   "--start-delay-ms", "1200"]) for _ in range(2)]
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
        recorded = node.stop()
    finally:
        node.kill()
    metrics = [wire.decode_metrics(v)
               for v in consume_all(broker.bootstrap, f"{prefix}.metrics.v1")]
    last = max(metrics, key=lambda m: m.ts_ns)
    by_pid = dict(last.dropped_kernel_by_pid)
    assert sum(by_pid.values()) == last.dropped_kernel
    events = [e for e in recorded if e["type"] != "aggregate"]
    counted: Counter[int] = Counter()
    for a in recorded:
        if a["type"] == "aggregate":
            counted[a["pid"]] += a["count"]
    assert last.events_aggregated == sum(counted.values()) > 0
    want = len(expected.capture_events(threads, iters))
    for proc in procs:
        kept = sum(1 for e in events if e["pid"] == proc.pid)
        assert kept + counted[proc.pid] + by_pid.get(proc.pid, 0) == want, (
            proc.pid, kept, counted, by_pid)
    assert set(by_pid) | set(counted) <= {p.pid for p in procs}
    assert last.captured == len(events) == last.published
    values = consume_all(broker.bootstrap, f"{prefix}.events.v1")
    published = [e for v in values for e in decode_named(v)]
    assert Counter(map(key, published)) == Counter(map(key, events))
    sent: Counter[int] = Counter()
    for batch in map(wire.decode_events, values):
        sent[batch.pid] += int(batch.aggregates["count"].sum())
    assert +sent == +counted


@pytest.mark.kafka
def test_replay_into_another_topic(broker: stack.KafkaHandle, bindir: Path,
                                   tmp_path: Path) -> None:
    prefix = f"rt{uuid.uuid4().hex[:8]}"
    node = node_producer(broker.bootstrap, prefix, tmp_path / "node.jsonl")
    try:
        run_workloads(bindir, count=1)
        recorded = node.stop()
    finally:
        node.kill()
    target = f"{prefix}.postmortem"
    proc = subprocess.run(
        [*GPUFLIGHT, "replay", "--kafka", broker.bootstrap, "--topic-prefix", prefix,
         "--from", str(node.started_ns / 1e9 - 5), "--to", str(time.time()),
         "--to-topic", target],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    events = [e for v in consume_all(broker.bootstrap, target) for e in decode_named(v)]
    # Kernel names travel with each message, into the other topic too.
    assert Counter(map(key, events)) == Counter(map(key, recorded))
    assert all(e["kernel"] for e in events if e["type"] == "launch")


@pytest.mark.kafka
def test_malformed_messages_are_skipped_and_counted(broker: stack.KafkaHandle, bindir: Path,
                                                    tmp_path: Path) -> None:
    prefix = f"bad{uuid.uuid4().hex[:8]}"
    node = node_producer(broker.bootstrap, prefix, tmp_path / "node.jsonl")
    try:
        foreign = Producer({"bootstrap.servers": broker.bootstrap})
        for value in (b"\xff\xfe not json", b'{"schema": "someone.else", "v": 1}',
                      b'{"schema": "gpuflight.events", "v": 1, "count": 3}'):
            foreign.produce(f"{prefix}.events.v1", value=value, key=b"intruder")
        assert foreign.flush(30) == 0
        run_workloads(bindir, count=1)
        recorded = node.stop()
    finally:
        node.kill()
    replayed, log = replay(broker.bootstrap, prefix, tmp_path / "replay.jsonl",
                           node.started_ns - 5 * 10**9, time.time_ns())
    assert Counter(map(key, replayed)) == Counter(map(key, recorded))
    assert "skipped 3 message(s)" in log


@pytest.mark.kafka
def test_broker_outage_loses_nothing_within_the_buffer(bindir: Path, tmp_path: Path) -> None:
    data = tmp_path / "kafka"
    port = stack.free_port()
    handle = stack.kafka_up(data, port=port)
    prefix = "outage"
    node = node_producer(handle.bootstrap, prefix, tmp_path / "node.jsonl")
    try:
        binary = build.build_capture(bindir, "stub")
        first = subprocess.run([str(binary), "--iters", "300", "--start-delay-ms", "1200"],
                               timeout=60, check=False)
        stack.kafka_down(data)
        during = subprocess.run([str(binary), "--iters", "300"], timeout=60, check=False)
        # Both runs are captured (held in the publish queue) before the broker comes back.
        node.wait_for_captured(2 * len(expected.capture_events(1, 300)))
        stack.kafka_up(data, port=port)
        after = subprocess.run([str(binary), "--iters", "300"], timeout=60, check=False)
        assert first.returncode == during.returncode == after.returncode == 0
        recorded = node.stop()
    finally:
        node.kill()
    try:
        assert len(recorded) >= 3 * len(expected.capture_events(1, 300))
        replayed, _ = replay(handle.bootstrap, prefix, tmp_path / "replay.jsonl",
                             node.started_ns - 5 * 10**9, time.time_ns())
        assert Counter(map(key, replayed)) == Counter(map(key, recorded))
    finally:
        stack.kafka_down(data)


def test_beyond_the_buffer_drops_are_counted_never_a_crash(bindir: Path,
                                                           tmp_path: Path) -> None:
    """No broker at all and a 1 MiB buffer: the producer keeps capturing and counts."""
    nobody = f"127.0.0.1:{stack.free_port()}"
    node = node_producer(nobody, "nobroker", tmp_path / "node.jsonl", "--buffer-mb", "1",
                        "--kafka-close-timeout", "2")
    try:
        binary = build.build_capture(bindir, "stub")
        proc = subprocess.run([str(binary), "--threads", "4", "--iters", "5000",
                               "--start-delay-ms", "1200"], timeout=120, check=False)
        assert proc.returncode == 0
        node.wait_for_captured(len(expected.capture_events(4, 5000)))
        recorded = node.stop()
    finally:
        node.kill()
    log = "".join(node.log)
    dropped = int(log.rsplit(" beyond the Kafka buffer", 1)[0].rsplit(", ", 1)[1])
    assert dropped > 0
    assert counted(recorded) >= len(expected.capture_events(4, 5000))
    assert "still unsent" in log


@pytest.mark.kafka
def test_a_full_disk_under_output_leaves_kafka_whole(broker: stack.KafkaHandle, bindir: Path,
                                                     tmp_path: Path) -> None:
    """ENOSPC on --output switches that output off; the Kafka sink gets every event, and the
    agent ends with 74 (an output is incomplete) after saying which and what it lost."""
    prefix = f"full{uuid.uuid4().hex[:8]}"
    full = Path("/dev/full")  # a character device: taken as --output, a symlink to it is not
    node = node_producer(broker.bootstrap, prefix, full)
    try:
        binary = build.build_capture(bindir, "stub")
        proc = subprocess.Popen([str(binary), "--iters", "50", "--start-delay-ms", "1200"])
        assert proc.wait(timeout=60) == 0
        want = len(expected.capture_events(1, 50))
        node.wait_for_captured(want)
        node.proc.send_signal(signal.SIGTERM)
        assert node.proc.wait(timeout=120) == 74
    finally:
        node.kill()
    log = "".join(node.log)
    assert "Traceback" not in log
    assert f"--output {full} failed (No space left on device)" in log
    outputs = {o["name"]: o for o in node.status()["outputs"]}
    assert outputs[f"--output {full}"]["failure"] == "No space left on device"
    assert outputs[f"--output {full}"]["lost"] >= want
    assert all(o["failure"] is None for name, o in outputs.items() if "--output" not in name)
    mine = [e for value in consume_all(broker.bootstrap, f"{prefix}.events.v1")
            for e in decode_named(value) if e["pid"] == proc.pid]
    assert len(mine) == want


@pytest.mark.kafka
def test_a_producer_pointed_at_the_controller_port_says_so_in_one_line_before_ready(
        broker: stack.KafkaHandle, tmp_path: Path) -> None:
    """A port that answers but serves no metadata (a KRaft controller's) is no broker to wait
    for: the producer said "ready", then died with 70 a few seconds later (its --output with
    it). It ends at once with 4, in one line, before it captures anything."""
    controller = f"127.0.0.1:{broker.controller_port}"
    wait_for_probe_releases()
    proc = subprocess.run([*GPUFLIGHT, "producer", "--kafka", controller, "--output",
                           str(tmp_path / "node.jsonl")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0] == (f"gpuflight: error: {controller} is not a Kafka broker's port (it "
                        "answers, but serves no metadata: a KRaft controller's port? the "
                        "brokers' listeners are in its server.properties)")


@pytest.mark.kafka
def test_a_killed_agent_s_unpublished_events_are_counted_by_the_next(
        broker: stack.KafkaHandle, bindir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect: kill -9 of the agent lost what it held with nothing counted. The first agent
    holds a process's events (a flush interval of an hour) and is SIGKILLed: the next one
    reads the kernel's pinned tally and publishes exactly that many as `dropped_agent_died`
    of that pid; it stops cleanly with everything delivered, so both tallies are removed.
    The first compiles the program (bcc pins the tally's maps), the second loads the image
    the first kept (producer/probe/bpfload.py pins them itself)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPUFLIGHT_CACHE_DIR", str(cache))
    prefix = f"killed{uuid.uuid4().hex[:8]}"
    binary = build.build_capture(bindir, "stub")
    want = len(expected.capture_events(1, 50))
    first = node_producer(broker.bootstrap, prefix, tmp_path / "first.jsonl",
                          "--kafka-flush-interval", "3600")
    try:
        held = subprocess.Popen([str(binary), "--iters", "50", "--start-delay-ms", "1200"])
        assert held.wait(timeout=60) == 0
        first.wait_for_captured(want)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=60)
    finally:
        first.kill()
    tallies = Path("/sys/fs/bpf/gpuflight")
    [first_tally] = tallies.glob(f"agent-{first.proc.pid}-*")
    images = sorted(cache.glob("bpf-*.json"))  # the CUDA probes', the HTTP capture's
    assert images
    kept = {image: image.stat().st_mtime_ns for image in images}
    second = node_producer(broker.bootstrap, prefix, tmp_path / "second.jsonl")
    try:
        delivered = subprocess.Popen([str(binary), "--iters", "50", "--start-delay-ms", "1200"])
        assert delivered.wait(timeout=60) == 0
        second.wait_for_captured(want)
        second.stop()
    finally:
        second.kill()
    log = "".join(second.log)
    assert f"an earlier agent (pid {first.proc.pid}) ended before publishing" in log, log
    metrics = [wire.decode_metrics(v) for v in consume_all(broker.bootstrap,
                                                           f"{prefix}.metrics.v1")]
    reports = [m.dropped_agent_died_by_pid for m in metrics if m.dropped_agent_died_by_pid]
    assert reports, "no metrics record carried the dead agent's count"
    assert all(r.get(held.pid) == want for r in reports), reports
    events: Counter[int] = Counter()
    for value in consume_all(broker.bootstrap, f"{prefix}.events.v1"):
        batch = wire.decode_events(value)
        events[batch.pid] += len(batch.events)
    assert events[held.pid] == 0  # the first agent never published them
    assert events[delivered.pid] == want
    assert not first_tally.exists()  # reported, then removed
    assert sorted(cache.glob("bpf-*.json")) == images  # nothing compiled again: each one
    assert all(image.stat().st_mtime_ns > kept[image] for image in images)  # was used
    assert not list(tallies.glob(f"agent-{second.proc.pid}-*"))  # everything delivered


@pytest.mark.kafka
def test_an_exited_process_is_forgotten_after_its_events_are_sent(
        broker: stack.KafkaHandle, tmp_path: Path) -> None:
    """The node agent forgets a process once it is gone (capture.Capture.exit_observers):
    the Kafka sink sends what is pending of it first, under the identity it had, then its
    record again with its exit (for the worker), and drops that identity, so thousands of
    short-lived processes an hour keep nothing (the soak's agent grew) and a later process
    given the same pid is published as itself, not as the one before."""
    from gpuflight.producer.contract.abi import EVENT_DTYPE, EventType
    from gpuflight.producer.publish.kafkasink import KafkaSettings, KafkaSink
    from tests.support.fakeproc import write_proc

    prefix = f"forget{uuid.uuid4().hex[:8]}"
    proc_root = tmp_path / "proc"
    write_proc(proc_root, 4242, "0::/user.slice\n", {})
    sink = KafkaSink(KafkaSettings(bootstrap=broker.bootstrap, topic_prefix=prefix,
                                   flush_interval_s=3600), proc_root=proc_root, host="node-a")
    events = np.zeros(10, dtype=EVENT_DTYPE)
    events["pid"] = 4242
    events["type"] = EventType.LAUNCH
    events["ts_ns"] = time.time_ns() + np.arange(10)
    sink.observe(4242)
    sink.write(events[:6])
    assert sink.identities == 1
    # The first process exits; the pid's next holder starts (another start time, command).
    stat = proc_root / "4242" / "stat"
    first_stat = stat.read_text()
    stat.write_text(first_stat.replace("(python3 train)", "(other)").replace(" 123456 ", " 777 "))
    sink.forget_processes({4242})
    assert sink.identities == 0
    sink.write(events[6:])
    sink.flush_pending()
    assert sink.flush(30) == 0
    batches = [wire.decode_events(v) for v in consume_all(broker.bootstrap, f"{prefix}.events.v1")]
    assert sorted((b.start_time, len(b.events)) for b in batches) == [(777, 4), (123456, 6)]
    processes = [wire.decode_process(v)
                 for v in consume_all(broker.bootstrap, f"{prefix}.processes.v1")]
    # The first process's record twice (alive, then with its exit), the second's once.
    assert sorted((p.start_time, p.comm, p.exited_ns is not None) for p in processes) == [
        (777, "other", False), (123456, "python3 train", False),
        (123456, "python3 train", True)]
