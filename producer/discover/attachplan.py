"""Where a library file's probes go: its attach plan, read once from the file's symbols.

For a runtime or driver file, the file offset of each function probed (a uprobe goes at a
file offset): its entry, or past a prefix the kernel would single-step, at the first
instruction it emulates (producer/discover/entrypoint.py: NVIDIA's driver begins every function
with a
`cmp` it single-steps at ~15 us a hit); for the dynamic loader, _dl_debug_state's offset and
the distance from it to the loader's r_state, which the loader-change program reads (its
attach cookie).

A plan depends on the file alone (and on what is probed, PROBED), so discover's Classifier
keeps it with the file's verdict (producer/discover/verdictcache.py): a later run attaches from it
and
reads no ELF while the process waits.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from gpuflight.producer.contract.abi import (
    AUTOGRAD_FUNCTIONS,
    DRIVER_APIS,
    DRIVER_NAME_FUNCTIONS,
    EXIT_FUNCTIONS,
    RUNTIME_APIS,
    RUNTIME_NAME_FUNCTIONS,
)
from gpuflight.producer.discover import elfsyms, entrypoint

log = logging.getLogger(__name__)

__all__ = [
    "LOADER_SYMBOL",
    "MAX_MOVE_BYTES",
    "PROBED",
    "R_DEBUG_SYMBOL",
    "R_STATE_OFFSET",
    "Plan",
    "read_plan",
]

#: The loader calls this empty function after every change to its link map.
LOADER_SYMBOL: Final = "_dl_debug_state"
#: The loader's struct r_debug (<link.h>), and where in it r_state lies (x86-64).
R_DEBUG_SYMBOL: Final = "_r_debug"
R_STATE_OFFSET: Final = 24
_U64 = 1 << 64
#: The furthest a probe is moved past its function's entry.
MAX_MOVE_BYTES: Final = entrypoint.MAX_SKIP_BYTES

#: What each kind of file (discover.Kind) is probed for: its API functions and its name
#: functions; the loader for _dl_debug_state; for code paths only, PyTorch's autograd engine
#: (libtorch_cpu.so) for where a backward pass starts, and libc and CPython for where a
#: process exits.
PROBED: Final[Mapping[str, frozenset[str]]] = MappingProxyType({
    "runtime": RUNTIME_APIS | RUNTIME_NAME_FUNCTIONS,
    "driver": DRIVER_APIS | DRIVER_NAME_FUNCTIONS,
    "loader": frozenset({LOADER_SYMBOL}),
    "autograd": AUTOGRAD_FUNCTIONS,
    "exit": EXIT_FUNCTIONS,
})


@dataclass(frozen=True, slots=True)
class Plan:
    """Where to attach in one file, as one `kind` of file."""

    kind: str
    #: (name, file offset) of each function probed that the file defines, by name: where its
    #: probes go. None: its address lies outside the file's loaded segments (not probed, and
    #: said so).
    offsets: tuple[tuple[str, int | None], ...]
    #: The loader's: r_state's distance from _dl_debug_state, as a u64 (0: not known).
    cookie: int = 0
    #: (name, file offset of its entry) of each function whose probes are moved past its
    #: entry (producer/discover/entrypoint.py), by name; any other's offset is its entry.
    entries: tuple[tuple[str, int], ...] = ()
    #: The functions whose probes are at an instruction the kernel single-steps.
    stepped: frozenset[str] = frozenset()

    def offset(self, name: str) -> int | None:
        return dict(self.offsets).get(name)

    def entry(self, name: str) -> int | None:
        """The file offset of the function's entry (where its offset is, unless moved)."""
        return dict(self.entries).get(name, self.offset(name))


def read_plan(path: str, kind: str, size: int, probe_only: frozenset[str] | None = None) -> Plan:
    """The plan of the file at `path` (`size` bytes) as a `kind` file, from its ELF symbols;
    `probe_only`: a runtime linked into the file, of which only these functions are probed.
    A file that cannot be read has an empty plan (attaching it then says why)."""
    if kind == "loader":
        address = elfsyms.symbol_address(path, LOADER_SYMBOL)
        offset = None if address is None else _file_offset(path, address, size)
        if address is None or offset is None:
            return Plan(kind, ())
        r_debug = elfsyms.symbol_address(path, R_DEBUG_SYMBOL)
        to_state = 0 if r_debug is None else r_debug + R_STATE_OFFSET - address
        return Plan(kind, ((LOADER_SYMBOL, offset),), to_state % _U64)
    before = _identity(path)
    extents = elfsyms.function_extents(path, PROBED[kind])
    if probe_only is not None:
        extents = {n: e for n, e in extents.items() if n in probe_only}
    entries = {name: _file_offset(path, extents[name][0], size) for name in sorted(extents)}
    # One choice per entry, so that two names of one function (an alias) share their offset
    # (probes.py probes an offset once): made with the largest size any of them states.
    sizes: dict[int, int] = {}
    vaddrs: dict[int, int] = {}
    for name, entry in entries.items():
        if entry is not None:
            sizes[entry] = max(sizes.get(entry, 0), extents[name][1])
            vaddrs[entry] = extents[name][0]
    points = entrypoint.read_points(path, sizes)
    after = _identity(path)
    if before is None or before != after or before[0] != size:
        # Rewritten in place while it was read: its bytes may be another file's.
        points = {e: entrypoint.AttachPoint(0, False, "the file changed while it was read")
                  for e in sizes}
    for entry, point in points.items():
        if point.skip and _entered_within(path, entry, point.skip, vaddrs[entry], sizes):
            points[entry] = entrypoint.AttachPoint(
                0, False, "another function starts inside the prefix a probe would skip")
    for name, entry in entries.items():
        if entry is not None and not points[entry].emulated:
            log.debug("%s: %s: its probe is single-stepped: %s", path, name, points[entry].why)
    return Plan(
        kind,
        tuple((name, None if entry is None else entry + points[entry].skip)
              for name, entry in entries.items()),
        entries=tuple((name, entry) for name, entry in entries.items()
                      if entry is not None and points[entry].skip),
        stepped=frozenset(name for name, entry in entries.items()
                          if entry is not None and not points[entry].emulated),
    )


def _identity(path: str) -> tuple[int, int, int] | None:
    """(size, mtime, ctime) of the file at `path` now, None if it cannot be asked."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _entered_within(
    path: str, entry: int, skip: int, vaddr: int, entries: Mapping[int, int]
) -> bool:
    """Whether a function other than the one at `entry` (st_value `vaddr`) starts within the
    `skip` bytes after it: a call to that one would fire the moved probe. `entries` are the
    other probed functions' (file offsets); any other function is looked up in the file."""
    if any(entry < other <= entry + skip for other in entries):
        return True
    for distance in range(1, skip + 1):
        found = elfsyms.symbol_at(path, entry + distance)
        if found is not None and found[1] != vaddr:
            return True
    return False


def _file_offset(path: str, address: int, size: int) -> int | None:
    offset = elfsyms.vaddr_to_file_offset(path, address)
    # Past the end: a segment that says it holds more than the file (never probed).
    return offset if offset is not None and 0 <= offset < size else None
