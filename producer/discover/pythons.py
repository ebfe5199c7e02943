"""Which CPython a process runs, and where its state is: the file that holds `_PyRuntime`
(libpython, or the executable itself when it is linked statically, as Debian's
/usr/bin/python3 and python-build-standalone's are), the address of `_PyRuntime` in the
process, and the offsets of the fields a stack walk reads (issue 28: code paths).

The walk: `_PyRuntime` → its first interpreter → its threads (the one whose native thread id
is the calling thread's; 3.9/3.10 keep only `pthread_self()`) → the thread's current frame →
each frame's code object and instruction → `previous`/`f_back`, bounded.

Offsets: CPython 3.13 and later describe themselves (`_Py_DebugOffsets`, at the start of
`_PyRuntime`, initialised in .data: read from the file, no symbols beyond `_PyRuntime`
needed); 3.9-3.12 are this module's table, measured with `offsetof` against each version's
own internal headers (`scripts/python-offsets`) and checked against a live interpreter by the
tests. A version neither describes is "not found", said once per file, and the process gets
native callers only.
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from gpuflight.producer.discover import elfsyms

log = logging.getLogger(__name__)

#: The cookie `_Py_DebugOffsets` begins with (3.13+).
DEBUG_COOKIE: Final = b"xdebugpy"
#: An offset a version does not have, in struct gf_py_offsets (GF_PY_NONE).
NONE: Final = 0xFFFF

_LIBPYTHON = re.compile(r"libpython3\.(\d+)[a-z]*\.so")
_EXECUTABLE = re.compile(r"python3\.(\d+)[a-z]*$")


@dataclass(frozen=True, slots=True)
class PyLayout:
    """Byte offsets of what a stack walk reads, for one CPython version (x86-64).

    `frames` is "interpreter" (3.11+: `_PyInterpreterFrame`, the code object and the
    instruction pointer in it) or "object" (3.9/3.10: `PyFrameObject`, `f_lasti`)."""

    version: tuple[int, int]
    frames: str
    runtime_interpreters_head: int
    interp_threads_head: int
    tstate_next: int
    #: 3.11+: the thread's kernel tid; 3.9/3.10: none (-1), `thread_id` is pthread_self().
    tstate_native_thread_id: int
    tstate_thread_id: int
    #: 3.11/3.12: tstate->cframe, then cframe->current_frame; 3.13+: tstate->current_frame
    #: (cframe -1); 3.9/3.10: tstate->frame (cframe -1).
    tstate_cframe: int
    cframe_current_frame: int
    tstate_current_frame: int
    frame_previous: int
    frame_code: int
    #: 3.11/3.12: prev_instr, 3.13+: instr_ptr (pointers into co_code_adaptive);
    #: 3.9/3.10: f_lasti (an int: bytes on 3.9, code units on 3.10).
    frame_instr: int
    #: 3.11+: the frame's owner byte (3: a C stack shim frame, skipped); else -1.
    frame_owner: int
    code_filename: int
    code_name: int
    #: 3.11+ (co_qualname); -1 before (co_name is all there is).
    code_qualname: int
    code_firstlineno: int
    #: co_linetable (3.10+) or co_lnotab (3.9).
    code_linetable: int
    #: 3.11+: where the instructions start in the code object; -1 before.
    code_adaptive: int
    unicode_state: int
    unicode_ascii_data: int
    unicode_compact_data: int
    bytes_size: int
    bytes_data: int


def _interpreter_frames(version: tuple[int, int], **fields: int) -> PyLayout:
    base = dict(frames="interpreter", tstate_next=8, unicode_state=32, bytes_size=16,
                bytes_data=32, code_filename=112, code_name=120, code_qualname=128,
                code_linetable=136, frame_instr=56)
    return PyLayout(version=version, **{**base, **fields})  # type: ignore[arg-type]


def _object_frames(version: tuple[int, int], lasti: int) -> PyLayout:
    return PyLayout(
        version=version, frames="object", runtime_interpreters_head=32,
        interp_threads_head=8, tstate_next=8, tstate_native_thread_id=-1,
        tstate_thread_id=176, tstate_cframe=-1, cframe_current_frame=-1,
        tstate_current_frame=24, frame_previous=24, frame_code=32, frame_instr=lasti,
        frame_owner=-1, code_filename=104, code_name=112, code_qualname=-1,
        code_firstlineno=40, code_linetable=120, code_adaptive=-1, unicode_state=32,
        unicode_ascii_data=48, unicode_compact_data=72, bytes_size=16, bytes_data=32)


#: Measured with offsetof against each version's internal headers (scripts/python-offsets).
LAYOUTS: Final[dict[tuple[int, int], PyLayout]] = {
    (3, 9): _object_frames((3, 9), lasti=104),
    (3, 10): _object_frames((3, 10), lasti=96),
    (3, 11): _interpreter_frames(
        (3, 11), runtime_interpreters_head=40, interp_threads_head=16,
        tstate_native_thread_id=160, tstate_thread_id=152, tstate_cframe=56,
        cframe_current_frame=8, tstate_current_frame=-1, frame_previous=48, frame_code=32,
        frame_owner=69, code_firstlineno=72, code_adaptive=184, unicode_ascii_data=48,
        unicode_compact_data=72),
    (3, 12): _interpreter_frames(
        (3, 12), runtime_interpreters_head=40, interp_threads_head=72,
        tstate_native_thread_id=144, tstate_thread_id=136, tstate_cframe=56,
        cframe_current_frame=0, tstate_current_frame=-1, frame_previous=8, frame_code=0,
        frame_owner=70, code_firstlineno=68, code_adaptive=192, unicode_ascii_data=40,
        unicode_compact_data=56),
    (3, 13): _interpreter_frames(
        (3, 13), runtime_interpreters_head=632, interp_threads_head=7344,
        tstate_native_thread_id=160, tstate_thread_id=152, tstate_cframe=-1,
        cframe_current_frame=-1, tstate_current_frame=72, frame_previous=8, frame_code=0,
        frame_owner=70, code_firstlineno=68, code_adaptive=200, unicode_ascii_data=40,
        unicode_compact_data=56),
}


@dataclass(frozen=True, slots=True)
class PythonRuntime:
    """A process's CPython: the file holding `_PyRuntime`, its address in the process, and
    the layout to walk its stacks with."""

    path: str
    runtime_address: int
    layout: PyLayout
    #: Where the layout came from: "_Py_DebugOffsets" or "table".
    source: str

    def walkable(self, thread_pointer: bool) -> bool:
        """Whether the kernel can walk it: 3.11+ (`_PyInterpreterFrame`s, threads by native
        id); 3.9/3.10 (threads by pthread_self()) where the kernel's walk reads the thread
        pointer (`thread_pointer`: the task's fsbase offset is known, from its BTF)."""
        if self.layout.frames == "interpreter":
            return self.layout.tstate_native_thread_id >= 0
        return thread_pointer and self.layout.tstate_thread_id >= 0

    def offsets_record(self) -> bytes:
        """struct gf_py_offsets (bpf/pywalk.bpf.h): what the kernel's walk reads by."""
        o = self.layout
        objects = o.frames == "object"
        fields = [o.runtime_interpreters_head, o.interp_threads_head, o.tstate_next,
                  o.tstate_native_thread_id, o.tstate_cframe, o.cframe_current_frame,
                  o.tstate_current_frame, o.frame_previous, o.frame_code, o.frame_instr,
                  o.frame_owner, o.tstate_thread_id if objects else -1, 4 if objects else 8,
                  0, 0, 0]
        return struct.pack("<Q16H", self.runtime_address,
                           *(NONE if f < 0 else f for f in fields))


def version_of(path: str) -> tuple[int, int] | None:
    """CPython's version from a file's name (libpython3.X.so…, python3.X), else None."""
    name = Path(path).name
    found = _LIBPYTHON.search(name) or _EXECUTABLE.search(name)
    return (3, int(found.group(1))) if found else None


def debug_offsets(path: str, runtime_vaddr: int) -> PyLayout | None:
    """The layout `_Py_DebugOffsets` gives (3.13: the initialiser of `_PyRuntime` in the
    file), None where the file has none (3.12 and before, or `_PyRuntime` not in .data)."""
    offset = elfsyms.vaddr_to_file_offset(path, runtime_vaddr)
    if offset is None:
        return None
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            raw = file.read(8 + 8 * 80)
    except OSError:
        return None
    if len(raw) < 8 + 8 * 80 or raw[:8] != DEBUG_COOKIE:
        return None
    words = struct.unpack_from("<80Q", raw, 8)
    version_hex = words[0]
    version = (version_hex >> 24 & 0xFF, version_hex >> 16 & 0xFF)
    if version != (3, 13):  # the layout of _Py_DebugOffsets itself is 3.13's
        log.info("%s: _Py_DebugOffsets of %d.%d, not read (3.13's layout only)", path,
                 *version)
        return None
    # 3.13's struct, in order: version, free_threaded, runtime_state{size, finalizing,
    # interpreters_head}, interpreter_state{size, id, next, threads_head, gc, imports_modules,
    # sysdict, builtins, ceval_gil, gil_runtime_state, gil_enabled, gil_locked, gil_holder},
    # thread_state{size, prev, next, interp, current_frame, thread_id, native_thread_id,
    # datastack_chunk, status}, interpreter_frame{size, previous, executable, instr_ptr,
    # localsplus, owner}, code_object{size, filename, name, qualname, linetable, firstlineno,
    # argcount, localsplusnames, localspluskinds, co_code_adaptive}, pyobject{size, ob_type},
    # type_object{size, tp_name, tp_repr, tp_flags}, tuple{3}, list{3}, dict{3}, float{2},
    # long{3}, bytes_object{size, ob_size, ob_sval}, unicode_object{size, state, length,
    # asciiobject_size}, gc{2}.
    if words[1]:  # free-threaded: another frame and thread layout
        log.info("%s: a free-threaded CPython: no stacks", path)
        return None
    rt, interp, ts, fr, co = 2, 5, 18, 27, 33
    bytes_at = co + 10 + 2 + 4 + 3 + 3 + 3 + 2 + 3
    uni = bytes_at + 3
    table = LAYOUTS[(3, 13)]
    return replace(
        table,
        runtime_interpreters_head=words[rt + 2], interp_threads_head=words[interp + 3],
        tstate_next=words[ts + 2], tstate_current_frame=words[ts + 4],
        tstate_thread_id=words[ts + 5], tstate_native_thread_id=words[ts + 6],
        frame_previous=words[fr + 1], frame_code=words[fr + 2], frame_instr=words[fr + 3],
        frame_owner=words[fr + 5], code_filename=words[co + 1], code_name=words[co + 2],
        code_qualname=words[co + 3], code_linetable=words[co + 4],
        code_firstlineno=words[co + 5], code_adaptive=words[co + 9],
        bytes_size=words[bytes_at + 1], bytes_data=words[bytes_at + 2],
        unicode_state=words[uni + 1], unicode_ascii_data=words[uni + 3])


def version_in(path: str) -> tuple[int, int] | None:
    """CPython's version from the file itself: `Py_Version` (3.11+, PY_VERSION_HEX in
    .rodata), for a file whose name does not say (a renamed or embedding executable)."""
    vaddr = elfsyms.symbol_address(path, "Py_Version")
    offset = elfsyms.vaddr_to_file_offset(path, vaddr) if vaddr is not None else None
    if offset is None:
        return None
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            raw = file.read(4)
    except OSError:
        return None
    if len(raw) != 4:
        return None
    hexversion = int.from_bytes(raw, "little")
    return (hexversion >> 24 & 0xFF, hexversion >> 16 & 0xFF)


def runtime_of(path: str) -> tuple[int, PyLayout, str] | None:
    """(`_PyRuntime`'s st_value, the layout, its source) of a file that defines
    `_PyRuntime`, or None: not a CPython, or a version neither the file nor the table
    describes."""
    vaddr = elfsyms.symbol_address(path, "_PyRuntime")
    if vaddr is None:
        return None
    described = debug_offsets(path, vaddr)
    if described is not None:
        return vaddr, described, "_Py_DebugOffsets"
    version = version_of(path) or version_in(path)
    layout = LAYOUTS.get(version) if version is not None else None
    if layout is None:
        known = "of an unknown version" if version is None else f"{version[0]}.{version[1]}"
        log.info("%s: CPython %s is not one gpuflight can walk", path, known)
        return None
    return vaddr, layout, "table"


def find_python(proc_root: Path, pid: int) -> PythonRuntime | None:
    """The CPython process `pid` runs, from its maps: the first mapped file that defines
    `_PyRuntime` (libpython, else the executable), or None."""
    try:
        maps = (proc_root / str(pid) / "maps").read_text()
    except OSError:
        return None
    bases: dict[str, int] = {}
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        start = int(fields[0].split("-")[0], 16)
        path = fields[5]
        if int(fields[2], 16) == 0 and path not in bases:
            bases[path] = start
    candidates = [p for p in bases if _LIBPYTHON.search(Path(p).name)]
    exe = _exe(proc_root, pid)
    # The executable whatever its name (a static CPython renamed, or one embedding it).
    candidates += [p for p in bases if p == exe or _EXECUTABLE.search(Path(p).name)]
    for path in dict.fromkeys(candidates):
        # Read through the process's root: the path is the one it sees.
        host = f"{proc_root}/{pid}/root{path}"
        found = runtime_of(host)
        if found is None:
            continue
        vaddr, layout, source = found
        bias = bases[path] - _first_load_vaddr(host)
        return PythonRuntime(path, bias + vaddr, layout, source)
    return None


def _exe(proc_root: Path, pid: int) -> str | None:
    try:
        return str(Path(proc_root / str(pid) / "exe").readlink())
    except OSError:
        return None


def _first_load_vaddr(path: str) -> int:
    """The page of the first PT_LOAD's p_vaddr (0 for a shared object or a PIE; the link
    address for a fixed executable): where the mapping at file offset 0 starts."""
    first = elfsyms.file_offset_to_vaddr(path, 0)
    return 0 if first is None else first & ~0xFFF
