"""The producer's status file: what tests and scripts wait on instead of log lines."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gpuflight.producer import status
from tests.support.shared_place import as_nobody, shared_directory


@dataclass(frozen=True)
class _Library:
    path: str
    kind: str


@dataclass(frozen=True)
class _Attached:
    library: _Library
    probes: int
    unprobed: dict[str, str] = field(default_factory=dict)
    stepped: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Skipped:
    library: _Library
    reason: str


def _update(file: status.StatusFile, state: str, attached: dict[object, _Attached],
            force: bool = False) -> None:
    skipped = {(2049, 7): _Skipped(_Library("/opt/libcudart.so.11", "runtime"),
                                   "defines none of them")}
    file.update(state, attached=attached, skipped=skipped,
                captured=12, dropped_kernel=1, outputs=[("--output x", None, 0)], force=force,
                aggregated=30)


def test_the_status_is_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    assert status.read(path) is None  # none yet
    file = status.StatusFile(path, interval_s=3600)
    attached: dict[object, _Attached] = {
        (1, 2): _Attached(_Library("/lib/libcudart.so.12", "runtime"), 84),
        (1, 3): _Attached(_Library("/lib/libcuda.so.1", "driver"), 101,
                          {"cuMemFree_v2": "the kernel cannot probe the instruction there"},
                          frozenset({"cuMemcpy", "cuLaunchKernel"}))}
    _update(file, status.STATE_READY, attached, force=True)
    got = status.read(path)
    assert got is not None and got["state"] == "ready" and got["captured"] == 12
    assert got["aggregated"] == 30  # counted in the kernel under overload: not lost
    assert got["libraries"] == [
        {"path": "/lib/libcuda.so.1", "kind": "driver", "probes": 101,
         "unprobed": {"cuMemFree_v2": "the kernel cannot probe the instruction there"},
         "stepped": 2},
        {"path": "/lib/libcudart.so.12", "kind": "runtime", "probes": 84, "unprobed": {},
         "stepped": 0}]
    assert got["skipped"] == [{"file": "8:1:7", "path": "/opt/libcudart.so.11", "kind": "runtime",
                               "reason": "defines none of them"}]
    assert got["outputs"] == [{"name": "--output x", "failure": None, "lost": 0}]
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temporary left


def test_a_new_library_is_written_at_once_and_the_rest_when_due(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    file = status.StatusFile(path, interval_s=3600)
    attached: dict[object, _Attached] = {}
    _update(file, status.STATE_READY, attached, force=True)
    assert not file.due(attached)  # nothing changed, the interval has not passed
    attached[(1, 3)] = _Attached(_Library("/opt/libcuda.so.1", "driver"), 102)
    assert file.due(attached)
    _update(file, status.STATE_READY, attached)
    got = status.read(path)
    assert got is not None and [lib["path"] for lib in got["libraries"]] == ["/opt/libcuda.so.1"]


def test_a_half_written_or_foreign_file_is_no_status(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_text('{"v": 1, "state": "rea')
    assert status.read(path) is None
    path.write_text('{"v": 99, "state": "ready"}')
    assert status.read(path) is None


def test_an_unwritable_status_file_is_never_fatal(tmp_path: Path) -> None:
    file = status.StatusFile(tmp_path / "no" / "dir" / "status.json")
    _update(file, status.STATE_READY, {}, force=True)  # logged, not raised


def test_a_link_planted_at_the_status_file_s_temporary_name_is_never_written_through(
        tmp_path: Path) -> None:
    """The status used to be written to .NAME.PID.tmp beside it, a name anyone could guess
    and plant a symlink at (to a file of root's) in a directory others write to."""
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    victim.chmod(0o600)
    with shared_directory() as shared:
        path = shared / "status.json"
        planted = shared / f".{path.name}.{os.getpid()}.tmp"
        as_nobody("ln", "-s", victim, planted)
        file = status.StatusFile(path)
        _update(file, status.STATE_READY, {}, force=True)
        written = status.read(path)
        assert written is not None and written["state"] == status.STATE_READY
        assert victim.read_text() == "root's own\n"
        assert sorted(p.name for p in shared.iterdir()) == [planted.name, path.name]
        assert planted.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o644
