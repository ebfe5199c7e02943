"""Which instructions the kernel emulates at a uprobe, and what a probe on each costs a call.

    sudo .venv/bin/python bench/emulation.py [--calls N] [--rounds R]

bench/firsts.S holds functions alike but for their first instruction; bench/callloop.c calls
one of them N times. For each: untraced, with an empty uprobe (bench/empty.bpf.c) on its first
instruction, and, where producer/discover/entrypoint.py moves gpuflight's probes past it, with one
at
the instruction it chooses. R rounds, interleaved, medians. A probe counts as emulated when
it adds less than --threshold ns (the kernel's single step costs ~15 us a hit on our VMs, its
emulation ~0.4 us); the table puts that beside what entrypoint.emulated_length says of the
same bytes, and the script exits 1 where entrypoint takes for emulated an instruction the
kernel single-steps: its table of what the kernel emulates is then wrong for this kernel.
The other way round (cheaper than entrypoint assumes: Linux 6.18 turns a probe on a 5-byte
nop into a call, ~0.2 us, where older kernels single-step it) is only noted.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import capstone
from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO)]

from gpuflight.producer.discover import elfsyms, entrypoint  # noqa: E402

#: The loop runs on this CPU (bench/overhead.py's).
LOOP_CPU = "1"


def build(out: Path) -> tuple[Path, Path]:
    lib = out / "libfirsts.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-nostdlib", "-o", str(lib),
                    str(BENCH / "firsts.S")], check=True)
    loop = out / "callloop"
    subprocess.run(["cc", "-O2", "-o", str(loop), str(BENCH / "callloop.c"), "-ldl"], check=True)
    return lib, loop


def functions(lib: Path) -> list[tuple[str, bytes, int]]:
    """(name, bytes, size) of each function of the library, in address order."""
    text = (BENCH / "firsts.S").read_text()
    names = [line[3:-1] for line in text.splitlines() if line.startswith("FN(")]
    extents = elfsyms.function_extents(str(lib), frozenset(names))
    data = lib.read_bytes()
    found = []
    for name in names:
        vaddr, size = extents[name]
        offset = elfsyms.vaddr_to_file_offset(str(lib), vaddr)
        assert offset is not None
        found.append((name, data[offset:offset + size], size))
    return found


def run(loop: Path, lib: Path, name: str, calls: int) -> float:
    return float(subprocess.run(["taskset", "-c", LOOP_CPU, str(loop), str(lib), name,
                                 str(calls)], check=True, capture_output=True,
                                text=True).stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threshold", type=float, default=3000.0,
                        help="ns a probe may add and count as emulated")
    args = parser.parse_args()
    from bcc import BPF  # root, and a bare program: the floor, not gpuflight's

    disassembler = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    bpf = BPF(src_file=str(BENCH / "empty.bpf.c").encode())
    rows, disagree, cheaper = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        lib, loop = build(Path(tmp))
        for name, code, size in functions(lib):
            chosen = entrypoint.choose(code, size)
            where = sorted({0, chosen.skip})
            untraced: list[float] = []
            probed: dict[int, list[float]] = {offset: [] for offset in where}
            for _ in range(args.rounds):
                untraced.append(run(loop, lib, name, args.calls))
                for offset in where:
                    bpf.attach_uprobe(name=str(lib).encode(), sym=name.encode(), sym_off=offset,
                                      fn_name=b"empty")
                    try:
                        probed[offset].append(run(loop, lib, name, args.calls))
                    finally:
                        bpf.detach_uprobe(name=str(lib).encode(), sym=name.encode(),
                                          sym_off=offset)
            base = statistics.median(untraced)
            for offset in where:
                at = code[offset:offset + 16]
                (_a, _s, mnemonic, operands), *_ = disassembler.disasm_lite(at, 0, 1)
                cost = statistics.median(probed[offset])
                measured = cost - base < args.threshold
                said = bool(entrypoint.emulated_length(at))
                disagree += said and not measured
                cheaper += measured and not said
                rows.append([name, f"+{offset}", f"{mnemonic} {operands}".strip(),
                             at[:_s].hex(" "), f"{base:.0f}", f"{cost:.0f}",
                             f"{cost - base:.0f}",
                             "emulated" if measured else "single-stepped",
                             "emulated" if said else "stepped",
                             "chosen" if offset == chosen.skip else ""])
    bpf.cleanup()
    print(f"machine: {platform.node()} {platform.machine()}, kernel {platform.release()}, "
          f"{time.strftime('%Y-%m-%d')}, {args.calls:,} calls x {args.rounds} rounds, medians")
    print(tabulate(rows, headers=["function", "probe at", "instruction", "bytes",
                                  "untraced ns", "probed ns", "added ns", "kernel (measured)",
                                  "entrypoint says", "gpuflight"]))
    if cheaper:
        print(f"{cheaper} instruction(s) cost less than producer/discover/entrypoint.py assumes "
              "(it counts on what every kernel since 4.15 emulates)")
    if disagree:
        print(f"{disagree} instruction(s) taken for emulated by producer/discover/entrypoint.py "
              "are single-stepped here: its table of what the kernel emulates is wrong",
              file=sys.stderr)
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
