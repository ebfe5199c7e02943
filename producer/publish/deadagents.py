"""The tally: what a node agent killed outright (SIGKILL, the OOM killer) never published.

A killed agent cannot say what it lost: the events still in its ring buffer, in its pending
batches and in librdkafka's queue. The kernel can. With Kafka, the node agent's BPF program
counts the events it commits for each pid in a hash map (`committed`), and the agent writes
beside it what became of them (`settled`, struct gf_settled in bpf/events.h): how many Kafka
acknowledged, and how many it dropped and said so in a metrics record Kafka acknowledged. Both
maps are pinned in bpffs, in a directory of the agent's own (`agent-PID-START`), so they
outlive it. The next agent reads the directories of agents no longer running and publishes,
per pid, committed - delivered - dropped as `dropped_agent_died` (metrics.v1); the stream
worker counts them lost for the pid's job. An agent that stops cleanly with everything
delivered removes its directory; one that could not deliver everything leaves it, so the
next agent counts what it could not.

Exact but for one window: a message Kafka stored but whose acknowledgement the agent had not
yet read when it was killed is counted lost and is also in the topic (at most the messages in
flight at that moment).

Pure but for the file system (an injectable /proc root and bpffs root); the live maps are
written by probe/probes.py; a dead agent's pinned ones are read here (read_pinned_tally).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np

from gpuflight.producer.contract.abi import SETTLED_DTYPE
from gpuflight.producer.probe import bpfload
from gpuflight.producer.publish.identity import start_time

log = logging.getLogger(__name__)

#: Where bpffs is mounted on a Linux host (a DaemonSet mounts the host's there).
BPFFS: Final = Path("/sys/fs/bpf")
#: The tally's directory in bpffs; each agent pins its maps in a directory of its own under it.
SUBDIR: Final = "gpuflight"
#: The pinned maps' names in an agent's directory.
MAPS: Final = ("committed", "settled")
_NAME: Final = re.compile(r"agent-(\d+)-(\d+)")
_BPF_FS_TYPE: Final = "bpf"
_U32: Final = struct.Struct("<I")


class TallyUnavailable(Exception):  # noqa: N818 (what callers check)
    """No bpffs to pin the tally in: one line saying why."""


@dataclass(frozen=True)
class DeadAgent:
    """An earlier agent's directory: it is no longer running."""

    directory: Path
    pid: int


def _bpffs_device(root: Path, proc_root: Path) -> int | None:
    """The device (st_dev) of the bpffs mounted at `root`, or None when none is (of several
    mounts there, the last: the one seen)."""
    try:
        mounts = (proc_root / "self" / "mountinfo").read_text()
    except OSError:
        return None
    device = None
    for line in mounts.splitlines():
        before, _, after = line.partition(" - ")
        fields = before.split()
        if len(fields) >= 5 and Path(fields[4]) == root and after.split()[:1] == [_BPF_FS_TYPE]:
            major, _, minor = fields[2].partition(":")
            device = os.makedev(int(major), int(minor))
    return device


def _mount_bpffs(root: Path) -> None:
    import ctypes.util  # ~2 ms of every start otherwise, for the one agent that mounts bpffs

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    # Its root 0700 (bpffs' own default is 1777: anyone may make a directory in it).
    if libc.mount(b"bpf", str(root).encode(), b"bpf", 0, b"mode=0700") != 0:
        errno = ctypes.get_errno()
        raise TallyUnavailable(f"cannot mount bpffs at {root}: {os.strerror(errno)}")


def _private_directory(path: Path, device: int | None) -> None:
    """TallyUnavailable unless `path` is a directory (not a symlink) of root's or this
    process's user that no group or other user may write in (and, with `device`, on that
    file system): one another user made in a bpffs mounted 1777 would let them read, rename
    and remove what is pinned there."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise TallyUnavailable(f"cannot use {path}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise TallyUnavailable(f"{path} is {what}")
    if st.st_uid not in (0, os.geteuid()):
        raise TallyUnavailable(f"{path} belongs to uid {st.st_uid}, not to root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TallyUnavailable(f"{path} may be written by others (mode "
                               f"{stat.S_IMODE(st.st_mode):04o})")
    if device is not None and st.st_dev != device:
        raise TallyUnavailable(f"{path} is not on the bpffs mounted at {path.parent}")


def prepare(root: Path = BPFFS, proc_root: Path = Path("/proc"), *, mount: bool = True) -> Path:
    """This agent's directory for its pinned maps (made; bpffs mounted at `root` first, with
    mode 0700, when it is not and `mount`). TallyUnavailable when there is no bpffs to pin in,
    or when the tally's directory is not root's own (`_private_directory`)."""
    device = _bpffs_device(root, proc_root)
    if root == BPFFS and device is None:
        if not mount:
            raise TallyUnavailable(f"no bpffs mounted at {root}")
        _mount_bpffs(root)
        device = _bpffs_device(root, proc_root)
    me = os.getpid()
    base = root / SUBDIR
    directory = base / f"agent-{me}-{start_time(proc_root, me)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # checked below, whoever made it
            base.mkdir(mode=0o700)
        _private_directory(base, device)
        directory.mkdir(mode=0o700, exist_ok=True)
        _private_directory(directory, device)
        for name in MAPS:  # a pid reused by an earlier agent of this boot cannot be: start differs
            (directory / name).unlink(missing_ok=True)
    except OSError as exc:
        raise TallyUnavailable(f"cannot make {directory}: {exc.strerror or exc}") from exc
    return directory


def dead_agents(root: Path = BPFFS, proc_root: Path = Path("/proc"),
                mine: Path | None = None) -> list[DeadAgent]:
    """Directories of agents that are no longer running (a pid gone, or another process's)."""
    base = root / SUBDIR
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    dead = []
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match is None or entry == mine:
            continue
        pid, started = int(match[1]), int(match[2])
        try:
            alive = start_time(proc_root, pid) == started
        except (OSError, ValueError):
            alive = False
        if not alive:
            dead.append(DeadAgent(entry, pid))
    return dead


def unpublished(committed: Mapping[int, int],
                settled: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """Per pid, the events committed that were neither delivered nor counted dropped (> 0)."""
    out = {}
    for pid, count in committed.items():
        delivered, dropped = settled.get(pid, (0, 0))
        left = count - delivered - dropped
        if left > 0:
            out[pid] = left
    return out


def remove(directory: Path) -> None:
    """Unpin a directory's maps and remove it; logs (never raises) what it could not."""
    try:
        for name in MAPS:
            (directory / name).unlink(missing_ok=True)
        directory.rmdir()
    except OSError as exc:
        log.warning("could not remove the tally %s: %s", directory, exc.strerror or exc)


class TallyMaps(Protocol):
    """This agent's maps (producer/probe/probes.py Probes)."""

    def tally_committed(self) -> dict[int, int]: ...

    def settle(self, pid: int, delivered: int, dropped: int) -> None: ...

    def forget_tally(self, pids: Iterable[int]) -> None: ...

    def freeze_tally(self) -> None: ...


class Ledger:
    """This agent's side of the tally, and its report of dead agents' tallies.

    Kafka's delivery reports call `delivered`; an acknowledged metrics record calls
    `published` (the drops it said, and the dead agents' counts it carried). `sweep` drops
    finished processes from the maps; `close` removes this agent's directory when everything
    was settled, and leaves it for the next agent otherwise."""

    def __init__(self, maps: TallyMaps, directory: Path, root: Path = BPFFS,
                 proc_root: Path = Path("/proc")) -> None:
        self._maps = maps
        self.directory = directory
        self._proc_root = proc_root
        self._delivered: Counter[int] = Counter()
        self._dropped: dict[int, int] = {}
        #: A forgotten pid's drops already counted (a later process of that pid starts at 0).
        self._dropped_base: dict[int, int] = {}
        #: What dead agents never published, by pid; their directories until it is published.
        self.dead_by_pid: Counter[int] = Counter()
        self._dead_dirs: list[Path] = []
        self._root = root

    @property
    def dead_total(self) -> int:
        return sum(self.dead_by_pid.values())

    def collect_dead(self, read: Callable[[Path], tuple[dict[int, int],
                                                        dict[int, tuple[int, int]]]]) -> None:
        """Read every dead agent's tally (`read`: probes.read_pinned_tally) and count, per pid,
        what it never published nor counted."""
        for dead in dead_agents(self._root, self._proc_root, mine=self.directory):
            try:
                committed, settled = read(dead.directory)
            except OSError as exc:
                log.warning("cannot read the tally an earlier agent (pid %d) left in %s: %s",
                            dead.pid, dead.directory, exc.strerror or exc)
                continue
            lost = unpublished(committed, settled)
            self.dead_by_pid.update(lost)
            self._dead_dirs.append(dead.directory)
            if lost:
                log.warning("an earlier agent (pid %d) ended before publishing %d event(s) of "
                            "%d process(es); they are counted lost (dropped_agent_died)",
                            dead.pid, sum(lost.values()), len(lost))
            else:
                log.info("an earlier agent (pid %d) left nothing unpublished", dead.pid)

    def delivered(self, pid: int, events: int) -> None:
        self._delivered[pid] += events
        self._settle(pid)

    def published(self, dropped_by_pid: Mapping[int, int], dead_included: bool) -> None:
        """A metrics record was acknowledged: its drops are counted, and, when it carried the
        dead agents' counts, their directories are done with."""
        for pid, total in dropped_by_pid.items():
            mine = total - self._dropped_base.get(pid, 0)
            if mine != self._dropped.get(pid, 0):
                self._dropped[pid] = mine
                self._settle(pid)
        if dead_included:
            dirs, self._dead_dirs = self._dead_dirs, []
            for directory in dirs:
                remove(directory)

    def _settle(self, pid: int) -> None:
        self._maps.settle(pid, self._delivered[pid], self._dropped.get(pid, 0))

    def _settled(self, pid: int) -> int:
        return self._delivered.get(pid, 0) + self._dropped.get(pid, 0)

    def sweep(self, alive: Callable[[int], bool]) -> int:
        """Forget processes that are gone with every event settled; how many."""
        done = [pid for pid, count in self._maps.tally_committed().items()
                if self._settled(pid) >= count and not alive(pid)]
        if done:
            self._maps.forget_tally(done)
            for pid in done:
                self._delivered.pop(pid, None)
                dropped = self._dropped.pop(pid, None)
                if dropped:
                    self._dropped_base[pid] = self._dropped_base.get(pid, 0) + dropped
        return len(done)

    def unsettled(self) -> dict[int, int]:
        """Per pid, events committed that are neither delivered nor counted dropped."""
        return unpublished(self._maps.tally_committed(),
                           {pid: (self._delivered.get(pid, 0), self._dropped.get(pid, 0))
                            for pid in {*self._delivered, *self._dropped}})

    def freeze(self) -> None:
        """At a clean stop, before the last drain: the kernel stops counting, so that what it
        counted is what the agent reads (its probes are released later, in the background).
        Never raises."""
        try:
            self._maps.freeze_tally()
        except Exception as exc:
            log.warning("tally: cannot stop counting (%s)", exc)

    def close(self) -> None:
        """At a clean stop, after `freeze` and the last flush: remove this agent's directory
        when everything was settled, else leave it for the next agent to count. Never
        raises."""
        try:
            left = self.unsettled()
        except Exception as exc:
            log.warning("tally: cannot read what was committed (%s); left for the next agent",
                        exc)
            return
        if left:
            log.warning("%d event(s) of %d process(es) were not delivered to Kafka: the next "
                        "agent will count them lost (tally kept in %s)", sum(left.values()),
                        len(left), self.directory)
        else:
            remove(self.directory)


def read_pinned_tally(directory: Path) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
    """A dead agent's pinned tally (producer/publish/deadagents.py): events committed per pid, and
    per pid
    (delivered, dropped) as it settled them. OSError when the maps cannot be opened."""

    def open_map(name: str) -> bpfload.BpfMap:
        try:
            fd = bpfload.obj_get(directory / name)
        except OSError as exc:
            raise OSError(exc.errno, f"{directory / name}: {exc.strerror}") from None
        try:
            return bpfload.BpfMap(fd, bpfload.map_spec(fd, name))
        except BaseException:
            os.close(fd)
            raise

    def entries(table: bpfload.BpfMap, dtype: np.dtype[Any]) -> dict[int, np.void]:
        if table.spec.key_size != 4 or table.spec.value_size != dtype.itemsize:
            raise OSError(errno.EINVAL, f"{directory / table.spec.name}: not a tally map "
                          f"({table.spec.key_size}-byte keys, {table.spec.value_size}-byte values)")
        return {_U32.unpack(k)[0]: np.frombuffer(v, dtype=dtype)[0] for k, v in table.items()}

    committed_map = open_map("committed")
    try:
        settled_map = open_map("settled")
        try:
            committed = {pid: int(v) for pid, v in
                         entries(committed_map, np.dtype("<u8")).items()}
            settled = {pid: (int(v["delivered"]), int(v["dropped"]))
                       for pid, v in entries(settled_map, SETTLED_DTYPE).items()}
        finally:
            os.close(settled_map.fd)
    finally:
        os.close(committed_map.fd)
    return committed, settled
