"""compose/kubernetes/ is valid Kubernetes (kubernetes-validate's schemas, strict: no unknown
field) and wires the node agent and the stream workers as compose/compose.yaml does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuflight.producer.probe.preflight import NODE_CAPABILITIES
from tests.conftest import REPO

KUBERNETES = REPO / "compose" / "kubernetes"
VERSION = "1.37"


def resources() -> dict[str, dict[str, Any]]:
    """Every resource the kustomization lists, by kind/name."""
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = [KUBERNETES / name for name in kustomization["resources"]]
    assert set(listed) == set(KUBERNETES.glob("*.yaml")) - {KUBERNETES / "kustomization.yaml"}
    found: dict[str, dict[str, Any]] = {}
    for path in listed:
        for doc in yaml.safe_load_all(path.read_text()):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def test_every_manifest_is_valid_for_kubernetes() -> None:
    import kubernetes_validate

    for key, doc in resources().items():
        kubernetes_validate.validate(doc, VERSION, strict=True)
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "gpuflight", key


def test_an_unknown_field_is_refused() -> None:
    import kubernetes_validate

    producer = resources()["DaemonSet/gpuflight-producer"]
    producer["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="hostPid"):
        kubernetes_validate.validate(producer, VERSION, strict=True)


def test_the_producer_runs_on_every_gpu_node_with_what_it_needs() -> None:
    found = resources()
    spec = found["DaemonSet/gpuflight-producer"]["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["hostNetwork"] is True
    (container,) = spec["containers"]
    # Root with the capabilities the agent checks for and no other, not privileged.
    context = container["securityContext"]
    assert context["privileged"] is False and context["runAsUser"] == 0
    assert context["capabilities"]["drop"] == ["ALL"]
    assert [f"CAP_{name}" for name in context["capabilities"]["add"]] == list(NODE_CAPABILITIES)
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    assert "securityContext" not in spec or "privileged" not in str(spec["securityContext"])
    assert container["args"][:3] == ["producer", "--kafka", "$(KAFKA_BOOTSTRAP)"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {Path(volumes[m["name"]]) for m in container["volumeMounts"] if m["name"] in volumes}
    assert {Path("/lib/modules"), Path("/usr/src"), Path("/sys/kernel/tracing")} <= mounts
    # The library verdicts outlive the pod (producer/discover/verdictcache.py), where the agent
    # keeps them.
    (cache,) = [m for m in container["volumeMounts"] if m["name"] == "verdicts"]
    assert volumes["verdicts"] == cache["mountPath"] == "/var/cache/gpuflight"
    config = found["ConfigMap/gpuflight"]["data"]
    assert {"KAFKA_BOOTSTRAP", "GPUFLIGHT_INFLUX_URL"} <= set(config)
    streams = found["Deployment/gpuflight-streams"]["spec"]
    assert streams["replicas"] >= 2
    (worker,) = streams["template"]["spec"]["containers"]
    assert worker["args"][:5] == ["streams", "--kafka", "$(KAFKA_BOOTSTRAP)",
                                  "--influx", "$(GPUFLIGHT_INFLUX_URL)"]
    assert worker["image"] == container["image"]


def test_clients_authenticate_with_credentials_from_secrets() -> None:
    """Kafka over SASL_SSL, InfluxDB with a login: every password from a Secret, the CA from
    a Secret volume, none in the manifests (which hold no Secret at all)."""
    from gpuflight.producer.publish.redact import is_secret_name

    found = resources()
    assert not [key for key in found if key.startswith("Secret/")]
    config = found["ConfigMap/gpuflight"]["data"]
    assert not [key for key in config if is_secret_name(key)]
    assert config["GPUFLIGHT_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert config["GPUFLIGHT_KAFKA_SASL_MECHANISM"].startswith("SCRAM-SHA-")
    for key, user in (("DaemonSet/gpuflight-producer", "producer"),
                      ("Deployment/gpuflight-streams", "streams")):
        spec = found[key]["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["GPUFLIGHT_KAFKA_SASL_USERNAME"]["value"] == user
        secret_env = [name for name in env if is_secret_name(name)]
        assert "GPUFLIGHT_KAFKA_SASL_PASSWORD" in secret_env
        for name in secret_env:
            assert "value" not in env[name], f"{key}: {name} written in the manifest"
            assert env[name]["valueFrom"]["secretKeyRef"]["name"].startswith("gpuflight-")
        secret_volumes = {v["name"] for v in spec["volumes"] if "secret" in v}
        ca_dir = Path(config["GPUFLIGHT_KAFKA_SSL_CA_LOCATION"]).parent
        (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == ca_dir]
        assert mount["name"] in secret_volumes and mount["readOnly"] is True
    streams_env = {e["name"] for e in found["Deployment/gpuflight-streams"]["spec"]["template"]
                   ["spec"]["containers"][0]["env"]}
    assert "GPUFLIGHT_INFLUX_TOKEN" in streams_env


def _metrics_port(container: dict[str, Any]) -> tuple[int, str]:
    """(--metrics-port, --metrics-address) as gpuflight's own parser reads the container's args
    (a $(VAR) given a value of its kind)."""
    from gpuflight import cli

    args = [a.replace("$(POD_IP)", "10.0.0.7").replace("$(POD_NAME)", "pod")
            .replace("$(KAFKA_BOOTSTRAP)", "kafka:9092")
            .replace("$(GPUFLIGHT_INFLUX_URL)", "http://influxdb:8086")
            for a in container["args"]]
    parsed = cli._parser().parse_args(args)
    return parsed.metrics_port, parsed.metrics_address


def test_the_podmonitor_scrapes_every_agents_metrics_port() -> None:
    found = resources()
    monitoring = KUBERNETES / "monitoring"
    kustomization = yaml.safe_load((monitoring / "kustomization.yaml").read_text())
    (monitor,) = [doc for name in kustomization["resources"]
                  for doc in yaml.safe_load_all((monitoring / name).read_text())]
    assert monitor["kind"] == "PodMonitor"
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    for key in ("DaemonSet/gpuflight-producer", "Deployment/gpuflight-streams"):
        template = found[key]["spec"]["template"]
        assert selector.items() <= template["metadata"]["labels"].items(), key
        (container,) = template["spec"]["containers"]
        (port,) = [p for p in container["ports"] if p["name"] == endpoint["port"]]
        served, address = _metrics_port(container)
        assert served == port["containerPort"], key
        if template["spec"].get("hostNetwork"):
            # On the node's network: its pod IP (the node's), not every interface of the node.
            env = {e["name"]: e for e in container["env"]}
            assert "$(POD_IP)" in container["args"] and address == "10.0.0.7"
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        else:
            assert address == "0.0.0.0"  # the pod's own network namespace
