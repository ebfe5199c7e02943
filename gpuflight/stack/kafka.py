"""A single-node Apache Kafka 4 broker in KRaft mode (broker and controller in one JVM), run
from the jars that scripts/setup-kafka copies into .cache/kafka/libs.

Its files, under the stack's data directory:

    kafka.log            the broker's stdout and stderr (the previous run's: kafka.log.1)
    kafka.pid            while it runs
    kafka/               server.properties and log4j2.properties, rewritten at each `up`
    kafka/data/          log.dirs: the topics and the KRaft metadata log, kept across down/up
                         (retention is unlimited: topics stay for postmortem replay)
    kafka/keystore.pem   with `security`: the broker's key and certificate (mode 600)

Plaintext on loopback is the local stack. `kafka_up(..., security=BrokerSecurity(...))` starts
the broker as the fleet recipe configures it (compose/kafka/): clients authenticate with SASL
(SCRAM-SHA-512, SCRAM-SHA-256, PLAIN) over TLS on the broker port, optionally with client
certificates (mTLS) on another, and ACLs are enforced when asked; only the controller and
inter-broker listeners are plaintext, on loopback. Tests run producer, worker and replay
against it.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuflight.stack.service import (
    HOST,
    REPO,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    Service,
    StackError,
    alive,
    free_port,
    locked,
    port_free,
    running_pid,
    service_status,
    spawn,
    start_failed,
    stop_service,
)

log = logging.getLogger(__name__)

DEFAULT_KAFKA_PORT = 9092
# Where scripts/setup-kafka puts the jars; GPUFLIGHT_KAFKA_LIBS overrides it.
DEFAULT_KAFKA_LIBS = REPO / ".cache" / "kafka" / "libs"
# Heap as asked for a local broker; the GC flags are those of Kafka's own kafka-run-class.sh.
# log4j2's shutdown hook would stop logging while Kafka's shutdown hook is still at work (the
# last lines of a shutdown lost): off; the console appender flushes each line anyway.
KAFKA_JAVA_OPTS = (
    "-Xms256m", "-Xmx1g",
    "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
    "-Dlog4j2.shutdownHookEnabled=false",
)
INSTALL_JAVA = "install a Java 17+ runtime (apt-get install default-jre-headless)"
#: SASL mechanisms a secured broker offers (compose's offers the SCRAM ones).
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
#: What may be in a user name or password given to a secured broker (they are written into
#: kafka-storage's --add-scram and the PLAIN JAAS line, which have no escapes for others).
_CREDENTIAL = re.compile(r"[A-Za-z0-9._~+/-]+")


@dataclass(frozen=True)
class BrokerSecurity:
    """How a secured broker authenticates and authorizes (see the module's docstring).

    Who comes through the loopback plaintext listeners (User:ANONYMOUS) is a super user, as
    `super_users` are: that is how the broker talks to its own controller, and how an operator
    on the broker's host adds users and ACLs to a broker that has none yet. Client certificates
    name their user by their CN (`CN=producer,O=…` is User:producer), as SASL users are named.
    """

    #: The broker's certificate (PEM, its chain after it) and private key (PEM, PKCS#8, not
    #: encrypted): they name 127.0.0.1 and localhost, as clients check.
    certificate: Path
    key: Path
    #: The CA whose client certificates the mTLS listener takes (PEM).
    ca: Path
    #: SCRAM users (both SHA-256 and SHA-512, created when the log directory is formatted)
    #: and PLAIN users, with their passwords.
    users: Mapping[str, str]
    #: Also a TLS listener that requires a client certificate (mTLS), on this port.
    mtls_port: int | None = None
    #: Enforce ACLs (StandardAuthorizer); nobody but super users may do anything without one.
    authorizer: bool = False
    super_users: tuple[str, ...] = ("admin",)


@dataclass(frozen=True)
class KafkaHandle:
    data_dir: Path
    port: int
    controller_port: int
    pid: int
    log_file: Path
    already_running: bool = False
    #: With security: the plaintext inter-broker listener on loopback (a super user's way in).
    local_port: int | None = None
    mtls_port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def local_bootstrap(self) -> str:
        """The plaintext loopback listener: the broker port itself unless it is secured."""
        return f"{HOST}:{self.local_port or self.port}"


# -- what a broker needs ---------------------------------------------------------------------

def find_java() -> str:
    """The java to run ($JAVA_HOME/bin/java, else java on PATH); StackError unless Java 17+."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else None
    if java is None or not os.access(java, os.X_OK):
        java = shutil.which("java")
    if java is None:
        raise StackError(f"no java found: {INSTALL_JAVA}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"{java} -version failed ({exc}): {INSTALL_JAVA}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        raise StackError(f"cannot tell the version of {java}: {INSTALL_JAVA}")
    major = int(match[1]) if match[1] != "1" else int(match[2] or 0)  # "1.8.0" is Java 8
    if major < 17:
        raise StackError(f"{java} is Java {major}, Kafka 4 needs 17 or later: {INSTALL_JAVA}")
    return java


def kafka_libs(libs: Path | None = None) -> Path:
    """The folder of the broker's jars; StackError when scripts/setup has not copied them."""
    if libs is None:
        libs = Path(os.environ.get("GPUFLIGHT_KAFKA_LIBS") or DEFAULT_KAFKA_LIBS)
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise StackError(f"no Kafka jars in {libs}: run scripts/setup")
    return libs


def check_kafka_runnable(libs: Path | None = None) -> None:
    """StackError unless this machine can start a broker (Java 17+, the jars)."""
    kafka_libs(libs)
    find_java()


# -- the files of a broker ------------------------------------------------------------------

def _kafka_dir(data_dir: Path) -> Path:
    return data_dir / "kafka"


def _pid_file(data_dir: Path) -> Path:
    return data_dir / "kafka.pid"


def _log_file(data_dir: Path) -> Path:
    return data_dir / "kafka.log"


def _properties(data_dir: Path) -> Path:
    return _kafka_dir(data_dir) / "server.properties"


def _keystore(data_dir: Path) -> Path:
    return _kafka_dir(data_dir) / "keystore.pem"


def _listeners(data_dir: Path, port: int, controller_port: int,
               security: BrokerSecurity | None, local_port: int | None) -> str:
    if security is None:
        return f"""\
listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}
advertised.listeners=PLAINTEXT://{HOST}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
"""
    mtls = f",MTLS://{HOST}:{security.mtls_port}" if security.mtls_port else ""
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    plain_users = " ".join(f'user_{name}="{password}"'
                           for name, password in security.users.items())
    supers = ";".join(f"User:{name}" for name in ("ANONYMOUS", *security.super_users))
    authorizer = f"""\
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users={supers}
""" if security.authorizer else ""
    return f"""\
# Clients: SASL over TLS (and TLS with client certificates); plaintext only on loopback, for
# the controller and the broker itself.
listeners=CLIENT://{HOST}:{port}{mtls},LOCAL://{HOST}:{local_port},\
CONTROLLER://{HOST}:{controller_port}
advertised.listeners=CLIENT://{HOST}:{port}{mtls},LOCAL://{HOST}:{local_port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=LOCAL
listener.security.protocol.map=CLIENT:SASL_SSL,MTLS:SSL,LOCAL:PLAINTEXT,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms={",".join(SASL_MECHANISMS)}
listener.name.client.scram-sha-512.sasl.jaas.config={scram}
listener.name.client.scram-sha-256.sasl.jaas.config={scram}
listener.name.client.plain.sasl.jaas.config=\
org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};
ssl.keystore.type=PEM
ssl.keystore.location={_keystore(data_dir)}
ssl.truststore.type=PEM
ssl.truststore.location={security.ca}
listener.name.mtls.ssl.client.auth=required
ssl.principal.mapping.rules=RULE:^CN=([^,]+).*$/$1/,DEFAULT
{authorizer}"""


def _server_properties(data_dir: Path, port: int, controller_port: int,
                       security: BrokerSecurity | None = None,
                       local_port: int | None = None) -> str:
    return f"""\
# Written by gpuflight (gpuflight/stack/) at each `stack up`: edits here are lost.
# One node, broker and KRaft controller in one process, on loopback only.
process.roles=broker,controller
node.id=1
# A static quorum: the ports live here, not in the metadata log, so they may change between runs.
controller.quorum.voters=1@{HOST}:{controller_port}
{_listeners(data_dir, port, controller_port, security, local_port)}\
log.dirs={_kafka_dir(data_dir) / "data"}
# A single node: every internal topic with one replica.
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Topics are made on purpose (gpuflight creates its own) and kept for postmortem replay.
auto.create.topics.enable=false
num.partitions=1
log.retention.ms=-1
log.retention.bytes=-1
group.initial.rebalance.delay.ms=0
"""


# Kafka logs through SLF4J to log4j2 (log4j-slf4j2-impl); without a configuration log4j2 shows
# errors only. Console = stdout, which `up` sends to kafka.log.
_LOG4J2_PROPERTIES = """\
# Written by gpuflight (gpuflight/stack/) at each `stack up`: edits here are lost.
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
# Every component prints its whole configuration at start (~2,000 lines); server.properties says
# what was set.
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
"""


def _read_ports(data_dir: Path) -> tuple[int, int] | None:
    """(port, controller port) from the server.properties of the last `up`, if any."""
    try:
        text = _properties(data_dir).read_text()
    except OSError:
        return None
    port = re.search(r"^listeners=(?:PLAINTEXT|CLIENT)://[^:,]+:(\d+)", text, re.M)
    cport = re.search(r"^listeners=.*CONTROLLER://[^:,]+:(\d+)", text, re.M)
    if port is None or cport is None:
        return None
    return int(port[1]), int(cport[1])


def _last_log_line(path: Path) -> str:
    """The line of a Java log that says most: the last ERROR with its exception, else the last."""
    try:
        lines = [line.rstrip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return f"no log at {path}"
    lines = [line for line in lines if line.strip()]
    if not lines:
        return f"nothing in {path}"
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"\[[^]]*\] (ERROR|FATAL) ", lines[i]):
            line = lines[i]
            cause = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if re.match(r"[\w.$]+(Exception|Error)\b", cause):
                line = f"{line}: {cause}"
            return line[:400]
    return lines[-1][:400]


# -- the broker ------------------------------------------------------------------------------

def _cluster_id() -> str:
    """A Kafka cluster id: a random UUID, base64url without padding (what StorageTool makes)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):  # Kafka's Uuid.randomUuid() avoids these too
            return cid


def _format_storage(java: str, libs: Path, data_dir: Path,
                    security: BrokerSecurity | None = None) -> None:
    """Format the KRaft log directory once (with the SCRAM users of `security`); a formatted
    one is left alone."""
    log_dir = _kafka_dir(data_dir) / "data"
    if (log_dir / "meta.properties").exists():
        return
    log4j = _kafka_dir(data_dir) / "log4j2.properties"
    command = [java, "-Xmx256m", f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{libs}/*",
               "kafka.tools.StorageTool", "format", "-t", _cluster_id(),
               "-c", str(_properties(data_dir))]
    for name, password in (security.users.items() if security else ()):
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            command += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"formatting {log_dir} took over 120 s") from exc
    if out.returncode != 0:
        lines = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
        raise StackError(f"formatting {log_dir} failed: {lines[-1] if lines else out.returncode}")
    log.info("formatted %s", log_dir)


def _wait_until_answers(bootstrap: str, alive: Callable[[], bool], deadline: float) -> bool:
    """Wait until a broker at bootstrap answers a metadata request; False if it died or timed out.

    A TCP connect comes first: librdkafka would log every refused connection until then.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    host, _, port = bootstrap.rpartition(":")
    admin: AdminClient | None = None
    while time.monotonic() < deadline and alive():
        if admin is None:
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
            except OSError:
                time.sleep(0.2)
                continue
            admin = AdminClient({"bootstrap.servers": bootstrap}, logger=log)
        try:
            if admin.list_topics(timeout=1.0).brokers:
                return True
        except KafkaException:
            pass
    return False


def _check_security(security: BrokerSecurity) -> None:
    for name, password in security.users.items():
        if not (_CREDENTIAL.fullmatch(name) and _CREDENTIAL.fullmatch(password)):
            raise StackError(f"Kafka user {name!r}: names and passwords may hold only "
                             "letters, digits and ._~+/-")
    for path in (security.certificate, security.key, security.ca):
        if not path.is_file():
            raise StackError(f"no such file: {path}")


def _write_keystore(data_dir: Path, security: BrokerSecurity) -> None:
    """Kafka's PEM keystore is one file: the private key, then the certificate chain."""
    keystore = _keystore(data_dir)
    fd = os.open(keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(security.key.read_text().strip() + "\n")
        out.write(security.certificate.read_text().strip() + "\n")


def kafka_up(data_dir: Path, port: int = DEFAULT_KAFKA_PORT, controller_port: int | None = None,
             *, libs: Path | None = None, timeout: float = START_TIMEOUT_S,
             security: BrokerSecurity | None = None) -> KafkaHandle:
    """Start the broker of data_dir on HOST:port and return once it answers metadata requests.

    controller_port defaults to port + 1, or to any free port when that one is busy (it is only
    used inside the node). A running broker with these ports is returned as it is. With
    `security`, the broker port is SASL_SSL (see BrokerSecurity) and the broker's own plaintext
    listener takes another free loopback port (`KafkaHandle.local_port`).
    """
    data_dir = data_dir.expanduser().resolve()
    properties = _properties(data_dir)
    with locked(data_dir):
        pid = running_pid(_pid_file(data_dir), str(properties))
        if pid is not None:
            running = _read_ports(data_dir) or (0, 0)
            if running[0] != port or controller_port not in {None, running[1]}:
                raise StackError(
                    f"Kafka of {data_dir} already runs on {HOST}:{running[0]} (controller "
                    f"{running[1]}, pid {pid}): run `gpuflight stack down` first to change ports")
            if security is not None:
                raise StackError(f"Kafka of {data_dir} already runs (pid {pid}): run "
                                 "`gpuflight stack down` first to start it secured")
            return KafkaHandle(data_dir, running[0], running[1], pid, _log_file(data_dir),
                               already_running=True)

        if not port_free(port):
            raise StackError(f"port {HOST}:{port} is busy: another Kafka or program listens there "
                             f"(ss -ltnp 'sport = :{port}'); stop it or choose another port")
        if controller_port is None:
            controller_port = port + 1 if port_free(port + 1) else free_port(frozenset({port}))
        elif controller_port == port or not port_free(controller_port):
            raise StackError(f"controller port {HOST}:{controller_port} is busy"
                             f"{' (it is the broker port)' if controller_port == port else ''}: "
                             "choose another")
        local_port = None
        if security is not None:
            _check_security(security)
            taken = {port, controller_port, *([security.mtls_port] if security.mtls_port else [])}
            local_port = free_port(frozenset(taken))
            if security.mtls_port is not None and not port_free(security.mtls_port):
                raise StackError(f"mTLS port {HOST}:{security.mtls_port} is busy: choose another")
        libs = kafka_libs(libs)
        java = find_java()

        kafka_dir = _kafka_dir(data_dir)
        kafka_dir.mkdir(parents=True, exist_ok=True)
        if security is not None:
            _write_keystore(data_dir, security)
        text = _server_properties(data_dir, port, controller_port, security, local_port)
        # It may hold the PLAIN users' passwords: readable by its owner only.
        fd = os.open(properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        log4j = kafka_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2_PROPERTIES)
        _format_storage(java, libs, data_dir, security)

        log_file = _log_file(data_dir)
        command = [java, *KAFKA_JAVA_OPTS, f"-Dlog4j2.configurationFile={log4j}",
                   "-cp", f"{libs}/*", "kafka.Kafka", str(properties)]
        started = time.monotonic()
        pid = spawn(command, kafka_dir, log_file, _pid_file(data_dir))
        handle = KafkaHandle(data_dir, port, controller_port, pid, log_file,
                             local_port=local_port,
                             mtls_port=security.mtls_port if security else None)
        if _wait_until_answers(handle.local_bootstrap, lambda: alive(pid, str(properties)),
                               started + timeout):
            log.info("Kafka up on %s (pid %d) in %.1f s", handle.bootstrap, pid,
                     time.monotonic() - started)
            return handle
        raise start_failed("Kafka", handle.bootstrap, pid=pid, marker=str(properties),
                            pid_file=_pid_file(data_dir), log_file=log_file,
                            last_line=_last_log_line, timeout=timeout)


def kafka_down(data_dir: Path, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the broker of data_dir (SIGTERM, SIGKILL after timeout); False if none ran."""
    data_dir = data_dir.expanduser().resolve()
    return stop_service(data_dir, "Kafka", _pid_file(data_dir), str(_properties(data_dir)),
                         timeout)


def kafka_status(data_dir: Path) -> str:
    """'running on 127.0.0.1:9092 (pid N)' or 'stopped'."""
    data_dir = data_dir.expanduser().resolve()
    return service_status(_pid_file(data_dir), str(_properties(data_dir)), _read_ports(data_dir))


def create_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str],
                 *, timeout: float = 30.0) -> bool:
    """Create a topic with one replica; False when it exists already (its settings untouched)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=log)
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)
    future = admin.create_topics([topic], request_timeout=timeout)[name]
    try:
        future.result(timeout=timeout + 5)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        reason = error.str() if isinstance(error, KafkaError) else str(exc)
        raise StackError(f"cannot create topic {name} on {bootstrap}: {reason}") from exc
    except TimeoutError as exc:
        raise StackError(f"cannot create topic {name}: {bootstrap} did not answer") from exc
    return True


SERVICE = Service("kafka", kafka_up, kafka_down, kafka_status)
