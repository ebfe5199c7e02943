"""Where a function's probes go (producer/discover/entrypoint.py, attachplan): at an instruction the
kernel emulates, past a prefix it would single-step, or at the entry, single-stepped and said so.

The code under test is written as assembly (GNU as, AT&T), assembled here; a label `here`
marks where its author says the probe belongs: that is the oracle, not this code's answer.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from gpuflight.producer.contract.abi import DRIVER_APIS, DRIVER_NAME_FUNCTIONS
from gpuflight.producer.discover import attachplan, elfsyms, entrypoint
from gpuflight.simgpu.build import build as build_sim
from tests.conftest import require
from tests.workloads import build


@lru_cache(maxsize=256)
def assemble(body: str) -> tuple[bytes, int | None]:
    """The bytes `body` assembles to, and where its label `here` is (None: no such label)."""
    cc = shutil.which("cc")
    assert cc is not None, "a C compiler is required (run scripts/setup)"
    with tempfile.TemporaryDirectory() as work:
        obj = Path(work) / "code.o"
        subprocess.run([cc, "-c", "-x", "assembler", "-", "-o", str(obj)],
                       input=f"\t.text\n{body}\n", text=True, check=True, capture_output=True)
        with obj.open("rb") as f:
            elf = ELFFile(f)
            text = elf.get_section_by_name(".text")
            assert text is not None
            symtab = elf.get_section_by_name(".symtab")
            here = [s["st_value"] for s in symtab.iter_symbols() if s.name == "here"] \
                if isinstance(symtab, SymbolTableSection) else []
            return text.data(), (here[0] if here else None)


def choose(body: str) -> tuple[entrypoint.AttachPoint, int | None]:
    code, here = assemble(body)
    return entrypoint.choose(code, len(code)), here


NVIDIA = """
    cmpl $0x321cba00, flag(%rip)
here:
    je 1f
    jmp *pointer(%rip)
1:  mov $4, %eax
    ret
"""


@pytest.mark.parametrize("body", [
    "here: push %rbp\n mov %rsp, %rbp\n pop %rbp\n ret",
    "here: push %r12\n pop %r12\n ret",
    "here: nop\n ret",
    "here: jmp 1f\n nop\n 1: ret",
    "here: jmp far\n .skip 200\n far: ret",
    "here: je 1f\n 1: ret",
    "here: call f\n ret\n f: ret",
], ids=["push rbp", "push r12", "nop", "jmp rel8", "jmp rel32", "jcc", "call"])
def test_an_entry_the_kernel_emulates_keeps_its_probe(body: str) -> None:
    point, here = choose(body)
    assert point == entrypoint.AttachPoint(here or 0, True)


@pytest.mark.parametrize("body", [
    NVIDIA,
    "endbr64\n here: push %rbp\n mov %rsp, %rbp\n pop %rbp\n ret",
    "endbr64\n cmpl $0x321cba00, flag(%rip)\n here: je 1f\n jmp *p(%rip)\n 1: ret",
    "testb $1, state(%rip)\n here: jne 1f\n jmp *p(%rip)\n 1: ret",
    "nopw 0(%rax,%rax,1)\n endbr64\n here: jmp f\n f: ret",
    "cmp %rdi, %rsi\n here: jb 1f\n xor %eax, %eax\n 1: ret",
    "test %edi, %edi\n here: je 1f\n mov $1, %eax\n 1: ret",
], ids=["nvidia's thunk", "endbr64 push", "endbr64 cmp je", "test jne", "nops jmp",
        "cmp registers", "test registers"])
def test_a_probe_moves_past_what_writes_only_the_flags(body: str) -> None:
    point, here = choose(body)
    assert here and point == entrypoint.AttachPoint(here, True)


def test_a_branch_back_to_the_entry_moves_nothing_it_would_not_fire_again() -> None:
    """A jump to the entry runs the prefix again: the probe fires again wherever it is."""
    point, here = choose(NVIDIA.replace("ret", "jmp 0b", 1).replace("cmpl", "0: cmpl", 1))
    assert here and point == entrypoint.AttachPoint(here, True)


@pytest.mark.parametrize("body", [
    "mov %rdi, %rax\n ret",
    "sub $8, %rsp\n push %rbp\n ret",
    "endbr64\n lea 8(%rsp), %rax\n push %rbp\n ret",
    "xor %eax, %eax\n ret",
    "endbr64\n endbr64\n endbr64\n endbr64\n endbr64\n push %rbp\n ret",
    "lock cmpxchg %rsi, (%rdi)\n push %rbp\n ret",
], ids=["mov", "sub rsp", "endbr64 lea", "xor", "five endbr64", "cmpxchg"])
def test_nothing_emulated_after_a_skippable_prefix_keeps_the_entry_stepped(body: str) -> None:
    point, _ = choose(body)
    assert point.skip == 0 and not point.emulated and point.why


@pytest.mark.parametrize("branch", [
    "jne here",          # a loop back to the moved probe: it would fire twice a call
    "jmp here",
    "je 2f\n 2: jmp middle",  # into the skipped prefix
    "call middle",
], ids=["jcc to the probe", "jmp to the probe", "jmp into the prefix", "call into the prefix"])
def test_a_branch_into_the_prefix_or_onto_the_probe_keeps_the_entry(branch: str) -> None:
    body = f"""
    endbr64
middle:
    cmpl $0x321cba00, flag(%rip)
here:
    je 1f
    jmp *pointer(%rip)
1:  cmpl $2, flag(%rip)
    {branch}
    ret
"""
    point, here = choose(body)
    assert here and point.skip == 0 and not point.emulated and "branch" in point.why


def test_bytes_that_do_not_decode_keep_the_entry() -> None:
    code, here = assemble(NVIDIA + " .byte 0x06, 0x07")  # push %es, pop %es: not in 64-bit mode
    assert here
    point = entrypoint.choose(code, len(code))
    assert point.skip == 0 and not point.emulated and "decode" in point.why


def test_a_function_of_unknown_or_too_large_size_or_cut_short_keeps_the_entry() -> None:
    code, _ = assemble(NVIDIA)
    unknown = entrypoint.choose(code, 0)
    large = entrypoint.choose(code + bytes(entrypoint.MAX_FUNCTION_BYTES), 1 + len(code)
                              + entrypoint.MAX_FUNCTION_BYTES)
    short = entrypoint.choose(code[:12], len(code))
    for point in (unknown, large, short):
        assert point.skip == 0 and not point.emulated and point.why


@pytest.mark.parametrize(("body", "emulated"), [
    (".byte 0x66\n jmp 1f\n 1: ret", False),   # the kernel refuses 0x66 on a branch
    ("pause\n ret", False),                     # f3 90: not the nop
    (".byte 0x48, 0x55\n ret", False),          # push %rbp with REX.W: not the 0x41 it takes
    ("push %r15\n ret", True),
    ("jg far\n .skip 300\n far: ret", True),    # jcc rel32
], ids=["0x66 jmp", "pause", "REX.W push", "push r15", "jcc rel32"])
def test_only_what_the_kernel_emulates_counts_as_emulated(body: str, emulated: bool) -> None:
    code, _ = assemble(body)
    assert bool(entrypoint.emulated_length(code)) is emulated


# ---- files: attach plans ----------------------------------------------------------------


def plan_of(path: Path, kind: str = "driver") -> attachplan.Plan:
    return attachplan.read_plan(str(path), kind, path.stat().st_size)


def test_every_probed_function_of_nvidia_s_driver_is_probed_at_its_je() -> None:
    try:
        directory = build.real_libcuda_dir()
    except Exception as exc:  # SetupError: not unpacked
        require(str(exc))
        raise
    path = directory / build.LIBCUDA_SONAME
    plan = plan_of(path)
    data = path.read_bytes()
    assert plan.offsets and not plan.stepped
    for name, offset in plan.offsets:
        entry = plan.entry(name)
        assert offset is not None and entry is not None
        # cmpl $imm32, disp32(%rip) (81 /7, ModRM 0x3d: 2 + 4 + 4 bytes), then je rel8 (0x74)
        assert data[entry:entry + 2] == b"\x81\x3d", name
        assert offset == entry + 10 and data[offset] == 0x74, name


def test_the_simulated_driver_is_entered_as_nvidia_s_and_probed_past_its_thunks(
    tmp_path: Path,
) -> None:
    """So that CI runs the moved probes (the conformance suite) without NVIDIA's driver."""
    sim = build_sim(tmp_path / "sim", runtimes=(13,))
    plan = plan_of(sim.driver)
    probed = dict(plan.offsets)
    assert probed.keys() == DRIVER_APIS | DRIVER_NAME_FUNCTIONS
    assert not plan.stepped
    data = sim.driver.read_bytes()
    for name, offset in probed.items():
        entry = plan.entry(name)
        assert offset is not None and entry is not None
        assert data[entry:entry + 2] == b"\x81\x3d" and offset == entry + 10, name
    runtime = plan_of(sim.runtime(13), "runtime")
    assert not runtime.entries and not runtime.stepped  # push %rbp: emulated at the entry


@pytest.fixture(scope="module")
def thunked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.build_thunked_stubcuda(tmp_path_factory.mktemp("thunked")) / build.LIBCUDA_SONAME


def test_each_thunk_shape_is_probed_where_its_author_marked(thunked: Path) -> None:
    plan = plan_of(thunked)
    shapes = build.thunk_shapes()
    marks = {name: elfsyms.symbol_address(str(thunked), f"gf_probe_{name}") for name in shapes}
    want = {name: elfsyms.vaddr_to_file_offset(str(thunked), mark)
            for name, mark in marks.items() if mark is not None}
    offsets = dict(plan.offsets)
    assert offsets == {name: want[name] for name in offsets}
    assert plan.stepped == {name for name in offsets if shapes[name] in ("stepped", "loop_back")}
    assert {shapes[name] for name in plan.stepped} == {"stepped", "loop_back"}


def shared_object(tmp_path: Path, body: str) -> Path:
    source = tmp_path / "lib.S"
    source.write_text(f"\t.text\n{body}\n\t.section .note.GNU-stack,\"\",@progbits\n")
    out = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-nostdlib", str(source), "-o", str(out)],
                   check=True, capture_output=True)
    return out


def thunk(name: str, extra: str = "") -> str:
    return f"""
    .globl {name}
    .type {name}, @function
{name}:
    cmpl $0x321cba00, flag(%rip)
{extra}
    je 1f
    jmp *pointer(%rip)
1:  mov $4, %eax
    ret
    .size {name}, .-{name}
"""


DATA = "\t.data\nflag: .long 0\npointer: .quad 0\n\t.text\n"


def test_two_names_of_one_function_share_one_offset_whatever_sizes_they_state(
    tmp_path: Path,
) -> None:
    """An alias without a size is moved with the function: one probe for both (probes.py
    attaches an offset once), never one at the entry and one past it, both firing."""
    alias = "\t.globl cuLaunchKernel_ptsz\n\t.type cuLaunchKernel_ptsz, @function\n" \
        "cuLaunchKernel_ptsz:\n"  # no .size
    path = shared_object(tmp_path, DATA + alias + thunk("cuLaunchKernel"))
    extents = elfsyms.function_extents(str(path), frozenset({"cuLaunchKernel",
                                                            "cuLaunchKernel_ptsz"}))
    assert extents["cuLaunchKernel"][0] == extents["cuLaunchKernel_ptsz"][0]
    assert extents["cuLaunchKernel_ptsz"][1] == 0  # the alias states no size
    plan = plan_of(path)
    assert plan.offset("cuLaunchKernel") == plan.offset("cuLaunchKernel_ptsz")
    assert plan.offset("cuLaunchKernel") == (plan.entry("cuLaunchKernel") or 0) + 10
    assert not plan.stepped


def test_another_function_starting_inside_the_prefix_keeps_the_entry(tmp_path: Path) -> None:
    """A call to the inner function would fire the outer one's moved probe."""
    inner = "\t.globl cuMemcpy\n\t.type cuMemcpy, @function\ncuMemcpy:"
    path = shared_object(tmp_path, DATA + thunk("cuLaunchKernel", inner))
    plan = plan_of(path)
    assert plan.offset("cuLaunchKernel") == plan.entry("cuLaunchKernel")
    assert "cuLaunchKernel" in plan.stepped
    assert plan.offset("cuMemcpy") == (plan.entry("cuLaunchKernel") or 0) + 10  # itself: its je


def test_undecodable_bytes_in_a_function_keep_its_entry(tmp_path: Path) -> None:
    body = thunk("cuLaunchKernel").replace("    ret\n", "    ret\n    .byte 0x06\n")
    path = shared_object(tmp_path, DATA + body + thunk("cuMemcpy").replace("1:", "2:")
                         .replace("1f", "2f"))
    plan = plan_of(path)
    assert plan.offset("cuLaunchKernel") == plan.entry("cuLaunchKernel")
    assert plan.stepped == {"cuLaunchKernel"}
    assert plan.offset("cuMemcpy") == (plan.entry("cuMemcpy") or 0) + 10


def test_a_file_changed_while_its_plan_is_read_keeps_every_entry(
    thunked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / build.LIBCUDA_SONAME
    shutil.copyfile(thunked, path)
    read = elfsyms.function_extents

    def then_rewritten(where: str, wanted: frozenset[str]) -> dict[str, tuple[int, int]]:
        found = read(where, wanted)
        data = path.read_bytes()
        path.write_bytes(data)  # rewritten in place, the same bytes: a new mtime and ctime
        return found

    monkeypatch.setattr(elfsyms, "function_extents", then_rewritten)
    plan = plan_of(path)
    monkeypatch.undo()
    assert plan.offsets and not plan.entries
    assert plan.stepped == {name for name, offset in plan.offsets if offset is not None}
    assert plan_of(path).entries  # read again, unchanged meanwhile: moved
