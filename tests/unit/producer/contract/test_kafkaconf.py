"""Kafka client settings (producer/contract/kafkaconf.py): librdkafka properties read once, and
what the
stream worker's aiokafka makes of them — checked here without a broker, with a TLS handshake
against a local server holding certificates from compose/make-secrets."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.contract.kafkaconf import ClientSecurity, load_config, shown
from tests.conftest import one_line
from tests.support.secure_kafka import make_secrets


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_secrets(tmp_path_factory.mktemp("secrets"))


def test_gpuflights_own_variables_are_not_librdkafka_properties(tmp_path: Path) -> None:
    config = load_config(None, {"GPUFLIGHT_KAFKA_LIBS": "/opt/kafka/libs",
                                "GPUFLIGHT_KAFKA_SASL_USERNAME": "producer"})
    assert config == {"sasl.username": "producer"}


def test_a_malformed_line_is_named_not_shown(tmp_path: Path) -> None:
    path = tmp_path / "kafka.properties"
    path.write_text("sasl.username=producer\nhunter2\n")
    with pytest.raises(UsageError) as error:
        load_config(path, {})
    assert one_line(error) == f"{path}:2: expected key=value"  # the line may be a password


def test_secrets_are_masked_where_settings_are_shown() -> None:
    config = {"sasl.username": "u", "sasl.password": "p", "ssl.key.password": "k"}
    assert shown(config) == {"sasl.username": "u", "sasl.password": "***",
                             "ssl.key.password": "***"}
    security = ClientSecurity.from_config({"security.protocol": "SASL_PLAINTEXT",
                                           "sasl.mechanism": "PLAIN", "sasl.username": "u",
                                           "sasl.password": "hunter2"})
    assert "hunter2" not in repr(security)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "scram-sha-512"])
def test_sasl_mechanisms(mechanism: str, secrets: Path) -> None:
    security = ClientSecurity.from_config({
        "security.protocol": "sasl_ssl", "sasl.mechanisms": mechanism,
        "sasl.username": "streams", "sasl.password": "pw",
        "ssl.ca.location": str(secrets / "ca.crt")})
    assert (security.protocol, security.mechanism, security.username, security.password) == (
        "SASL_SSL", mechanism.upper(), "streams", "pw")
    assert security.sasl and security.ssl_context is not None
    assert security.ssl_context.check_hostname
    assert security.ssl_context.verify_mode == ssl.CERT_REQUIRED


def test_plaintext_is_the_default() -> None:
    security = ClientSecurity.from_config({})
    assert (security.protocol, security.mechanism, security.ssl_context) == ("PLAINTEXT",
                                                                            None, None)


@pytest.mark.parametrize(("config", "says"), [
    ({"linger.ms": "5"}, "linger.ms not supported by the stream worker"),
    ({"bootstrap.servers": "h:1", "client.id": "x"},
     "bootstrap.servers, client.id not supported"),
    ({"security.protocol": "TLS"}, "security.protocol must be one of"),
    ({"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "p"},
     "'GSSAPI' not supported by the stream worker"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "'OAUTHBEARER'"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.password": "p"},
     "needs sasl.username"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u"},
     "needs sasl.password (in --kafka-config or GPUFLIGHT_KAFKA_SASL_PASSWORD)"),
    ({"security.protocol": "SSL", "sasl.username": "u"},
     "sasl.username is set but security.protocol is SSL"),
    ({"sasl.mechanism": "PLAIN"}, "security.protocol is PLAINTEXT"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u",
      "sasl.password": "p", "ssl.ca.location": "/x"}, "ssl.ca.location is set but"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "dns"},
     "must be https or none"),
    ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"},
     "ssl.ca.location /nonexistent/ca.pem: cannot load it"),
    ({"security.protocol": "SSL", "ssl.key.location": "/k"}, "without ssl.certificate.location"),
])
def test_what_the_worker_cannot_honour_is_a_usage_error(config: dict[str, str],
                                                          says: str) -> None:
    with pytest.raises(UsageError) as error:
        ClientSecurity.from_config(config)
    assert says in one_line(error)


def test_a_client_key_that_cannot_be_read_is_a_usage_error(secrets: Path) -> None:
    config = {"security.protocol": "SSL", "ssl.ca.location": str(secrets / "ca.crt"),
              "ssl.certificate.location": str(secrets / "producer.crt"),
              "ssl.key.location": str(secrets / "streams.key")}  # not this certificate's key
    with pytest.raises(UsageError, match="cannot load the client certificate"):
        ClientSecurity.from_config(config)


@pytest.fixture
def tls_server(secrets: Path) -> Iterator[tuple[int, list[str]]]:
    """A TLS server with the broker's certificate, asking for a client certificate; it
    records the CN of each client's."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(secrets / "ca.crt"))
    context.load_cert_chain(secrets / "kafka.crt", secrets / "kafka.key")
    context.verify_mode = ssl.CERT_OPTIONAL
    listener = socket.create_server(("127.0.0.1", 0))
    clients: list[str] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    peer: Any = tls.getpeercert() or {}
                    names = {k: v for rdn in peer.get("subject", ()) for k, v in rdn}
                    clients.append(str(names.get("commonName", "")))
            except (OSError, ssl.SSLError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], clients
    listener.close()
    thread.join(5)


def handshake(context: ssl.SSLContext, port: int, name: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name) as tls:
        tls.do_handshake()


def test_the_tls_context_checks_the_broker_as_librdkafka_does(
        secrets: Path, tls_server: tuple[int, list[str]]) -> None:
    port, clients = tls_server
    config = {"security.protocol": "SSL", "ssl.ca.location": str(secrets / "ca.crt"),
              "ssl.certificate.location": str(secrets / "streams.crt"),
              "ssl.key.location": str(secrets / "streams.key")}
    context = ClientSecurity.from_config(config).ssl_context
    assert context is not None
    handshake(context, port, "localhost")  # a name in the broker's certificate
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(context, port, "elsewhere.example")
    lax = ClientSecurity.from_config(
        {**config, "ssl.endpoint.identification.algorithm": "none"}).ssl_context
    assert lax is not None and lax.verify_mode == ssl.CERT_REQUIRED
    handshake(lax, port, "elsewhere.example")  # the name unchecked, the CA still checked
    system = ClientSecurity.from_config({"security.protocol": "SSL"}).ssl_context
    assert system is not None
    with pytest.raises(ssl.SSLCertVerificationError):  # our CA is no system CA
        handshake(system, port, "localhost")
    deadline = time.monotonic() + 10  # the server records after its side of the handshake
    while len(clients) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert clients[:2] == ["streams", "streams"]  # the client certificate was presented
