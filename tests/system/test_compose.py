"""compose/ is a valid Docker Compose project (checked by Compose itself, no engine needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gpuflight.producer.probe.preflight import NODE_CAPABILITIES
from tests.conftest import REPO
from tests.support.compose import FLEET, compose_config


def test_compose_file_is_valid_and_wires_the_producer_to_kafka() -> None:
    config = compose_config()
    services = config["services"]
    assert isinstance(services, dict)
    producer = services["producer"]
    assert producer["pid"] == "host"
    # Root with the capabilities the agent checks for and no other, not privileged.
    assert not producer.get("privileged")
    assert producer["cap_drop"] == ["ALL"]
    assert [f"CAP_{name}" for name in producer["cap_add"]] == list(NODE_CAPABILITIES)
    assert producer["security_opt"] == ["apparmor=unconfined"]  # seccomp stays the default
    assert producer["ulimits"] == {"memlock": -1}  # BPF maps on kernels before 5.11
    assert "user" not in producer
    assert producer["uts"] == "host"  # its host tag is the node's name
    assert producer["command"] == ["producer", "--kafka", "kafka:9092",
                                   "--metrics-port", "9464", "--metrics-address", "0.0.0.0"]
    mounts = {Path(v["target"]) for v in producer["volumes"]}
    assert {Path("/lib/modules"), Path("/usr/src"), Path("/sys/kernel/tracing")} <= mounts
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert kafka["KAFKA_LOG_RETENTION_HOURS"] == "-1"  # kept for replay


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


# -- a fleet that authenticates by default ---------------------------------------------------

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def broker_properties(environment: dict[str, str]) -> dict[str, str]:
    """The broker's properties from its KAFKA_* variables, as compose/kafka/start writes
    them (___ → -, __ → _, _ → .); docker compose config writes a `$` as `$$`."""
    out = {}
    for name, value in environment.items():
        if not name.startswith("KAFKA_") or name in {"KAFKA_HEAP_OPTS", "KAFKA_OPTS"}:
            continue
        key = name.removeprefix("KAFKA_").replace("___", "-").replace("__", "@")
        out[key.replace("_", ".").replace("@", "_").lower()] = value.replace("$$", "$")
    return out


def listeners(value: str) -> list[tuple[str, str, str]]:
    """(name, host, port) of a listeners property."""
    found = []
    for item in value.split(","):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        found.append((name, host, port))
    return found


def assert_authenticated(properties: dict[str, str]) -> None:
    """No listener takes a client without authenticating it, except on loopback."""
    protocols = dict(item.split(":") for item in
                     properties["listener.security.protocol.map"].split(","))
    for key in ("listeners", "advertised.listeners"):
        for name, host, _ in listeners(properties[key]):
            protocol = protocols[name]
            client_auth = properties.get(f"listener.name.{name.lower()}.ssl.client.auth",
                                         properties.get("ssl.client.auth", "none"))
            authenticated = protocol == "SASL_SSL" or (protocol == "SSL"
                                                      and client_auth == "required")
            assert authenticated or host in LOOPBACK, f"{key}: {name} is {protocol} on {host!r}"
            assert protocol != "SASL_PLAINTEXT" or host in LOOPBACK, f"{name}: passwords in clear"
    # Who the loopback listeners let in is a super user: nothing else may be anonymous.
    assert properties["authorizer.class.name"].endswith("StandardAuthorizer")
    assert properties["allow.everyone.if.no.acl.found"] == "false"
    assert set(properties["sasl.enabled.mechanisms"].split(",")) <= {"SCRAM-SHA-512",
                                                                     "SCRAM-SHA-256"}
    assert properties["ssl.keystore.location"].startswith("/tmp/")  # written in the container


def secret_files(service: dict[str, object], config: dict[str, object]) -> dict[str, str]:
    """target path → secret file of the secrets a service mounts."""
    secrets = config["secrets"]
    assert isinstance(secrets, dict)
    mounted = service.get("secrets") or []
    assert isinstance(mounted, list)
    return {m["target"]: secrets[m["source"]]["file"] for m in mounted}


@pytest.mark.parametrize("fleet", [False, True])
def test_no_kafka_listener_is_plaintext_off_loopback(fleet: bool) -> None:
    config = compose_config(FLEET if fleet else {})
    services = config["services"]
    assert isinstance(services, dict)
    properties = broker_properties(services["kafka"]["environment"])
    assert_authenticated(properties)
    if fleet:
        assert "HOST://kafka.fleet.internal:9092" in properties["advertised.listeners"]
    # The published port is the SASL_SSL one.
    (port,) = services["kafka"]["ports"]
    (host_listener,) = [(n, p) for n, _, p in listeners(properties["listeners"]) if n == "HOST"]
    assert port["target"] == int(host_listener[1])


def test_credentials_come_from_secrets_never_from_the_files() -> None:
    from gpuflight.producer.publish.redact import is_secret_name

    config = compose_config()
    services = config["services"]
    assert isinstance(services, dict)
    secrets = config["secrets"]
    assert isinstance(secrets, dict)
    for secret in secrets.values():  # files compose/make-secrets writes, none in the repo
        assert Path(secret["file"]).parent == REPO / "compose" / "secrets"
        assert not Path(secret["file"]).is_relative_to(REPO) or not git_tracked(secret["file"])
    for name, service in services.items():
        mounted = secret_files(service, config)
        for variable, value in (service.get("environment") or {}).items():
            plain = variable.removesuffix("_FILE").rstrip("_")
            if not is_secret_name(plain) or variable.startswith("KAFKA_"):
                continue
            assert variable.endswith("_FILE"), f"{name}: {variable} holds a secret"
            assert value in mounted, f"{name}: {variable}={value} is no secret it mounts"
    env = {n: s.get("environment") or {} for n, s in services.items()}
    # Kafka clients: SASL_SSL as users of their own, the CA from a secret.
    for name, user in (("producer", "producer"), ("streams", "streams")):
        assert env[name]["GPUFLIGHT_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        assert env[name]["GPUFLIGHT_KAFKA_SASL_USERNAME"] == user
        ca = env[name]["GPUFLIGHT_KAFKA_SSL_CA_LOCATION"]
        assert secret_files(services[name], config)[ca].endswith("/ca.crt")
    # The gpuflight image turns *_FILE variables into the variables it reads.
    dockerfile = (REPO / "compose" / "producer.Dockerfile").read_text()
    assert 'ENTRYPOINT ["/usr/local/bin/from-secrets", "gpuflight"]' in dockerfile
    # InfluxDB takes logins; the workers and Grafana have their own.
    assert env["influxdb"]["INFLUXDB_HTTP_AUTH_ENABLED"] == "true"
    assert secret_files(services["streams"], config)[
        env["streams"]["GPUFLIGHT_INFLUX_TOKEN_FILE"]].endswith("influxdb-streams.token")
    assert env["grafana"]["GPUFLIGHT_INFLUX_USER"] == env["influxdb"]["INFLUXDB_READ_USER"]
    assert "GPUFLIGHT_INFLUX_PASSWORD_FILE" in env["grafana"]
    assert "GF_SECURITY_ADMIN_PASSWORD__FILE" in env["grafana"]
    for name in ("influxdb", "grafana"):  # their images' own entrypoints, behind from-secrets
        assert services[name]["entrypoint"][:2] == ["/bin/sh", "/usr/local/bin/from-secrets"]


def git_tracked(path: str) -> bool:
    proc = subprocess.run(["git", "-C", str(REPO), "ls-files", "--error-unmatch", path],
                          capture_output=True, check=False)
    return proc.returncode == 0
