"""Build the simulated GPU: our libcuda.so.1 (driver) and libcudart.so.13/.12 (runtime).

    sim = build(outdir)                 compile (or reuse) everything under outdir
    env = sim.env(devices=2, counts=p)  the environment a command runs on it with
    counts = read_counts(p)             the counts the processes of such a run wrote

NVIDIA's headers (cuda.h, cudaTypedefs.h, cuda_runtime_api.h) are read at build
time, from the CUDA wheels of the running interpreter or of the frameworks venv
(`.cache/frameworks/venv`), or from $GF_SIM_CUDA13_INCLUDE / $GF_SIM_CUDA12_INCLUDE.
From them the build generates, for each library, stubs for every exported name we
do not implement (each returns success and counts its calls), and for the driver the
cuGetProcAddress table (name + CUDA version -> versioned entry point). Outputs are
rebuilt only when their inputs change (a digest of sources, headers and commands: the
whole build's in OUTDIR/simgpu.digest, each compile's by cbuild.compile_c) and are written
to temporary names then renamed, so concurrent builders are safe.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflight.simgpu import cbuild
from gpuflight.simgpu.cbuild import (
    BuildError,
    c_compiler,
    compile_c,
    digest,
    replace_atomically,
    run_tool,
    write_if_changed,
)

SIMGPU_DIR = Path(__file__).resolve().parent
COMPAT_DIR = SIMGPU_DIR / "compat"
DRIVER_SOURCES = ("driver.c", "driver_api.inc", "simgpu.h", "timing.h", "activity.h")
NVML_SOURCES = ("nvml.c", "activity.h")
RUNTIME_SOURCES = ("runtime.c", "compat/crt/host_defines.h")

DRIVER_SONAME = "libcuda.so.1"
NVML_SONAME = "libnvidia-ml.so.1"
RUNTIME_SONAMES = {13: "libcudart.so.13", 12: "libcudart.so.12"}

CFLAGS: tuple[str, ...] = (
    "-std=gnu11",
    "-O2",
    "-g",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-deprecated-declarations",
    # Every exported entry point keeps its own body and prologue (uprobe-able):
    # identical bodies must not be folded into one that jumps into another.
    "-fno-ipa-icf",
    "-fno-optimize-sibling-calls",
    # And starts as NVIDIA's runtime does (every function of libcudart 12 and 13 begins
    # `push %rbp`): a uprobe there is emulated by the kernel, ~0.4 us a call on our VMs,
    # where one on an instruction it must single-step (`sub $8,%rsp`, as -O2 starts many
    # functions otherwise) costs ~17 us. The simulated GPU must cost what the real one does:
    # PyTorch registers ~25,000 kernels at import (bench/results/startup.md, run 12).
    "-fno-omit-frame-pointer",
    "-fvisibility=hidden",
)


# ---- headers ---------------------------------------------------------------------------


def _site_dirs() -> list[Path]:
    dirs = [Path(p) for p in sys.path if p.endswith("site-packages")]
    repo = SIMGPU_DIR.parent.parent
    for venv in (repo / ".cache" / "frameworks" / "venv",):
        dirs += [Path(p) for p in glob.glob(str(venv / "lib" / "python3*" / "site-packages"))]
    return dirs


def _cudart_version(include: Path) -> int:
    try:
        text = (include / "cuda_runtime_api.h").read_text(errors="replace")
    except OSError:
        return 0
    m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", text)
    return int(m.group(1)) if m else 0


def find_cuda_include(major: int) -> Path:
    """The include directory of CUDA `major` (13 or 12): cuda.h, cuda_runtime_api.h."""
    env = os.environ.get(f"GF_SIM_CUDA{major}_INCLUDE")
    candidates = [Path(env)] if env else []
    for site in _site_dirs():
        candidates += [
            site / "nvidia" / "cu13" / "include",
            site / "nvidia" / "cuda_runtime" / "include",
        ]
    for inc in candidates:
        if (inc / "cuda.h").is_file() and _cudart_version(inc) // 1000 == major:
            return inc
    raise BuildError(
        f"no CUDA {major} headers (cuda.h, cuda_runtime_api.h): install the "
        f"nvidia-cuda-runtime{'-cu12' if major == 12 else ''} wheel, or set "
        f"GF_SIM_CUDA{major}_INCLUDE"
    )


# ---- tools ---------------------------------------------------------------------------------


def _preprocess(include: Path, text: str, defines: Iterable[str] = ()) -> str:
    cmd = [c_compiler(), "-E", "-P", f"-I{COMPAT_DIR}", f"-I{include}",
           *(f"-D{d}" for d in defines), "-x", "c", "-"]
    return run_tool(cmd, f"preprocessing the CUDA headers in {include}", stdin=text)


def _defined_symbols(obj: Path) -> set[str]:
    out = run_tool(["nm", "--defined-only", "-g", str(obj)], f"nm could not read {obj.name}")
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


# ---- generators -------------------------------------------------------------------------------


def driver_symbols(include: Path) -> set[str]:
    """Every driver function name cuda.h declares (current, legacy and per-thread forms)."""
    text = _preprocess(include, "#include <cuda.h>\n", ["__CUDA_API_VERSION_INTERNAL=1"])
    names = set(re.findall(r"\bCUresult\s+(cu\w+)\s*\(", text))
    text = _preprocess(include, "#include <cuda.h>\n")
    names |= set(re.findall(r"\bCUresult\s+(cu\w+)\s*\(", text))
    return names


def runtime_symbols(include: Path) -> set[str]:
    """Every runtime function name cuda_runtime_api.h declares (also _ptds/_ptsz forms)."""
    names: set[str] = set()
    for defines in ((), ("CUDA_API_PER_THREAD_DEFAULT_STREAM=1",)):
        text = _preprocess(include, "#include <cuda_runtime_api.h>\n", defines)
        for decl in re.findall(r"extern\s+[^;{}]*?\b(cuda\w+)\s*\(", text):
            names.add(decl)
    return names


def _macro_targets(include: Path) -> dict[str, str]:
    text = (include / "cuda.h").read_text(errors="replace")
    out: dict[str, str] = {}
    pat = r"^\s*#\s*define\s+(cu\w+)\s+(?:__CUDA_API_PT(?:DS|SZ)\()?\s*(cu\w+)\s*\)?\s*$"
    for m in re.finditer(pat, text, re.M):
        name, target = m.group(1), m.group(2)
        if target.endswith(("_ptds", "_ptsz")) or name in out:
            continue
        out[name] = target
    return out


@dataclass(frozen=True)
class ProcEntry:
    """One row of the cuGetProcAddress table: from `version` on, `name` is `symbol`
    (and `per_thread` under CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)."""

    name: str
    version: int
    symbol: str
    per_thread: str


def proc_table(include: Path, symbols: set[str]) -> list[ProcEntry]:
    """The cuGetProcAddress table, from cudaTypedefs.h's PFN_<name>_v<version> typedefs.

    For each name, the newest version is the symbol cuda.h's macro maps the name to
    (cuMemAlloc -> cuMemAlloc_v2), else the name itself; older versions take the older
    symbols of the chain name, name_v2, name_v3 ... newest first. The per-thread form
    of a version is its symbol + _ptds/_ptsz, from the first per-thread typedef on.
    """
    text = _preprocess(include, "#include <cudaTypedefs.h>\n", ["__CUDA_API_VERSION_INTERNAL=1"])
    versions: dict[str, set[int]] = {}
    pt_versions: dict[str, set[int]] = {}
    for m in re.finditer(r"\*\s*PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\s*\)", text):
        base, ver, pt = m.group(1), int(m.group(2)), m.group(3)
        (pt_versions if pt else versions).setdefault(base, set()).add(ver)
    macros = _macro_targets(include)
    entries: list[ProcEntry] = []
    for base in sorted(set(versions) | set(pt_versions)):
        vs = sorted(versions.get(base, set()) | pt_versions.get(base, set()))
        np_vs = sorted(versions.get(base, set())) or vs
        chain = [s for s in [base] + [f"{base}_v{k}" for k in range(2, 8)] if s in symbols]
        target = macros.get(base, base)
        if target == base and chain:
            target = chain[-1]
        if target not in symbols:
            target = base if base in symbols else ""
        older = chain[: chain.index(target)] if target in chain else chain
        if not target and not chain:
            continue
        sym_of: dict[int, str] = {}
        for i, ver in enumerate(reversed(np_vs)):
            if i == 0:
                sym_of[ver] = target or chain[-1]
            else:
                k = len(older) - i
                sym_of[ver] = older[k] if k >= 0 else (older[0] if older else sym_of[np_vs[-1]])
        pt_min = min(pt_versions[base]) if base in pt_versions else None
        for ver in vs:
            below = [v for v in np_vs if v <= ver]
            sym = sym_of[max(below)] if below else sym_of[np_vs[0]]
            pt_sym = sym
            if pt_min is not None and ver >= pt_min:
                for suffix in ("_ptds", "_ptsz"):
                    if sym + suffix in symbols:
                        pt_sym = sym + suffix
                        break
            entries.append(ProcEntry(base, ver, sym, pt_sym))
    # cuGraphInstantiate became cuGraphInstantiateWithFlags in CUDA 12 (another name).
    if "cuGraphInstantiateWithFlags" in symbols:
        entries.append(
            ProcEntry(
                "cuGraphInstantiate",
                12000,
                "cuGraphInstantiateWithFlags",
                "cuGraphInstantiateWithFlags",
            )
        )
        entries = [e for e in entries if not (e.name == "cuGraphInstantiate" and e.version < 12000)]
        entries += [
            ProcEntry("cuGraphInstantiate", 10000, "cuGraphInstantiate", "cuGraphInstantiate"),
            ProcEntry(
                "cuGraphInstantiate", 11000, "cuGraphInstantiate_v2", "cuGraphInstantiate_v2"
            ),
        ]
    # Names exported without a typedef are found at any version.
    covered = {e.name for e in entries}
    for sym in sorted(symbols):
        if sym not in covered and not sym.endswith(("_ptds", "_ptsz")):
            entries.append(ProcEntry(sym, 0, sym, sym))
    return sorted(entries, key=lambda e: (e.name, e.version))


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def driver_procs_c(entries: Sequence[ProcEntry]) -> str:
    """C source of the driver's sim_proc_lookup() over `entries`."""
    syms = sorted({e.symbol for e in entries} | {e.per_thread for e in entries})
    lines = ["/* Generated by gpuflight/simgpu/build.py from cudaTypedefs.h: do not edit. */"]
    lines.append("#include <stddef.h>\n#include <string.h>")
    lines += [f"extern void {s}(void);" for s in syms]
    lines.append(
        "struct proc { const char *name; int version; void (*fn)(void); void (*pt)(void); };"
    )
    lines.append("static const struct proc procs[] = {")
    lines += [
        f"\t{{{_c_string(e.name)}, {e.version}, {e.symbol}, {e.per_thread}}}," for e in entries
    ]
    lines.append("};")
    lines.append(
        """
void *sim_proc_lookup(const char *name, int version, int per_thread, int *status)
{
	size_t lo = 0, hi = sizeof(procs) / sizeof(procs[0]), i;
	const struct proc *best = NULL;
	int found = 0;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (strcmp(procs[mid].name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (i = lo; i < sizeof(procs) / sizeof(procs[0]) && !strcmp(procs[i].name, name); i++) {
		found = 1;
		if (procs[i].version <= version)
			best = &procs[i];
	}
	if (!best) {
		*status = found ? 2 : 1; /* VERSION_NOT_SUFFICIENT : SYMBOL_NOT_FOUND */
		return NULL;
	}
	*status = 0;
	return (void *)(per_thread ? best->pt : best->fn);
}
"""
    )
    return "\n".join(lines) + "\n"


#: NVIDIA's driver (libcuda 535) marks itself torn down by this value in a word its thunks test.
NVIDIA_TORN_DOWN = 0x321CBA00
#: What a thunk returns once the driver is torn down: CUDA_ERROR_DEINITIALIZED.
_DEINITIALIZED = 4


def nvidia_thunks_s(names: Sequence[str], impl_prefix: str) -> str:
    """Assembly (GNU as, x86-64) of one exported thunk per name, the shape NVIDIA's driver
    gives every exported function (libcuda 535):

        NAME:  cmpl $0x321cba00, torn_down(%rip)   # 10 bytes: the kernel single-steps it
               je   1f                             # emulated: where gpuflight's probes go
               jmp  *ptr(%rip)                     # a tail call into the implementation
        1:     mov  $4, %eax                       # CUDA_ERROR_DEINITIALIZED
               ret

    `impl_prefix` + NAME is the implementation each jumps to (defined elsewhere, made hidden
    here). The torn-down word is never set: the simulated driver is never torn down."""
    flag = f"{impl_prefix}torn_down"
    lines = [
        "/* Generated by gpuflight/simgpu/build.py: do not edit. */",
        "\t.bss",
        "\t.p2align 2",
        f"\t.globl {flag}",
        f"\t.hidden {flag}",
        f"{flag}:\t.zero 4",
    ]
    for name in names:
        impl = f"{impl_prefix}{name}"
        lines += [
            f"\t.hidden {impl}",
            "\t.section .data.rel.ro,\"aw\"",
            "\t.p2align 3",
            f"{impl}_ptr:\t.quad {impl}",
            "\t.text",
            "\t.p2align 4",
            f"\t.globl {name}",
            f"\t.type {name}, @function",
            f"{name}:",
            f"\tcmpl ${NVIDIA_TORN_DOWN:#x}, {flag}(%rip)",
            "\tje 1f",
            f"\tjmp *{impl}_ptr(%rip)",
            f"1:\tmovl ${_DEINITIALIZED}, %eax",
            "\tret",
            f"\t.size {name}, .-{name}",
        ]
    lines.append('\t.section .note.GNU-stack,"",@progbits')
    return "\n".join(lines) + "\n"


def stubs_c(names: Sequence[str], hit: str, prefix: str) -> str:
    """C source of one stub per name: counts its call (`hit(id)`), returns 0 (success)."""
    lines = [
        "/* Generated by gpuflight/simgpu/build.py: do not edit. */",
        f"void {hit}(unsigned int id);",
        f"const char *const {prefix}_stub_names[] = {{",
        *(f"\t{_c_string(n)}," for n in names),
        "\t0,",
        "};",
        f"const unsigned int {prefix}_stub_count = {len(names)};",
    ]
    for i, n in enumerate(names):
        lines.append(
            f'__attribute__((visibility("default"), noinline)) int {n}(void) '
            f"{{ {hit}({i}u); return 0; }}"
        )
    return "\n".join(lines) + "\n"


# ---- the build ---------------------------------------------------------------------------------


#: The CUDA headers whose content the build depends on (they include the rest).
HEADERS = ("cuda.h", "cudaTypedefs.h", "cuda_runtime_api.h", "driver_types.h")


def _headers(include: Path) -> list[Path]:
    return [include / name for name in HEADERS if (include / name).is_file()]


def _header_bytes(include: Path) -> list[bytes]:
    out = []
    for name in HEADERS:
        try:
            out.append((include / name).read_bytes())
        except OSError:
            out.append(b"")
    return out


def _sources(names: Iterable[str]) -> list[Path]:
    return [SIMGPU_DIR / name for name in names]


#: What driver.c's implementation of each exported function is renamed to: the exported name
#: is NVIDIA's thunk (nvidia_thunks_s), which jumps to it.
IMPL_PREFIX = "gfsim_impl_"


def _build_driver(outdir: Path, inc13: Path, *, link: bool = True) -> list[Path]:
    """The driver's objects and generated sources; linked as OUTDIR/libcuda.so.1 if `link`."""
    work = outdir / "gen"
    work.mkdir(parents=True, exist_ok=True)
    obj = compile_c(work / "driver.o", [SIMGPU_DIR / "driver.c"],
                    [f"-I{inc13}", f"-I{SIMGPU_DIR}", "-c"],
                    inputs=[*_sources(DRIVER_SOURCES[1:]), *_headers(inc13)], cflags=CFLAGS)
    symbols = driver_symbols(inc13)
    defined = _defined_symbols(obj)
    stubs = sorted(s for s in symbols if s not in defined)
    # Every function of the API driver.c defines is entered as NVIDIA's are, through a thunk
    # (its first instruction single-stepped at a probe): what gpuflight attaches past.
    thunked = sorted(s for s in symbols if s in defined)
    renames = write_if_changed(work / "driver_renames.txt", "".join(
        f"{name} {IMPL_PREFIX}{name}\n" for name in thunked))
    impl = work / "driver_impl.o"
    renamed = impl.with_name(f".{impl.name}.{os.getpid()}.tmp")
    try:
        run_tool([shutil.which("objcopy") or "objcopy", f"--redefine-syms={renames}", str(obj),
                  str(renamed)], "objcopy could not rename driver.c's functions")
        replace_atomically(renamed, impl)
    finally:
        renamed.unlink(missing_ok=True)
    thunks = write_if_changed(work / "driver_thunks.S", nvidia_thunks_s(thunked, IMPL_PREFIX))
    entries = proc_table(inc13, symbols)
    stub_src = write_if_changed(work / "driver_stubs.c", stubs_c(stubs, "sim_stub_hit", "sim"))
    proc_src = write_if_changed(work / "driver_procs.c", driver_procs_c(entries))
    parts = [impl, thunks, stub_src, proc_src]
    if not link:
        return parts
    compile_c(outdir / DRIVER_SONAME, parts,
              ["-shared", f"-Wl,-soname,{DRIVER_SONAME}", "-Wl,-z,defs", "-lpthread", "-ldl"],
              cflags=CFLAGS)
    for alias in ("libcuda.so",):
        alias_link = outdir / alias
        if not alias_link.is_symlink():
            alias_link.unlink(missing_ok=True)
            alias_link.symlink_to(DRIVER_SONAME)
    return parts


def _build_nvml(outdir: Path) -> None:
    """libnvidia-ml.so.1: NVML over the driver's activity logs (nvml.c; no CUDA headers)."""
    compile_c(outdir / NVML_SONAME, [SIMGPU_DIR / "nvml.c"],
              ["-shared", f"-Wl,-soname,{NVML_SONAME}", "-Wl,-z,defs", f"-I{SIMGPU_DIR}",
               "-lpthread"],
              inputs=_sources(NVML_SOURCES[1:]), cflags=CFLAGS)


def _build_runtime(outdir: Path, major: int, include: Path,
                   driver_inside: Sequence[Path] = ()) -> None:
    """libcudart.so.MAJOR: on libcuda.so.1 of outdir, or with the driver's objects
    (`driver_inside`) linked into it, their functions not exported."""
    soname = RUNTIME_SONAMES[major]
    work = outdir / "gen"
    obj = compile_c(work / f"runtime{major}.o", [SIMGPU_DIR / "runtime.c"],
                    [f"-I{COMPAT_DIR}", f"-I{include}", f"-I{SIMGPU_DIR}",
                     f'-DGF_SIM_SONAME="{soname}"', "-c"],
                    inputs=[*_sources(RUNTIME_SOURCES[1:]), *_headers(include)], cflags=CFLAGS)
    defined = _defined_symbols(obj)
    stubs = sorted(s for s in runtime_symbols(include) if s not in defined)
    stub_src = write_if_changed(work / f"runtime{major}_stubs.c",
                                stubs_c(stubs, "rt_stub_hit", "rt"))
    script = write_if_changed(
        work / f"runtime{major}.map",
        f"{soname} {{\n  global:\n    cuda*;\n    __cuda*;\n    gfsim_*;\n  local:\n    *;\n}};\n",
    )
    if driver_inside:
        compile_c(outdir / soname, [obj, stub_src, *driver_inside],
                  ["-shared", f"-Wl,-soname,{soname}", f"-Wl,--version-script={script}",
                   "-Wl,-z,defs", "-lpthread", "-ldl"],
                  inputs=[script], cflags=CFLAGS)
        return
    compile_c(outdir / soname, [obj, stub_src],
              ["-shared", f"-Wl,-soname,{soname}", f"-Wl,--version-script={script}",
               f"-L{outdir}", f"-l:{DRIVER_SONAME}", "-Wl,-rpath,$ORIGIN", "-lpthread", "-ldl"],
              inputs=[script, outdir / DRIVER_SONAME], cflags=CFLAGS)


@dataclass(frozen=True)
class SimGpu:
    """A built simulated GPU: `lib_dir` holds libcuda.so.1 (+ libcuda.so) and the runtimes."""

    lib_dir: Path

    @property
    def driver(self) -> Path:
        """Our libcuda.so.1."""
        return self.lib_dir / DRIVER_SONAME

    @property
    def nvml(self) -> Path:
        """Our libnvidia-ml.so.1 (GPUFLIGHT_NVML_LIB names it to gpuflight)."""
        return self.lib_dir / NVML_SONAME

    def runtime(self, major: int = 13) -> Path:
        """Our libcudart.so.<major> (13 or 12)."""
        return self.lib_dir / RUNTIME_SONAMES[major]

    def env(
        self,
        devices: int = 1,
        counts: Path | str | None = None,
        runtime: int = 13,
        base: Mapping[str, str] | None = None,
        nvml_dir: Path | str | None = None,
    ) -> dict[str, str]:
        """The environment (a copy of `base`, default os.environ) that runs a command on
        the simulated GPU: LD_PRELOAD of our runtime and driver (torch's RPATH would
        otherwise win), TRITON_LIBCUDA_PATH, GF_SIM_DEVICES and GF_SIM_COUNTS; with
        `nvml_dir`, GF_SIM_NVML_DIR (the activity logs our NVML reads: real-time mode only)
        and GPUFLIGHT_NVML_LIB (our NVML, for gpuflight run in this environment)."""
        env = dict(os.environ if base is None else base)
        preload = [str(self.runtime(runtime)), str(self.driver)]
        if env.get("LD_PRELOAD"):
            preload.append(env["LD_PRELOAD"])
        env["LD_PRELOAD"] = " ".join(preload)
        env["TRITON_LIBCUDA_PATH"] = str(self.lib_dir)
        env["GF_SIM_DEVICES"] = str(devices)
        if counts is not None:
            env["GF_SIM_COUNTS"] = str(counts)
        else:
            env.pop("GF_SIM_COUNTS", None)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if nvml_dir is not None:
            env["GF_SIM_NVML_DIR"] = str(nvml_dir)
            env["GPUFLIGHT_NVML_LIB"] = str(self.nvml)
        return env


def build(outdir: Path | str, runtimes: Sequence[int] = (13, 12), *,
          driver_inside: bool = False) -> SimGpu:
    """Compile (or reuse, by digest of sources and headers) the simulated GPU in `outdir`.

    With `driver_inside`, each runtime holds the driver (not exported) and there is no
    libcuda.so.1: the simulated GPU of a program that calls only the runtime API (the demo's,
    the tests' "stub" runtime), which gpuflight probes as a runtime alone. Node-wide, a process
    on files already probed is seen from its first call, and its runtime's calls into a
    libcuda.so.1 would be counted too until the agent has read its maps (its runtime's text,
    which tells them apart: bpf/cudart.bpf.c, the two layers)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    inc13 = find_cuda_include(13)
    incs = {m: (inc13 if m == 13 else find_cuda_include(m)) for m in runtimes}
    sources = [(SIMGPU_DIR / s).read_bytes()
               for s in (*DRIVER_SOURCES, *RUNTIME_SOURCES, *NVML_SOURCES)]
    parts: list[str | bytes] = [*CFLAGS, Path(__file__).read_bytes(),
                                Path(cbuild.__file__).read_bytes(), *sources, c_compiler()]
    for m in sorted(incs):
        parts += [str(m), *_header_bytes(incs[m])]
    parts.append(f"driver_inside={driver_inside}")
    want = digest(parts)[:16]
    stamp = outdir / "simgpu.digest"
    outputs = [outdir / NVML_SONAME, *(outdir / RUNTIME_SONAMES[m] for m in incs)]
    if not driver_inside:
        outputs.append(outdir / DRIVER_SONAME)
    try:
        if stamp.read_text() == want and all(p.is_file() for p in outputs):
            return SimGpu(outdir)
    except OSError:
        pass
    driver = _build_driver(outdir, inc13, link=not driver_inside)
    if driver_inside:  # no driver of an earlier build beside the runtimes
        for stale in (DRIVER_SONAME, f"{DRIVER_SONAME}.inputs", "libcuda.so"):
            (outdir / stale).unlink(missing_ok=True)
    _build_nvml(outdir)
    for m in sorted(incs, reverse=True):
        _build_runtime(outdir, m, incs[m], driver if driver_inside else ())
    write_if_changed(stamp, want)
    return SimGpu(outdir)


def counts_files(counts: Path | str) -> list[Path]:
    """The per-process files of a GF_SIM_COUNTS path (NAME.json -> NAME.<pid>.json)."""
    path = Path(counts)
    stem = path.name[: -len(".json")] if path.name.endswith(".json") else path.name
    pat = re.compile(re.escape(stem) + r"\.(\d+)\.json$")
    if not path.parent.is_dir():
        return []
    return sorted(p for p in path.parent.iterdir() if pat.match(p.name))


def read_counts(counts: Path | str) -> list[dict[str, Any]]:
    """The counts of each process of a run, in pid order (see driver.c for the schema)."""
    out: list[dict[str, Any]] = []
    for p in counts_files(counts):
        data = json.loads(p.read_text())
        if isinstance(data, dict):
            out.append(data)
    return sorted(out, key=lambda d: int(str(d.get("pid", 0))))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpuflight.simgpu.build OUTDIR`: build there, print the library dir."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: build.py OUTDIR", file=sys.stderr)
        return 2
    print(build(args[0]).lib_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
