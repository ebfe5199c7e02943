"""Where in a function its uprobe costs least: at an instruction the kernel emulates.

When a uprobe fires, the kernel must still run the instruction its breakpoint replaced. A few
it emulates in place (~0.4 us a hit on our VMs); every other one it copies out of line and
single-steps, a trap more (~15 us a hit there). Measured on Linux 6.18 (bench/emulation.py):

    emulated        push %reg (0x50-0x57, 0x41 0x50-0x57), nop (0x90), jmp rel8/rel32,
                    jcc rel8/rel32, call rel32
    single-stepped  endbr64, multi-byte nops, cmp/test (RIP-relative ones included), mov, sub,
                    xor, lea, and everything else

Older kernels emulate no more than the first set (push's emulation is its newest part: a
kernel older than it single-steps a push-first function, which the single-stepped count,
decided here from this table, does not see). 6.18 also emulates the canonical multi-byte
nops (0f 1f 40 00, ...) and turns a probe on the 5-byte one into a call (~0.2 us), which older
kernels single-step: not counted on here (they are skipped, as any nop).

NVIDIA's runtimes begin every function with `push %rbp`: emulated at the entry. NVIDIA's driver
(libcuda 535) begins every exported function with a thunk, `cmpl $0x321cba00, X(%rip)` ·
`je` · `jmp *Y(%rip)`: the `cmp` is single-stepped, the `je` after it is emulated. The `cmp`
changes the flags only, so at the `je` the argument registers, %rsp and the return address at
[%rsp] are what they were at the entry: everything a probe reads (bpf/cudart.bpf.c), and what
the kernel takes as the return address when a return probe's hit is the entry hit.

So a probe moves past a straight-line prefix of instructions that write no register but the
flags and no memory and are not control flow (endbr64, nops, cmp, test) to the first
instruction the kernel emulates, and stays at the entry (single-stepped, and said so) where
that is not sure to be right: no emulated instruction within a few instructions, bytes that
do not decode, a function whose size is not known or too large to read, or a direct branch
anywhere in the function (a linear sweep over its st_size bytes) to an address inside the
skipped prefix or at the moved probe (a loop back to it would fire the probe twice a call).

Pure: bytes in, an AttachPoint out; `read_points` reads them from a file. capstone (the
disassembler) is imported only for a function whose first instruction is not emulated.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import capstone

__all__ = [
    "MAX_FUNCTION_BYTES",
    "MAX_SKIPPED",
    "MAX_SKIP_BYTES",
    "AttachPoint",
    "choose",
    "emulated_length",
    "read_points",
]

#: The most instructions skipped before the probe (NVIDIA's thunk: 1; endbr64 + cmp: 2).
MAX_SKIPPED: Final = 4
#: ... and the most bytes: no skipped prefix is longer (4 instructions of at most 15 bytes).
MAX_SKIP_BYTES: Final = 64
#: The largest function swept for branches into its prefix: a larger one keeps its entry.
MAX_FUNCTION_BYTES: Final = 1 << 16
#: The longest x86-64 instruction, what is read of a function to look at its first.
_PEEK: Final = 15

#: The instructions a probe may be moved past: they write the flags at most, and no memory
#: (capstone's mnemonics, prefixes included: `lock cmp` or `rep nop` is none of these).
_SKIPPABLE: Final = frozenset({"endbr64", "nop", "cmp", "test"})
#: Direct branches (capstone's mnemonics: every jcc starts with j), whose target is an address.
_BRANCHES: Final = frozenset({"call", "loop", "loope", "loopne", "xbegin"})
#: Where the code is disassembled as if loaded: far from 0, so that a branch before the function
#: is a smaller address, not one that wraps around.
_BASE: Final = 1 << 32


@dataclass(frozen=True, slots=True)
class AttachPoint:
    """Where a function's probe goes: `skip` bytes past its entry, at an instruction the
    kernel emulates, or single-steps (`emulated` False, `why` says why it stays there)."""

    skip: int
    emulated: bool
    why: str = ""


def emulated_length(code: bytes) -> int:
    """The length of the instruction at the start of `code` if the kernel emulates it at a
    uprobe (arch/x86/kernel/uprobes.c: branch_setup_xol_ops, push_setup_xol_ops), else 0.

    Told by its bytes alone, without prefixes (the kernel refuses 0x66 on a branch and takes
    only REX 0x41 on a push; the other prefixes it allows are left for the single step)."""
    if not code:
        return 0
    op = code[0]
    if op == 0x90 or 0x50 <= op <= 0x57:  # nop, push %rax..%rdi
        return 1
    if op == 0xEB or 0x70 <= op <= 0x7F:  # jmp rel8, jcc rel8
        return 2 if len(code) >= 2 else 0
    if op == 0x41 and len(code) >= 2 and 0x50 <= code[1] <= 0x57:  # push %r8..%r15
        return 2
    if op in (0xE8, 0xE9):  # call rel32, jmp rel32
        return 5 if len(code) >= 5 else 0
    if op == 0x0F and len(code) >= 6 and 0x80 <= code[1] <= 0x8F:  # jcc rel32
        return 6
    return 0


def _stepped(why: str) -> AttachPoint:
    return AttachPoint(0, False, why)


def choose(code: bytes, size: int) -> AttachPoint:
    """The attach point of the function whose bytes from its entry are `code` (its `size`
    bytes, st_size; 0: not known). At the entry when the kernel emulates the instruction
    there; past a skippable prefix when the instruction after it is emulated and no branch of
    the function lands inside the prefix or on that instruction; else at the entry, stepped."""
    if emulated_length(code):
        return AttachPoint(0, True)
    if size <= 0:
        return _stepped("its size is not known")
    if size > MAX_FUNCTION_BYTES:
        return _stepped(f"it is larger than {MAX_FUNCTION_BYTES} bytes")
    if len(code) < size:
        return _stepped("its bytes could not be read")
    code = code[:size]
    instructions = _decode(code)
    if instructions is None:
        return _stepped("its bytes do not decode")
    skip = _past_prefix(code, instructions)
    if skip is None:
        return _stepped(f"no instruction the kernel emulates within its first {MAX_SKIPPED + 1}")
    for offset, _length, mnemonic, operands in instructions:
        target = _target(mnemonic, operands)
        if target is not None and 0 < target <= skip:
            return _stepped(f"a branch at +{offset} lands at +{target}, inside the {skip} bytes"
                            " a probe would skip")
    return AttachPoint(skip, True)


def _past_prefix(code: bytes, instructions: list[tuple[int, int, str, str]]) -> int | None:
    """The offset of the first emulated instruction after a prefix of skippable ones."""
    for offset, length, mnemonic, _operands in instructions[: MAX_SKIPPED + 1]:
        if offset > MAX_SKIP_BYTES:
            return None
        if emulated_length(code[offset : offset + length]) == length:
            return offset
        if mnemonic not in _SKIPPABLE:
            return None
    return None


def _target(mnemonic: str, operands: str) -> int | None:
    """The target (an offset from the entry) of a direct branch, else None."""
    op = mnemonic.rsplit(" ", 1)[-1]  # "bnd jmp": the branch is the last word
    if not (op.startswith("j") or op in _BRANCHES) or not operands.startswith("0x"):
        return None
    try:
        return int(operands, 16) - _BASE
    except ValueError:  # an indirect one: "qword ptr [rip + 0x...]", "rax"
        return None


_local = threading.local()


def _disassembler() -> capstone.Cs:
    """One disassembler per thread (a Cs object is not to be shared), made at first use."""
    cs: capstone.Cs | None = getattr(_local, "cs", None)
    if cs is None:
        import capstone  # ~40 ms: only where a first instruction is not emulated

        cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        cs.skipdata = False
        _local.cs = cs
    return cs


def _decode(code: bytes) -> list[tuple[int, int, str, str]] | None:
    """(offset, length, mnemonic, operands) of every instruction of `code`, decoded from its
    start; None unless they cover it exactly (capstone stops at bytes it cannot decode)."""
    found = []
    end = 0
    for address, length, mnemonic, operands in _disassembler().disasm_lite(code, _BASE):
        found.append((address - _BASE, length, mnemonic, operands))
        end = address - _BASE + length
    return found if end == len(code) else None


def read_points(path: str, functions: Mapping[int, int]) -> dict[int, AttachPoint]:
    """The attach point of each function of the file open at `path` (/proc/self/fd/N), by the
    file offset of its entry → its size (st_size, 0 if not known). The first bytes are read
    first; the whole function only where its first instruction is not emulated. A function
    whose bytes cannot be read stays at its entry, stepped."""
    points: dict[int, AttachPoint] = {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return {entry: _stepped("its file cannot be read") for entry in functions}
    try:
        for entry, size in functions.items():
            points[entry] = _read_point(fd, entry, size)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return points


def _read_point(fd: int, entry: int, size: int) -> AttachPoint:
    try:
        head = os.pread(fd, _PEEK, entry)
        if emulated_length(head) or size <= 0 or size > MAX_FUNCTION_BYTES:
            return choose(head, size)
        return choose(os.pread(fd, size, entry), size)
    except OSError:
        return _stepped("its bytes could not be read")
