"""Files gpuflight keeps across runs (producer/discover/verdictcache.py,
producer/probe/bpfimage.py): read only
when nobody else could have written them, written atomically.

A file is trusted only when it is a regular file owned by our effective uid and writable by
nobody else, in a folder owned by us (or root) that nobody else may write to unless it is
sticky: what these files hold decides what is probed and what the kernel runs.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["UntrustedError", "read_trusted", "write_atomic"]


class UntrustedError(ValueError):
    """The file is there but is not ours to trust (the message says why)."""


def read_trusted(path: Path, max_bytes: int, what: str = "this file") -> bytes | None:
    """The file's bytes if it is ours alone to write; None if there is none. Raises
    UntrustedError when there is one we must not trust (or one bigger than `max_bytes`:
    more than `what` holds)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symbolic link; EACCES: not ours
        raise UntrustedError(f"cannot be opened safely ({exc.strerror})") from None
    try:
        _check_folder(path.parent)
        return _read_file(fd, max_bytes, what)
    finally:
        os.close(fd)


def write_atomic(directory: Path, name: str, data: bytes) -> Path:
    """Write `directory`/`name` whole or not at all (a temporary file in the same folder,
    then os.replace), mode 0600, creating the folder (0700) if need be. Raises OSError."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:  # mkstemp made it 0600
            f.write(data)
        os.replace(temp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return directory / name


def _check_folder(folder: Path) -> None:
    """Someone else who may replace files in the folder could swap in a file of ours (an
    old one, a hard link): the folder must be ours (or root's), and if others may write to
    it, sticky (/tmp: only a file's owner may rename it)."""
    st = os.stat(folder)
    if st.st_uid not in (os.geteuid(), 0):
        raise UntrustedError(f"in a folder owned by uid {st.st_uid}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UntrustedError(
            f"in a folder others may write to (mode {stat.S_IMODE(st.st_mode):o})")


def _read_file(fd: int, max_bytes: int, what: str) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedError("not a regular file")
    if st.st_uid != os.geteuid():
        raise UntrustedError(f"owned by uid {st.st_uid}, not by us ({os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedError(f"writable by others (mode {stat.S_IMODE(st.st_mode):o})")
    if st.st_size > max_bytes:
        raise UntrustedError(f"{st.st_size} bytes, more than {what} holds")
    chunks: list[bytes] = []
    left = st.st_size + 1  # one more: a file that grew while read is seen to
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
