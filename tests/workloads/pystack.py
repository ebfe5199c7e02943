"""A Python process with known stacks, for walks of its frames from outside
(tests/system/test_pystacks.py). Runs on CPython 3.9+: no newer syntax.

Each of two threads (the main one and "worker") reaches a known depth through a plain
function, a method, a generator, a decorated function, recursion and a non-ASCII name, then
prints one JSON line (its native tid, its pthread id, and its stack as sys._getframe sees
it, innermost first: qualified names where the version has them) and waits for stdin to
close. With `--point LIB`, each calls LIB's gf_point() (through ctypes) once a line is read
from stdin, and says "called", before that wait.
"""

from __future__ import annotations

import ctypes
import functools
import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

said = threading.Lock()
done = threading.Event()
go = threading.Event()
#: --point LIB: after saying its stack, each thread calls LIB's gf_point() once a line is
#: read from stdin (tests/system/test_pywalk.py probes it and walks from there).
point = ctypes.CDLL(sys.argv[2]).gf_point if sys.argv[1:2] == ["--point"] else None


def report(wait: Callable[[], object]) -> None:
    frames = []
    frame: Any = sys._getframe()
    while frame is not None:
        code = frame.f_code
        frames.append({"name": getattr(code, "co_qualname", code.co_name),
                       "file": code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    with said:
        sys.stdout.write(json.dumps({"tid": threading.get_native_id(),
                                     "ident": threading.get_ident(), "frames": frames}) + "\n")
        sys.stdout.flush()
    if point is not None:
        go.wait()
        point()
        with said:
            sys.stdout.write("called\n")
            sys.stdout.flush()
    wait()


def decorated(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return fn(*args)
    return wrapper


@decorated
def récursif(n: int, wait: Callable[[], object]) -> Any:  # noqa: PLC2401 (a name walks must decode: not ASCII)
    if n:
        return récursif(n - 1, wait)
    return report(wait)


def gen(wait: Callable[[], object]) -> Iterator[None]:
    yield récursif(3, wait)


class Model:
    def forward(self, wait: Callable[[], object]) -> None:
        return next(gen(wait))


def read_stdin() -> None:
    """Go (--point) at the first line; the end at end of file."""
    if point is not None:
        sys.stdin.readline()
        go.set()
    sys.stdin.read()
    done.set()


def run(wait: Callable[[], object]) -> None:
    Model().forward(wait)


threading.Thread(target=read_stdin, name="stdin", daemon=True).start()
worker = threading.Thread(target=run, args=(done.wait,), name="worker")
worker.start()
run(done.wait)
worker.join()
