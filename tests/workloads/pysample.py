"""Calls from two known places, for the in-kernel sampler (tests/system/test_pywalk.py).

`pysample.py LIB N` says "ready"; once a line is read from stdin, it calls LIB's gf_point()
N times from `hot()` and N // 4 times from `cold()`, interleaved, then says "done" and waits
for stdin to close. Runs on CPython 3.9+."""

from __future__ import annotations

import ctypes
import sys

point = ctypes.CDLL(sys.argv[1]).gf_point
n = int(sys.argv[2])


def hot() -> None:
    point()


def cold() -> None:
    point()


sys.stdout.write("ready\n")
sys.stdout.flush()
sys.stdin.readline()
for i in range(n):
    hot()
    if i % 4 == 3:
        cold()
sys.stdout.write("done\n")
sys.stdout.flush()
sys.stdin.read()
