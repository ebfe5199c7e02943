"""Where a library file's probes go: its attach plan, read once from the file's symbols.

For a runtime or driver file, the file offset of each function probed (a uprobe goes at a
file offset); for the dynamic loader, _dl_debug_state's offset and the distance from it to
the loader's r_state, which the loader-change program reads (its attach cookie).

A plan depends on the file alone (and on what is probed, PROBED), so discover's Classifier
keeps it with the file's verdict (producer/verdicts.py): a later run attaches from it and
reads no ELF while the process waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from producer import elfsyms
from producer.records import (
    DRIVER_APIS,
    DRIVER_NAME_FUNCTIONS,
    RUNTIME_APIS,
    RUNTIME_NAME_FUNCTIONS,
)

__all__ = [
    "LOADER_SYMBOL",
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

#: What each kind of file (discover.Kind) is probed for: its API functions and its name
#: functions; the loader for _dl_debug_state.
PROBED: Final[Mapping[str, frozenset[str]]] = MappingProxyType({
    "runtime": RUNTIME_APIS | RUNTIME_NAME_FUNCTIONS,
    "driver": DRIVER_APIS | DRIVER_NAME_FUNCTIONS,
    "loader": frozenset({LOADER_SYMBOL}),
})


@dataclass(frozen=True, slots=True)
class Plan:
    """Where to attach in one file, as one `kind` of file."""

    kind: str
    #: (name, file offset) of each function probed that the file defines, by name; None: its
    #: address lies outside the file's loaded segments (not probed, and said so).
    offsets: tuple[tuple[str, int | None], ...]
    #: The loader's: r_state's distance from _dl_debug_state, as a u64 (0: not known).
    cookie: int = 0

    def offset(self, name: str) -> int | None:
        return dict(self.offsets).get(name)


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
    addresses = elfsyms.function_addresses(path, PROBED[kind])
    if probe_only is not None:
        addresses = {n: a for n, a in addresses.items() if n in probe_only}
    return Plan(kind, tuple((name, _file_offset(path, addresses[name], size))
                            for name in sorted(addresses)))


def _file_offset(path: str, address: int, size: int) -> int | None:
    offset = elfsyms.vaddr_to_file_offset(path, address)
    # Past the end: a segment that says it holds more than the file (never probed).
    return offset if offset is not None and 0 <= offset < size else None
