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
(the file's base name and the address's offset in it). A launch is never
dropped for want of a name. Names are demangled with cxxfilt, which wraps libstdc++'s
__cxa_demangle (the reference implementation GCC and c++filt use; pure-Python demanglers lag
behind it on CUDA's templates); the short form drops template arguments, parameter lists and
return types, so that a dashboard's kernel tag stays bounded, but keeps what a generic kernel
runs: `at::native::vectorized_elementwise_kernel<launch_clamp_scalar>` (`operation`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from producer import elfsyms
from producer.records import EventType, NameKind
from producer.wire import KernelName

log = logging.getLogger(__name__)

__all__ = ["KernelNames", "demangle", "operation", "short_name"]

#: Processes whose names are kept (the least recently named are forgotten beyond it).
MAX_PROCESSES = 4096
#: Names kept per process (a process that builds kernels without end stays bounded).
MAX_NAMES_PER_PROCESS = 65536

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


@dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    offset: int
    inode: int
    path: str  # "" for anonymous memory


class KernelNames:
    """Launch handle → KernelName, per process. Feed it name records in ring order with
    `add` before the events that use them; ask with `name_of` or `for_launches`."""

    def __init__(self, proc_root: Path | None = Path("/proc")) -> None:
        #: None: offline (replay): only names learnt or recorded, no address lookups.
        self._proc_root = proc_root
        self._processes: OrderedDict[int, _Process] = OrderedDict()
        #: The last maps read of each process: a process that has exited is still named.
        self._maps: OrderedDict[int, list[_Mapping]] = OrderedDict()
        self.records = 0

    def remember_maps(self, pid: int) -> None:
        """Read `pid`'s mappings and nvcc `__handle` statics now, while it lives (capture
        calls this when it scans): a process attached late may be gone by the time its
        launches are named."""
        maps = self._read_maps(pid)
        if maps is not None:
            self._maps[pid] = maps
            self._maps.move_to_end(pid)
            while len(self._maps) > MAX_PROCESSES:
                self._maps.popitem(last=False)
        if self._proc_root is not None:
            state = self._process(pid)
            state.statics.update(self._read_handle_statics(pid))
            state.statics_read_at = time.monotonic()

    def forget(self, pids: Iterable[int]) -> None:
        """Processes gone, their launches named: their names and maps are not needed again."""
        for pid in pids:
            self._processes.pop(pid, None)
            self._maps.pop(pid, None)

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
        maps = self._read_maps(pid)
        if not maps:
            return {}
        found: dict[int, str] = {}
        bases: dict[tuple[int, str], int] = {}
        for mapping in maps:
            if mapping.path.startswith("/") and mapping.offset == 0:
                bases.setdefault((mapping.inode, mapping.path), mapping.start)
        try:
            mem = os.open(f"{self._proc_root}/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            for (inode, path), start in bases.items():
                opened = self._open_path(pid, _Mapping(start, start, 0, inode, path))
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
        # through any of them (elfsyms caches by inode).
        for opened in self._open_paths(pid, mapping):
            found = elfsyms.symbol_at(opened, file_offset)
            if found is not None:
                return demangle(found[0])
            vaddr = elfsyms.file_offset_to_vaddr(opened, file_offset)
            if vaddr is not None:
                break  # read, and no function there
        where = vaddr if vaddr is not None else file_offset
        label = f"{os.path.basename(mapping.path)}+0x{where:x}"
        return KernelName(label, label)

    def _open_path(self, pid: int, mapping: _Mapping) -> str | None:
        """A path that opens the mapped file: through the live process, else (it has
        exited) the path itself when it still names the same inode."""
        return next(self._open_paths(pid, mapping), None)

    def _open_paths(self, pid: int, mapping: _Mapping) -> Iterator[str]:
        candidates = (
            f"{self._proc_root}/{pid}/map_files/{mapping.start:x}-{mapping.end:x}",
            f"{self._proc_root}/{pid}/root{mapping.path}",
            mapping.path,
        )
        for path in candidates:
            try:
                if os.stat(path).st_ino == mapping.inode:
                    yield path
            except OSError:
                continue

    def _mapping_of(self, pid: int, address: int) -> _Mapping | None:
        for maps in (self._read_maps(pid), self._maps.get(pid)):
            for mapping in maps or ():
                if mapping.start <= address < mapping.end:
                    return mapping
        return None

    def _read_maps(self, pid: int) -> list[_Mapping] | None:
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
            start_text, _, end_text = parts[0].partition("-")
            path = parts[5].removesuffix(" (deleted)") if len(parts) == 6 else ""
            maps.append(
                _Mapping(int(start_text, 16), int(end_text, 16), int(parts[2], 16),
                         int(parts[4]), path)
            )
        return maps
