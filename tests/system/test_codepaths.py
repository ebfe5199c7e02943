"""`trace --stacks/--profile`: the code paths that made a Python program's launches, walked
in the kernel at every call (exact) and sampled (within the stated bound), named by function,
file and line."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflight.producer.decode.codepaths import read_profile
from tests.conftest import REPO
from tests.support.capture import GPUFLIGHT
from tests.workloads.build import build_simgpu

pytestmark = pytest.mark.bpf

WORKLOAD = REPO / "tests" / "workloads" / "pylaunch.py"


def _trace(tmp_path: Path, period: int, calls: int) -> tuple[list[str], str, Path]:
    runtime = build_simgpu(tmp_path / "gpu") / "libcudart.so.12"
    folded, profile = tmp_path / "paths.folded", tmp_path / "paths.pb.gz"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [*GPUFLIGHT, "trace", "--stacks", str(folded), "--profile", str(profile),
         "--stack-sampling", str(period), "--", sys.executable, "-m", "tests.workloads.pylaunch",
         str(runtime), str(calls)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return folded.read_text().splitlines(), done.stderr, profile


def _lines_of(name: str) -> int:
    text = WORKLOAD.read_text().splitlines()
    start = text.index(f"def {name}() -> None:")
    return start + 2  # its one line of body


def test_every_call_walked_names_each_launch_by_its_function_exactly(tmp_path: Path) -> None:
    lines, summary, profile = _trace(tmp_path, period=1, calls=2000)
    launch = f"Gpu.launch ({REPO / 'gpuflight' / 'demo' / 'serve.py'}:"
    through = sum(int(line.rsplit(" ", 1)[1]) for line in lines
                  if line.rsplit(" ", 1)[0].rsplit(";", 1)[-1].startswith(launch))
    assert through == 2000 + 500  # every launch, through Gpu.launch
    callers: dict[str, int] = {}
    for line in lines:
        frames = line.rsplit(" ", 1)[0].split(";")
        caller = next((f for f in frames if f.startswith(("hot (", "cold ("))), None)
        if caller is not None:
            callers[caller] = callers.get(caller, 0) + int(line.rsplit(" ", 1)[1])
    assert callers == {f"hot ({WORKLOAD}:{_lines_of('hot')})": 2000,
                       f"cold ({WORKLOAD}:{_lines_of('cold')})": 500}
    assert "code paths:" in summary
    got = read_profile(profile)
    assert sum(s.value[0] for s in got.sample) >= 2500  # launches and the copy's call


def test_sampled_estimates_are_within_their_bound(tmp_path: Path) -> None:
    calls, period = 20_000, 20
    lines, _, _ = _trace(tmp_path, period=period, calls=calls)
    callers: dict[str, int] = {}
    for line in lines:
        frames = line.rsplit(" ", 1)[0].split(";")
        caller = next((f.split(" (")[0] for f in frames if f.startswith(("hot (", "cold ("))),
                      None)
        if caller is not None:
            callers[caller] = callers.get(caller, 0) + int(line.rsplit(" ", 1)[1])
    # Each call has the same chance whatever its stack, 1 in `period`: a site's estimate (its
    # samples times the period) has a standard deviation of at most ~sqrt(truth * period),
    # as if each call were drawn on its own; 6 of them (a false failure ~1 in 500 million).
    for site, truth in (("hot", calls), ("cold", calls // 4)):
        sd = math.sqrt(truth * period)
        assert abs(callers[site] - truth) <= 6 * sd, (site, callers[site], truth, sd)
