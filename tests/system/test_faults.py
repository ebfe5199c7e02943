"""What a user trips on, and what goes wrong around capture: one line and the right exit code,
no traceback, and a failing output or a failing detach never costs the others their data."""

from __future__ import annotations

import errno
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflight.producer import trace
from gpuflight.producer.capture import Capture
from gpuflight.producer.probe.probes import LoaderEvent, Probes
from gpuflight.producer.probe.uprobes import UprobeLinks
from gpuflight.producer.settings import CaptureSettings
from tests.support.capture import GPUFLIGHT, read_events, wait_for_probe_releases
from tests.workloads import build, expected

pytestmark = pytest.mark.bpf

# ---- command lines ------------------------------------------------------------------------


# ---- a failing output ---------------------------------------------------------------------


@pytest.mark.bpf
def test_trace_on_a_full_disk_keeps_the_summary_and_says_so(bindir: Path) -> None:
    binary = build.build_capture(bindir, "stub")
    proc = subprocess.run([*GPUFLIGHT, "trace", "--output", "/dev/full", "--", str(binary),
                           "--iters", "10"], capture_output=True, text=True, timeout=180,
                          check=False)
    assert proc.returncode == trace.EXIT_OUTPUT_INCOMPLETE, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "40  kernel launches" in proc.stderr.replace(",", "")
    assert "--output /dev/full is incomplete: No space left on device" in proc.stderr


@pytest.mark.bpf
def test_the_command_outlives_a_broken_capture(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capture fails half-way: the command runs to its end, untraced, with its exit code, and
    the summary of what was captured is there; no process is left held or orphaned."""
    binary = build.build_capture(bindir, "stub")
    real_step = Capture.step
    steps = [0]

    def failing_step(self: Capture, timeout_s: float | None = None) -> None:
        steps[0] += 1
        if steps[0] == 3:
            raise RuntimeError("the ring buffer went away")
        real_step(self, timeout_s)

    monkeypatch.setattr(Capture, "step", failing_step)
    marker = tmp_path / "done"
    result = trace.run(["sh", "-c", f'"{binary}" --iters 5 --start-delay-ms 300; '
                        f'touch "{marker}"; exit 3'], print_summary=False)
    assert result.exit_code == 3
    assert marker.exists()  # the command ran to its end


@pytest.mark.bpf
def test_nvml_failing_once_the_command_runs_costs_it_nothing(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NVML is opened once the command is released (its start takes tens to hundreds of ms on
    a GPU node): a failure there is one line, and the capture goes on, exact."""
    from gpuflight.producer import trace as tracing

    class BrokenSampler:
        devices: tuple[object, ...] = ()

        def close(self) -> None:
            pass

    def broken_feed(*args: object, **kwargs: object) -> None:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    monkeypatch.setattr(tracing, "open_nvml", BrokenSampler)
    monkeypatch.setattr(tracing, "UtilizationFeed", broken_feed)
    binary = build.build_capture(bindir, "stub")
    out = tmp_path / "out.jsonl"
    with caplog.at_level(logging.WARNING):
        result = trace.run([str(binary), "--iters", "10"], output=out, print_summary=False,
                           settings=CaptureSettings(http=True))  # NVML: for requests' cost
    assert result.exit_code == 0
    assert result.summary.launches == 40
    assert len(read_events(out)) == len(expected.capture_events(1, 10))
    assert any("NVML failed (RuntimeError: NVML_ERROR_GPU_IS_LOST)" in r.getMessage()
               for r in caplog.records)


@pytest.mark.bpf
def test_a_slow_nvml_start_holds_up_neither_the_capture_nor_the_command(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML's start (tens to hundreds of ms on a GPU node) runs beside the capture loop: here
    it lasts until the loop has released the command from a hold, which it could never do if
    the loop waited for NVML."""
    from gpuflight.producer import capture as capturing
    from gpuflight.producer import trace as tracing

    released = threading.Event()
    real_release = capturing.Capture._release

    def release(self: capturing.Capture, note: LoaderEvent) -> None:
        real_release(self, note)
        released.set()

    waited: list[bool] = []

    def slow_nvml() -> None:
        waited.append(released.wait(60))  # NVML still starting as the command is released

    monkeypatch.setattr(capturing.Capture, "_release", release)
    monkeypatch.setattr(tracing, "open_nvml", slow_nvml)
    binary = build.build_capture(bindir, "stub")
    out = tmp_path / "out.jsonl"
    result = trace.run([str(binary), "--iters", "10"], output=out, print_summary=False,
                       settings=CaptureSettings(http=True))  # NVML: for requests' cost
    assert waited == [True]
    assert result.exit_code == 0 and result.holds >= 1
    assert len(read_events(out)) == len(expected.capture_events(1, 10))


@pytest.mark.bpf
def test_a_failing_detach_costs_neither_summary_nor_output(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every other probe's detach fails (EBUSY, as tracefs removals did under bcc) and so does
    bcc's own cleanup: logged, and the summary and --output are complete all the same."""
    binary = build.build_capture(bindir, "stub")
    real_detach = UprobeLinks.detach
    calls: list[int] = []
    failed: list[int] = []

    def flaky_detach(self: UprobeLinks, fd: int) -> None:
        calls.append(fd)
        if len(calls) % 2:  # by call, not by fd: fds leaked by earlier tests skew their parity
            failed.append(fd)
            raise OSError(errno.EBUSY, "Device or resource busy")
        real_detach(self, fd)

    def failing_cleanup(self: Probes) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(UprobeLinks, "detach", flaky_detach)
    monkeypatch.setattr(Probes, "_close_program", failing_cleanup)
    out = tmp_path / "out.jsonl"
    with caplog.at_level(logging.WARNING):
        result = trace.run([str(binary), "--iters", "10"], output=out, print_summary=False)
    assert result.exit_code == 0
    assert result.summary.launches == 40
    assert len(read_events(out)) == len(expected.capture_events(1, 10))
    assert failed and len(calls) > len(failed)  # the failures were real, and were survived
    messages = [r.getMessage() for r in caplog.records]
    assert any("could not be detached (Device or resource busy)" in m for m in messages)
    assert any("the BPF program failed to close" in m for m in messages)


@pytest.fixture
def node_output(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    wait_for_probe_releases()
    out = tmp_path / "node.jsonl"
    proc = subprocess.Popen([*GPUFLIGHT, "producer", "--output", str(out)],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "ready" in line:
            break
    yield proc, out
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
    proc.stderr.close()


@pytest.mark.bpf
def test_output_reaches_the_file_without_sigterm(
    node_output: tuple[subprocess.Popen[str], Path], bindir: Path
) -> None:
    """A quiet node: what was captured is in the file within a tick, so SIGKILL loses none."""
    proc, out = node_output
    binary = build.build_capture(bindir, "stub")
    work = subprocess.Popen([str(binary), "--iters", "3", "--start-delay-ms", "1200"])
    assert work.wait(60) == 0
    want = len(expected.capture_events(1, 3))
    deadline = time.monotonic() + 30
    tag = f'"pid":{work.pid},'

    def mine() -> int:
        text = out.read_text() if out.exists() else ""
        return sum(1 for line in text.splitlines() if tag in line and line.endswith("}"))

    while mine() < want and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert mine() == want


# ---- a short-lived first mapper -----------------------------------------------------------


def _mapper(library: Path) -> subprocess.Popen[bytes]:
    """A process that maps `library` and waits on its stdin; returned once it is mapped."""
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import ctypes, os, sys; "
                             f"ctypes.CDLL({str(library)!r}, os.RTLD_LAZY); sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while str(library) not in Path(f"/proc/{proc.pid}/maps").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "the mapper did not map it"
        time.sleep(0.01)
    return proc


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)
    if proc.stdin is not None:
        proc.stdin.close()


@pytest.mark.bpf
def test_a_short_lived_first_mapper_costs_the_file_nothing(bindir: Path, tmp_path: Path) -> None:
    """The agent reaches a file through the process that mapped it (/proc/PID/root), and
    holds it open from its check on: when that process exits between the scan and the
    attach, the file is probed all the same (it was once marked failed for the agent's life,
    "defines none of the CUDA runtime functions", then left to the next process)."""
    import shutil

    from gpuflight.producer.discover import procmaps
    from gpuflight.producer.settings import CaptureSettings

    build.build_capture(bindir, "stub")
    libdir = tmp_path / "lib"
    shutil.copytree(build.runtime_library(bindir, "stub").parent, libdir)
    library = libdir / build.runtime_library(bindir, "stub").name
    classifier = procmaps.Classifier()
    probes = Probes(CaptureSettings())
    try:
        first = _mapper(library)
        found = [f for f in procmaps.scan_pid(Path("/proc"), first.pid, classifier)
                 .libraries.values() if f.kind == "runtime"]
        assert [f.host_path for f in found] == [f"/proc/{first.pid}/root{library}"]
        _end(first)  # gone before the attach
        attached = probes.attach(found[0])
        assert attached is not None and attached.probes > 0
        assert found[0].key not in probes.failed
        second = _mapper(library)
        try:
            again = [f for f in procmaps.scan_pid(Path("/proc"), second.pid, classifier)
                     .libraries.values() if f.kind == "runtime"]
            assert [f.key for f in again] == [found[0].key]
            assert probes.attach(again[0]) is attached  # once per file
        finally:
            _end(second)
    finally:
        probes.close(background=False)
