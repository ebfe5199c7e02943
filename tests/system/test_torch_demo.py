"""`gpuflight demo` on real PyTorch: eager vs torch.compile on the simulated GPU, side by side.

The end-to-end test traces the demo's two runs (root, bcc and the frameworks venv: skipped
locally without them, failing under CI=true); the region's figures are also checked on
synthetic events, without any of that.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, require
from tests.support.frameworks import frameworks_python

pytestmark = [pytest.mark.bpf, pytest.mark.frameworks]


def test_demo_on_pytorch_fuses_eight_launches_into_one() -> None:
    python = frameworks_python()
    require(None if python else "no frameworks venv (run scripts/setup-frameworks)")
    assert python is not None
    steps = 300
    proc = subprocess.run(
        [sys.executable, "-m", "gpuflight", "demo", "--steps", str(steps), "--python", str(python)],
        capture_output=True, text=True, cwd=REPO, timeout=1800, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    # eager: one kernel per op, 8 per step; torch.compile: one fused Triton kernel per step
    m = re.search(r"kernel launches\s+([\d,]+)\s+([\d,]+)\s+8\.0x fewer", proc.stdout)
    assert m, proc.stdout
    assert (int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))) == (
        8 * steps, steps)
    assert re.search(r"GPU utilization \(simulated GPU\)\s+\d+%\s+\d+%", proc.stdout), proc.stdout
    assert "torch.compile vs eager" in proc.stdout
