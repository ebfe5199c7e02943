"""A real Kafka 4 broker as a fleet runs it: SASL_SSL with SCRAM users, mTLS, ACLs enforced.

The CA, the broker's certificate, the client certificates and the passwords come from
compose/make-secrets (so the fleet's own script is what the tests trust); the ACLs are
compose/kafka/acls, applied through the admin API exactly as kafka-acls would add them.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflight import stack
from gpuflight.stack.kafka import BrokerSecurity
from tests.conftest import REPO

MAKE_SECRETS = REPO / "compose" / "make-secrets"
ACLS = REPO / "compose" / "kafka" / "acls"
USERS = ("producer", "streams", "replay")


def make_secrets(directory: Path, *hosts: str) -> Path:
    """Run compose/make-secrets into directory; its outputs."""
    args = [a for host in hosts for a in ("--host", host)]
    proc = subprocess.run([str(MAKE_SECRETS), *args, str(directory)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return directory


def acl_lines(prefix: str = "gpuflight", app: str = "gpuflight-streams") -> list[list[str]]:
    """compose/kafka/acls with the placeholders filled in: kafka-acls arguments per line."""
    lines = []
    for raw in ACLS.read_text().splitlines():
        if raw.strip() and not raw.lstrip().startswith("#"):
            text = raw.replace("${PREFIX}", prefix).replace("${APP}", app)
            lines.append(shlex.split(text))
    return lines


def acl_bindings(args: list[str]) -> list[Any]:
    """The ACLs one kafka-acls `--add` line makes (each resource with each operation)."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    principals: list[str] = []
    operations: list[str] = []
    resources: list[tuple[Any, str]] = []
    pattern, host = ResourcePatternType.LITERAL, "*"
    words = iter(args)
    for word in words:
        if word == "--allow-principal":
            principals.append(next(words))
        elif word == "--operation":
            operations.append(next(words))
        elif word == "--topic":
            resources.append((ResourceType.TOPIC, next(words)))
        elif word == "--group":
            resources.append((ResourceType.GROUP, next(words)))
        elif word == "--transactional-id":
            resources.append((ResourceType.TRANSACTIONAL_ID, next(words)))
        elif word == "--cluster":
            resources.append((ResourceType.BROKER, "kafka-cluster"))
        elif word == "--resource-pattern-type":
            pattern = ResourcePatternType[next(words).upper()]
        elif word == "--allow-host":
            host = next(words)
        else:
            raise AssertionError(f"kafka-acls argument the tests do not know: {word}")
    assert principals and operations and resources, args
    return [AclBinding(kind, name, pattern, principal, host,
                       AclOperation[_operation(op)], AclPermissionType.ALLOW)
            for principal in principals for kind, name in resources for op in operations]


def _operation(name: str) -> str:
    # kafka-acls spells them CamelCase (DescribeConfigs); the enum UPPER_SNAKE.
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(name)).upper()


def apply_acls(bootstrap: str, prefix: str = "gpuflight", app: str = "gpuflight-streams") -> int:
    """Add the fleet's ACLs (as a super user: the broker's loopback plaintext listener)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    bindings = [b for line in acl_lines(prefix, app) for b in acl_bindings(line)]
    for future in admin.create_acls(bindings, request_timeout=30).values():
        future.result(timeout=40)
    return len(bindings)


@dataclass(frozen=True)
class SecureKafka:
    handle: stack.KafkaHandle
    secrets: Path
    passwords: Mapping[str, str]

    @property
    def bootstrap(self) -> str:
        """SASL_SSL."""
        return self.handle.bootstrap

    @property
    def mtls_bootstrap(self) -> str:
        return f"{stack.HOST}:{self.handle.mtls_port}"

    @property
    def admin_bootstrap(self) -> str:
        """The loopback plaintext listener: a super user (ACLs, reading every topic)."""
        return self.handle.local_bootstrap

    def sasl(self, user: str, mechanism: str = "SCRAM-SHA-512",
             password: str | None = None) -> dict[str, str]:
        """librdkafka properties of a SASL_SSL client, password included."""
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
                "sasl.username": user,
                "sasl.password": self.passwords[user] if password is None else password,
                "ssl.ca.location": str(self.secrets / "ca.crt")}

    def mtls(self, user: str) -> dict[str, str]:
        return {"security.protocol": "SSL", "ssl.ca.location": str(self.secrets / "ca.crt"),
                "ssl.certificate.location": str(self.secrets / f"{user}.crt"),
                "ssl.key.location": str(self.secrets / f"{user}.key")}


def config_file(path: Path, config: Mapping[str, str]) -> Path:
    """A --kafka-config file."""
    path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    return path


@contextlib.contextmanager
def secure_kafka_up(directory: Path, *, authorizer: bool = True) -> Iterator[SecureKafka]:
    """Start a secured broker in directory (secrets and data), yield it, stop it."""
    secrets = make_secrets(directory / "secrets")
    passwords = {user: (secrets / f"kafka-{user}.password").read_text().strip()
                 for user in USERS}
    port = stack.free_port()
    mtls_port = stack.free_port(frozenset({port}))
    data = directory / "kafka"
    handle = stack.kafka_up(data, port, stack.free_port(frozenset({port, mtls_port})),
                            security=BrokerSecurity(
                                secrets / "kafka.crt", secrets / "kafka.key",
                                secrets / "ca.crt", passwords, mtls_port=mtls_port,
                                authorizer=authorizer))
    try:
        yield SecureKafka(handle, secrets, passwords)
    finally:
        stack.kafka_down(data)
