"""A fake /proc tree for the identity tests (producer/publish/identity.py reads an injectable
root)."""

from __future__ import annotations

from pathlib import Path


def write_proc(root: Path, pid: int, cgroup: str, environ: dict[str, str]) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    stat = f"{pid} (python3 train) S 1 " + " ".join(["0"] * 17) + " 123456 0 0"
    (base / "stat").write_text(stat)
    (base / "cmdline").write_bytes(b"python3\0train.py\0--fused\0")
    (base / "cgroup").write_text(cgroup)
    (base / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in environ.items()))
    (root / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
