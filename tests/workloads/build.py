"""Build the test workloads against each CUDA runtime we probe.

    build_simgpu(outdir)            the stub runtime: outdir/libcudart.so.12
    build_capture(outdir, runtime)  outdir/capture-RUNTIME
    build_dlopen(outdir)            outdir/dlopen (links no CUDA runtime)
    build_swaprace(outdir)          outdir/swaprace (maps a library, races its directory)
    build_devices(outdir, sim)      outdir/devices, on gpuflight/simgpu's runtime and driver
    nvidia_runtime_dir(major)       .../site-packages/nvidia/{cuda_runtime,cu13}/lib
    runtime_library(outdir, runtime)  the file that holds the runtime's code

Runtimes: "stub" (the simulated GPU, gpuflight/simgpu, as the demo runs on it: our
libcudart.so.12 with our driver inside), "cu12" / "cu13" (NVIDIA's libcudart.so.12 / .so.13 from
the pip wheels nvidia-cuda-runtime-cu12 / nvidia-cuda-runtime, with a run path to the
wheel's lib dir), "static12" / "static13" (libcudart_static.a of the same wheels linked
into the executable, which then holds the runtime itself). The workloads declare the
runtime API with gpuflight/demo/cuda_abi.h. C is built by gpuflight/simgpu/cbuild.py, which
reuses up-to-date outputs.
"""

from __future__ import annotations

import atexit
import filecmp
import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, get_args

from gpuflight.demo.build import ABI_HEADER, DEMO_DIR, SIMGPU_SONAME
from gpuflight.producer.contract.errors import SetupError
from gpuflight.simgpu import cbuild
from gpuflight.simgpu.build import NVML_SONAME, SimGpu
from gpuflight.simgpu.build import build as build_sim
from gpuflight.simgpu.cbuild import link_args

__all__ = [
    "RUNTIMES",
    "WORKLOADS_DIR",
    "Runtime",
    "build_capture",
    "build_devices",
    "build_dlopen",
    "build_simgpu",
    "build_swaprace",
    "compile_c",
    "nvidia_runtime_dir",
    "runtime_library",
]

WORKLOADS_DIR = Path(__file__).resolve().parent
CAPTURE_SOURCE = WORKLOADS_DIR / "capture.c"
DLOPEN_SOURCE = WORKLOADS_DIR / "dlopen.c"
DEVICES_SOURCE = WORKLOADS_DIR / "devices.c"

Runtime = Literal["stub", "cu12", "cu13", "static12", "static13"]
RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)

# major -> (package holding lib/, pip distribution, shared library file name)
_WHEELS: dict[int, tuple[str, str, str]] = {
    12: ("nvidia.cuda_runtime", "nvidia-cuda-runtime-cu12", "libcudart.so.12"),
    13: ("nvidia.cu13", "nvidia-cuda-runtime", "libcudart.so.13"),
}

# libcudart_static.a needs these from the C library (all in libc since glibc 2.34;
# named for older systems). It needs no C++ runtime.
STATIC_LIBS: tuple[str, ...] = ("-ldl", "-lpthread", "-lrt")


def compile_c(
    output: Path, sources: Sequence[Path], args: Sequence[str] = (), *,
    inputs: Sequence[Path] = (),
) -> Path:
    """cbuild.compile_c, with the workloads' declarations of the CUDA runtime API
    (gpuflight/demo/cuda_abi.h) on the include path."""
    return cbuild.compile_c(output, sources, [f"-I{DEMO_DIR}", *args],
                            inputs=[ABI_HEADER, *inputs])


#: The simulated GPU this process built (a build takes seconds; each caller gets copies).
_SIMGPU: list[Path] = []


def build_simgpu(outdir: Path) -> Path:
    """The stub runtime: outdir/libcudart.so.12, the simulated GPU's CUDA 12 runtime with its
    driver inside (as the demo's: gpuflight probes it as a runtime alone), its
    libnvidia-ml.so.1 beside it; returns outdir (the library dir).

    The files are copies of one build per process: outdir's own files (inodes no other
    directory shares), left as they are where outdir has them already."""
    if not _SIMGPU:
        built = Path(tempfile.mkdtemp(prefix="gpuflight-simgpu-"))
        atexit.register(shutil.rmtree, built, True)
        _SIMGPU.append(build_sim(built, runtimes=(12,), driver_inside=True).lib_dir)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for name in (SIMGPU_SONAME, NVML_SONAME):
        source, target = _SIMGPU[0] / name, outdir / name
        if not (target.is_file() and filecmp.cmp(source, target, shallow=False)):
            tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
            shutil.copy2(source, tmp)
            cbuild.replace_atomically(tmp, target)
    return outdir


def _wheel(major: int) -> tuple[str, str, str]:
    try:
        return _WHEELS[major]
    except KeyError:
        raise ValueError(f"no CUDA runtime wheel for major version {major}") from None


def nvidia_runtime_dir(major: int) -> Path:
    """The lib dir of the installed CUDA `major` runtime wheel (12 or 13).

    Raises SetupError, naming the wheel to install, when it is missing.
    """
    package, dist, soname = _wheel(major)
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        lib_dir = Path(location) / "lib"
        if (lib_dir / soname).is_file() and (lib_dir / "libcudart_static.a").is_file():
            return lib_dir
    raise SetupError(f"the CUDA {major} runtime wheel is not installed: pip install {dist}")


def runtime_library(outdir: Path, runtime: Runtime) -> Path:
    """The file that holds the runtime's code for build_capture(outdir, runtime).

    That is the file a tracer attaches its probes to: the shared library, or for the
    static runtimes the capture executable itself.
    """
    if runtime == "stub":
        return Path(outdir) / "simgpu" / SIMGPU_SONAME
    if runtime in ("cu12", "cu13"):
        major = int(runtime[2:])
        return nvidia_runtime_dir(major) / _wheel(major)[2]
    if runtime in ("static12", "static13"):
        return Path(outdir) / f"capture-{runtime}"
    raise ValueError(f"unknown runtime {runtime!r}; one of {', '.join(RUNTIMES)}")


def build_capture(outdir: Path, runtime: Runtime) -> Path:
    """Build outdir/capture-RUNTIME, the capture workload on that runtime; return it."""
    outdir = Path(outdir)
    output = outdir / f"capture-{runtime}"
    if runtime == "stub":
        lib_dir = build_simgpu(outdir / "simgpu")
        args = link_args(lib_dir, SIMGPU_SONAME)
        inputs: list[Path] = [lib_dir / SIMGPU_SONAME]
    elif runtime in ("cu12", "cu13"):
        major = int(runtime[2:])
        lib_dir = nvidia_runtime_dir(major)
        args = link_args(lib_dir, _wheel(major)[2])
        inputs = []
    elif runtime in ("static12", "static13"):
        archive = nvidia_runtime_dir(int(runtime[6:])) / "libcudart_static.a"
        args = [str(archive), *STATIC_LIBS]
        inputs = [archive]
    else:
        raise ValueError(f"unknown runtime {runtime!r}; one of {', '.join(RUNTIMES)}")
    return compile_c(output, [CAPTURE_SOURCE], [*args, "-lpthread"], inputs=inputs)


def build_devices(outdir: Path, sim: SimGpu) -> Path:
    """Build outdir/devices, linked against the simulated GPU's runtime (13) and driver."""
    runtime, driver = sim.runtime(13), sim.driver
    return compile_c(
        Path(outdir) / "devices",
        [DEVICES_SOURCE],
        [*link_args(runtime.parent, runtime.name), *link_args(driver.parent, driver.name),
         "-lpthread"],
        inputs=[runtime, driver],
    )


def build_dlopen(outdir: Path) -> Path:
    """Build outdir/dlopen, which loads a runtime with dlopen(--lib PATH); return it."""
    return compile_c(Path(outdir) / "dlopen", [DLOPEN_SOURCE], ["-ldl"])


POINT_SOURCE = WORKLOADS_DIR / "point.c"


def build_point(outdir: Path) -> Path:
    """Build outdir/libgfpoint.so, whose gf_point() Python calls through ctypes; return it."""
    return compile_c(Path(outdir) / "libgfpoint.so", [POINT_SOURCE],
                     ["-O1", "-shared", "-fPIC"])


SWAPRACE_SOURCE = WORKLOADS_DIR / "swaprace.c"


def build_swaprace(outdir: Path) -> Path:
    """Build outdir/swaprace, which maps a library, then swaps its directory with a link to
    another one, over and over (the race a user can run against the agent); return it."""
    return compile_c(Path(outdir) / "swaprace", [SWAPRACE_SOURCE], ["-ldl"])


# ---- the driver API ---------------------------------------------------------------

DRIVER_SOURCE = WORKLOADS_DIR / "driver.c"
DRIVER_HEADER = WORKLOADS_DIR / "cuda_driver.h"
STUBCUDA_SOURCE = WORKLOADS_DIR / "stubcuda.c"
FWDCUDART_SOURCE = WORKLOADS_DIR / "fwdcudart.c"
NVCCSTYLE_SOURCE = WORKLOADS_DIR / "nvccstyle.c"
STATIC_HOST_SOURCE = WORKLOADS_DIR / "static_host.c"
LIBCUDA_SONAME = "libcuda.so.1"
#: Where scripts/setup-libcuda unpacks NVIDIA's libcuda.so.1 (Debian non-free).
REAL_LIBCUDA_DIR = WORKLOADS_DIR.parent.parent / ".cache" / "nvidia-cuda"

Driver = Literal["stub", "real", "thunked"]

# Stub libraries: exported by name, no identical bodies folded into one (one probe each).
_STUB_LIBRARY_FLAGS: tuple[str, ...] = ("-fPIC", "-shared", "-fvisibility=hidden", "-fno-ipa-icf")


def real_libcuda_dir() -> Path:
    """The directory holding NVIDIA's libcuda.so.1 (unpacked by scripts/setup-libcuda)."""
    if not (REAL_LIBCUDA_DIR / LIBCUDA_SONAME).is_file():
        raise SetupError(
            f"NVIDIA's {LIBCUDA_SONAME} is not unpacked in {REAL_LIBCUDA_DIR}: run scripts/setup"
        )
    return REAL_LIBCUDA_DIR


def build_stubcuda(outdir: Path) -> Path:
    """Build outdir/stubcuda/libcuda.so.1 (every call succeeds); return its directory."""
    lib_dir = Path(outdir) / "stubcuda"
    compile_c(
        lib_dir / LIBCUDA_SONAME,
        [STUBCUDA_SOURCE],
        [*_STUB_LIBRARY_FLAGS, f"-Wl,-soname,{LIBCUDA_SONAME}"],
        inputs=[DRIVER_HEADER],
    )
    return lib_dir


THUNKS_SOURCE = WORKLOADS_DIR / "thunks.S"
#: What build_thunked_stubcuda renames each thunked function of stubcuda.c to.
THUNK_IMPL_PREFIX = "gf_impl_"


def thunk_shapes() -> dict[str, str]:
    """The function → the shape of its thunk (a macro of thunks.S), as thunks.S lists them."""
    text = THUNKS_SOURCE.read_text()
    return {name: shape for shape, name in re.findall(r"^\t(\w+) (cu\w+)$", text, re.M)}


def build_thunked_stubcuda(outdir: Path) -> Path:
    """Build outdir/thunked/libcuda.so.1: the stub driver, each function entered through a
    thunk of thunks.S (real drivers' first instructions: NVIDIA's `cmp`+`je`, endbr64, ...);
    return its directory. cuGetProcAddress hands out the stub's own functions, past the
    thunks: use the exported ones."""
    lib_dir = Path(outdir) / "thunked"
    renames = [f"-D{name}={THUNK_IMPL_PREFIX}{name}" for name in sorted(thunk_shapes())]
    flags = [f for f in _STUB_LIBRARY_FLAGS if f != "-shared"]
    stub = compile_c(lib_dir / "stubcuda.o", [STUBCUDA_SOURCE], [*flags, "-c", *renames],
                     inputs=[DRIVER_HEADER])
    compile_c(
        lib_dir / LIBCUDA_SONAME,
        [THUNKS_SOURCE],
        [str(stub), *_STUB_LIBRARY_FLAGS, f"-Wl,-soname,{LIBCUDA_SONAME}", "-Wl,-z,defs"],
        inputs=[stub],
    )
    return lib_dir


def libcuda_dir(outdir: Path, driver: Driver) -> Path:
    if driver == "real":
        return real_libcuda_dir()
    return build_thunked_stubcuda(outdir) if driver == "thunked" else build_stubcuda(outdir)


def build_driver(outdir: Path, driver: Driver) -> Path:
    """Build outdir/driver-DRIVER, the driver workload on the stub or the real libcuda."""
    lib_dir = libcuda_dir(outdir, driver)
    return compile_c(
        Path(outdir) / f"driver-{driver}",
        [DRIVER_SOURCE],
        link_args(lib_dir, LIBCUDA_SONAME),
        inputs=[DRIVER_HEADER, lib_dir / LIBCUDA_SONAME],
    )


def build_fwdcudart(outdir: Path) -> Path:
    """Build outdir/fwdcudart/libcudart.so.12, the runtime that forwards to the stub
    driver; return its directory."""
    cuda = build_stubcuda(outdir)
    lib_dir = Path(outdir) / "fwdcudart"
    compile_c(
        lib_dir / SIMGPU_SONAME,
        [FWDCUDART_SOURCE],
        [*_STUB_LIBRARY_FLAGS, f"-Wl,-soname,{SIMGPU_SONAME}",
         *link_args(cuda, LIBCUDA_SONAME), "-lpthread"],
        inputs=[DRIVER_HEADER, cuda / LIBCUDA_SONAME],
    )
    return lib_dir


def build_nvccstyle(outdir: Path) -> Path:
    """Build outdir/nvccstyle on the forwarding runtime (shared) and the stub driver."""
    runtime = build_fwdcudart(outdir)
    cuda = build_stubcuda(outdir)
    return compile_c(
        Path(outdir) / "nvccstyle",
        [NVCCSTYLE_SOURCE],
        [*link_args(runtime, SIMGPU_SONAME), *link_args(cuda, LIBCUDA_SONAME)],
        inputs=[runtime / SIMGPU_SONAME],
    )


def build_nvccstyle_static_so(outdir: Path) -> tuple[Path, Path]:
    """Build (program, library): outdir/static-so/libnvccapp.so holds nvccstyle and the
    forwarding runtime with hidden symbols (only in .symtab, as a static runtime inside a
    library has them); outdir/nvccstyle-static-so runs it."""
    cuda = build_stubcuda(outdir)
    lib_dir = Path(outdir) / "static-so"
    library = compile_c(
        lib_dir / "libnvccapp.so",
        [NVCCSTYLE_SOURCE, FWDCUDART_SOURCE],
        [*_STUB_LIBRARY_FLAGS, "-DGF_NO_MAIN", "-DGF_RUNTIME_API=__attribute__((noinline))",
         "-Wl,-soname,libnvccapp.so", *link_args(cuda, LIBCUDA_SONAME), "-lpthread"],
        inputs=[DRIVER_HEADER, cuda / LIBCUDA_SONAME],
    )
    program = compile_c(
        Path(outdir) / "nvccstyle-static-so",
        [STATIC_HOST_SOURCE],
        link_args(lib_dir, "libnvccapp.so"),
        inputs=[library],
    )
    return program, library


PROCADDRESS_SOURCE = WORKLOADS_DIR / "procaddress.c"


def build_procaddress(outdir: Path, driver: Driver) -> Path:
    """Build outdir/procaddress-DRIVER (cuGetProcAddress against dlsym)."""
    lib_dir = libcuda_dir(outdir, driver)
    return compile_c(
        Path(outdir) / f"procaddress-{driver}",
        [PROCADDRESS_SOURCE],
        [*link_args(lib_dir, LIBCUDA_SONAME), "-ldl"],
        inputs=[lib_dir / LIBCUDA_SONAME],
    )


LOCKFIRST_SOURCE = WORKLOADS_DIR / "lockfirst.c"


def build_lockfirst(outdir: Path, all_locked: bool = False) -> Path:
    """Build a stub runtime (libcudart.so.12) whose cudaDeviceSynchronize starts with a
    lock-prefixed instruction, which uprobes refuse; with `all_locked`, every function does.
    Returns the library file (for `build_dlopen`'s --lib)."""
    lib_dir = Path(outdir) / ("lockall" if all_locked else "lockfirst")
    return compile_c(
        lib_dir / SIMGPU_SONAME,
        [LOCKFIRST_SOURCE],
        ["-shared", "-fPIC", f"-Wl,-soname,{SIMGPU_SONAME}",
         *(["-DGF_ALL_LOCKED"] if all_locked else [])],
    )
