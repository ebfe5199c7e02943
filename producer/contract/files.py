"""Files named on the command line, which may lie in places other users write to (/tmp, a
team's directory): opened so that no one can turn them into something else.

    check_target(path, what)     before a command runs: a path to be written that exists as
                                 a symlink, a FIFO, a socket, a directory or a block device, or
                                 as a file with other names (hard links), is a UsageError
    open_output(path, what)      --output: opened for writing, never through a symlink
                                 (O_NOFOLLOW), never waiting (O_NONBLOCK), a regular file with
                                 one name (checked on the open file, then emptied) or a
                                 character device (/dev/null; /dev/full, where tests want a
                                 full disk): no other user can make one, mknod needs a
                                 privilege
    read_input(path, what)       --prices, --kafka-config: the bytes of a regular file
                                 (symlinks are followed: Kubernetes mounts Secrets so), never
                                 waiting on a FIFO or a device
    replace_file(path, data)     --status-file: the file written whole beside its place, under
                                 a random name made with O_EXCL|O_NOFOLLOW (mkstemp), then
                                 renamed over it (a rename replaces a symlink, never follows it)

Each refusal is a UsageError of one line (exit 2). A contract module: it imports no other
producer module but errors.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Final

from gpuflight.producer.contract.errors import UsageError

#: The mode of a file replace_file writes (readable by whoever waits on it, as a status is).
REPLACED_MODE: Final = 0o644
_KINDS: Final = (
    (stat.S_ISLNK, "a symlink"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind(mode: int) -> str:
    """What a file of this st_mode is, in words ("a FIFO")."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a file"


def _refused(what: str, path: Path | str, why: str) -> UsageError:
    return UsageError(f"{what} {path}: {why}, not a regular file: refused")


def _check(st: os.stat_result, what: str, path: Path | str, *, one_name: bool,
           char_device: bool = False) -> None:
    if char_device and stat.S_ISCHR(st.st_mode):
        return
    if not stat.S_ISREG(st.st_mode):
        raise _refused(what, path, f"it is {kind(st.st_mode)}")
    if one_name and st.st_nlink > 1:
        raise UsageError(f"{what} {path}: it has {st.st_nlink} names (hard links), and writing "
                         "it would write them all: refused")


def check_target(path: Path | None, what: str, *, replaced: bool = False) -> None:
    """Refuse, before anything runs, a path to be written that exists as anything but what
    open_output takes (`replaced`, a file replace_file renames over: a regular file, hard
    links or not). A missing path is fine."""
    if path is None or str(path) == "-":
        return
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    _check(st, what, path, one_name=not replaced, char_device=not replaced)


def open_output(path: Path | str, what: str) -> int:
    """A descriptor of `path` opened for writing (created 0666 less the umask, or emptied):
    a regular file with one name, or a character device; never through a symlink."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENODEV, errno.EWOULDBLOCK):
            # O_NOFOLLOW on a symlink, O_NONBLOCK on a FIFO no one reads, a directory...
            with contextlib.suppress(OSError):
                check_target(Path(path), what)
        raise UsageError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        _check(st, what, path, one_name=True, char_device=True)
        if stat.S_ISREG(st.st_mode):
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_input(path: Path, what: str) -> bytes:
    """The bytes of an input file; a FIFO, a device or a directory is refused (never waited
    on), and an unreadable file is a UsageError too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        _check(os.fstat(fd), what, path, one_name=False)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read()
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes, mode: int = REPLACED_MODE) -> None:
    """Write `path` whole, atomically: a new file of a random name beside it (made with
    O_CREAT|O_EXCL|O_NOFOLLOW, so nothing planted there is written through), renamed over
    it. OSError when it cannot; the new file is removed then."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            os.fchmod(file.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
