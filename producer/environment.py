"""Can this machine run probes? Each missing piece is one clear line."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
from pathlib import Path

from producer.errors import SetupError

log = logging.getLogger(__name__)

TRACEFS = Path("/sys/kernel/tracing")
#: Machines whose calling convention the probes decode (bpf/cudart.bpf.c reads arguments past
#: the sixth, and the return address, from the x86-64 stack).
SUPPORTED_MACHINES = frozenset({"x86_64"})


def check_can_probe(modules_root: Path = Path("/lib/modules"), machine: str | None = None) -> None:
    """Raise SetupError unless an x86-64 machine, root, bcc and kernel headers are all there."""
    machine = machine or os.uname().machine
    if machine not in SUPPORTED_MACHINES:
        raise SetupError(
            f"gpuflight probes x86-64 only, and this machine is {machine}: its probes read "
            "arguments at x86-64 stack offsets and would decode wrong values here"
        )
    if os.geteuid() != 0:
        raise SetupError(
            "gpuflight needs root to attach eBPF uprobes (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN); "
            "run it with sudo"
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
