"""Per-call cost on the traced process: no probe, an empty uprobe (the floor), gpuflight.

    sudo .venv/bin/python bench/overhead.py [--calls N] [--rounds R]
                                            [--mode launch|copies|driver|nvidia]

A C loop makes N cudaLaunchKernel calls (then N launch + N cudaMemcpyAsync) into a
runtime whose functions start with `push rbp`, like libcudart's, then N cuLaunchKernel
calls into a driver built the same way (libcuda.so.1: its probe also checks the caller),
then N cuLaunchKernel calls into NVIDIA's own libcuda 535 (scripts/setup-libcuda; without a
GPU each call fails at once, so what is left is the probe's cost). NVIDIA's driver begins
every function with a `cmp` the kernel single-steps: its floor is measured twice, an empty
uprobe at the entry and one at the instruction gpuflight attaches at instead (the `je`
after it: producer/discover/entrypoint.py), and gpuflight is held to the second.
The modes run interleaved, R rounds, on the same machine; medians and ratios are printed.
gpuflight runs twice a round: as shipped (each CPU's event buffer, then the ring) and with
the ring alone (`--cpu-buffer-slots 0`), side by side.
gpuflight's run also reports its own events and drops, so the same run says
whether capture kept up (lossless) at that rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
#: NVIDIA's driver, as scripts/setup-libcuda unpacks it (Debian's libcuda1, 535).
NVIDIA_LIBCUDA = REPO / ".cache" / "nvidia-cuda" / "libcuda.so.1"


def build(out: Path) -> Path:
    lib = out / "libcudart.so.12"
    subprocess.run(["cc", "-O2", "-fno-omit-frame-pointer", "-fPIC", "-shared",
                    "-Wl,-soname,libcudart.so.12", "-o", str(lib), str(BENCH / "fakert.c")],
                   check=True)
    cuda = out / "libcuda.so.1"
    subprocess.run(["cc", "-O2", "-fno-omit-frame-pointer", "-fPIC", "-shared",
                    "-Wl,-soname,libcuda.so.1", "-o", str(cuda), str(BENCH / "fakecuda.c")],
                   check=True)
    calls = out / "calls"
    subprocess.run(["cc", "-O2", "-o", str(calls), str(BENCH / "calls.c"), f"-L{out}",
                    "-l:libcudart.so.12", "-l:libcuda.so.1", f"-Wl,-rpath,{out}"], check=True)
    if NVIDIA_LIBCUDA.exists():  # the same loop on NVIDIA's driver (its run path first)
        nvidia = NVIDIA_LIBCUDA.parent
        subprocess.run(["cc", "-O2", "-o", str(out / "calls-nvidia"), str(BENCH / "calls.c"),
                        f"-L{nvidia}", "-l:libcuda.so.1", f"-L{out}", "-l:libcudart.so.12",
                        f"-Wl,-rpath,{nvidia}", f"-Wl,-rpath,{out}"], check=True)
    return calls


def nvidia_probe_offset(symbol: str) -> int:
    """How far past `symbol`'s entry gpuflight attaches in NVIDIA's driver (its plan)."""
    sys.path.insert(0, str(REPO))
    from gpuflight.producer.discover import attachplan

    path = NVIDIA_LIBCUDA.resolve()
    plan = attachplan.read_plan(str(path), "driver", path.stat().st_size)
    offset, entry = plan.offset(symbol), plan.entry(symbol)
    assert offset is not None and entry is not None and symbol not in plan.stepped
    return offset - entry


def prologue(lib: Path, symbol: str) -> bytes:
    with lib.open("rb") as f:
        elf = ELFFile(f)
        dynsym, text = elf.get_section_by_name(".dynsym"), elf.get_section_by_name(".text")
        assert isinstance(dynsym, SymbolTableSection) and text is not None
        sym = (dynsym.get_symbol_by_name(symbol) or [])[0]
        offset = sym["st_value"] - text["sh_addr"] + text["sh_offset"]
        f.seek(offset)
        return f.read(4)


#: The loops measured: mode → (calls.c argument, calls per iteration, label).
MODES: dict[str, tuple[list[str], int, str]] = {
    "launch": ([], 1, "launch"),
    "copies": (["copies"], 2, "launch + memcpyAsync"),
    "driver": (["driver"], 1, "cuLaunchKernel (driver)"),
    "nvidia": (["driver"], 1, "cuLaunchKernel (NVIDIA's libcuda 535)"),
}


#: The loop runs on one core, gpuflight's reader on the other, in every mode: an
#: unpinned run lets the two share a core now and then, which moved medians by 20 %.
LOOP_CPU, READER_CPU = "1", "0"
#: gpuflight with its events in the ring alone, as before the per-CPU buffers (issue 26).
RING_ONLY = ("--cpu-buffer-slots", "0")


def loop_args(calls: Path, n: int, mode: str) -> list[str]:
    binary = calls.with_name("calls-nvidia") if mode == "nvidia" else calls
    return ["taskset", "-c", LOOP_CPU, str(binary), str(n), *MODES[mode][0]]


def run_calls(calls: Path, n: int, mode: str) -> float:
    return float(subprocess.run(loop_args(calls, n, mode), check=True, capture_output=True,
                                text=True).stdout)


@contextlib.contextmanager
def empty_uprobes(where: list[tuple[Path, str, int]]) -> Iterator[None]:
    """An empty uprobe (bench/empty.bpf.c) `skip` bytes past each (library, symbol, skip),
    attached as gpuflight attaches (producer/probe/probes.py UprobeLinks, by file offset): bcc's
    attach_uprobe passes the kernel a ref_ctr_offset of whatever its stack holds, which the
    kernel refuses where another tool's probe is at the same place."""
    from bcc import BPF  # the floor needs a bare bcc program, not gpuflight's

    sys.path.insert(0, str(REPO))
    from gpuflight.producer.discover import elfsyms
    from gpuflight.producer.probe.uprobes import UprobeLinks

    bpf = BPF(src_file=str(BENCH / "empty.bpf.c").encode())
    links = UprobeLinks(multi=False)
    program = bpf.load_func(b"empty", BPF.KPROBE).fd
    fds = []
    try:
        for lib, symbol, skip in where:
            path = str(lib.resolve())
            entry = elfsyms.vaddr_to_file_offset(
                path, elfsyms.function_addresses(path, frozenset({symbol}))[symbol])
            assert entry is not None
            fds.append(links.attach(program, path, entry + skip, retprobe=False))
        yield
    finally:
        for fd in fds:
            os.close(fd)
        bpf.cleanup()


def run_empty(calls: Path, lib: Path, n: int, mode: str, nvidia_offset: int = 0) -> float:
    """The loop with an empty uprobe on each function it calls; NVIDIA's cuLaunchKernel's
    `nvidia_offset` bytes past its entry."""
    driver = NVIDIA_LIBCUDA if mode == "nvidia" else lib.parent / "libcuda.so.1"
    with empty_uprobes([(lib, "cudaLaunchKernel", 0), (lib, "cudaMemcpyAsync", 0),
                        (driver, "cuLaunchKernel", nvidia_offset)]):
        return run_calls(calls, n, mode)


def run_gpuflight(calls: Path, n: int, mode: str,
                  extra: tuple[str, ...] = ()) -> tuple[float, int, int]:
    args = ["taskset", "-c", READER_CPU, sys.executable, "-m", "gpuflight", "trace", *extra,
            "--", *loop_args(calls, n, mode)]
    proc = subprocess.run(args, check=True, capture_output=True, text=True, cwd=REPO)
    ns = float(proc.stdout)
    events = int(proc.stderr.split(" events):")[0].rsplit(", ", 1)[1].replace(",", ""))
    dropped = int(proc.stderr.rsplit("events dropped:", 1)[1].split()[0].replace(",", ""))
    return ns, events, dropped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mode", action="append", choices=list(MODES),
                        help="measure only these loops (default: all)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        calls = build(Path(tmp))
        lib = Path(tmp) / "libcudart.so.12"
        for path, symbol in ((lib, "cudaLaunchKernel"), (lib, "cudaMemcpyAsync"),
                             (lib.parent / "libcuda.so.1", "cuLaunchKernel")):
            head = prologue(path, symbol)
            assert head[:1] == b"\x55", f"{symbol} starts with {head.hex()}, not push rbp"
        rows, raw = [], {}
        for mode, (_, per_iteration, label) in MODES.items():
            if args.mode and mode not in args.mode:
                continue
            if mode == "nvidia" and not NVIDIA_LIBCUDA.exists():
                print(f"{label}: skipped, {NVIDIA_LIBCUDA} is not unpacked (scripts/setup)")
                continue
            moved = nvidia_probe_offset("cuLaunchKernel") if mode == "nvidia" else 0
            samples: dict[str, list[float]] = {"none": [], "empty": [], "gpuflight": [],
                                               "ring only": []}
            if moved:
                samples["empty at the entry"] = []
            captured = dropped = 0
            for _ in range(args.rounds):
                samples["none"].append(run_calls(calls, args.calls, mode))
                samples["empty"].append(run_empty(calls, lib, args.calls, mode, moved))
                if moved:
                    samples["empty at the entry"].append(run_empty(calls, lib, args.calls, mode))
                for column, extra in (("gpuflight", ()), ("ring only", RING_ONLY)):
                    ns, events, drops = run_gpuflight(calls, args.calls, mode, extra)
                    samples[column].append(ns)
                    captured += events
                    dropped += drops
                    # Let the background probe release finish (docs/architecture.md,
                    # "Shutting down").
                    time.sleep(8)
            med = {k: statistics.median(v) for k, v in samples.items()}
            expected = 2 * args.rounds * args.calls * per_iteration
            entry = med.get("empty at the entry")
            rows.append([
                label,
                f"{med['none']:.0f}", "-" if entry is None else f"{entry:.0f}",
                f"{med['empty']:.0f}" + (f" (+{moved})" if moved else ""),
                f"{med['gpuflight']:.0f}",
                f"{med['gpuflight'] / med['empty']:.2f}x",
                f"{med['ring only']:.0f} ({med['ring only'] / med['empty']:.2f}x)",
                f"{(med['gpuflight'] - med['none']) / (med['empty'] - med['none']):.2f}x",
                f"{captured:,}/{expected:,}", f"{dropped:,}",
            ])
            raw[mode] = samples
    print(f"machine: {platform.node()} {platform.machine()}, kernel {platform.release()}, "
          f"{time.strftime('%Y-%m-%d')}, {args.calls:,} calls x {args.rounds} rounds, medians")
    print(tabulate(rows, headers=["calls", "no probe ns", "empty uprobe at the entry ns",
                                  "empty uprobe ns (where gpuflight attaches)", "gpuflight ns",
                                  "vs floor", "ring only ns (vs floor)",
                                  "added vs floor's added", "events captured",
                                  "dropped"]))
    print(json.dumps(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
