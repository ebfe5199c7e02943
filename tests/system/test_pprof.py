"""`--profile`'s file read by pprof itself (`go tool pprof`; Go is here: setup needs it to
build promlint)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from gpuflight.producer.decode.codepaths import write_profile
from tests.conftest import require
from tests.unit.producer.decode.test_codepaths import SAMPLES


def test_go_tool_pprof_reads_it(tmp_path: Path) -> None:
    go = shutil.which("go")
    require(None if go else "Go is missing (apt-get install golang-go; setup needs it)")
    assert go is not None
    path = tmp_path / "p.pb.gz"
    write_profile(path, SAMPLES, duration_ns=10**9)
    shown = subprocess.run([go, "tool", "pprof", "-top", "-sample_index=gpu_ns", str(path)],
                           capture_output=True, text=True, timeout=300, check=True).stdout
    rows = {line.split()[-1]: line.split()[0] for line in shown.splitlines()
            if line.strip().endswith(("gemm", "Model.forward", "train"))}
    assert rows == {"at::native::gemm": "6s", "Model.forward": "4.20s", "train": "0"}
