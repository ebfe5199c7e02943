"""`gpuflight demo` on real PyTorch: eager vs torch.compile on the simulated GPU, side by side.

The end-to-end test traces the demo's two runs (root, bcc and the frameworks venv: skipped
locally without them, failing under CI=true); the region's figures are also checked on
synthetic events, without any of that.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from gpuflight.demo import showcase
from gpuflight.demo.torch_showcase import LABELS, window_summary
from tests.conftest import REPO


def launch(ts: int, grid: tuple[int, int, int], captured: bool = False) -> dict[str, Any]:
    return {"type": "launch", "ts_ns": ts, "grid": list(grid), "captured": captured}


def test_window_summary_counts_only_the_region() -> None:
    events = [
        launch(5, (1, 1, 1)),  # warm-up: before the region
        launch(10, (4, 1, 1)),
        launch(11, (4, 1, 1)),
        launch(12, (8, 2, 1)),
        launch(13, (64, 1, 1), captured=True),  # recorded into a graph, not run
        {"type": "graph_launch", "ts_ns": 14, "kernel_nodes": 3},
        {"type": "memcpy", "ts_ns": 15, "bytes": 4096, "async": False, "duration_ns": 2_000},
        {"type": "memcpy", "ts_ns": 16, "bytes": 100, "async": True, "duration_ns": 50},
        {"type": "sync", "ts_ns": 17, "duration_ns": 3_000},
        launch(1_000_000_001, (1, 1, 1)),  # after the region
    ]
    got = window_summary(events, 10, 1_000_000_000)
    assert got["launches"] == 3 + 3  # three that ran, three graph kernel nodes
    assert got["wall_s"] == (1_000_000_000 - 10) / 1e9
    assert got["mean_grid_blocks"] == (4 + 4 + 16) / 3
    assert got["top_grid"] == "(4,1,1)"
    assert got["copy_bytes"] == 4196
    assert abs(got["blocked_share"] - 5_000 / 1e9 / got["wall_s"]) < 1e-12


def test_table_has_the_c_showcase_shape() -> None:
    row = {"launches": 800, "launch_rate": 1000.0, "mean_grid_blocks": 512.0, "top_grid": "(1,1,1)",
           "copy_bytes": 0, "blocked_share": 0.1, "gpu_util": 0.5, "wall_s": 1.0}
    table = showcase.comparison({LABELS[0]: row, LABELS[1]: {**row, "launches": 100}},
                                modes=LABELS, title="PyTorch")
    c_table = showcase.comparison({"unfused": row, "fused": {**row, "launches": 100}})
    assert [ln.split("  ")[0] for ln in table.splitlines()[2:]] == [
        ln.split("  ")[0] for ln in c_table.splitlines()[2:]]
    assert "torch.compile vs eager" in table.splitlines()[0]
    assert re.search(r"kernel launches\s+800\s+100\s+8\.0x fewer", table)


def test_a_python_without_torch_is_one_line_and_exit_2() -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("gpuflight's own Python has torch here")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuflight", "demo", "--python", sys.executable],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "cannot import a CUDA build of torch" in proc.stderr
