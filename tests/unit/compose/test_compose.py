"""compose/ is a valid Docker Compose project (checked by Compose itself, no engine needed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import yaml

from tests.conftest import REPO, require
from tests.support.compose import COMPOSE, PROJECT


def test_the_producer_image_builds_from_files_that_exist() -> None:
    dockerfile = (REPO / "compose" / "producer.Dockerfile").read_text()
    copied = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert copied and all((REPO / path).exists() for path in copied)


def test_a_fleet_node_points_its_producer_at_the_shared_kafka() -> None:
    require(None if COMPOSE.exists() else "docker compose is not built (run scripts/setup)")
    env = {**os.environ, "KAFKA_BOOTSTRAP": "kafka.fleet.internal:9092",
           "KAFKA_ADVERTISED_HOST": "kafka.fleet.internal", "KAFKA_BIND_ADDRESS": "0.0.0.0",
           "GPUFLIGHT_STREAMS_WORKERS": "4"}
    proc = subprocess.run([str(COMPOSE), "-f", str(PROJECT), "config", "--format", "json"],
                          capture_output=True, text=True, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    assert services["producer"]["command"][:3] == ["producer", "--kafka",
                                                   "kafka.fleet.internal:9092"]
    assert services["streams"]["command"][2] == "kafka.fleet.internal:9092"
    assert services["streams"]["deploy"]["replicas"] == 4
    listeners = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert "HOST://kafka.fleet.internal:9092" in listeners
    (port,) = services["kafka"]["ports"]
    assert port["host_ip"] == "0.0.0.0" and port["published"] == "9092"


# -- a fleet that authenticates by default ---------------------------------------------------


def listeners(value: str) -> list[tuple[str, str, str]]:
    """(name, host, port) of a listeners property."""
    found = []
    for item in value.split(","):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        found.append((name, host, port))
    return found


def test_from_secrets_sets_variables_from_files(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("hunter2\n")
    env = {"PATH": os.environ["PATH"], "GPUFLIGHT_KAFKA_SASL_PASSWORD_FILE": str(secret),
           "INFLUXDB_ADMIN_PASSWORD_FILE": str(secret), "GF_X__FILE": "/left/alone"}
    proc = subprocess.run(["sh", str(REPO / "compose" / "from-secrets"), "env"], env=env,
                          capture_output=True, text=True, check=True)
    seen = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    assert seen["GPUFLIGHT_KAFKA_SASL_PASSWORD"] == "hunter2"
    assert seen["INFLUXDB_ADMIN_PASSWORD"] == "hunter2"
    assert "GPUFLIGHT_KAFKA_SASL_PASSWORD_FILE" not in seen and seen["GF_X__FILE"] == "/left/alone"
    env["GPUFLIGHT_INFLUX_TOKEN_FILE"] = str(tmp_path / "missing")
    proc = subprocess.run(["sh", str(REPO / "compose" / "from-secrets"), "true"], env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "cannot read" in proc.stderr


def test_the_deploy_page_lists_the_acls_the_broker_is_given() -> None:
    from tests.support.secure_kafka import acl_lines

    page = re.sub(r" \\\n +", " ", (REPO / "docs" / "deploy.md").read_text())  # continued lines
    for args in acl_lines():
        line = "kafka-acls --bootstrap-server BROKER --add " + " ".join(args)
        assert line in page, line


def test_the_monitoring_profile_scrapes_the_ports_the_agents_serve() -> None:
    from gpuflight import cli

    compose = yaml.safe_load((REPO / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    config = yaml.safe_load((REPO / "compose" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    served = {}
    for name in ("producer", "streams"):
        command = [re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", a)
                   for a in services[name]["command"]]
        args = cli._parser().parse_args(command)
        assert args.metrics_address == "0.0.0.0"  # the compose network, not published
        served[name] = args.metrics_port
    (producer,) = jobs["gpuflight-producer"]["static_configs"]
    assert producer["targets"] == [f"producer:{served['producer']}"]
    (streams,) = jobs["gpuflight-streams"]["dns_sd_configs"]
    assert streams["names"] == ["streams"] and streams["port"] == served["streams"]
