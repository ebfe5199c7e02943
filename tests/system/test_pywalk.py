"""The in-kernel Python walk (bpf/pywalk.bpf.h) against the interpreter itself: a uprobe on
a C function two threads call through ctypes walks each caller's stack; every frame (code
object, instruction) symbolised in user space is what sys._getframe said, on every CPython
3.11+ the machine has and Debian's static 3.11."""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuflight.producer.decode.pystacks import Frame, ProcessMemory, Walk, code_info, locate
from gpuflight.producer.discover.pythons import PyLayout, find_python
from tests.conftest import require
from tests.system.test_pystacks import WORKLOAD, _interpreter

pytestmark = pytest.mark.bpf

REPO = Path(__file__).resolve().parents[2]
MAX_DEPTH = 64
NONE = 0xFFFF
#: struct gf_py_stack as sent (without its scratch): bpf/pywalk.bpf.h.
STACK_DTYPE = np.dtype([("ts_ns", "<u8"), ("pid", "<u4"), ("tid", "<u4"), ("tstate", "<u8"),
                        ("depth", "<u4"), ("flags", "<u4"), ("code", "<u8", MAX_DEPTH),
                        ("instr", "<u8", MAX_DEPTH)])


def _point_library(tmp_path: Path) -> Path:
    source = tmp_path / "point.c"
    source.write_text("void gf_point(void) { __asm__ volatile(\"\" ::: \"memory\"); }\n")
    library = tmp_path / "libgfpoint.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(library), str(source)],
                   check=True)
    return library


def _offsets(layout: PyLayout, runtime: int) -> bytes:
    def u16(value: int) -> int:
        return NONE if value < 0 else value

    fields = [layout.runtime_interpreters_head, layout.interp_threads_head,
              layout.tstate_next, layout.tstate_native_thread_id, layout.tstate_cframe,
              layout.cframe_current_frame, layout.tstate_current_frame,
              layout.frame_previous, layout.frame_code, layout.frame_instr,
              layout.frame_owner, 0, 0, 0, 0, 0]
    return runtime.to_bytes(8, "little") + b"".join(
        u16(f).to_bytes(2, "little") for f in fields)


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13", "/usr/bin/python3.11"])
def test_the_kernels_walk_finds_every_frame_the_interpreter_has(python: str,
                                                                 tmp_path: Path) -> None:
    from bcc import BPF  # the one bcc import of the tests

    path = python if python.startswith("/") else _interpreter(python)
    require(None if path and Path(path).exists() else f"no CPython {python} here (pyenv)")
    assert path is not None
    library = _point_library(tmp_path)
    with subprocess.Popen([path, str(WORKLOAD), "--point", str(library)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        said = {t["tid"]: t for t in (json.loads(proc.stdout.readline()) for _ in range(2))}
        runtime = find_python(Path("/proc"), proc.pid)
        assert runtime is not None
        bpf = BPF(text=(REPO / "tests" / "workloads" / "pywalk.bpf.c").read_bytes(),
                  cflags=[f"-I{REPO / 'bpf'}", f"-DGF_PY_MAX_DEPTH={MAX_DEPTH}"])
        try:
            table = bpf[b"py_procs"]
            table[ctypes.c_uint32(proc.pid)] = table.Leaf.from_buffer_copy(
                _offsets(runtime.layout, runtime.runtime_address))
            got: list[Any] = []

            def take(_ctx: object, data: int, size: int) -> None:
                raw = ctypes.string_at(data, STACK_DTYPE.itemsize)
                got.append(np.frombuffer(raw, dtype=STACK_DTYPE)[0])

            bpf[b"py_stacks"].open_ring_buffer(take)
            bpf.attach_uprobe(name=str(library).encode(), sym=b"gf_point",
                              fn_name=b"on_point", pid=proc.pid)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            for _ in range(100):  # each poll waits up to 100 ms for a record
                if len(got) == 2:
                    break
                bpf.ring_buffer_poll(100)
            assert len(got) == 2, "the two calls were not seen"
            with ProcessMemory(proc.pid) as memory:
                for record in got:
                    thread = said[int(record["tid"])]
                    assert int(record["flags"]) == 0
                    depth = int(record["depth"])
                    walk = Walk(tuple(Frame(int(c), int(i)) for c, i in
                                      zip(record["code"][:depth], record["instr"][:depth],
                                          strict=True) if c), truncated=False)  # 0: a shim
                    frames = []
                    for frame in walk.frames:
                        info = code_info(memory, runtime.layout, frame.code)
                        where = locate(runtime.layout, frame.code, info, frame.instr)
                        frames.append({"name": where.function, "file": where.filename,
                                       "line": where.line})
                    # The innermost frame is `report` at its point() call; below it, every
                    # frame as the interpreter said.
                    below = thread["frames"][1:]
                    assert frames[1:] == below
                    assert (frames[0]["name"], frames[0]["file"]) == ("report", str(WORKLOAD))
        finally:
            bpf.cleanup()
            proc.stdin.close()
