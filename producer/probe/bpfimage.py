"""The compiled BPF program, kept on disk so that a start need not compile it again.

bcc compiles the C at every start: ~1.0 s of CPU for bpf/cudart.bpf.c, most of it clang
setting up (a program of one function takes nearly as long), before a traced command can
start. What comes out never changes while its inputs do not, so it is kept here:

    key = sha256(the bundled source, the cflags, bcc's library file, the kernel)
        ──► Image: each map's shape, each function's instructions, and where in them
            each map's fd goes

An Image is what bcc hands the kernel, less the fds: the instructions with each map load
(`ld_imm64` with src_reg BPF_PSEUDO_MAP_FD) pointing at a map by its index here, not by
an fd of the compiling process. Loading one (producer/probe/probes.py) creates the maps, puts
their fds in, and lets the kernel verify each program as it would bcc's.

One JSON file per key (orjson), `bpf-<key>.json`, in the cache folder of the verdicts
(GPUFLIGHT_CACHE_DIR), trusted only as producer/discover/cachefile.py says: the instructions in it
are run by the kernel, so a file anybody else could have written is ignored, as is one that does
not parse exactly. At most MAX_IMAGES are kept (each set of settings compiles its own: a
trace and a node agent differ); the least recently used go first.

Pure: no bcc, no BPF; producer/probe/probes.py compiles and loads.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import orjson

from gpuflight.producer.discover.cachefile import read_trusted, write_atomic

__all__ = [
    "FORMAT_VERSION",
    "MAX_IMAGES",
    "Image",
    "ImageCache",
    "ImageError",
    "MapSpec",
    "ProgramSpec",
    "image_key",
    "relocations",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_FORMAT = "gpuflight-bpf-image"
#: Images kept in a cache folder (one per set of settings; ~150 KB each).
MAX_IMAGES = 16
#: Far more than any image of ours (the probe program: ~65 KB of instructions).
_MAX_FILE_BYTES = 16 << 20
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_KEY = re.compile(r"^[0-9a-f]{64}$")

# struct bpf_insn: code u8, dst_reg:4 src_reg:4, off s16, imm s32 (little-endian).
_LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW: two instructions, a 64-bit constant
_PSEUDO_MAP_FD = 1  # its src_reg when the constant is a map's fd


class ImageError(ValueError):
    """Not an image this gpuflight can load (the message says why)."""


@dataclass(frozen=True, slots=True)
class MapSpec:
    """A map as the kernel was asked to create it (struct bpf_map_info's fields)."""

    name: str
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


@dataclass(frozen=True, slots=True)
class ProgramSpec:
    """One function: its instructions as compiled, with the map fds left out."""

    name: str
    insns: bytes
    #: (instruction index, map index) of each map load: the fd goes in that imm.
    relocations: tuple[tuple[int, int], ...]

    def with_fds(self, fds: Sequence[int]) -> bytes:
        """The instructions with each map load holding that map's fd (from `fds`, by map
        index)."""
        insns = np.frombuffer(self.insns, dtype="<u8").copy()
        for index, map_index in self.relocations:
            insns[index] = (insns[index] & 0xFFFFFFFF) | (fds[map_index] << 32)
        return insns.tobytes()


@dataclass(frozen=True, slots=True)
class Image:
    license: str
    kern_version: int
    maps: tuple[MapSpec, ...]
    programs: tuple[ProgramSpec, ...]

    def program(self, name: str) -> ProgramSpec:
        for spec in self.programs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def map_index(self, name: str) -> int:
        for i, spec in enumerate(self.maps):
            if spec.name == name:
                return i
        raise KeyError(name)


def relocations(insns: bytes, map_of_fd: Mapping[int, int]) -> tuple[tuple[int, int], ...]:
    """Where `insns` (as bcc loads them) load a map's fd, as (instruction index, map index)
    by `map_of_fd` (fd -> map index). ImageError for anything an image cannot carry: a load
    of another kind of pseudo constant (a map value, a BTF id), or of an fd not a map's."""
    if len(insns) % 8:
        raise ImageError("instructions are not whole (8 bytes each)")
    words = np.frombuffer(insns, dtype="<u8")
    code = words & 0xFF
    src = (words >> 12) & 0xF
    found: list[tuple[int, int]] = []
    for index in np.flatnonzero(code == _LD_IMM64):
        i = int(index)  # (an ld_imm64's second half has code 0: never matched here)
        if i + 1 >= len(words):
            raise ImageError("an ld_imm64 without its second half")
        kind = int(src[i])
        if kind == 0:
            continue  # a plain constant
        if kind != _PSEUDO_MAP_FD:
            raise ImageError(f"instruction {i} loads a pseudo constant of kind {kind}")
        fd = int(words[i] >> 32)
        if fd not in map_of_fd:
            raise ImageError(f"instruction {i} loads fd {fd}, which is no map of the program")
        found.append((i, map_of_fd[fd]))
    return tuple(found)


def image_key(source: str, cflags: Iterable[str], compiler: Iterable[str]) -> str:
    """What an image depends on, as a hex digest: the bundled source text, the cflags, and
    `compiler` (bcc's library file, the kernel and its headers: environment_parts)."""
    digest = hashlib.sha256(f"{_FORMAT}/{FORMAT_VERSION}".encode())
    for part in (source, *(f"cflag:{c}" for c in cflags), *(f"env:{e}" for e in compiler)):
        data = part.encode()
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


#: The running kernel's BTF: its size is part of the kernel's identity in an image key.
VMLINUX_BTF: Final = Path("/sys/kernel/btf/vmlinux")


def environment_parts(library: Path | None, headers: Path | None,
                      btf: Path = VMLINUX_BTF) -> list[str]:
    """What the compiled program depends on beyond its source and cflags: the kernel
    (release, build and the size of its BTF, which the struct offsets some cflags carry are
    read from), bcc's library file and the kernel headers bcc compiles against (each by path,
    size and mtime)."""
    uname = os.uname()
    try:
        btf_size = str(btf.stat().st_size)
    except OSError:
        btf_size = "none"
    parts = [f"kernel {uname.release} {uname.version} {uname.machine} btf {btf_size}"]
    for label, path in (("bcc", library), ("headers", headers)):
        if path is None:
            parts.append(f"{label} none")
            continue
        try:
            real = path.resolve()
            st = real.stat()
            parts.append(f"{label} {real} {st.st_size} {st.st_mtime_ns}")
        except OSError:
            parts.append(f"{label} {path} missing")
    return parts


def encode(image: Image, key: str) -> bytes:
    return orjson.dumps({
        "format": _FORMAT,
        "version": FORMAT_VERSION,
        "key": key,
        "license": image.license,
        "kern_version": image.kern_version,
        "maps": [[m.name, m.map_type, m.key_size, m.value_size, m.max_entries, m.flags]
                 for m in image.maps],
        "programs": [[p.name, base64.b64encode(p.insns).decode(), [list(r) for r in p.relocations]]
                     for p in image.programs],
    })


def decode(data: bytes, key: str) -> Image:
    """The image in `data`, made for `key`; ImageError if it is anything else."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ImageError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != _FORMAT:
        raise ImageError("not a gpuflight BPF image")
    if document.get("version") != FORMAT_VERSION:
        raise ImageError(f"format version {document.get('version')!r}, not {FORMAT_VERSION}")
    if document.get("key") != key:
        raise ImageError("made from another source, cflags, bcc or kernel")
    license, kern_version = document.get("license"), document.get("kern_version")
    if not isinstance(license, str) or not license or not isinstance(kern_version, int) \
            or not _u32(kern_version):
        raise ImageError("a bad license or kernel version")
    maps = document.get("maps")
    programs = document.get("programs")
    if not isinstance(maps, list) or not isinstance(programs, list) or not programs:
        raise ImageError("no map or program list")
    map_specs: list[MapSpec] = []
    for row in maps:
        if (not isinstance(row, list) or len(row) != 6 or not isinstance(row[0], str)
                or not _NAME.match(row[0]) or not all(_u32(v) for v in row[1:])):
            raise ImageError("a map of the wrong shape")
        map_specs.append(MapSpec(row[0], *row[1:]))
    program_specs: list[ProgramSpec] = []
    for row in programs:
        if (not isinstance(row, list) or len(row) != 3 or not isinstance(row[0], str)
                or not _NAME.match(row[0]) or not isinstance(row[1], str)
                or not isinstance(row[2], list)):
            raise ImageError("a program of the wrong shape")
        try:
            insns = base64.b64decode(row[1], validate=True)
        except ValueError:
            raise ImageError(f"program {row[0]}: instructions not base64") from None
        if not insns or len(insns) % 8:
            raise ImageError(f"program {row[0]}: instructions not whole")
        relocs: list[tuple[int, int]] = []
        words = np.frombuffer(insns, dtype="<u8")
        for reloc in row[2]:
            if (not isinstance(reloc, list) or len(reloc) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in reloc)
                    or not 0 <= reloc[0] < len(words) - 1 or not 0 <= reloc[1] < len(map_specs)
                    or int(words[reloc[0]]) & 0xFF != _LD_IMM64
                    or (int(words[reloc[0]]) >> 12) & 0xF != _PSEUDO_MAP_FD):
                raise ImageError(f"program {row[0]}: a map load that is not one")
            relocs.append((reloc[0], reloc[1]))
        program_specs.append(ProgramSpec(row[0], insns, tuple(relocs)))
    return Image(license, kern_version, tuple(map_specs), tuple(program_specs))


def _u32(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32


class ImageCache:
    """Images by key in `directory` (None: off, nothing read or written)."""

    def __init__(self, directory: Path | None, max_images: int = MAX_IMAGES) -> None:
        self.directory = directory
        self._max = max(1, max_images)

    def path(self, key: str) -> Path | None:
        if self.directory is None or not _KEY.match(key):
            return None
        return self.directory / f"bpf-{key}.json"

    def load(self, key: str) -> Image | None:
        """The image kept for `key`, or None (none kept, or one not to be used: logged)."""
        path = self.path(key)
        if path is None:
            return None
        try:
            data = read_trusted(path, _MAX_FILE_BYTES, "a BPF image")
            if data is None:
                return None
            image = decode(data, key)
        except (OSError, ValueError) as exc:  # ValueError: UntrustedError, ImageError
            log.info("compiled BPF program in %s ignored: %s", path, exc)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used: the least recently used go first
        return image

    def save(self, key: str, image: Image) -> bool:
        """Keep `image` for `key`; True if written. Never raises: a folder that cannot be
        written costs the next start its compile, not this one anything (logged)."""
        path = self.path(key)
        if path is None or self.directory is None:
            return False
        try:
            write_atomic(self.directory, path.name, encode(image, key))
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the folder's name
            log.info("compiled BPF program not saved in %s: %s", self.directory, exc)
            return False
        self._trim()
        return True

    def _trim(self) -> None:
        assert self.directory is not None
        try:
            kept = sorted(self.directory.glob("bpf-*.json"),
                          key=lambda p: p.stat().st_mtime_ns, reverse=True)
            for old in kept[self._max:]:
                old.unlink()
        except OSError as exc:
            log.debug("old BPF images not removed: %s", exc)
