"""`gpuflight stack up|down|status`: a local Kafka and InfluxDB on loopback."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "stack", help="local Kafka and InfluxDB on loopback, for one machine and tests"
    )
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--dir", type=Path, default=None, metavar="DIR",
                        help="where the stack keeps its data (default "
                        "~/.local/share/gpuflight/stack)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuflight import stack

    data_dir = args.dir or stack.default_data_dir()
    if args.action == "up":
        stack.stack_up(data_dir)
    elif args.action == "down":
        stack.stack_down(data_dir)
    for line in stack.stack_status(data_dir):
        print(line)
    return 0
