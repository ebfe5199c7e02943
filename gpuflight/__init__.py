"""gpuflight: see what GPU applications do, with eBPF uprobes on the CUDA runtime.

    gpuflight.producer   the per-node capture library (producer/ in the repository)
    gpuflight.streams    the stream worker: Kafka → windows → InfluxDB (streams/)
    gpuflight.cli, commands, stack, demo, simgpu: the face, the only part that imports both
                         halves (neither imports it; the import rules in pyproject.toml)

Importing any part of it imports this first: numpy with one BLAS thread (below).
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
