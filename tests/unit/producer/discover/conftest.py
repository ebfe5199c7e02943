"""The ELF files and fake /proc trees the discovery tests share (tests/support/elves.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflight.producer.discover import elfsyms
from tests.conftest import require
from tests.support.elves import Elves, FakeProc, build_elves


@pytest.fixture(scope="session")
def elves(tmp_path_factory: pytest.TempPathFactory) -> Elves:
    require(None if shutil.which("cc") else "needs a C compiler (cc)")
    return build_elves(tmp_path_factory.mktemp("elves"))


@pytest.fixture(autouse=True)
def _fresh_elf_cache() -> Iterator[None]:
    # elfsyms answers from its own in-process cache: every read in these tests is a real one.
    elfsyms.clear_cache()
    yield
    elfsyms.clear_cache()


@pytest.fixture
def proc(tmp_path: Path, elves: Elves) -> FakeProc:
    # The files live beside the tree, as on a host, and are hard-linked into each root.
    store = tmp_path / "store"
    shutil.copytree(elves.dir, store)
    return FakeProc(tmp_path / "proc")
