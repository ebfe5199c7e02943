"""Capture end to end, as root with real uprobes: exact counts and arguments.

Workloads (tests/workloads/*.c) are built at test time against the real NVIDIA
runtimes from PyPI (libcudart.so.12 and .so.13, where every call fails with
error 35 but the entry probes see the true arguments), the real
libcudart_static.a linked into the executable, and our simulated GPU (a stub
runtime with the same ABI where every call succeeds and takes known time).
The oracle is tests/workloads/expected.py, written from the workload's script.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuflight.demo.build import SIMGPU_SONAME
from gpuflight.producer.decode.summary import Summary
from gpuflight.simgpu.build import SimGpu, read_counts
from gpuflight.simgpu.build import build as build_sim
from tests.support.capture import (
    GPUFLIGHT,
    Producer,
    read_events,
    start_calls,
    wait_for_probe_releases,
)
from tests.support.counting import (
    aggregates_from_json,
    events_from_json,
    figures_of_text,
    text_figures_of_summary,
)
from tests.workloads import build, expected

pytestmark = pytest.mark.bpf

TIMEOUT_S = 180


def trace(cmd: Sequence[str], out: Path, *extra: str, env: dict[str, str] | None = None
          ) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    proc = subprocess.run(
        [*GPUFLIGHT, "trace", "--output", str(out), *extra, "--", *cmd],
        capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, read_events(out) if out.exists() else []


def assert_exact(want: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    missing, unexpected = expected.diff(want, got)
    assert not missing and not unexpected, (
        f"{len(missing)} missing, e.g. {missing[:3]}; {len(unexpected)} unexpected, "
        f"e.g. {unexpected[:3]}"
    )


# ---- trace: every runtime, exact ------------------------------------------------

@pytest.mark.parametrize("runtime", build.RUNTIMES)
def test_trace_is_exact_on_every_runtime(
    runtime: build.Runtime, bindir: Path, tmp_path: Path
) -> None:
    binary = build.build_capture(bindir, runtime)
    threads, iters = 3, 25
    proc, events = trace([str(binary), "--threads", str(threads), "--iters", str(iters),
                          "--all-apis"], tmp_path / "out.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert_exact(expected.capture_events(threads, iters, all_apis=True), events)
    # One process; the work came from the three worker threads and main.
    assert len({e["pid"] for e in events}) == 1
    assert len({e["tid"] for e in events}) == threads + 1
    assert all(e["layer"] == "runtime" for e in events)
    # C workloads register no kernels: each launch is named by its stub's symbol.
    launches = [e for e in events if e["type"] == "launch"]
    assert {(e["kernel"], e["kernel_full"]) for e in launches} == {
        (f"kernel_{c}", f"kernel_{c}") for c in "abcdef"}
    # Results and durations are known exactly where a return probe completes the event.
    completed = [e for e in events if e["type"] in {"alloc", "free", "sync"}
                 or (e["type"] == "memcpy" and not e["async"])]
    assert completed
    assert all(isinstance(e["duration_ns"], int) and e["duration_ns"] > 0 for e in completed)
    if runtime == "stub":
        assert all(e["ok"] is True for e in completed)
        allocs = {e["ptr"]: e["bytes"] for e in events if e["type"] == "alloc"}
        frees = [e for e in events if e["type"] == "free"]
        assert all(allocs.get(e["ptr"]) == e["bytes"] for e in frees)
    else:  # no driver: every completed call reports cudaErrorInsufficientDriver
        assert {e["result"] for e in completed} == {35}
        assert all(e["ok"] is False for e in completed)
    assert "events dropped: 0" in proc.stderr


def test_trace_summary_and_passthrough(bindir: Path, tmp_path: Path) -> None:
    binary = build.build_capture(bindir, "stub")
    script = f'echo to-stdout; echo to-stderr >&2; "{binary}" --iters 10; exit 7'
    proc, events = trace(["sh", "-c", script], tmp_path / "out.jsonl")
    assert proc.returncode == 7
    assert proc.stdout == "to-stdout\n"
    assert proc.stderr.startswith("to-stderr\n")
    # The workload ran in a grandchild (sh forks it): followed from its first call.
    assert_exact(expected.capture_events(1, 10), events)
    summary = proc.stderr
    assert "40  kernel launches" in summary.replace(",", "")
    assert "(64,1,1)  (32,4,1)" in summary  # a top launch shape
    assert "H2D" in summary and "D2H" in summary
    assert "events dropped: 0" in summary


def test_trace_covers_a_library_dlopened_late(bindir: Path, tmp_path: Path) -> None:
    dlopen = build.build_dlopen(bindir)
    library = build.runtime_library(bindir, "cu12")
    proc, events = trace([str(dlopen), "--lib", str(library), "--iters", "50"],
                         tmp_path / "out.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert_exact(expected.dlopen_events(50), events)


def test_sync_copy_and_wait_durations_on_the_simulated_gpu(bindir: Path, tmp_path: Path) -> None:
    """The stub copies at a known bandwidth: 4096 B per thread at 1 MB/s take ~4.1 ms."""
    binary = build.build_capture(bindir, "stub")
    env = {**os.environ, "GF_SIM_H2D_GBPS": "0.001"}
    proc, events = trace([str(binary), "--iters", "3"], tmp_path / "out.jsonl", env=env)
    assert proc.returncode == 0, proc.stderr
    copies = [e for e in events if e["api"] == "cudaMemcpy"]
    assert len(copies) == 3
    for copy in copies:
        assert 4_000_000 <= copy["duration_ns"] <= 12_000_000, copy
    # Each stream sync waits for the async 1 MiB D2H copy queued before it.
    syncs = [e for e in events if e["api"] == "cudaStreamSynchronize"]
    assert len(syncs) == 3 and all(e["duration_ns"] > 0 and e["ok"] for e in syncs)


@pytest.mark.simgpu
def test_each_event_carries_its_threads_device(
    bindir: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """On the simulated GPU with two devices: cudaSetDevice, a thread's own default, and the
    driver's contexts (set, push, pop, create) put each launch on the device the simulated
    driver ran it on, per event and in the summary."""
    sim: SimGpu = build_sim(tmp_path_factory.mktemp("simgpu"), runtimes=(13,))
    binary = build.build_devices(bindir, sim)
    counts = tmp_path / "counts.json"
    proc, events = trace([str(binary)], tmp_path / "out.jsonl",
                         env=sim.env(devices=2, counts=counts))
    assert proc.returncode == 0, proc.stderr
    assert_exact(expected.devices_events(), events)
    (c,) = read_counts(counts)
    driver_per_device = [sum(k["per_device"]["launches"][d] for k in c["kernels"].values())
                         for d in (0, 1)]
    assert driver_per_device == expected.devices_launches_per_device() == [5, 6]
    summary = proc.stderr.replace(",", "")
    assert "5    on device 0" in summary and "6    on device 1" in summary, summary


def test_each_thread_s_events_keep_their_order_through_cpu_buffers_and_ring(
    bindir: Path, tmp_path: Path
) -> None:
    """Each CPU's event buffer (bpf/cudart.bpf.c GF_CPU_SLOTS) and the ring are read one after
    the other: with buffers of 16 slots, four threads' events go to both, and every one comes
    out, exact, each thread's in the order it made them."""
    binary = build.build_capture(bindir, "stub")
    threads, iters = 4, 3000
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        [*GPUFLIGHT, "-v", "trace", "--output", str(out), "--cpu-buffer-slots", "16", "--",
         str(binary), "--threads", str(threads), "--iters", str(iters), "--all-apis"],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = read_events(out)
    assert_exact(expected.capture_events(threads, iters, all_apis=True), events)
    assert "events dropped: 0" in proc.stderr
    by_thread: dict[int, list[int]] = {}
    for e in events:
        by_thread.setdefault(e["tid"], []).append(e["ts_ns"])
    assert len(by_thread) == threads + 1
    for tid, times in by_thread.items():
        assert all(a < b for a, b in itertools.pairwise(times)), f"thread {tid} out of order"
    read = re.search(r"events read: (\d+) from the per-CPU buffers, (\d+) from the ring",
                     proc.stderr)
    assert read, proc.stderr[-3000:]
    from_cpus, from_ring = int(read[1]), int(read[2])
    assert from_cpus > 0 and from_ring > 0 and from_cpus + from_ring == len(events)


def test_what_a_full_ring_cannot_hold_is_counted_never_silent(bindir: Path,
                                                              tmp_path: Path) -> None:
    """A one-page ring buffer (behind CPU buffers of 16 slots, which a burst fills at once)
    cannot hold a burst: what it cannot take is counted in the kernel
    (the --output's "aggregate" lines, each with its count) and what fits nowhere is counted
    lost: recorded + counted + lost is every call."""
    binary = build.build_capture(bindir, "stub")
    threads, iters = 2, 4000
    proc, lines = trace([str(binary), "--threads", str(threads), "--iters", str(iters)],
                        tmp_path / "out.jsonl", "--ring-buffer-pages", "1",
                        "--cpu-buffer-slots", "16")
    assert proc.returncode == 0, proc.stderr
    want = len(expected.capture_events(threads, iters))
    dropped = int(proc.stderr.rsplit("events dropped:", 1)[1].split()[0].replace(",", ""))
    counted = sum(a["count"] for a in lines if a["type"] == "aggregate")
    recorded = sum(e["type"] != "aggregate" for e in lines)
    assert counted > 0
    assert recorded + counted + dropped == want
    assert f"events counted in the kernel: {counted:,}" in proc.stderr
    assert ("dropped in the kernel" in proc.stderr) == (dropped > 0)


def test_a_flood_leaves_a_small_job_seen_and_every_count_exact(bindir: Path,
                                                               tmp_path: Path) -> None:
    """One process floods a small ring (16 pages, ~680 events, behind CPU buffers of 16 slots)
    while another makes a few calls:
    the small one's events are all recorded (under pressure each process has a share of the
    ring), and what the flood's could not be is counted in the kernel, so every figure of the
    summary and of --output is exact: the workloads' own counts."""
    binary = build.build_capture(bindir, "stub")
    flood_threads, flood_iters, small_iters = 2, 20_000, 5
    script = (f'"{binary}" --threads {flood_threads} --iters {flood_iters} & '
              f'"{binary}" --iters {small_iters}; wait')
    proc, lines = trace(["sh", "-c", script], tmp_path / "out.jsonl",
                        "--ring-buffer-pages", "16", "--cpu-buffer-slots", "16")
    assert proc.returncode == 0, proc.stderr
    assert "events dropped: 0" in proc.stderr
    events = [e for e in lines if e["type"] != "aggregate"]
    counted = [a for a in lines if a["type"] == "aggregate"]
    totals: Counter[int] = Counter(e["pid"] for e in events)
    for a in counted:
        totals[a["pid"]] += a["count"]
    small_pid, flood_pid = sorted(totals, key=totals.__getitem__)
    small_want = expected.capture_events(1, small_iters)
    flood_want = expected.capture_events(flood_threads, flood_iters)
    # The small job: every event recorded, exactly, none of it only counted.
    assert_exact(small_want, of_pid(events, small_pid))
    assert not of_pid(counted, small_pid)
    # The flood: the ring was under pressure, and what it shed was counted, per api exactly.
    assert sum(a["count"] for a in counted) > 0
    flood = expected.api_counts(of_pid(events, flood_pid))
    for a in of_pid(counted, flood_pid):
        flood[a["api"]] += a["count"]
    assert flood == expected.api_counts(flood_want)
    # The summary: what it printed is what its events and aggregates count, and exact.
    summary = Summary()
    summary.add(events_from_json(events))
    summary.add_aggregates(aggregates_from_json(counted))
    printed = figures_of_text(proc.stderr)
    assert printed == text_figures_of_summary(summary)
    both = [*flood_want, *small_want]
    assert printed["kernel launches"] == sum(e["type"] == "launch" for e in both)
    assert printed["copies"] == dict(Counter(e["kind"] for e in both if e["type"] == "memcpy"))
    assert summary.events == len(both)


#: Copies through the simulated GPU's runtime by ctypes: N cudaMemcpy and N cudaMemcpyAsync.
TAIL_COPIES = """
import ctypes, sys
rt = ctypes.CDLL("libcudart.so.13")
n = int(sys.argv[1])
d = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(d), ctypes.c_size_t(1 << 20)) == 0
h = ctypes.create_string_buffer(1 << 20)
for _ in range(n):
    assert rt.cudaMemcpy(d, h, ctypes.c_size_t(4096), 1) == 0
for _ in range(n):
    assert rt.cudaMemcpyAsync(d, h, ctypes.c_size_t(8192), 1, None) == 0
assert rt.cudaDeviceSynchronize() == 0
"""


@pytest.mark.simgpu
def test_a_runtime_that_tail_calls_the_driver_is_counted_once(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The simulated runtime's cudaMemcpy and cudaMemcpyAsync end in `jmp *ptr` to the driver
    entry points cuGetProcAddress gave (GF_SIM_TAIL_CALLS=1): the driver returns straight to
    the application, so its return address is no runtime's. 25 copies of each are 25 events
    each, recorded once by the runtime's probes, as the simulated driver counted them."""
    sim: SimGpu = build_sim(tmp_path_factory.mktemp("simgpu"), runtimes=(13,))
    counts = tmp_path / "counts.json"
    env = {**sim.env(counts=counts), "GF_SIM_TAIL_CALLS": "1"}
    proc, events = trace([sys.executable, "-c", TAIL_COPIES, "25"], tmp_path / "out.jsonl",
                         env=env)
    assert proc.returncode == 0, proc.stderr
    copies = Counter((e["api"], e["layer"]) for e in events if e["type"] == "memcpy")
    assert copies == {("cudaMemcpy", "runtime"): 25, ("cudaMemcpyAsync", "runtime"): 25}
    (c,) = read_counts(counts)
    assert c["copies"]["h2d"]["count"] == 50


# ---- producer: node-wide --------------------------------------------------------


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[Producer]:
    wait_for_probe_releases()
    running = Producer(tmp_path / "node.jsonl")
    yield running
    running.kill()


def of_pid(events: list[dict[str, Any]], pid: int) -> list[dict[str, Any]]:
    return [e for e in events if e["pid"] == pid]


def test_producer_finds_processes_started_after_it(producer: Producer, bindir: Path,
                                                    tmp_path: Path) -> None:
    # A copy is a library file nobody has mapped yet: covered within 1 s of being mapped.
    binary = build.build_capture(bindir, "stub")
    private = tmp_path / "fresh"
    shutil.copytree(bindir / "simgpu", private)
    env = {**os.environ, "LD_LIBRARY_PATH": str(private)}
    first = subprocess.Popen([str(binary), "--start-delay-ms", "1200", "--iters", "5",
                              "--hold-ms", "1500"], env=env)
    producer.wait_for_library(str(private))  # first maps the new file; it is attached now
    # A second process on the same, already attached file is covered from its first call.
    second = subprocess.Popen([str(binary), "--iters", "5"], env=env)
    assert second.wait(timeout=60) == 0 and first.wait(timeout=60) == 0
    events = producer.stop()
    assert_exact(expected.capture_events(1, 5), of_pid(events, first.pid))
    assert_exact(expected.capture_events(1, 5), of_pid(events, second.pid))


def test_producer_sees_a_private_mount_namespace(producer: Producer, bindir: Path) -> None:
    """The library exists only in the process's own mount namespace."""
    binary = build.build_capture(bindir, "cu13")
    library = build.runtime_library(bindir, "cu13")
    script = (
        "mount -t tmpfs gpuflight-test /mnt && "
        f"cp {library} /mnt/ && "
        f"LD_LIBRARY_PATH=/mnt exec {binary} --start-delay-ms 1200 --iters 4"
    )
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                             "sh", "-c", script])
    assert proc.wait(timeout=60) == 0
    events = producer.stop()
    mine = of_pid(events, proc.pid)
    assert_exact(expected.capture_events(1, 4), mine)


def test_producer_covers_a_late_dlopen(producer: Producer, bindir: Path, tmp_path: Path) -> None:
    dlopen = build.build_dlopen(bindir)
    fresh = tmp_path / "libcudart.so.12"
    shutil.copy(build.runtime_library(bindir, "cu12"), fresh)
    proc = subprocess.Popen([str(dlopen), "--lib", str(fresh), "--delay-ms", "1200",
                             "--iters", "20"])
    assert proc.wait(timeout=60) == 0
    events = producer.stop()
    assert_exact(expected.dlopen_events(20), of_pid(events, proc.pid))


def _wait_mapped(pid: int, name: str, timeout_s: float = 60) -> None:
    """Wait until process `pid` maps a file called `name`."""
    deadline = time.monotonic() + timeout_s
    while name not in Path(f"/proc/{pid}/maps").read_text():
        assert time.monotonic() < deadline, f"{pid} never mapped {name}"
        time.sleep(0.01)


def test_producer_pid_filter(bindir: Path, tmp_path: Path) -> None:
    binary = build.build_capture(bindir, "stub")
    wait_for_probe_releases()
    # Both map the runtime, then wait (stopped) until the producer has probed it: however long
    # its start takes, their calls come after.
    wanted = subprocess.Popen([str(binary), "--start-delay-ms", "60000", "--iters", "3"])
    other = subprocess.Popen([str(binary), "--start-delay-ms", "60000", "--iters", "3"])
    try:
        for child in (wanted, other):
            _wait_mapped(child.pid, SIMGPU_SONAME)
            os.kill(child.pid, signal.SIGSTOP)
        running = Producer(tmp_path / "pid.jsonl", "--pid", str(wanted.pid))
        try:
            running.wait_for_library(SIMGPU_SONAME)
            for child in (wanted, other):  # the start delay ended: the calls begin
                os.kill(child.pid, signal.SIGCONT)
                start_calls(child.pid)
            assert wanted.wait(timeout=60) == 0 and other.wait(timeout=60) == 0
            events = running.stop()
        finally:
            running.kill()
    finally:
        for child in (wanted, other):  # none left stopped if the producer failed
            if child.poll() is None:
                child.kill()
                child.wait()
    assert Counter(e["pid"] for e in events) == {wanted.pid: len(expected.capture_events(1, 3))}


@pytest.mark.parametrize("task_layout", ["known", "unknown"])
def test_forks_are_followed_on_the_raw_tracepoint_or_else_the_perf_event(
    task_layout: str, bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tracepoint of trace's program is a raw one (their release waits for nothing,
    where a tracepoint perf event's holds the kernel's event_mutex for two grace periods);
    the fork one reads the child's pid where the kernel's BTF says. Where that is unknown,
    forks are followed on the tracepoint perf event. Either way a grandchild (sh forks it)
    is traced from its first call."""
    from gpuflight.producer import trace as tracing
    from gpuflight.producer.probe import bpfload, btf
    from gpuflight.producer.probe.btf import BtfError

    if task_layout == "unknown":
        def unknown(_btf: btf.Btf) -> list[str]:
            raise BtfError("struct task_struct has no member pid")
        monkeypatch.setattr(btf, "task_pid_cflags", unknown)
    monkeypatch.setenv("GPUFLIGHT_CACHE_DIR", str(tmp_path / "cache"))  # compiled afresh
    attached: list[list[str]] = []
    real_init = bpfload.LoadedObject.__init__

    def init(self: bpfload.LoadedObject, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        attached.append(sorted(self.tracepoints))
    monkeypatch.setattr(bpfload.LoadedObject, "__init__", init)

    binary = build.build_capture(bindir, "stub")
    out = tmp_path / "out.jsonl"
    before = time.monotonic_ns()
    result = tracing.run(["sh", "-c", f'"{binary}" --iters 5; true'], output=out,
                         print_summary=False)
    after = time.monotonic_ns()
    assert result.exit_code == 0
    events = read_events(out)
    assert_exact(expected.capture_events(1, 5), events)
    # The output's wall-clock times, less the trace's offset, are the probes' own monotonic
    # times: within the run, whatever the wall clock did.
    assert all(before <= e["ts_ns"] - result.clock_offset_ns <= after for e in events)
    fork = "raw:sched_process_fork" if task_layout == "known" else "sched:sched_process_fork"
    assert attached[0] == sorted(["raw:sched_process_exec", "raw:sched_process_exit",
                                  "raw:sys_enter", fork])


def test_a_trace_keeps_its_verdicts_and_the_next_reads_no_symbols(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trace` saves what it learned of each library file (producer/discover/verdictcache.py: what
    it
    defines, and where its probes go) when it closes, and the compiled BPF program
    (producer/probe/bpfimage.py) when it starts; the next one classifies and attaches the same
    files from that alone (no ELF read), compiles nothing, and captures as exactly."""
    from gpuflight.producer import trace as tracing
    from gpuflight.producer.discover import elfsyms
    from gpuflight.producer.probe import compile as bpfcompile

    binary = build.build_capture(bindir, "stub")
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPUFLIGHT_CACHE_DIR", str(cache))
    want = expected.capture_events(1, 5)
    first = tmp_path / "first.jsonl"
    assert tracing.run([str(binary), "--iters", "5"], output=first,
                       print_summary=False).exit_code == 0
    assert_exact(want, read_events(first))
    assert (cache / "verdicts.json").is_file()
    assert len(list(cache.glob("bpf-*.json"))) == 1

    document = orjson.loads((cache / "verdicts.json").read_bytes())
    plans = {row[10][0] for row in document["entries"] if len(row) > 6 and row[10]}
    assert {"runtime", "loader"} <= plans  # kept for the stub runtime and the loader

    def unread(path: str, wanted: object, *rest: object) -> frozenset[str]:
        raise AssertionError(f"{path} was read for its symbols again")

    def uncompiled(text: str, cflags: list[str]) -> None:
        raise AssertionError("the BPF program was compiled again")

    # Neither to classify nor to attach (producer/discover/attachplan.py).
    for name in ("defined_functions", "referenced_functions", "function_addresses",
                 "symbol_address", "vaddr_to_file_offset"):
        monkeypatch.setattr(elfsyms, name, unread)
    monkeypatch.setattr(bpfcompile, "compile_image", uncompiled)
    second = tmp_path / "second.jsonl"
    assert tracing.run([str(binary), "--iters", "5"], output=second,
                       print_summary=False).exit_code == 0
    assert_exact(want, read_events(second))


def test_the_cuda_programs_load_after_the_command_starts_and_capture_is_exact(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA API programs and the maps only they use (the events and names rings among
    them) are made on a thread of their own (Probes._load_programs) while the command
    starts; here they are held back until the command's runtime is being attached, so that
    the capture loop runs without the rings meanwhile and the attach has to wait for them:
    it uses each loader thread's program (none is loaded twice), and the capture is exact."""
    from gpuflight.producer import trace as tracing
    from gpuflight.producer.probe import bpfload
    from gpuflight.producer.probe.probes import Probes

    gate = threading.Event()
    loads: Counter[tuple[str, int, int]] = Counter()
    waiting_at_attach: list[bool] = []
    real_load = bpfload.LoadedObject._load
    real_maps = bpfload.LoadedObject._make_later_maps
    real_attach = Probes._attach_runtime
    rings_at_attach: list[bool] = []

    def gated_maps(self: bpfload.LoadedObject) -> None:
        if threading.current_thread() is not threading.main_thread():
            assert gate.wait(60), "no runtime was attached"
        real_maps(self)

    def gated_load(self: bpfload.LoadedObject, name: str, prog_type: int,
                   attach_type: int) -> int:
        if (prog_type == bpfload.BPF_PROG_TYPE_KPROBE
                and threading.current_thread() is not threading.main_thread()):
            assert gate.wait(60), "no runtime was attached"
        loads[(name, prog_type, attach_type)] += 1
        return real_load(self, name, prog_type, attach_type)

    def attach_runtime(self: Probes, library: Any, path: str, fds: list[int]) -> Any:
        done, _failure = self._bpf.background_failure()
        waiting_at_attach.append(not done)
        rings_at_attach.append(self._bpf.made("events") or self._bpf.made("names"))
        gate.set()
        return real_attach(self, library, path, fds)

    monkeypatch.setattr(bpfload.LoadedObject, "_load", gated_load)
    monkeypatch.setattr(bpfload.LoadedObject, "_make_later_maps", gated_maps)
    monkeypatch.setattr(Probes, "_attach_runtime", attach_runtime)
    binary = build.build_capture(bindir, "stub")
    out = tmp_path / "out.jsonl"
    result = tracing.run([str(binary), "--threads", "2", "--iters", "10", "--all-apis"],
                         output=out, print_summary=False)
    assert result.exit_code == 0
    assert waiting_at_attach[:1] == [True]  # the runtime came while its programs were loading
    assert rings_at_attach[:1] == [False]  # and before the rings were made
    assert loads and max(loads.values()) == 1
    assert_exact(expected.capture_events(2, 10, all_apis=True), read_events(out))
    assert result.dropped == 0


def test_before_the_rings_are_made_there_is_nothing_to_drain_and_nothing_waits(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture loop drains the events and names rings from its first turn; until the
    loader thread has made them (no CUDA program can have run), a drain finds nothing
    rather than waiting, and the readers are made once the rings are."""
    from gpuflight.producer.probe import bpfload
    from gpuflight.producer.probe.probes import Probes
    from gpuflight.producer.settings import CaptureSettings

    gate = threading.Event()
    real_maps = bpfload.LoadedObject._make_later_maps

    def gated_maps(self: bpfload.LoadedObject) -> None:
        assert gate.wait(60)
        real_maps(self)

    monkeypatch.setattr(bpfload.LoadedObject, "_make_later_maps", gated_maps)
    probes = Probes(CaptureSettings(pids=frozenset()))
    try:
        assert not probes._bpf.made("events") and not probes._bpf.made("names")
        assert len(probes.drain_events(10)) == 0 and len(probes.drain_names()) == 0
        assert probes._bpf.background_failure() == (False, None)
        probes.check_loaded()  # still loading: no error
        gate.set()
        probes.wait_loaded()
        assert probes._bpf.made("events") and probes._bpf.made("names")
        assert len(probes.drain_events(10)) == 0 and len(probes.drain_names()) == 0
        assert probes._events_ring is not None and probes._names_ring is not None
    finally:
        gate.set()
        probes.close(background=False)


def test_a_cuda_program_that_fails_to_load_after_the_command_starts_ends_trace_clearly(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA API program the kernel refuses on its loader thread: trace ends with the error
    it gave when every program loaded before the command (SetupError, "the BPF program did
    not load: ..."), no probe missing unsaid; the command, already started, runs to its end
    untraced, and nothing hangs."""
    from gpuflight.producer import trace as tracing
    from gpuflight.producer.contract.errors import SetupError
    from gpuflight.producer.probe import bpfload

    real_load = bpfload.LoadedObject._load

    def refusing_load(self: bpfload.LoadedObject, name: str, prog_type: int,
                      attach_type: int) -> int:
        if (prog_type == bpfload.BPF_PROG_TYPE_KPROBE
                and threading.current_thread() is not threading.main_thread()):
            raise OSError(errno.EACCES, "Permission denied: R2 !read_ok (as a test refuses)")
        return real_load(self, name, prog_type, attach_type)

    monkeypatch.setattr(bpfload.LoadedObject, "_load", refusing_load)
    binary = build.build_capture(bindir, "stub")
    marker = tmp_path / "done"
    with pytest.raises(SetupError) as raised:
        tracing.run(["sh", "-c", f'"{binary}" --iters 5; touch "{marker}"; exit 3'],
                    output=tmp_path / "out.jsonl", print_summary=False)
    assert str(raised.value) == (f"the BPF program did not load: [Errno {errno.EACCES}] "
                                 "Permission denied: R2 !read_ok (as a test refuses)")
    assert marker.exists()  # the command ran to its end


def _links_to(path: Path) -> int:
    """How many uprobe links of this process point into `path` (their fdinfo says)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            info = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue
        if "uprobe" in info and f"path:\t{path}\n" in info:
            count += 1
    return count


def test_the_node_agent_detaches_a_file_no_process_maps_any_more(
    bindir: Path, tmp_path: Path
) -> None:
    """Node-wide, a library file whose last process is gone (a finished job's, a deleted
    image's) is detached after settings.detach_unmapped_after_s: its probes' fds are closed
    (in the soak, 11,856 an hour kept open before), and a process that maps it later has it
    attached again, captured exactly."""
    from gpuflight.producer.capture import Capture
    from gpuflight.producer.decode.sinks import MemorySink
    from gpuflight.producer.settings import CaptureSettings

    binary = build.build_capture(bindir, "stub")
    lib = tmp_path / "lib"
    shutil.copytree(bindir / "simgpu", lib)
    runtime = (lib / "libcudart.so.12").resolve()
    key = (runtime.stat().st_dev, runtime.stat().st_ino)
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(lib)}
    sink = MemorySink()
    capture = Capture(CaptureSettings(detach_unmapped_after_s=0.0), [sink])

    def step_until(done: Any, what: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, what
            capture.step()

    try:
        capture.start()
        first = subprocess.Popen([str(binary), "--start-delay-ms", "600000"], env=env)
        step_until(lambda: key in capture.probes.attached, "the runtime was never attached")
        assert _links_to(runtime) > 0
        first.kill()
        first.wait()
        step_until(lambda: key not in capture.probes.attached, "the runtime stayed attached")
        step_until(lambda: _links_to(runtime) == 0, "its probes' links stayed open")

        # Node-wide nothing is held: the job waits before its first call until the runtime
        # is attached again, then is told to start. (Stopping it once its maps show the
        # runtime could stop it between ld.so's mmap and its notification, which then never
        # came while it was stopped: seen once under load.)
        second = subprocess.Popen([str(binary), "--iters", "5", "--start-delay-ms", "600000"],
                                  env=env)
        try:
            step_until(lambda: key in capture.probes.attached, "not attached again")
            start_calls(second.pid)
            step_until(lambda: second.poll() is not None, "the second job did not end")
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
        capture.drain(until_empty=True)
        assert second.returncode == 0
    finally:
        capture.close()
    assert_exact(expected.capture_events(1, 5),
                 [e for e in sink.events if e["pid"] == second.pid])


def test_a_lost_loader_notification_has_every_process_scanned_again(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node-wide, a process already scanned is scanned again when its loader says it mapped
    something. A notification lost (its ring full: counted in the kernel) would leave what it
    mapped then unprobed until its next dlopen: a rescan that finds loader notifications lost
    scans every process again."""
    from gpuflight.producer.capture import Capture
    from gpuflight.producer.decode.sinks import MemorySink
    from gpuflight.producer.settings import CaptureSettings

    build.build_capture(bindir, "stub")
    lib = tmp_path / "lib"
    shutil.copytree(bindir / "simgpu", lib)
    runtime = lib / "libcudart.so.12"
    key = (runtime.stat().st_dev, runtime.stat().st_ino)
    capture = Capture(CaptureSettings(), [MemorySink()])
    job = subprocess.Popen(
        [sys.executable, "-c", "import ctypes, sys; sys.stdin.readline(); "
         f"ctypes.CDLL({str(runtime)!r}); print('mapped', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert job.stdin is not None and job.stdout is not None
    try:
        capture.start()
        deadline = time.monotonic() + 120
        while job.pid not in capture._loader_covered:
            assert time.monotonic() < deadline, "the job was never scanned"
            capture.step()
        job.stdin.write(b"\n")
        job.stdin.flush()
        assert job.stdout.readline() == b"mapped\n"
        capture.probes.poll_loader(0)  # its notification, lost
        capture.rescan()
        assert key not in capture.probes.attached
        monkeypatch.setattr(capture.probes, "loader_drops", lambda: 1, raising=False)
        capture.rescan()
        assert key in capture.probes.attached
    finally:
        job.kill()
        job.wait()
        job.stdin.close()
        job.stdout.close()
        capture.close()


def test_the_node_agent_forgets_a_process_once_it_is_gone(
    bindir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node-wide, what is kept of a process (its allocations' sizes, graphs, kernel names and
    maps; the Kafka sink's identity, through exit_observers) is dropped once a rescan found it
    gone, FORGET_EXITED_AFTER_S later — after its events were drained, named and handed on.
    Thousands of short-lived processes an hour then leave nothing behind (the soak's agent
    grew 130 MiB an hour keeping them up to the caches' 4,096 processes, identities without
    bound); one that lives on keeps its state."""
    from gpuflight.producer import capture as capture_module
    from gpuflight.producer.capture import Capture
    from gpuflight.producer.decode.enrich import Enricher
    from gpuflight.producer.decode.sinks import MemorySink
    from gpuflight.producer.settings import CaptureSettings

    monkeypatch.setattr(capture_module, "FORGET_EXITED_AFTER_S", 0.5)
    binary = build.build_capture(bindir, "stub")
    enricher = Enricher()
    sink = MemorySink(enricher.kernels)
    capture = Capture(CaptureSettings(), [sink], enricher)
    forgotten: set[int] = set()
    capture.exit_observers.append(forgotten.update)

    def step_until(done: Any, what: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, what
            capture.step()

    holder = subprocess.Popen([str(binary), "--iters", "0", "--start-delay-ms", "600000"])
    short: list[subprocess.Popen[bytes]] = []
    try:
        capture.start()
        step_until(lambda: holder.pid in enricher.pids(), "the holder was never scanned")
        for _ in range(4):
            short.append(subprocess.Popen([str(binary), "--iters", "3"]))
        step_until(lambda: all(p.poll() is not None for p in short), "the jobs did not end")
        pids = {p.pid for p in short}
        step_until(lambda: pids <= forgotten, "the exited processes were never forgotten")
        assert not pids & enricher.pids()
        assert holder.pid in enricher.pids() and holder.pid not in forgotten
        holder.kill()
        holder.wait()
        step_until(lambda: holder.pid in forgotten, "the holder was never forgotten")
        assert holder.pid not in enricher.pids()
    finally:
        holder.kill()
        capture.close()
    for p in short:
        assert p.returncode == 0
        mine = [e for e in sink.events if e["pid"] == p.pid]
        assert_exact(expected.capture_events(1, 3), mine)
        # Named while the process was still known: forgetting came after.
        assert all(e["kernel"] for e in mine if e["type"] == "launch"), mine[:3]


def test_kernel_naming_reads_no_process_while_it_is_held(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What kernel naming reads of a process (its maps and nvcc `__handle` statics: the
    first read of libtorch_cuda.so's costs 0.1-0.9 s) is read after the process that mapped
    a CUDA file is let go, never while the loader probe holds it (issue 14)."""
    from gpuflight.producer import trace as tracing
    from gpuflight.producer.capture import Capture
    from gpuflight.producer.decode.kernels import KernelNames
    from gpuflight.producer.probe import probes

    binary = build.build_capture(bindir, "stub")
    held: set[int] = set()
    log: list[tuple[str, int, frozenset[int]]] = []
    poll, release, remember = (
        probes.Probes.poll_loader, Capture._release, KernelNames.remember_maps
    )

    def polled(self: probes.Probes, timeout_s: float) -> list[probes.LoaderEvent]:
        notes = poll(self, timeout_s)
        held.update(n.pid for n in notes if n.held)
        return notes

    def released(self: Capture, note: probes.LoaderEvent) -> None:
        held.discard(note.pid)
        log.append(("release", note.pid, frozenset(held)))
        release(self, note)

    def remembered(self: KernelNames, pid: int) -> None:
        log.append(("remember", pid, frozenset(held)))
        remember(self, pid)

    monkeypatch.setattr(probes.Probes, "poll_loader", polled)
    monkeypatch.setattr(Capture, "_release", released)
    monkeypatch.setattr(KernelNames, "remember_maps", remembered)
    out = tmp_path / "out.jsonl"
    assert tracing.run([str(binary), "--iters", "3"], output=out,
                       print_summary=False).exit_code == 0
    assert_exact(expected.capture_events(1, 3), read_events(out))
    remembered_pids = {pid for kind, pid, _ in log if kind == "remember"}
    assert remembered_pids, log  # the workload maps the runtime: its maps were read
    assert any(kind == "release" for kind, _, _ in log), log  # and it was held
    assert [entry for entry in log if entry[0] == "remember" and entry[2]] == []
