"""The BPF program compiled: by bcc (the one module that imports it), or read from the cache.

bcc compiles at every start (~1 s of CPU, most of it clang setting up); what comes out never
changes while its inputs do not, so the image (bpfimage.py) is kept in the cache folder, keyed
by the source, the cflags, bcc's library and the kernel, and the next start skips the compile.
bpfload.py loads the image, compiled a moment ago or read back: one path to trust.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import os
import sysconfig
from collections.abc import Callable
from pathlib import Path

from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.probe import bpfimage, bpfload
from gpuflight.producer.probe.bpfsource import bundle
from gpuflight.producer.settings import CaptureSettings

log = logging.getLogger(__name__)


def kernel_cflags(settings: CaptureSettings) -> list[str]:
    """What the program reads of the running kernel's structs, from its BTF: the offsets of
    the quiet-load filter's fd → file walk (without them the filter is compiled out: every
    dlopen is held), and where a task keeps its pid (without it, forks are followed on a
    tracepoint perf event instead of the raw tracepoint, whose release costs the kernel
    more), and, with code paths, where a task keeps its thread pointer (without it, CPython
    3.9/3.10 stacks are not walked)."""
    stacks = settings.stack_period is not None
    if not (settings.quiet_loads_on or settings.follow_forks or stacks):
        return []
    from gpuflight.producer.probe.btf import (
        Btf,
        BtfError,
        file_offsets,
        task_fsbase_cflags,
        task_pid_cflags,
    )

    try:
        btf = Btf.from_file()
    except (BtfError, OSError) as exc:
        log.info("the kernel's BTF cannot be read (%s): every dlopen is held, and forks are "
                 "followed on a tracepoint perf event", exc)
        return []
    flags: list[str] = []
    if settings.quiet_loads_on:
        try:
            flags += file_offsets(btf).cflags()
        except BtfError as exc:
            log.info("every dlopen is held: the kernel's file structs are unknown (%s)", exc)
    if settings.follow_forks:
        try:
            flags += task_pid_cflags(btf)
        except BtfError as exc:
            log.info("forks are followed on a tracepoint perf event: %s", exc)
    if stacks:
        try:
            flags += task_fsbase_cflags(btf)
        except BtfError as exc:
            log.info("CPython 3.9/3.10 stacks are not walked: %s", exc)
    return flags


@functools.cache
def thread_pointer_known() -> bool:
    """Whether the kernel's walk can find CPython 3.9/3.10 threads (kernel_cflags gives it
    the thread pointer's offset): the running kernel's BTF says where a task keeps it (read
    once, ~50 ms)."""
    from gpuflight.producer.probe.btf import Btf, BtfError, task_fsbase_cflags

    try:
        return bool(task_fsbase_cflags(Btf.from_file()))
    except (BtfError, OSError):
        return False


def program_image(
    source: Path,
    cflags: list[str],
    cache_dir: Path | None,
    kernel_cflags: Callable[[], list[str]] | None = None,
) -> bpfimage.Image:
    """The compiled `source` (with `cflags`): from the image cache in `cache_dir` where one
    was kept for exactly this source, these cflags, this bcc and this kernel, else compiled
    by bcc (~1 s) and kept there.

    The tally's bpffs folder (GF_TALLY_DIR) names only where two maps are pinned, which the
    loader is told apart (Probes): it is no part of the key, so that each agent (a folder of
    its own) finds the image of the one before. `kernel_cflags` are read from the running
    kernel (struct offsets from its BTF, ~60 ms): asked for only when the program is
    compiled, and no part of the key either, which names the kernel (release, build, BTF)
    they follow from."""
    text = bundle(source)
    key = bpfimage.image_key(
        text, [flag for flag in cflags if not flag.startswith("-DGF_TALLY_DIR=")],
        bpfimage.environment_parts(_bcc_library(), _kernel_headers()))
    cache = bpfimage.ImageCache(cache_dir)
    image = cache.load(key)
    if image is not None:
        log.debug("compiled BPF program read from %s", cache.path(key))
        return image
    image = compile_image(text, [*cflags, *(kernel_cflags() if kernel_cflags else [])])
    if cache.save(key, image):
        log.debug("compiled BPF program kept in %s", cache.path(key))
    return image


def compile_image(text: str, cflags: list[str]) -> bpfimage.Image:
    """bcc compiles `text`; the image of what it would load. The maps bcc creates meanwhile
    are freed (those it pins stay pinned), and nothing is attached."""
    try:
        from bcc import BPF, libbcc  # the one bcc import
    except ImportError as exc:
        raise SetupError(
            f"bcc cannot be imported ({exc}): apt-get install python3-bpfcc"
        ) from exc

    class CompileOnly(BPF):  # type: ignore[misc]
        def _trace_autoload(self) -> None:
            """bcc attaches tracepoint__ functions as it loads: the loader does (bpfload)."""

    try:
        compiled = CompileOnly(text=text.encode(), cflags=cflags)
    except Exception as exc:
        raise SetupError(f"the BPF program did not compile: {exc}") from exc
    atexit.unregister(compiled.cleanup)
    lib = libbcc.lib
    lib.bpf_num_tables.restype = ctypes.c_size_t
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.bpf_table_fd_id.restype = ctypes.c_int
    lib.bpf_table_fd_id.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    module = compiled.module
    try:
        maps: list[bpfimage.MapSpec] = []
        map_of_fd: dict[int, int] = {}
        for i in range(lib.bpf_num_tables(module)):
            fd = int(lib.bpf_table_fd_id(module, i))
            map_of_fd[fd] = len(maps)
            maps.append(bpfload.map_spec(fd, lib.bpf_table_name(module, i).decode()))
        programs = []
        for i in range(lib.bpf_num_functions(module)):
            name = lib.bpf_function_name(module, i)
            insns = ctypes.string_at(lib.bpf_function_start(module, name),
                                     lib.bpf_function_size(module, name))
            programs.append(bpfimage.ProgramSpec(name.decode(), insns,
                                                 bpfimage.relocations(insns, map_of_fd)))
        return bpfimage.Image(lib.bpf_module_license(module).decode(),
                              int(lib.bpf_module_kern_version(module)),
                              tuple(maps), tuple(programs))
    except (OSError, ValueError) as exc:
        raise SetupError(f"the compiled BPF program cannot be read back: {exc}") from exc
    finally:
        compiled.cleanup()


def _bcc_library() -> Path | None:
    """libbcc.so.0, the library that compiles (its Python side is upgraded with it)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for folder in (f"/usr/lib/{multiarch}", f"/lib/{multiarch}", "/usr/lib64", "/usr/lib",
                   "/usr/local/lib"):
        path = Path(folder) / "libbcc.so.0"
        if path.exists():
            return path
    return None


def _kernel_headers() -> Path | None:
    """What bcc compiles against: the running kernel's build tree (its Makefile)."""
    build = Path("/lib/modules") / os.uname().release / "build"
    return build / "Makefile" if (build / "Makefile").exists() else None
