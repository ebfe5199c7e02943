"""Who a process is: read once per process from /proc, published to the processes topic.

The job a process belongs to, in order of preference: its Kubernetes pod
(namespace/pod), its SLURM job, or its command and pid.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from gpuflight.producer.contract import wire
from gpuflight.producer.publish.redact import CmdlineMode, cmdline_for

_CONTAINER_ID: Final = re.compile(r"([0-9a-f]{64})")
_POD_UID: Final = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_SERVICE_ACCOUNT_NAMESPACE: Final = "var/run/secrets/kubernetes.io/serviceaccount/namespace"


def job_of(pid: int, comm: str | None, pod: str | None, namespace: str | None,
           slurm_job_id: str | None) -> str:
    """The job a process belongs to: its pod, else its SLURM job, else its command and pid."""
    if pod:
        return f"k8s:{namespace or 'default'}/{pod}"
    if slurm_job_id:
        return f"slurm:{slurm_job_id}"
    return f"{comm or 'unknown'}:{pid}"


def _clip(text: str | None) -> str | None:
    """A value from the process's environment, at most as long as the contract takes."""
    return None if text is None else text[: wire.MAX_TEXT]


def _read(path: Path, limit: int = 1 << 20) -> bytes | None:
    with contextlib.suppress(OSError), path.open("rb") as f:
        return f.read(limit)
    return None


def stat_fields(proc_root: Path, pid: int) -> tuple[str, list[str]] | None:
    """(comm, the fields after comm) of /proc/PID/stat; comm may hold spaces."""
    raw = _read(proc_root / str(pid) / "stat")
    if not raw:
        return None
    text = raw.decode(errors="replace")
    open_paren, close_paren = text.find("("), text.rfind(")")
    if open_paren < 0 or close_paren < 0:
        return None
    return text[open_paren + 1 : close_paren], text[close_paren + 2 :].split()


def start_time(proc_root: Path, pid: int) -> int:
    """The process's start time in clock ticks since boot (0 if it is gone)."""
    fields = stat_fields(proc_root, pid)
    # Fields after comm start at field 3 (state); starttime is field 22.
    return int(fields[1][19]) if fields and len(fields[1]) > 19 else 0


def _boot_time_ns(proc_root: Path) -> int | None:
    raw = _read(proc_root / "stat")
    for line in (raw or b"").splitlines():
        if line.startswith(b"btime "):
            return int(line.split()[1]) * 1_000_000_000
    return None


#: The team a process's cost is rolled up under: a pod label given to the container by the
#: downward API (`valueFrom.fieldRef.fieldPath: metadata.labels['team']`), or set by hand.
TEAM_VARIABLE: Final = "GPUFLIGHT_TEAM"
#: The environment variables an identity is made of; no other is read out of /proc/PID/environ.
ENVIRON_NAMES: Final = ("KUBERNETES_SERVICE_HOST", "POD_NAME", "POD_NAMESPACE", "HOSTNAME",
                        "SLURM_JOB_ID", TEAM_VARIABLE)
#: How much of /proc/PID/environ is read: this first, and up to the most the kernel allows
#: (a quarter of the stack limit for argv and environ together, 2 MiB by default) when that
#: is not enough.
ENVIRON_FIRST: Final = 64 << 10
ENVIRON_LIMIT: Final = 4 << 20


def environ_values(raw: bytearray, names: Sequence[str] = ENVIRON_NAMES) -> dict[str, str]:
    """The values of `names` in an environ block (NAME=value, NUL-separated; the first of a
    name wins, as getenv has it), and nothing else: the block is searched, never split, and
    zeroed before returning, so no other variable (a token, a password) outlives this call."""
    found: dict[str, str] = {}
    try:
        for name in names:
            needle = name.encode() + b"="
            if raw.startswith(needle):
                start = len(needle)
            else:
                at = raw.find(b"\0" + needle)
                if at < 0:
                    continue
                start = at + 1 + len(needle)
            end = raw.find(b"\0", start)
            found[name] = raw[start : end if end >= 0 else len(raw)].decode(errors="replace")
    finally:
        raw[:] = bytes(len(raw))  # in place: same length, no reallocation
    return found


def _read_environ(path: Path, limit: int) -> tuple[bytearray, int]:
    """Up to `limit` bytes of an environ file, read straight into a buffer of that size
    (unbuffered: no copy stays in a file object); the buffer and how much was read."""
    raw = bytearray(limit)
    size = 0
    try:
        with open(path, "rb", buffering=0) as f, memoryview(raw) as view:
            while size < limit:
                n = f.readinto(view[size:])
                if not n:
                    break
                size += n
    except OSError:
        pass
    return raw, size


def _environ(proc_root: Path, pid: int) -> dict[str, str]:
    """The variables of ENVIRON_NAMES in the process's environment, and no other."""
    path = proc_root / str(pid) / "environ"
    raw, size = _read_environ(path, ENVIRON_FIRST)
    if size == ENVIRON_FIRST:  # more than that: once more, whole (rare: huge environments)
        raw[:] = bytes(len(raw))
        raw, size = _read_environ(path, ENVIRON_LIMIT)
    return environ_values(raw)


def resolve(proc_root: Path, pid: int, host: str, clock_ticks: int = 100,
            cmdline: CmdlineMode = "redacted") -> wire.ProcessRecord:
    """Everything /proc says about a process; fields of a vanished process are None. Its
    command line is kept in full, redacted (producer.publish.redact: no secrets) or not at all."""
    base = proc_root / str(pid)
    fields = stat_fields(proc_root, pid)
    ticks = int(fields[1][19]) if fields and len(fields[1]) > 19 else 0
    boot = _boot_time_ns(proc_root)
    argv = (_read(base / "cmdline") or b"").rstrip(b"\0").split(b"\0")
    cgroup = (_read(base / "cgroup") or b"").decode(errors="replace")
    env = _environ(proc_root, pid)
    exe: str | None = None
    with contextlib.suppress(OSError):
        exe = str((base / "exe").readlink())
    container = _CONTAINER_ID.search(cgroup)
    pod_uid = _POD_UID.search(cgroup)
    in_kubernetes = pod_uid is not None or "KUBERNETES_SERVICE_HOST" in env
    namespace = env.get("POD_NAMESPACE")
    if in_kubernetes and namespace is None:
        raw_ns = _read(base / "root" / _SERVICE_ACCOUNT_NAMESPACE, 256)
        namespace = raw_ns.decode().strip() if raw_ns else None
    comm = fields[0] if fields else None
    pod = _clip(env.get("POD_NAME") or env.get("HOSTNAME")) if in_kubernetes else None
    namespace = _clip(namespace)
    slurm_job_id = _clip(env.get("SLURM_JOB_ID"))
    return wire.ProcessRecord(
        host=host,
        pid=pid,
        start_time=ticks,
        started_at_ns=boot + ticks * 1_000_000_000 // clock_ticks if boot and ticks else None,
        comm=comm,
        cmdline=tuple(cmdline_for([c.decode(errors="replace") for c in argv if c], cmdline)),
        exe=_clip(exe),
        container_id=container.group(1) if container else None,
        pod_uid=pod_uid.group(1).replace("_", "-") if pod_uid else None,
        pod=pod,
        namespace=namespace,
        slurm_job_id=slurm_job_id,
        job=job_of(pid, comm, pod, namespace, slurm_job_id),
        team=_clip(env.get(TEAM_VARIABLE)),
    )
