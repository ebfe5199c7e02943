"""The package works without a checkout: the built wheel carries the BPF sources, the demo's C
files and the simulated GPU's, and `gpuflight trace` runs from it in a fresh virtualenv outside
the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--disable-pip-version-check", "--wheel-dir", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300, cwd=out,
    )
    (built,) = out.glob("gpuflight-*.whl")
    return built


def test_the_wheel_carries_the_bpf_sources_and_no_tests(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"gpuflight/producer/bpf/cudart.bpf.c", "gpuflight/producer/bpf/events.h"} <= names
    # The demo's C and the simulated GPU it runs on (built where the demo runs).
    assert {"gpuflight/demo/fusion.c", "gpuflight/demo/cuda_abi.h", "gpuflight/simgpu/driver.c",
            "gpuflight/simgpu/runtime.c", "gpuflight/simgpu/nvml.c",
            "gpuflight/simgpu/cbuild.py"} <= names
    assert "gpuflight/producer/contract/prices.toml" in names
    assert {"gpuflight/cli.py", "gpuflight/streams/app.py",
            "gpuflight/producer/capture.py"} <= names
    # One top-level package: the generic names (producer, streams, grafana, bpf) live inside it.
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"gpuflight"}
    assert not any(name.startswith(("tests/", "bench/", "gpuflight/grafana/")) for name in names)


@pytest.mark.bpf
def test_gpuflight_trace_runs_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # Debian's Python, as scripts/setup uses: bcc is a system package.
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True, timeout=300)
    # The dependencies come from the test's own environment: a path line (no .pth files of
    # that directory run, so its editable finder, which points at the checkout, stays out).
    site = Path(sysconfig.get_paths()["purelib"])
    target = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    (target / "gpuflight-test-deps.pth").write_text(f"{site}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFLIGHT_BPF_DIR", "PYTHONPATH")}
    where = subprocess.run(
        [str(python), "-c", "import gpuflight.producer.settings as s, gpuflight; "
         "print(s.DEFAULT_BPF_DIR); print(gpuflight.__file__)"],
        check=True, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    ).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where
    proc = subprocess.run([str(venv / "bin" / "gpuflight"), "trace", "--", "true"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "gpuflight trace of 'true'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("setting", [None, "3"])
def test_numpy_starts_no_blas_threads_and_commands_keep_their_environment(
    setting: str | None,
) -> None:
    """gpuflight does no linear algebra: numpy's OpenBLAS starts no thread of its own (it
    would start one per CPU) unless the user says otherwise, and what gpuflight runs sees the
    environment as it was."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if setting is not None:
        env["OPENBLAS_NUM_THREADS"] = setting
    code = ("import os, gpuflight, numpy; "
            "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")
    threads, seen = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True,
                                   capture_output=True, text=True).stdout.split()
    assert seen == str(setting)
    if setting is None:
        assert threads == "1"
