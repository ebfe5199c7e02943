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
from tests.conftest import REPO, require
from tests.support.capture import GPUFLIGHT
from tests.system.test_pystacks import _interpreter
from tests.workloads.build import LIBCUDA_SONAME, build_simgpu, real_libcuda_dir

pytestmark = pytest.mark.bpf

WORKLOAD = REPO / "tests" / "workloads" / "pylaunch.py"


def _trace(tmp_path: Path, period: int | str, calls: int, *extra: str,
           python: str = sys.executable, ending: tuple[str, ...] = ()
           ) -> tuple[list[str], str, Path]:
    tmp_path.mkdir(exist_ok=True)
    runtime = build_simgpu(tmp_path / "gpu") / "libcudart.so.12"
    folded, profile = tmp_path / "paths.folded", tmp_path / "paths.pb.gz"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [*GPUFLIGHT, "trace", "--stacks", str(folded), "--profile", str(profile),
         "--stack-sampling", str(period), *extra, "--", python, "-m",
         "tests.workloads.pylaunch", str(runtime), str(calls), *ending],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return folded.read_text().splitlines(), done.stderr, profile


def _lines_of(name: str) -> int:
    text = WORKLOAD.read_text().splitlines()
    start = text.index(f"def {name}() -> None:")
    return start + 2  # its one line of body


def test_every_call_walked_names_each_launch_by_its_function_exactly(tmp_path: Path) -> None:
    lines, summary, profile = _trace(tmp_path, period=1, calls=2000)
    _exact(lines)
    assert "code paths:" in summary
    got = read_profile(profile)
    assert sum(s.value[0] for s in got.sample) == 2500  # launches: not the copies' calls


@pytest.mark.parametrize("version", ["3.9", "3.10", "3.11", "3.12", "3.13"])
def test_a_shared_libpython_is_walked_from_the_command_s_start(version: str,
                                                                tmp_path: Path) -> None:
    """pyenv's builds, like the official Docker images', link libpython shared: the loader maps
    it after the exec at which `trace` first scans the command. Its CPython was looked for on
    that scan alone, so every path was its native caller alone; it is now found by the first
    scan that shows it. 3.9 and 3.10 too: their threads are found by the thread pointer. (A
    stack's code objects are read from the process's memory as its first walk arrives: the
    workload lives longer than that, as programs do; docs/commands.md says so.)"""
    python = _interpreter(version)
    require(None if python and Path(python).exists() else f"no CPython {version} here (pyenv)")
    assert python is not None
    linked = subprocess.run(["ldd", python], capture_output=True, text=True, check=True).stdout
    assert f"libpython{version}.so" in linked  # the case at hand
    folded = tmp_path / "paths.folded"
    done = subprocess.run(
        [*GPUFLIGHT, "trace", "--stacks", str(folded), "--stack-sampling", "1", "--", python,
         "-c", SHARED_WORKLOAD, str(real_libcuda_dir() / LIBCUDA_SONAME), "20000"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    by_function: dict[str, int] = {}
    for line in folded.read_text().splitlines():
        path, count = line.rsplit(" ", 1)
        python_leaf = path.split(";")[-2]  # before the native caller (libffi's)
        by_function[python_leaf] = by_function.get(python_leaf, 0) + int(count)
    assert by_function == {"hot (<string>:5)": 20000, "cold (<string>:7)": 5000}, done.stderr


#: NVIDIA's driver (no GPU: each call fails at once, and is recorded) from two functions.
SHARED_WORKLOAD = """import ctypes, sys
launch = ctypes.CDLL(sys.argv[1]).cuLaunchKernel
launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
def hot():
    launch(None, 4, 1, 1, 64, 1, 1, 0, None, None, None)
def cold():
    launch(None, 2, 1, 1, 32, 1, 1, 0, None, None, None)
for i in range(int(sys.argv[2])):
    hot()
    if i % 4 == 0:
        cold()
"""


def _exact(lines: list[str], calls: int = 2000) -> None:
    """Every launch of pylaunch's `calls` through Gpu.launch, by its function, exactly."""
    launch = f"Gpu.launch ({REPO / 'gpuflight' / 'demo' / 'serve.py'}:"
    leaves = [line.rsplit(" ", 1)[0].split(";")[-2:] for line in lines]
    through = sum(int(line.rsplit(" ", 1)[1]) for line, (python, _) in zip(lines, leaves,
                                                                             strict=True)
                  if python.startswith(launch))
    assert through == calls + calls // 4  # every launch, through Gpu.launch
    # ... into ctypes' libffi: each path's leaf is the call's native caller.
    assert all(" (libffi.so" in native for _, native in leaves), leaves
    callers: dict[str, int] = {}
    for line in lines:
        frames = line.rsplit(" ", 1)[0].split(";")
        caller = next((f for f in frames if f.startswith(("hot (", "cold ("))), None)
        if caller is not None:
            callers[caller] = callers.get(caller, 0) + int(line.rsplit(" ", 1)[1])
    assert callers == {f"hot ({WORKLOAD}:{_lines_of('hot')})": calls,
                       f"cold ({WORKLOAD}:{_lines_of('cold')})": calls // 4}


def _by_function(profile: Path) -> dict[str, dict[str, int]]:
    """Each sample type's total per workload function on the path (pprof, parsed back)."""
    got = read_profile(profile)
    strings = list(got.string_table)
    kinds = [strings[t.type] for t in got.sample_type]
    names = {f.id: strings[f.name] for f in got.function}
    where = {loc.id: names[loc.line[0].function_id] for loc in got.location}
    out: dict[str, dict[str, int]] = {}
    for sample in got.sample:
        functions = [where[i] for i in sample.location_id]  # the leaf first
        mine = next((f for f in functions
                     if f in ("hot", "cold", "upload", "wait", "last", "<module>")), "?")
        totals = out.setdefault(mine, dict.fromkeys(kinds, 0))
        for kind, value in zip(kinds, sample.value, strict=True):
            totals[kind] += value
    return out


def test_every_call_walked_gives_each_function_what_its_calls_cost(tmp_path: Path) -> None:
    """Each sampled call is joined to its event: the bytes each function copied, the time it
    waited, its launches and calls, exactly as the events say (--output of the same trace)."""
    from tests.support.capture import read_events
    from tests.workloads.pylaunch import UPLOAD

    calls = 1000
    events_file = tmp_path / "events.jsonl"
    lines, summary, profile = _trace(tmp_path, 1, calls, "--stacks-weight", "bytes",
                                     "--output", str(events_file))
    events = [e for e in read_events(events_file) if e.get("type") != "aggregate"]
    got = _by_function(profile)
    uploads = calls // 10
    assert got["upload"]["bytes"] == uploads * UPLOAD and got["upload"]["calls"] == uploads
    # The last call's stack is new and its process exits at once: still named.
    assert got["<module>"]["bytes"] == 4096 and "?" not in got
    assert got["hot"]["launches"] == calls and got["cold"]["launches"] == calls // 4
    assert got["hot"]["bytes"] == got["wait"]["bytes"] == got["wait"]["launches"] == 0
    # CPU time blocked: the syncs' and the synchronous copies' durations, to the nanosecond
    # (each path's sum rounded once).
    syncs = sum(e["duration_ns"] for e in events if e["api"] == "cudaStreamSynchronize")
    copies = sum(e["duration_ns"] for e in events if e["api"] == "cudaMemcpy")
    assert abs(got["wait"]["blocked_ns"] - syncs) <= 1 and syncs > 0
    assert abs(got["upload"]["blocked_ns"] + got["<module>"]["blocked_ns"] - copies) <= 2
    assert sum(f["calls"] for f in got.values()) == len(events)  # every call, once
    assert sum(f["gpu_ns"] for f in got.values()) > 0
    # --stacks folded by bytes: the uploads' path, and the last copy's.
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == uploads * UPLOAD + 4096
    assert "of GPU time:" in summary and "whose call was not recorded" not in summary


def test_a_process_that_launches_from_new_code_and_exits_at_once_is_named(
        tmp_path: Path) -> None:
    """The code objects of a new stack are read from the process while it lives: one that
    launches from a function never walked before and calls os._exit at once is held at libc's
    _exit until they are read (and at CPython's finalization on an ordinary exit)."""
    lines, summary, profile = _trace(tmp_path, 1, 40, ending=("os._exit",))
    got = _by_function(profile)
    assert "?" not in got and not [line for line in lines if "[unknown" in line]
    last = f"last ({WORKLOAD}:{_lines_of('last')})"
    assert [line.rsplit(" ", 1)[1] for line in lines if last in line] == ["1"]
    assert "held at exit: 1 time(s)" in summary


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


def test_a_cpu_that_walks_its_bound_samples_less_and_the_estimates_stay_honest(
        tmp_path: Path) -> None:
    """1 call in 2 asked, at most 50 walks a CPU a second: the period doubles each time a CPU
    reaches the bound, so a few hundred walks are made instead of thousands; the weights follow
    the period in force, so each estimate stays within its stated bound of the truth."""
    calls = 30_000
    _, summary, _ = _trace(tmp_path, 2, calls, "--stack-max-walks", "50")
    (line,) = [s for s in summary.splitlines() if "code paths:" in s]
    walks = int(line.split(" walk(s)")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert walks < calls // 20, line  # 1 in 2 would be ~19,000
    assert "1 in up to" in line and "doubled" in line, line
    _estimates_hold(summary, calls)


def _rate(summary: str) -> tuple[int, float, float, float]:
    """(walks, the mean period, ns the walks of known stacks took a recorded call, ns such a
    walk took) of trace's summary."""
    (line,) = [s for s in summary.splitlines() if "code paths:" in s]

    def number(before: str, after: str) -> float:
        return float(line.split(before)[1].split(after)[0].replace(",", ""))

    walks = int(line.split(" walk(s)")[0].rsplit(" ", 1)[1].replace(",", ""))
    return (walks, number("1 call in ", " walked"), number("they took ", " ns"),
            number(" ns, ", " ns a walk"))


def _estimates_hold(summary: str, calls: int) -> None:
    for site, truth in (("hot (", calls), ("cold (", calls // 4)):
        (row,) = [s for s in summary.splitlines() if "±" in s and f" {site}" in s]
        figures = row.split("%", 1)[1].split()  # "25,136 ±5,184 hot (…"
        estimate = float(figures[0].replace(",", ""))
        spread = float(figures[1].removeprefix("±").replace(",", ""))
        # ± is two standard deviations: 6 of them (a false failure ~1 in 500 million).
        assert abs(estimate - truth) <= 3 * spread, (site, estimate, truth, spread)


def test_the_default_rate_keeps_the_walks_within_their_cost_budget(tmp_path: Path) -> None:
    """`--stack-sampling auto` (the default): each CPU's period is the least that keeps what
    its walks take, as the kernel times them, within `--stack-cost` ns a recorded call. A
    tight budget walks few calls and keeps to it; a loose one walks many more; the estimates
    follow the periods in force, within their stated bounds, either way. The budget is for
    the walks of known stacks: the first walk of a new stack, its frames sent with it (10-50 µs
    here), is a one-off cost the rate does not follow, and the summary gives it apart (5 of
    them over 58,000 calls were once nearly half of what a short run's walks took a call).
    Enough calls that each CPU's rise to its period, 8 timed walks at each period on the
    way, is a small part of the walks (the loose run, which walks nearly every call, needs
    fewer)."""
    calls, loose_calls, budget = 100_000, 40_000, 8
    _, tight, _ = _trace(tmp_path / "tight", "auto", calls, "--stack-cost", str(budget))
    _, loose, _ = _trace(tmp_path / "loose", "auto", loose_calls, "--stack-cost", "5000",
                         "--stack-max-walks", "0")
    tight_walks, tight_period, tight_took, a_walk = _rate(tight)
    loose_walks, loose_period, _, _ = _rate(loose)
    # A walk of pylaunch's ~10 frames takes ~0.7-1.1 µs on the 2-core VM: 1 call in ~90-140
    # for 8 ns.
    assert tight_period >= a_walk / budget / 2, tight
    # Within the budget, but for the few walks made before a CPU's period has risen to it.
    assert tight_took <= 2 * budget, tight
    # Each stack new once (py_seen is the node's; one thread walks), given apart.
    (line,) = [s for s in tight.splitlines() if "code paths:" in s]
    stacks = line.split(" stack(s), ")[0].rsplit(" ", 1)[1]
    assert f"the first walks of {stacks} new stack(s)" in line, line
    # 5 µs a call: every call, or nearly, walked.
    assert loose_period < 2 and loose_walks > 10 * tight_walks, (tight, loose)
    _estimates_hold(tight, calls)
    _estimates_hold(loose, loose_calls)
