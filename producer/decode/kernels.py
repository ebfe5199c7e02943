"""Kernel names: launch handles → names, per process, from the `names` ring and ELF files.

What the probes report (bpf/events.h, enum gf_name_kind), and how a launch handle is named:

    runtime  __cudaRegisterFunction   host stub → mangled device name
             __cudaGetKernel          cudaKernel_t → host stub (nvcc 12.4+ launches by it)
    driver   cuModuleGetFunction      CUfunction → name
             cuLibraryGetKernel       CUkernel → name (the runtime's cudaKernel_t is one)
             cuKernelGetFunction      CUfunction → CUkernel
             cuModuleLoadData(Ex)     module → image address (which file, or JIT memory)

A handle none of these name (the process was attached after it registered its kernels) is
looked up in the process: among the `__handle` statics nvcc 12.4+ keeps next to each kernel
stub (`_ZZ<stub>E8__handle`, read from the process's memory: each holds its kernel's
cudaKernel_t once the stub has run), then as an address: the symbol that covers it in its
file's .symtab/.dynsym (nvcc 13 keeps host stubs only in .symtab), else "MODULE+0xOFFSET"
(the file's base name and the address's offset in it). A launch is never dropped for want
of a name. The process's maps, and a descriptor of each file it maps executable (opened
through /proc/PID/map_files), are kept from while it lived (`keep_maps`: capture calls it
while the process is held at the scan that finds it mapping CUDA): one that exits before its
launches are named is named from the very files it mapped. Names are demangled with cxxfilt,
which wraps libstdc++'s __cxa_demangle (the reference implementation GCC and c++filt use;
pure-Python demanglers lag behind it on CUDA's templates); the short form drops template
arguments, parameter lists and return types, so that a dashboard's kernel tag stays bounded,
but keeps what a generic kernel runs:
`at::native::vectorized_elementwise_kernel<launch_clamp_scalar>` (`operation`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract.abi import EventType, NameKind
from gpuflight.producer.contract.wire import KernelName
from gpuflight.producer.discover import elfsyms

log = logging.getLogger(__name__)

__all__ = ["KernelNames", "demangle", "operation", "short_name"]

#: Processes whose names are kept (the least recently named are forgotten beyond it).
MAX_PROCESSES = 4096
#: Names kept per process (a process that builds kernels without end stays bounded).
MAX_NAMES_PER_PROCESS = 65536
#: Files kept open to name the launches of processes that have exited (_KeptFiles), node-wide.
MAX_KEPT_FILES = 256
#: Where this process's own descriptors are named (the real /proc: a fake tree given as
#: proc_root holds other processes', never ours).
SELF_FD = "/proc/self/fd"

#: nvcc's function-local static holding a stub's cudaKernel_t, and the stubs' name prefix.
HANDLE_STATIC = "__handle"
_STUB = re.compile(r"__device_stub_(_Z[^(]*)\(")
_HANDLE_TAIL = f"E{len(HANDLE_STATIC)}{HANDLE_STATIC}"
#: A process's `__handle` statics are read again at most this often (on a miss).
STATICS_INTERVAL_S = 1.0

_ANONYMOUS = "(anonymous namespace)"
_ANONYMOUS_MARK = "\x00anon\x00"


@cache
def _cxxfilt() -> Any:
    """cxxfilt, imported the first time a name is demangled: importing it runs
    `ldconfig -p` twice (to find libc and libstdc++), ~8 ms of every start otherwise."""
    import cxxfilt

    return cxxfilt


def demangle(symbol: str) -> KernelName:
    """(short, full) of a symbol: `full` demangled (the symbol itself if it is not mangled)."""
    full = symbol
    if symbol.startswith("_Z"):
        cxxfilt = _cxxfilt()
        try:
            full = cxxfilt.demangle(symbol, external_only=False)
        except cxxfilt.InvalidName:
            full = symbol
    return KernelName(short_name(full) or full, full)


def short_name(full: str) -> str:
    """A demangled name without template arguments, parameter lists or return type, and with
    the operation it runs where its template arguments say so (see `operation`):
    "void at::native::vectorized_elementwise_kernel<4, at::native::AbsFunctor<float>, …>(…)"
    → "at::native::vectorized_elementwise_kernel<AbsFunctor>"."""
    base = _base_name(full)
    op = operation(full)
    return f"{base}<{op}>" if op else base


def _base_name(full: str) -> str:
    text = full.replace(_ANONYMOUS, _ANONYMOUS_MARK)
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    # What is left before the name proper (a return type) ends at the last top-level space.
    kept = "".join(out).strip().rsplit(" ", 1)[-1]
    return kept.replace(_ANONYMOUS_MARK, _ANONYMOUS)


#: Generic kernels are told apart by what they run: a functor named like one, or the function
#: a lambda was written in (PyTorch's `launch_clamp_scalar(…)::{lambda(float)#1}`).
_FUNCTOR = re.compile(r"(?:Functor|_functor|Ops|_op|_kernel_cuda|_kernel_impl|_kernel)\w*$|"
                      r"^(?:CUDAFunctor|Functor)")
#: Templates that only wrap the operation: looked through, never named.
_WRAPPERS = frozenset({
    "BinaryFunctor", "BUnaryFunctor", "UnaryFunctor", "OpaqueFunctor", "func_wrapper_t",
    "ReduceOp", "gpu_kernel_impl", "gpu_kernel_impl_nocast", "gpu_kernel", "gpu_kernel_nocast",
    "launch_vectorized_kernel", "launch_legacy_kernel", "launch_unrolled_kernel",
    "opmath_gpu_kernel_with_scalars", "gpu_kernel_with_scalars", "jitted_gpu_kernel",
    "elementwise_kernel_helper", "AUnaryFunctor",
})
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
#: Longer template argument lists are not searched (a bound on the work per name).
_MAX_SEARCHED = 16384


def operation(full: str) -> str | None:
    """What a generic (templated) kernel runs, from its template arguments: the function its
    lambda was written in (looking through helpers such as gpu_kernel_impl_nocast, and naming
    the class of an `operator()`), else the first functor named like one (…Functor, …_functor,
    …Ops) that is not a wrapper (BinaryFunctor<…, MulFunctor> → MulFunctor); None when the
    arguments name no operation (plain types, sizes). Identifiers of the program's own code:
    the set of values stays bounded."""
    args = _template_args(full)
    if not args:
        return None
    return _operation_in(args[:_MAX_SEARCHED], depth=0)


def _operation_in(text: str, depth: int) -> str | None:
    if depth > 4:
        return None
    lambda_at = text.find("{lambda")
    if lambda_at > 0:
        found = _enclosing_function(text[:lambda_at], depth)
        if found:
            return found
    for match in _IDENTIFIER.finditer(text):
        name = match.group(0)
        if name not in _WRAPPERS and _FUNCTOR.search(name):
            return name
    return None


def _enclosing_function(prefix: str, depth: int) -> str | None:
    """The function whose body `prefix` (the text before '{lambda', ending in '::') ends in."""
    end = len(prefix)
    if not prefix.endswith("::"):
        return None
    end -= 2
    if prefix[:end].endswith(" const"):
        end -= len(" const")
    if end == 0 or prefix[end - 1] != ")":
        return None
    start = _group_start(prefix, end - 1, "(", ")")
    if start is None:
        return None
    end = start
    if prefix[:end].endswith("operator()"):  # a method: name its class
        end -= len("operator()")
        if not prefix[:end].endswith("::"):
            return None
        end -= 2
    template: str | None = None
    if end and prefix[end - 1] == ">":
        open_at = _group_start(prefix, end - 1, "<", ">")
        if open_at is None:
            return None
        template = prefix[open_at + 1 : end - 1]
        end = open_at
    begin = end
    while begin and (prefix[begin - 1].isalnum() or prefix[begin - 1] == "_"):
        begin -= 1
    name = prefix[begin:end]
    if not name:
        return None
    if name in _WRAPPERS:
        return _operation_in(template, depth + 1) if template else None
    return name


def _group_start(text: str, close_at: int, opening: str, closing: str) -> int | None:
    """Index of the bracket that `text[close_at]` (a closing one) matches."""
    level = 0
    for i in range(close_at, -1, -1):
        ch = text[i]
        if ch == closing:
            level += 1
        elif ch == opening:
            level -= 1
            if level == 0:
                return i
    return None


def _template_args(full: str) -> str | None:
    """The template argument text of the kernel itself (the top-level name's first <…>)."""
    text = full.replace(_ANONYMOUS, _ANONYMOUS_MARK)
    depth = 0
    open_at = -1
    for i, ch in enumerate(text):
        if ch == "(" and depth == 0:
            break  # the parameter list: the name had no template arguments
        if ch == "<":
            if depth == 0:
                open_at = i
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
            if depth == 0 and open_at >= 0:
                return text[open_at + 1 : i].replace(_ANONYMOUS_MARK, _ANONYMOUS)
    return None


#: Addresses closer than this are read in one span of /proc/PID/mem.
_SPAN_GAP = 1 << 16
#: The longest span read at once.
_MAX_SPAN = 1 << 24


def _read_words(mem: int, base: int, addresses: list[int]) -> list[int]:
    """The 8-byte little-endian words at base + each address (ascending) of a process's
    memory (0 where unreadable), read in few spans: nvcc's statics lie together in .bss."""
    words = [0] * len(addresses)
    first = 0
    while first < len(addresses):
        last = first
        while (
            last + 1 < len(addresses)
            and addresses[last + 1] - addresses[last] <= _SPAN_GAP
            and addresses[last + 1] - addresses[first] + 8 <= _MAX_SPAN
        ):
            last += 1
        span_start = base + addresses[first]
        try:
            raw = os.pread(mem, addresses[last] - addresses[first] + 8, span_start)
        except (OSError, OverflowError, ValueError):
            raw = b""
        for i in range(first, last + 1):
            at = addresses[i] - addresses[first]
            if at + 8 <= len(raw):
                words[i] = int.from_bytes(raw[at : at + 8], "little")
            elif first != last:  # the span crossed unreadable memory: this word alone
                words[i] = _read_words(mem, base, [addresses[i]])[0]
        first = last + 1
    return words


@lru_cache(maxsize=65536)
def _kernel_of_handle_static(symbol: str) -> str | None:
    """The kernel symbol a `__handle` static belongs to: `_ZZ<encoding>E8__handle` is local
    to the function `_Z<encoding>`, nvcc's `__device_stub_<kernel symbol>` (or the kernel)."""
    if not symbol.startswith("_ZZ") or not symbol.endswith(_HANDLE_TAIL):
        return None
    function = "_Z" + symbol[3 : -len(_HANDLE_TAIL)]
    match = _STUB.search(demangle(function).full)
    return match.group(1) if match else function


@dataclass
class _Process:
    """What one process's name records said."""

    stub_names: dict[int, str] = field(default_factory=dict)  # host stub → symbol
    kernel_stubs: dict[int, int] = field(default_factory=dict)  # cudaKernel_t → host stub
    driver_names: dict[int, str] = field(default_factory=dict)  # CUfunction/CUkernel → name
    function_kernels: dict[int, int] = field(default_factory=dict)  # CUfunction → CUkernel
    modules: dict[int, int] = field(default_factory=dict)  # module/library → image address
    resolved: dict[int, KernelName] = field(default_factory=dict)
    statics: dict[int, str] = field(default_factory=dict)  # cudaKernel_t → its __handle static
    statics_read_at: float = float("-inf")
    guessed: set[int] = field(default_factory=set)  # handles named by address, not by record

    def size(self) -> int:
        return len(self.stub_names) + len(self.kernel_stubs) + len(self.driver_names)


#: (st_dev, st_ino) of a file as stat gives them: what it is, on whichever file system.
_FileId = tuple[int, int]


class _Mapping(NamedTuple):
    """One line of /proc/PID/maps (a tuple: a PyTorch process has hundreds, read again on
    each address lookup)."""

    start: int
    end: int
    offset: int
    dev: int  # st_dev of the file as /proc/PID/maps shows it (major:minor)
    inode: int
    path: str  # "" for anonymous memory
    executable: bool

    @property
    def owner(self) -> tuple[int, int, str]:
        """Its file, as maps names it: every mapping of one file has the same."""
        return (self.dev, self.inode, self.path)


@dataclass
class _Kept:
    """A process's maps as last read, and the files kept for it: per file (as maps names it),
    the first executable mapping of it (start, end, offset) and the kept file's identity
    (None where none could be opened)."""

    maps: list[_Mapping]
    files: dict[tuple[int, int, str], tuple[tuple[int, int, int], _FileId | None]]

    def kept(self) -> set[_FileId]:
        return {key for _, key in self.files.values() if key is not None}

    def file_of(self, mapping: _Mapping) -> _FileId | None:
        found = self.files.get(mapping.owner)
        return None if found is None else found[1]


def _close_all(fds: dict[_FileId, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


class _KeptFiles:
    """Descriptors of the files processes map executable (where a launch by address can
    point), node-wide, one per file, opened through /proc/PID/map_files while the process
    lived: a process that has exited is named from the very files it mapped, even when their
    paths are gone or name other files by then (a container's root, a library replaced).
    Each is closed once no process kept uses it, or beyond MAX_KEPT_FILES (the least recently
    used first: those files are then found by path, where they still are)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._fds: OrderedDict[_FileId, int] = OrderedDict()
        self._users: dict[_FileId, set[int]] = {}
        self._finalizer = weakref.finalize(self, _close_all, self._fds)

    def __len__(self) -> int:
        return len(self._fds)

    def open(self, pid: int, link: str) -> _FileId | None:
        """Keep the regular file `link` opens (a map_files entry) for `pid`; its identity."""
        try:
            st = os.stat(link)
        except (OSError, ValueError):
            return None
        if not stat.S_ISREG(st.st_mode):  # a device mapped executable is never opened
            return None
        key = (st.st_dev, st.st_ino)
        if key in self._fds:
            self._fds.move_to_end(key)
        else:
            try:
                fd = os.open(link, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            except (OSError, ValueError):
                return None
            try:
                opened = os.fstat(fd)
            except OSError:
                opened = None
            # The range may have been mapped anew between the stat and the open.
            if opened is None or (opened.st_dev, opened.st_ino) != key or not stat.S_ISREG(
                    opened.st_mode):
                os.close(fd)
                return None
            self._fds[key] = fd
            while len(self._fds) > self.limit:
                old, old_fd = self._fds.popitem(last=False)
                self._users.pop(old, None)
                os.close(old_fd)
        self._users.setdefault(key, set()).add(pid)
        return key

    def touch(self, pid: int, key: _FileId) -> bool:
        """`pid` still maps the kept file `key`; False if it is kept no more."""
        if key not in self._fds:
            return False
        self._fds.move_to_end(key)
        self._users.setdefault(key, set()).add(pid)
        return True

    def path(self, key: _FileId | None) -> str | None:
        """A path that opens the kept file itself (this process's descriptor of it)."""
        fd = None if key is None else self._fds.get(key)
        return None if fd is None else f"{SELF_FD}/{fd}"

    def release(self, pid: int, keys: Iterable[_FileId]) -> None:
        """`pid` is done with these files: each no kept process uses is closed."""
        for key in keys:
            users = self._users.get(key)
            if users is None:
                continue
            users.discard(pid)
            if not users:
                del self._users[key]
                fd = self._fds.pop(key, None)
                if fd is not None:
                    os.close(fd)

    def close(self) -> None:
        self._users.clear()
        self._finalizer()


class KernelNames:
    """Launch handle → KernelName, per process. Feed it name records in ring order with
    `add` before the events that use them; ask with `name_of` or `for_launches`."""

    def __init__(self, proc_root: Path | None = Path("/proc")) -> None:
        #: None: offline (replay): only names learnt or recorded, no address lookups.
        self._proc_root = proc_root
        self._processes: OrderedDict[int, _Process] = OrderedDict()
        #: The last maps read of each process: a process that has exited is still named.
        self._maps: OrderedDict[int, _Kept] = OrderedDict()
        #: The files those maps name, open (what names a process that has exited).
        self._files = _KeptFiles(MAX_KEPT_FILES)
        self.records = 0

    def keep_maps(self, pid: int) -> list[_Mapping] | None:
        """Read `pid`'s mappings now, and keep a descriptor of each file it maps executable
        (cheap: one read of its maps, and for a file not kept yet a stat and an open).
        Capture calls this while the process is held, at the scan that finds it mapping a
        CUDA library: a short process may be gone before its launches are named, and they
        are named from these then. None (what was kept stays) when it cannot be read."""
        maps = self._read_maps(pid)
        if not maps:  # gone (a zombie's maps are empty), or not ours to read
            return None
        before = self._maps.get(pid)
        known = before.files if before is not None else {}
        files: dict[tuple[int, int, str], tuple[tuple[int, int, int], _FileId | None]] = {}
        for m in maps:
            if not m.executable or not m.path.startswith("/") or m.owner in files:
                continue
            place = (m.start, m.end, m.offset)
            was = known.get(m.owner)
            key = was[1] if was is not None and was[0] == place else None
            if key is None or not self._files.touch(pid, key):
                key = self._files.open(
                    pid, f"{self._proc_root}/{pid}/map_files/{m.start:x}-{m.end:x}")
            files[m.owner] = (place, key)
        kept = _Kept(maps, files)
        if before is not None:
            self._files.release(pid, before.kept() - kept.kept())
        self._maps[pid] = kept
        self._maps.move_to_end(pid)
        while len(self._maps) > MAX_PROCESSES:
            old, dropped = self._maps.popitem(last=False)
            self._files.release(old, dropped.kept())
        return maps

    def remember_maps(self, pid: int) -> None:
        """keep_maps, and read `pid`'s nvcc `__handle` statics now, while it lives (capture
        calls this when it scans, once no process is held: the statics of a large library
        take a while to read)."""
        self.keep_maps(pid)
        if self._proc_root is not None:
            state = self._process(pid)
            state.statics.update(self._read_handle_statics(pid))
            state.statics_read_at = time.monotonic()

    def forget(self, pids: Iterable[int]) -> None:
        """Processes gone, their launches named: their names, maps and files are not needed
        again."""
        for pid in pids:
            self._processes.pop(pid, None)
            dropped = self._maps.pop(pid, None)
            if dropped is not None:
                self._files.release(pid, dropped.kept())

    def close(self) -> None:
        """Close the files kept (also done when this object is collected)."""
        self._files.close()

    def __len__(self) -> int:
        """Processes something is kept of."""
        return len(self.pids())

    def pids(self) -> set[int]:
        return self._processes.keys() | self._maps.keys()

    def _process(self, pid: int) -> _Process:
        state = self._processes.get(pid)
        if state is None:
            state = self._processes[pid] = _Process()
            while len(self._processes) > MAX_PROCESSES:
                self._processes.popitem(last=False)
        else:
            self._processes.move_to_end(pid)
        return state

    def add(self, records: npt.NDArray[np.void]) -> None:
        """Take name records (records.NAME_EVENT_DTYPE), oldest first."""
        for record in records:
            self._add_one(
                int(record["pid"]),
                int(record["kind"]),
                int(record["handle"]),
                int(record["aux"]),
                bytes(record["name"]).split(b"\0", 1)[0].decode("utf-8", "replace"),
            )

    def _add_one(self, pid: int, kind: int, handle: int, aux: int, name: str) -> None:
        self.records += 1
        state = self._process(pid)
        if state.size() >= MAX_NAMES_PER_PROCESS:
            return
        if kind == NameKind.RUNTIME_FUNCTION and name:
            state.stub_names[handle] = name
        elif kind == NameKind.RUNTIME_KERNEL:
            state.kernel_stubs[handle] = aux
        elif kind in (NameKind.DRIVER_FUNCTION, NameKind.DRIVER_KERNEL) and name:
            state.driver_names[handle] = name
        elif kind == NameKind.KERNEL_FUNCTION:
            state.function_kernels[handle] = aux
        elif kind == NameKind.MODULE:
            state.modules[handle] = aux
            return
        else:
            return
        # A name may have been guessed from an address before its record came.
        for guessed in list(state.guessed):
            state.resolved.pop(guessed, None)
        state.guessed.clear()
        state.resolved.pop(handle, None)

    def learn(self, pid: int, names: Mapping[int, KernelName]) -> None:
        """Names known already (a Kafka message's): they win over everything else."""
        if names:
            self._process(pid).resolved.update(names)

    def name_of(self, pid: int, handle: int) -> KernelName | None:
        """The name of launch handle `handle` in `pid`; None only offline (no proc root)
        for a handle no message named. On a node a launch always has a name."""
        state = self._process(pid)
        known = state.resolved.get(handle)
        if known is not None:
            return known
        symbol = self._recorded(state, handle)
        if symbol is None and self._proc_root is not None:
            symbol = self._from_handle_statics(pid, state, handle)
        if symbol is not None:
            name = demangle(symbol)
        elif self._proc_root is None:
            return None
        else:
            name = self._by_address(pid, state.kernel_stubs.get(handle, handle))
            state.guessed.add(handle)
        state.resolved[handle] = name
        return name

    def code_at(self, pid: int, address: int) -> tuple[KernelName, str]:
        """The function of `pid` whose code holds `address` (a call's return address: its
        native caller), by the same lookup that names launches no record named, and the file
        that holds it ("" where no file does)."""
        mapping = self._mapping_of(pid, address) if self._proc_root is not None else None
        name = self._by_address(pid, address)
        return name, (mapping.path if mapping is not None and mapping.path.startswith("/")
                      else "")

    def for_launches(self, pid: int, events: npt.NDArray[np.void]) -> dict[int, KernelName]:
        """handle → name for every launch among one process's `events`."""
        launches = events["handle"][events["type"] == EventType.LAUNCH]
        named = {h: self.name_of(pid, h) for h in np.unique(launches).tolist()}
        return {h: name for h, name in named.items() if name is not None}

    def lookup(self) -> Mapping[tuple[int, int], KernelName]:
        """A read-only view of everything resolved so far (for tests and tools)."""
        return {
            (pid, h): name for pid, p in self._processes.items() for h, name in p.resolved.items()
        }

    @staticmethod
    def _recorded(state: _Process, handle: int) -> str | None:
        stub = state.kernel_stubs.get(handle, handle)
        if stub in state.stub_names:
            return state.stub_names[stub]
        if handle in state.driver_names:
            return state.driver_names[handle]
        kernel = state.function_kernels.get(handle)
        if kernel is not None and kernel in state.driver_names:
            return state.driver_names[kernel]
        return None

    # -- nvcc's __handle statics (late attach) --------------------------------

    def _from_handle_statics(self, pid: int, state: _Process, handle: int) -> str | None:
        if handle not in state.statics and (
            time.monotonic() - state.statics_read_at >= STATICS_INTERVAL_S
        ):
            state.statics_read_at = time.monotonic()
            state.statics.update(self._read_handle_statics(pid))
        static = state.statics.get(handle)
        return None if static is None else _kernel_of_handle_static(static)

    def _read_handle_statics(self, pid: int) -> dict[int, str]:
        """cudaKernel_t value → the `__handle` static's symbol, for every one `pid` maps
        that holds a handle. Demangled only when a launch asks (`_kernel_of_handle_static`):
        libtorch_cuda.so has 24,000 of them and a scan must not demangle them all."""
        maps = self.keep_maps(pid)
        if not maps:
            return {}
        found: dict[int, str] = {}
        bases: dict[tuple[int, int, str], _Mapping] = {}
        for mapping in maps:
            if mapping.path.startswith("/") and mapping.offset == 0:
                bases.setdefault((mapping.dev, mapping.inode, mapping.path), mapping)
        try:
            mem = os.open(f"{self._proc_root}/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            for mapping in bases.values():
                start = mapping.start
                opened = next(self._file_paths(pid, mapping), None)
                statics = elfsyms.local_statics(opened, HANDLE_STATIC) if opened else None
                if statics is None or not statics.objects:
                    continue
                base = start - (statics.first_vaddr & ~0xFFF) if statics.relocatable else 0
                handles = _read_words(mem, base, [value for value, _ in statics.objects])
                for handle, (_, symbol) in zip(handles, statics.objects, strict=True):
                    if handle:
                        found[handle] = symbol
        finally:
            os.close(mem)
        return found

    # -- by address ---------------------------------------------------------

    def _by_address(self, pid: int, address: int) -> KernelName:
        mapping = self._mapping_of(pid, address)
        if mapping is None:
            label = f"unknown+0x{address:x}"
            return KernelName(label, label)
        if not mapping.path or mapping.path.startswith("["):
            base = mapping.path or "anon"
            label = f"{base}+0x{address - mapping.start:x}"
            return KernelName(label, label)
        file_offset = address - mapping.start + mapping.offset
        vaddr = None
        # Each path in turn: the process may exit between finding a path and reading the
        # file through it (its map_files then open no more); the file itself reads the same
        # through any of them (elfsyms caches by file identity).
        for opened in self._file_paths(pid, mapping):
            found = elfsyms.symbol_at(opened, file_offset)
            if found is not None:
                return demangle(found[0])
            vaddr = elfsyms.file_offset_to_vaddr(opened, file_offset)
            if vaddr is not None:
                break  # read, and no function there
        where = vaddr if vaddr is not None else file_offset
        label = f"{os.path.basename(mapping.path)}+0x{where:x}"
        return KernelName(label, label)

    def _file_paths(self, pid: int, mapping: _Mapping) -> Iterator[str]:
        """Paths that open the file `mapping` maps, surest first: the descriptor kept of it;
        its /proc/PID/map_files entry (the mapped file itself, on any file system); then,
        the process gone (or map_files refused), /proc/PID/root/PATH and PATH, each only
        when stat says it is that file: the identity of the kept file, else the device and
        inode /proc/PID/maps gave (an inode number alone is no identity: another file system
        has a file of the same number, which a user could map there). Through overlayfs and
        btrfs subvolumes stat's device differs from maps': such a path is not read."""
        held = self._maps.get(pid)
        file = held.file_of(mapping) if held is not None else None
        kept = self._files.path(file)
        if kept is not None:
            yield kept
        through_map = f"{self._proc_root}/{pid}/map_files/{mapping.start:x}-{mapping.end:x}"
        for path in (through_map, f"{self._proc_root}/{pid}/root{mapping.path}", mapping.path):
            try:
                st = os.stat(path)
            except (OSError, ValueError):
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            identity = (st.st_dev, st.st_ino)
            if file is not None:
                same = identity == file
            else:
                same = path == through_map or identity == (mapping.dev, mapping.inode)
            if same:
                yield path

    def _mapping_of(self, pid: int, address: int) -> _Mapping | None:
        """The mapping of `pid` that covers `address`: in its maps now (kept, with their
        files, for when it has exited), else in the maps kept while it lived."""
        maps = self.keep_maps(pid) if self._proc_root is not None else None
        if maps is None:
            held = self._maps.get(pid)
            maps = held.maps if held is not None else None
        for mapping in maps or ():
            if mapping.start <= address < mapping.end:
                return mapping
        return None

    def _read_maps(self, pid: int) -> list[_Mapping] | None:
        if self._proc_root is None:
            return None
        try:
            with open(f"{self._proc_root}/{pid}/maps", "rb") as f:
                lines = f.read().decode("utf-8", "surrogateescape").splitlines()
        except OSError:
            return None
        maps = []
        for line in lines:
            parts = line.split(None, 5)
            if len(parts) < 5:
                continue
            try:
                start_text, _, end_text = parts[0].partition("-")
                major, _, minor = parts[3].partition(":")
                path = parts[5].removesuffix(" (deleted)") if len(parts) == 6 else ""
                maps.append(_Mapping(
                    int(start_text, 16), int(end_text, 16), int(parts[2], 16),
                    os.makedev(int(major, 16), int(minor, 16)), int(parts[4]),
                    path.replace("\\012", "\n"), "x" in parts[1]))
            except ValueError:
                continue
        return maps
