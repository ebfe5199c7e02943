"""A Python process with known stacks, for walks of its frames from outside
(tests/system/test_pystacks.py). Runs on CPython 3.9+: no newer syntax.

Each of two threads (the main one and "worker") reaches a known depth through a plain
function, a method, a generator, a decorated function, recursion and a non-ASCII name, then
prints one JSON line (its native tid, its pthread id, and its stack as sys._getframe sees
it, innermost first: qualified names where the version has them) and waits: the main thread
for stdin to close, the worker for an event the main thread sets then.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

said = threading.Lock()
done = threading.Event()


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


def main_wait() -> None:
    sys.stdin.read()
    done.set()


def run(wait: Callable[[], object]) -> None:
    Model().forward(wait)


worker = threading.Thread(target=run, args=(done.wait,), name="worker")
worker.start()
run(main_wait)
worker.join()
