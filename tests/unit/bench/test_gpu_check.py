"""scripts/gpu-check on a machine without a GPU: one clear line, exit 3, nothing else.

(On a GPU machine it is run by hand; its figures go in the release notes.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO


def has_nvidia_gpu() -> bool:
    """As bench/gpu_check.py decides it: an NVIDIA driver with a device."""
    return Path("/dev/nvidiactl").exists() and any(Path("/dev").glob("nvidia[0-9]*"))


def test_without_a_gpu_it_says_so_in_one_line() -> None:
    if has_nvidia_gpu():
        pytest.skip("a GPU is here: run scripts/gpu-check itself")
    proc = subprocess.run([str(REPO / "scripts" / "gpu-check")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "no NVIDIA GPU" in proc.stderr
