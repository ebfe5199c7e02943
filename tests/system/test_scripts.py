"""The README's two commands as a new user runs them (#17): `scripts/demo` and `scripts/test`
work in a root shell with no sudo (and go through sudo from another account only where there
is one), and each sets up only what it needs (`scripts/setup demo` builds no Docker Compose,
no NVIDIA libraries, no frameworks venv).

The scripts run from a copy of scripts/ whose helpers (scripts/setup-*, scripts/setup itself
for demo and test, .venv/bin/*) are stand-ins that record how they were called: what is
tested is the scripts' own logic, not the installs (the rest of the suite runs on those).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, require

NOBODY = 65534
SETPRIV = shutil.which("setpriv") or "setpriv"
SETUP_HELPERS = ("setup-kafka", "setup-influxdb", "setup-nvml", "setup-libcuda",
                 "setup-compose", "setup-frameworks", "setup-otlp", "setup-promlint")
DEMO_NEEDS = {"setup-kafka", "setup-influxdb"}


def recorder(path: Path, log: Path) -> None:
    """A stand-in executable that appends its name and arguments to `log`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {log}\n')
    path.chmod(0o755)


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A directory any user can reach (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="gpuflight-scripts-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def tree(tmp: Path) -> Path:
    """A copy of the repository's scripts with stand-in helpers; world-readable, so another
    user can run it too."""
    root = tmp / "repo"
    (root / "scripts").mkdir(parents=True)
    log = tmp / "calls.log"
    log.touch()
    log.chmod(0o666)
    for name in ("demo", "test", "setup"):
        shutil.copy(REPO / "scripts" / name, root / "scripts" / name)
    for name in SETUP_HELPERS:
        recorder(root / "scripts" / name, log)
    for name in ("gpuflight", "ruff", "lint-imports", "mypy", "python", "mkdocs"):
        recorder(root / ".venv" / "bin" / name, log)
    for path in (tmp, *tmp.rglob("*")):
        path.chmod(path.stat().st_mode | 0o755 if path.is_dir() else path.stat().st_mode | 0o644)
    return root


def calls(tree: Path) -> list[str]:
    return (tree.parent / "calls.log").read_text().splitlines()


def stand_in_setup(tree: Path) -> None:
    recorder(tree / "scripts" / "setup", tree.parent / "calls.log")


def bin_without_sudo(tmp_path: Path) -> str:
    """A PATH with the usual tools and no sudo."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("sh", "bash", "id", "dirname", "basename", "cat", "env"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    bin_dir.chmod(0o755)
    return str(bin_dir)


def need_root() -> None:
    require(None if os.geteuid() == 0 else "needs root (runs the scripts as root and nobody)")


@pytest.mark.parametrize(("script", "profile"), [("demo", "demo"), ("test", "test")])
def test_runs_in_a_root_shell_without_sudo(tree: Path, tmp: Path, script: str,
                                           profile: str) -> None:
    need_root()
    stand_in_setup(tree)
    env = {"PATH": bin_without_sudo(tmp), "HOME": str(tmp)}
    proc = subprocess.run([str(tree / "scripts" / script), "--flag"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    done = calls(tree)
    assert done[0] == f"setup {profile}"
    if script == "demo":
        assert done[1:] == ["gpuflight demo --flag", "gpuflight demo --pipeline --flag"]
    else:
        assert done[-1] == "python -m pytest --flag"


@pytest.mark.parametrize("script", ["demo", "test"])
def test_another_user_without_sudo_is_told_in_one_line(tree: Path, tmp: Path,
                                                       script: str) -> None:
    need_root()
    env = {"PATH": bin_without_sudo(tmp), "HOME": "/"}
    proc = subprocess.run([SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", "--", str(tree / "scripts" / script)],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr == f"{script}: run as root (there is no sudo here)\n"
    assert calls(tree) == []


def test_another_user_goes_through_sudo_where_there_is_one(tree: Path, tmp: Path) -> None:
    need_root()
    bin_dir = bin_without_sudo(tmp)
    recorder(Path(bin_dir) / "sudo", tree.parent / "calls.log")
    proc = subprocess.run([SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", "--", str(tree / "scripts" / "demo"), "--flag"],
                          env={"PATH": bin_dir, "HOME": "/"}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert calls(tree) == [f"sudo -E {tree / 'scripts' / 'demo'} --flag"]


@pytest.mark.parametrize("profile", ["demo", "test"])
def test_setup_installs_only_what_its_command_needs(tree: Path, profile: str) -> None:
    """scripts/setup itself, with the machine already set up (as the suite's own run left it):
    it calls the helpers its profile needs, and no other."""
    need_root()
    venv = REPO / ".venv"
    require(None if (venv / ".gpuflight-installed").exists() else "no .venv (run scripts/setup)")
    shutil.rmtree(tree / ".venv")
    (tree / ".venv").symlink_to(venv.resolve())
    shutil.copy(REPO / "pyproject.toml", tree / "pyproject.toml")
    stamp = (venv / ".gpuflight-installed").read_text().strip()
    digest = subprocess.run(["sha256sum", str(tree / "pyproject.toml")], capture_output=True,
                            text=True, check=True).stdout.split()[0]
    require(None if stamp == digest else ".venv is not installed from this pyproject.toml")
    proc = subprocess.run([str(tree / "scripts" / "setup"), profile], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    ran = {line.split()[0] for line in calls(tree)}
    assert ran == (DEMO_NEEDS if profile == "demo" else set(SETUP_HELPERS))
