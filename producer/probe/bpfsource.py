"""The BPF source bcc compiles: one file, with our own headers inlined.

bcc rewrites map calls (`table.lookup(&key)`) and tracepoint arguments (`args->fd`) only in the
file it compiles, not in the files that file #includes: a program written in a header compiles
but fails to load. So the loader hands bcc one text, the main file with each `#include "x.h"`
that names a file of the BPF directory replaced by that file (once, recursively), and `#line`
markers so that compiler messages still name the right file and line. System headers
(`#include <...>`) stay as they are.

Pure: reads files, returns text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from gpuflight.producer.contract.errors import SetupError

_INCLUDE: Final = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$')


def bundle(main: Path, include_dir: Path | None = None) -> str:
    """`main` with the quoted includes found in `include_dir` (default: its directory) inlined."""
    directory = include_dir or main.parent
    done: set[Path] = set()
    return _expand(main, directory, done)


def _expand(path: Path, directory: Path, done: set[Path]) -> str:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SetupError(f"BPF source {path} cannot be read: {exc.strerror}") from exc
    done.add(path.resolve())
    out = [f'#line 1 "{path}"']
    for number, line in enumerate(lines, start=1):
        match = _INCLUDE.match(line)
        target = directory / match.group(1) if match else None
        if target is None or not target.is_file():
            out.append(line)
            continue
        if target.resolve() not in done:
            out.append(_expand(target, directory, done))
        out.append(f'#line {number + 1} "{path}"')
    return "\n".join(out) + "\n"
