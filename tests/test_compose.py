"""compose/ is a valid Docker Compose project (checked by Compose itself, no engine needed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

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
