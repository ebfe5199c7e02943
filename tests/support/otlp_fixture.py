"""A real OTLP receiver for tests: the OpenTelemetry Collector (OTLP receiver, file exporter)
that scripts/setup-otlp builds into .cache/otelcol/. `running_collector` yields its endpoints
and reads back the spans it received. Under CI=true a missing collector is built first; locally
the tests skip with the command to run."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuflight import stack
from tests.conftest import IN_CI, REPO, require

BINARY = REPO / ".cache" / "otelcol" / "gf-otelcol"
SETUP = REPO / "scripts" / "setup-otlp"


def otelcol_unavailable_reason() -> str | None:
    if BINARY.is_file() and os.access(BINARY, os.X_OK):
        return None
    if IN_CI:
        done = subprocess.run([str(SETUP)], check=False, capture_output=True, text=True,
                              timeout=1800)
        if done.returncode == 0 and BINARY.is_file():
            return None
        return f"scripts/setup-otlp failed: {done.stderr.strip().splitlines()[-1:]}"
    return f"no OpenTelemetry Collector at {BINARY} (run scripts/setup-otlp)"


@dataclass
class Collector:
    grpc: str
    http: str
    spans_file: Path
    process: subprocess.Popen[bytes]

    def spans(self) -> list[dict[str, Any]]:
        """Every span received so far, each with its resource's attributes under 'resource'."""
        out: list[dict[str, Any]] = []
        if not self.spans_file.exists():
            return out
        for line in self.spans_file.read_text().splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line).get("resourceSpans", []):
                resource = attributes(rs.get("resource", {}).get("attributes", []))
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        out.append({**span, "resource": resource,
                                    "scope": ss.get("scope", {}).get("name")})
        return out

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            if self.process.poll() is not None:
                pytest.fail(f"the collector exited with {self.process.returncode}")
            time.sleep(0.05)


def attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP/JSON attributes as a plain dict."""
    def value(v: dict[str, Any]) -> Any:
        if "stringValue" in v:
            return v["stringValue"]
        if "intValue" in v:
            return int(v["intValue"])
        if "doubleValue" in v:
            return float(v["doubleValue"])
        if "boolValue" in v:
            return bool(v["boolValue"])
        if "arrayValue" in v:
            return [value(x) for x in v["arrayValue"].get("values", [])]
        return None
    return {a["key"]: value(a.get("value", {})) for a in items}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def running_collector(tmp_path: Path) -> Iterator[Collector]:
    """A collector for one test (wrap it in a fixture); skips or fails as `require` does."""
    require(otelcol_unavailable_reason())
    grpc_port = stack.free_port()
    http_port = stack.free_port(frozenset({grpc_port}))
    spans = tmp_path / "spans.json"
    config = tmp_path / "otelcol.yaml"
    config.write_text(f"""
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc_port}
      http:
        endpoint: 127.0.0.1:{http_port}
exporters:
  file:
    path: {spans}
    flush_interval: 100ms
service:
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
""")
    log = (tmp_path / "otelcol.log").open("wb")
    process = subprocess.Popen([str(BINARY), "--config", str(config)], stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not (_listening(grpc_port) and _listening(http_port)):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the collector did not start: "
                            + (tmp_path / "otelcol.log").read_text()[-2000:])
            time.sleep(0.05)
        yield Collector(f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}", spans, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
