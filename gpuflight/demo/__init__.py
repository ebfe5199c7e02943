"""The demo: a kernel-fusion workload in C (or PyTorch) on the simulated GPU (gpuflight/simgpu)."""
