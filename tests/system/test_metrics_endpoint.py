"""--metrics-port on the node agent and the stream worker, as Prometheus scrapes them: every
figure the service's own count of what the test made happen, every name passing promtool's
linter; a port in use is one line before anything starts."""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflight import stack
from tests.support.capture import GPUFLIGHT
from tests.support.capture import Producer as NodeProducer
from tests.support.promlint import lint, samples, scrape
from tests.support.streams_support import Feed, StreamWorker, launches, wait_for
from tests.workloads import build, expected

W = 1_000_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.KafkaHandle]:
    data = tmp_path_factory.mktemp("kafka")
    handle = stack.kafka_up(data, port=stack.free_port())
    yield handle
    stack.kafka_down(data)


@pytest.mark.bpf
@pytest.mark.kafka
def test_the_node_agents_metrics_are_its_own_counts(broker: stack.KafkaHandle, bindir: Path,
                                                    tmp_path: Path) -> None:
    from tests.support.capture import wait_for_probe_releases

    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    wait_for_probe_releases()
    node = NodeProducer(tmp_path / "node.jsonl", "--kafka", broker.bootstrap, "--topic-prefix",
                        f"m{uuid.uuid4().hex[:8]}", "--metrics-port", str(port),
                        ready_timeout_s=90, stop_timeout_s=120)
    try:
        binary = build.build_capture(bindir, "stub")
        workload = subprocess.run([str(binary), "--threads", "2", "--iters", "200",
                                   "--start-delay-ms", "1200"], timeout=60, check=False)
        assert workload.returncode == 0
        made = len(expected.capture_events(2, 200))
        node.wait_for_captured(made)

        def settled() -> str | None:  # everything captured was published
            text = scrape(url)
            captured = _value(text, "gpuflight_agent_events_captured_total")
            published = _value(text, "gpuflight_agent_events_published_total")
            return text if captured == published and captured is not None else None

        text = wait_for(settled, 60, "the agent's events published")
        status = node.status()
    finally:
        node.stop()
    assert lint(text) == []
    assert _value(text, "gpuflight_agent_events_captured_total") == status["captured"] >= made
    for reason in ("ring_full", "kafka_queue_full", "agent_killed"):
        assert _value(text, "gpuflight_agent_events_dropped_total", reason=reason) == 0
    runtime = [lib for lib in status["libraries"] if lib["kind"] == "runtime"]
    assert _value(text, "gpuflight_agent_library_files", kind="runtime") == len(runtime) >= 1
    assert _value(text, "gpuflight_agent_probes_attached", kind="runtime") == sum(
        lib["probes"] for lib in runtime)
    assert _value(text, "gpuflight_agent_probes_single_stepped", kind="runtime") == 0
    fill = _value(text, "gpuflight_agent_ring_fill_ratio")
    assert fill is not None and 0 <= fill <= 1
    assert _value(text, "gpuflight_agent_start_time_seconds") == pytest.approx(time.time(),
                                                                               abs=600)
    # Loopback only unless told: the port is not open on another address of this host.
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.2", port)) != 0


@pytest.mark.bpf
def test_a_metrics_port_in_use_is_one_line_before_the_agent_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*GPUFLIGHT, "producer", "--output", str(tmp_path / "o.jsonl"),
                               "--metrics-port", str(port)],
                              capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 4, done.stderr
    assert done.stderr.splitlines() == [
        f"gpuflight: error: cannot serve metrics on 127.0.0.1:{port}: in use"]
    assert not (tmp_path / "o.jsonl").exists() or (tmp_path / "o.jsonl").stat().st_size == 0


@pytest.mark.kafka
@pytest.mark.influx
def test_the_stream_workers_metrics_are_its_own_counts(kafka_bootstrap: str, influx_url: str,
                                                       tmp_path: Path) -> None:
    prefix = f"metrics-{uuid.uuid4().hex[:8]}"
    feed = Feed(kafka_bootstrap, prefix)
    host = f"{prefix}-a"
    t0 = (time.time_ns() // W - 30) * W
    feed.process(host, 100, 7, "train:100")
    feed.events(host, 100, 7, launches([t0 + i * 1000 for i in range(40)], 100, 64, 128))
    feed.raw(feed.topics.events, host, b"\x00 not json")
    feed.events(host, 100, 7, launches([t0 + 5 * W], 100, 1, 32))
    feed.flush()
    port = _free_port()
    worker = StreamWorker(kafka_bootstrap, influx_url, prefix, f"{prefix}-app", tmp_path,
                          extra=["--metrics-port", str(port)])
    worker.start()
    try:
        def counted() -> str | None:
            try:
                text = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                return None  # not listening yet
            done = (_value(text, "gpuflight_worker_events_total") == 41
                    and _value(text, "gpuflight_worker_dead_letters_total",
                               reason="malformed") == 1
                    and (_value(text, "gpuflight_worker_influx_points_written_total") or 0) > 0)
            lags = [v for (name, _), v in samples(text).items()
                    if name == "gpuflight_worker_consumer_lag_messages"]
            return text if done and lags and not any(lags) else None

        text = wait_for(counted, 120, "the worker's metrics", worker)
    finally:
        assert worker.stop() == 0, worker.output()[-4000:]
    assert lint(text) == []
    assert _value(text, "gpuflight_worker_late_events_total") == 0
    assert _value(text, "gpuflight_worker_dead_letters_total", reason="late") == 0
    assert _value(text, "gpuflight_worker_jobs") == 1
    assert "Traceback" not in worker.output()
