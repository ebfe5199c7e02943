"""The driver API end to end, as root with real uprobes: exact counts, arguments and names.

Workloads (tests/workloads/driver.c, nvccstyle.c) run on NVIDIA's real libcuda.so.1 from
Debian non-free (no GPU: every call fails, after the entry probes saw its arguments) and on
our stub driver and forwarding runtime (stubcuda.c, fwdcudart.c), where calls succeed and
make handles. The oracle is tests/workloads/expected.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from gpuflight.producer.contract import abi
from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.discover import elfsyms, procmaps
from tests.conftest import require
from tests.support.capture import Producer, read_events, wait_for_probe_releases
from tests.workloads import build, expected

pytestmark = pytest.mark.bpf

GPUFLIGHT = [sys.executable, "-m", "gpuflight"]
TIMEOUT_S = 180


def real_driver_or_skip() -> None:
    try:
        build.real_libcuda_dir()
    except SetupError as exc:
        require(str(exc))


def trace(cmd: Sequence[str], out: Path) -> tuple[subprocess.CompletedProcess[str],
                                                   list[dict[str, Any]]]:
    proc = subprocess.run(
        [*GPUFLIGHT, "trace", "--output", str(out), "--", *cmd],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "events dropped: 0" in proc.stderr, proc.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    return proc, events


def assert_exact(want: list[dict[str, Any]], got: list[dict[str, Any]],
                 names: bool = False) -> None:
    missing, unexpected = expected.diff(want, got, names=names)
    assert not missing and not unexpected, (
        f"{len(missing)} missing, e.g. {missing[:3]}; {len(unexpected)} unexpected, "
        f"e.g. {unexpected[:3]}"
    )


# ---- discovery ---------------------------------------------------------------------


def test_real_libcuda_is_a_driver_with_every_probed_function() -> None:
    real_driver_or_skip()
    path = str(build.real_libcuda_dir() / build.LIBCUDA_SONAME)
    assert elfsyms.defined_functions(path, procmaps.DRIVER_SYMBOLS) == procmaps.DRIVER_SYMBOLS
    # and what the device of each event is followed by (cuCtxCreate_v3/_v4 are newer)
    device = {"cuDevicePrimaryCtxRetain", "cuCtxCreate_v2", "cuCtxSetCurrent",
              "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"}
    assert device <= elfsyms.defined_functions(path, abi.DEVICE_FUNCTIONS)
    assert not elfsyms.defined_functions(path, procmaps.RUNTIME_SYMBOLS)


def test_stub_driver_defines_what_the_real_one_does(bindir: Path) -> None:
    path = str(build.build_stubcuda(bindir) / build.LIBCUDA_SONAME)
    assert elfsyms.defined_functions(path, procmaps.DRIVER_SYMBOLS) == procmaps.DRIVER_SYMBOLS


# ---- the real driver: attach and argument decoding ---------------------------------


def assert_results_and_durations(stdout: str, events: list[dict[str, Any]]) -> None:
    """Each call that completes at its return (a return probe: copies, allocations, frees,
    syncs, ...) has the result the workload saw it return (driver.c --results), and a
    duration within the time the workload measured around the call."""
    printed: dict[str, list[tuple[int, int]]] = {}
    for line in stdout.splitlines():
        if line.startswith("result "):
            _, api, code, ns = line.split()
            printed.setdefault(api, []).append((int(code), int(ns)))
    traced: dict[str, list[tuple[int, int]]] = {}
    for e in sorted((e for e in events if "result" in e), key=lambda e: e["ts_ns"]):
        traced.setdefault(e["api"], []).append((e["result"], e["duration_ns"]))
    assert printed and traced.keys() == printed.keys()
    for api, calls in printed.items():
        assert [code for code, _ in traced[api]] == [code for code, _ in calls], api
        for (_, duration), (_, measured) in zip(traced[api], calls, strict=True):
            assert 0 < duration <= measured, api


def probed_line(stderr: str, path: Path) -> str:
    """The summary's line for the probed file at `path` (its real path)."""
    (line,) = [ln for ln in stderr.splitlines() if ln.endswith(str(path.resolve()))
               or f"{path.resolve()}   #" in ln]
    return line


@pytest.mark.parametrize("mode", ["all", "triton"])
def test_real_driver_arguments_are_decoded_exactly(mode: str, bindir: Path,
                                                   tmp_path: Path) -> None:
    """NVIDIA's 535 driver begins each function with a `cmp` the kernel single-steps: its
    probes go at the `je` after it, and read there every argument, result and duration."""
    real_driver_or_skip()
    binary = build.build_driver(bindir, "real")
    proc, events = trace([str(binary), "--mode", mode, "--iters", "5", "--handles-in-memory",
                          "--results"], tmp_path / "out.jsonl")
    base = int(proc.stdout.split("handle-base", 1)[1].split()[0], 16)
    h = expected.memory_handles(base)
    want = (expected.driver_all_events(h) if mode == "all"
            else expected.triton_events(5, h, names=False))
    assert_exact(want, events)
    assert all(e["layer"] == "driver" for e in events)
    # No driver: every call that was timed failed, and no handle was made or named.
    completed = [e for e in events if "result" in e]
    assert completed and all(e["ok"] is False for e in completed)
    assert_results_and_durations(proc.stdout, events)
    # Every probe of the driver at an instruction the kernel emulates: none single-stepped.
    line = probed_line(proc.stderr, build.real_libcuda_dir() / build.LIBCUDA_SONAME)
    assert "single-stepped" not in line and "single-stepped" not in proc.stderr
    launches = [e for e in events if e["type"] == "launch"]
    assert launches and all(e["function"] == 0 for e in launches)
    assert all(e["kernel"] == "unknown+0x0" for e in launches)


def test_no_call_into_nvidia_s_driver_is_single_stepped(bindir: Path, tmp_path: Path) -> None:
    """Every probe on NVIDIA's driver is where the kernel emulates: the trace counts, in the
    kernel, no call that hit a single-stepped probe, and lists the file with none."""
    from gpuflight.producer import trace as tracing
    from gpuflight.producer.settings import CaptureSettings

    real_driver_or_skip()
    require(None if CaptureSettings().attach_cookies else
            "a kernel without attach cookies (before 5.15) does not count stepped calls")
    binary = build.build_driver(bindir, "real")
    out = tmp_path / "out.jsonl"
    result = tracing.run([str(binary), "--mode", "triton", "--iters", "50",
                          "--handles-in-memory"], output=out, print_summary=False)
    assert result.exit_code == 0
    assert len([e for e in read_events(out) if e["type"] == "launch"]) == 50
    (driver,) = [p for p in result.probed if p.kind == "driver"]
    assert driver.path == str((build.real_libcuda_dir() / build.LIBCUDA_SONAME).resolve())
    assert driver.probes > 60 and driver.stepped == 0
    assert result.stepped_calls == 0


def test_a_driver_entered_through_thunks_is_probed_past_them(bindir: Path,
                                                             tmp_path: Path) -> None:
    """The stub driver with each function entered through a thunk of the shapes real drivers
    begin with (tests/workloads/thunks.S: NVIDIA's cmp+je, endbr64, test+jne, nops): every
    argument, result and duration decoded at the moved probes; where nothing could be moved
    past (a first `lea`, a loop back to the `je`) the probe stays at the entry, single-stepped,
    and the summary says so: per file, and how many calls paid for it."""
    binary = build.build_driver(bindir, "thunked")
    proc, events = trace([str(binary), "--mode", "all", "--results"], tmp_path / "out.jsonl")
    want = expected.driver_all_events()
    assert_exact(want, events)
    completed = [e for e in events if "result" in e]
    assert completed and all(e["ok"] is True for e in completed)
    assert_results_and_durations(proc.stdout, events)
    shapes = build.thunk_shapes()
    stepped = {name for name, shape in shapes.items() if shape in ("stepped", "loop_back")
               and name in procmaps.DRIVER_SYMBOLS}
    line = probed_line(proc.stderr, build.libcuda_dir(bindir, "thunked") / build.LIBCUDA_SONAME)
    assert line.split("#")[1].strip() == f"{len(stepped)} function(s) single-stepped"
    calls = sum(1 for e in want if e["api"] in stepped)
    assert calls and f"single-stepped calls: {calls:,}   #" in proc.stderr


# ---- the stub driver: frameworks' launches, names, graphs ---------------------------


def test_triton_like_launches_are_counted_and_named(bindir: Path, tmp_path: Path) -> None:
    binary = build.build_driver(bindir, "stub")
    _, events = trace([str(binary), "--mode", "triton", "--iters", "40"], tmp_path / "out.jsonl")
    assert_exact(expected.triton_events(40), events, names=True)


def test_jax_like_launches_and_a_driver_graph(bindir: Path, tmp_path: Path) -> None:
    binary = build.build_driver(bindir, "stub")
    _, events = trace([str(binary), "--mode", "jax", "--iters", "25"], tmp_path / "out.jsonl")
    assert_exact(expected.jax_events(25), events, names=True)
    graph_launches = [e for e in events if e["type"] == "graph_launch"]
    # Replays expand to kernels downstream: 3 replays of a 2-kernel graph are 6 kernels.
    assert sum(e["kernel_nodes"] for e in graph_launches) == 6


def test_every_driver_api_on_the_stub(bindir: Path, tmp_path: Path) -> None:
    binary = build.build_driver(bindir, "stub")
    _, events = trace([str(binary), "--mode", "all"], tmp_path / "out.jsonl")
    assert_exact(expected.driver_all_events(), events)
    completed = [e for e in events if "result" in e]
    assert completed and all(e["ok"] is True for e in completed)
    # A CUfunction from cuKernelGetFunction is named after its library kernel.
    launches = [e for e in events if e["type"] == "launch"]
    assert {(e["kernel"], e["kernel_full"]) for e in launches} == {("lib_kernel", "lib_kernel")}
    assert all(e["function"] == 0xD0001 for e in launches)


# ---- a runtime over the driver: one event per operation ---------------------------


def test_runtime_forwarding_to_the_driver_is_counted_once(bindir: Path, tmp_path: Path) -> None:
    """The runtime reaches the driver through cuGetProcAddress pointers and exported
    symbols alike; each operation is one event, layer runtime, named from nvcc's
    registration (cudaKernel_t handles) and from .symtab (a stub never registered)."""
    binary = build.build_nvccstyle(bindir)
    _, events = trace([str(binary), "--iters", "30", "--replays", "7"], tmp_path / "out.jsonl")
    assert_exact(expected.nvccstyle_events(30, 7), events, names=True)
    assert {e["layer"] for e in events} == {"runtime"}


def test_static_runtime_inside_a_shared_object(bindir: Path, tmp_path: Path) -> None:
    program, library = build.build_nvccstyle_static_so(bindir)
    # The runtime is only in the library's .symtab: found there, probed there.
    with library.open("rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        exported = {s.name for s in dynsym.iter_symbols()}
    assert "cudaLaunchKernel" not in exported
    assert "cudaLaunchKernel" in elfsyms.defined_functions(str(library), procmaps.RUNTIME_SYMBOLS)
    _, events = trace([str(program), "--iters", "12", "--replays", "2"], tmp_path / "out.jsonl")
    assert_exact(expected.nvccstyle_events(12, 2), events, names=True)


def test_names_of_a_process_attached_late(bindir: Path, tmp_path: Path) -> None:
    """Registration happened before capture: names come from nvcc's `__handle` statics
    (cudaKernel_t handles, read from the process) and from .symtab (stub addresses)."""
    binary = build.build_nvccstyle(bindir)
    go = tmp_path / "go"
    wait_for_probe_releases()
    proc = subprocess.Popen([str(binary), "--iters", "6", "--replays", "2",
                             "--wait-file", str(go)])
    producer = Producer(tmp_path / "node.jsonl", "--pid", str(proc.pid))
    try:
        go.touch()  # attached already: the producer is ready once its first scan attached
        assert proc.wait(timeout=60) == 0
        events = producer.stop()
    finally:
        producer.kill()
        proc.kill()
    assert_exact(expected.nvccstyle_events(6, 2, late=True), events, names=True)


def test_a_command_gone_before_its_maps_are_read_keeps_its_kernel_names(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short command runs to its end as soon as it is let go; on a loaded node the capture
    loop reads its maps only after it has exited. The kernel it launches by address (never
    registered) is still named from its executable's .symtab. Here the loop reads each
    process's maps only once it has exited (or stopped again)."""
    from gpuflight.producer import trace as tracing
    from gpuflight.producer.decode.kernels import KernelNames

    read = KernelNames.remember_maps
    waited: list[int] = []

    def once_it_has_run(self: KernelNames, pid: int) -> None:
        with contextlib.suppress(ChildProcessError):  # only the command is our child
            os.waitid(os.P_PID, pid, os.WEXITED | os.WSTOPPED | os.WNOWAIT)
            waited.append(pid)
        read(self, pid)

    monkeypatch.setattr(KernelNames, "remember_maps", once_it_has_run)
    binary = build.build_nvccstyle(bindir)
    out = tmp_path / "out.jsonl"
    result = tracing.run([str(binary), "--iters", "3", "--replays", "2"], output=out,
                         print_summary=False)
    assert result.exit_code == 0 and waited
    assert_exact(expected.nvccstyle_events(3, 2), read_events(out), names=True)

#: cuGetProcAddress queries (base names, as runtimes ask) → the exported symbol we probe.
PROC_ADDRESS_QUERIES = {
    "cuLaunchKernel": "cuLaunchKernel",
    "cuLaunchKernelEx": "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel": "cuLaunchCooperativeKernel",
    "cuMemAlloc": "cuMemAlloc_v2",
    "cuMemFree": "cuMemFree_v2",
    "cuMemcpyHtoD": "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH": "cuMemcpyDtoH_v2",
    "cuMemcpyAsync": "cuMemcpyAsync",
    "cuStreamSynchronize": "cuStreamSynchronize",
    "cuGraphLaunch": "cuGraphLaunch",
    "cuModuleGetFunction": "cuModuleGetFunction",
    "cuLibraryGetKernel": "cuLibraryGetKernel",
}


def test_real_driver_hands_out_its_probed_entry_points(bindir: Path) -> None:
    """Calls through cuGetProcAddress pointers (how the runtime and PyTorch reach the
    driver) land on the exported functions the probes are on, per-thread forms included."""
    real_driver_or_skip()
    binary = build.build_procaddress(bindir, "real")
    args = [f"{q}={e}" for q, e in PROC_ADDRESS_QUERIES.items()]
    args += ["cuLaunchKernel=cuLaunchKernel_ptsz:", "cuLaunchKernelEx=cuLaunchKernelEx_ptsz:",
             "cuStreamSynchronize=cuStreamSynchronize_ptsz:"]
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60,
                          check=True)
    verdicts = dict(line.rsplit(" ", 1) for line in proc.stdout.splitlines())
    assert verdicts == {a: "same" for a in args}
