"""`gpuflight demo`: the kernel-fusion showcase on the simulated GPU (C, or real PyTorch where
the frameworks venv is), through the whole pipeline (--pipeline), or an inference-like server
under load with the cost of each route (--serve)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflight.commands.options import positive_int
from gpuflight.producer.contract.errors import GpuflightError

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers

log = logging.getLogger("gpuflight")


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("demo", help="the kernel-fusion showcase on a simulated GPU")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="training steps per run")
    parser.add_argument("--python", type=Path, default=None,
                        help="a Python with CUDA PyTorch: the showcase on real PyTorch (eager "
                        "vs torch.compile); default: the frameworks venv if there, else the C "
                        "showcase")
    parser.add_argument("--c", action="store_true", dest="c_showcase",
                        help="the C showcase even where PyTorch is installed")
    parser.add_argument("--pipeline", action="store_true",
                        help="through the whole pipeline: producer → Kafka → streams → "
                        "InfluxDB, then the comparison from InfluxDB")
    parser.add_argument("--serve", action="store_true",
                        help="an inference-like HTTP server on the simulated GPU under load: "
                        "its per-route table with the cost of 1,000 requests")
    parser.add_argument("--clients", type=positive_int, default=4, help="(--serve) clients")
    parser.add_argument("--requests", type=positive_int, default=100,
                        help="(--serve) requests per client")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.serve:
        from gpuflight.demo import serve

        return serve.run(clients=args.clients, requests=args.requests)
    if args.pipeline:
        from gpuflight.demo import pipeline as pipeline_demo

        return pipeline_demo.run(steps=args.steps)
    from gpuflight.demo import showcase, torch_showcase

    if args.python is not None:
        return torch_showcase.run(torch_showcase.prepare(args.python), steps=args.steps)
    python = None if args.c_showcase else torch_showcase.frameworks_python()
    if python is not None:
        try:
            prepared = torch_showcase.prepare(python)
        except GpuflightError as exc:
            log.warning("the PyTorch showcase cannot run (%s): the C showcase instead", exc)
        else:
            return torch_showcase.run(prepared, steps=args.steps)
    return int(showcase.run(steps=args.steps))
