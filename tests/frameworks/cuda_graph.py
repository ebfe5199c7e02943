# mypy: disable-error-code="import-not-found"
"""Workload (b): a CUDA graph captured once with torch.cuda.CUDAGraph, replayed N times.

Usage: cuda_graph.py N. Prints one JSON line with N.
"""

import json
import sys

import torch


def main() -> None:
    replays = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    static_x = torch.zeros(256, device="cuda")
    # warm up on a side stream, as torch's docs ask before capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            static_y = (static_x * 2.0 + 1.0).sin()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = (static_x * 2.0 + 1.0).sin()
    for i in range(replays):
        static_x.fill_(float(i))
        g.replay()
    torch.cuda.synchronize()
    print(json.dumps({"replays": replays, "shape": list(static_y.shape)}))


if __name__ == "__main__":
    main()
