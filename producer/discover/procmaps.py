"""Which CUDA runtime and driver files and dynamic loaders the processes of a node have mapped.

Pure: reads a /proc tree (any root, so tests use fake ones) and ELF files; imports no bcc.

    /proc/PID/maps ──► executable file mappings, keyed by (dev, inode)
                   ──► one LibraryFile per key, classified once (Classifier remembers it)
                   ──► Snapshot: {key → file}, {key → pids}, {pid → keys}

Each file is opened once, through a path from the agent's own mount namespace
(/proc/PID/root/..., else /proc/PID/map_files/...), so files inside containers, private mount
namespaces and deleted files are found too, and each is probed once however many processes
map it. The descriptor is checked to be the very file the process maps (its device and inode
as /proc/PID/maps shows them); from then on the file is classified, planned and attached only
through that descriptor (/proc/self/fd/N), never through a path again: a path runs through
directories other users control, which they can swap between two uses of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os
import re
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from gpuflight.producer.contract.abi import (
    API_IDS,
    AUTOGRAD_FUNCTIONS,
    DRIVER_APIS,
    EXIT_FUNCTIONS,
    RUNTIME_APIS,
    RUNTIME_NAME_FUNCTIONS,
)
from gpuflight.producer.discover import attachplan, elfsyms, entrypoint, verdictcache

__all__ = [
    "AUTOGRAD_SYMBOLS",
    "DRIVER_API_NAMES",
    "DRIVER_SYMBOLS",
    "EXIT_SYMBOLS",
    "HOOK_KINDS",
    "LOADER_SYMBOL",
    "RUNTIME_API_NAMES",
    "RUNTIME_SYMBOLS",
    "Classifier",
    "Kind",
    "LibraryFile",
    "LibraryKey",
    "OpenFile",
    "Snapshot",
    "open_verdict_store",
    "ppid",
    "process_tree",
    "scan",
    "scan_pid",
    "verdict_fingerprint",
]

# Every GF_API_<name> of bpf/events.h, in its order, by layer: the mirror in
# producer/contract/abi.py (tests/unit/producer/contract/test_abi.py checks it against the header).
RUNTIME_API_NAMES: tuple[str, ...] = tuple(name for name in API_IDS if name in RUNTIME_APIS)
RUNTIME_SYMBOLS: frozenset[str] = frozenset(RUNTIME_API_NAMES)
DRIVER_API_NAMES: tuple[str, ...] = tuple(name for name in API_IDS if name in DRIVER_APIS)
DRIVER_SYMBOLS: frozenset[str] = frozenset(DRIVER_API_NAMES)
# The hooks of code paths: PyTorch's autograd engine (libtorch_cpu.so), where a backward pass
# starts; where a Python process exits (libc, CPython), held there by `trace` until its new
# stacks are read.
AUTOGRAD_SYMBOLS: frozenset[str] = AUTOGRAD_FUNCTIONS
EXIT_SYMBOLS: frozenset[str] = EXIT_FUNCTIONS
_HOOK_SYMBOLS = AUTOGRAD_SYMBOLS | EXIT_SYMBOLS
# One read of a file answers every question.
_CLASSIFYING_SYMBOLS = RUNTIME_SYMBOLS | DRIVER_SYMBOLS | _HOOK_SYMBOLS
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
# import of a driver function says nothing. Not covered (a limit, see docs/limits.md): a file
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

Kind = Literal["runtime", "driver", "loader", "autograd", "exit"]
#: The kinds of file that are probed for code paths alone (Classifier's `hooks`), by what they
#: define.
HOOK_KINDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {"autograd": AUTOGRAD_SYMBOLS, "exit": EXIT_SYMBOLS})

# How many processes mapping a file are tried for a path to it, before the file is skipped
# for this scan: when the first few fail, the rest will fail the same way.
_MAX_HOLDERS_TRIED = 4

_DELETED = " (deleted)"

# The tail of an executable, file-backed line of /proc/PID/maps, from the 'x' of its perms:
# "start-end r-xp offset major:minor inode   /path". Starting at a literal lets the regex
# engine skip ahead instead of trying every position (three times faster than anchoring at
# line starts). Pseudo-files ([vdso], [heap]) and anonymous mappings have no '/' path.
_EXEC_TAIL = re.compile(r"x[ps] [0-9a-f]+ ([0-9a-f]+:[0-9a-f]+) ([0-9]+) +(/[^\n]*)")


class OpenFile:
    """A library file open for reading, checked to be the file a process maps.

    Everything done with the file after the check (its ELF read, its plan, its probes) goes
    through this descriptor, as /proc/self/fd/N: the kernel resolves that to the open file
    itself, whatever happens meanwhile to the directories of any path to it. The descriptor
    is closed by `close`, or when the last reference goes (a LibraryFile that holds it is
    dropped: a probed file's lives as long as its probes are kept).
    """

    __slots__ = ("__weakref__", "_closed", "_finalizer", "_lock", "fd", "origin", "stat")

    def __init__(self, fd: int, st: os.stat_result, origin: str) -> None:
        self.fd = fd
        self.stat = st
        #: The path it was opened through (for logs: never opened again).
        self.origin = origin
        self._lock = threading.Lock()
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_quietly, fd)

    @property
    def closed(self) -> bool:
        return self._closed

    @contextlib.contextmanager
    def reading(self) -> Iterator[str]:
        """A path to this very file, valid inside the block (it is not closed meanwhile).
        OSError(EBADF) if it was closed."""
        with self._lock:
            if self._closed:
                raise OSError(9, f"{self.origin}: closed")  # EBADF
            yield f"{SELF_FD}/{self.fd}"

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._finalizer()

    def __repr__(self) -> str:
        return f"OpenFile(fd={self.fd}, origin={self.origin!r}, closed={self._closed})"


#: Where this process's own descriptors are named (the real /proc: a fake tree given as
#: proc_root holds other processes', never ours).
SELF_FD = "/proc/self/fd"


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


@dataclass(frozen=True)
class LibraryFile:
    """One library file, as the agent probes it: once, for every process that maps it."""

    key: LibraryKey
    path: str  # as the process whose host_path this is sees it (containers see other paths)
    host_path: str  # where it was opened from the agent's mount namespace (for logs)
    kind: Kind
    # the RUNTIME_SYMBOLS (DRIVER_SYMBOLS, LOADER_SYMBOL) it defines
    symbols: frozenset[str] = frozenset()
    #: A runtime linked statically into the file (NCCL, NVSHMEM): the runtime functions its
    #: own code calls, the only ones worth probing. None: every function it defines.
    probe_only: frozenset[str] | None = None
    #: Where its probes go (file offsets), kept across runs with its verdict.
    plan: attachplan.Plan | None = None
    #: The file itself, open: what it was classified and planned from, and what its probes
    #: are attached through. None for a LibraryFile made by hand (tests): then `reading`
    #: opens host_path once.
    source: OpenFile | None = field(default=None, compare=False, repr=False)

    @contextlib.contextmanager
    def reading(self) -> Iterator[str]:
        """A path to the file that stays the same file inside the block (/proc/self/fd/N).
        OSError if it cannot be had (a LibraryFile without a source whose host_path no
        longer opens to a regular file)."""
        if self.source is not None:
            with self.source.reading() as path:
                yield path
            return
        opened = _open_regular(self.host_path)
        if opened is None:
            raise OSError(2, f"{self.host_path}: not an openable regular file")  # ENOENT
        try:
            with opened.reading() as path:
                yield path
        finally:
            opened.close()


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
    hooks: frozenset[str] = frozenset()  # the _HOOK_SYMBOLS it defines


@dataclass(frozen=True, slots=True)
class _Located:
    """A file open, checked to be the mapped one, and what fstat said of it."""

    mapping: _Line
    opened: OpenFile

    @property
    def host_path(self) -> str:
        return self.opened.origin

    @property
    def stat(self) -> os.stat_result:
        return self.opened.stat


class Classifier:
    """Remembers what each library file is across scans, so a file is read once.

    Pass the same Classifier to every scan. A file is read again only when its size, mtime
    or ctime changes; a full scan forgets the files no process maps any more. With a `store`
    (open_verdict_store), what was learned of a file outlives the Classifier: a file another
    run classified is not read again (save the store to keep what this one learns).
    Not thread-safe: use one per thread.

    `hooks`: the HOOK_KINDS wanted (code paths): a file that is no CUDA runtime or driver
    and defines PyTorch's autograd engine is an "autograd" file, one that defines where a
    process exits an "exit" file, each only if wanted; else such a file is none.
    """

    def __init__(
        self,
        max_entries: int = 65536,
        store: verdictcache.VerdictStore | None = None,
        hooks: frozenset[str] = frozenset(),
    ) -> None:
        self._max_entries = max_entries
        self.store = store
        self.hooks = hooks
        self._verdicts: dict[LibraryKey, _Verdict] = {}
        # The process whose path to a file was used last, tried first so host_path is stable.
        self._host_pids: dict[LibraryKey, int] = {}
        # Files found to hold nothing probed since take_quiet last ran: (st_dev, st_ino,
        # st_size, st_ctime_ns) as stat gives them through the process's path (an overlayfs
        # file's as the process opens it, which maps does not show).
        self._quiet_new: list[tuple[int, int, int, int]] = []
        # Files whose fstat device differs from the one maps shows (overlayfs, btrfs), once
        # checked to be the mapped file: (st_dev, st_ino, st_ctime_ns) → the maps key. The
        # same inode (its ctime cannot be set) needs no second check.
        self._checked: dict[tuple[int, int, int], LibraryKey] = {}

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
        keep = False
        try:
            with located.opened.reading() as path:
                verdict = self._verdict(key, located, path, loader_candidate)
                if loader_candidate and verdict.loader:
                    kind: Kind = "loader"
                    symbols = _LOADER_SYMBOLS
                elif verdict.runtime:
                    kind, symbols = "runtime", verdict.runtime
                elif verdict.driver:
                    kind, symbols = "driver", verdict.driver
                else:
                    hook = next((k for k in ("autograd", "exit") if k in self.hooks
                                 and verdict.hooks & HOOK_KINDS[k]), None)
                    if hook is None:
                        return None
                    kind = "autograd" if hook == "autograd" else "exit"
                    symbols = verdict.hooks & HOOK_KINDS[hook]
                probe_only = verdict.probe_only if kind == "runtime" else None
                if verdict.plan is None or verdict.plan.kind != kind:
                    verdict = self._plan(key, located, path, verdict, kind=kind,
                                         probe_only=probe_only)
            keep = True
            return LibraryFile(
                key, _path_of(located.mapping), located.host_path, kind, symbols, probe_only,
                verdict.plan, located.opened,
            )
        finally:
            if not keep:  # only what is to be probed stays open
                located.opened.close()

    def _plan(
        self,
        key: LibraryKey,
        located: _Located,
        path: str,
        verdict: _Verdict,
        *,
        kind: Kind,
        probe_only: frozenset[str] | None,
    ) -> _Verdict:
        """`verdict` with the file's attach plan as a `kind` file, read now (and kept) from
        `path`, the checked descriptor's."""
        plan = attachplan.read_plan(path, kind, located.stat.st_size, probe_only)
        verdict = replace(verdict, plan=plan)
        if not _readable(path):
            # Out of reach (out of descriptors): nothing is known of where to attach, so
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
            located = _locate_in(proc_root, pid, key, holders[pid], self._checked)
            if located is not None:
                self._host_pids[key] = pid
                return located
        return None

    def _verdict(
        self, key: LibraryKey, located: _Located, path: str, loader_candidate: bool
    ) -> _Verdict:
        """What the file defines: remembered, or read from `path` (the checked descriptor's:
        a verdict is never read from anything but the file that was checked)."""
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
                path, _CLASSIFYING_SYMBOLS, _DYNAMIC_RUNTIME_MARKERS
            )
            runtime = found & RUNTIME_SYMBOLS
            # Read only for a runtime: the rare file, and the code search costs a pass over
            # its executable sections.
            probe_only = (
                elfsyms.referenced_functions(path, _REFERENCED_SYMBOLS) if runtime else None
            )
            verdict = _Verdict(identity, runtime, found & DRIVER_SYMBOLS, None, probe_only,
                               hooks=found & _HOOK_SYMBOLS)
            if not found and not _readable(path):
                # Out of reach (out of descriptors): nothing is known of the file, so nothing
                # is remembered (the next process that maps it tells).
                return verdict
        if loader_candidate and verdict.loader is None:
            learned = True
            defined = elfsyms.defined_functions(path, _LOADER_SYMBOLS)
            verdict = replace(verdict, loader=LOADER_SYMBOL in defined)
        self._remember(key, verdict)
        # A file that could not be read (out of descriptors) read as defining nothing: true
        # for now, not worth keeping for the next run, nor quiet.
        sure = not learned or _readable(path)
        if sure and (fresh or learned) and not verdict.runtime and not verdict.driver \
                and not verdict.loader and not verdict.hooks & AUTOGRAD_SYMBOLS:
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
            identity, kept.runtime, kept.driver, kept.loader, kept.probe_only, kept.plan,
            kept.hooks,
        )

    def _remember(self, key: LibraryKey, verdict: _Verdict) -> None:
        self._verdicts[key] = verdict
        if len(self._verdicts) > self._max_entries:
            oldest = next(iter(self._verdicts))
            del self._verdicts[oldest]
            self._host_pids.pop(oldest, None)


def _stored(verdict: _Verdict) -> verdictcache.Stored:
    return verdictcache.Stored(
        verdict.runtime, verdict.driver, verdict.loader, verdict.probe_only, verdict.plan,
        verdict.hooks,
    )


def _readable(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except (OSError, ValueError):
        return False
    return True


def verdict_fingerprint() -> str:
    """What a stored verdict was computed against: the names classified and probed, and the
    code that reads them (this module, elfsyms, attachplan and entrypoint, which moves probes
    past a function's entry; a change to any makes the old verdicts stale, which costs one
    slower start, never a wrong one)."""
    sources: list[bytes] = []
    for module in (elfsyms, attachplan, entrypoint, sys.modules[__name__]):
        try:
            sources.append(Path(module.__file__ or "").read_bytes())
        except OSError:  # no source shipped: the package version stands for it
            sources.append(_distribution_version().encode())
    return verdictcache.fingerprint(
        RUNTIME_SYMBOLS, DRIVER_SYMBOLS, _REFERENCED_SYMBOLS, _LOADER_SYMBOLS, _HOOK_SYMBOLS,
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
    max_entries: int = verdictcache.DEFAULT_MAX_ENTRIES,
    clock: Callable[[], float] = time.time,
) -> verdictcache.VerdictStore:
    """The verdicts kept in `directory` (CaptureSettings.verdict_cache_dir) for a Classifier;
    None: a store that is off (remembers nothing, never touches disk). Never raises."""
    vocabulary = verdictcache.Vocabulary(
        RUNTIME_SYMBOLS, DRIVER_SYMBOLS, _REFERENCED_SYMBOLS, attachplan.PROBED,
        _HOOK_SYMBOLS,
    )
    fingerprint = verdict_fingerprint() if directory is not None else ""
    return verdictcache.VerdictStore.load(directory, fingerprint, vocabulary, max_entries, clock)


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
            if libraries[key].kind in ("runtime", "driver"):
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


def _locate_in(
    proc_root: str,
    pid: int,
    key: LibraryKey,
    mapping: _Line,
    checked: dict[tuple[int, int, int], LibraryKey] | None = None,
) -> _Located | None:
    """The file `pid` maps as `key`, opened from the agent's mount namespace and checked to
    be that very file; None if no path to it opens it.

    Through /proc/PID/root first (how the quiet-load filter sees the file: an overlayfs
    file as the process opens it), else through the kernel's own link to the mapped file
    (/proc/PID/map_files: right even once the file is deleted or replaced). Neither path is
    trusted: the directories on the first belong to whoever made them, who may swap them for
    links to other files at any moment; the second names an address range, which the process
    may map another file at. What was opened is checked instead (_is_mapped_file)."""
    candidates: list[str] = []
    if not _is_deleted(mapping):
        candidates.append(f"{proc_root}/{pid}/root{_path_of(mapping)}")
    candidates.append(f"{proc_root}/{pid}/map_files/{_map_files_name(mapping)}")
    for path in candidates:
        opened = _open_regular(path)
        if opened is None:
            continue
        if _is_mapped_file(opened, key, checked):
            return _Located(mapping, opened)
        opened.close()
    return None


def _open_regular(path: str) -> OpenFile | None:
    """`path` opened for reading if it is a regular file, else None. Never blocks (a FIFO
    put where a library was opens at once and is refused) and never raises."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return OpenFile(fd, st, path)


def _is_mapped_file(
    opened: OpenFile,
    key: LibraryKey,
    checked: dict[tuple[int, int, int], LibraryKey] | None = None,
) -> bool:
    """Whether the open file is the one maps shows as `key` (st_dev, st_ino).

    The inode alone says nothing: inode numbers repeat across file systems, and a user can
    make files until one has the number of a root-owned library. Where fstat's device is the
    one maps shows (ext4, xfs, ...), the pair decides. Where it is not (overlayfs shows its
    own device, btrfs a subvolume's, while maps shows the file system's), the file is mapped
    here too, and this process's own maps says how the kernel shows it."""
    st = opened.stat
    if st.st_ino != key[1]:
        return False
    if st.st_dev == key[0]:
        return True
    seen = (st.st_dev, st.st_ino, st.st_ctime_ns)
    if checked is not None and checked.get(seen) == key:
        return True
    if _mapped_key(opened.fd) != key:
        return False
    if checked is not None:
        if len(checked) >= _MAX_CHECKED:
            checked.pop(next(iter(checked)))
        checked[seen] = key
    return True


_MAX_CHECKED = 65536

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _mapped_key(fd: int) -> LibraryKey | None:
    """(device, inode) of the file open as `fd` as /proc/PID/maps shows it: the file is
    mapped (one page, read-only, never touched) and this process's own maps read."""
    address = _libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
    if address is None or address == _MAP_FAILED:
        return None
    try:
        prefix = f"{address:08x}-".encode()
        with open(f"{SELF_MAPS}", "rb") as maps:
            for line in maps:
                if line.startswith(prefix):
                    fields = line.split(maxsplit=5)
                    if len(fields) < 5:
                        return None
                    return _device(fields[3].decode()), int(fields[4])
        return None
    except (OSError, ValueError):
        return None
    finally:
        _libc.munmap(address, mmap.PAGESIZE)


SELF_MAPS = "/proc/self/maps"
