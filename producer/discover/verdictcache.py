"""What each library file was found to define, kept on disk across runs.

Classifying a file reads its ELF symbol tables: ~1 s for the ~135 files a PyTorch start-up
maps, while the process is held. The answer never changes while the file does not, so it is
kept here, keyed by the file's identity, and a later `gpuflight trace` (or a restarted node
agent) reads it back instead of the file.

    identity (st_dev as maps shows it, st_ino, st_size, st_mtime_ns, st_ctime_ns)
        ──► Stored (runtime, driver, loader, probe_only, plan, hooks)

`plan` is where the file's probes go (producer/discover/attachplan.py: the file offset of each
function probed, past its entry where the kernel would single-step that; the loader's
_dl_debug_state and its r_state cookie), so a warm start attaches without reading the file
either.

st_ctime_ns is part of the identity because no user can set it: a file rewritten in place and
given back its old size and mtime still reads as a new file.

One JSON file (orjson), `verdicts.json`:

    {"format": "gpuflight-verdicts", "version": 4, "fingerprint": "<hex>",
     "entries": [[dev, ino, size, mtime_ns, ctime_ns, used],               # defines nothing
                 [dev, ino, size, mtime_ns, ctime_ns, used, loader, runtime, driver, probe_only,
                  plan, hooks]]}

    plan: null, or [kind, {name: file offset or null, ...}, cookie,
                    {name: entry's file offset, ...} (the probes moved past their entry),
                    [name, ...] (the probes at an instruction the kernel single-steps)]

`used` is when the entry was last looked up (Unix seconds): the oldest-used go first when the
store outgrows its bound. The fingerprint names what the verdicts were computed against (the
probe table, the classifying code): a gpuflight whose fingerprint differs ignores the file.

The file is trusted only when it is a regular file owned by our effective uid and writable by
nobody else, in a folder owned by us (or root) that nobody else may write to unless it is
sticky (a planted verdict could hide a CUDA library); anything else, and anything that does
not parse exactly, is ignored with one log line: a plan naming a function that is not probed
for its kind, an offset that is not within the file's size, a cookie that is not a u64 (or
not a loader's), a probe moved to before its entry or further past it than attachplan ever
moves one, make the whole file ignored, never attached. Written atomically (a temporary file in
the same folder, then os.replace), only when something new was learned, merged with what
another gpuflight may have written meanwhile. Not thread-safe, like the Classifier it serves.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from gpuflight.producer.contract.abi import AUTOGRAD_FUNCTIONS
from gpuflight.producer.discover.attachplan import MAX_MOVE_BYTES, Plan
from gpuflight.producer.discover.cachefile import read_trusted, write_atomic

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "FILE_NAME",
    "FORMAT_VERSION",
    "Identity",
    "Stored",
    "VerdictStore",
    "Vocabulary",
    "fingerprint",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 4
FILE_NAME = "verdicts.json"
_FORMAT = "gpuflight-verdicts"
#: ~60 bytes an entry on disk (a few KB for the few files probed, with their plans): 20,000
#: files (a node running many container images) ~1.2 MB.
DEFAULT_MAX_ENTRIES = 20_000
#: A bigger file is not ours to parse (DEFAULT_MAX_ENTRIES of rich entries is far below).
_MAX_FILE_BYTES = 64 << 20
# In memory, entries may run this far past the bound before the oldest-used are dropped.
_SLACK = 1.25
_U64 = 1 << 64

Identity = tuple[int, int, int, int, int]
"""(st_dev as /proc/PID/maps shows it, st_ino, st_size, st_mtime_ns, st_ctime_ns)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """What a file defines: the fields of discover's verdict, less the identity."""

    runtime: frozenset[str]
    driver: frozenset[str]
    loader: bool | None  # None: not asked (only loader candidates are)
    probe_only: frozenset[str] | None = None
    plan: Plan | None = None
    #: The other functions code paths probe that it defines (abi.AUTOGRAD_FUNCTIONS in
    #: libtorch_cpu.so, abi.EXIT_FUNCTIONS in libc and CPython).
    hooks: frozenset[str] = frozenset()

    @property
    def is_nothing(self) -> bool:
        """Defines nothing and was not asked about the loader: the common, compact case."""
        return (
            not self.runtime and not self.driver and self.loader is None and self.plan is None
            and not self.hooks
        )

    @property
    def is_quiet(self) -> bool:
        """A dlopen that maps it needs no hold: no runtime, no driver, not a loader, not
        PyTorch's autograd engine (where a process exits is in files mapped at its start: a
        trace attaches there at its next scan)."""
        return not self.runtime and not self.driver and not self.loader and not (
            self.hooks & AUTOGRAD_FUNCTIONS)


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """The names each field may hold: a file naming anything else is not ours."""

    runtime: frozenset[str]
    driver: frozenset[str]
    probe_only: frozenset[str]
    #: By kind of file, the functions a plan may name (attachplan.PROBED); none: no plan is.
    plans: Mapping[str, frozenset[str]] = field(default_factory=dict)
    hooks: frozenset[str] = frozenset()


def fingerprint(*parts: Iterable[str] | bytes) -> str:
    """A digest of what verdicts are computed against (name sets, source code)."""
    digest = hashlib.sha256(f"{_FORMAT}/{FORMAT_VERSION}".encode())
    for part in parts:
        if isinstance(part, bytes):
            digest.update(b"\x01" + len(part).to_bytes(8, "little") + part)
        else:
            for name in sorted(part):
                digest.update(b"\x02" + name.encode() + b"\x00")
        digest.update(b"\x03")
    return digest.hexdigest()


class _InvalidError(ValueError):
    """The file is not a verdict file this gpuflight can use (the message says why)."""


class VerdictStore:
    """Verdicts by file identity, loaded from and saved to `directory`/verdicts.json.

    With `directory` None the store is off: it remembers nothing and never touches disk.
    """

    def __init__(
        self,
        directory: Path | None,
        fingerprint: str,
        vocabulary: Vocabulary,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self._clock = clock
        self.fingerprint = fingerprint
        self._vocabulary = vocabulary
        self._max_entries = max(1, max_entries)
        self._entries: dict[Identity, tuple[Stored, int]] = {}
        self._dirty = False
        self._last_save = self._clock()
        #: Lookups answered, and verdicts learned since loading (bench, logs).
        self.hits = 0
        self.learned = 0

    @classmethod
    def load(
        cls,
        directory: Path | None,
        fingerprint: str,
        vocabulary: Vocabulary,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> VerdictStore:
        """A store holding what `directory` has for this fingerprint (nothing if unusable)."""
        store = cls(directory, fingerprint, vocabulary, max_entries, clock)
        if store.path is not None:
            store._entries = store._read(store.path)
            store._trim(store._max_entries)
            log.debug("%d library verdicts read from %s", len(store._entries), store.path)
        return store

    @property
    def path(self) -> Path | None:
        return None if self.directory is None else self.directory / FILE_NAME

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    @property
    def dirty(self) -> bool:
        """Something was learned that the file does not hold yet."""
        return self._dirty

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, identity: Identity) -> Stored | None:
        """The verdict for the file with `identity`, if one was kept."""
        entry = self._entries.get(identity)
        if entry is None:
            return None
        self.hits += 1
        now = int(self._clock())
        if entry[1] != now:  # marks it used; not by itself worth a write
            self._entries[identity] = (entry[0], now)
        return entry[0]

    def quiet_files(self) -> list[tuple[int, int, int, int]]:
        """(st_dev, st_ino, st_size, st_ctime_ns) of each file kept as one nothing in it is
        probed (Stored.is_quiet): dlopens of these need no hold (Probes.add_quiet)."""
        return [(identity[0], identity[1], identity[2], identity[4])
                for identity, (verdict, _) in self._entries.items() if verdict.is_quiet]

    def put(self, identity: Identity, verdict: Stored) -> None:
        """Keep `verdict` for the file with `identity` (written by the next save)."""
        if self.directory is None:
            return
        entry = self._entries.get(identity)
        if entry is not None and entry[0] == verdict:
            return
        self._entries[identity] = (verdict, int(self._clock()))
        self._dirty = True
        self.learned += 1
        if len(self._entries) > self._max_entries * _SLACK:
            self._trim(self._max_entries)

    def save_if_dirty(self, min_interval_s: float = 0.0) -> bool:
        """Write the file if something new was learned (and `min_interval_s` has passed since
        the last write, or since the store was opened); True if written. Cheap otherwise:
        call it as often as convenient.

        Never raises: a folder that cannot be written costs the next run its head start, not
        this one its output (logged once, at info)."""
        if not self._dirty or self.path is None:
            return False
        if self._clock() - self._last_save < min_interval_s:
            return False
        assert self.directory is not None
        try:
            self._write(self.directory, self.path)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the folder's name
            log.info("library verdicts not saved to %s: %s", self.directory, exc)
            self._dirty = False  # one line, not one per save
            return False
        self._dirty = False
        self._last_save = self._clock()
        return True

    # --- disk ---------------------------------------------------------------------------------

    def _write(self, directory: Path, path: Path) -> None:
        # What another gpuflight saved meanwhile is kept too (the newer use wins).
        merged = self._read(path, quiet=True)
        for identity, entry in self._entries.items():
            other = merged.get(identity)
            if other is None or other[1] <= entry[1]:
                merged[identity] = entry
        self._entries = merged
        self._trim(self._max_entries)
        data = orjson.dumps(
            {
                "format": _FORMAT,
                "version": FORMAT_VERSION,
                "fingerprint": self.fingerprint,
                "entries": [_row(i, v, used) for i, (v, used) in self._entries.items()],
            }
        )
        write_atomic(directory, FILE_NAME, data)

    def _read(self, path: Path, quiet: bool = False) -> dict[Identity, tuple[Stored, int]]:
        try:
            data = _read_trusted(path)
            if data is None:
                return {}
            return self._parse(data)
        except (OSError, ValueError) as exc:  # ValueError: _InvalidError, orjson.JSONDecodeError
            if not quiet:
                log.info("library verdicts in %s ignored: %s", path, exc)
            return {}

    def _parse(self, data: bytes) -> dict[Identity, tuple[Stored, int]]:
        document = orjson.loads(data)
        if not isinstance(document, dict) or document.get("format") != _FORMAT:
            raise _InvalidError("not a gpuflight verdict file")
        if document.get("version") != FORMAT_VERSION:
            raise _InvalidError(f"format version {document.get('version')!r}, not {FORMAT_VERSION}")
        if document.get("fingerprint") != self.fingerprint:
            raise _InvalidError("computed by a gpuflight with another probe table or classifier")
        rows = document.get("entries")
        if not isinstance(rows, list):
            raise _InvalidError("no entry list")
        names = _Names(self._vocabulary)
        entries: dict[Identity, tuple[Stored, int]] = {}
        for row in rows:
            if not isinstance(row, list) or len(row) not in (6, 12):
                raise _InvalidError("an entry of the wrong shape")
            numbers = row[:6]
            if not all(type(n) is int and 0 <= n < _U64 for n in numbers):
                raise _InvalidError("an entry with a bad identity")
            identity: Identity = (numbers[0], numbers[1], numbers[2], numbers[3], numbers[4])
            verdict = _NOTHING if len(row) == 6 else names.verdict(row[6:], identity[2])
            entries[identity] = (verdict, numbers[5])
        return entries

    def _trim(self, bound: int) -> None:
        if len(self._entries) <= bound:
            return
        # Stable: among equally recent entries, the ones added last stay.
        kept = sorted(self._entries.items(), key=lambda item: item[1][1])[-bound:]
        self._entries = dict(kept)


_NOTHING = Stored(frozenset(), frozenset(), None, None)


def _row(identity: Identity, verdict: Stored, used: int) -> list[object]:
    if verdict.is_nothing:
        return [*identity, used]
    probe_only = None if verdict.probe_only is None else sorted(verdict.probe_only)
    plan = verdict.plan
    return [
        *identity,
        used,
        verdict.loader,
        sorted(verdict.runtime),
        sorted(verdict.driver),
        probe_only,
        None if plan is None else [plan.kind, dict(plan.offsets), plan.cookie,
                                   dict(plan.entries), sorted(plan.stepped)],
        sorted(verdict.hooks),
    ]


class _Names:
    """Checks an entry's names against the vocabulary, sharing one string per name."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self._runtime = {n: n for n in vocabulary.runtime}
        self._driver = {n: n for n in vocabulary.driver}
        self._probe_only = {n: n for n in vocabulary.probe_only}
        self._hooks = {n: n for n in vocabulary.hooks}
        self._plans = {kind: {n: n for n in names} for kind, names in vocabulary.plans.items()}

    def verdict(self, fields: list[object], size: int) -> Stored:
        loader, runtime, driver, probe_only, plan, hooks = fields
        if loader is not None and type(loader) is not bool:
            raise _InvalidError("an entry with a bad loader flag")
        return Stored(
            _names(runtime, self._runtime),
            _names(driver, self._driver),
            loader,
            None if probe_only is None else _names(probe_only, self._probe_only),
            None if plan is None else self.plan(plan, size),
            _names(hooks, self._hooks),
        )

    def plan(self, value: object, size: int) -> Plan:
        """An attach plan for a file of `size` bytes: every name probed for its kind, every
        offset within the file, the cookie a u64 and only a loader's; a moved probe a little
        past its function's entry, a stepped one a function the plan probes."""
        if not isinstance(value, list) or len(value) != 5:
            raise _InvalidError("an entry with a bad attach plan")
        kind, offsets, cookie, moved, stepped = value
        known = self._plans.get(kind) if type(kind) is str else None
        if known is None or not isinstance(offsets, dict) or not isinstance(moved, dict):
            raise _InvalidError("an entry with a bad attach plan")
        if type(cookie) is not int or not 0 <= cookie < _U64 or (cookie and kind != "loader"):
            raise _InvalidError("an entry with a bad attach cookie")
        try:
            pairs = tuple(sorted((known[name], offset) for name, offset in offsets.items()))
        except KeyError:
            raise _InvalidError("an attach plan naming a function that is not probed") from None
        for _, offset in pairs:
            if offset is not None and not (type(offset) is int and 0 <= offset < size):
                raise _InvalidError("an attach plan with an offset outside the file")
        at = dict(pairs)
        entries = []
        for name, entry in sorted(moved.items()):
            offset = at.get(name)
            if offset is None or type(entry) is not int or not (
                    0 <= entry < offset <= entry + MAX_MOVE_BYTES):
                raise _InvalidError("an attach plan moving a probe where it never goes")
            entries.append((known[name], entry))
        names = _names(stepped, known)
        if not names <= at.keys():
            raise _InvalidError("an attach plan stepping a function it does not probe")
        return Plan(kind, pairs, cookie, tuple(entries), names)


def _names(value: object, known: dict[str, str]) -> frozenset[str]:
    if not isinstance(value, list):
        raise _InvalidError("an entry with a bad name list")
    try:
        return frozenset(known[name] for name in value)
    except (KeyError, TypeError):
        raise _InvalidError("an entry naming a function that is not probed") from None


def _read_trusted(path: Path) -> bytes | None:
    """The file's bytes if it is ours alone to write; None if there is none (raises
    UntrustedError, a ValueError, when there is one we must not trust)."""
    return read_trusted(path, _MAX_FILE_BYTES, "a verdict file")
