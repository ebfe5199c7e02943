"""Real PyTorch for the tests: the frameworks venv (scripts/setup-frameworks) and its workloads."""

from __future__ import annotations

from pathlib import Path

from gpuflight.demo.torch_showcase import frameworks_python
from tests.conftest import REPO, require

__all__ = ["FRAMEWORKS", "frameworks_python", "require_frameworks_python"]

#: The torch workloads (tests/frameworks/*.py).
FRAMEWORKS = REPO / "tests" / "frameworks"


def require_frameworks_python() -> Path:
    """The frameworks venv's python; skips (fails under CI=true) when there is none."""
    path = frameworks_python()
    require(
        None
        if path
        else "no frameworks venv (run scripts/setup-frameworks, or set "
        "GF_FRAMEWORKS_PYTHON to a python with torch 2.15)"
    )
    assert path is not None
    return path
