"""Python stacks read from outside the process, with the layouts producer/discover/pythons.py
gives (the reference the in-kernel walk is checked against, issue 28): on every CPython the
machine has (3.9-3.13, libpython builds, and Debian's statically linked /usr/bin/python3.11),
for two threads at a known depth through a method, a generator, a decorator, recursion and a
non-ASCII name, every frame's function, file and line are what the interpreter itself says."""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuflight.producer.decode.pystacks import (
    ProcessMemory,
    code_info,
    locate,
    thread_state,
    walk,
)
from gpuflight.producer.discover.pythons import find_python
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "tests" / "workloads" / "pystack.py"
VERSIONS = ["3.9", "3.10", "3.11", "3.12", "3.13"]


def _interpreter(version: str) -> str | None:
    found = sorted(glob.glob(f"{Path.home()}/.pyenv/versions/{version}.*/bin/python{version}"))
    return found[-1] if found else None


def _pythons() -> list[Any]:
    params = [pytest.param(v, id=f"cpython{v}") for v in VERSIONS]
    params.append(pytest.param("/usr/bin/python3.11", id="debian-static-3.11"))
    params.append(pytest.param("renamed", id="debian-static-3.11-renamed"))
    return params


@pytest.mark.parametrize("python", _pythons())
def test_every_frame_is_what_the_interpreter_says(python: str, tmp_path: Path) -> None:
    if python == "renamed":  # its name says nothing: the version is read from the file
        require(None if Path("/usr/bin/python3.11").exists() else "no /usr/bin/python3.11")
        python = str(tmp_path / "inference-server")
        shutil.copy("/usr/bin/python3.11", python)
    path = python if python.startswith("/") else _interpreter(python)
    require(None if path and Path(path).exists() else f"no CPython {python} here (pyenv)")
    assert path is not None
    with subprocess.Popen([path, str(WORKLOAD)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        said = [json.loads(proc.stdout.readline()) for _ in range(2)]
        runtime = find_python(Path("/proc"), proc.pid)
        assert runtime is not None
        if python.startswith("/"):
            assert runtime.path == str(Path(path).resolve())  # the executable: static
        assert runtime.source == ("_Py_DebugOffsets" if runtime.layout.version >= (3, 13)
                                  else "table")
        with ProcessMemory(proc.pid) as memory:
            for thread in said:
                tstate = thread_state(memory, runtime, thread["tid"], thread["ident"])
                assert tstate is not None
                seen = walk(memory, runtime.layout, tstate)
                assert not seen.truncated
                got = []
                for frame in seen.frames:
                    info = code_info(memory, runtime.layout, frame.code)
                    where = locate(runtime.layout, frame.code, info, frame.instr)
                    got.append({"name": where.function, "file": where.filename,
                                "line": where.line})
                # Read while it waits: its innermost frames are in the wait (threading's, or
                # main_wait), `report` is at its wait() call; below it, every frame as said.
                below = thread["frames"][1:]
                assert got[-len(below):] == below
                report = got[-len(below) - 1]
                assert (report["name"], report["file"]) == ("report", str(WORKLOAD))
        proc.stdin.close()  # the workload ends
