"""A trace that dies while it holds its command (SIGKILL between the probe's SIGSTOP and its
SIGCONT) leaves nothing stopped that its probes stopped, and continues nothing else.

The tracer here is `gpuflight trace` with one seam (this module run as a program): its capture
never lets go of a process held once it maps a given library, and prints that process's pid,
so that the hold is there, for good, when the test kills the tracer."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, bpf_unavailable_reason, require
from tests.workloads import build

#: How long a held process may take to run on once its tracer is killed (the watchdog's start
#: and the scope emptied: 0.1-0.2 s here; the tracer itself takes seconds to go, its probes
#: released one after another), and how long the tracer's own end may take.
TIMEOUT_S = 60.0


@pytest.fixture
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(bpf_unavailable_reason())
    return tmp_path_factory.mktemp("workloads")


def _state(pid: int) -> str:
    """The process's state letter (/proc/PID/stat), "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait for `done` (a look at /proc: nothing to block on), yielding the CPU between looks."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        os.sched_yield()


def _exited(pidfd: int, timeout_s: float) -> bool:
    """Whether the process behind `pidfd` ends within `timeout_s` (it need not be our child)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))


class HeldTrace:
    """The seam's tracer on `argv`, once it holds, for good, the process that mapped
    `library` (`held`); every process the test met is killed at the end (by pidfd)."""

    def __init__(self, library: Path, argv: list[str], log: Path) -> None:
        self.log = log
        with log.open("wb") as err:
            self.tracer = subprocess.Popen(
                [sys.executable, "-m", "tests.test_holds", str(library), *argv], cwd=REPO,
                stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        self._pidfds: list[int] = []
        self.held = self.held_fd = -1

    def wait_for_hold(self) -> None:
        assert self.tracer.stdout is not None
        ready = select.poll()
        ready.register(self.tracer.stdout, select.POLLIN)
        assert ready.poll(int(TIMEOUT_S * 1000)), f"nothing held: {self.stderr()}"
        line = self.tracer.stdout.readline()
        assert line.strip().isdigit(), f"nothing held: {self.stderr()}"
        self.held = int(line)
        self.held_fd = self.pidfd(self.held)
        _until(lambda: _state(self.held) == "T", TIMEOUT_S, "the hold's stop")

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def pidfd(self, pid: int) -> int:
        fd = os.pidfd_open(pid)
        self._pidfds.append(fd)
        return fd

    def children(self) -> list[int]:
        """The tracer's children (its own threads' too)."""
        found: list[int] = []
        for task in Path(f"/proc/{self.tracer.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(p) for p in (task / "children").read_text().split()]
        return found

    def watchdog(self) -> int:
        """A pidfd of the tracer's holds watchdog (producer/holdguard.py)."""
        from producer.holdguard import WATCHDOG_NAME

        watchdogs = [pid for pid in self.children()
                     if WATCHDOG_NAME in Path(f"/proc/{pid}/cmdline").read_text().split("\0")]
        assert len(watchdogs) == 1, self.children()
        return self.pidfd(watchdogs[0])

    def kill_tracer(self) -> None:
        self.tracer.kill()
        self.tracer.wait(TIMEOUT_S)

    def close(self) -> None:
        if self.tracer.poll() is None:
            self.kill_tracer()
        for fd in self._pidfds:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        if self.tracer.stdout is not None:
            self.tracer.stdout.close()


@contextlib.contextmanager
def _held_trace(library: Path, argv: list[str], log: Path) -> Iterator[HeldTrace]:
    trace = HeldTrace(library, argv, log)
    try:
        trace.wait_for_hold()
        yield trace
    finally:
        trace.close()


@pytest.mark.bpf
def test_a_trace_killed_while_it_holds_its_command_at_a_dlopen_leaves_it_running(
    bindir: Path, tmp_path: Path
) -> None:
    """SIGKILL while a process of the command (the shell's child) is held at its dlopen: it
    runs to its end, and the command with it."""
    lib = build.build_simgpu(tmp_path / "simgpu") / "libcudart.so.12"
    dlopen = build.build_dlopen(bindir)
    done = tmp_path / "done"
    script = f'"{dlopen}" --lib "{lib}" --iters 3 && touch "{done}"'
    with _held_trace(lib, ["sh", "-c", script], tmp_path / "trace.log") as trace:
        watchdog = trace.watchdog()
        shell = trace.pidfd(_parent(trace.held))
        trace.kill_tracer()
        assert _exited(trace.held_fd, TIMEOUT_S), (
            f"the held process is still {_state(trace.held)!r}: {trace.stderr()}")
        assert _exited(shell, TIMEOUT_S)
        assert done.exists()  # the dlopen workload exited 0, and the shell went on
        # The watchdog says what it did once it is done (after the processes run on).
        assert _exited(watchdog, TIMEOUT_S)
        assert "trace ended while it held 1 process(es)" in trace.stderr()


@pytest.mark.bpf
def test_a_trace_killed_while_it_holds_continues_no_process_the_user_stopped(
    bindir: Path, tmp_path: Path
) -> None:
    """Of the command's processes, one stops itself (as Ctrl-Z or `kill -STOP` would stop it)
    and one is held at its dlopen when the tracer is killed: once the tracer's watchdog is
    done, the held one has run to its end, and the stopped one is still stopped."""
    lib = build.build_simgpu(tmp_path / "simgpu") / "libcudart.so.12"
    dlopen = build.build_dlopen(bindir)
    stopped_pid, done = tmp_path / "stopped", tmp_path / "done"
    script = (f"sh -c 'echo $$ > \"{stopped_pid}\"; kill -STOP $$' & "
              # The dlopen once the other has stopped itself (builtins only: nothing is exec'd).
              f'until [ -s "{stopped_pid}" ] && read -r _ _ state _ < /proc/$!/stat && '
              f'[ "$state" = T ]; do :; done; '
              f'"{dlopen}" --lib "{lib}" && touch "{done}"')
    with _held_trace(lib, ["sh", "-c", script], tmp_path / "trace.log") as trace:
        stopped = int(stopped_pid.read_text())
        trace.pidfd(stopped)
        assert _state(stopped) == "T"
        watchdog = trace.watchdog()
        shell = trace.pidfd(_parent(trace.held))
        trace.kill_tracer()
        assert _exited(watchdog, TIMEOUT_S)
        assert _exited(shell, TIMEOUT_S), trace.stderr()
        assert done.exists()
        assert _state(stopped) == "T"  # the user's stop is the user's to end


@pytest.mark.bpf
def test_each_hold_is_in_the_holds_map_until_the_capture_releases_it(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel records each hold (at an exec, a dlopen, a first listen) under the key the
    capture forgets it by: there while the process is held, gone once it is released (so a
    watchdog would continue none of them, nor a process that runs on)."""
    from producer import trace
    from producer.capture import Capture
    from producer.holdguard import hold_key
    from producer.probes import LoaderEvent
    from producer.records import LOADER_LISTEN, LOADER_MAPPED
    from producer.settings import CaptureSettings

    seen: list[tuple[bool, bool, bool]] = []  # (a listen, the key there before, and after)
    release = Capture._release

    def checked_release(self: Capture, note: LoaderEvent) -> None:
        holds = self.probes.holds
        assert holds is not None
        key = hold_key(note.pid, LOADER_LISTEN if note.listen else LOADER_MAPPED, note.ts_ns)
        before = holds.lookup(key) is not None
        release(self, note)
        seen.append((note.listen, before, holds.lookup(key) is not None))

    monkeypatch.setattr(Capture, "_release", checked_release)
    lib = build.build_simgpu(tmp_path / "simgpu") / "libcudart.so.12"
    script = (f'"{build.build_dlopen(bindir)}" --lib "{lib}" && '
              f'"{sys.executable}" -S -c "import socket; socket.socket().listen()"')
    result = trace.run(["sh", "-c", script], print_summary=False,
                       settings=CaptureSettings(http=True))  # a first listen is held
    assert result.exit_code == 0
    assert {listen for listen, _, _ in seen} == {False, True}, seen
    assert all(before and not after for _, before, after in seen), seen


def _trace_never_letting_go(library: str, argv: list[str]) -> int:
    """`gpuflight trace -- argv`, whose capture never continues a process held once it maps
    `library`: it prints that process's pid instead (and continues every other)."""
    from gpuflight import cli
    from producer.capture import Capture
    from producer.probes import LoaderEvent

    release = Capture._release

    def release_but_at_library(self: Capture, note: LoaderEvent) -> None:
        try:
            maps = Path(f"/proc/{note.pid}/maps").read_text()
        except OSError:
            maps = ""
        if library in maps:
            print(note.pid, flush=True)
            return
        release(self, note)

    Capture._release = release_but_at_library  # type: ignore[method-assign]
    return cli.main(["trace", "--", *argv])


if __name__ == "__main__":
    sys.exit(_trace_never_letting_go(sys.argv[1], sys.argv[2:]))
