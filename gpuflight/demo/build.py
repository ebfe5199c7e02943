"""Build the demo's C programs: the simulated GPU and the fusion workload.

    build_demo()            simgpu (a stub libcudart.so.12) + fusion, in a cache dir
    build_simgpu(outdir)    outdir/libcudart.so.12, returns outdir
    build_fusion(outdir, lib_dir)
    compile_c(output, sources, args)   the one way C gets built (tests use it too)

Everything is compiled with `cc` from PATH. An output is rebuilt only when its
inputs changed: next to it, OUTPUT.inputs holds a digest of the command line and
of every input file's content. Outputs are written to a temporary name and
renamed into place, so concurrent builders never see a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuflight.producer.contract.errors import SetupError

DEMO_DIR = Path(__file__).resolve().parent
ABI_HEADER = DEMO_DIR / "cuda_abi.h"
SIMGPU_SOURCE = DEMO_DIR / "simgpu.c"
FUSION_SOURCE = DEMO_DIR / "fusion.c"

#: File name and SONAME of the stub: the CUDA 12 runtime's.
SIMGPU_SONAME = "libcudart.so.12"

#: Every C file is built warning-free with these.
CFLAGS: tuple[str, ...] = ("-std=gnu11", "-O2", "-g", "-Wall", "-Wextra")

# The real libcudart.so.12 versions its symbols (cudaMalloc@@libcudart.so.12); so
# does the stub, so that one binary runs against either without a loader warning.
_SIMGPU_VERSION_SCRIPT = "libcudart.so.12 {\n  global:\n    cuda*;\n  local:\n    *;\n};\n"

_SIMGPU_FLAGS: tuple[str, ...] = (
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    # Identical bodies (cudaMemcpy / cudaMemcpy_ptds) must not be folded into one
    # function jumping into the other's entry: a probe there would fire twice.
    "-fno-ipa-icf",
    f"-Wl,-soname,{SIMGPU_SONAME}",
)


def c_compiler() -> str:
    """The path of `cc`, or SetupError saying how to get one."""
    cc = shutil.which("cc")
    if cc is None:
        raise SetupError(
            "no C compiler: `cc` is not on PATH (install one, e.g. apt-get install gcc)"
        )
    return cc


def _digest(command: Sequence[str], inputs: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for arg in command:
        h.update(arg.encode())
        h.update(b"\0")
    for path in inputs:
        h.update(str(path).encode())
        h.update(b"\0")
        try:
            h.update(path.read_bytes())
        except OSError as exc:
            raise SetupError(f"cannot read build input {path}: {exc.strerror}") from exc
        h.update(b"\0")
    return h.hexdigest()


def _first_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[-1] if lines else "no diagnostics"


def compile_c(
    output: Path,
    sources: Sequence[Path],
    args: Sequence[str] = (),
    *,
    inputs: Sequence[Path] = (),
) -> Path:
    """Compile and link `sources` into `output` (unless it is up to date); return `output`.

    The command is `cc CFLAGS -I<demo dir> SOURCES ARGS -o OUTPUT`: put linker inputs
    and libraries in `args`. `inputs` are further files the result depends on
    (headers other than cuda_abi.h, static libraries): their content is part of the
    digest that decides whether to rebuild.
    """
    cc = c_compiler()
    output = Path(output)
    command = [cc, *CFLAGS, f"-I{DEMO_DIR}", *map(str, sources), *args]
    digest = _digest([*command, str(output)], [*sources, ABI_HEADER, *inputs])
    stamp = output.with_name(output.name + ".inputs")
    try:
        if output.is_file() and stamp.read_text() == digest:
            return output
    except OSError:
        pass

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        proc = subprocess.run(
            [*command, "-o", str(tmp)], capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise SetupError(f"cannot run the C compiler {cc}: {exc.strerror}") from exc
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SetupError(
            f"the C compiler could not build {output.name}: {_first_error(proc.stderr)}"
        )
    os.replace(tmp, output)
    stamp_tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    stamp_tmp.write_text(digest)
    os.replace(stamp_tmp, stamp)
    return output


def _write_if_changed(path: Path, text: str) -> Path:
    try:
        if path.read_text() == text:
            return path
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def build_simgpu(outdir: Path) -> Path:
    """Build the simulated GPU as outdir/libcudart.so.12; return outdir (the library dir)."""
    outdir = Path(outdir)
    version_script = _write_if_changed(outdir / "simgpu.map", _SIMGPU_VERSION_SCRIPT)
    compile_c(
        outdir / SIMGPU_SONAME,
        [SIMGPU_SOURCE],
        [*_SIMGPU_FLAGS, f"-Wl,--version-script={version_script}", "-lpthread"],
        inputs=[version_script],
    )
    return outdir


def link_args(lib_dir: Path, soname: str) -> list[str]:
    """Linker arguments for a program that loads `soname` from `lib_dir` at run time.

    The library is named by file (-l:NAME), since CUDA wheels ship no libcudart.so
    link; the run path is DT_RUNPATH, so LD_LIBRARY_PATH can still swap the runtime.
    """
    return [f"-L{lib_dir}", f"-l:{soname}", f"-Wl,-rpath,{lib_dir}"]


def build_fusion(outdir: Path, lib_dir: Path) -> Path:
    """Build outdir/fusion, linked against lib_dir/libcudart.so.12 (with a run path)."""
    return compile_c(
        Path(outdir) / "fusion", [FUSION_SOURCE], link_args(Path(lib_dir), SIMGPU_SONAME)
    )


@dataclass(frozen=True)
class DemoBuild:
    """The built demo: the stub runtime's directory and the fusion program."""

    lib_dir: Path
    fusion: Path

    @property
    def runtime(self) -> Path:
        """The stub libcudart.so.12 itself (what the probes attach to)."""
        return self.lib_dir / SIMGPU_SONAME

    def command(self, mode: str, steps: int | None = None, copies: int = 1) -> list[str]:
        """The command line of one fusion run (mode: "unfused" or "fused"; `copies` H2D
        copies of the batch per step)."""
        cmd = [str(self.fusion), "--mode", mode]
        if steps is not None:
            cmd += ["--steps", str(steps)]
        if copies != 1:
            cmd += ["--copies", str(copies)]
        return cmd


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/gpuflight/demo, or ~/.cache/gpuflight/demo."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuflight" / "demo"


def build_demo(cache_dir: Path | None = None) -> DemoBuild:
    """Build (or reuse) the simulated GPU and the fusion workload in `cache_dir`."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    lib_dir = build_simgpu(root / "lib")
    return DemoBuild(lib_dir=lib_dir, fusion=build_fusion(root / "bin", lib_dir))
