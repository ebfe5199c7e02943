"""Load a compiled BPF program (producer/probe/bpfimage.py) into the kernel, and use its maps.

What bcc would do after compiling, with the bpf(2) and perf_event_open(2) system calls:
create each map (or open it where it is pinned), put the maps' fds into the instructions,
load each function when it is first asked for (the kernel verifies it then) or, for those
asked for later, on threads of their own meanwhile (`load_in_background`), and attach the
`tracepoint__<category>__<name>` functions to their tracepoints (as perf events) and the
`raw_tracepoint__<name>` ones to their raw tracepoints at once, as bcc does. Every
start loads this way, whether the image was compiled a moment ago (producer/probe/probes.py, with
bcc) or read from the cache, so there is one path to trust.

No bcc here: a start that finds its image in the cache never imports it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path
from typing import Any, Final

from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.probe.bpfimage import Image, MapSpec
from gpuflight.producer.probe.preflight import TRACEFS

log = logging.getLogger(__name__)

NR_PERF_EVENT_OPEN: Final = 298  # x86-64, the one machine the probes support (environment.py)
NR_BPF: Final = 321
BPF_MAP_CREATE: Final = 0
BPF_MAP_LOOKUP_ELEM: Final = 1
BPF_MAP_UPDATE_ELEM: Final = 2
BPF_MAP_DELETE_ELEM: Final = 3
BPF_MAP_GET_NEXT_KEY: Final = 4
BPF_PROG_LOAD: Final = 5
BPF_OBJ_PIN: Final = 6
BPF_OBJ_GET: Final = 7
BPF_OBJ_GET_INFO_BY_FD: Final = 15
BPF_RAW_TRACEPOINT_OPEN: Final = 17
BPF_MAP_UPDATE_BATCH: Final = 26
BPF_LINK_CREATE: Final = 28
#: The kernel's own ENOTSUPP (not EOPNOTSUPP): "not supported", which a batch command may
#: answer, and what an attach answers for an instruction the kernel cannot probe.
ENOTSUPP: Final = 524
BPF_PROG_TYPE_KPROBE: Final = 2
BPF_PROG_TYPE_TRACEPOINT: Final = 5
BPF_PROG_TYPE_RAW_TRACEPOINT: Final = 17
#: enum bpf_map_type: the per-CPU kinds, whose lookups return a value per possible CPU.
PERCPU_MAP_TYPES: Final = frozenset({5, 6, 10})  # percpu hash, percpu array, LRU percpu hash
PERF_TYPE_TRACEPOINT: Final = 2
PERF_FLAG_FD_CLOEXEC: Final = 1 << 3
PERF_EVENT_IOC_ENABLE: Final = 0x2400
PERF_EVENT_IOC_SET_BPF: Final = 0x40042408
PERF_ATTR_DISABLED: Final = 1  # perf_event_attr's first flag bit
#: enum bpf_attach_type: a perf event's BPF link; a program loaded for BPF_TRACE_UPROBE_MULTI
#: attaches only through uprobe_multi links (BPF_F_UPROBE_MULTI_RETURN: at the return).
BPF_PERF_EVENT: Final = 41
BPF_TRACE_UPROBE_MULTI: Final = 48
BPF_F_UPROBE_MULTI_RETURN: Final = 1
TRACEPOINT_PREFIX: Final = "tracepoint__"
RAW_TRACEPOINT_PREFIX: Final = "raw_tracepoint__"
#: The verifier's log for a program it refuses (the message's last lines are kept).
_LOG_BYTES: Final = 1 << 20
#: Loads of one program before an EAGAIN (a signal arrived while the verifier ran) is its
#: error: libbpf's count.
PROG_LOAD_ATTEMPTS: Final = 5


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr as far as config2 (PERF_ATTR_SIZE_VER1)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),  # uprobe: bit `retprobe`; ref_ctr_offset in bits 32-63
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # uprobe_path
        ("config2", ctypes.c_uint64),  # probe_offset
    ]


class ProgLoad(ctypes.Structure):
    """union bpf_attr as BPF_PROG_LOAD reads it, as far as expected_attach_type."""

    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
    ]


class _RawTracepointOpen(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_uint64),
        ("prog_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class _MapCreate(ctypes.Structure):
    _fields_ = [
        ("map_type", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("numa_node", ctypes.c_uint32),
        ("map_name", ctypes.c_char * 16),
    ]


class _MapElem(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),  # next_key for BPF_MAP_GET_NEXT_KEY
        ("flags", ctypes.c_uint64),
    ]


class _MapBatch(ctypes.Structure):
    _fields_ = [
        ("in_batch", ctypes.c_uint64),
        ("out_batch", ctypes.c_uint64),
        ("keys", ctypes.c_uint64),
        ("values", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("map_fd", ctypes.c_uint32),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


class _ObjPath(ctypes.Structure):
    _fields_ = [
        ("pathname", ctypes.c_uint64),
        ("bpf_fd", ctypes.c_uint32),
        ("file_flags", ctypes.c_uint32),
    ]


class _InfoByFd(ctypes.Structure):
    _fields_ = [
        ("bpf_fd", ctypes.c_uint32),
        ("info_len", ctypes.c_uint32),
        ("info", ctypes.c_uint64),
    ]


class _MapInfo(ctypes.Structure):
    """struct bpf_map_info as far as the name."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def syscall(number: int, *args: Any) -> int:
    """A raw system call; OSError with its errno when it fails."""
    result = int(_libc.syscall(ctypes.c_long(number), *(
        ctypes.c_long(a) if isinstance(a, int) else a for a in args)))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def bpf(command: int, attr: ctypes.Structure) -> int:
    return syscall(NR_BPF, command, ctypes.byref(attr), ctypes.sizeof(attr))


def obj_get(path: Path) -> int:
    """An fd for the BPF object pinned at `path`; OSError if none."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    return bpf(BPF_OBJ_GET, _ObjPath(pathname=ctypes.addressof(name)))


def obj_pin(fd: int, path: Path) -> None:
    name = ctypes.create_string_buffer(os.fsencode(path))
    bpf(BPF_OBJ_PIN, _ObjPath(pathname=ctypes.addressof(name), bpf_fd=fd))


def map_spec(fd: int, name: str) -> MapSpec:
    """The shape of the map behind `fd`, as the kernel has it."""
    info = _MapInfo()
    bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info),
                                          info=ctypes.addressof(info)))
    return MapSpec(name, info.type, info.key_size, info.value_size, info.max_entries,
                   info.map_flags)


def possible_cpus(path: Path = Path("/sys/devices/system/cpu/possible")) -> int:
    """How many values a per-CPU map holds per key ("0-3,5" -> 6; as the kernel counts
    them, the highest possible CPU + 1)."""
    highest = 0
    for part in path.read_text().strip().split(","):
        highest = max(highest, int(part.split("-")[-1]))
    return highest + 1


class BpfMap:
    """One map, by its fd: keys and values as bytes of the map's sizes."""

    def __init__(self, fd: int, spec: MapSpec) -> None:
        self.fd = fd
        self.spec = spec
        self._value_bytes = spec.value_size
        self.percpu = spec.map_type in PERCPU_MAP_TYPES
        if self.percpu:
            self._stride = (spec.value_size + 7) & ~7
            self._value_bytes = self._stride * possible_cpus()

    def _key(self, key: bytes) -> ctypes.Array[ctypes.c_char]:
        if len(key) != self.spec.key_size:
            raise ValueError(f"{self.spec.name}: a key of {len(key)} bytes, not "
                             f"{self.spec.key_size}")
        return ctypes.create_string_buffer(key, len(key))

    def lookup(self, key: bytes) -> bytes | None:
        """The value (per-CPU maps: every CPU's, one after another, 8-byte aligned), or None."""
        k = self._key(key)
        value = ctypes.create_string_buffer(self._value_bytes)
        try:
            bpf(BPF_MAP_LOOKUP_ELEM, _MapElem(map_fd=self.fd, key=ctypes.addressof(k),
                                              value=ctypes.addressof(value)))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return value.raw

    def lookup_percpu(self, key: bytes) -> list[bytes]:
        """A per-CPU map's value on each possible CPU (empty if the key is absent)."""
        raw = self.lookup(key)
        if raw is None:
            return []
        step = self._stride if self.percpu else len(raw)
        return [raw[i:i + self.spec.value_size] for i in range(0, len(raw), step)]

    def update(self, key: bytes, value: bytes) -> None:
        """Set `key` to `value`; OSError (E2BIG: the map is full)."""
        if len(value) != self.spec.value_size or self.percpu:
            raise ValueError(f"{self.spec.name}: a value of {len(value)} bytes, not "
                             f"{self.spec.value_size}")
        k = self._key(key)
        v = ctypes.create_string_buffer(value, len(value))
        bpf(BPF_MAP_UPDATE_ELEM, _MapElem(map_fd=self.fd, key=ctypes.addressof(k),
                                          value=ctypes.addressof(v)))

    def update_many(self, keys: bytes, values: bytes) -> int:
        """Set each key (`keys`: key_size bytes each, one after another) to its value, in one
        system call where the kernel has BPF_MAP_UPDATE_BATCH (5.6), else one by one; how many
        were set before the first failure (E2BIG: the map is full)."""
        count, rest = divmod(len(keys), self.spec.key_size)
        if rest or self.percpu or len(values) != count * self.spec.value_size:
            raise ValueError(f"{self.spec.name}: {len(keys)} bytes of keys and {len(values)} "
                             f"of values do not make whole entries")
        if not count:
            return 0
        k = ctypes.create_string_buffer(keys, len(keys))
        v = ctypes.create_string_buffer(values, len(values))
        attr = _MapBatch(keys=ctypes.addressof(k), values=ctypes.addressof(v), count=count,
                         map_fd=self.fd)
        try:
            bpf(BPF_MAP_UPDATE_BATCH, attr)
            return count
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, ENOTSUPP, errno.EOPNOTSUPP):
                return int(attr.count)  # the kernel says how many it set
        step, size = self.spec.key_size, self.spec.value_size
        for i in range(count):
            try:
                self.update(keys[i * step:(i + 1) * step], values[i * size:(i + 1) * size])
            except OSError:
                return i
        return count

    def delete(self, key: bytes) -> bool:
        """Whether `key` was there."""
        k = self._key(key)
        try:
            bpf(BPF_MAP_DELETE_ELEM, _MapElem(map_fd=self.fd, key=ctypes.addressof(k)))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def keys(self) -> list[bytes]:
        """Every key, as the map orders them (a snapshot: keys may come and go meanwhile)."""
        out: list[bytes] = []
        size = self.spec.key_size
        current = ctypes.create_string_buffer(size)
        following = ctypes.create_string_buffer(size)
        attr = _MapElem(map_fd=self.fd, key=0, value=ctypes.addressof(following))
        while len(out) <= self.spec.max_entries:
            try:
                bpf(BPF_MAP_GET_NEXT_KEY, attr)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    break
                raise
            out.append(following.raw)
            ctypes.memmove(current, following, size)
            attr.key = ctypes.addressof(current)
        return out

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.keys())

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        for key in self.keys():
            value = self.lookup(key)
            if value is not None:
                yield key, value

    def clear(self) -> None:
        for key in self.keys():
            self.delete(key)


class LoadedObject:
    """An image's maps, created (or opened where `pinned` names a path), its tracepoint
    and raw tracepoint functions attached, and its other functions loaded as they are asked
    for.

    The maps named in `later` (unless pinned, or used by a tracepoint function) are not made
    at once: `load_in_background` makes them on its threads before any function that uses
    them, and `map` or a function that uses them, asked for first, waits for them (or makes
    them then). Until they are made they are not in `maps`."""

    def __init__(self, image: Image, pinned: Mapping[str, Path] | None = None,
                 tracefs: Path = TRACEFS, later: frozenset[str] = frozenset()) -> None:
        self.image = image
        #: Guards _fds, _programs and _pending: loader threads add to them (bpf(2) lets go
        #: of the GIL while the kernel verifies, and they carry on meanwhile).
        self._lock = threading.Lock()
        self._fds: list[int] = []  # everything we hold, closed by close()
        self._programs: dict[tuple[str, int, int], int] = {}
        #: Functions being loaded on a loader thread, or that failed to load there (the
        #: future keeps the error, raised to whoever asks for the function).
        self._pending: dict[tuple[str, int, int], Future[int]] = {}
        self.maps: dict[str, BpfMap] = {}
        #: The attached tracepoints' fds: "category:name" (a perf event) or "raw:name".
        self.tracepoints: dict[str, int] = {}
        tracepoints = [spec.name for spec in image.programs
                       if spec.name.startswith(TRACEPOINT_PREFIX)]
        raw = [spec.name for spec in image.programs
               if spec.name.startswith(RAW_TRACEPOINT_PREFIX)]
        at_once = {index for name in [*tracepoints, *raw]
                   for _, index in image.program(name).relocations}
        #: The maps made later (by index in the image), and the future of their making.
        self._later: dict[int, MapSpec] = {
            index: spec for index, spec in enumerate(image.maps)
            if spec.name in later and index not in at_once and spec.name not in (pinned or {})}
        self._later_made: Future[None] | None = None
        try:
            self._map_fds = [-1 if index in self._later else
                             self._map(spec, (pinned or {}).get(spec.name))
                             for index, spec in enumerate(image.maps)]
            self.load_in_background(raw, BPF_PROG_TYPE_RAW_TRACEPOINT)
            self.preload(tracepoints, BPF_PROG_TYPE_TRACEPOINT)
            for name in raw:
                self._attach_raw_tracepoint(name)
            for name in tracepoints:
                self._attach_tracepoint(name, tracefs)
        except BaseException:
            self.close()
            raise

    def _map(self, spec: MapSpec, pin: Path | None) -> int:
        if pin is not None:
            try:
                fd = obj_get(pin)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise SetupError(f"the BPF map pinned at {pin} cannot be opened: "
                                 f"{exc.strerror}") from exc
            else:
                self._keep(fd)
                have = map_spec(fd, spec.name)
                if (have.map_type, have.key_size, have.value_size, have.max_entries) != (
                        spec.map_type, spec.key_size, spec.value_size, spec.max_entries):
                    raise SetupError(f"the map pinned at {pin} is not the program's "
                                     f"{spec.name}: {have}")
                self.maps[spec.name] = BpfMap(fd, spec)
                return fd
        fd = self._create(spec)
        if pin is not None:
            try:
                obj_pin(fd, pin)
            except OSError as exc:
                raise SetupError(f"the BPF map {spec.name} cannot be pinned at {pin}: "
                                 f"{exc.strerror}") from exc
        self.maps[spec.name] = BpfMap(fd, spec)
        return fd

    def _create(self, spec: MapSpec) -> int:
        """A new map of `spec`'s shape, kept until close; SetupError if the kernel refuses."""
        try:
            fd = bpf(BPF_MAP_CREATE, _MapCreate(
                map_type=spec.map_type, key_size=spec.key_size, value_size=spec.value_size,
                max_entries=spec.max_entries, map_flags=spec.flags,
                map_name=spec.name.encode()[:15]))
        except OSError as exc:
            raise SetupError(f"the BPF map {spec.name} cannot be created: {exc.strerror}"
                             ) from exc
        self._keep(fd)
        return fd

    def _make_later_maps(self) -> None:
        """Make the maps left for later (whichever thread runs it: once)."""
        for index, spec in self._later.items():
            fd = self._create(spec)
            with self._lock:
                self.maps[spec.name] = BpfMap(fd, spec)
                self._map_fds[index] = fd

    def _maps_ready(self) -> None:
        """Wait for the maps left for later (a loader thread makes them), or make them now
        if nothing is; SetupError if they cannot be made."""
        with self._lock:
            future = self._later_made
            mine = future is None and bool(self._later)
            if mine:
                future = self._later_made = Future()
                future.set_running_or_notify_cancel()  # under way here: not to be cancelled
        if future is None:
            return
        if mine:
            try:
                self._make_later_maps()
            except BaseException as exc:
                future.set_exception(exc)
                raise
            future.set_result(None)
            return
        try:
            future.result()
        except CancelledError:
            raise SetupError("the BPF maps were closed before they were made") from None

    def _uses_later(self, function: str) -> bool:
        """Whether `function` uses a map left for later (one not in the image: no, and
        loading it says so)."""
        if not self._later:
            return False
        try:
            relocations = self.image.program(function).relocations
        except KeyError:
            return False
        return any(index in self._later for _, index in relocations)

    def made(self, name: str) -> bool:
        """Whether the map `name` is made (without waiting)."""
        with self._lock:
            return name in self.maps

    def map(self, name: str) -> BpfMap:
        """The map `name`; one left for later is waited for (or made now)."""
        with self._lock:
            found = self.maps.get(name)
        if found is not None:
            return found
        self._maps_ready()
        return self.maps[name]

    def preload(self, names: list[str], prog_type: int = BPF_PROG_TYPE_KPROBE,
                attach_type: int = -1) -> None:
        """Load these functions now, on as many threads as there are CPUs: the kernel
        verifies each (the HTTP capture's: ~16 ms each, 23 of them), outside the GIL.
        OSError as `program` says, the first of `names` that failed (whatever else loaded is
        kept, and freed by close)."""
        todo = list(dict.fromkeys(names))
        if len(todo) > 1:
            self.load_in_background(todo, prog_type, attach_type)
        failure: OSError | None = None
        for name in todo:  # each waited for: none is loading once this returns
            try:
                self.program(name, prog_type, attach_type)
            except OSError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def load_in_background(self, names: list[str], prog_type: int = BPF_PROG_TYPE_KPROBE,
                           attach_type: int = -1, threads: int | None = None) -> None:
        """Start loading these functions on threads of their own (`threads`, else as many as
        there are CPUs; fewer for fewer functions; they end when the last is loaded) and
        return at once. `program` waits for one still loading, and raises its error where it
        failed; `background_failure` says, without waiting, whether one has."""
        with self._lock:
            todo = [key for key in dict.fromkeys((n, prog_type, attach_type) for n in names)
                    if key not in self._programs and key not in self._pending]
            if not todo:
                return
            pool = ThreadPoolExecutor(max_workers=min(len(todo), threads or os.cpu_count() or 1),
                                      thread_name_prefix="gf-bpfload")
            try:
                if self._later_made is None and any(self._uses_later(n) for n, _, _ in todo):
                    self._later_made = pool.submit(self._make_later_maps)  # first: they wait
                for key in todo:
                    self._pending[key] = pool.submit(self._load_kept, *key)
            finally:
                pool.shutdown(wait=False)  # its threads end once the queue is done

    def _load_kept(self, name: str, prog_type: int, attach_type: int) -> int:
        """A loader thread's: load one function and keep its fd, as `program` would."""
        fd = self._load(name, prog_type, attach_type)
        self._keep(fd, (name, prog_type, attach_type))
        return fd

    def _keep(self, fd: int, program: tuple[str, int, int] | None = None) -> None:
        """Hold `fd` until close (and know it as `program`'s), whichever thread made it."""
        with self._lock:
            self._fds.append(fd)
            if program is not None:
                self._programs[program] = fd

    def background_failure(self) -> tuple[bool, BaseException | None]:
        """Without waiting: whether every function loading in the background is done, and
        the error of the first (in the order they were asked for) that failed, if one has."""
        with self._lock:
            futures: list[Future[Any]] = list(self._pending.values())
            if self._later_made is not None:
                futures.insert(0, self._later_made)
        done = all(future.done() for future in futures)
        for future in futures:
            if future.done() and not future.cancelled() and future.exception() is not None:
                return done, future.exception()
        return done, None

    def wait_loaded(self) -> None:
        """Wait until nothing is loading in the background; the first failure (in the order
        they were asked for) is raised, as `program` would."""
        self._maps_ready()
        with self._lock:
            keys = list(self._pending)
        first: OSError | None = None
        for key in keys:  # every one waited for, even after a failure: then nothing loads
            try:
                self.program(*key)
            except OSError as error:
                first = first or error
        if first is not None:
            raise first

    def program(self, name: str, prog_type: int = BPF_PROG_TYPE_KPROBE,
                attach_type: int = -1) -> int:
        """The fd of function `name` loaded as `prog_type` for `attach_type` (-1: none),
        loaded (and verified by the kernel) the first time it is asked for, or when a loader
        thread has it (`load_in_background`: this waits for it). OSError, with the
        verifier's last words where it refused."""
        key = (name, prog_type, attach_type)
        with self._lock:
            known = self._programs.get(key)
            pending = self._pending.get(key)
        if known is not None:
            return known
        if pending is not None:
            try:
                return pending.result()  # the loader thread's error, if it failed
            except CancelledError:
                raise OSError(errno.ECANCELED, f"{name}: closed while it was loading"
                              ) from None
        fd = self._load(name, prog_type, attach_type)
        self._keep(fd, key)
        return fd

    def stop_loading(self) -> None:
        """Loads not started are dropped, and those under way finished (their fds kept for
        close): nothing is loading once this returns. A load takes milliseconds, so this
        never waits long."""
        with self._lock:
            futures: list[Future[Any]] = list(self._pending.values())
            if self._later_made is not None:
                futures.append(self._later_made)
        for future in futures:
            future.cancel()
        wait_for(futures)

    def _load(self, name: str, prog_type: int, attach_type: int) -> int:
        """Load one function; the caller keeps the fd."""
        spec = self.image.program(name)
        if self._uses_later(name):
            self._maps_ready()
        with self._lock:
            map_fds = list(self._map_fds)
        insns = ctypes.create_string_buffer(spec.with_fds(map_fds), len(spec.insns))
        license = ctypes.create_string_buffer(self.image.license.encode())
        attr = ProgLoad(prog_type=prog_type, insn_cnt=len(spec.insns) // 8,
                        insns=ctypes.addressof(insns), license=ctypes.addressof(license),
                        kern_version=self.image.kern_version,
                        prog_name=name.encode()[:15],
                        expected_attach_type=max(attach_type, 0))
        attempts = PROG_LOAD_ATTEMPTS
        while True:
            try:
                return bpf(BPF_PROG_LOAD, attr)
            except OSError as exc:
                attempts -= 1
                # The verifier gives up with EAGAIN when a signal is pending for the loading
                # thread (a child's SIGCHLD, say): loaded again, as libbpf does.
                if exc.errno == errno.EAGAIN and attempts > 0:
                    continue
                if exc.errno not in (errno.EINVAL, errno.EACCES, errno.E2BIG):
                    raise
                raise OSError(exc.errno,
                              f"{exc.strerror}: {self._verifier_says(attr)}") from None

    @staticmethod
    def _verifier_says(attr: ProgLoad) -> str:
        """The verifier's reason for refusing the program in `attr` (its last lines)."""
        log_buf = ctypes.create_string_buffer(_LOG_BYTES)
        attr.log_level, attr.log_size, attr.log_buf = 1, _LOG_BYTES, ctypes.addressof(log_buf)
        try:
            os.close(bpf(BPF_PROG_LOAD, attr))  # not expected: it was refused a moment ago
            return "refused once, then loaded"
        except OSError:
            pass
        lines = log_buf.value.decode(errors="replace").strip().splitlines()
        return " / ".join(lines[-3:]) or "the verifier said nothing"

    def _attach_tracepoint(self, function: str, tracefs: Path) -> None:
        category, _, event = function[len(TRACEPOINT_PREFIX):].partition("__")
        try:
            tp_id = int((tracefs / "events" / category / event / "id").read_text())
        except (OSError, ValueError) as exc:
            raise SetupError(f"the tracepoint {category}:{event} is not there ({exc})") from exc
        prog = self.program(function, BPF_PROG_TYPE_TRACEPOINT)
        attr = PerfEventAttr(type=PERF_TYPE_TRACEPOINT, size=ctypes.sizeof(PerfEventAttr),
                             config=tp_id, sample_period=1, wakeup_events=1)
        try:
            fd = syscall(NR_PERF_EVENT_OPEN, ctypes.byref(attr), -1, 0, -1, PERF_FLAG_FD_CLOEXEC)
        except OSError as exc:
            raise SetupError(f"the tracepoint {category}:{event} cannot be opened: "
                             f"{exc.strerror}") from exc
        self._keep(fd)
        try:
            fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog)
            fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
        except OSError as exc:
            raise SetupError(f"the tracepoint {category}:{event} cannot run the program: "
                             f"{exc.strerror}") from exc
        self.tracepoints[f"{category}:{event}"] = fd

    def _attach_raw_tracepoint(self, function: str) -> None:
        event = function[len(RAW_TRACEPOINT_PREFIX):]
        try:
            prog = self.program(function, BPF_PROG_TYPE_RAW_TRACEPOINT)
        except OSError as exc:
            raise SetupError(f"the raw tracepoint {event}'s program was refused: "
                             f"{exc.strerror}") from exc
        name = ctypes.create_string_buffer(event.encode())
        try:
            fd = bpf(BPF_RAW_TRACEPOINT_OPEN,
                     _RawTracepointOpen(name=ctypes.addressof(name), prog_fd=prog))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise SetupError(f"the raw tracepoint {event} is not there") from exc
            raise SetupError(f"the raw tracepoint {event} cannot run the program: "
                             f"{exc.strerror}") from exc
        self._keep(fd)
        self.tracepoints[f"raw:{event}"] = fd

    def fds(self) -> list[int]:
        with self._lock:
            return list(self._fds)

    def close(self) -> int:
        """Close every fd (tracepoints, programs, maps: the kernel frees what nothing else
        holds); how many failed (never raises)."""
        self.stop_loading()
        failed = 0
        with self._lock:
            fds, self._fds = self._fds, []
            self._programs.clear()
            self._pending.clear()
        for fd in reversed(fds):
            try:
                os.close(fd)
            except OSError:
                failed += 1
        return failed
