"""Kafka client settings, written once for every command that talks to Kafka.

    load_config(path, environ)        librdkafka `key=value` properties from --kafka-config and
                                      GPUFLIGHT_KAFKA_* variables, verbatim (confluent-kafka
                                      takes them as they are: the producer, replay, the admin
                                      client and processes reader of the stream worker)
    ClientSecurity.from_config(cfg)   the same properties for the stream worker's aiokafka
                                      (Faust): protocol, SASL mechanism and user, a TLS context.
                                      It takes the security properties only; any other is a
                                      UsageError, so nothing is silently ignored
    check_access(bootstrap, cfg)      whether the broker takes the credentials: a broker that
                                      refuses them is a ServiceError within seconds (librdkafka
                                      would retry for ever, and aiokafka hang)

A contract module: the stream app imports it, so it imports no other producer module but
errors and files.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gpuflight.producer.contract.errors import ServiceError, UsageError
from gpuflight.producer.contract.files import read_input

log = logging.getLogger(__name__)

ENV_PREFIX: Final = "GPUFLIGHT_KAFKA_"
#: GPUFLIGHT_KAFKA_* variables that are gpuflight's own, not librdkafka properties.
ENV_NOT_PROPERTIES: Final = frozenset({"GPUFLIGHT_KAFKA_LIBS"})

PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: The SASL mechanisms the stream worker (aiokafka) is given; GSSAPI and OAUTHBEARER need
#: callbacks librdkafka properties cannot describe.
MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: The librdkafka properties the stream worker understands.
WORKER_PROPERTIES: Final = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
)
#: Properties whose values are never logged or shown.
SECRET_PROPERTIES: Final = frozenset({"sasl.password", "ssl.key.password",
                                      "ssl.keystore.password", "sasl.oauthbearer.client.secret"})


def load_config(path: Path | None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """librdkafka properties from a `key=value` file, then GPUFLIGHT_KAFKA_* variables
    (GPUFLIGHT_KAFKA_SASL_PASSWORD sets sasl.password)."""
    config: dict[str, str] = {}
    if path is not None:
        try:  # a regular file: a FIFO or a device is refused, never waited on
            lines = read_input(path, "Kafka config").decode().splitlines()
        except UnicodeDecodeError:
            raise UsageError(f"Kafka config {path} is not text") from None
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                # The line may hold a secret: its number says where, its text stays out.
                raise UsageError(f"{path}:{number}: expected key=value")
            config[key.strip()] = value.strip()
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX) and name not in ENV_NOT_PROPERTIES:
            config[name[len(ENV_PREFIX) :].lower().replace("_", ".")] = value
    return config


def shown(config: Mapping[str, Any]) -> dict[str, Any]:
    """The properties with their secrets masked, for logs and errors."""
    return {k: ("***" if k in SECRET_PROPERTIES else v) for k, v in config.items()}


@dataclass(frozen=True)
class ClientSecurity:
    """How a client authenticates to Kafka, in the terms aiokafka takes."""

    protocol: str = "PLAINTEXT"
    #: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with a SASL protocol, else None.
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    #: With SSL and SASL_SSL: the CA, client certificate and hostname check of the properties.
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> ClientSecurity:
        """The security of librdkafka properties; UsageError for any property the stream worker
        does not take, and for files that cannot be read (checked now, not at connect time)."""
        unknown = sorted(set(config) - set(WORKER_PROPERTIES))
        if unknown:
            raise UsageError(
                f"Kafka setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} not "
                f"supported by the stream worker (it takes {', '.join(WORKER_PROPERTIES)})")
        protocol = config.get("security.protocol", "PLAINTEXT").strip().upper()
        if protocol not in PROTOCOLS:
            raise UsageError(f"security.protocol must be one of {', '.join(PROTOCOLS)}, "
                             f"got {config['security.protocol']!r}")
        mechanism = _mechanism(config, protocol)
        sasl_keys = [k for k in ("sasl.mechanism", "sasl.mechanisms", "sasl.username",
                                 "sasl.password") if k in config]
        ssl_keys = [k for k in config if k.startswith("ssl.")]
        if mechanism is None and sasl_keys:
            raise UsageError(f"{sasl_keys[0]} is set but security.protocol is {protocol}"
                             " (SASL_SSL or SASL_PLAINTEXT use it)")
        if protocol not in ("SSL", "SASL_SSL") and ssl_keys:
            raise UsageError(f"{ssl_keys[0]} is set but security.protocol is {protocol}"
                             " (SSL or SASL_SSL use it)")
        username = password = None
        if mechanism is not None:
            username, password = config.get("sasl.username"), config.get("sasl.password")
            if not username or password is None:
                missing = "sasl.username" if not username else "sasl.password"
                raise UsageError(f"SASL {mechanism} needs {missing} (in --kafka-config or "
                                 f"GPUFLIGHT_KAFKA_{missing.upper().replace('.', '_')})")
        context = _ssl_context(config) if protocol in ("SSL", "SASL_SSL") else None
        return cls(protocol, mechanism, username, password, context)


def _mechanism(config: Mapping[str, str], protocol: str) -> str | None:
    if not protocol.startswith("SASL_"):
        return None
    # librdkafka's default mechanism is GSSAPI: say so rather than guess another.
    raw = config.get("sasl.mechanism", config.get("sasl.mechanisms", "GSSAPI"))
    mechanism = raw.strip().upper()
    if mechanism not in MECHANISMS:
        raise UsageError(f"SASL mechanism {raw!r} not supported by the stream worker "
                         f"(set sasl.mechanism to {', '.join(MECHANISMS)})")
    return mechanism


def _ssl_context(config: Mapping[str, str]) -> ssl.SSLContext:
    """A client TLS context as librdkafka would make of the properties: the CA (a file, a
    directory, or the system's with `probe` or none set), the client certificate and key, and
    the broker's name checked against its certificate unless the algorithm is `none`."""
    ca = config.get("ssl.ca.location", "").strip()
    try:
        if not ca or ca == "probe":
            context = ssl.create_default_context()
        elif Path(ca).is_dir():
            context = ssl.create_default_context(capath=ca)
        else:
            context = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"ssl.ca.location {ca}: cannot load it ({_reason(exc)})") from None
    certificate = config.get("ssl.certificate.location", "").strip()
    key = config.get("ssl.key.location", "").strip()
    if key and not certificate:
        raise UsageError("ssl.key.location is set without ssl.certificate.location")
    if certificate:
        try:
            context.load_cert_chain(certificate, key or None, config.get("ssl.key.password"))
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"ssl.certificate.location {certificate}"
                             f"{f' / ssl.key.location {key}' if key else ''}: cannot load the "
                             f"client certificate ({_reason(exc)})") from None
    elif "ssl.key.password" in config:
        raise UsageError("ssl.key.password is set without ssl.certificate.location")
    algorithm = config.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm not in ("https", "none"):
        raise UsageError("ssl.endpoint.identification.algorithm must be https or none, "
                         f"got {algorithm!r}")
    context.check_hostname = algorithm == "https"
    return context


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


# -- does the broker take the credentials? ---------------------------------------------------

#: librdkafka error codes that mean the broker refused who we are (or we refused the broker):
#: retrying will not help. _AUTHENTICATION (-169), _SSL (-181), ILLEGAL_SASL_STATE (34),
#: UNSUPPORTED_SASL_MECHANISM (33), SASL_AUTHENTICATION_FAILED (58).
REFUSED_CODES: Final = frozenset({-169, -181, 33, 34, 58})
#: librdkafka's _ALL_BROKERS_DOWN: nothing answers at any bootstrap address.
ALL_BROKERS_DOWN: Final = -187
#: librdkafka's _UNSUPPORTED_FEATURE: what answers does not serve metadata as a broker does
#: (a KRaft controller's port, a broker older than 0.11): it never will, so it is not waited on.
UNSUPPORTED_FEATURE: Final = -165

_QUIET = logging.getLogger(f"{__name__}.librdkafka")
_QUIET.propagate = False
_QUIET.addHandler(logging.NullHandler())


def is_refusal(error: Any) -> bool:
    """Whether a confluent-kafka KafkaError says the credentials (or TLS) were refused."""
    code = getattr(error, "code", None)
    return callable(code) and code() in REFUSED_CODES


def _code(error: Any) -> int | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def check_access(bootstrap: str, config: Mapping[str, str],
                 timeout_s: float = 10.0) -> str | None:
    """Ask the broker for its metadata with these settings. None when it answered; a
    ServiceError at once when it refused the credentials or TLS, or is no broker (a port that
    answers but serves no metadata: a KRaft controller's); else, when it could not be
    reached (nothing listening, or no answer within timeout_s), what librdkafka last said, and
    the caller decides (the producer buffers, replay gives up). A setting librdkafka does not
    know is a UsageError."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[Any] = []
    done = threading.Event()

    def on_error(error: Any) -> None:
        log.debug("Kafka: %s", error)
        errors.append(error)
        if is_refusal(error) or _code(error) in (ALL_BROKERS_DOWN, UNSUPPORTED_FEATURE):
            done.set()

    settings: dict[str, Any] = {**config, "bootstrap.servers": bootstrap,
                                "error_cb": on_error, "logger": _QUIET}
    try:
        admin = AdminClient(settings)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        raise UsageError(f"Kafka settings: {_text(error)}") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"Kafka settings: {exc}") from None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not done.is_set():
        try:
            if admin.list_topics(timeout=min(1.0, max(deadline - time.monotonic(), 0.1))
                                 ).brokers:
                return None
        except KafkaException as exc:
            if exc.args:
                on_error(exc.args[0])
        admin.poll(0)  # serves error_cb
    refused = [e for e in errors if is_refusal(e)]
    if refused:
        raise ServiceError(f"Kafka at {bootstrap} refused the connection: {_text(refused[0])}")
    if any(_code(e) == UNSUPPORTED_FEATURE for e in errors):
        raise ServiceError(f"{bootstrap} is not a Kafka broker's port (it answers, but serves no "
                           "metadata: a KRaft controller's port? the brokers' listeners are in "
                           "its server.properties)")
    return _text(errors[-1]) if errors else f"no answer within {timeout_s:g} s"


def _text(error: Any) -> str:
    return str(error.str()) if hasattr(error, "str") else str(error)
