"""`gpuflight producer`: the node agent, capturing node-wide until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflight.commands.options import (
    add_capture_options,
    add_kafka_options,
    add_metrics_options,
    add_stack_options,
    check_kafka,
    kafka_settings,
    metrics_endpoint,
    non_negative,
    pid,
    positive,
    positive_int,
    stack_rate,
)
from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.contract.files import check_target
from gpuflight.producer.publish.redact import CMDLINE_MODES
from gpuflight.producer.settings import CaptureSettings

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("producer", help="capture node-wide until SIGTERM/SIGINT")
    parser.add_argument("--output", "-o", type=Path, help="write events as JSON lines")
    add_kafka_options(parser, required=False)
    parser.add_argument(
        "--buffer-mb",
        type=positive_int,
        default=256,
        help="bound of the Kafka publish queue; beyond it batches are dropped and counted "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--kafka-close-timeout",
        type=non_negative,
        default=30.0,
        metavar="S",
        help="at shutdown, how long to wait for Kafka to take what is queued (default 30)",
    )
    parser.add_argument(
        "--kafka-flush-interval",
        type=positive,
        default=0.25,
        metavar="S",
        help="how long a process's events wait to be sent together (default %(default)s)",
    )
    parser.add_argument(
        "--cmdline", choices=CMDLINE_MODES, default="redacted",
        help="command lines on the processes topic: in full, with what looks like a secret "
        "(--password X, --api-key=X, TOKEN=X, https://user:pass@…) replaced by <redacted>, "
        "or none (default %(default)s)")
    parser.add_argument(
        "--pid", type=pid, action="append", help="capture only this process (repeatable)"
    )
    parser.add_argument("--status-file", type=Path, metavar="FILE",
                        help="keep a JSON status here (ready, probed files, counters), "
                        "replaced atomically: what scripts and tests wait on")
    add_metrics_options(parser, "the agent")
    parser.add_argument("--top-feed", type=Path, default=None, metavar="SOCKET",
                        help="where `gpuflight top` reads this agent's rows (default "
                        "/run/gpuflight/top.sock)")
    add_stack_options(parser, None)  # code paths: each process's, published with their costs
    parser.add_argument("--proc", type=Path, default=Path("/proc"), help=argparse.SUPPRESS)
    add_capture_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuflight.producer import node

    if args.stack_sampling is not None and args.kafka is None:
        raise UsageError("--stack-sampling publishes code paths to Kafka: give --kafka too")
    check_target(args.output, "--output")
    check_target(args.status_file, "--status-file", replaced=True)
    pids = frozenset(args.pid) if args.pid else None
    period, budget_ns = (None, 0) if args.stack_sampling is None else stack_rate(args)
    settings = CaptureSettings(
        proc_root=args.proc, pids=pids, ringbuf_pages=args.ring_buffer_pages,
        cpu_slots=args.cpu_buffer_slots, http=args.http,
        stack_period=period, stack_budget_ns=budget_ns, stack_max_walks=args.stack_max_walks,
    )
    kafka = kafka_settings(args, args.buffer_mb) if args.kafka is not None else None
    if kafka is not None:
        from gpuflight.producer.probe.preflight import check_can_probe

        check_can_probe()  # what the machine lacks comes first
        check_kafka(kafka.bootstrap, kafka.config, required=False)
    from gpuflight.producer.top import FEED_PATH

    return node.run(settings, args.output, kafka, status_file=args.status_file,
                    metrics=metrics_endpoint(args), top_feed=args.top_feed or FEED_PATH)
