"""Kernel names: demangling, short forms, and how a launch handle finds its name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from producer import elfsyms
from producer.kernels import KernelNames, demangle, operation, short_name
from producer.records import EVENT_DTYPE, NAME_EVENT_DTYPE, EventType, NameKind
from producer.wire import KernelName


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


def test_address_in_a_file_is_named_by_its_symbol_or_module_offset(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler is required (run scripts/setup)")
    source = tmp_path / "k.c"
    source.write_text("void _Z6kernelPf(float *p) { if (p) *p = 1; }\n"
                      "static int pad[64] __attribute__((used));\n")
    library = tmp_path / "libk.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", str(source), "-o", str(library)], check=True)
    symbol = elfsyms.function_addresses(str(library), frozenset({"_Z6kernelPf"}))["_Z6kernelPf"]
    # Mapped at 0x7f0000000000 from file offset 0; the symbol's file offset equals its
    # vaddr for this layout (checked by file_offset_to_vaddr).
    assert elfsyms.file_offset_to_vaddr(str(library), symbol) == symbol
    inode = library.stat().st_ino
    base = 0x7F0000000000
    proc = tmp_path / "proc"
    _fake_proc(proc, 42, f"{base:x}-{base + 0x100000:x} r-xp 00000000 fd:01 {inode}   "
                         f"{library}\n555500000000-555500021000 rw-p 00000000 00:00 0   [heap]\n")
    kernels = KernelNames(proc_root=proc)
    assert kernels.name_of(42, base + symbol) == KernelName("kernel", "kernel(float*)")
    # An address in the file but in no function: the module and the offset.
    assert name_of(kernels, 42, base + 0x10).short == "libk.so+0x10"
    assert name_of(kernels, 42, 0x555500000040).short == "[heap]+0x40"
    assert name_of(kernels, 42, 0x10).short == "unknown+0x10"
