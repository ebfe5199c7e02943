"""The simulated GPU: our libcuda.so.1, libcudart.so.13/.12 and libnvidia-ml.so.1, that real
frameworks, the demo and the tests run on.

See build.py: `build(outdir)` compiles it, `SimGpu.env(...)` is the environment a
command runs on it with, `read_counts(path)` reads what each process counted; cbuild.py is
the one way C gets built (this, the demo's workload, the tests' workloads).
"""
