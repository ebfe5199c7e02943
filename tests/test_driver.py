"""The driver API end to end, as root with real uprobes: exact counts, arguments and names.

Workloads (tests/workloads/driver.c, nvccstyle.c) run on NVIDIA's real libcuda.so.1 from
Debian non-free (no GPU: every call fails, after the entry probes saw its arguments) and on
our stub driver and forwarding runtime (stubcuda.c, fwdcudart.c), where calls succeed and
make handles. The oracle is tests/workloads/expected.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from producer import discover, elfsyms, records
from producer.errors import SetupError
from tests.conftest import bpf_unavailable_reason, require
from tests.support.capture import Producer, wait_for_probe_releases
from tests.workloads import build, expected

pytestmark = pytest.mark.bpf

GPUFLIGHT = [sys.executable, "-m", "gpuflight"]
TIMEOUT_S = 180


@pytest.fixture(scope="module", autouse=True)
def _bpf_ready() -> None:
    require(bpf_unavailable_reason())


@pytest.fixture(scope="module")
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("driver-workloads")


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
    assert elfsyms.defined_functions(path, discover.DRIVER_SYMBOLS) == discover.DRIVER_SYMBOLS
    # and what the device of each event is followed by (cuCtxCreate_v3/_v4 are newer)
    device = {"cuDevicePrimaryCtxRetain", "cuCtxCreate_v2", "cuCtxSetCurrent",
              "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2"}
    assert device <= elfsyms.defined_functions(path, records.DEVICE_FUNCTIONS)
    assert not elfsyms.defined_functions(path, discover.RUNTIME_SYMBOLS)


def test_stub_driver_defines_what_the_real_one_does(bindir: Path) -> None:
    path = str(build.build_stubcuda(bindir) / build.LIBCUDA_SONAME)
    assert elfsyms.defined_functions(path, discover.DRIVER_SYMBOLS) == discover.DRIVER_SYMBOLS


# ---- the real driver: attach and argument decoding ---------------------------------


@pytest.mark.parametrize("mode", ["all", "triton"])
def test_real_driver_arguments_are_decoded_exactly(mode: str, bindir: Path,
                                                   tmp_path: Path) -> None:
    real_driver_or_skip()
    binary = build.build_driver(bindir, "real")
    proc, events = trace([str(binary), "--mode", mode, "--iters", "5", "--handles-in-memory"],
                         tmp_path / "out.jsonl")
    base = int(proc.stdout.split("handle-base", 1)[1].split()[0], 16)
    h = expected.memory_handles(base)
    want = (expected.driver_all_events(h) if mode == "all"
            else expected.triton_events(5, h, names=False))
    assert_exact(want, events)
    assert all(e["layer"] == "driver" for e in events)
    # No driver: every call that was timed failed, and no handle was made or named.
    completed = [e for e in events if "result" in e]
    assert completed and all(e["ok"] is False for e in completed)
    launches = [e for e in events if e["type"] == "launch"]
    assert launches and all(e["function"] == 0 for e in launches)
    assert all(e["kernel"] == "unknown+0x0" for e in launches)


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
    assert "cudaLaunchKernel" in elfsyms.defined_functions(str(library), discover.RUNTIME_SYMBOLS)
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
