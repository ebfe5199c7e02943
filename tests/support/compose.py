"""compose/compose.yaml as Docker Compose itself reads it (`docker compose config`, no engine
needed; the binary scripts/setup-compose builds)."""

from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import REPO, require

COMPOSE = REPO / ".cache" / "compose" / "docker-compose"
PROJECT = REPO / "compose" / "compose.yaml"
#: A fleet's central host, as docs/deploy.md starts it.
FLEET = {"KAFKA_BOOTSTRAP": "kafka.fleet.internal:9092",
         "KAFKA_ADVERTISED_HOST": "kafka.fleet.internal", "KAFKA_BIND_ADDRESS": "0.0.0.0",
         "GPUFLIGHT_STREAMS_WORKERS": "4"}


def compose_unavailable_reason() -> str | None:
    return None if COMPOSE.exists() else "docker compose is not built (run scripts/setup)"


def compose_config(env: dict[str, str] | None = None) -> dict[str, object]:
    require(compose_unavailable_reason())
    proc = subprocess.run([str(COMPOSE), "-f", str(PROJECT), "config", "--format", "json"],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    config: dict[str, object] = json.loads(proc.stdout)
    return config
