"""Request GPU time from NVML per-process utilisation, end to end, with no GPU: `gpuflight
trace` on a thread-per-request server (tests/workloads/nvml_server.py) running on the simulated
GPU (gpuflight/simgpu, real-time timing model), with the simulated NVML (libnvidia-ml.so.1 over
the driver's own timeline) or with none. The ground truth is the simulated driver's: the device
time of each request's kernels (gfsim_thread_kernel_ns on its handler's thread).

Tolerance, from the sampling period P (GF_SIM_NVML_PERIOD_US): the simulated NVML is exact but
for rounding smUtil to a whole percent, at most P/200 of GPU time per sample; a request's
kernels run in at most 2 sample periods (each is shorter than P), and the client pauses longer
than P between requests, so no sample holds two requests' work. So each request's NVML GPU time
is its truth within 2 x P/200, and a route's total within n x 2 x P/200.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuflight.simgpu.build import SimGpu, build
from tests.conftest import REPO

pytestmark = [pytest.mark.bpf, pytest.mark.simgpu]

PERIOD_US = 10_000
#: The most one request's NVML GPU time may differ from its truth (see above), ns.
PER_REQUEST_NS = 2 * PERIOD_US * 1000 / 200
REQUESTS = 45  # 15 of each route


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> SimGpu:
    return build(tmp_path_factory.mktemp("simgpu"))


Traced = tuple[list[dict[str, Any]], dict[str, Any], str]


def _trace(sim: SimGpu, tmp: Path, nvml: bool) -> Traced:
    out, expect = tmp / "out.jsonl", tmp / "expect.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "GF_SIM_NS_PER_THREAD": "1",
           "GF_SIM_NVML_PERIOD_US": str(PERIOD_US)}
    if nvml:
        (tmp / "activity").mkdir()
        env.update(GF_SIM_NVML_DIR=str(tmp / "activity"), GPUFLIGHT_NVML_LIB=str(sim.nvml))
    else:  # whatever this machine has: no NVML for this trace
        env.pop("GF_SIM_NVML_DIR", None)
        env["GPUFLIGHT_NVML_LIB"] = str(tmp / "no-libnvidia-ml.so.1")
    done = subprocess.run(
        [sys.executable, "-m", "gpuflight", "trace", "--output", str(out), "--",
         sys.executable, "-m", "tests.workloads.nvml_server", "serve",
         "--runtime", str(sim.runtime(12)), "--expect", str(expect),
         "--requests", str(REQUESTS), "--pause-ms", str(3 * PERIOD_US / 1000)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    return lines, json.loads(expect.read_text()), done.stderr


@pytest.fixture(scope="module")
def with_nvml(sim: SimGpu, tmp_path_factory: pytest.TempPathFactory) -> Traced:
    return _trace(sim, tmp_path_factory.mktemp("nvml"), nvml=True)


@pytest.fixture(scope="module")
def without_nvml(sim: SimGpu, tmp_path_factory: pytest.TempPathFactory) -> Traced:
    return _trace(sim, tmp_path_factory.mktemp("queued"), nvml=False)


def _requests(traced: Traced) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], int]:
    """(request line, what the workload sent and its truth) pairs; the server's pid."""
    lines, expect, _ = traced
    got = {r["path"]: r for r in lines if r["type"] == "request" and r["pid"] == expect["pid"]}
    sent = expect["requests"]
    assert len(sent) == REQUESTS
    assert sorted(got) == sorted(s["path"] for s in sent)
    return [(got[s["path"]], s) for s in sent], expect["pid"]


def _by_kind(pairs: list[tuple[dict[str, Any], dict[str, Any]]],
             value: Callable[[dict[str, Any], dict[str, Any]], float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for got, sent in pairs:
        out[sent["kind"]] = out.get(sent["kind"], 0.0) + value(got, sent)
    return out


def _unexplained_ms(stderr: str) -> float:
    (ms,) = re.findall(r"not explained by any request: ([\d,.]+) GPU ms", stderr)
    return float(ms.replace(",", ""))


def test_request_gpu_time_comes_from_nvml_and_matches_the_simulated_gpu(
    with_nvml: Traced,
) -> None:
    pairs, _ = _requests(with_nvml)
    for got, sent in pairs:
        gpu_ns = got["cost"].get("gpu_ns", 0.0)
        if sent["kind"] == "health":
            assert gpu_ns == 0 and got["gpu_source"] is None
            continue
        assert got["gpu_source"] == "nvml", got
        assert abs(gpu_ns - sent["gpu_ns"]) <= PER_REQUEST_NS, (got["path"], gpu_ns, sent)
    got_route = _by_kind(pairs, lambda g, _s: g["cost"].get("gpu_ns", 0.0))
    truth = _by_kind(pairs, lambda _g, s: s["gpu_ns"])
    n = REQUESTS // 3
    assert truth["heavy"] == pytest.approx(n * 2.0005e6, rel=1e-3)  # the model's own numbers
    assert truth["light"] == pytest.approx(n * 2 * 0.5003e6, rel=1e-3)
    for kind in ("heavy", "light"):
        assert abs(got_route[kind] - truth[kind]) <= n * PER_REQUEST_NS, (kind, got_route, truth)
    # Nothing else ran on the GPU: NVML's GPU time of the process is the requests' (within the
    # rounding); what no request explains is no more than the rounding could put there.
    _, _, stderr = with_nvml
    assert _unexplained_ms(stderr) * 1e6 <= REQUESTS * PER_REQUEST_NS
    assert "GPU time: NVML per-process utilisation" in stderr
    (heavy_row,) = [x for x in stderr.splitlines() if "POST /v1/heavy/{id}" in x]
    assert heavy_row.rstrip().endswith(" NVML")


def test_node_wide_producer_takes_request_gpu_time_from_nvml(
    sim: SimGpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpuflight producer` node-wide: the same server, watched once it maps the runtime; its
    requests' GPU time from the simulated NVML, as under trace."""
    from tests.support.capture import Producer, wait_for_probe_releases

    (tmp_path / "activity").mkdir()
    env = {"GF_SIM_NS_PER_THREAD": "1", "GF_SIM_NVML_PERIOD_US": str(PERIOD_US),
           "GF_SIM_NVML_DIR": str(tmp_path / "activity"), "GPUFLIGHT_NVML_LIB": str(sim.nvml)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the producer's environment, and the server's
    expect = tmp_path / "expect.json"
    wait_for_probe_releases()
    node = Producer(tmp_path / "node.jsonl", ready_timeout_s=240, stop_timeout_s=240)
    try:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.workloads.nvml_server", "serve", "--hold",
             "--runtime", str(sim.runtime(12)), "--expect", str(expect),
             "--requests", str(REQUESTS), "--pause-ms", str(3 * PERIOD_US / 1000)],
            stdin=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert server.stdin is not None
        node.wait_for_library(str(sim.runtime(12)), timeout_s=240)
        server.stdin.write(b"go\n")
        server.stdin.close()
        assert server.wait(timeout=300) == 0
        recorded = node.stop()
    finally:
        node.kill()
    pairs, _ = _requests((recorded, json.loads(expect.read_text()), ""))
    for got, sent in pairs:
        if sent["kind"] != "health":
            assert got["gpu_source"] == "nvml", got
            assert abs(got["cost"]["gpu_ns"] - sent["gpu_ns"]) <= PER_REQUEST_NS, (got, sent)


def test_without_nvml_request_gpu_time_is_queued_time_and_says_so(
    without_nvml: Traced,
) -> None:
    pairs, _ = _requests(without_nvml)
    for got, sent in pairs:
        if sent["kind"] == "health":
            continue
        assert got["gpu_source"] == "queued", got
        if sent["kind"] == "heavy":
            # Queued from the launch to the sync's return, past the 10 ms of host work: five
            # times the 2 ms the kernel ran. This is what NVML corrects.
            assert got["cost"]["gpu_ns"] >= 10e6 > 4 * sent["gpu_ns"]
    _, _, stderr = without_nvml
    assert "GPU time: queued time (first launch after idle" in stderr
    assert "no NVML on this machine" in stderr
    (heavy_row,) = [x for x in stderr.splitlines() if "POST /v1/heavy/{id}" in x]
    assert heavy_row.rstrip().endswith(" queued")
