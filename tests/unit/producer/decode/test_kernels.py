"""Kernel names: demangling, short forms, and how a launch handle finds its name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuflight.producer.contract.abi import EVENT_DTYPE, NAME_EVENT_DTYPE, EventType, NameKind
from gpuflight.producer.contract.wire import KernelName
from gpuflight.producer.decode.kernels import KernelNames, demangle, operation, short_name
from gpuflight.producer.discover import elfsyms


@pytest.mark.parametrize(
    ("symbol", "short", "full"),
    [
        ("_Z5scalePfi", "scale", "scale(float*, int)"),
        ("_Z4axpyIfLi4EEvPT_S0_i", "axpy", "void axpy<float, 4>(float*, float, int)"),
        (
            "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEE"
            "St5arrayIPcLm1EEEEviT0_T1_",
            "at::native::vectorized_elementwise_kernel<FillFunctor>",
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, "
            "std::array<char*, 1ul>)",
        ),
        (
            "_ZN3xla3gpu12_GLOBAL__N_113reduce_kernelIfLi256EEEvPKT_PS3_i",
            "xla::gpu::(anonymous namespace)::reduce_kernel",
            "void xla::gpu::(anonymous namespace)::reduce_kernel<float, 256>"
            "(float const*, float*, int)",
        ),
        # Triton and hand-written PTX kernels are not mangled: kept as they are.
        ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0"),
        # Looks mangled, is not: kept, never an error.
        ("_Znot_really", "_Znot_really", "_Znot_really"),
    ],
)
def test_demangle(symbol: str, short: str, full: str) -> None:
    assert demangle(symbol) == KernelName(short, full)


def test_short_name_keeps_operators_and_namespaces_readable() -> None:
    assert short_name("void ns::k<(anonymous namespace)::T>(int)") == "ns::k"
    assert short_name("ns::Outer<int>::inner(float)") == "ns::Outer::inner"


# Kernels of PyTorch 2.15 (CUDA 13 wheels), demangled, with what their short name keeps: the
# operation, not only the generic kernel every elementwise op shares.
_ANON = "(anonymous namespace)"
_TORCH_KERNELS = [
    (f"void at::native::vectorized_elementwise_kernel<4, at::native::{_ANON}::launch_clamp_scalar"
     "(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::"
     "{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, "
     "std::array<char*, 2ul>, false>(int, at::native::(anonymous namespace)::launch_clamp_scalar"
     "(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::"
     "{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, "
     "std::array<char*, 2ul>)",
     "at::native::vectorized_elementwise_kernel<launch_clamp_scalar>"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AbsFunctor<float>, "
     "std::array<char*, 2ul>, false>(int, at::native::AbsFunctor<float>, std::array<char*, 2ul>)",
     "at::native::vectorized_elementwise_kernel<AbsFunctor>"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, "
     "float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul>, false>"
     "(int, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::"
     "MulFunctor<float> >, std::array<char*, 3ul>)",
     "at::native::vectorized_elementwise_kernel<MulFunctor>"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
     "neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#7}::"
     "operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::neg_kernel_cuda"
     "(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#7}::operator()() "
     "const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast"
     "<at::native::neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::"
     "{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::"
     "neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#7}::"
     "operator()() const::{lambda(float)#1} const&)::{lambda(int)#1})",
     "at::native::elementwise_kernel<neg_kernel_cuda>"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
     "BUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::"
     "TensorIteratorBase&, at::native::BUnaryFunctor<float, float, float, at::native::"
     "binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, at::native::"
     "gpu_kernel_impl_nocast<at::native::BUnaryFunctor<float, float, float, at::native::"
     "binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BUnaryFunctor"
     "<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::"
     "{lambda(int)#1})",
     "at::native::elementwise_kernel<MulFunctor>"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::"
     "func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::"
     "TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(at::native::"
     "ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, "
     "float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, "
     "4, 4>)",
     "at::native::reduce_kernel<sum_functor>"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps"
     "<float, float, float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, "
     "at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4>)",
     "at::native::reduce_kernel<MeanOps>"),
    ("void at_cuda_detail::cub::detail::scan::DeviceScanInitKernel<at_cuda_detail::cub::"
     "ScanTileState<float, true> >(at_cuda_detail::cub::ScanTileState<float, true>, int)",
     "at_cuda_detail::cub::detail::scan::DeviceScanInitKernel"),
    ("triton_poi_fused_add_mul_relu_0", "triton_poi_fused_add_mul_relu_0"),
]


@pytest.mark.parametrize(("full", "short"), _TORCH_KERNELS)
def test_short_names_of_generic_kernels_keep_their_operation(full: str, short: str) -> None:
    assert short_name(full) == short


def test_operation_search_is_bounded_and_never_raises() -> None:
    assert operation("") is None
    assert operation("k<" + "a<" * 5000 + ">" * 5000 + ">(int)") is None
    assert operation("k<x::{lambda()#1}>") is None  # no enclosing function
    assert operation("k<f(::{lambda()#1}>") is None  # unbalanced
    assert short_name("k<" + "FooFunctor, " * 10000 + ">()") == "k<FooFunctor>"


def name_of(kernels: KernelNames, pid: int, handle: int) -> KernelName:
    """A node's KernelNames always names a launch handle."""
    name = kernels.name_of(pid, handle)
    assert name is not None
    return name


def names(*rows: tuple[int, NameKind, int, int, str]) -> np.ndarray:
    records = np.zeros(len(rows), dtype=NAME_EVENT_DTYPE)
    for i, (pid, kind, handle, aux, name) in enumerate(rows):
        records[i]["pid"], records[i]["kind"] = pid, kind
        records[i]["handle"], records[i]["aux"] = handle, aux
        records[i]["name"] = name.encode()
    return records


def test_runtime_handles_resolve_through_registration(tmp_path: Path) -> None:
    kernels = KernelNames(proc_root=tmp_path)  # an empty /proc: no address lookups succeed
    kernels.add(names(
        (7, NameKind.RUNTIME_FUNCTION, 0x401000, 0x1, "_Z5scalePfi"),  # stub → name
        (7, NameKind.RUNTIME_KERNEL, 0xE0001, 0x401000, ""),  # cudaKernel_t → stub
        (7, NameKind.DRIVER_KERNEL, 0xE0002, 0x60001, "_Z4axpyIfLi4EEvPT_S0_i"),
        (7, NameKind.KERNEL_FUNCTION, 0xD0001, 0xE0002, ""),  # CUfunction → CUkernel
        (7, NameKind.DRIVER_FUNCTION, 0xF0001, 0x50001, "triton_poi_fused_add_mul_0"),
        (7, NameKind.MODULE, 0x50001, 0x7000, ""),
    ))
    assert kernels.name_of(7, 0x401000) == KernelName("scale", "scale(float*, int)")
    assert kernels.name_of(7, 0xE0001) == KernelName("scale", "scale(float*, int)")
    assert name_of(kernels, 7, 0xE0002).short == "axpy"
    assert name_of(kernels, 7, 0xD0001).short == "axpy"
    assert name_of(kernels, 7, 0xF0001).short == "triton_poi_fused_add_mul_0"
    # Per process: the same handle in another process is not named by pid 7's records.
    assert kernels.name_of(8, 0xF0001) == KernelName("unknown+0xf0001", "unknown+0xf0001")


def test_a_late_record_replaces_a_guess(tmp_path: Path) -> None:
    kernels = KernelNames(proc_root=tmp_path)
    assert name_of(kernels, 3, 0xF0009).short == "unknown+0xf0009"
    kernels.add(names((3, NameKind.DRIVER_FUNCTION, 0xF0009, 0, "late")))
    assert name_of(kernels, 3, 0xF0009).short == "late"


def test_offline_names_only_what_it_learnt() -> None:
    kernels = KernelNames(proc_root=None)
    kernels.learn(5, {0x10: KernelName("k", "k(int)")})
    assert kernels.name_of(5, 0x10) == KernelName("k", "k(int)")
    assert kernels.name_of(5, 0x11) is None


def test_for_launches_names_each_launched_handle_once(tmp_path: Path) -> None:
    kernels = KernelNames(proc_root=tmp_path)
    kernels.add(names((9, NameKind.DRIVER_FUNCTION, 0xF0001, 0, "a")))
    events = np.zeros(4, dtype=EVENT_DTYPE)
    events["pid"] = 9
    events["type"] = [EventType.LAUNCH, EventType.LAUNCH, EventType.MEMCPY, EventType.LAUNCH]
    events["handle"] = [0xF0001, 0xF0001, 0x1234, 0xF0002]
    assert kernels.for_launches(9, events) == {
        0xF0001: KernelName("a", "a"),
        0xF0002: KernelName("unknown+0xf0002", "unknown+0xf0002"),
    }


def _fake_proc(root: Path, pid: int, maps: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "maps").write_text(maps)


def _library(tmp_path: Path) -> tuple[Path, int]:
    """A shared library defining _Z6kernelPf, and that function's address in it (its file
    offset too, for this layout)."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is required (run scripts/setup)")
    source = tmp_path / "k.c"
    source.write_text("void _Z6kernelPf(float *p) { if (p) *p = 1; }\n"
                      "static int pad[64] __attribute__((used));\n")
    library = tmp_path / "libk.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", str(source), "-o", str(library)], check=True)
    symbol = elfsyms.function_addresses(str(library), frozenset({"_Z6kernelPf"}))["_Z6kernelPf"]
    # Mapped from file offset 0: the symbol's file offset equals its vaddr for this layout.
    assert elfsyms.file_offset_to_vaddr(str(library), symbol) == symbol
    return library, symbol


def _dev(path: Path) -> str:
    """st_dev of `path` as /proc/PID/maps writes it (major:minor in hex)."""
    dev = path.stat().st_dev
    return f"{os.major(dev):02x}:{os.minor(dev):02x}"


BASE = 0x7F0000000000


def test_address_in_a_file_is_named_by_its_symbol_or_module_offset(tmp_path: Path) -> None:
    library, symbol = _library(tmp_path)
    inode = library.stat().st_ino
    proc = tmp_path / "proc"
    _fake_proc(proc, 42, f"{BASE:x}-{BASE + 0x100000:x} r-xp 00000000 {_dev(library)} {inode}"
                         f"   {library}\n"
                         "555500000000-555500021000 rw-p 00000000 00:00 0   [heap]\n")
    kernels = KernelNames(proc_root=proc)
    assert kernels.name_of(42, BASE + symbol) == KernelName("kernel", "kernel(float*)")
    # An address in the file but in no function: the module and the offset.
    assert name_of(kernels, 42, BASE + 0x10).short == "libk.so+0x10"
    assert name_of(kernels, 42, 0x555500000040).short == "[heap]+0x40"
    assert name_of(kernels, 42, 0x10).short == "unknown+0x10"


def test_a_file_with_the_inode_number_on_another_file_system_is_not_read(
    tmp_path: Path,
) -> None:
    """A process's maps name a file by device and inode: a path that stats to the same inode
    number on another device is another file (one a user can make), and is never read."""
    library, symbol = _library(tmp_path)
    real = library.stat().st_dev
    other = f"{os.major(real) ^ 0x40:02x}:{os.minor(real) ^ 0x5:02x}"
    proc = tmp_path / "proc"
    _fake_proc(proc, 42, f"{BASE:x}-{BASE + 0x100000:x} r-xp 00000000 {other} "
                         f"{library.stat().st_ino}   {library}\n")
    kernels = KernelNames(proc_root=proc)
    assert name_of(kernels, 42, BASE + symbol).short == f"libk.so+0x{symbol:x}"


def test_the_mapped_file_is_opened_through_map_files_whatever_stat_says(
    tmp_path: Path,
) -> None:
    """Through overlayfs (or a btrfs subvolume) stat gives another device, even another inode,
    than /proc/PID/maps does: /proc/PID/map_files opens the mapped file itself."""
    library, symbol = _library(tmp_path)
    proc = tmp_path / "proc"
    _fake_proc(proc, 42, f"{BASE:x}-{BASE + 0x100000:x} r-xp 00000000 00:2f 12345678   "
                         f"/usr/lib/libk.so\n")
    (proc / "42" / "map_files").mkdir()
    (proc / "42" / "map_files" / f"{BASE:x}-{BASE + 0x100000:x}").symlink_to(library)
    kernels = KernelNames(proc_root=proc)
    assert kernels.name_of(42, BASE + symbol) == KernelName("kernel", "kernel(float*)")


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_process_that_exited_is_named_from_the_files_it_mapped(tmp_path: Path) -> None:
    """Its maps were read while it lived; by the time its launch is named it has exited and
    its library was deleted, and another file took its path: the name comes from the file it
    mapped. Forgotten, the files kept for it are closed."""
    library, symbol = _library(tmp_path)
    fds = _open_fds()
    kernels = KernelNames()
    with subprocess.Popen(
        [sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1]); "
         "print('mapped', flush=True); sys.stdin.read()", str(library)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline() == "mapped\n"
            kernels.remember_maps(child.pid)
            with open(f"/proc/{child.pid}/maps") as maps:
                base = next(int(line.split("-", 1)[0], 16) for line in maps
                            if line.rstrip().endswith(str(library))
                            and line.split()[2] == "00000000")
        finally:
            child.stdin.close()
            assert child.wait(timeout=60) == 0
    library.unlink()
    library.write_bytes(b"not the library: another file at its path\n")
    assert kernels.name_of(child.pid, base + symbol) == KernelName("kernel", "kernel(float*)")
    kernels.forget([child.pid])
    assert _open_fds() <= fds
