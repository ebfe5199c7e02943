"""Shared fixtures. Tests that need root/BPF skip locally with a reason, but fail under CI=true."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

# Registered here, before any test module imports it (test_kafka does).
pytest_plugins = [
    "tests.support.kafka_fixture",
    "tests.support.influx_fixture",
    "tests.support.pipeline_fixture",
]

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# Tests (and the gpuflight they start) neither read nor write the user's verdict cache
# (producer/discover/verdictcache.py): each classifies from the files. Tests of the cache pass a
# folder.
os.environ.setdefault("GPUFLIGHT_CACHE_DIR", "off")


def bpf_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to attach uprobes"
    if importlib.util.find_spec("bcc") is None:
        return "bcc (python3-bpfcc) is not importable"
    if not (Path("/lib/modules") / os.uname().release / "build" / "include").is_dir():
        return "no kernel headers (run scripts/setup)"
    return None


def require(reason: str | None) -> None:
    """Skip with the reason locally; fail under CI, where nothing may be skipped."""
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def bpf_ready() -> None:
    require(bpf_unavailable_reason())


def one_line(error: pytest.ExceptionInfo[Exception]) -> str:
    """The message of a raised error, checked to be one non-empty line."""
    message = str(error.value)
    assert "\n" not in message and message
    return message
