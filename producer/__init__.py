"""gpuflight producer: discover CUDA libraries, probe them with eBPF, decode, publish."""
