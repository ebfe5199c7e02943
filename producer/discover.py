"""Which CUDA runtime and driver files and dynamic loaders the processes of a node have mapped.

Pure: reads a /proc tree (any root, so tests use fake ones) and ELF files; imports no bcc.

    /proc/PID/maps ──► executable file mappings, keyed by (dev, inode)
                   ──► one LibraryFile per key, classified once (Classifier remembers it)
                   ──► Snapshot: {key → file}, {key → pids}, {pid → keys}

Each file is reached through a path that opens it from the agent's own mount namespace
(/proc/PID/root/..., else /proc/PID/map_files/...), so files inside containers, private mount
namespaces and deleted files are found too, and each is probed once however many processes
map it.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from producer import attachplan, elfsyms, verdicts
from producer.records import API_IDS, DRIVER_APIS, RUNTIME_APIS, RUNTIME_NAME_FUNCTIONS

__all__ = [
    "DRIVER_API_NAMES",
    "DRIVER_SYMBOLS",
    "LOADER_SYMBOL",
    "RUNTIME_API_NAMES",
    "RUNTIME_SYMBOLS",
    "Classifier",
    "Kind",
    "LibraryFile",
    "LibraryKey",
    "Snapshot",
    "open_verdict_store",
    "ppid",
    "process_tree",
    "scan",
    "scan_pid",
    "verdict_fingerprint",
]

# Every GF_API_<name> of bpf/events.h, in its order, by layer: the mirror in
# producer/records.py (tests/test_records.py checks it against the header).
RUNTIME_API_NAMES: tuple[str, ...] = tuple(name for name in API_IDS if name in RUNTIME_APIS)
RUNTIME_SYMBOLS: frozenset[str] = frozenset(RUNTIME_API_NAMES)
DRIVER_API_NAMES: tuple[str, ...] = tuple(name for name in API_IDS if name in DRIVER_APIS)
DRIVER_SYMBOLS: frozenset[str] = frozenset(DRIVER_API_NAMES)
# One read of a file answers both questions.
_CLASSIFYING_SYMBOLS = RUNTIME_SYMBOLS | DRIVER_SYMBOLS
# What a runtime linked into another file is probed for, if its code calls it.
_REFERENCED_SYMBOLS = RUNTIME_SYMBOLS | RUNTIME_NAME_FUNCTIONS
# A file whose .dynsym imports one of these links the CUDA runtime dynamically, so it holds
# no static copy: its .symtab (where only a static runtime's local functions would be) is
# not read. libtorch_cuda.so imports 22 of them; its .symtab pass was 0.23 s of a 0.27 s
# dlopen, libtorch_cpu.so's (it imports cudaDeviceSynchronize) 0.19 s.
#
# Why that is sound: a static runtime (libcudart_static.a, linked into NCCL and NVSHMEM)
# defines every one of these functions, and the static linker resolves each reference in
# the file against that copy, so none is left undefined. Only runtime functions count:
# a static runtime may import the driver's (cu*: a library linked with -lcuda), so an
# import of a driver function says nothing. Not covered (a limit, see README): a file
# that imports some runtime functions while a hand-made partial copy of the runtime
# defines others locally — a build mixing two runtimes, which NVIDIA's never does.
# The driver is never linked statically (libcuda.so.1 exports its API in .dynsym), so
# skipping .symtab loses no driver function either.
_DYNAMIC_RUNTIME_MARKERS = RUNTIME_SYMBOLS

# The loader calls this empty function after every change to its link map (dlopen, start-up).
LOADER_SYMBOL = attachplan.LOADER_SYMBOL
_LOADER_SYMBOLS = frozenset({LOADER_SYMBOL})

LibraryKey = tuple[int, int]
"""(st_dev, st_ino) of a file, as /proc/PID/maps shows them."""

Kind = Literal["runtime", "driver", "loader"]

# How many processes mapping a file are tried for a path to it, before the file is skipped
# for this scan: when the first few fail, the rest will fail the same way.
_MAX_HOLDERS_TRIED = 4

_DELETED = " (deleted)"

# The tail of an executable, file-backed line of /proc/PID/maps, from the 'x' of its perms:
# "start-end r-xp offset major:minor inode   /path". Starting at a literal lets the regex
# engine skip ahead instead of trying every position (three times faster than anchoring at
# line starts). Pseudo-files ([vdso], [heap]) and anonymous mappings have no '/' path.
_EXEC_TAIL = re.compile(r"x[ps] [0-9a-f]+ ([0-9a-f]+:[0-9a-f]+) ([0-9]+) +(/[^\n]*)")


@dataclass(frozen=True)
class LibraryFile:
    """One library file, as the agent probes it: once, for every process that maps it."""

    key: LibraryKey
    path: str  # as the process whose host_path this is sees it (containers see other paths)
    host_path: str  # opens the same file from the agent's mount namespace
    kind: Kind
    # the RUNTIME_SYMBOLS (DRIVER_SYMBOLS, LOADER_SYMBOL) it defines
    symbols: frozenset[str] = frozenset()
    #: A runtime linked statically into the file (NCCL, NVSHMEM): the runtime functions its
    #: own code calls, the only ones worth probing. None: every function it defines.
    probe_only: frozenset[str] | None = None
    #: Where its probes go (file offsets), kept across runs with its verdict.
    plan: attachplan.Plan | None = None


@dataclass(frozen=True)
class Snapshot:
    """The library files mapped on a node (or by some processes) at one moment."""

    libraries: Mapping[LibraryKey, LibraryFile]
    pids_by_library: Mapping[LibraryKey, frozenset[int]]
    libraries_by_pid: Mapping[int, frozenset[LibraryKey]]  # every pid read, even if empty
    errors: frozenset[int]  # pids that vanished or could not be read during the scan
    #: (pid, file) → (start, end) of the file's first executable mapping in that process.
    text_ranges: Mapping[tuple[int, LibraryKey], tuple[int, int]] = field(
        default_factory=lambda: MappingProxyType({})
    )


# The first executable mapping of one file in one process, as maps shows it:
# ("start-end", the path maybe ending in " (deleted)"). A plain tuple: a scan makes one per
# file per process, 100,000 on a busy node, and a NamedTuple costs twice as much to build.
_Line = tuple[str, str]


def _path_of(line: _Line) -> str:
    path = line[1].removesuffix(_DELETED)
    # The kernel writes a newline in a file name as \012.
    return path.replace("\\012", "\n") if "\\012" in path else path


def _is_deleted(line: _Line) -> bool:
    return line[1].endswith(_DELETED)


def _map_files_name(line: _Line) -> str:
    # maps pads addresses to 8 digits; map_files names them without padding.
    start, _, end = line[0].partition("-")
    return f"{start.lstrip('0') or '0'}-{end.lstrip('0') or '0'}"


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What a file defines, and the size, mtime and ctime it had when that was read."""

    identity: tuple[int, int, int]
    runtime: frozenset[str]
    driver: frozenset[str]
    loader: bool | None  # None: not asked yet (only loader candidates are)
    probe_only: frozenset[str] | None = None  # see LibraryFile.probe_only
    plan: attachplan.Plan | None = None  # see LibraryFile.plan


@dataclass(frozen=True, slots=True)
class _Located:
    """A path to a file that was checked to be the mapped one, and what stat said of it."""

    mapping: _Line
    host_path: str
    stat: os.stat_result


class Classifier:
    """Remembers what each library file is across scans, so a file is read once.

    Pass the same Classifier to every scan. A file is read again only when its size, mtime
    or ctime changes; a full scan forgets the files no process maps any more. With a `store`
    (open_verdict_store), what was learned of a file outlives the Classifier: a file another
    run classified is not read again (save the store to keep what this one learns).
    Not thread-safe: use one per thread.
    """

    def __init__(
        self, max_entries: int = 65536, store: verdicts.VerdictStore | None = None
    ) -> None:
        self._max_entries = max_entries
        self.store = store
        self._verdicts: dict[LibraryKey, _Verdict] = {}
        # The process whose path to a file was used last, tried first so host_path is stable.
        self._host_pids: dict[LibraryKey, int] = {}
        # Files found to hold nothing probed since take_quiet last ran: (st_dev, st_ino,
        # st_size, st_ctime_ns) as stat gives them through the process's path (an overlayfs
        # file's as the process opens it, which maps does not show).
        self._quiet_new: list[tuple[int, int, int, int]] = []

    def __len__(self) -> int:
        return len(self._verdicts)

    def take_quiet(self) -> list[tuple[int, int, int, int]]:
        """The files classified (or recalled) since the last call that hold nothing probed:
        no runtime, no driver, not a loader."""
        quiet, self._quiet_new = self._quiet_new, []
        return quiet

    def _library(
        self,
        proc_root: str,
        key: LibraryKey,
        holders: Mapping[int, _Line],
        loader_candidate: bool,
    ) -> LibraryFile | None:
        """The LibraryFile for `key`, mapped by `holders` (pid → mapping), or None if no kind."""
        located = self._locate(proc_root, key, holders)
        if located is None:
            return None
        verdict = self._verdict(key, located, loader_candidate)
        if loader_candidate and verdict.loader:
            kind: Kind = "loader"
            symbols = _LOADER_SYMBOLS
        elif verdict.runtime:
            kind, symbols = "runtime", verdict.runtime
        elif verdict.driver:
            kind, symbols = "driver", verdict.driver
        else:
            return None
        probe_only = verdict.probe_only if kind == "runtime" else None
        if verdict.plan is None or verdict.plan.kind != kind:
            verdict = self._plan(key, located, verdict, kind, probe_only)
        return LibraryFile(
            key, _path_of(located.mapping), located.host_path, kind, symbols, probe_only,
            verdict.plan,
        )

    def _plan(
        self,
        key: LibraryKey,
        located: _Located,
        verdict: _Verdict,
        kind: Kind,
        probe_only: frozenset[str] | None,
    ) -> _Verdict:
        """`verdict` with the file's attach plan as a `kind` file, read now (and kept)."""
        plan = attachplan.read_plan(located.host_path, kind, located.stat.st_size, probe_only)
        verdict = replace(verdict, plan=plan)
        if not _readable(located.host_path):
            # Gone (or out of reach) since the stat: nothing is known of where to attach, so
            # nothing is remembered; the next process that maps the file tells.
            return verdict
        self._remember(key, verdict)
        if self.store is not None and self.store.enabled:
            self.store.put((*key, *verdict.identity), _stored(verdict))
        return verdict

    def _forget_all_but(self, keys: Iterable[LibraryKey]) -> None:
        """Drop what is known about every file not in `keys`."""
        live = set(keys)
        self._verdicts = {k: v for k, v in self._verdicts.items() if k in live}
        self._host_pids = {k: p for k, p in self._host_pids.items() if k in live}

    def _locate(
        self, proc_root: str, key: LibraryKey, holders: Mapping[int, _Line]
    ) -> _Located | None:
        previous = self._host_pids.get(key)
        first = [previous] if previous is not None and previous in holders else []
        others = (pid for pid in holders if pid != previous)
        for pid in itertools.islice(itertools.chain(first, others), _MAX_HOLDERS_TRIED):
            located = _locate_in(proc_root, pid, key, holders[pid])
            if located is not None:
                self._host_pids[key] = pid
                return located
        return None

    def _verdict(self, key: LibraryKey, located: _Located, loader_candidate: bool) -> _Verdict:
        st = located.stat
        identity = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        verdict = self._verdicts.get(key)
        learned = False
        fresh = verdict is None or verdict.identity != identity
        if fresh:
            verdict = self._recall(key, identity)
        if verdict is None:
            learned = True
            found = elfsyms.defined_functions(
                located.host_path, _CLASSIFYING_SYMBOLS, _DYNAMIC_RUNTIME_MARKERS
            )
            runtime = found & RUNTIME_SYMBOLS
            # Read only for a runtime: the rare file, and the code search costs a pass over
            # its executable sections.
            probe_only = (
                elfsyms.referenced_functions(located.host_path, _REFERENCED_SYMBOLS)
                if runtime
                else None
            )
            verdict = _Verdict(identity, runtime, found & DRIVER_SYMBOLS, None, probe_only)
            if not found and not os.path.exists(located.host_path):
                # Its process went away between the stat and the read: nothing is known of
                # the file, so nothing is remembered (the next process that maps it tells).
                return verdict
        if loader_candidate and verdict.loader is None:
            learned = True
            defined = elfsyms.defined_functions(located.host_path, _LOADER_SYMBOLS)
            verdict = replace(verdict, loader=LOADER_SYMBOL in defined)
        self._remember(key, verdict)
        # A file that could not be opened (gone, EACCES, out of descriptors) read as defining
        # nothing: true for now, not worth keeping for the next run, nor quiet.
        sure = not learned or _readable(located.host_path)
        if sure and (fresh or learned) and not verdict.runtime and not verdict.driver \
                and not verdict.loader:
            self._quiet_new.append((st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns))
        store = self.store
        if learned and sure and store is not None and store.enabled:
            store.put((*key, *identity), _stored(verdict))
        return verdict

    def _recall(self, key: LibraryKey, identity: tuple[int, int, int]) -> _Verdict | None:
        """The verdict the store kept for this very file, if any."""
        if self.store is None:
            return None
        kept = self.store.get((*key, *identity))
        if kept is None:
            return None
        return _Verdict(
            identity, kept.runtime, kept.driver, kept.loader, kept.probe_only, kept.plan
        )

    def _remember(self, key: LibraryKey, verdict: _Verdict) -> None:
        self._verdicts[key] = verdict
        if len(self._verdicts) > self._max_entries:
            oldest = next(iter(self._verdicts))
            del self._verdicts[oldest]
            self._host_pids.pop(oldest, None)


def _stored(verdict: _Verdict) -> verdicts.Stored:
    return verdicts.Stored(
        verdict.runtime, verdict.driver, verdict.loader, verdict.probe_only, verdict.plan
    )


def _readable(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except (OSError, ValueError):
        return False
    return True


def verdict_fingerprint() -> str:
    """What a stored verdict was computed against: the names classified and probed, and the
    code that reads them (this module, elfsyms and attachplan; a change to any makes the old
    verdicts stale, which costs one slower start, never a wrong one)."""
    sources: list[bytes] = []
    for module in (elfsyms, attachplan, sys.modules[__name__]):
        try:
            sources.append(Path(module.__file__ or "").read_bytes())
        except OSError:  # no source shipped: the package version stands for it
            sources.append(_distribution_version().encode())
    return verdicts.fingerprint(
        RUNTIME_SYMBOLS, DRIVER_SYMBOLS, _REFERENCED_SYMBOLS, _LOADER_SYMBOLS,
        *(attachplan.PROBED[kind] for kind in sorted(attachplan.PROBED)), *sources
    )


def _distribution_version() -> str:
    import importlib.metadata  # ~5 ms, and only where no source is shipped

    try:
        return importlib.metadata.version("gpuflight")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def open_verdict_store(
    directory: Path | None,
    max_entries: int = verdicts.DEFAULT_MAX_ENTRIES,
    clock: Callable[[], float] = time.time,
) -> verdicts.VerdictStore:
    """The verdicts kept in `directory` (CaptureSettings.verdict_cache_dir) for a Classifier;
    None: a store that is off (remembers nothing, never touches disk). Never raises."""
    vocabulary = verdicts.Vocabulary(
        RUNTIME_SYMBOLS, DRIVER_SYMBOLS, _REFERENCED_SYMBOLS, attachplan.PROBED
    )
    fingerprint = verdict_fingerprint() if directory is not None else ""
    return verdicts.VerdictStore.load(directory, fingerprint, vocabulary, max_entries, clock)


def scan(
    proc_root: Path = Path("/proc"),
    pids: Iterable[int] | None = None,
    cache: Classifier | None = None,
) -> Snapshot:
    """The runtime and loader files mapped by every process in `proc_root` (or by `pids`).

    Pass one Classifier to every scan so that files are read once, not once per scan.
    """
    root = os.fspath(proc_root)
    classifier = Classifier() if cache is None else cache
    targets = _list_pids(root) if pids is None else sorted(set(pids))
    return _snapshot(root, targets, classifier, forget_others=pids is None)


def loader_of(proc_root: Path, pid: int, cache: Classifier | None = None) -> LibraryFile | None:
    """The dynamic loader `pid` maps, or None (gone, static, none found): its other files are
    not looked at (~10 ms for gpuflight's own ~60, at each start)."""
    root = os.fspath(proc_root)
    mappings = _read_exec_mappings(root, pid)
    if mappings is None:
        return None
    classifier = Classifier() if cache is None else cache
    for key in sorted(_loader_keys(root, pid, mappings)):
        library = classifier._library(root, key, {pid: mappings[key]}, True)
        if library is not None and library.kind == "loader":
            return library
    return None


def scan_pid(proc_root: Path, pid: int, cache: Classifier | None = None) -> Snapshot:
    """Rescan one process, e.g. after the loader probe reports that its link map changed."""
    return scan(proc_root, (pid,), cache)


def ppid(proc_root: Path, pid: int) -> int | None:
    """The parent of `pid` from /proc/PID/stat, or None if it cannot be read."""
    try:
        with open(f"{os.fspath(proc_root)}/{pid}/stat", "rb") as f:
            text = f.read()
        # comm (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
        return int(text[text.rindex(b")") + 2 :].split(maxsplit=2)[1])
    except (OSError, ValueError, IndexError):
        return None


def process_tree(proc_root: Path, root_pid: int) -> set[int]:
    """`root_pid` and every process descending from it (empty if `root_pid` does not exist)."""
    children: dict[int, list[int]] = {}
    for pid in _list_pids(os.fspath(proc_root)):
        parent = ppid(proc_root, pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    if ppid(proc_root, root_pid) is None:
        return set()
    tree, todo = {root_pid}, [root_pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


# --- scanning ------------------------------------------------------------------------------


def _snapshot(
    proc_root: str, pids: Iterable[int], classifier: Classifier, forget_others: bool
) -> Snapshot:
    maps_by_pid: dict[int, dict[LibraryKey, _Line]] = {}
    errors: set[int] = set()
    for pid in pids:
        mappings = _read_exec_mappings(proc_root, pid)
        if mappings is None:
            errors.add(pid)
        else:
            maps_by_pid[pid] = mappings
    holders = _holders_by_key(maps_by_pid)
    if forget_others:  # a full scan: what no process maps now is not worth remembering
        classifier._forget_all_but(holders)
    loader_keys = _loader_candidates(proc_root, maps_by_pid)
    libraries: dict[LibraryKey, LibraryFile] = {}
    for key, by_pid in holders.items():
        library = classifier._library(proc_root, key, by_pid, key in loader_keys)
        if library is not None:
            libraries[key] = library
    return _assemble(libraries, holders, maps_by_pid, errors)


def _assemble(
    libraries: dict[LibraryKey, LibraryFile],
    holders: Mapping[LibraryKey, Mapping[int, _Line]],
    scanned: Iterable[int],
    errors: set[int],
) -> Snapshot:
    pids_by_library = {key: frozenset(holders[key]) for key in libraries}
    keys_by_pid: dict[int, list[LibraryKey]] = {pid: [] for pid in scanned}
    text_ranges: dict[tuple[int, LibraryKey], tuple[int, int]] = {}
    for key, pids in pids_by_library.items():
        for pid in pids:
            keys_by_pid[pid].append(key)
            if libraries[key].kind != "loader":
                text_ranges[(pid, key)] = _address_range(holders[key][pid])
    return Snapshot(
        libraries=MappingProxyType(libraries),
        pids_by_library=MappingProxyType(pids_by_library),
        libraries_by_pid=MappingProxyType({p: frozenset(k) for p, k in keys_by_pid.items()}),
        errors=frozenset(errors),
        text_ranges=MappingProxyType(text_ranges),
    )


def _address_range(line: _Line) -> tuple[int, int]:
    start, _, end = line[0].partition("-")
    return int(start, 16), int(end, 16)


def _list_pids(proc_root: str) -> list[int]:
    return sorted(int(name) for name in os.listdir(proc_root) if name.isdigit())


def _read_exec_mappings(proc_root: str, pid: int) -> dict[LibraryKey, _Line] | None:
    """The process's executable file mappings, or None if it vanished or cannot be read."""
    try:
        with open(f"{proc_root}/{pid}/maps", "rb") as f:
            data = f.read()
    except OSError:  # exited (ENOENT, ESRCH) or not ours to read (EACCES): both are normal
        return None
    return _exec_mappings(data.decode("utf-8", "surrogateescape"))


def _exec_mappings(maps: str) -> dict[LibraryKey, _Line]:
    """The first executable mapping of each file in a /proc/PID/maps text."""
    found: dict[LibraryKey, _Line] = {}
    for match in _EXEC_TAIL.finditer(maps):
        device, inode, shown = match.groups()
        key = (_device(device), int(inode))
        if key not in found and key[1] != 0:
            x = match.start()
            # "start-end r-x": the addresses end three characters before the 'x'.
            found[key] = (maps[maps.rfind("\n", 0, x) + 1 : x - 3], shown)
    return found


@lru_cache(maxsize=1024)
def _device(device: str) -> int:
    """st_dev from the hex major:minor that maps shows ("fd:01")."""
    major, _, minor = device.partition(":")
    return os.makedev(int(major, 16), int(minor, 16))


def _holders_by_key(
    maps_by_pid: Mapping[int, Mapping[LibraryKey, _Line]],
) -> dict[LibraryKey, dict[int, _Line]]:
    holders: dict[LibraryKey, dict[int, _Line]] = {}
    for pid, mappings in maps_by_pid.items():
        for key, mapping in mappings.items():
            holders.setdefault(key, {})[pid] = mapping
    return holders


def _loader_candidates(
    proc_root: str, maps_by_pid: Mapping[int, Mapping[LibraryKey, _Line]]
) -> set[LibraryKey]:
    candidates: set[LibraryKey] = set()
    for pid, mappings in maps_by_pid.items():
        candidates |= _loader_keys(proc_root, pid, mappings)
    return candidates


def _loader_keys(proc_root: str, pid: int, mappings: Mapping[LibraryKey, _Line]) -> set[LibraryKey]:
    """The files that may be this process's dynamic loader: named like one, or its PT_INTERP."""
    named = {key for key, m in mappings.items() if "/ld-" in m[1] and _is_loader_name(_path_of(m))}
    if named:
        return named
    # Only now read the executable: most processes have a loader named ld-*.so*.
    interp = elfsyms.interpreter(f"{proc_root}/{pid}/exe")
    if interp is None:
        return set()
    same_path = {key for key, m in mappings.items() if _path_of(m) == interp}
    if same_path:
        return same_path
    # PT_INTERP often names a symlink (/lib64/ld-linux-x86-64.so.2): compare inodes.
    try:
        inode = os.stat(f"{proc_root}/{pid}/root{interp}").st_ino
    except OSError:
        return set()
    return {key for key in mappings if key[1] == inode}


def _is_loader_name(path: str) -> bool:
    """ld-*.so* (ld-linux-x86-64.so.2, ld-2.31.so, ld-musl-x86_64.so.1)."""
    name = path.rsplit("/", 1)[-1]
    return name.startswith("ld-") and ".so" in name[3:]


def _locate_in(proc_root: str, pid: int, key: LibraryKey, mapping: _Line) -> _Located | None:
    """A path from which the agent opens the file `pid` maps, checked against its inode."""
    if not _is_deleted(mapping):
        through_root = f"{proc_root}/{pid}/root{_path_of(mapping)}"
        st = _stat(through_root)
        # Only the inode is compared: through overlayfs st_dev is the overlay's, not the
        # underlying file system's that maps shows.
        if st is not None and st.st_ino == key[1]:
            return _Located(mapping, through_root, st)
    # The kernel's own link to the mapped file: right by construction, even once deleted.
    through_map = f"{proc_root}/{pid}/map_files/{_map_files_name(mapping)}"
    st = _stat(through_map)
    if st is not None:
        return _Located(mapping, through_map, st)
    return None


def _stat(path: str) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None
