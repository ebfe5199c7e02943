"""`gpuflight trace -- CMD`: run a command under capture and summarise it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflight.commands.options import (
    add_capture_options,
    add_price_options,
    add_stack_options,
    price_book,
    stack_rate,
)
from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.contract.files import check_target
from gpuflight.producer.decode.codepaths import FOLDED_WEIGHTS
from gpuflight.producer.settings import CaptureSettings

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers
    from gpuflight.producer.trace import RequestOptions


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("trace", help="run a command under capture and summarise it")
    parser.add_argument("--output", "-o", type=Path,
                        help="write events as JSON lines ('-': stdout)")
    parser.add_argument("--timeline", type=Path, metavar="FILE",
                        help="write a Perfetto trace of it (open in ui.perfetto.dev): a track "
                        "per process and thread, each CUDA call a slice, requests with flows "
                        "to their calls")
    parser.add_argument("--top", action="store_true",
                        help="show top's screen on the command while it runs (its output goes "
                        "to --command-output); the summary follows when it exits")
    parser.add_argument("--command-output", type=Path, metavar="FILE",
                        help="with --top: write the command's stdout and stderr to FILE "
                        "(default: a new file in $TMPDIR, named at the end)")
    parser.add_argument("--stacks", type=Path, metavar="FILE",
                        help="write the code paths that made the calls as folded stacks "
                        "(flamegraph.pl, speedscope, inferno): Python frames root first, "
                        "then the weight (--stacks-weight)")
    parser.add_argument("--stacks-weight", default="launches", choices=FOLDED_WEIGHTS,
                        help="what --stacks weighs each path by: kernel launches, GPU time, "
                        "bytes copied, CPU time blocked on the GPU, or probed calls "
                        "(default %(default)s)")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="write the code paths as a pprof profile (go tool pprof, "
                        "speedscope, Pyroscope): launches, GPU time, bytes, time blocked, "
                        "cost and calls per path")
    add_stack_options(parser, "auto")
    add_capture_options(parser)
    parser.add_argument("--otlp", metavar="URL", default=None,
                        help="export each HTTP request as an OTLP span (with its GPU work) to "
                        "this collector, e.g. http://127.0.0.1:4318")
    parser.add_argument("--otlp-protocol", choices=("http/protobuf", "grpc"),
                        default="http/protobuf", help="(default %(default)s)")
    add_price_options(parser)
    parser.add_argument("--gpu-model", metavar="NAME", default=None,
                        help="the GPU to price requests at (default: NVML's name of GPU 0)")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    parser.set_defaults(run=run)


def request_options(args: argparse.Namespace) -> RequestOptions:
    from gpuflight.producer.trace import RequestOptions

    return RequestOptions(prices=price_book(args.prices), gpu_model=args.gpu_model,
                          otlp=args.otlp, otlp_protocol=args.otlp_protocol)


def run(args: argparse.Namespace) -> int:
    from gpuflight.producer import trace

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    check_target(args.output, "--output")  # a FIFO there would hang; before CMD runs
    check_target(args.timeline, "--timeline")
    if args.command_output is not None and not args.top:
        raise UsageError("--command-output goes with --top (without it the command's output "
                         "is yours: redirect it)")
    check_target(args.command_output, "--command-output")
    if args.top and args.output is not None and str(args.output) == "-":
        raise UsageError("--output - writes to the terminal, which --top's screen owns: give "
                         "it a file")
    check_target(args.stacks, "--stacks")
    check_target(args.profile, "--profile")
    period, budget_ns = stack_rate(args)
    stacks = (trace.StackOptions(args.stacks, args.profile, period=period, budget_ns=budget_ns,
                                 weight=args.stacks_weight, max_walks=args.stack_max_walks)
              if args.stacks is not None or args.profile is not None else None)
    settings = CaptureSettings(ringbuf_pages=args.ring_buffer_pages,
                               cpu_slots=args.cpu_buffer_slots, http=args.http)
    requests = request_options(args)
    if not args.top:
        return trace.run(argv, output=args.output, settings=settings, requests=requests,
                         timeline=args.timeline, stacks=stacks).exit_code
    from gpuflight.commands.top import check_terminal
    from gpuflight.traceview import LiveTop

    check_terminal("trace --top", "without a terminal, trace without --top")
    if not argv:  # before the screen takes the terminal: trace.run says what is missing
        return trace.run(argv).exit_code
    live = LiveTop(argv, args.command_output, requests.prices, settings.http)
    try:
        result = trace.run(argv, output=args.output, settings=settings, requests=requests,
                           timeline=args.timeline, watchers=live.watchers,
                           command_stdio=live.command_stdio, on_end=live.end,
                           stacks=stacks)
    finally:
        live.close()
    print(live.output_note(), file=sys.stderr)
    return result.exit_code
