"""A place other users write to (a team's directory, bpffs mounted 1777), and another user
(nobody) planting things there: how files gpuflight writes or reads are attacked on a shared
node. Needs root (to act as nobody): skips locally without it, fails under CI=true."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import require

NOBODY = 65534


def need_root() -> None:
    require(None if os.geteuid() == 0 else "needs root (plants files as another user, nobody)")
    require(None if shutil.which("setpriv") else "no setpriv (util-linux)")


@contextmanager
def shared_directory(mode: int = 0o777) -> Iterator[Path]:
    """A directory anyone may write in (not sticky, as a team's directory: the kernel's
    fs.protected_* settings, which only guard sticky ones, do not come into it)."""
    need_root()
    path = Path(tempfile.mkdtemp(prefix="gpuflight-shared-", dir="/tmp"))
    try:
        path.chmod(mode)
        yield path
    finally:
        shutil.rmtree(path)


def as_nobody(*argv: str | Path) -> None:
    """Run a command as nobody (no groups), which must succeed."""
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    "--", *map(str, argv)], check=True, timeout=30)
