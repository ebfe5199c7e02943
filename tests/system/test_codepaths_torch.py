"""Code paths of real PyTorch on the simulated GPU, every call walked (exact): the forward
launches by the function that made them, the backward ones — launched on autograd's device
thread, which has no Python frames — by the stack that entered the backward pass.

    gpuflight trace --stacks FILE --stack-sampling 1 --output EVENTS -- <frameworks python>
        tests/frameworks/code_paths.py

Each launch is held against its event (--output: the thread that made it): every launch of the
engine's device thread is on a path through "[autograd backward]" below the `loss.backward()`
line that entered its pass, or, where the device thread ran Python (a tensor hook, a
checkpoint's recompute), below that Python. The node agent walking stacks probes the same
engine. Needs root and bcc and the frameworks venv, and Kafka for the agent (skips locally
without, fails under CI=true).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gpuflight.simgpu.build import SimGpu, build
from tests.conftest import REPO
from tests.support.capture import Producer, wait_for_probe_releases
from tests.support.conformance import read_events
from tests.support.frameworks import FRAMEWORKS, require_frameworks_python

pytestmark = [pytest.mark.bpf, pytest.mark.frameworks, pytest.mark.simgpu]

WORKLOAD = FRAMEWORKS / "code_paths.py"
MARK = "[autograd backward]"


def _line(function: str, text: str) -> int:
    """The line of `text` in `function` of the workload."""
    lines = WORKLOAD.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {function}("))
    return next(i for i in range(start, len(lines)) if text in lines[i]) + 1


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> SimGpu:
    return build(tmp_path_factory.mktemp("simgpu"))


def _trace(sim: SimGpu, tmp: Path) -> tuple[list[tuple[list[str], int]], list[dict[str, object]],
                                             dict[str, int], str]:
    python = require_frameworks_python()
    folded, out = tmp / "paths.folded", tmp / "events.jsonl"
    sim_env = sim.env(devices=1, counts=tmp / "counts.json", base={})
    command = ["env", "-u", "PYTHONPATH", *(f"{k}={v}" for k, v in sim_env.items()),
               str(python), str(WORKLOAD)]
    done = subprocess.run(
        [sys.executable, "-m", "gpuflight", "trace", "--stacks", str(folded),
         "--stack-sampling", "1", "--output", str(out), "--", *command],
        capture_output=True, text=True, cwd=REPO, timeout=1800, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO), "GPUFLIGHT_CACHE_DIR": str(tmp / "cache")})
    assert done.returncode == 0, done.stderr[-4000:]
    tids = json.loads([ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1])
    paths = []
    for line in folded.read_text().splitlines():
        stack, _, weight = line.rpartition(" ")
        paths.append((stack.split(";"), int(weight)))
    launches = [e for e in read_events(out) if e.get("type") == "launch"]
    return paths, launches, tids, done.stderr


@pytest.mark.kafka
def test_the_node_agent_walking_stacks_probes_the_autograd_engine(
        sim: SimGpu, kafka_bootstrap: str, tmp_path: Path) -> None:
    """The node agent (`producer --stack-sampling`) finds PyTorch's autograd engine in a
    process that imports torch, and probes its entry: an `autograd` file in its status."""
    python = require_frameworks_python()
    wait_for_probe_releases()
    agent = Producer(tmp_path / "node.jsonl", "--stack-sampling", "1", "--kafka",
                     kafka_bootstrap, "--topic-prefix", f"autograd{os.getpid()}")
    sim_env = sim.env(devices=1, counts=tmp_path / "counts.json", base={})
    torch_process = subprocess.Popen(
        ["env", "-u", "PYTHONPATH", *(f"{k}={v}" for k, v in sim_env.items()), str(python),
         "-c", "import sys, torch; torch.zeros(1, device='cuda'); sys.stdin.readline()"],
        stdin=subprocess.PIPE)
    try:
        library = agent.wait_for_library("libtorch_cpu.so", timeout_s=300)
        assert library["kind"] == "autograd" and library["probes"] == 1, library
    finally:
        if torch_process.stdin is not None:
            torch_process.stdin.close()
        torch_process.wait(60)
        agent.stop()


def test_backward_launches_go_to_the_stack_that_entered_the_pass(
        sim: SimGpu, tmp_path: Path) -> None:
    paths, launches, tids, summary = _trace(sim, tmp_path)
    by_thread = Counter("main" if e["tid"] == tids["main"] else
                        "worker" if e["tid"] == tids["worker"] else "engine" for e in launches)
    # Every launch walked once, and no path without its Python (none lost to an exit either).
    assert sum(weight for _, weight in paths) == len(launches)
    assert not [f for frames, _ in paths for f in frames
                if f.startswith(("[no Python frames]", "[unknown code]", "[truncated]"))]

    def where(function: str, text: str) -> str:
        return f"{function} ({WORKLOAD}:{_line(function, text)})"

    entered = {"main": where("train_step", "loss.backward()"),
               "worker": where("worker_step", "loss.backward()")}
    got: Counter[str] = Counter()
    for frames, weight in paths:
        if MARK in frames:
            # The device thread's call, under the line that entered its pass.
            before = frames[:frames.index(MARK)]
            who = [k for k, at in entered.items() if at in before]
            assert len(who) == 1, frames
            got[f"engine for {who[0]}"] += weight
        elif any(f.startswith("doubled (") for f in frames):
            got["engine: hook"] += weight  # a tensor hook: Python on the device thread
        elif any(f.startswith("CheckpointFunction.backward (") for f in frames):
            got["engine: checkpoint"] += weight  # the reentrant recompute and its pass
        elif any(f.startswith("worker_step (") for f in frames):
            got["worker"] += weight
        else:
            assert any(f.startswith(("main (", "train_step (")) for f in frames), frames
            got["main"] += weight
    engine = sum(v for k, v in got.items() if k.startswith("engine"))
    assert (got["main"], got["worker"], engine) == (
        by_thread["main"], by_thread["worker"], by_thread["engine"])
    assert got["engine: hook"] == 3  # one multiply a pass
    assert got["engine for main"] > 0 and got["engine for worker"] > 0
    assert got["engine: checkpoint"] > 0
    share = 100 * (got["engine for main"] + got["engine for worker"]) / len(launches)
    assert (f"{share:.1f}% of the launches were made by autograd's threads for a backward"
            " pass") in summary
