"""The simulated GPU: our libcuda.so.1 and libcudart.so.13/.12 that real frameworks run on.

See build.py: `build(outdir)` compiles it, `SimGpu.env(...)` is the environment a
command runs on it with, `read_counts(path)` reads what each process counted.
"""
