# mypy: disable-error-code="import-not-found"
"""Workload (c): torch.compile (Inductor -> Triton) of a small MLP-like function.

The matmuls go through Inductor's Triton templates (max-autotune, Triton as the only
GEMM backend), never cuBLAS; the elementwise epilogue and the reduction are fused
Triton kernels. Kernels launch through Triton's own launcher (cuModuleLoadData,
cuModuleGetFunction, cuLaunchKernelEx), not Inductor's static launcher (which calls
cuLaunchKernel). Usage: compile_mlp.py [max-autotune|default]; run with a fresh
TORCHINDUCTOR_CACHE_DIR. Prints one JSON line.
"""

import json
import os
import sys

import torch
import torch._inductor.config as inductor_config


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x @ w1 + b1)
    return (torch.tanh(h @ w2) * 2.0).sum(dim=1)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "max-autotune"
    inductor_config.max_autotune_gemm_backends = "TRITON"
    inductor_config.compile_threads = 1
    inductor_config.use_static_cuda_launcher = False
    x = torch.randn(64, 64, device="cuda")
    w1 = torch.randn(64, 64, device="cuda")
    b1 = torch.randn(64, device="cuda")
    w2 = torch.randn(64, 64, device="cuda")
    if mode == "max-autotune":
        fn = torch.compile(mlp, mode="max-autotune-no-cudagraphs")
    else:
        fn = torch.compile(mlp)
    out = fn(x, w1, b1, w2)
    out = fn(x, w1, b1, w2)
    torch.cuda.synchronize()
    print(
        json.dumps({"shape": list(out.shape), "cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR")})
    )


if __name__ == "__main__":
    main()
