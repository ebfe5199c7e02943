"""compose/ is a valid Docker Compose project (checked by Compose itself, no engine needed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from tests.conftest import REPO, require

COMPOSE = REPO / ".cache" / "compose" / "docker-compose"
PROJECT = REPO / "compose" / "compose.yaml"


def compose_config() -> dict[str, object]:
    require(None if COMPOSE.exists() else "docker compose is not built (run scripts/setup)")
    proc = subprocess.run([str(COMPOSE), "-f", str(PROJECT), "config", "--format", "json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    config: dict[str, object] = json.loads(proc.stdout)
    return config


def test_compose_file_is_valid_and_wires_the_producer_to_kafka() -> None:
    config = compose_config()
    services = config["services"]
    assert isinstance(services, dict)
    producer = services["producer"]
    assert producer["privileged"] is True and producer["pid"] == "host"
    assert producer["uts"] == "host"  # its host tag is the node's name
    assert producer["command"] == ["producer", "--kafka", "kafka:9092"]
    mounts = {Path(v["target"]) for v in producer["volumes"]}
    assert {Path("/lib/modules"), Path("/usr/src"), Path("/sys/kernel/tracing")} <= mounts
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert kafka["KAFKA_LOG_RETENTION_HOURS"] == "-1"  # kept for replay


def test_the_producer_image_builds_from_files_that_exist() -> None:
    dockerfile = (REPO / "compose" / "producer.Dockerfile").read_text()
    copied = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert copied and all((REPO / path).exists() for path in copied)


def test_the_stack_has_influxdb_stream_workers_and_provisioned_grafana() -> None:
    services = compose_config()["services"]
    assert isinstance(services, dict)
    assert set(services) == {"kafka", "producer", "influxdb", "streams", "grafana"}
    assert services["influxdb"]["image"].startswith("influxdb:1.8")
    assert services["influxdb"]["environment"]["INFLUXDB_DB"] == "gpuflight"

    streams = services["streams"]
    assert streams["image"] == services["producer"]["image"]  # one image, built once
    assert streams["command"][:5] == ["streams", "--kafka", "kafka:9092",
                                      "--influx", "http://influxdb:8086"]
    assert streams["deploy"]["replicas"] >= 2
    assert {"kafka", "influxdb"} <= set(streams["depends_on"])

    grafana = services["grafana"]
    mounts = {Path(v["target"]): Path(v["source"]) for v in grafana["volumes"]
              if v["type"] == "bind"}
    assert mounts[Path("/etc/grafana/provisioning")] == REPO / "grafana" / "provisioning"
    provider = yaml.safe_load(
        (REPO / "grafana" / "provisioning" / "dashboards" / "gpuflight.yaml").read_text())
    dashboards = Path(provider["providers"][0]["options"]["path"])
    assert mounts[dashboards] == REPO / "grafana" / "dashboards"
    # What the provisioning files expand.
    env = grafana["environment"]
    assert env["GPUFLIGHT_INFLUX_URL"] == "http://influxdb:8086"
    assert env["GPUFLIGHT_ALERT_WEBHOOK_URL"]
    home = Path(env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home.parent == dashboards
    assert (REPO / "grafana" / "dashboards" / home.name).exists()


def test_a_fleet_node_points_its_producer_at_the_shared_kafka() -> None:
    require(None if COMPOSE.exists() else "docker compose is not built (run scripts/setup)")
    env = {**os.environ, "KAFKA_BOOTSTRAP": "kafka.fleet.internal:9092",
           "KAFKA_ADVERTISED_HOST": "kafka.fleet.internal", "KAFKA_BIND_ADDRESS": "0.0.0.0",
           "GPUFLIGHT_STREAMS_WORKERS": "4"}
    proc = subprocess.run([str(COMPOSE), "-f", str(PROJECT), "config", "--format", "json"],
                          capture_output=True, text=True, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    assert services["producer"]["command"] == ["producer", "--kafka",
                                               "kafka.fleet.internal:9092"]
    assert services["streams"]["command"][2] == "kafka.fleet.internal:9092"
    assert services["streams"]["deploy"]["replicas"] == 4
    listeners = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert "HOST://kafka.fleet.internal:9092" in listeners
    (port,) = services["kafka"]["ports"]
    assert port["host_ip"] == "0.0.0.0" and port["published"] == "9092"
