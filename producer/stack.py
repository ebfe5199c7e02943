"""`gpuflight stack up|down|status`: the local services gpuflight publishes to, on loopback only.

Two services, each a process of its own:
  - a single-node Apache Kafka 4 broker in KRaft mode (broker and controller in one JVM), run
    from the jars that scripts/setup-kafka copies into .cache/kafka/libs;
  - InfluxDB 1.8 (influxd, built by scripts/setup-influxdb into .cache/influxdb), which serves
    both the v2 write API (/api/v2/write, influxdb-client's) and InfluxQL (/query); database
    "db" with retention policy "rp" is the v2 bucket "db/rp".
A stack lives in one data directory (default ~/.local/share/gpuflight/stack, under
$XDG_DATA_HOME if set):

    kafka.log            the broker's stdout and stderr (the previous run's: kafka.log.1)
    kafka.pid            while it runs
    kafka/               server.properties and log4j2.properties, rewritten at each `up`
    kafka/data/          log.dirs: the topics and the KRaft metadata log, kept across down/up
                         (retention is unlimited: topics stay for postmortem replay)
    influxdb.log         influxd's output (the previous run's: influxdb.log.1)
    influxdb.pid         while it runs
    influxdb/            influxdb.conf, rewritten at each `up`
    influxdb/{meta,data,wal}/  the databases, kept across down/up (autogen keeps points forever)

`up` on a service that already runs with the same ports is a no-op that returns the running one
(`KafkaHandle.already_running`, `InfluxHandle.already_running`); asking for other ports is a
StackError. Every failure is a StackError with a one-line message that says what to do.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from producer.errors import GpuflightError

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_KAFKA_PORT = 9092
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
REPO = Path(__file__).resolve().parent.parent
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
DEFAULT_INFLUX_PORT = 8086
# Where scripts/setup-influxdb builds influxd; GPUFLIGHT_INFLUXD overrides it.
DEFAULT_INFLUXD = REPO / ".cache" / "influxdb" / "influxd"

# Brokers this process started: waited for, so a stopped one leaves no zombie that looks alive.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class StackError(GpuflightError):
    """A local service cannot be set up, started or stopped; the message says why, in one line."""


@dataclass(frozen=True)
class KafkaHandle:
    data_dir: Path
    port: int
    controller_port: int
    pid: int
    log_file: Path
    already_running: bool = False

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


@dataclass(frozen=True)
class InfluxHandle:
    data_dir: Path
    port: int
    rpc_port: int
    pid: int
    log_file: Path
    already_running: bool = False

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass(frozen=True)
class Service:
    """One service of the stack; `up` starts it with its default ports (InfluxDB goes beside)."""

    name: str
    up: Callable[[Path], object]
    down: Callable[[Path], bool]
    status: Callable[[Path], str]


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "gpuflight" / "stack"


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


def port_free(port: int) -> bool:
    """Whether a server could listen on HOST:port now (what Java does: SO_REUSEADDR set)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(avoid: frozenset[int] = frozenset()) -> int:
    """A port of HOST that nothing listens on now, chosen by the kernel."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if port not in avoid:
            return port


# -- the files of a stack --------------------------------------------------------------------

def _kafka_dir(data_dir: Path) -> Path:
    return data_dir / "kafka"


def _pid_file(data_dir: Path) -> Path:
    return data_dir / "kafka.pid"


def _log_file(data_dir: Path) -> Path:
    return data_dir / "kafka.log"


def _properties(data_dir: Path) -> Path:
    return _kafka_dir(data_dir) / "server.properties"


def _server_properties(data_dir: Path, port: int, controller_port: int) -> str:
    return f"""\
# Written by gpuflight (producer/stack.py) at each `stack up`: edits here are lost.
# One node, broker and KRaft controller in one process, on loopback only.
process.roles=broker,controller
node.id=1
# A static quorum: the ports live here, not in the metadata log, so they may change between runs.
controller.quorum.voters=1@{HOST}:{controller_port}
listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}
advertised.listeners=PLAINTEXT://{HOST}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
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
# Written by gpuflight (producer/stack.py) at each `stack up`: edits here are lost.
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
    port = re.search(r"^listeners=.*PLAINTEXT://[^:,]+:(\d+)", text, re.M)
    cport = re.search(r"^listeners=.*CONTROLLER://[^:,]+:(\d+)", text, re.M)
    if port is None or cport is None:
        return None
    return int(port[1]), int(cport[1])


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """One `up` or `down` at a time per data directory."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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


# -- processes -------------------------------------------------------------------------------

def _start_failed(name: str, where: str, *, pid: int, marker: str, pid_file: Path,
                  log_file: Path, last_line: Callable[[Path], str], timeout: float) -> StackError:
    """The error of a service that exited while starting or never answered (then stopped)."""
    if not _alive(pid, marker):
        pid_file.unlink(missing_ok=True)
        return StackError(f"{name} exited while starting: {last_line(log_file)} "
                          f"(all in {log_file})")
    _stop(pid, marker, STOP_TIMEOUT_S)
    pid_file.unlink(missing_ok=True)
    return StackError(f"{name} did not answer on {where} within {timeout:.0f} s, "
                      f"stopped it: {last_line(log_file)} (all in {log_file})")


def _stop_service(data_dir: Path, name: str, pid_file: Path, marker: str,
                  timeout: float) -> bool:
    with _locked(data_dir):
        pid = _running_pid(pid_file, marker)
        if pid is None:
            return False
        _stop(pid, marker, timeout)
        pid_file.unlink(missing_ok=True)
        log.info("%s (pid %d) stopped", name, pid)
        return True


def _service_status(pid_file: Path, marker: str, ports: tuple[int, int] | None) -> str:
    pid = _running_pid(pid_file, marker)
    if pid is None or ports is None:
        return "stopped"
    return f"running on {HOST}:{ports[0]} (pid {pid})"


def _alive(pid: int, marker: str) -> bool:
    """Whether pid is running (not a zombie) with marker among its arguments."""
    child = _CHILDREN.get(pid)
    if child is not None:  # ours: poll() also reaps it
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[0]
    return state not in {"Z", "X"} and marker.encode() in args


def _running_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in pid_file if that process still runs; a stale file is removed."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if pid > 0 and _alive(pid, marker):
        return pid
    pid_file.unlink(missing_ok=True)
    return None


def _spawn(command: list[str], cwd: Path, log_file: Path, pid_file: Path,
           env: dict[str, str] | None = None) -> int:
    """Start command in its own session, output to log_file (the previous one kept as .1)."""
    if log_file.exists():
        log_file.replace(log_file.with_name(log_file.name + ".1"))
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _CHILDREN[proc.pid] = proc
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def _stop(pid: int, marker: str, timeout: float) -> None:
    """SIGTERM, then SIGKILL after timeout seconds; returns once the process is gone."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        if sig == signal.SIGKILL:
            log.warning("pid %d did not stop within %.0f s of SIGTERM: killing it", pid, timeout)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid, marker):
                return
            time.sleep(0.1)
    raise StackError(f"pid {pid} is still running after SIGKILL")


# -- Kafka -----------------------------------------------------------------------------------

def _cluster_id() -> str:
    """A Kafka cluster id: a random UUID, base64url without padding (what StorageTool makes)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):  # Kafka's Uuid.randomUuid() avoids these too
            return cid


def _format_storage(java: str, libs: Path, data_dir: Path) -> None:
    """Format the KRaft log directory once; a formatted one is left alone."""
    log_dir = _kafka_dir(data_dir) / "data"
    if (log_dir / "meta.properties").exists():
        return
    log4j = _kafka_dir(data_dir) / "log4j2.properties"
    command = [java, "-Xmx256m", f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{libs}/*",
               "kafka.tools.StorageTool", "format", "-t", _cluster_id(),
               "-c", str(_properties(data_dir))]
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


def kafka_up(data_dir: Path, port: int = DEFAULT_KAFKA_PORT, controller_port: int | None = None,
             *, libs: Path | None = None, timeout: float = START_TIMEOUT_S) -> KafkaHandle:
    """Start the broker of data_dir on HOST:port and return once it answers metadata requests.

    controller_port defaults to port + 1, or to any free port when that one is busy (it is only
    used inside the node). A running broker with these ports is returned as it is.
    """
    data_dir = data_dir.expanduser().resolve()
    properties = _properties(data_dir)
    with _locked(data_dir):
        pid = _running_pid(_pid_file(data_dir), str(properties))
        if pid is not None:
            running = _read_ports(data_dir) or (0, 0)
            if running[0] != port or controller_port not in {None, running[1]}:
                raise StackError(
                    f"Kafka of {data_dir} already runs on {HOST}:{running[0]} (controller "
                    f"{running[1]}, pid {pid}): run `gpuflight stack down` first to change ports")
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
        libs = kafka_libs(libs)
        java = find_java()

        kafka_dir = _kafka_dir(data_dir)
        kafka_dir.mkdir(parents=True, exist_ok=True)
        properties.write_text(_server_properties(data_dir, port, controller_port))
        log4j = kafka_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2_PROPERTIES)
        _format_storage(java, libs, data_dir)

        log_file = _log_file(data_dir)
        command = [java, *KAFKA_JAVA_OPTS, f"-Dlog4j2.configurationFile={log4j}",
                   "-cp", f"{libs}/*", "kafka.Kafka", str(properties)]
        started = time.monotonic()
        pid = _spawn(command, kafka_dir, log_file, _pid_file(data_dir))
        handle = KafkaHandle(data_dir, port, controller_port, pid, log_file)
        if _wait_until_answers(handle.bootstrap, lambda: _alive(pid, str(properties)),
                               started + timeout):
            log.info("Kafka up on %s (pid %d) in %.1f s", handle.bootstrap, pid,
                     time.monotonic() - started)
            return handle
        raise _start_failed("Kafka", handle.bootstrap, pid=pid, marker=str(properties),
                            pid_file=_pid_file(data_dir), log_file=log_file,
                            last_line=_last_log_line, timeout=timeout)


def kafka_down(data_dir: Path, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the broker of data_dir (SIGTERM, SIGKILL after timeout); False if none ran."""
    data_dir = data_dir.expanduser().resolve()
    return _stop_service(data_dir, "Kafka", _pid_file(data_dir), str(_properties(data_dir)),
                         timeout)


def kafka_status(data_dir: Path) -> str:
    """'running on 127.0.0.1:9092 (pid N)' or 'stopped'."""
    data_dir = data_dir.expanduser().resolve()
    return _service_status(_pid_file(data_dir), str(_properties(data_dir)), _read_ports(data_dir))


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


# -- InfluxDB --------------------------------------------------------------------------------

def find_influxd(binary: Path | None = None) -> Path:
    """The influxd to run; StackError when scripts/setup has not built it."""
    if binary is None:
        binary = Path(os.environ.get("GPUFLIGHT_INFLUXD") or DEFAULT_INFLUXD)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise StackError(f"no influxd at {binary}: run scripts/setup")
    return binary


def _influx_dir(data_dir: Path) -> Path:
    return data_dir / "influxdb"


def _influx_pid_file(data_dir: Path) -> Path:
    return data_dir / "influxdb.pid"


def _influx_log_file(data_dir: Path) -> Path:
    return data_dir / "influxdb.log"


def _influx_conf(data_dir: Path) -> Path:
    return _influx_dir(data_dir) / "influxdb.conf"


def _influx_config(data_dir: Path, port: int, rpc_port: int) -> str:
    def path(name: str) -> str:  # a TOML basic string: JSON's escapes are TOML's
        return json.dumps(str(_influx_dir(data_dir) / name))

    return f"""\
# Written by gpuflight (producer/stack.py) at each `stack up`: edits here are lost.
# One node on loopback only, no authentication.
reporting-disabled = true
# The RPC service (backup and restore); its default, 8088, is a popular port.
bind-address = "{HOST}:{rpc_port}"

[meta]
  dir = {path("meta")}

[data]
  dir = {path("data")}
  wal-dir = {path("wal")}
  query-log-enabled = false

[monitor]
  # No _internal database growing beside ours every 10 s.
  store-enabled = false

[http]
  bind-address = "{HOST}:{port}"
  auth-enabled = false
  flux-enabled = true
  # No line per request in influxdb.log (failed writes are answered to the writer).
  log-enabled = false

[logging]
  suppress-logo = true
"""


def _read_influx_ports(data_dir: Path) -> tuple[int, int] | None:
    """(HTTP port, RPC port) from the influxdb.conf of the last `up`, if any."""
    try:
        config = tomllib.loads(_influx_conf(data_dir).read_text())
        http = str(config["http"]["bind-address"]).rpartition(":")[2]
        rpc = str(config["bind-address"]).rpartition(":")[2]
        return int(http), int(rpc)
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError):
        return None


def _last_influx_log_line(path: Path) -> str:
    """The line of influxd's log that says most: the last error, else the last line.

    influxd logs logfmt (`ts=... lvl=info msg="..."`); what makes it exit comes last, as a
    plain line ("run: open server: listen: ... address already in use").
    """
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return f"no log at {path}"
    lines = [line for line in lines if line]
    if not lines:
        return f"nothing in {path}"
    for line in reversed(lines):
        if line.startswith("run: ") or re.search(r"\blvl=(error|fatal)\b", line):
            return line[:400]
    return lines[-1][:400]


# Loopback needs no proxy, whatever http_proxy says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _wait_for_ping(url: str, alive: Callable[[], bool], deadline: float) -> bool:
    """Wait until url/ping answers 204; False if the server died or the deadline passed."""
    while time.monotonic() < deadline and alive():
        try:
            with _DIRECT.open(f"{url}/ping", timeout=1.0) as response:
                if response.status == 204:
                    return True
        except OSError:  # refused until it listens (URLError, a reset, a timeout)
            pass
        time.sleep(0.1)
    return False


def influx_up(data_dir: Path, port: int = DEFAULT_INFLUX_PORT, *, rpc_port: int | None = None,
              binary: Path | None = None, timeout: float = START_TIMEOUT_S) -> InfluxHandle:
    """Start the InfluxDB of data_dir on HOST:port and return once /ping answers.

    rpc_port (backup and restore only) defaults to any free port. A running InfluxDB with
    this HTTP port is returned as it is.
    """
    data_dir = data_dir.expanduser().resolve()
    conf = _influx_conf(data_dir)
    marker = str(conf)
    with _locked(data_dir):
        pid = _running_pid(_influx_pid_file(data_dir), marker)
        if pid is not None:
            running = _read_influx_ports(data_dir) or (0, 0)
            if running[0] != port or rpc_port not in {None, running[1]}:
                raise StackError(
                    f"InfluxDB of {data_dir} already runs on {HOST}:{running[0]} (RPC "
                    f"{running[1]}, pid {pid}): run `gpuflight stack down` first to change ports")
            return InfluxHandle(data_dir, running[0], running[1], pid,
                                _influx_log_file(data_dir), already_running=True)

        if not port_free(port):
            raise StackError(f"port {HOST}:{port} is busy: another InfluxDB or program listens "
                             f"there (ss -ltnp 'sport = :{port}'); stop it or choose another port")
        if rpc_port is None:
            rpc_port = free_port(frozenset({port}))
        elif rpc_port == port or not port_free(rpc_port):
            raise StackError(f"RPC port {HOST}:{rpc_port} is busy"
                             f"{' (it is the HTTP port)' if rpc_port == port else ''}: "
                             "choose another")
        influxd = find_influxd(binary)

        _influx_dir(data_dir).mkdir(parents=True, exist_ok=True)
        conf.write_text(_influx_config(data_dir, port, rpc_port))
        # influxd lets INFLUXDB_* variables override its configuration file: none of those.
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("INFLUXDB_")}
        log_file = _influx_log_file(data_dir)
        started = time.monotonic()
        pid = _spawn([str(influxd), "run", "-config", marker], _influx_dir(data_dir), log_file,
                     _influx_pid_file(data_dir), env)
        handle = InfluxHandle(data_dir, port, rpc_port, pid, log_file)
        if _wait_for_ping(handle.url, lambda: _alive(pid, marker), started + timeout):
            log.info("InfluxDB up on %s (pid %d) in %.1f s", handle.url, pid,
                     time.monotonic() - started)
            return handle
        raise _start_failed("InfluxDB", f"{handle.url}/ping", pid=pid, marker=marker,
                            pid_file=_influx_pid_file(data_dir), log_file=log_file,
                            last_line=_last_influx_log_line, timeout=timeout)


def influx_down(data_dir: Path, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the InfluxDB of data_dir (SIGTERM, SIGKILL after timeout); False if none ran."""
    data_dir = data_dir.expanduser().resolve()
    return _stop_service(data_dir, "InfluxDB", _influx_pid_file(data_dir),
                         str(_influx_conf(data_dir)), timeout)


def influx_status(data_dir: Path) -> str:
    """'running on 127.0.0.1:8086 (pid N)' or 'stopped'."""
    data_dir = data_dir.expanduser().resolve()
    return _service_status(_influx_pid_file(data_dir), str(_influx_conf(data_dir)),
                           _read_influx_ports(data_dir))


def create_database(url: str, name: str, *, timeout: float = 30.0) -> None:
    """CREATE DATABASE name (InfluxQL, POST /query): a database that exists is left as it is."""
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    body = urllib.parse.urlencode({"q": f'CREATE DATABASE "{quoted}"'}).encode()
    request = urllib.request.Request(f"{url}/query", data=body, method="POST")
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        reason = exc.read().decode(errors="replace").strip() or f"HTTP {exc.code}"
        with contextlib.suppress(ValueError, AttributeError):
            reason = json.loads(reason).get("error") or reason
        raise StackError(f"cannot create database {name} on {url}: {reason}") from exc
    except (OSError, ValueError) as exc:
        why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise StackError(f"cannot create database {name}: {url} did not answer ({why})") from exc
    errors = [result["error"] for result in answer.get("results", []) if "error" in result]
    if errors:
        raise StackError(f"cannot create database {name} on {url}: {errors[0]}")


# -- the whole stack -------------------------------------------------------------------------

SERVICES: tuple[Service, ...] = (
    Service("kafka", kafka_up, kafka_down, kafka_status),
    Service("influxdb", influx_up, influx_down, influx_status),
)


def stack_up(data_dir: Path) -> None:
    for service in SERVICES:
        service.up(data_dir)


def stack_down(data_dir: Path) -> None:
    for service in reversed(SERVICES):
        service.down(data_dir)


def stack_status(data_dir: Path) -> list[str]:
    """One line per service: 'kafka: running on 127.0.0.1:9092 (pid N)', then 'influxdb: ...'."""
    return [f"{service.name}: {service.status(data_dir)}" for service in SERVICES]

