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


def check_can_probe(modules_root: Path = Path("/lib/modules")) -> None:
    """Raise SetupError unless root, bcc and kernel headers are all there."""
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
