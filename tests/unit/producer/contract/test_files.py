"""Files in shared places (producer/contract/files.py): what another user plants where gpuflight
writes
or reads — a symlink, a FIFO, a hard link — is refused in one line (exit 2) before any command
runs, never written through and never waited on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuflight import cli
from gpuflight.producer.contract.errors import SetupError, UsageError
from gpuflight.producer.decode.sinks import JsonLinesSink
from tests.conftest import one_line
from tests.support.capture import GPUFLIGHT
from tests.support.shared_place import as_nobody, shared_directory

#: A refused command ends at once; on code that waits on a FIFO, this is how long it may try.
TIMEOUT_S = 60


def root_only(path: Path) -> Path:
    path.write_text("root's own\n")
    path.chmod(0o600)
    return path


def test_output_through_a_symlink_another_user_planted_is_refused_and_its_target_untouched(
        tmp_path: Path) -> None:
    victim = root_only(tmp_path / "victim")
    with shared_directory() as shared:
        planted = shared / "events.jsonl"
        as_nobody("ln", "-s", victim, planted)
        with pytest.raises(UsageError) as error:
            JsonLinesSink(planted)
        assert one_line(error) == (f"--output {planted}: it is a symlink, not a regular file: "
                                   "refused")
    assert victim.read_text() == "root's own\n"


def test_output_that_is_a_hard_link_to_another_file_is_refused(tmp_path: Path) -> None:
    """Where fs.protected_hardlinks is 0, any user can link to a file they cannot write."""
    victim = root_only(tmp_path / "victim")
    linked = tmp_path / "events.jsonl"
    linked.hardlink_to(victim)
    with pytest.raises(UsageError) as error:
        JsonLinesSink(linked)
    assert "it has 2 names (hard links)" in one_line(error)
    assert victim.read_text() == "root's own\n"


@pytest.mark.parametrize("argv", [
    ["trace", "--output", "{fifo}", "--", "touch", "{ran}"],
    ["trace", "--prices", "{fifo}", "--", "touch", "{ran}"],
    ["producer", "--output", "{fifo}"],
    ["replay", "--kafka", "127.0.0.1:1", "--from", "0", "--to", "1", "--output", "{fifo}"],
    ["replay", "--kafka", "127.0.0.1:1", "--kafka-config", "{fifo}", "--from", "0", "--to", "1",
     "--output", "{out}"],
], ids=["trace-output", "trace-prices", "producer-output", "replay-output",
        "replay-kafka-config"])
def test_a_fifo_where_a_file_goes_is_refused_in_one_line_and_never_waited_on(
        argv: list[str], tmp_path: Path) -> None:
    fifo, ran = tmp_path / "fifo", tmp_path / "ran"
    os.mkfifo(fifo)
    names = {"fifo": fifo, "ran": ran, "out": tmp_path / "out.jsonl"}
    proc = subprocess.run([*GPUFLIGHT, *(a.format(**names) for a in argv)],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{fifo}: it is a FIFO, not a regular file: refused" in lines[0]
    assert not ran.exists()  # the command never ran


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "device"])
def test_a_status_file_that_is_no_regular_file_is_refused_before_the_agent_starts(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpuflight.producer import node

    def started() -> None:
        raise SetupError("the agent started")

    monkeypatch.setattr(node, "check_can_probe", started)
    path = Path("/dev/null") if kind == "device" else tmp_path / "status.json"
    if kind == "symlink":
        path.symlink_to(root_only(tmp_path / "victim"))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    assert cli.main(["producer", "--output", str(tmp_path / "out.jsonl"),
                     "--status-file", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a regular file: refused" in err[0], err
