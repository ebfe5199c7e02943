"""The simulated GPU: our libcuda.so.1 and libcudart.so.13/.12 that real frameworks run on.

See build.py: `build(outdir)` compiles it, `SimGpu.env(...)` runs a command on it,
`read_counts(path)` reads what each process counted.
"""

from gpuflight.simgpu.build import BuildError, SimGpu, build, counts_files, read_counts

__all__ = ["BuildError", "SimGpu", "build", "counts_files", "read_counts"]
