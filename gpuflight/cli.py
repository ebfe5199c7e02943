"""The `gpuflight` command: argument parsing, logging set-up, errors as one line and exit codes.
Each command is a module of gpuflight/commands/ (its options and what it runs)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from gpuflight.commands import COMMANDS
from gpuflight.producer.contract.errors import GpuflightError

log = logging.getLogger("gpuflight")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuflight",
        description="See what GPU applications do: eBPF uprobes on the CUDA runtime.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="gpuflight: %(message)s",
        stream=sys.stderr,
    )


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command parsed (its module's `run`)."""
    code: int = args.run(args)
    return code


#: Commands that have written, flushed and closed all they produce by the time they return:
#: the `gpuflight` command leaves without the interpreter's teardown after them.
_NO_TEARDOWN = frozenset({"trace"})


def main(argv: Sequence[str] | None = None) -> int:
    return _run(argv)[0]


def console() -> None:
    """The `gpuflight` command (and `python -m gpuflight`). After `trace`, the interpreter's
    teardown (freeing every object and module: ~50-70 ms after a PyTorch start-up, with its
    ~25,000 kernel names) is skipped: the command's user waits for nothing of it."""
    code, command = _run(None)
    if command in _NO_TEARDOWN:
        _exit_without_teardown(code)
    sys.exit(code)


def _exit_without_teardown(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed stream
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _run(argv: Sequence[str] | None) -> tuple[int, str | None]:
    """The exit code, and which command ran (None where none did)."""
    command: str | None = None
    try:
        args = _parser().parse_args(argv)
        command = args.command
        return _main(args), command
    except BrokenPipeError:  # `gpuflight report | head`: the reader has what it wanted
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE, command


def _main(args: argparse.Namespace) -> int:
    _configure_logging(args.verbose)
    if args.command in ("producer", "streams"):
        from gpuflight import memdebug

        memdebug.start_from_environment(args.command)  # opt-in: GPUFLIGHT_MEMDEBUG=DIR
    try:
        return _dispatch(args)
    except GpuflightError as exc:
        if args.verbose:
            log.exception("failed")
        print(f"gpuflight: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise
    except Exception as exc:  # a bug: one line unless -v
        if args.verbose:
            raise
        print(f"gpuflight: internal error: {type(exc).__name__}: {exc} (rerun with -v)",
              file=sys.stderr)
        return 70


if __name__ == "__main__":
    console()
