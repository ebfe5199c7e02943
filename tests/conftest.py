"""Shared fixtures, and the markers that say what a test needs of the machine.

    bpf          root, bcc and kernel headers: it loads BPF programs and attaches probes
    kafka        a Kafka broker's jars and Java: it starts brokers (scripts/setup-kafka)
    influx       InfluxDB 1.8: it starts one (scripts/setup-influxdb)
    simgpu       the simulated GPU built (gpuflight/simgpu): a C compiler and NVIDIA's headers
    frameworks   the frameworks venv: real PyTorch on the simulated GPU (scripts/setup-frameworks)

One hook (pytest_runtest_setup) turns them into requirements before a test runs: what is
missing skips the test with the reason, or fails it under CI=true, where nothing may be
skipped. Fixtures that start a service mark the tests that use them. tests/unit/ needs none
of them (a marked unit test is a collection error); tests/system/ is where they go.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

# Registered here, before any test module imports it (the system tests do).
pytest_plugins = [
    "tests.support.kafka_fixture",
    "tests.support.influx_fixture",
    "tests.support.pipeline_fixture",
]

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# Tests (and the gpuflight they start) neither read nor write the user's verdict cache
# (producer/discover/verdictcache.py): each classifies from the files. Tests of the cache pass
# a folder.
os.environ.setdefault("GPUFLIGHT_CACHE_DIR", "off")


def bpf_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to attach uprobes"
    if importlib.util.find_spec("bcc") is None:
        return "bcc (python3-bpfcc) is not importable"
    if not (Path("/lib/modules") / os.uname().release / "build" / "include").is_dir():
        return "no kernel headers (run scripts/setup)"
    return None


def _kafka_unavailable_reason() -> str | None:
    from tests.support.kafka_fixture import kafka_unavailable_reason

    return kafka_unavailable_reason()


def _influx_unavailable_reason() -> str | None:
    from tests.support.influx_fixture import influx_unavailable_reason

    return influx_unavailable_reason()


def simgpu_unavailable_reason() -> str | None:
    from gpuflight.simgpu.build import find_cuda_include
    from gpuflight.simgpu.cbuild import BuildError

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return "no C compiler (apt-get install gcc)"
    try:
        for major in (13, 12):
            find_cuda_include(major)
    except BuildError as exc:
        return str(exc)
    return None


def frameworks_unavailable_reason() -> str | None:
    from tests.support.frameworks import frameworks_python

    if frameworks_python() is None:
        return ("no frameworks venv (run scripts/setup-frameworks, or set GF_FRAMEWORKS_PYTHON "
                "to a python with torch)")
    return None


#: Each marker, what it needs, and the function that says why that is missing (None: it is not).
REQUIREMENTS: dict[str, tuple[str, Callable[[], str | None]]] = {
    "bpf": ("root, bcc and kernel headers (loads BPF programs)", bpf_unavailable_reason),
    "kafka": ("a Kafka broker's jars and Java (starts brokers)", _kafka_unavailable_reason),
    "influx": ("InfluxDB 1.8 (starts one)", _influx_unavailable_reason),
    "simgpu": ("the simulated GPU built: a C compiler and NVIDIA's headers",
               simgpu_unavailable_reason),
    "frameworks": ("the frameworks venv: real PyTorch on the simulated GPU",
                   frameworks_unavailable_reason),
}
#: Fixtures that start a service: a test that uses one needs what it needs.
FIXTURE_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "kafka_bootstrap": ("kafka",),
    "kafka_ready": ("kafka",),
    "influx_url": ("influx",),
    "influx_auth": ("influx",),
    "pipeline": ("bpf", "kafka", "influx"),
}


def pytest_configure(config: pytest.Config) -> None:
    for marker, (needs, _) in REQUIREMENTS.items():
        config.addinivalue_line("markers", f"{marker}: needs {needs}; skipped without it, "
                                "failed under CI=true")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unit = REPO / "tests" / "unit"
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            for marker in FIXTURE_REQUIREMENTS.get(fixture, ()):
                item.add_marker(marker)
        marked = sorted({m.name for m in item.iter_markers() if m.name in REQUIREMENTS})
        if marked and item.path.is_relative_to(unit):
            raise pytest.UsageError(f"{item.nodeid} is a unit test but needs {', '.join(marked)}:"
                                    " it belongs in tests/system/")


@functools.cache
def _missing(marker: str) -> str | None:
    return REQUIREMENTS[marker][1]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A marked test's requirements, before any of its fixtures is set up."""
    for marker in sorted({m.name for m in item.iter_markers() if m.name in REQUIREMENTS}):
        require(_missing(marker))


def require(reason: str | None) -> None:
    """Skip with the reason locally; fail under CI, where nothing may be skipped."""
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of the module's own for the workloads it builds (tests/workloads/build.py)."""
    return tmp_path_factory.mktemp("workloads")


def one_line(error: pytest.ExceptionInfo[Exception]) -> str:
    """The message of a raised error, checked to be one non-empty line."""
    message = str(error.value)
    assert "\n" not in message and message
    return message
