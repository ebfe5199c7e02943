"""A code path's user function: what the stream worker folds paths to (streams/paths.py) and
what a request's span names its code paths by (producer/http/otlp.py). Pure.

A path's **user function** is its innermost Python frame that is neither in site-packages
(dist-packages) nor in Python's own library ("function (dir/file.py)": the line and all but
the file's last directory left out, so that one function is one series whichever release
directory it ran from): the function the user wrote that led to the call, whatever library
code it went through. A path with no such frame takes its innermost Python frame; one with no
Python frame at all (a process without CPython), its native caller.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

#: The longest user function kept (a tag value).
MAX_FUNCTION_CHARS: Final = 512
#: Library code: a frame in one of these is not the user's.
_LIBRARY: Final = re.compile(r"/(site|dist)-packages/|/lib(64)?/python3\.\d+t?/|^<frozen ")

#: (function, file, line): a Python frame; a native caller has no line.
Frame = tuple[str, str, int | None]


def user_function(frames: Sequence[Frame]) -> str:
    """The path's user function (root first: the innermost frame is the last)."""
    python = [(name, file) for name, file, line in frames if line is not None]
    mine = [f for f in python if not _LIBRARY.search(f[1])]
    name, file = (mine or python or [(f[0], f[1]) for f in frames[-1:]] or [("[none]", "")])[-1]
    file = "/".join(file.split("/")[-2:])  # not where a release was unpacked this time
    return (f"{name} ({file})" if file else name)[:MAX_FUNCTION_CHARS]
