"""producer/discover/elfsyms.py on files made to hurt it: sizes and offsets that lie, sparse files
that claim hundreds of GB, and symbol tables of millions of entries.

The files are generated here (a minimal ELF64 writer): every field can be set to what an
attacker would choose, which a compiler never does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from gpuflight.producer.discover import elfsyms, procmaps

pytestmark = pytest.mark.frameworks

STT_OBJECT, STT_FUNC, STB_GLOBAL = 1, 2, 1
SHT_STRTAB, SHT_SYMTAB, SHT_DYNSYM = 3, 2, 11
GB = 1 << 30


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    elfsyms.clear_cache()
    yield
    elfsyms.clear_cache()


# --- a runtime linked into another library: only what that library calls ---------------------


def test_nccl_and_nvshmem_are_probed_for_what_they_call() -> None:
    from tests.support.frameworks import frameworks_python

    python = frameworks_python()
    if python is None:
        pytest.skip("no frameworks venv (scripts/setup-frameworks)")
    site = next(python.parent.parent.glob("lib/python3*/site-packages"))
    for path in ("nvidia/nccl/lib/libnccl.so.2", "nvidia/nvshmem/lib/libnvshmem_host.so.3"):
        lib = str(site / path)
        if not os.path.exists(lib):
            continue
        defined = elfsyms.defined_functions(lib, procmaps.RUNTIME_SYMBOLS)
        called = elfsyms.referenced_functions(lib, procmaps.RUNTIME_SYMBOLS)
        assert called is not None
        assert {"cudaLaunchKernel", "cudaMalloc", "cudaMemcpyAsync"} <= called < defined, path
        assert len(called) <= len(defined) // 2, (path, sorted(called))


# --- a file that imports the runtime holds no static copy: its .symtab is not read -----------


def _symbol_tables_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The section types of the symbol tables elfsyms decodes from now on."""
    read: list[int] = []
    decode = elfsyms._read_symbols

    def spy(elf: elfsyms._Elf, table: elfsyms._Section) -> object:
        read.append(table.type)
        return decode(elf, table)

    monkeypatch.setattr(elfsyms, "_read_symbols", spy)
    return read


#: The frameworks venv's files the rule must not change: PyTorch's (they import the runtime:
#: .symtab skipped) and NCCL's and NVSHMEM's (static runtimes: .symtab read).
REAL_FILES = (
    "torch/lib/libtorch_cuda.so", "torch/lib/libtorch_cpu.so", "torch/lib/libtorch_python.so",
    "torch/lib/libc10_cuda.so", "torch/lib/libtorch_nvshmem.so",
    "nvidia/nccl/lib/libnccl.so.2", "nvidia/nvshmem/lib/libnvshmem_host.so.3",
    "nvidia/nvshmem/lib/nvshmem_transport_ibrc.so.6",
)


def test_the_rule_changes_no_answer_for_real_files(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.frameworks import frameworks_python

    python = frameworks_python()
    if python is None:
        pytest.skip("no frameworks venv (scripts/setup-frameworks)")
    site = next(python.parent.parent.glob("lib/python3*/site-packages"))
    runtime, wanted = procmaps.RUNTIME_SYMBOLS, procmaps._CLASSIFYING_SYMBOLS
    skipped = []
    for path in REAL_FILES:
        lib = str(site / path)
        if not os.path.exists(lib):
            continue
        with monkeypatch.context() as patch:
            read = _symbol_tables_read(patch)
            quick = elfsyms.defined_functions(lib, wanted, unless_imported=runtime)
        if SHT_SYMTAB not in read:
            skipped.append(path)
        assert quick == elfsyms.defined_functions(lib, wanted), path
        if path.startswith("nvidia/"):
            assert SHT_SYMTAB in read, path  # a static runtime is looked for ...
            assert quick >= {"cudaLaunchKernel", "cudaMalloc"}, path  # ... and found
    if os.path.exists(site / REAL_FILES[0]):
        assert "torch/lib/libtorch_cuda.so" in skipped
        assert "torch/lib/libtorch_cpu.so" in skipped


# --- the rel32 search: every byte, exactly ---------------------------------------------------


# --- issue 25, item 3: what a file's headers claim costs no more than what it holds ---------
