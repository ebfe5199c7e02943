"""The `gpuflight` command: argument parsing, logging set-up and exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from producer.errors import GpuflightError, UsageError
from producer.settings import CaptureSettings

log = logging.getLogger("gpuflight")


def _pages(text: str) -> int:
    value = int(text)
    if value < 1 or value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {text}")
    return value


def _add_capture_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ring-buffer-pages",
        type=_pages,
        default=CaptureSettings.ringbuf_pages,
        metavar="N",
        help="event ring buffer size in pages, a power of two (default %(default)s = 32 MiB)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuflight",
        description="See what GPU applications do: eBPF uprobes on the CUDA runtime.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    trace = sub.add_parser("trace", help="run a command under capture and summarise it")
    trace.add_argument("--output", "-o", type=Path, help="write events as JSON lines ('-': stdout)")
    _add_capture_options(trace)
    trace.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")

    producer = sub.add_parser("producer", help="capture node-wide until SIGTERM/SIGINT")
    producer.add_argument("--output", "-o", type=Path, help="write events as JSON lines")
    producer.add_argument(
        "--pid", type=int, action="append", help="capture only this process (repeatable)"
    )
    producer.add_argument("--proc", type=Path, default=Path("/proc"), help=argparse.SUPPRESS)
    _add_capture_options(producer)

    demo = sub.add_parser("demo", help="the kernel-fusion showcase on a simulated GPU")
    demo.add_argument("--steps", type=int, default=None, help="training steps per run")
    return parser


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="gpuflight: %(message)s",
        stream=sys.stderr,
    )


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "trace":
        from producer import trace

        argv = list(args.argv)
        if argv and argv[0] == "--":
            argv = argv[1:]
        settings = CaptureSettings(ringbuf_pages=args.ring_buffer_pages)
        return trace.run(argv, output=args.output, settings=settings).exit_code
    if args.command == "producer":
        from producer import node

        pids = frozenset(args.pid) if args.pid else None
        settings = CaptureSettings(
            proc_root=args.proc, pids=pids, ringbuf_pages=args.ring_buffer_pages
        )
        return node.run(settings, args.output)
    if args.command == "demo":
        from producer.demo import showcase

        return int(showcase.run(steps=args.steps))
    raise UsageError(f"unknown command {args.command}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _configure_logging(args.verbose)
    try:
        return _dispatch(args)
    except GpuflightError as exc:
        if args.verbose:
            log.exception("failed")
        print(f"gpuflight: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: one line unless -v
        if args.verbose:
            raise
        print(f"gpuflight: internal error: {type(exc).__name__}: {exc} (rerun with -v)",
              file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
