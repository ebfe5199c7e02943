"""Can this machine run probes? Each missing piece is one clear line."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from gpuflight.producer.contract.errors import SetupError

log = logging.getLogger(__name__)

TRACEFS = Path("/sys/kernel/tracing")
#: Machines whose calling convention the probes decode (bpf/cudart.bpf.c reads arguments past
#: the sixth, and the return address, from the x86-64 stack).
SUPPORTED_MACHINES = frozenset({"x86_64"})

# Capability bits (linux/capability.h).
CAP_DAC_READ_SEARCH = 2
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21

#: What the node agent (`gpuflight producer`) uses each capability for: with these alone (as
#: root, every other capability dropped) it captures every process of the node. CAP_SYS_ADMIN
#: covers CAP_BPF and CAP_PERFMON in the kernel's checks, so they are not asked for apart.
NODE_CAPABILITIES: Mapping[str, tuple[int, str]] = {
    "CAP_SYS_ADMIN": (CAP_SYS_ADMIN, "/proc/PID/map_files (a library deleted or replaced "
                      "since it was mapped), uprobes on kernels without uprobe_multi links "
                      "(before 6.6: perf_event_open of a uprobe takes it since 6.16) and BPF"),
    "CAP_SYS_PTRACE": (CAP_SYS_PTRACE, "the maps and mount namespaces (/proc/PID/maps, "
                       "/proc/PID/root) of processes with capabilities it lacks"),
    "CAP_DAC_READ_SEARCH": (CAP_DAC_READ_SEARCH, "libraries under other users' "
                            "private directories"),
}
#: `gpuflight trace` follows its own command, which runs with its capabilities and user: only
#: the probes need more than that.
TRACE_CAPABILITIES: Mapping[str, tuple[int, str]] = {
    "CAP_SYS_ADMIN": NODE_CAPABILITIES["CAP_SYS_ADMIN"],
}


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int:
    """This process's effective capability set, as a bit mask (CapEff)."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise SetupError(f"{status} says nothing of this process's capabilities")


def missing_capabilities(
    needed: Mapping[str, tuple[int, str]], effective: int | None = None
) -> list[str]:
    """The names of the capabilities in `needed` that the effective set lacks."""
    have = effective_capabilities() if effective is None else effective
    return [name for name, (bit, _) in needed.items() if not have >> bit & 1]


def check_can_probe(
    modules_root: Path = Path("/lib/modules"),
    machine: str | None = None,
    capabilities: Mapping[str, tuple[int, str]] = NODE_CAPABILITIES,
) -> None:
    """Raise SetupError unless an x86-64 machine, root with `capabilities`, bcc and kernel
    headers are all there."""
    machine = machine or os.uname().machine
    if machine not in SUPPORTED_MACHINES:
        raise SetupError(
            f"gpuflight probes x86-64 only, and this machine is {machine}: its probes read "
            "arguments at x86-64 stack offsets and would decode wrong values here"
        )
    if os.geteuid() != 0:
        raise SetupError(
            f"gpuflight needs root to attach eBPF uprobes ({', '.join(capabilities)}): "
            "run it as root, or through sudo"
        )
    if importlib.util.find_spec("bcc") is None:
        raise SetupError(
            "bcc is not installed for this Python: apt-get install python3-bpfcc "
            "(or run scripts/setup, which makes a virtualenv that sees it)"
        )
    release = os.uname().release
    build = modules_root / release / "build"
    if not (build / "include").is_dir():
        raise SetupError(
            f"no kernel headers for {release} at {build}: install linux-headers-{release}, "
            "or run scripts/setup (links Debian's linux-headers-amd64, which works for uprobes)"
        )
    missing = missing_capabilities(capabilities)
    if missing:
        name = missing[0]
        raise SetupError(
            f"gpuflight lacks {', '.join(missing)}, needed for {capabilities[name][1]}: "
            f"run it as root with {', '.join(capabilities)} (README: least privilege)"
        )


def ensure_tracefs() -> bool:
    """Mount tracefs if needed (tracepoints need it); False if it cannot be had."""
    if (TRACEFS / "events").is_dir():
        return True
    result = subprocess.run(
        ["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True, check=False
    )
    if result.returncode != 0:
        log.warning("tracefs is not mounted and could not be: child processes are found by "
                    "rescans only (%s)", result.stderr.decode().strip())
        return False
    return True
