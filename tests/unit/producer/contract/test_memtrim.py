"""producer/memtrim.py: freed memory goes back to the system on a schedule."""

from __future__ import annotations

import ctypes
import os

from gpuflight.producer.contract import memtrim


def rss_kib() -> int:
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_trims_when_due_and_only_then() -> None:
    now = [100.0]
    trimmer = memtrim.Trimmer(60.0, clock=lambda: now[0])
    assert not trimmer.maybe()
    now[0] = 159.9
    assert not trimmer.maybe()
    now[0] = 160.0
    assert trimmer.maybe() and trimmer.trims == 1
    assert not trimmer.maybe()
    now[0] = 221.0
    assert trimmer.maybe() and trimmer.trims == 2
    assert not memtrim.Trimmer(-1.0, clock=lambda: 1e9).maybe()  # negative: never


def test_a_trim_gives_back_what_a_peak_freed() -> None:
    """Many small blocks freed but for one at the top of the heap: glibc keeps the rest until
    malloc_trim (what the soak's agent and worker showed after a peak)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(4096) for _ in range(40_000)]  # ~160 MiB, below the mmap threshold
    for block in blocks[:-1]:
        libc.free(block)
    held = rss_kib()
    now = [0.0]
    trimmer = memtrim.Trimmer(1.0, clock=lambda: now[0])
    now[0] = 2.0
    assert trimmer.maybe()
    try:
        assert rss_kib() < held - 100_000, (held, rss_kib())
    finally:
        libc.free(blocks[-1])


def test_a_zero_interval_trims_every_time() -> None:
    trimmer = memtrim.Trimmer(0.0, clock=lambda: 5.0)
    assert trimmer.maybe() and trimmer.maybe()
