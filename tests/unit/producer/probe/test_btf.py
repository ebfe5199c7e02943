"""The HTTP capture (bpf/http.bpf.h through bpf/http_proto.bpf.c): its contract with user space,
the source bundling, the BTF offsets, and the programs on this kernel (root, bcc)."""

from __future__ import annotations

import struct

import pytest

from gpuflight.producer.probe.btf import (
    VMLINUX,
    Btf,
    BtfError,
    file_offsets,
    socket_offsets,
    task_fsbase_cflags,
    task_pid_cflags,
)
from tests.conftest import require

# -- the contract ---------------------------------------------------------------------------


# -- one source for bcc ---------------------------------------------------------------------


# -- BTF ------------------------------------------------------------------------------------


def test_socket_offsets_of_the_running_kernel() -> None:
    require(None if VMLINUX.is_file() else f"{VMLINUX} is missing (a kernel without BTF)")
    offsets = socket_offsets(Btf.from_file())
    flags = offsets.cflags()
    assert len(flags) == 15 and all(f.startswith("-DGF_HTTP_OFF_") for f in flags)
    # sock_common is struct sock's first member; its family sits near its start.
    assert 0 < offsets.sk_family < 64 and offsets.sk_type > offsets.sk_family


class _Members(Btf):
    """A BTF that answers member() from a table (the walk's lookups, without a blob)."""

    def __init__(self, members: dict[tuple[str, str], tuple[int, int]]) -> None:
        self._table = members

    def member(self, struct_name: str, member: str) -> tuple[int, int]:
        try:
            return self._table[(struct_name, member)]
        except KeyError:
            raise BtfError(f"struct {struct_name} has no member {member}") from None


_FILE_WALK_MEMBERS = {
    ("task_struct", "files"): (1824, 8), ("files_struct", "fdt"): (32, 8),
    ("fdtable", "max_fds"): (0, 4), ("fdtable", "fd"): (8, 8), ("file", "f_inode"): (32, 8),
    ("inode", "i_ino"): (64, 8), ("inode", "i_size"): (80, 8), ("inode", "i_sb"): (40, 8),
    ("super_block", "s_dev"): (16, 4),
}


@pytest.mark.parametrize(("ctime", "want"), [
    ({("inode", "i_ctime_sec"): (104, 8), ("inode", "i_ctime_nsec"): (120, 4)}, (104, 120)),
    ({("inode", "__i_ctime"): (96, 16)}, (96, 104)),  # Linux 6.6: a timespec64
    ({("inode", "i_ctime"): (88, 16)}, (88, 96)),  # before
])
def test_file_walk_finds_the_change_time_of_each_kernel(
    ctime: dict[tuple[str, str], tuple[int, int]], want: tuple[int, int]
) -> None:
    offsets = file_offsets(_Members({**_FILE_WALK_MEMBERS, **ctime}))
    assert (offsets.inode_ctime_sec, offsets.inode_ctime_nsec) == want
    assert (offsets.task_files, offsets.sb_dev) == (1824, 16)
    assert f"-DGF_FILE_OFF_INODE_CTIME_NSEC={want[1]}" in offsets.cflags()


@pytest.mark.parametrize("ctime", [
    {},  # no change time at all
    {("inode", "i_ctime"): (88, 8)},  # not a timespec64
    {("inode", "i_ctime_sec"): (104, 4), ("inode", "i_ctime_nsec"): (120, 4)},
])
def test_file_walk_refuses_a_change_time_it_does_not_know(
    ctime: dict[tuple[str, str], tuple[int, int]]
) -> None:
    with pytest.raises(BtfError):
        file_offsets(_Members({**_FILE_WALK_MEMBERS, **ctime}))


def test_file_walk_refuses_a_member_of_another_size() -> None:
    members = {**_FILE_WALK_MEMBERS, ("inode", "i_ino"): (64, 4),
               ("inode", "i_ctime_sec"): (104, 8), ("inode", "i_ctime_nsec"): (120, 4)}
    with pytest.raises(BtfError, match="i_ino is 4 bytes"):
        file_offsets(_Members(members))


def test_file_offsets_of_the_running_kernel() -> None:
    require(None if VMLINUX.is_file() else f"{VMLINUX} is missing (a kernel without BTF)")
    offsets = file_offsets(Btf.from_file())
    flags = offsets.cflags()
    assert len(flags) == 11 and all(f.startswith("-DGF_FILE_OFF_") for f in flags)
    assert offsets.inode_ctime_nsec > offsets.inode_ctime_sec


def test_where_a_task_keeps_its_pid() -> None:
    """The raw fork tracepoint reads the child's pid where the kernel's BTF says; one of
    another size is refused (the program then follows forks on the tracepoint perf event)."""
    assert task_pid_cflags(_Members({("task_struct", "pid"): (2456, 4)})) == [
        "-DGF_TASK_OFF_PID=2456"]
    with pytest.raises(BtfError, match=r"task_struct\.pid is 8 bytes"):
        task_pid_cflags(_Members({("task_struct", "pid"): (2456, 8)}))
    with pytest.raises(BtfError, match="no member pid"):
        task_pid_cflags(_Members({}))
    require(None if VMLINUX.is_file() else f"{VMLINUX} is missing (a kernel without BTF)")
    btf = Btf.from_file()
    (flag,) = task_pid_cflags(btf)
    pid = int(flag.rpartition("=")[2])
    assert btf.member("task_struct", "tgid") == (pid + 4, 4)  # declared one after the other


# -- on the kernel --------------------------------------------------------------------------


# -- the contract ---------------------------------------------------------------------------


# -- one source for bcc ---------------------------------------------------------------------


# -- BTF ------------------------------------------------------------------------------------

def _btf_blob() -> bytes:
    """struct outer { int x; union { int y; struct inner in; }; int bits:3; } by hand."""
    strings = b"\0int\0outer\0x\0y\0inner\0in\0bits\0z\0"

    def off(name: bytes) -> int:
        return strings.index(b"\0" + name + b"\0") + 1

    def head(name: int, kind: int, vlen: int, size: int, flag: int = 0) -> bytes:
        return struct.pack("<III", name, (flag << 31) | (kind << 24) | vlen, size)

    types = b"".join([
        head(off(b"int"), 1, 0, 4) + struct.pack("<I", 32),  # 1: int
        head(off(b"inner"), 4, 1, 8) + struct.pack("<III", off(b"z"), 1, 32),  # 2: inner
        head(0, 5, 2, 8) + struct.pack("<IIIIII", off(b"y"), 1, 0, off(b"in"), 2, 0),  # 3
        head(off(b"outer"), 4, 3, 20, flag=1)
        + struct.pack("<III", off(b"x"), 1, 0)
        + struct.pack("<III", 0, 3, 64)
        + struct.pack("<III", off(b"bits"), 1, (3 << 24) | 128),  # 4: outer
    ])
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def test_btf_members_through_anonymous_unions() -> None:
    btf = Btf(_btf_blob())
    assert btf.member("outer", "x") == (0, 4)
    assert btf.member("outer", "y") == (8, 4)
    assert btf.member("outer", "in") == (8, 8)
    assert btf.member("inner", "z") == (4, 4)
    with pytest.raises(BtfError, match="bitfield"):
        btf.member("outer", "bits")
    with pytest.raises(BtfError, match="no member"):
        btf.member("outer", "nope")
    with pytest.raises(BtfError, match="not in the kernel"):
        btf.member("absent", "x")


@pytest.mark.parametrize("blob", [b"", b"\x00" * 40, _btf_blob()[:-20], _btf_blob()[:30]])
def test_btf_rejects_malformed_blobs(blob: bytes) -> None:
    with pytest.raises(BtfError):
        Btf(blob)


# -- on the kernel --------------------------------------------------------------------------


def test_where_a_task_keeps_its_thread_pointer() -> None:
    """The Python walk finds a CPython 3.9/3.10 thread by pthread_self(), the thread pointer:
    task_struct.thread.fsbase, an 8-byte member of a member."""
    members = {("task_struct", "thread"): (5120, 4096), ("thread_struct", "fsbase"): (40, 8)}
    assert task_fsbase_cflags(_Members(members)) == ["-DGF_TASK_OFF_FSBASE=5160"]
    with pytest.raises(BtfError, match=r"thread_struct\.fsbase is 4 bytes"):
        task_fsbase_cflags(_Members({**members, ("thread_struct", "fsbase"): (40, 4)}))
    with pytest.raises(BtfError, match="no member thread"):
        task_fsbase_cflags(_Members({("thread_struct", "fsbase"): (40, 8)}))
    require(None if VMLINUX.is_file() else f"{VMLINUX} is missing (a kernel without BTF)")
    (flag,) = task_fsbase_cflags(Btf.from_file())
    assert flag.startswith("-DGF_TASK_OFF_FSBASE=") and int(flag.rpartition("=")[2]) > 0
