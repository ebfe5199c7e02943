"""gpuflight's face: the command line, the local stack and the demos.

The only package that imports both halves: `producer` (the per-node capture library) and
`streams` (the stream app). Neither imports this package.
"""

import os as _os

# numpy's OpenBLAS starts a thread per CPU as numpy is imported, which costs ~40 ms of CPU on a
# 2-core VM, on the cores a traced command starts on. gpuflight does no linear algebra, so
# numpy gets one thread, and the environment is restored for the commands gpuflight runs.
if "OPENBLAS_NUM_THREADS" not in _os.environ:
    _os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del _os.environ["OPENBLAS_NUM_THREADS"]
