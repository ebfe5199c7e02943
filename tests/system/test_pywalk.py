"""The in-kernel Python walk and sampler (bpf/pywalk.bpf.h) against the interpreter itself.

A uprobe on a C function that Python calls through ctypes walks the caller's stack:
- every frame (code object, instruction) symbolised in user space is what sys._getframe
  said, for two threads, on every CPython 3.11+ the machine has and Debian's static 3.11;
- sampling every call counts each call site exactly, its frames sent once per stack;
- sampled at a period, each site's estimate is within the stated error bound."""

from __future__ import annotations

import ctypes
import json
import math
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuflight.producer.decode.codepaths import folded_lines
from gpuflight.producer.decode.pysamples import StackSamples, head_dtype, stack_dtype
from gpuflight.producer.decode.pystacks import ProcessMemory, code_info, locate
from gpuflight.producer.discover.pythons import PythonRuntime, find_python
from gpuflight.producer.probe.btf import Btf, task_fsbase_cflags
from tests.conftest import require
from tests.system.test_pystacks import WORKLOAD, _interpreter
from tests.workloads.build import build_point

pytestmark = pytest.mark.bpf

REPO = Path(__file__).resolve().parents[2]
MAX_DEPTH = 64
HEAD_DTYPE = head_dtype()
STACK_DTYPE = stack_dtype(MAX_DEPTH)
NEW = 4  # GF_PY_NEW
SAMPLE = REPO / "tests" / "workloads" / "pysample.py"


class _Probe:
    """pywalk.bpf.c loaded, sampling every `period`-th call of gf_point in process `pid`,
    its samples collected: (head, frames or None)."""

    def __init__(self, library: Path, pid: int, runtime: PythonRuntime, period: int) -> None:
        from bcc import BPF  # the one bcc import of the tests

        #: (head, its stack's frames if it is the stack's first sample, else None)
        self.samples: list[tuple[Any, Any]] = []
        self.wholes: dict[int, Any] = {}
        self.raw: list[bytes] = []
        self.bpf = BPF(text=(REPO / "tests" / "workloads" / "pywalk.bpf.c").read_bytes(),
                       cflags=[f"-I{REPO / 'bpf'}", f"-DGF_PY_MAX_DEPTH={MAX_DEPTH}",
                               *task_fsbase_cflags(Btf.from_file())])
        try:
            config = self.bpf[b"py_config"]
            config[ctypes.c_int(0)] = ctypes.c_uint32(period)
            procs = self.bpf[b"py_procs"]
            procs[ctypes.c_uint32(pid)] = procs.Leaf.from_buffer_copy(
                runtime.offsets_record())
            # Frames first: a stack's frames are sent before its first head.
            self.bpf[b"py_frames"].open_ring_buffer(self._take_frames)
            self.bpf[b"py_samples"].open_ring_buffer(self._take)
            self.bpf.attach_uprobe(name=str(library).encode(), sym=b"gf_point",
                                   fn_name=b"on_point", pid=pid)
        except BaseException:
            self.bpf.cleanup()
            raise

    def _take_frames(self, _ctx: object, data: int, size: int) -> None:
        assert size == STACK_DTYPE.itemsize
        raw = ctypes.string_at(data, size)
        self.raw.append(raw)
        whole = np.frombuffer(raw, STACK_DTYPE)[0]
        self.wholes[int(whole["stack_id"])] = whole

    def _take(self, _ctx: object, data: int, size: int) -> None:
        assert size == HEAD_DTYPE.itemsize
        raw = ctypes.string_at(data, size)
        self.raw.append(raw)
        head = np.frombuffer(raw, HEAD_DTYPE)[0]
        first = bool(int(head["flags"]) & NEW)
        self.samples.append((head, self.wholes[int(head["stack_id"])] if first else None))

    def take(self) -> None:
        """What the ring holds now (the samples wake no one: it is read when asked)."""
        self.bpf.ring_buffer_consume()

    def close(self) -> None:
        self.bpf.cleanup()


def _symbolised(memory: ProcessMemory, runtime: PythonRuntime,
                whole: Any) -> list[dict[str, Any]]:
    depth = int(whole["depth"])
    frames = []
    for code, instr in zip(whole["code"][:depth], whole["instr"][:depth], strict=True):
        if not code:  # a shim frame (owned by the C stack)
            continue
        info = code_info(memory, runtime.layout, int(code))
        where = locate(runtime.layout, int(code), info, int(instr))
        frames.append({"name": where.function, "file": where.filename, "line": where.line})
    return frames


def _python(python: str) -> str:
    path = python if python.startswith("/") else _interpreter(python)
    require(None if path and Path(path).exists() else f"no CPython {python} here (pyenv)")
    assert path is not None
    return path


@pytest.mark.parametrize("python", ["3.9", "3.10", "3.11", "3.12", "3.13", "/usr/bin/python3.11"])
def test_the_kernels_walk_finds_every_frame_the_interpreter_has(python: str,
                                                                 tmp_path: Path) -> None:
    library = build_point(tmp_path)
    with subprocess.Popen([_python(python), str(WORKLOAD), "--point", str(library)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        said = {t["tid"]: t for t in (json.loads(proc.stdout.readline()) for _ in range(2))}
        runtime = find_python(Path("/proc"), proc.pid)
        assert runtime is not None
        probe = _Probe(library, proc.pid, runtime, period=1)
        try:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert [proc.stdout.readline() for _ in range(2)] == ["called\n"] * 2
            probe.take()
            assert len(probe.samples) == 2, "the two calls were not seen"
            with ProcessMemory(proc.pid) as memory:
                for head, whole in probe.samples:
                    thread = said[int(head["tid"])]
                    assert int(head["flags"]) == NEW and int(head["weight"]) == 1
                    frames = _symbolised(memory, runtime, whole)
                    # The innermost frame is `report` at its point() call; below it, every
                    # frame as the interpreter said.
                    below = thread["frames"][1:]
                    assert frames[1:] == below
                    assert (frames[0]["name"], frames[0]["file"]) == ("report", str(WORKLOAD))
        finally:
            probe.close()
            proc.stdin.close()


def _sampled(python: str, tmp_path: Path, calls: int, period: int,
             then: Callable[[_Probe, int, PythonRuntime], None] | None = None) -> tuple[
        dict[str, float], dict[str, int], int]:
    """Run pysample.py under the sampler: (estimated calls per site, samples per site, the
    number of stacks sent whole); `then(probe, pid, runtime)` while the process still runs."""
    library = build_point(tmp_path)
    with subprocess.Popen([_python(python), str(SAMPLE), str(library), str(calls)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "ready\n"  # its interpreter and LIB mapped
        runtime = find_python(Path("/proc"), proc.pid)
        assert runtime is not None
        probe = _Probe(library, proc.pid, runtime, period=period)
        try:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "done\n"
            probe.take()
            sites: dict[int, str] = {}
            with ProcessMemory(proc.pid) as memory:
                for head, whole in probe.samples:
                    if whole is not None:
                        frames = _symbolised(memory, runtime, whole)
                        sites[int(head["stack_id"])] = frames[0]["name"]
            estimates: dict[str, float] = {}
            counts: dict[str, int] = {}
            for head, _ in probe.samples:
                site = sites[int(head["stack_id"])]  # every id was sent whole first
                estimates[site] = estimates.get(site, 0) + int(head["weight"])
                counts[site] = counts.get(site, 0) + 1
            if then is not None:
                then(probe, proc.pid, runtime)
            return estimates, counts, len(sites)
        finally:
            probe.close()
            proc.stdin.close()


def test_sampling_every_call_counts_each_site_exactly_and_sends_each_stack_once(
        tmp_path: Path) -> None:
    estimates, _, whole = _sampled("3.12", tmp_path, calls=2000, period=1)
    assert estimates == {"hot": 2000, "cold": 500}
    assert whole == 2


def test_a_sampled_estimate_is_within_its_error_bound(tmp_path: Path) -> None:
    # Gaps uniform on [1, 2p-1] (mean p): each call has the same chance, 1 in p, whatever its
    # site. A site's estimate (its samples times p) has a standard deviation of at most
    # ~sqrt(truth * p), as if each call were drawn on its own (the gaps' regularity only
    # narrows it); the test allows 6 (a false failure ~1 in 500 million runs).
    calls, period = 20_000, 20
    estimates, counts, _ = _sampled("3.12", tmp_path, calls=calls, period=period)
    for site, truth in (("hot", calls), ("cold", calls // 4)):
        sd = math.sqrt(truth * period)
        assert abs(estimates[site] - truth) <= 6 * sd, (site, estimates[site], truth, sd)
        assert counts[site] < truth / 4  # sampled, not every call


def test_samples_become_code_paths_named_and_counted(tmp_path: Path) -> None:
    """The samples as `trace` will take them (producer/decode/pysamples.py): each stack
    symbolised once, from its first sample, root first; folded with its count. The probed
    point is no CUDA call, so no event comes for any sample: each counts as its calls alone
    (`unjoined`), weighed here by calls."""
    folded: list[str] = []

    def fold(probe: _Probe, pid: int, runtime: PythonRuntime) -> None:
        with ProcessMemory(pid) as memory:
            samples = StackSamples(MAX_DEPTH, lambda _pid: memory, lambda _pid: runtime.layout)
            for raw in probe.raw:
                samples.add(raw)
            paths = samples.samples()
            assert samples.unknown_stacks == 0
            assert samples.unjoined == 2500  # every sample: no event of this point's calls
            assert not folded_lines(paths)  # … so no launches, …
            folded.extend(folded_lines(paths, "calls"))  # … only calls

    _sampled("3.13", tmp_path, calls=2000, period=1, then=fold)
    site = str(SAMPLE)
    hot_line, cold_line = [n for n, line in enumerate(SAMPLE.read_text().splitlines(), 1)
                           if line.strip() == "point()"]
    hot, cold = folded
    assert hot.startswith(f"<module> ({site}:")
    assert hot.endswith(f";hot ({site}:{hot_line}) 2000")
    assert cold.endswith(f";cold ({site}:{cold_line}) 500")
