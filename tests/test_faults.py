"""What a user trips on, and what goes wrong around capture: one line and the right exit code,
no traceback, and a failing output or a failing detach never costs the others their data."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuflight import cli, stack
from gpuflight.producer import trace
from gpuflight.producer.capture import Capture
from gpuflight.producer.contract.abi import EVENT_DTYPE
from gpuflight.producer.decode.sinks import Guarded, JsonLinesSink
from gpuflight.producer.probe.probes import LoaderEvent, Probes
from gpuflight.producer.probe.uprobes import UprobeLinks
from gpuflight.producer.settings import CaptureSettings
from tests.conftest import bpf_unavailable_reason, require
from tests.support.capture import GPUFLIGHT, read_events, wait_for_probe_releases
from tests.workloads import build, expected


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ---- command lines ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kafka", "reason"),
    [("host:99999", "port must be 1-65535"), ("host:abc", "port must be 1-65535"),
     ("", "expected HOST:PORT"), ("nohost", "expected HOST:PORT"),
     ("a:1,b:0", "port must be 1-65535")],
)
def test_a_bad_kafka_address_is_a_usage_error(
    kafka: str, reason: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["producer", "--kafka", kafka, "--output", str(tmp_path / "x")])
    assert exit_.value.code == 2
    assert reason in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--buffer-mb", "0"], ["--buffer-mb", "x"],
                                    ["--kafka-close-timeout", "-1"],
                                    ["--kafka-close-timeout", "nan"]])
def test_bad_numbers_are_usage_errors(option: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["producer", "--kafka", "h:1", "--output", str(tmp_path / "x"), *option])
    assert exit_.value.code == 2


def test_streams_window_must_be_finite() -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["streams", "--window", "inf"])
    assert exit_.value.code == 2


def test_an_unknown_librdkafka_setting_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kafka.properties"
    config.write_text("no.such.setting=1\n")
    code = cli.main(["replay", "--kafka", f"127.0.0.1:{stack.free_port()}", "--kafka-config",
                     str(config), "--from", "0", "--to", "1", "--output", str(tmp_path / "o")])
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert 'No such configuration property: "no.such.setting"' in line


@pytest.mark.parametrize("when", ["1e400", "-5", "nan", "99999999999999999999ns"])
def test_times_out_of_range_are_usage_errors(
    when: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["replay", "--kafka", "127.0.0.1:1", "--from", when, "--to", "1",
                     "--output", str(tmp_path / "o")])
    assert code == 2
    assert "not a time" in one_error_line(capsys.readouterr().err)


def test_replay_without_kafka_is_a_service_error_in_few_lines(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*GPUFLIGHT, "replay", "--kafka", f"127.0.0.1:{stack.free_port()}", "--from", "0",
         "--to", "1", "--output", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) <= 5, proc.stderr
    assert "cannot reach Kafka" in proc.stderr.splitlines()[-1]


def test_an_unwritable_output_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"cannot write --output .*: No such file or directory"):
        JsonLinesSink(tmp_path / "no" / "such" / "dir.jsonl")


@pytest.mark.parametrize("command", ["trace", "producer"])
def test_an_unwritable_output_is_a_usage_error_on_the_command_line(command: str,
                                                                    tmp_path: Path) -> None:
    argv = ([*GPUFLIGHT, "trace", "--output", str(tmp_path / "no" / "x"), "--", "true"]
            if command == "trace" else
            [*GPUFLIGHT, "producer", "--output", str(tmp_path / "no" / "x")])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "cannot write --output" in one_error_line(proc.stderr)


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`gpuflight … | head`: the reader went away; no traceback, the SIGPIPE exit code."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*GPUFLIGHT, "stack", "status", "--dir", str(tmp_path)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                              check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 128 + signal.SIGPIPE
    assert proc.stderr == ""


# ---- a failing output ---------------------------------------------------------------------


class _Failing:
    name = "a failing sink"

    def __init__(self) -> None:
        self.calls = 0

    def write(self, events: Any) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_failed_sink_is_off_and_counts_what_it_lost() -> None:
    failing = _Failing()
    guarded = Guarded(failing, failing.name)
    batch = np.zeros(5, dtype=EVENT_DTYPE)
    guarded.write(batch)
    guarded.write(batch)
    guarded.tick()
    guarded.close()
    assert failing.calls == 1  # off after the first failure
    assert guarded.failure == "No space left on device"
    assert guarded.lost == 10


def test_events_held_for_a_full_disk_are_counted_lost_not_dropped_unsaid() -> None:
    """--output buffers between flushes: when the flush finds the disk full, every event it
    held is counted lost (the CI run of the last stop found 8 of 406 missing from the count:
    Python's buffer had taken them without a word)."""
    sink = JsonLinesSink("/dev/full", flush_interval_s=3600.0)
    guarded = Guarded(sink, sink.name)
    batch = np.zeros(3, dtype=EVENT_DTYPE)
    batch["type"] = 1  # launches
    for _ in range(4):
        guarded.write(batch)  # held: no write yet
    assert guarded.failure is None and guarded.lost == 0
    guarded.close()  # the flush meets ENOSPC
    assert guarded.failure == "No space left on device"
    assert guarded.lost == 12
    guarded.write(batch)  # off from here on, and counted
    assert guarded.lost == 15


@pytest.fixture
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(bpf_unavailable_reason())
    return tmp_path_factory.mktemp("workloads")


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
    require(bpf_unavailable_reason())
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


def test_a_file_that_could_not_be_read_is_not_remembered(tmp_path: Path) -> None:
    """The checked descriptor could not be read again (out of descriptors, say): the file
    reads as defining nothing, which is not kept as its verdict ("no CUDA" for good)."""
    from gpuflight.producer.discover import procmaps

    path = tmp_path / "libcudart.so.12"
    path.write_bytes(b"\x7fELF")
    opened = procmaps._open_regular(str(path))
    assert opened is not None
    key = (opened.stat.st_dev, opened.stat.st_ino)
    located = procmaps._Located(mapping=("1000-2000", str(path)), opened=opened)
    classifier = procmaps.Classifier()
    try:
        verdict = classifier._verdict(key, located, str(tmp_path / "unreadable"),
                                      loader_candidate=False)
        assert not verdict.runtime
        assert len(classifier) == 0
        with opened.reading() as through:
            classifier._verdict(key, located, through, loader_candidate=False)
        assert len(classifier) == 1  # a file that is there and defines nothing is remembered
    finally:
        opened.close()
