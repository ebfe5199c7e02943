"""`gpuflight replay`: re-emit the events of a time range from Kafka."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflight.commands.options import add_kafka_options, check_kafka, kafka_settings, pid
from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.contract.files import check_target

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers

log = logging.getLogger("gpuflight")


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("replay", help="re-emit the events of a time range from Kafka")
    add_kafka_options(parser, required=True)
    parser.add_argument("--from", dest="from_time", required=True, metavar="TIME",
                        help="ISO 8601 (UTC unless it says), or since the epoch: seconds, "
                        "or an integer with a unit (…ns, …ms) for an exact bound")
    parser.add_argument("--to", dest="to_time", required=True, metavar="TIME")
    parser.add_argument("--host", help="only this host's events")
    parser.add_argument("--pid", type=pid, help="only this process's events")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--output", "-o", type=Path, help="write JSON lines ('-': stdout)")
    where.add_argument("--to-topic", metavar="TOPIC", help="re-publish into this topic")
    where.add_argument("--timeline", type=Path, metavar="FILE",
                       help="write a Perfetto trace of the range (one host's: --host)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuflight import timeparse
    from gpuflight.producer import replay

    check_target(args.output, "--output")
    check_target(args.timeline, "--timeline")
    if args.timeline is not None and args.host is None:
        raise UsageError("replay --timeline needs --host: a timeline is one host's (the "
                         "process ids of several hosts would mix)")
    kafka = kafka_settings(args)
    from_ns = timeparse.parse_time(args.from_time)
    to_ns = timeparse.parse_time(args.to_time)
    check_kafka(kafka.bootstrap, kafka.config, required=True)
    stats = replay.replay(
        kafka,
        from_ns=from_ns,
        to_ns=to_ns,
        host=args.host,
        pid=args.pid,
        output=args.output,
        to_topic=args.to_topic,
        timeline=args.timeline,
    )
    log.info("replayed %d events and %d requests from %d messages (%d skipped as "
             "malformed)", stats.events, stats.requests, stats.messages,
             stats.skipped_malformed)
    return 0
