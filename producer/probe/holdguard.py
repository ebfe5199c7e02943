"""Holds that a tracer's death does not leave behind.

`trace` holds its command at each exec and each dlopen that maps something (the probe's
SIGSTOP, bpf/cudart.bpf.c gf_loader_notify) until it has attached to what was mapped, then
continues it (SIGCONT, producer/capture.py). A tracer killed in between (SIGKILL, the OOM
killer) would leave the process stopped for good. So the kernel side records each hold in the
`holds` map, by its notification, before it stops the process; the capture forgets a hold once
it has continued the process; and a watchdog started with the trace, a small process that keeps
descriptors of that map, of the scope, and of the tracer (a pidfd), continues the processes left
in the map when the tracer dies, then exits. Only those: a process the user stopped (Ctrl-Z,
`kill -STOP`) is not in the map, and stays stopped. A trace that ends as it should lets go of
what is left itself and says goodbye to the watchdog (a line on a pipe), which exits.

The watchdog is spawned (vfork), not forked: a forked copy of the tracer would have it pay for a
copy of each page it writes for as long as the trace lasts (80-670 ms for 80 MB here). Until the
tracer goes it is a shell waiting on the pipe (< 1 ms of CPU to start, beside the command's
start, where an interpreter took ~10 ms). The pipe closed without a goodbye (the tracer is
dying) has it exec this file, which takes every process out of scope (the probes, still there,
hold no process from then on), continues what they held, and, once the tracer is gone, anything
held in the moment between. The kernel releases a dying process's files from the highest
descriptor down, and each probe's release waits for a grace period (3.5 s for a trace of one
stub runtime here, more with hundreds of probes): the pipe's end sits at the top of the tracer's
fd table, so that a held process runs on 0.1-0.2 s after a SIGKILL, not once the tracer is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import resource
import select
import signal
import struct
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator

    from gpuflight.producer.probe.bpfload import BpfMap

log = logging.getLogger(__name__)

#: The watchdog's name: its shell's $0 (in /proc/PID/cmdline), then its process name.
WATCHDOG_NAME = "gpuflight-hold"
#: How long a trace that ended waits for its watchdog to exit (it does as soon as it reads the
#: goodbye), before it kills it.
WATCHDOG_EXIT_S = 5.0
#: Where the watchdog's pipe goes in the tracer's fd table (_on_top): its top, as grown ahead
#: (probes.FD_TABLE_SLOTS).
FD_TOP = 1024
#: struct gf_loader_event (bpf/events.h, records.LOADER_EVENT_DTYPE): a hold's notification,
#: the `holds` map's key.
_HOLD = struct.Struct("<IHHQ")
#: What a trace that ended as it should writes to its watchdog.
_BYE = b"bye\n"
#: The watchdog until the tracer goes: it reads the pipe (its stdin); a goodbye ends it, an end
#: without one has it run this file (`"$@"`). It ignores what it outlives: the signals a stop of
#: every process of a service sends (the tracer forwards SIGTERM to the command), and the
#: terminal's (it has a session of its own).
_SHELL = 'trap "" INT QUIT TERM HUP PIPE; read -r said; [ "$said" = bye ] || exec "$@"'


def hold_key(pid: int, reason: int, ts_ns: int) -> bytes:
    """The `holds` key of the hold that a notification (pid, reason, ts_ns) reported."""
    return _HOLD.pack(pid, 1, reason, ts_ns)


def let_go(holds: BpfMap) -> int:
    """Continue (SIGCONT) every process the probes hold, and forget its holds; how many
    processes were continued. OSError if the map cannot be read."""
    continued: set[int] = set()
    for key in holds:
        pid = int(_HOLD.unpack(key)[0])
        if pid not in continued:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                continued.add(pid)
        holds.delete(key)  # after: a hold made once it runs again has a key of its own
    return len(continued)


class HoldGuard:
    """A trace's watchdog, and the tracer's own descriptor of the `holds` map (it outlives the
    probes' close, for the holds made as the capture ends), given the `holds` map and the
    scope's (Probes.holds, Probes.scope_map). Start it before anything in scope can be held;
    `close` it once the command is over. Without a `holds` map (nothing is held) it does
    nothing."""

    def __init__(self, holds: BpfMap | None, scope: BpfMap) -> None:
        self._holds: BpfMap | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._bye = -1
        if holds is None:
            return
        from gpuflight.producer.probe.bpfload import BpfMap

        self._holds = BpfMap(os.dup(holds.fd), holds.spec)
        try:
            self._watchdog, self._bye = _spawn(self._holds.fd, scope.fd)
        except (OSError, ValueError) as exc:
            log.warning("no watchdog for the holds (%s): should gpuflight be killed while it "
                        "holds the command, the command stays stopped", exc)

    def let_go(self) -> int | None:
        """Continue every process the probes hold (`let_go`); how many, or None where the
        holds cannot be read (there are none, or the map failed). Never raises."""
        if self._holds is None:
            return None
        try:
            return let_go(self._holds)
        except OSError as exc:
            log.debug("the holds cannot be read: %s", exc)
            return None

    def close(self) -> None:
        """The trace is over: let go of what the probes still hold (a hold made as the capture
        ended), then tell the watchdog, and reap it. Never raises."""
        self.let_go()
        if self._bye >= 0:
            with contextlib.suppress(OSError):
                os.write(self._bye, _BYE)
            os.close(self._bye)
            self._bye = -1
        if self._watchdog is not None:
            _reap(self._watchdog)
            self._watchdog = None
        if self._holds is not None:
            with contextlib.suppress(OSError):
                os.close(self._holds.fd)
            self._holds = None


def _spawn(holds_fd: int, scope_fd: int) -> tuple[subprocess.Popen[bytes], int]:
    """Start the watchdog on the maps at `holds_fd` and `scope_fd`; it and the write end of its
    pipe."""
    import subprocess

    tracer = os.pidfd_open(os.getpid())
    read_end, write_end = os.pipe()
    write_end = _on_top(write_end)
    try:
        # `-I -S`: the standard library only, until the tracer's own path is taken up.
        watchdog = subprocess.Popen(
            ["/bin/sh", "-c", _SHELL, WATCHDOG_NAME, sys.executable, "-I", "-S", __file__,
             str(tracer), str(holds_fd), str(scope_fd), os.pathsep.join(sys.path)],
            stdin=read_end, stdout=subprocess.DEVNULL, close_fds=True,
            pass_fds=(tracer, holds_fd, scope_fd), start_new_session=True)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(tracer)
        os.close(read_end)
    return watchdog, write_end


def _on_top(fd: int) -> int:
    """`fd` moved to the top of the fd table (producer/probe/probes.py grows it to 1,024 slots
    ahead):
    a process that dies has the kernel release its files from the highest descriptor down, so
    that the watchdog hears of the death before the probes' releases (tens of ms each), not
    after them. Where there is no room up there, `fd` as it was."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = min(FD_TOP, soft if soft != resource.RLIM_INFINITY else FD_TOP) - 1
    try:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top)
    except OSError:
        return fd
    os.close(fd)
    return moved


def _reap(watchdog: subprocess.Popen[bytes]) -> None:
    """Wait for the watchdog to exit (on a pidfd: Popen.wait with a timeout polls, 1.5 ms
    here); kill it if it does not in WATCHDOG_EXIT_S."""
    try:
        with _pidfd(watchdog.pid) as exited:
            gone = select.poll()
            gone.register(exited, select.POLLIN)
            if not gone.poll(int(WATCHDOG_EXIT_S * 1000)):
                log.debug("the holds' watchdog did not exit: killed")
                watchdog.kill()
    except OSError as exc:  # no pidfd: kill it, it has nothing left to do
        log.debug("the holds' watchdog cannot be waited for (%s): killed", exc)
        watchdog.kill()
    watchdog.wait()


@contextlib.contextmanager
def _pidfd(pid: int) -> Iterator[int]:
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


def _watch(tracer: int, holds_fd: int, scope_fd: int, path: str) -> int:
    """The watchdog once the tracer is dying (its pipe closed without a goodbye): no process is
    in scope from now on, so none is held any more; what the probes hold is continued now, and
    what they held in the moment between, once the tracer is gone (its probes with it)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(WATCHDOG_NAME)
    try:
        sys.path[:0] = path.split(os.pathsep)
        from gpuflight.producer.probe.bpfload import BpfMap, map_spec

        holds = BpfMap(holds_fd, map_spec(holds_fd, "holds"))
        scope = BpfMap(scope_fd, map_spec(scope_fd, "scope_pids"))
        for _ in range(8):  # until a pass finds it empty: a fork in flight may add its child
            if not scope.keys():
                break
            scope.clear()
        continued = let_go(holds)
        gone = select.poll()
        gone.register(tracer, select.POLLIN)
        gone.poll()  # readable once every thread of it has exited, its descriptors closed
        continued += let_go(holds)
    except Exception as exc:
        os.write(2, f"gpuflight: the processes trace held could not be continued: {exc}\n"
                 .encode())
        return 1
    if continued:
        os.write(2, f"gpuflight: trace ended while it held {continued} process(es): continued,"
                 " they run on untraced\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(_watch(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
