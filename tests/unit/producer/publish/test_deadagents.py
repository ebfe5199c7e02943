"""The tally (producer/deadagents.py): what a killed agent never published, counted by the next.

Pure parts here, on fake /proc and bpffs trees; the real thing (the kernel's pinned maps, a
SIGKILLed agent, the next one's metrics on a real Kafka broker) is in tests/system/test_kafka.py.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

import pytest

from gpuflight.producer.publish import deadagents
from tests.support.shared_place import as_nobody, shared_directory


def stat_line(pid: int, start: int) -> str:
    # Fields after "(comm)": state is the first, starttime the 20th.
    after = ["S", *["0"] * 18, str(start), "0"]
    return f"{pid} (gpuflight) {' '.join(after)}\n"


def fake_proc(root: Path, processes: dict[int, int]) -> Path:
    for pid, start in processes.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(stat_line(pid, start))
    return root


class FakeMaps:
    """This agent's maps: committed (what the kernel would count) and what was settled."""

    def __init__(self, committed: dict[int, int]) -> None:
        self.committed = dict(committed)
        self.settled: dict[int, tuple[int, int]] = {}
        self.frozen = False

    def tally_committed(self) -> dict[int, int]:
        return dict(self.committed)

    def settle(self, pid: int, delivered: int, dropped: int) -> None:
        self.settled[pid] = (delivered, dropped)

    def freeze_tally(self) -> None:
        self.frozen = True

    def forget_tally(self, pids: Iterable[int]) -> None:
        for pid in pids:
            self.committed.pop(pid, None)
            self.settled.pop(pid, None)


def test_unpublished_is_committed_less_delivered_and_counted_drops() -> None:
    committed = {1: 100, 2: 50, 3: 7, 4: 5}
    settled = {1: (60, 10), 2: (50, 0), 4: (9, 0)}  # 4: more than committed (a reused pid)
    assert deadagents.unpublished(committed, settled) == {1: 30, 3: 7}


def test_dead_agents_are_those_whose_process_is_gone_or_another(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {100: 5000, 200: 7000})
    base = tmp_path / "bpffs" / deadagents.SUBDIR
    for name in ("agent-100-5000", "agent-200-6999", "agent-300-1", "not-an-agent"):
        (base / name).mkdir(parents=True)
    mine = base / "agent-100-5000"
    dead = deadagents.dead_agents(tmp_path / "bpffs", proc)
    # 100 runs with that start: alive. 200 is another process now, 300 is gone.
    assert [(d.directory.name, d.pid) for d in dead] == [("agent-200-6999", 200),
                                                         ("agent-300-1", 300)]
    assert [d.directory for d in deadagents.dead_agents(tmp_path / "bpffs", proc, mine=mine)] == [
        base / "agent-200-6999", base / "agent-300-1"]
    assert deadagents.dead_agents(tmp_path / "nothing", proc) == []


def test_prepare_makes_a_directory_per_agent(tmp_path: Path) -> None:
    import os

    proc = fake_proc(tmp_path / "proc", {os.getpid(): 4242})
    (proc / "self").symlink_to(str(os.getpid()))
    directory = deadagents.prepare(tmp_path / "bpffs", proc)
    assert directory == tmp_path / "bpffs" / deadagents.SUBDIR / f"agent-{os.getpid()}-4242"
    assert directory.is_dir()


def agent_proc(root: Path, mount: tuple[Path, int] | None = None) -> Path:
    """A /proc of this process (start 4242), with `mount` (a bpffs there, on that device) in
    its mountinfo."""
    proc = fake_proc(root, {os.getpid(): 4242})
    (proc / "self").symlink_to(str(os.getpid()))
    if mount is not None:
        where, device = mount
        (proc / str(os.getpid()) / "mountinfo").write_text(
            f"46 23 {os.major(device)}:{os.minor(device)} / {where} rw,relatime - bpf bpf "
            "rw,mode=700\n")
    return proc


def test_the_tally_directory_is_root_s_alone(tmp_path: Path) -> None:
    directory = deadagents.prepare(tmp_path / "bpffs", agent_proc(tmp_path / "proc"))
    for made in (directory.parent, directory):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made


@pytest.mark.parametrize(("symlink", "why"), [
    (True, "is a symlink"),
    (False, "belongs to uid 65534, not to root"),
], ids=["symlink", "directory"])
def test_a_tally_directory_another_user_planted_turns_the_tally_off(
        symlink: bool, why: str, tmp_path: Path) -> None:
    """bpffs is mounted 1777 where the host mounted it so: anyone may make
    /sys/fs/bpf/gpuflight before the first agent starts. A symlink there made every agent exit
    3 (its maps could not be pinned where it led); a directory of theirs let them read, rename
    and remove the tallies."""
    proc = agent_proc(tmp_path / "proc")
    with shared_directory(0o1777) as bpffs:
        if symlink:
            as_nobody("mkdir", bpffs / "theirs")
            as_nobody("ln", "-s", bpffs / "theirs", bpffs / deadagents.SUBDIR)
        else:
            as_nobody("mkdir", bpffs / deadagents.SUBDIR)
        with pytest.raises(deadagents.TallyUnavailable, match=why):
            deadagents.prepare(bpffs, proc)
        assert not list(bpffs.rglob("agent-*"))  # nothing of the agent's in their hands


def test_a_tally_directory_off_the_bpffs_turns_the_tally_off(tmp_path: Path) -> None:
    root = tmp_path / "bpffs"
    root.mkdir()
    elsewhere = os.makedev(os.major(root.stat().st_dev) + 1, 0)
    with pytest.raises(deadagents.TallyUnavailable, match="is not on the bpffs mounted at"):
        deadagents.prepare(root, agent_proc(tmp_path / "proc", (root, elsewhere)))
    ours = deadagents.prepare(root, agent_proc(tmp_path / "proc2", (root, root.stat().st_dev)))
    assert ours.is_dir()


@pytest.mark.parametrize("failure", [deadagents.TallyUnavailable("/sys/fs/bpf/gpuflight is a "
                                                            "symlink"),
                                     PermissionError(1, "Operation not permitted")])
def test_a_tally_that_cannot_be_had_is_one_warning_and_the_agent_goes_on(
        failure: Exception, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from gpuflight.producer import node

    def prepare() -> Path:
        raise failure

    monkeypatch.setattr(deadagents, "prepare", prepare)
    with caplog.at_level(logging.WARNING):
        assert node._tally_dir() is None
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "will not be counted" in caplog.records[0].getMessage()


def test_ledger_settles_each_delivery_and_each_acknowledged_drop_count(tmp_path: Path) -> None:
    maps = FakeMaps({10: 30, 11: 5})
    ledger = deadagents.Ledger(maps, tmp_path / "me", root=tmp_path, proc_root=tmp_path)
    ledger.delivered(10, 20)
    ledger.delivered(10, 5)
    assert maps.settled[10] == (25, 0)
    ledger.published({10: 3, 11: 0}, dead_included=False)
    assert maps.settled[10] == (25, 3)
    assert ledger.unsettled() == {10: 2, 11: 5}


def test_ledger_sweeps_finished_processes_and_a_reused_pid_starts_afresh(tmp_path: Path) -> None:
    maps = FakeMaps({10: 30, 11: 5, 12: 4})
    ledger = deadagents.Ledger(maps, tmp_path / "me", root=tmp_path, proc_root=tmp_path)
    ledger.delivered(10, 28)
    ledger.published({10: 2}, dead_included=False)  # 10: all 30 settled
    ledger.delivered(11, 5)  # 11: settled, but alive
    ledger.delivered(12, 3)  # 12: one event not yet delivered
    assert ledger.sweep(alive=lambda pid: pid == 11) == 1
    assert set(maps.committed) == {11, 12}
    # pid 10 again, a new process: the sink's drop counter for the pid is cumulative (2 so
    # far); only what is dropped from now on is this process's.
    maps.committed[10] = 4
    ledger.delivered(10, 3)
    ledger.published({10: 3}, dead_included=False)
    assert maps.settled[10] == (3, 1)
    assert ledger.unsettled() == {12: 1}


def test_ledger_close_removes_its_directory_only_when_everything_was_settled(
        tmp_path: Path) -> None:
    for delivered, kept in ((7, False), (6, True)):
        directory = tmp_path / f"agent-{delivered}"
        directory.mkdir()
        maps = FakeMaps({10: 7})
        ledger = deadagents.Ledger(maps, directory, root=tmp_path, proc_root=tmp_path)
        ledger.delivered(10, delivered)
        ledger.close()
        assert directory.exists() is kept


def test_ledger_reports_dead_agents_and_forgets_them_once_published(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {})
    base = tmp_path / "bpffs" / deadagents.SUBDIR
    for name in ("agent-300-1", "agent-301-1", "agent-302-1"):
        (base / name).mkdir(parents=True)
    tallies = {
        "agent-300-1": ({7: 100, 8: 10}, {7: (60, 5), 8: (10, 0)}),
        "agent-301-1": ({7: 3}, {}),
    }

    def read(directory: Path) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
        if directory.name not in tallies:
            raise FileNotFoundError(2, "No such file or directory")
        return tallies[directory.name]

    ledger = deadagents.Ledger(FakeMaps({}), base / "me", root=tmp_path / "bpffs", proc_root=proc)
    ledger.collect_dead(read)
    assert dict(ledger.dead_by_pid) == {7: 35 + 3}
    assert ledger.dead_total == 38
    ledger.published({}, dead_included=False)
    assert (base / "agent-300-1").exists()
    ledger.published({}, dead_included=True)
    # Read and published: gone. Unreadable: left as it is (logged).
    assert sorted(p.name for p in base.iterdir()) == ["agent-302-1"]
