"""Struct member offsets of the running kernel, read from its BTF (/sys/kernel/btf/vmlinux).

The HTTP capture walks a few kernel structs from an accepted fd to its socket (is it TCP? which
port?). The kernel headers bcc compiles against may be another version than the running kernel
(Debian's generic headers on a cloud kernel), so their layouts cannot be trusted; BTF describes
the running kernel exactly. Offsets go to the BPF program as cflags.

Pure: parses bytes (the BTF format of linux/btf.h), so tests feed it hand-built blobs too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Final

from gpuflight.producer.contract.errors import SetupError

VMLINUX: Final = Path("/sys/kernel/btf/vmlinux")

_MAGIC: Final = 0xEB9F
# BTF kinds (linux/btf.h).
_INT, _PTR, _ARRAY, _STRUCT, _UNION, _ENUM, _FWD, _TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
_VOLATILE, _CONST, _RESTRICT, _FUNC, _FUNC_PROTO, _VAR, _DATASEC = 9, 10, 11, 12, 13, 14, 15
_FLOAT, _DECL_TAG, _TYPE_TAG, _ENUM64 = 16, 17, 18, 19
_MODIFIERS: Final = frozenset({_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG})


class BtfError(SetupError):
    """The BTF blob is malformed, or lacks a struct or member we need."""


# Bytes after the 12-byte common header: fixed, and per vlen item, by kind.
_EXTRA: Final = {_INT: 4, _VAR: 4, _DECL_TAG: 4, _ARRAY: 12}
_PER_ITEM: Final = {_STRUCT: 12, _UNION: 12, _DATASEC: 12, _ENUM64: 12, _ENUM: 8, _FUNC_PROTO: 8}
_KNOWN: Final = frozenset(
    {_PTR, _FWD, _FUNC, _FLOAT, *_MODIFIERS, *_EXTRA, *_PER_ITEM}
)
_HEAD: Final = struct.Struct("<III")


class Btf:
    """The types of one BTF blob. Indexing walks the type section once (~40 ms for a
    distribution kernel); a struct's members are decoded only when asked for."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 24:
            raise BtfError("BTF blob too short")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != _MAGIC:
            raise BtfError(f"not BTF (magic {magic:#x})")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        types_start = hdr_len + type_off
        strings_start = hdr_len + str_off
        if types_start + type_len > len(data) or strings_start + str_len > len(data):
            raise BtfError("BTF sections run past the end of the blob")
        self._data = data
        self._strings = data[strings_start : strings_start + str_len]
        self._positions = self._index(types_start, types_start + type_len)
        self._structs: dict[str, int] | None = None

    @classmethod
    def from_file(cls, path: Path = VMLINUX) -> Btf:
        try:
            return cls(path.read_bytes())
        except OSError as exc:
            raise BtfError(f"cannot read {path}: {exc.strerror}") from exc

    def _index(self, pos: int, end: int) -> list[int]:
        """Where each type record starts; index 0 stands for void."""
        data = self._data
        extra = [_EXTRA.get(k, 0) for k in range(32)]
        per_item = [_PER_ITEM.get(k, 0) for k in range(32)]
        info_at = struct.Struct("<I").unpack_from
        positions = [-1]
        append = positions.append
        while pos < end:
            if pos + 12 > end:
                raise BtfError("truncated type record")
            info = info_at(data, pos + 4)[0]
            kind = (info >> 24) & 0x1F
            if kind not in _KNOWN:
                raise BtfError(f"unknown BTF kind {kind}")
            append(pos)
            pos += 12 + extra[kind] + per_item[kind] * (info & 0xFFFF)
        if pos != end:
            raise BtfError("the last type record runs past the type section")
        return positions

    def _name(self, offset: int) -> str:
        end = self._strings.find(b"\0", offset)
        if offset >= len(self._strings) or end < 0:
            raise BtfError(f"string offset {offset} outside the string section")
        return self._strings[offset:end].decode(errors="replace")

    def _head(self, type_id: int) -> tuple[int, int, int, int]:
        """(kind, vlen, kind_flag, size_or_type) of a type id."""
        if not 0 < type_id < len(self._positions):
            raise BtfError(f"type id {type_id} out of range")
        _name, info, size_or_type = _HEAD.unpack_from(self._data, self._positions[type_id])
        return (info >> 24) & 0x1F, info & 0xFFFF, info >> 31, size_or_type

    def _struct_id(self, name: str) -> int | None:
        if self._structs is None:
            self._structs = {}
            for type_id in range(1, len(self._positions)):
                name_off, info, _ = _HEAD.unpack_from(self._data, self._positions[type_id])
                if (info >> 24) & 0x1F == _STRUCT and name_off and info & 0xFFFF:
                    self._structs.setdefault(self._name(name_off), type_id)
        return self._structs.get(name)

    def _resolve(self, type_id: int) -> int:
        """The type id under typedefs and qualifiers (0: void)."""
        for _ in range(64):
            if type_id == 0:
                return 0
            kind, _vlen, _flag, target = self._head(type_id)
            if kind not in _MODIFIERS:
                return type_id
            type_id = target
        raise BtfError("a typedef chain loops")

    def _size(self, type_id: int) -> int:
        type_id = self._resolve(type_id)
        if type_id == 0:
            return 0
        kind, _vlen, _flag, size = self._head(type_id)
        if kind == _PTR:
            return 8
        if kind == _ARRAY:
            at = self._positions[type_id] + 12
            elem, _index, count = struct.unpack_from("<III", self._data, at)
            return self._size(int(elem)) * int(count)
        return size if kind in (_INT, _STRUCT, _UNION, _ENUM, _ENUM64, _FLOAT) else 0

    def _members(self, type_id: int) -> list[tuple[str, int, int, int]]:
        """(name, type id, bit offset, bitfield bits) of a struct or union."""
        kind, vlen, kind_flag, _size = self._head(type_id)
        if kind not in (_STRUCT, _UNION):
            return []
        pos = self._positions[type_id] + 12
        out = []
        for i in range(vlen):
            name_off, m_type, m_offset = _HEAD.unpack_from(self._data, pos + 12 * i)
            if kind_flag:
                bits, offset = m_offset >> 24, m_offset & 0xFFFFFF
            else:
                bits, offset = 0, m_offset
            out.append((self._name(name_off) if name_off else "", m_type, offset, bits))
        return out

    def _find(self, type_id: int, member: str) -> tuple[int, int, int] | None:
        """(bit offset, type id, bitfield bits) of `member`, looking into anonymous members."""
        for name, m_type, offset, bits in self._members(self._resolve(type_id)):
            if name == member:
                return offset, m_type, bits
            if not name:
                inner = self._find(m_type, member)
                if inner is not None:
                    return offset + inner[0], inner[1], inner[2]
        return None

    def member(self, struct_name: str, member: str) -> tuple[int, int]:
        """(byte offset, size in bytes) of `struct_name.member`; a bitfield is an error."""
        type_id = self._struct_id(struct_name)
        if type_id is None:
            raise BtfError(f"struct {struct_name} is not in the kernel's BTF")
        found = self._find(type_id, member)
        if found is None:
            raise BtfError(f"struct {struct_name} has no member {member}")
        bit_offset, m_type, bits = found
        if bits or bit_offset % 8:
            raise BtfError(f"{struct_name}.{member} is a bitfield")
        return bit_offset // 8, self._size(m_type)


@dataclass(frozen=True)
class SocketOffsets:
    """Where the fd → socket walk reads, in bytes (bpf/http.bpf.h, GF_HTTP_OFF_*)."""

    task_files: int
    files_fdt: int
    fdt_max_fds: int
    fdt_fd: int
    file_inode: int
    file_private: int
    inode_mode: int
    socket_sk: int
    sk_family: int
    sk_num: int
    sk_dport: int
    sk_daddr: int
    sk_v6_daddr: int
    sk_type: int
    sk_protocol: int

    def cflags(self) -> list[str]:
        return [f"-DGF_HTTP_OFF_{f.name.upper()}={getattr(self, f.name)}" for f in fields(self)]


# (field, struct, member, the size the BPF program reads)
_WALK: Final = (
    ("task_files", "task_struct", "files", 8),
    ("files_fdt", "files_struct", "fdt", 8),
    ("fdt_max_fds", "fdtable", "max_fds", 4),
    ("fdt_fd", "fdtable", "fd", 8),
    ("file_inode", "file", "f_inode", 8),
    ("file_private", "file", "private_data", 8),
    ("inode_mode", "inode", "i_mode", 2),
    ("socket_sk", "socket", "sk", 8),
    ("sk_family", "sock_common", "skc_family", 2),
    ("sk_num", "sock_common", "skc_num", 2),
    ("sk_dport", "sock_common", "skc_dport", 2),
    ("sk_daddr", "sock_common", "skc_daddr", 4),
    ("sk_v6_daddr", "sock_common", "skc_v6_daddr", 16),
    ("sk_type", "sock", "sk_type", 2),
    ("sk_protocol", "sock", "sk_protocol", 2),
)


def socket_offsets(btf: Btf) -> SocketOffsets:
    """The offsets of the fd → socket walk; BtfError when a member moved out of reach
    (a bitfield, another size), so the caller falls back to the accept's address family."""
    sock_common_in_sock, _ = btf.member("sock", "__sk_common")
    values = _offsets(btf, _WALK)
    for name, struct_name, _member, _size in _WALK:
        if struct_name == "sock_common":
            values[name] += sock_common_in_sock
    return SocketOffsets(**values)


def _offsets(btf: Btf, walk: tuple[tuple[str, str, str, int], ...]) -> dict[str, int]:
    """Each (field, struct, member, size) of `walk`: the member's offset by field; BtfError
    when one is missing or of another size than the walk reads."""
    values: dict[str, int] = {}
    for name, struct_name, member, size in walk:
        offset, actual = btf.member(struct_name, member)
        if actual != size:
            raise BtfError(f"{struct_name}.{member} is {actual} bytes, expected {size}")
        values[name] = offset
    return values


@dataclass(frozen=True)
class FileOffsets:
    """Where the fd → file identity walk reads, in bytes (bpf/cudart.bpf.c, GF_FILE_OFF_*):
    task->files->fdt->fd[fd]->f_inode, then the inode's number, size and change time and its
    superblock's dev_t: what stat(2) shows of the file."""

    task_files: int
    files_fdt: int
    fdt_max_fds: int
    fdt_fd: int
    file_inode: int
    inode_ino: int
    inode_size: int
    inode_sb: int
    sb_dev: int
    #: The inode's change time: seconds (8 bytes) and nanoseconds (the low 4 bytes).
    inode_ctime_sec: int
    inode_ctime_nsec: int

    def cflags(self) -> list[str]:
        return [f"-DGF_FILE_OFF_{f.name.upper()}={getattr(self, f.name)}" for f in fields(self)]


_FILE_WALK: Final = (
    ("task_files", "task_struct", "files", 8),
    ("files_fdt", "files_struct", "fdt", 8),
    ("fdt_max_fds", "fdtable", "max_fds", 4),
    ("fdt_fd", "fdtable", "fd", 8),
    ("file_inode", "file", "f_inode", 8),
    ("inode_ino", "inode", "i_ino", 8),
    ("inode_size", "inode", "i_size", 8),
    ("inode_sb", "inode", "i_sb", 8),
    ("sb_dev", "super_block", "s_dev", 4),
)


def file_offsets(btf: Btf) -> FileOffsets:
    """The offsets of the fd → file identity walk; BtfError when a member is missing or of
    another size than the walk reads."""
    values = _offsets(btf, _FILE_WALK)
    # Linux 6.7+: i_ctime_sec and i_ctime_nsec; 6.6: __i_ctime, before: i_ctime (each a
    # struct timespec64: tv_sec, then tv_nsec).
    try:
        sec, sec_size = btf.member("inode", "i_ctime_sec")
        nsec, nsec_size = btf.member("inode", "i_ctime_nsec")
    except BtfError:
        for member in ("__i_ctime", "i_ctime"):
            try:
                sec, sec_size = btf.member("inode", member)
            except BtfError:
                continue
            if sec_size != 16:
                raise BtfError(f"inode.{member} is {sec_size} bytes, not a timespec64") from None
            nsec, sec_size, nsec_size = sec + 8, 8, 8
            break
        else:
            raise BtfError("struct inode has no change time the walk knows") from None
    if sec_size != 8 or nsec_size not in (4, 8):
        raise BtfError(f"inode's change time is {sec_size}+{nsec_size} bytes, expected 8+4")
    return FileOffsets(**values, inode_ctime_sec=sec, inode_ctime_nsec=nsec)


def task_pid_cflags(btf: Btf) -> list[str]:
    """Where task_struct keeps `pid` (the thread's id; a process's first thread's is the
    process's): the raw fork tracepoint reads the child's there (bpf/cudart.bpf.c,
    GF_TASK_OFF_PID). BtfError when it is missing or not 4 bytes."""
    offset, size = btf.member("task_struct", "pid")
    if size != 4:
        raise BtfError(f"task_struct.pid is {size} bytes, expected 4")
    return [f"-DGF_TASK_OFF_PID={offset}"]


def task_fsbase_cflags(btf: Btf) -> list[str]:
    """Where task_struct keeps an x86-64 thread's thread pointer (thread.fsbase: what glibc's
    pthread_self() returns): the Python walk finds a CPython 3.9/3.10 thread's state by it
    (bpf/pywalk.bpf.h, GF_TASK_OFF_FSBASE). BtfError when it is missing or not 8 bytes."""
    thread, _ = btf.member("task_struct", "thread")
    fsbase, size = btf.member("thread_struct", "fsbase")
    if size != 8:
        raise BtfError(f"thread_struct.fsbase is {size} bytes, expected 8")
    return [f"-DGF_TASK_OFF_FSBASE={thread + fsbase}"]
