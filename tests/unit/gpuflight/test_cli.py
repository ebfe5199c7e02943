"""Bad input and missing prerequisites: one clear line, a non-zero exit, no traceback."""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuflight import cli
from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.probe import preflight
from tests.conftest import one_line


def test_not_root_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["trace", "--", "true"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and "needs root" in err[0] and "Traceback" not in err[0]


def test_missing_bcc_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bcc" else real(name, *a))
    with pytest.raises(SetupError, match="python3-bpfcc"):
        preflight.check_can_probe()


def test_missing_headers_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    with pytest.raises(SetupError, match=r"linux-headers-.*scripts/setup"):
        preflight.check_can_probe(modules_root=tmp_path)


def test_a_missing_capability_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Root with CAP_SYS_ADMIN alone: enough for trace, not for the node agent."""
    assert preflight.missing_capabilities(preflight.NODE_CAPABILITIES, 1 << 21) == [
        "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"]
    assert preflight.missing_capabilities(preflight.TRACE_CAPABILITIES, 1 << 21) == []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(preflight, "effective_capabilities", lambda: 1 << 21)
    (tmp_path / os.uname().release / "build" / "include").mkdir(parents=True)
    preflight.check_can_probe(modules_root=tmp_path,
                                capabilities=preflight.TRACE_CAPABILITIES)
    with pytest.raises(SetupError) as error:
        preflight.check_can_probe(modules_root=tmp_path)
    assert one_line(error) == (
        "gpuflight lacks CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, needed for the maps and mount "
        "namespaces (/proc/PID/maps, /proc/PID/root) of processes with capabilities it "
        "lacks: run it as root with CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH "
        "(README: least privilege)")


def test_arm64_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = os.uname()
    arm = os.uname_result((real.sysname, real.nodename, real.release, real.version, "aarch64"))
    monkeypatch.setattr(os, "uname", lambda: arm)
    assert cli.main(["trace", "--", "true"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and "x86-64 only, and this machine is aarch64" in err[0]


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trace", "--", "/no/such/command-here"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "gpuflight: error: command not found: /no/such/command-here"


def test_trace_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trace"]) == 2
    assert "trace needs a command" in capsys.readouterr().err


def test_producer_without_destination(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["producer"]) == 2
    assert "--output" in capsys.readouterr().err


def test_producer_code_paths_go_to_kafka(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    """Sampled without Kafka, the paths would go nowhere: said at once, nothing started."""
    assert cli.main(["producer", "--stack-sampling", "10", "--output",
                     str(tmp_path / "o.jsonl")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--stack-sampling" in line and "--kafka" in line
    assert not (tmp_path / "o.jsonl").exists()


def test_ring_buffer_pages_must_be_a_power_of_two(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["trace", "--ring-buffer-pages", "3", "--", "true"])
    assert exit_info.value.code == 2
    assert "power of two" in capsys.readouterr().err


def test_internal_errors_are_one_line_without_verbose(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(_args: object) -> int:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(cli, "_dispatch", boom)
    assert cli.main(["producer", "--output", "x"]) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kaboom" in err and "-v" in err


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_report_without_influxdb_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuflight import stack

    url = f"http://127.0.0.1:{stack.free_port()}"
    assert cli.main(["report", "--job", "j", "--influx", url]) == 4
    assert f"cannot reach InfluxDB at {url}" in _one_error_line(capsys)
    assert cli.main(["compare", "a", "b", "--influx", url, "--since", "later"]) == 2
    assert "not a time: 'later'" in _one_error_line(capsys)


def test_streams_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["streams", "--window", "0"])
    assert exit_.value.code == 2
    assert "must be 1 to 86400 seconds" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "why"), [
    (["producer", "--output", "o", "--pid", "-1"], "a process id is 1 to 4194304, got -1"),
    (["producer", "--output", "o", "--pid", "0"], "a process id is 1 to 4194304"),
    (["producer", "--output", "o", "--pid", "99999999999"], "a process id is 1 to 4194304"),
    (["replay", "--kafka", "h:1", "--from", "0", "--to", "1", "--output", "o", "--pid", "-1"],
     "a process id is 1 to 4194304"),
    (["streams", "--window", "1e300"], "--window: must be 1 to 86400 seconds"),
    (["streams", "--window", "1e-10"], "--window: must be 1 to 86400 seconds"),
    (["streams", "--window", "nan"], "--window: must be 1 to 86400 seconds"),
    (["streams", "--grace", "1e300"], "--grace: must be 0 to 86400 seconds"),
    (["streams", "--max-future", "1e300"], "--max-future: must be 1 to 86400 seconds"),
    (["streams", "--max-future", "0"], "--max-future: must be 1 to 86400 seconds"),
    (["streams", "--idle", "1e300"], "--idle: must be 0 to 86400 seconds"),
    (["streams", "--idle=-1"], "--idle: must be 0 to 86400 seconds"),
    (["producer", "--kafka", "h:\u0669\u0660\u0669\u0662", "--output", "o"],
     "port must be 1-65535"),
    (["demo", "--steps", "-5"], "must be 1 or more, got -5"),
    (["demo", "--steps", "0"], "must be 1 or more, got 0"),
    (["producer", "--output", "o", "--metrics-port", "0"], "a port is 1 to 65535, got '0'"),
    (["producer", "--output", "o", "--metrics-port", "65536"], "a port is 1 to 65535"),
    (["streams", "--metrics-port", "\u0669\u0660"], "a port is 1 to 65535"),
    (["trace", "--stack-sampling", "0", "--", "true"], "must be auto or 1 to 2^20 calls, got 0"),
    (["trace", "--stack-sampling", "often", "--", "true"],
     "expected auto or a whole number of calls, got 'often'"),
    (["producer", "--output", "o", "--stack-sampling", "auto", "--stack-cost", "0"],
     "must be 1 or more, got 0"),
    (["streams", "--metrics-port", "9400", "--metrics-address", "localhost"],
     "expected an IP address, got 'localhost'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_numbers_out_of_range_are_refused_before_the_command_runs(
        argv: list[str], why: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """They used to reach the command: a pid of -1 or 10^11 ended the agent with 70, a window
    of 1e300 s crashed the stream agent (OverflowError) while the worker stayed up, a window of
    1e-10 s (0 ns) dead-lettered every event, an Arabic-Indic port passed for 9092."""
    monkeypatch.setattr(cli, "_dispatch", lambda args: pytest.fail(f"{args.command} ran"))
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err, err


def test_the_stream_durations_documented_bounds_are_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[argparse.Namespace] = []

    def dispatch(args: argparse.Namespace) -> int:
        taken.append(args)
        return 0

    monkeypatch.setattr(cli, "_dispatch", dispatch)
    assert cli.main(["streams", "--window", "1", "--grace", "0", "--idle", "0",
                     "--max-future", "1"]) == 0
    assert cli.main(["streams", "--window", "86400", "--grace", "86400", "--idle", "86400",
                     "--max-future", "86400"]) == 0
    assert [(a.window, a.grace, a.idle, a.max_future) for a in taken] == [
        (1.0, 0.0, 0.0, 1.0), (86400.0, 86400.0, 86400.0, 86400.0)]
    with pytest.raises(SystemExit):
        cli.main(["streams", "--window", "86400.5"])


def test_a_replayed_timeline_is_one_hosts(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    timeline = tmp_path / "t.pftrace"
    assert cli.main(["replay", "--kafka", "h:1", "--from", "0", "--to", "1",
                     "--timeline", str(timeline)]) == 2
    assert "replay --timeline needs --host" in _one_error_line(capsys)
    assert not timeline.exists()


@pytest.mark.parametrize(("argv", "rate"), [
    ([], (1, 40)),  # trace's default: as often as 40 ns a recorded call allows
    (["--stack-sampling", "auto", "--stack-cost", "25"], (1, 25)),
    (["--stack-sampling", "100"], (100, 0)),  # a fixed period: no budget
    (["--stack-sampling", "1", "--stack-cost", "25"], (1, 0)),  # every call, exact
])
def test_the_stack_rate_is_auto_with_a_cost_budget_or_a_fixed_period(
        argv: list[str], rate: tuple[int, int], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    from gpuflight.producer import trace

    taken: list[trace.StackOptions | None] = []

    def run(argv: list[str], **kw: object) -> SimpleNamespace:
        stacks = kw["stacks"]
        assert stacks is None or isinstance(stacks, trace.StackOptions)
        taken.append(stacks)
        return SimpleNamespace(exit_code=0)

    monkeypatch.setattr(trace, "run", run)
    assert cli.main(["trace", "--stacks", str(tmp_path / "f"), *argv, "--", "true"]) == 0
    (stacks,) = taken
    assert stacks is not None and (stacks.period, stacks.budget_ns) == rate
