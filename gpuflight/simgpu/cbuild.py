"""The one way C gets built: the simulated GPU (build.py), the demo's workload that runs on it
(gpuflight/demo/build.py) and the tests' workloads (tests/workloads/build.py).

    compile_c(output, sources, args)   `cc CFLAGS SOURCES ARGS -o OUTPUT`, unless up to date
    run_tool(command, failure)         another build tool (nm, objcopy, cc -E): its stdout
    write_if_changed(path, text)       a generated file, rewritten only when its text changed
    link_args(lib_dir, soname)         link with lib_dir/soname, found there at run time too
    c_compiler()                       `cc` from PATH

An output is rebuilt only when its inputs changed: next to it, OUTPUT.inputs holds a digest of
the command line and of the content of every source and of every further input named
(headers, libraries, objects). Outputs are written to a temporary name and renamed into place,
so concurrent builders never see a half-written file. What cannot be built is a BuildError:
one line saying what failed (the compiler's first error), or how to get a compiler.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpuflight.producer.contract.errors import SetupError

#: Every C file is built warning-free with these (the simulated GPU adds its own: build.py).
CFLAGS: tuple[str, ...] = ("-std=gnu11", "-O2", "-g", "-Wall", "-Wextra")


class BuildError(SetupError):
    """Something could not be built: no compiler, no headers, a compile error."""


def c_compiler() -> str:
    """The path of `cc` (else `gcc`), or BuildError saying how to get one."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise BuildError("no C compiler: `cc` is not on PATH (install one, e.g. apt-get "
                         "install gcc)")
    return cc


def digest(parts: Iterable[str | bytes]) -> str:
    """A digest of `parts` (each one delimited: ("ab", "c") and ("a", "bc") differ)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BuildError(f"cannot read build input {path}: {exc.strerror}") from exc


def _first_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[-1] if lines else "no diagnostics"


def run_tool(command: Sequence[str], failure: str, *, stdin: str | None = None) -> str:
    """Run a build tool; its stdout. If it fails, BuildError "FAILURE: its first error"."""
    try:
        proc = subprocess.run(list(command), input=stdin, capture_output=True, text=True,
                              check=False)
    except OSError as exc:
        raise BuildError(f"cannot run {command[0]}: {exc.strerror}") from exc
    if proc.returncode != 0:
        raise BuildError(f"{failure}: {_first_error(proc.stderr)}")
    return proc.stdout


def replace_atomically(tmp: Path, final: Path) -> None:
    """Move a finished `tmp` over `final` (one rename: readers see the old or the new file)."""
    os.replace(tmp, final)


def write_if_changed(path: Path, text: str) -> Path:
    """Write `text` to `path` unless it holds that already (its time then stays); `path`."""
    try:
        if path.read_text() == text:
            return path
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    replace_atomically(tmp, path)
    return path


def compile_c(
    output: Path,
    sources: Sequence[Path],
    args: Sequence[str] = (),
    *,
    inputs: Sequence[Path] = (),
    cflags: Sequence[str] = CFLAGS,
) -> Path:
    """Compile (and link, unless `args` say -c) `sources` into `output`, unless it is up to
    date; return `output`.

    The command is `cc CFLAGS SOURCES ARGS -o OUTPUT`: include directories, linker inputs
    and libraries go in `args`. `inputs` are further files the result depends on (headers,
    static libraries, objects, the libraries linked with): their content is part of the
    digest that decides whether to rebuild.
    """
    cc = c_compiler()
    output = Path(output)
    command = [cc, *cflags, *map(str, sources), *args]
    want = digest([*command, str(output), *(_read(Path(p)) for p in [*sources, *inputs])])
    stamp = output.with_name(output.name + ".inputs")
    try:
        if output.is_file() and stamp.read_text() == want:
            return output
    except OSError:
        pass
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        run_tool([*command, "-o", str(tmp)], f"the C compiler could not build {output.name}")
        replace_atomically(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    write_if_changed(stamp, want)
    return output


def link_args(lib_dir: Path, soname: str) -> list[str]:
    """Linker arguments for a program that loads `soname` from `lib_dir` at run time.

    The library is named by file (-l:NAME), since CUDA wheels ship no libcudart.so link; the
    run path is DT_RUNPATH, so LD_LIBRARY_PATH can still swap the runtime.
    """
    return [f"-L{lib_dir}", f"-l:{soname}", f"-Wl,-rpath,{lib_dir}"]
