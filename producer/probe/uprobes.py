"""Uprobes, one BPF link each: how a program is attached at a file offset, and detached.

Not bcc's attach_uprobe: Debian's python3-bpfcc 0.26 declares libbcc's 7-argument
bpf_attach_uprobe with 6 arguments, so the 7th, ref_ctr_offset, is whatever the stack holds;
the kernel registers the uprobe with it, and then refuses any other tracer's uprobe on the
same function (its ref_ctr_offset is 0: "ref_ctr_offset mismatch" in dmesg), or ours when the
other came first. bcc also falls back to tracefs events, whose removal fails with EBUSY while
a copy of the fd is open, and stops at 1000 open probes per process.

So, as libbpf does: where the kernel has them (Linux 6.6+), a BPF uprobe_multi link per probe
(one offset each: each function has a program of its own), ref_ctr_offset 0. Not the uprobe
PMU: releasing a perf-event uprobe takes the kernel ~100 ms, one after another however many
threads close them, a link ~50 ms alone and ~2.7 ms 32 at a time; and while perf uprobes are
being released (an earlier trace's releaser), registering one took 1-11 ms where a link took
0.1-0.3 ms: a traced PyTorch start-up was held ~7 s at its dlopens for ~320 probes, ~0.1 s
with links (bench/attach_cost.py, bench/RESULTS.md). Older kernels: perf_event_open(2) on
the uprobe PMU, then a BPF link (5.15+) or PERF_EVENT_IOC_SET_BPF. One fd per probe; closing
it detaches.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import resource
from pathlib import Path
from typing import Any, Protocol

from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.probe import bpfload
from gpuflight.producer.probe.fds import raise_open_files_limit

log = logging.getLogger(__name__)

UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe")
#: Errors that concern a whole file (or this process), not one function: the file is skipped
#: rather than every function tried in vain.
FILE_ERRNOS = frozenset({
    errno.ENOENT, errno.ENOTDIR, errno.ESTALE, errno.ELOOP, errno.EPERM, errno.EACCES,
    errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENODEV, errno.ENOSYS,
})


class Uprobes(Protocol):
    """How Probes attaches a program to one uprobe and detaches it (the seam tests fake)."""

    #: The expected attach type the programs must be loaded with (-1: none).
    attach_type: int

    def attach(self, prog_fd: int, path: str, offset: int, retprobe: bool,
               cookie: int = 0) -> int: ...
    def detach(self, fd: int) -> None: ...


class _LinkCreate(ctypes.Structure):
    """union bpf_attr as BPF_LINK_CREATE reads it for a perf event."""

    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("bpf_cookie", ctypes.c_uint64),
    ]


class _UprobeMultiLink(ctypes.Structure):
    """union bpf_attr as BPF_LINK_CREATE reads it for a uprobe_multi link."""

    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("path", ctypes.c_uint64),
        ("offsets", ctypes.c_uint64),
        ("ref_ctr_offsets", ctypes.c_uint64),  # NULL: no USDT semaphores
        ("cookies", ctypes.c_uint64),
        ("cnt", ctypes.c_uint32),
        ("multi_flags", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),  # 0: every process that maps the file
        ("pad", ctypes.c_uint32),
    ]


class UprobeLinks:
    """Attaches BPF programs to uprobes; the seam tests replace to make one fail."""

    def __init__(self, pmu: Path = UPROBE_PMU, multi: bool | None = None) -> None:
        """`multi`: whether to use uprobe_multi links (None: where the kernel has them)."""
        self._links = True  # BPF links for perf events, until the kernel says it has none
        self.multi = self._has_uprobe_multi() if multi is None else multi
        self.attach_type = bpfload.BPF_TRACE_UPROBE_MULTI if self.multi else -1
        self._type = self._retprobe = 0
        if self.multi:
            return
        try:
            self._type = int((pmu / "type").read_text())
            retprobe = (pmu / "format" / "retprobe").read_text().strip()  # "config:0"
            self._retprobe = 1 << int(retprobe.removeprefix("config:"))
        except (OSError, ValueError) as exc:
            raise SetupError(f"this kernel has no uprobe PMU ({pmu}) and no uprobe_multi "
                             "links: gpuflight needs Linux 4.17 or later with "
                             "CONFIG_UPROBE_EVENTS") from exc

    def _has_uprobe_multi(self) -> bool:
        """Whether the kernel has uprobe_multi links (6.6+), probed as libbpf does: a
        do-nothing program loaded for them, linked to "/", is refused with EBADF (not a
        regular file) where they exist, with EINVAL before."""
        insns = (ctypes.c_uint64 * 2)(0xB7, 0x95)  # r0 = 0; exit
        license = ctypes.create_string_buffer(b"GPL")
        load = bpfload.ProgLoad(prog_type=bpfload.BPF_PROG_TYPE_KPROBE, insn_cnt=2,
                         insns=ctypes.addressof(insns), license=ctypes.addressof(license),
                         expected_attach_type=bpfload.BPF_TRACE_UPROBE_MULTI)
        try:
            prog = self._call(bpfload.NR_BPF, bpfload.BPF_PROG_LOAD, ctypes.byref(load),
                              ctypes.sizeof(load))
        except OSError as exc:
            log.debug("no uprobe_multi programs (%s): uprobes through the perf PMU", exc)
            return False
        try:
            root = ctypes.create_string_buffer(b"/")
            offsets = (ctypes.c_uint64 * 1)(0)
            link = _UprobeMultiLink(prog_fd=prog, attach_type=bpfload.BPF_TRACE_UPROBE_MULTI,
                                    path=ctypes.addressof(root),
                                    offsets=ctypes.addressof(offsets), cnt=1)
            try:
                os.close(self._call(bpfload.NR_BPF, bpfload.BPF_LINK_CREATE, ctypes.byref(link),
                                    ctypes.sizeof(link)))
            except OSError as exc:
                log.debug("uprobe_multi links: %s", exc)
                return exc.errno == errno.EBADF
            return True  # not expected ("/" is no file), but it linked
        finally:
            os.close(prog)

    def attach(self, prog_fd: int, path: str, offset: int, retprobe: bool,
               cookie: int = 0) -> int:
        """An fd holding a uprobe at `offset` of the file at `path` that runs `prog_fd`
        (which reads `cookie` with bpf_get_attach_cookie; 0 before Linux 5.15);
        OSError with the kernel's errno when it refuses. Each probe holds a file descriptor
        (~85 per runtime file): out of them, the soft limit is raised towards the hard one
        (only then, so that a traced command started before inherits the usual limit)."""
        try:
            return self._attach(prog_fd, path, offset, retprobe, cookie)
        except OSError as exc:
            if exc.errno != errno.EMFILE or not raise_open_files_limit():
                raise
        return self._attach(prog_fd, path, offset, retprobe, cookie)

    def _attach(self, prog_fd: int, path: str, offset: int, retprobe: bool,
                cookie: int) -> int:
        name = ctypes.create_string_buffer(os.fsencode(path))
        if self.multi:
            offsets = (ctypes.c_uint64 * 1)(offset)
            cookies = (ctypes.c_uint64 * 1)(cookie)
            multi = _UprobeMultiLink(
                prog_fd=prog_fd, attach_type=bpfload.BPF_TRACE_UPROBE_MULTI,
                path=ctypes.addressof(name), offsets=ctypes.addressof(offsets),
                cookies=ctypes.addressof(cookies), cnt=1,
                multi_flags=bpfload.BPF_F_UPROBE_MULTI_RETURN if retprobe else 0,
            )
            return self._call(bpfload.NR_BPF, bpfload.BPF_LINK_CREATE, ctypes.byref(multi),
                              ctypes.sizeof(multi))
        attr = bpfload.PerfEventAttr(
            type=self._type,
            size=ctypes.sizeof(bpfload.PerfEventAttr),
            config=self._retprobe if retprobe else 0,  # ref_ctr_offset 0: not a USDT semaphore
            flags=bpfload.PERF_ATTR_DISABLED,
            config1=ctypes.addressof(name),
            config2=offset,
        )
        event = self._call(bpfload.NR_PERF_EVENT_OPEN, ctypes.byref(attr), -1, 0, -1,
                           bpfload.PERF_FLAG_FD_CLOEXEC)
        try:
            if self._links:
                link = _LinkCreate(prog_fd=prog_fd, target_fd=event,
                                   attach_type=bpfload.BPF_PERF_EVENT, bpf_cookie=cookie)
                try:
                    fd = self._call(bpfload.NR_BPF, bpfload.BPF_LINK_CREATE, ctypes.byref(link),
                                    ctypes.sizeof(link))
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._links = False  # before Linux 5.15: the perf event holds the program
                else:
                    try:
                        fcntl.ioctl(event, bpfload.PERF_EVENT_IOC_ENABLE, 0)
                    except BaseException:
                        os.close(fd)
                        raise
                    os.close(event)  # the link holds the event
                    return fd
            fcntl.ioctl(event, bpfload.PERF_EVENT_IOC_SET_BPF, prog_fd)
            fcntl.ioctl(event, bpfload.PERF_EVENT_IOC_ENABLE, 0)
            return event
        except BaseException:
            os.close(event)
            raise

    def detach(self, fd: int) -> None:
        os.close(fd)

    def _call(self, number: int, *args: Any) -> int:
        return bpfload.syscall(number, *args)


def _strerror(err: int) -> str:
    if err == bpfload.ENOTSUPP:
        return "the kernel cannot probe the instruction there (bpfload.ENOTSUPP)"
    if err in (errno.EMFILE, errno.ENFILE):
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (f"{os.strerror(err)}: each probe holds a file descriptor, and the limit is "
                f"{soft} (raise it: ulimit -n, or LimitNOFILE= for a service)")
    return os.strerror(err)


def reason(exc: OSError) -> str:
    """Why the kernel refused an attach, in words."""
    return _strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
