"""Where gpuflight's probes go on NVIDIA's own files, and whether the kernel emulates them there.

    .venv/bin/python bench/entrypoints.py [--detail] [--fetch-debian PACKAGE ...] [FILE ...]

For every function of the probe table that each file defines and gpuflight would probe (as
producer/procmaps.py classifies the file: a runtime, its static copy's called functions, or a
driver), its first instruction, the offset its probes go at (producer/discover/attachplan.py: past a
prefix the kernel single-steps, producer/discover/entrypoint.py) and whether the kernel emulates the
instruction there (~0.4 us a hit on our VMs) or single-steps it (~15 us; bench/emulation.py
measures both). The files: NVIDIA's runtimes 12 and 13 (this .venv's wheels), libcuda 535
(scripts/setup-libcuda), every ELF file of the frameworks venv (.cache/frameworks/venv:
PyTorch, cuBLAS, cuDNN, cuFFT, NCCL, NVSHMEM, Triton, CuPy), the FILEs named, and each Debian
PACKAGE named (downloaded with `apt-get download`, unpacked, not installed: root, and the
non-free component scripts/setup-nvml configures; e.g. libnvidia-tesla-470-cuda1).

The table groups a file's functions by the shape of their entry (first instruction, the one
probed, how far apart); --detail lists every function.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import capstone
from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO)]

from gpuflight.producer.contract.abi import RUNTIME_NAME_FUNCTIONS  # noqa: E402
from gpuflight.producer.discover import attachplan, elfsyms, entrypoint, procmaps  # noqa: E402

_DISASSEMBLER = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)


def default_files() -> Iterator[Path]:
    site = REPO / ".venv" / "lib"
    for pattern in ("python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
                    "python3*/site-packages/nvidia/cu13/lib/libcudart.so.13"):
        yield from (Path(p) for p in sorted(glob.glob(str(site / pattern))))
    libcuda = REPO / ".cache" / "nvidia-cuda" / "libcuda.so.1"
    if libcuda.exists():
        yield libcuda.resolve()
    frameworks = REPO / ".cache" / "frameworks" / "venv" / "lib"
    for path in sorted(glob.glob(str(frameworks / "python3*" / "site-packages" / "**" / "*.so*"),
                                 recursive=True)):
        if Path(path).is_file() and not Path(path).is_symlink() and _is_elf(Path(path)):
            yield Path(path)


def _is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def fetch_debian(package: str, into: Path) -> list[Path]:
    """The shared objects of Debian's `package`, downloaded and unpacked under `into`."""
    into.mkdir(parents=True, exist_ok=True)
    for folder in (into.parent, into):  # apt-get download drops to _apt
        shutil.chown(folder, "_apt")
    subprocess.run(["apt-get", "download", "-qq", package], cwd=into, check=True)
    (deb,) = into.glob("*.deb")
    subprocess.run(["dpkg", "-x", str(deb), str(into / "root")], check=True)
    return [p for p in sorted((into / "root").rglob("*.so.*")) if p.is_file()
            and not p.is_symlink()]


def classify(path: Path) -> tuple[str, frozenset[str] | None] | None:
    """(kind, probe_only) as discover's Classifier tells them, or None: nothing probed."""
    found = elfsyms.defined_functions(
        str(path), procmaps.RUNTIME_SYMBOLS | procmaps.DRIVER_SYMBOLS, procmaps.RUNTIME_SYMBOLS)
    if found & procmaps.RUNTIME_SYMBOLS:
        return "runtime", elfsyms.referenced_functions(
            str(path), procmaps.RUNTIME_SYMBOLS | RUNTIME_NAME_FUNCTIONS)
    if found & procmaps.DRIVER_SYMBOLS:
        return "driver", None
    return None


def first_instruction(data: bytes) -> str:
    for _address, _size, mnemonic, operands in _DISASSEMBLER.disasm_lite(data, 0, 1):
        return f"{mnemonic} {operands}".strip()
    return "(does not decode)"


def shape(text: str) -> str:
    """An instruction with its displacements and immediates blanked, for grouping."""
    out, word = [], ""
    for ch in text + " ":
        if ch.isalnum() or ch == "_":
            word += ch
            continue
        if word:
            out.append("N" if word.startswith("0x") or word.isdigit() else word)
            word = ""
        out.append(ch)
    return "".join(out).strip()


def audit(path: Path) -> list[list[str]] | None:
    """One row per probed function: name, first instruction, probed instruction, +offset,
    emulated or stepped (and why)."""
    kind = classify(path)
    if kind is None:
        return None
    plan = attachplan.read_plan(str(path), kind[0], path.stat().st_size, kind[1])
    data = path.read_bytes()
    rows = []
    for name, offset in plan.offsets:
        entry = plan.entry(name)
        if offset is None or entry is None:
            rows.append([name, "-", "-", "-", "not probed (outside the loaded segments)"])
            continue
        verdict = "stepped" if name in plan.stepped else "emulated"
        if name in plan.stepped:
            size = elfsyms.function_extents(str(path), frozenset({name})).get(name, (0, 0))[1]
            verdict += ": " + entrypoint.choose(data[entry:entry + max(size, 16)], size).why
        rows.append([name, first_instruction(data[entry:entry + 16]),
                     first_instruction(data[offset:offset + 16]), f"+{offset - entry}", verdict])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--detail", action="store_true", help="every function, not groups")
    parser.add_argument("--fetch-debian", action="append", default=[], metavar="PACKAGE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = [*default_files(), *args.files]
        for package in args.fetch_debian:
            try:
                files += fetch_debian(package, Path(tmp) / package)
            except (subprocess.CalledProcessError, OSError, ValueError) as exc:
                print(f"{package}: could not be fetched ({exc})", file=sys.stderr)
        print(f"{platform.node()}, {time.strftime('%Y-%m-%d')}: where each probe goes, "
              "and whether the kernel emulates the instruction there")
        quiet: list[str] = []
        for path in dict.fromkeys(files):
            rows = audit(path)
            if rows is None:
                if "nvidia" in path.parts or path.name.startswith(("libcu", "libnv", "libnccl")):
                    quiet.append(path.name)
                continue
            shown = os.path.relpath(path, REPO) if path.is_relative_to(REPO) else str(path)
            steps = sum(row[4].startswith("stepped") for row in rows)
            print(f"\n{shown}: {len(rows)} functions probed, {steps} single-stepped")
            if args.detail:
                print(tabulate(rows, headers=["function", "first instruction", "probed at",
                                              "offset", "kernel"]))
                continue
            groups = Counter((shape(r[1]), shape(r[2]), r[3], r[4].split(":")[0])
                             for r in rows)
            print(tabulate([[n, *key] for key, n in groups.most_common()],
                           headers=["functions", "first instruction", "probed at", "offset",
                                    "kernel"]))
        if quiet:
            print(f"\nNVIDIA files with no function gpuflight probes (their runtime is linked in"
                  f" and stripped, or imported from libcudart): {', '.join(sorted(set(quiet)))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
