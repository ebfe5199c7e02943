"""The demo: a simulated GPU (stub libcudart.so.12) and a kernel-fusion workload, in C."""
