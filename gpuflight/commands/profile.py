"""`gpuflight profile`: a job's code paths over a time range, from Kafka, as pprof."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflight.commands.options import add_kafka_options, check_kafka, kafka_settings
from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.contract.files import check_target

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers

log = logging.getLogger("gpuflight")


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("profile", help="a job's code paths over a time range, from Kafka, "
                            "as a pprof profile (producer --stack-sampling)")
    add_kafka_options(parser, required=True)
    parser.add_argument("--job", required=True, help="the job (k8s:NS/POD, slurm:ID, COMM:PID)")
    parser.add_argument("--host", help="only this host's processes")
    parser.add_argument("--since", default="1h", metavar="WHEN",
                        help="how far back: a duration (90s, 30m, 6h, 7d) or a TIME as for "
                        "replay (default %(default)s)")
    parser.add_argument("--until", default=None, metavar="TIME", help="up to (default: now)")
    parser.add_argument("--output", "-o", type=Path, required=True, metavar="FILE",
                        help="the profile (profile.proto, gzipped: go tool pprof, speedscope, "
                        "Pyroscope)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuflight import timeparse
    from gpuflight.producer import replay

    check_target(args.output, "--output")
    since_ns, until_ns = timeparse.time_range(args.since, args.until)
    kafka = kafka_settings(args)
    check_kafka(kafka.bootstrap, kafka.config, required=True)
    processes = replay.processes_of_job(kafka, args.job, args.host)
    if not processes:
        raise UsageError(f"no process of job {args.job} on {kafka.topics.processes}"
                         + (f" from host {args.host}" if args.host else ""))
    stats = replay.replay(kafka, from_ns=since_ns, to_ns=until_ns, profile=args.output,
                          processes=processes)
    if not stats.paths:
        log.warning("no code paths of %s in that range: its producer samples them with "
                    "--stack-sampling N", args.job)
    log.info("wrote %s: %d code path records of %d process(es) of %s", args.output,
             stats.paths, len(processes), args.job)
    return 0
