"""Authenticated transport against a real Kafka 4 broker secured as the fleet recipe secures
it: SASL_SSL with SCRAM users, mTLS, the ACLs of compose/kafka/acls and nothing more
(tests/support/secure_kafka.py). The stream worker, replay and the producer each authenticate
with the same librdkafka settings; a wrong password ends each of them in one line, in seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflight import stack
from gpuflight.demo.build import SIMGPU_SONAME
from gpuflight.producer.contract import wire
from gpuflight.producer.contract.errors import ServiceError
from gpuflight.producer.contract.kafkaconf import check_access, load_config
from gpuflight.producer.publish.redact import REDACTED
from tests.conftest import REPO, require
from tests.support.capture import read_events, wait_for_probe_releases
from tests.support.secure_kafka import SecureKafka, apply_acls, config_file, secure_kafka_up
from tests.support.streams_support import (
    Feed,
    StreamWorker,
    launches,
    read_topic,
    rows,
    wait_for,
)
from tests.workloads.build import build_simgpu

pytestmark = pytest.mark.kafka

GPUFLIGHT = [sys.executable, "-m", "gpuflight"]
W = 1_000_000_000
#: A command that fails for its credentials must say so within this long.
PROMPTLY_S = 15.0


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secure_kafka_up(tmp_path_factory.mktemp("secure-kafka")) as secured:
        apply_acls(secured.admin_bootstrap)
        yield secured


def past_window(ago_s: int) -> int:
    return (time.time_ns() // W - ago_s) * W


def without_password(config: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in config.items() if k != "sasl.password"}


@pytest.mark.influx
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_the_worker_reads_over_sasl_ssl_with_only_its_acls(
        secure: SecureKafka, influx_url: str, tmp_path: Path, mechanism: str) -> None:
    """Producer's user in, the worker's user out: exact points in InfluxDB; the password
    comes from GPUFLIGHT_KAFKA_SASL_PASSWORD, the rest from --kafka-config."""
    feed = Feed(secure.bootstrap, "gpuflight", config=secure.sasl("producer", mechanism))
    host = f"sasl-{mechanism}-{os.getpid()}-{time.time_ns() % 10**6}"
    t0 = past_window(30)
    feed.process(host, 100, 7, "train:100")
    feed.events(host, 100, 7, launches([t0 + i for i in range(40)], 100, 64, 128))
    feed.events(host, 100, 7, launches([t0 + W + i for i in range(5)], 100, 4096, 256))
    feed.events(host, 100, 7, launches([t0 + 5 * W], 100, 1, 32))
    feed.flush()
    settings = config_file(tmp_path / "streams.properties",
                           without_password(secure.sasl("streams", mechanism)))
    worker = StreamWorker(secure.bootstrap, influx_url, "gpuflight", "gpuflight-streams",
                          tmp_path, extra=["--kafka-config", str(settings)],
                          env={"GPUFLIGHT_KAFKA_SASL_PASSWORD": secure.passwords["streams"]})
    worker.start()
    try:
        wait_for(lambda: rows(influx_url, f"SELECT verdict FROM memory_bound WHERE host = "
                                          f"'{host}' AND time = {t0 + W}"), 90,
                 "window 1 closed", worker)
        found = rows(influx_url, f"SELECT count FROM launches WHERE host = '{host}'"
                                 f" AND time < {t0 + 2 * W}")
        assert [(r["time"] - t0, r["count"]) for r in found] == [(0, 40), (W, 5)]
        jobs = rows(influx_url, f"SELECT count FROM launches WHERE host = '{host}' GROUP BY job")
        assert {r["job"] for r in jobs} == {"train:100"}  # the processes topic was read
    finally:
        assert worker.stop() == 0, worker.output()[-3000:]
    assert "Traceback" not in worker.output()


def run_gpuflight(*args: str, env: dict[str, str] | None = None,
                  timeout_s: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([*GPUFLIGHT, *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False, env={**os.environ, **(env or {})})
    return proc, time.monotonic() - started


def test_a_wrong_password_ends_the_worker_in_one_line(secure: SecureKafka,
                                                      tmp_path: Path) -> None:
    settings = config_file(tmp_path / "streams.properties",
                           secure.sasl("streams", password="not-the-password"))
    proc, took = run_gpuflight("streams", "--kafka", secure.bootstrap, "--kafka-config",
                               str(settings), "--data-dir", str(tmp_path / "data"),
                               timeout_s=PROMPTLY_S * 4)
    assert proc.returncode == 4, proc.stderr
    assert took < PROMPTLY_S
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused" in lines[0] and "SASL authentication" in lines[0], lines
    assert "not-the-password" not in proc.stderr


def test_unsupported_worker_settings_are_usage_errors(secure: SecureKafka,
                                                      tmp_path: Path) -> None:
    for extra, says in (({"linger.ms": "5"}, "linger.ms not supported by the stream worker"),
                        ({"sasl.mechanism": "GSSAPI"}, "GSSAPI"),
                        ({"ssl.ca.location": str(tmp_path / "nowhere.pem")}, "nowhere.pem")):
        settings = config_file(tmp_path / "streams.properties",
                               {**secure.sasl("streams"), **extra})
        proc, _ = run_gpuflight("streams", "--kafka", secure.bootstrap, "--kafka-config",
                                str(settings), "--data-dir", str(tmp_path / "data"))
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert says in line, line
        assert secure.passwords["streams"] not in line


@pytest.mark.influx
def test_the_worker_reads_over_mtls(secure: SecureKafka, influx_url: str,
                                    tmp_path: Path) -> None:
    """A client certificate instead of a password: the certificate's CN is the user."""
    feed = Feed(secure.mtls_bootstrap, "gpuflight", config=secure.mtls("producer"))
    host = f"mtls-{os.getpid()}-{time.time_ns() % 10**6}"
    t0 = past_window(30)
    feed.process(host, 200, 7, "mtls:200")
    feed.events(host, 200, 7, launches([t0 + i for i in range(17)], 200, 8, 32))
    feed.events(host, 200, 7, launches([t0 + 5 * W], 200, 1, 32))
    feed.flush()
    settings = config_file(tmp_path / "streams.properties", secure.mtls("streams"))
    worker = StreamWorker(secure.mtls_bootstrap, influx_url, "gpuflight", "gpuflight-streams",
                          tmp_path, extra=["--kafka-config", str(settings)])
    worker.start("mtls")
    try:
        found = wait_for(lambda: rows(influx_url, f"SELECT count FROM launches WHERE host ="
                                                  f" '{host}' AND time = {t0}"), 90,
                         "window 0", worker)
        assert found[0]["count"] == 17
    finally:
        worker.stop()


def test_replay_over_sasl_ssl_and_a_wrong_password(secure: SecureKafka,
                                                   tmp_path: Path) -> None:
    feed = Feed(secure.bootstrap, "gpuflight", config=secure.sasl("producer"))
    host = f"replay-{os.getpid()}-{time.time_ns() % 10**6}"
    t0 = past_window(30)
    feed.process(host, 300, 7, "replay:300")
    feed.events(host, 300, 7, launches([t0 + i for i in range(25)], 300, 8, 32))
    feed.flush()
    settings = config_file(tmp_path / "replay.properties", without_password(secure.sasl("replay")))
    out = tmp_path / "replay.jsonl"
    proc, _ = run_gpuflight("replay", "--kafka", secure.bootstrap, "--kafka-config",
                            str(settings), "--host", host, "--from", f"{t0}ns",
                            "--to", f"{t0 + W}ns", "--output", str(out),
                            env={"GPUFLIGHT_KAFKA_SASL_PASSWORD": secure.passwords["replay"]})
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 25 and all('"pid":300' in line for line in lines)
    proc, took = run_gpuflight("replay", "--kafka", secure.bootstrap, "--kafka-config",
                               str(settings), "--from", f"{t0}ns", "--to", f"{t0 + W}ns",
                               "--output", str(tmp_path / "never.jsonl"),
                               env={"GPUFLIGHT_KAFKA_SASL_PASSWORD": "wrong"})
    assert proc.returncode == 4 and took < PROMPTLY_S, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "refused" in line and "SASL authentication" in line
    # The producer's user may write events, not read them back.
    proc, took = run_gpuflight("replay", "--kafka", secure.bootstrap, "--kafka-config",
                            str(config_file(tmp_path / "p.properties", secure.sasl("producer"))),
                            "--from", f"{t0}ns", "--to", f"{t0 + W}ns",
                            "--output", str(tmp_path / "denied.jsonl"))
    assert proc.returncode == 4 and took < PROMPTLY_S, proc.stderr
    assert "does not let this user read gpuflight.events.v1" in proc.stderr.splitlines()[-1]


# -- the node agent, for real: uprobes → SASL_SSL → worker → InfluxDB, and no secret on the wire

#: A process with secrets in its arguments and environment: it maps the simulated GPU, waits
#: for a line on stdin (the producer has attached), then launches LAUNCHES kernels.
WORKLOAD = """
import ctypes, sys
class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
cuda = ctypes.CDLL(sys.argv[1])
launch = cuda.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.c_void_p]
sys.stdin.readline()
for _ in range(int(sys.argv[2])):
    launch(0x1000, Dim3(64, 1, 1), Dim3(128, 1, 1), None, 0, None)
"""
LAUNCHES = 300
SECRETS = ("sk-ARGV-9d81c2f0", "PASSWORD-ARG-5e7a", "URL-USERINFO-77b3", "ENV-TOKEN-c0ffee",
           "TOKEN-ARG-3141")


def every_message(secure: SecureKafka) -> list[bytes]:
    """Key, value and headers of every message of every topic on the broker."""
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": secure.admin_bootstrap}).list_topics(
        timeout=10).topics
    found: list[bytes] = []
    for topic in topics:
        if topic.startswith("__"):
            continue
        for message in read_topic(secure.admin_bootstrap, topic, timeout_s=5):
            found += [message.key() or b"", message.value() or b"",
                      *(v or b"" for _, v in message.headers() or ())]
    return found


@pytest.mark.influx
@pytest.mark.bpf
def test_node_agent_to_influxdb_over_sasl_ssl_with_no_secret_on_the_wire(
        secure: SecureKafka, influx_url: str, tmp_path: Path) -> None:
    lib = build_simgpu(tmp_path / "gpu") / SIMGPU_SONAME
    slurm_job = f"t{time.time_ns() % 10**9}"
    streams = StreamWorker(secure.bootstrap, influx_url, "gpuflight", "gpuflight-streams",
                           tmp_path, extra=["--kafka-config", str(config_file(
                               tmp_path / "streams.properties",
                               without_password(secure.sasl("streams"))))],
                           env={"GPUFLIGHT_KAFKA_SASL_PASSWORD": secure.passwords["streams"]})
    streams.start("node")
    wait_for_probe_releases()
    producer_log = tmp_path / "producer.log"
    out = tmp_path / "node.jsonl"
    settings = config_file(tmp_path / "producer.properties",
                           without_password(secure.sasl("producer")))
    with producer_log.open("wb") as log_out:
        producer = subprocess.Popen(
            [*GPUFLIGHT, "-v", "producer", "--kafka", secure.bootstrap, "--kafka-config",
             str(settings), "--output", str(out)],
            stdout=log_out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "GPUFLIGHT_KAFKA_SASL_PASSWORD": secure.passwords["producer"]})
    workload = None
    try:
        wait_for(lambda: "ready" in producer_log.read_text(errors="replace")
                 or producer.poll() is not None, 120, "the producer to be ready")
        assert producer.poll() is None, producer_log.read_text(errors="replace")
        workload = subprocess.Popen(
            [sys.executable, "-c", WORKLOAD, str(lib), str(LAUNCHES), "--api-key", SECRETS[0],
             f"--db-password={SECRETS[1]}", f"https://trainer:{SECRETS[2]}@data.example/x",
             f"HF_TOKEN={SECRETS[4]}"],
            stdin=subprocess.PIPE, text=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_ID": slurm_job,
                 "OPENAI_API_KEY": SECRETS[3]})
        wait_for(lambda: any("attached" in line and str(lib) in line for line in
                             producer_log.read_text(errors="replace").splitlines()),
                 120, "the producer to attach to the simulated GPU")
        assert workload.stdin is not None
        workload.stdin.write("go\n")
        workload.stdin.close()
        assert workload.wait(60) == 0
        wait_for(lambda: sum(1 for line in out.read_text().splitlines()
                             if f'"pid":{workload.pid},' in line) == LAUNCHES, 30,
                 "the launches in --output")
    finally:
        if workload is not None and workload.poll() is None:
            workload.kill()
        os.killpg(producer.pid, signal.SIGTERM)
        producer.wait(120)
    log = producer_log.read_text(errors="replace")
    assert producer.returncode == 0, log[-3000:]
    recorded = [e for e in read_events(out) if e["pid"] == workload.pid]
    assert len(recorded) == LAUNCHES and {e["type"] for e in recorded} == {"launch"}
    job = f"slurm:{slurm_job}"  # from the process's environment: SLURM_JOB_ID was read
    try:
        wait_for(lambda: sum_launches(influx_url, job) == LAUNCHES, 90,
                 f"{LAUNCHES} launches of {job} in InfluxDB", streams)
    finally:
        streams.stop()
    # replay over SASL_SSL gives back exactly what the node recorded.
    replay_settings = config_file(tmp_path / "replay.properties", secure.sasl("replay"))
    replayed_file = tmp_path / "replay.jsonl"
    first, last = min(e["ts_ns"] for e in recorded), max(e["ts_ns"] for e in recorded)
    proc, _ = run_gpuflight("replay", "--kafka", secure.bootstrap, "--kafka-config",
                            str(replay_settings), "--pid", str(workload.pid),
                            "--from", f"{first}ns", "--to", f"{last + 1}ns",
                            "--output", str(replayed_file))
    assert proc.returncode == 0, proc.stderr
    assert Counter(map(canonical, read_events(replayed_file))) == Counter(map(canonical,
                                                                              recorded))
    # The identity went out, redacted; no secret is in any topic, file or log.
    processes = [wire.decode_process(m.value()) for m in read_topic(
        secure.admin_bootstrap, "gpuflight.processes.v1", timeout_s=5)]
    (mine,) = [r for r in processes if r.pid == workload.pid]
    assert mine.job == job
    assert list(mine.cmdline[-5:]) == ["--api-key", REDACTED, f"--db-password={REDACTED}",
                                    f"https://{REDACTED}@data.example/x", f"HF_TOKEN={REDACTED}"]
    wire_bytes = b"\n".join(every_message(secure))
    files = {"--output": out.read_bytes(), "replay": replayed_file.read_bytes(),
             "producer log": log.encode(), "worker log": streams.output().encode()}
    leaks = [(secret, where) for secret in SECRETS
             for where, data in {"Kafka": wire_bytes, **files}.items()
             if secret.encode() in data]
    assert not leaks


def sum_launches(influx_url: str, job: str) -> int:
    found = rows(influx_url, f"SELECT sum(count) FROM launches WHERE job = '{job}'")
    return int(found[0]["sum"]) if found else 0


def canonical(event: dict[str, object]) -> str:
    return json.dumps(event, sort_keys=True)


@pytest.mark.bpf
def test_a_wrong_password_ends_the_producer_in_one_line(secure: SecureKafka,
                                                        tmp_path: Path) -> None:
    settings = config_file(tmp_path / "producer.properties",
                           without_password(secure.sasl("producer")))
    proc, took = run_gpuflight("producer", "--kafka", secure.bootstrap, "--kafka-config",
                               str(settings), "--output", str(tmp_path / "never.jsonl"),
                               env={"GPUFLIGHT_KAFKA_SASL_PASSWORD": "guessed"},
                               timeout_s=PROMPTLY_S * 4)
    assert proc.returncode == 4 and took < PROMPTLY_S, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "refused" in line and "SASL authentication" in line and "guessed" not in line


# -- the fleet's own broker: compose/kafka/start with compose.yaml's settings, outside Docker


def _rewrite(value: str, ports: dict[str, int], secrets: Path) -> str:
    value = value.replace("$$", "$").replace("/run/secrets/", f"{secrets}/")
    value = value.replace("://:", "://127.0.0.1:").replace("://kafka:", "://127.0.0.1:")
    for port, free in ports.items():
        value = value.replace(f":{port}", f":{free}")
    return value


@pytest.mark.influx
def test_the_compose_broker_takes_the_fleets_clients_and_no_others(
        influx_url: str, tmp_path: Path) -> None:
    """compose/kafka/start run with the kafka service's environment as `docker compose
    config` gives it (ports, paths and /run/secrets moved here; Kafka's admin scripts played
    by the admin API): a producer and a stream worker configured as compose configures them,
    through compose/from-secrets, get their events into InfluxDB; a client without
    credentials, or with the wrong ones, gets nothing."""
    from tests.support.compose import compose_config, compose_unavailable_reason
    from tests.support.kafka_cli import write_bin
    from tests.support.secure_kafka import make_secrets

    require(compose_unavailable_reason())
    config = compose_config()
    services, secrets = config["services"], config["secrets"]
    assert isinstance(services, dict) and isinstance(secrets, dict)
    made = make_secrets(tmp_path / "made")
    mounted = tmp_path / "run-secrets"  # /run/secrets of the containers
    mounted.mkdir()
    for name, secret in secrets.items():
        (mounted / name).write_bytes((made / Path(secret["file"]).name).read_bytes())
    ports: dict[str, int] = {}
    for port in ("9091", "9092", "9093", "9094"):
        ports[port] = stack.free_port(frozenset(ports.values()))
    env = {name: _rewrite(str(value), ports, mounted)
           for name, value in services["kafka"]["environment"].items()}
    # Docker publishes the HOST listener's port as 9092: here it is reached on its own.
    env["KAFKA_ADVERTISED_LISTENERS"] = env["KAFKA_ADVERTISED_LISTENERS"].replace(
        f"HOST://127.0.0.1:{ports['9092']}", f"HOST://127.0.0.1:{ports['9094']}")
    env |= {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
            "KAFKA_LOG_DIRS": str(tmp_path / "data"),
            "KAFKA_SSL_KEYSTORE_LOCATION": str(tmp_path / "run" / "keystore.pem"),
            "KAFKA_BIN": str(write_bin(tmp_path / "bin")), "GPUFLIGHT_SECRETS_DIR": str(mounted),
            "GPUFLIGHT_KAFKA_LOCAL": f"127.0.0.1:{ports['9091']}"}
    log = tmp_path / "kafka.log"
    with log.open("wb") as out:
        broker = subprocess.Popen(["bash", str(REPO / "compose" / "kafka" / "start")], env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    bootstrap = f"127.0.0.1:{ports['9094']}"  # HOST, the published listener
    try:
        wait_for(lambda: "users and ACLs set" in log.read_text(errors="replace")
                 or broker.poll() is not None, 120, "the broker and its users and ACLs")
        assert broker.poll() is None, log.read_text(errors="replace")[-3000:]
        assert (tmp_path / "run" / "ready").exists()  # what compose's healthcheck looks for

        def client_env(service: str) -> dict[str, str]:
            found = services[service]["environment"]
            return {k: _rewrite(str(v), ports, mounted) for k, v in found.items()
                    if k.startswith("GPUFLIGHT_KAFKA_")}

        producer_env = client_env("producer")
        password = Path(producer_env.pop("GPUFLIGHT_KAFKA_SASL_PASSWORD_FILE")).read_text()
        producer_config = load_config(None, {**producer_env,
                                             "GPUFLIGHT_KAFKA_SASL_PASSWORD": password})
        feed = Feed(bootstrap, "gpuflight", config=producer_config)
        host = f"compose-{os.getpid()}"
        t0 = past_window(30)
        feed.process(host, 400, 7, "fleet:400")
        feed.events(host, 400, 7, launches([t0 + i for i in range(33)], 400, 16, 64))
        feed.events(host, 400, 7, launches([t0 + 5 * W], 400, 1, 32))
        feed.flush()
        worker = StreamWorker(bootstrap, influx_url, "gpuflight", "gpuflight-streams", tmp_path,
                              env=client_env("streams"),
                              launcher=["sh", str(REPO / "compose" / "from-secrets")])
        worker.start("compose")
        try:
            found = wait_for(lambda: rows(influx_url, f"SELECT count FROM launches WHERE host"
                                                      f" = '{host}' AND time = {t0}"), 90,
                             "window 0", worker)
            assert found[0]["count"] == 33
        finally:
            worker.stop()
        # No way in without the credentials compose gives.
        assert check_access(bootstrap, {}, timeout_s=5) is not None  # plaintext: nothing
        with pytest.raises(ServiceError, match="SASL authentication"):
            check_access(bootstrap, {**producer_config, "sasl.password": "guess"})
        lax = {**producer_config, "ssl.ca.location": "probe"}  # a CA that is not ours
        with pytest.raises(ServiceError, match="certificate verify failed"):
            check_access(bootstrap, lax)
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        broker.wait(60)
