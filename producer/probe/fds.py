"""This process's file descriptors, as many probes need them: the table grown ahead, the open
files limit raised when it runs out, and probes released in bulk by a detached grandchild.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import resource
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Process name of the detached helper that releases probes after a capture.
RELEASER_NAME = "gpuflight-rel"

#: The file descriptors this process's table is grown to at once (grow_fd_table): a PyTorch
#: start-up's probes, programs and maps hold ~450.
FD_TABLE_SLOTS = 1024


def grow_fd_table(slots: int = FD_TABLE_SLOTS) -> int:
    """Have the kernel make room for `slots` file descriptors now (up to the open files
    limit); the room there is then (FDSize). The kernel grows a process's table by doubling
    it (64, 128, 256, ... slots) as descriptors are opened, and in a process with threads
    each growth waits for an RCU grace period (expand_fdtable: 4-30 ms here): each probe is
    a descriptor, so three such waits fell in the holds of a traced PyTorch start-up. Grown
    at once before any thread starts, it waits for nothing. Never raises."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = (slots if soft == resource.RLIM_INFINITY else min(slots, soft)) - 1
    try:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            # The lowest free descriptor from `top` on: no open one is touched.
            os.close(fcntl.fcntl(null, fcntl.F_DUPFD_CLOEXEC, top))
        finally:
            os.close(null)
    except OSError as exc:
        log.debug("the fd table was not grown ahead: %s", exc)
    return _fd_table_size()


def _fd_table_size() -> int:
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"FDSize:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def raise_open_files_limit() -> bool:
    """Double the soft limit on open files, up to the hard one; whether it went up."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft * 2, 1024)
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if want <= soft:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError) as exc:
        log.debug("cannot raise the open files limit from %d: %s", soft, exc)
        return False
    log.debug("open files limit raised from %d to %d for the probes", soft, want)
    return True


def release_in_background(cleanup: Callable[[], object]) -> None:
    """Run `cleanup` (which closes this process's probes, tracepoints and programs) cheaply:
    a detached grandchild holds a copy of every fd meanwhile, so that what the kernel does to
    release each one (a grace period per probe, ~50-100 ms) happens there, after we go on."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            if os.fork() == 0:
                # Holds every probe until our parent has closed its copies, so
                # that the last (costly) release happens here, then exits.
                with open("/proc/self/comm", "w") as comm:
                    comm.write(RELEASER_NAME)
                _let_go_of_stdio()  # a pipe reading our output is not kept open meanwhile
                os.close(write_end)
                os.read(read_end, 1)
                _close_all_at_once(keep=read_end)
        finally:
            os._exit(0)
    os.close(read_end)
    os.waitpid(child, 0)
    try:
        cleanup()  # cheap now: the grandchild still holds each probe
    finally:
        os.close(write_end)


def _let_go_of_stdio() -> None:
    """Point stdin, stdout and stderr at /dev/null: whoever reads gpuflight's output through
    a pipe (`gpuflight trace ... | tee`, a test's subprocess) would otherwise wait for the
    releaser too (~0.6 s after a PyTorch start-up)."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if null > 2:
            os.close(null)


def _close_all_at_once(keep: int) -> None:
    """Close every fd of this process but stdio and `keep`, many at a time: each release of a
    uprobe or tracepoint waits for its own grace period, and waits made together overlap
    (60 uprobe links: 3.4 s one after another, 0.16 s 32 at a time). Exiting would close them
    one after another."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return

    def close(fd: int) -> bool:
        with contextlib.suppress(OSError):
            os.close(fd)
        return True

    together([fd for fd in fds if fd > 2 and fd != keep], close)


def together(fds: list[int], release: Callable[[int], bool]) -> int:
    """`release` every fd, 32 at a time (a probe's release waits for a grace period of its
    own; waits made together overlap); how many failed."""
    from concurrent.futures import ThreadPoolExecutor

    if not fds:
        return 0
    with ThreadPoolExecutor(max_workers=min(32, len(fds))) as pool:
        return sum(1 for ok in pool.map(release, fds) if not ok)
