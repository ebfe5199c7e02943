"""Attaching: a library file that cannot be probed is skipped and logged once."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from producer.discover import LibraryFile
from producer.probes import Probes
from tests.workloads import build


class RefusingBPF:
    def __init__(self) -> None:
        self.calls = 0

    def attach_uprobe(self, **_kwargs: Any) -> None:
        self.calls += 1
        raise Exception("Failed to attach BPF to uprobe")  # what bcc raises


def test_unattachable_library_is_skipped_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    probes = Probes.__new__(Probes)  # no BPF program: only the attach bookkeeping is tested
    probes.attached, probes.failed = {}, {}
    bpf = RefusingBPF()
    probes._bpf = bpf
    library = build.nvidia_runtime_dir(12) / "libcudart.so.12"
    target = LibraryFile(key=(1, 2), path="/opt/x/libcudart.so.12", host_path=str(library),
                         kind="runtime")
    with caplog.at_level(logging.WARNING):
        assert probes.attach(target) is None
        assert probes.attach(target) is None  # a later scan finds it again
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "skipping /opt/x/libcudart.so.12: cannot attach to" in warnings[0]
    assert bpf.calls == 1
    assert target.key in probes.failed and target.key not in probes.attached


def test_a_file_without_runtime_functions_is_refused(tmp_path: Any) -> None:
    probes = Probes.__new__(Probes)
    probes.attached, probes.failed = {}, {}
    probes._bpf = RefusingBPF()
    not_elf = tmp_path / "libcudart.so.12"
    not_elf.write_text("not an ELF file")
    target = LibraryFile(key=(3, 4), path=str(not_elf), host_path=str(not_elf), kind="runtime")
    assert probes.attach(target) is None
    assert "defines none of the CUDA runtime functions" in probes.failed[(3, 4)]
