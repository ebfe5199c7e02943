"""`gpuflight compare JOB_A JOB_B`: two jobs side by side from InfluxDB, with ratios."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpuflight.commands.options import add_report_options

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("compare", help="two jobs side by side, with ratios (B vs A)")
    parser.add_argument("job_a", metavar="JOB_A")
    parser.add_argument("job_b", metavar="JOB_B")
    add_report_options(parser)
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuflight import timeparse
    from gpuflight.streams import report
    from gpuflight.streams.settings import InfluxSettings

    influx = InfluxSettings.from_environment(args.influx, args.bucket)
    since_ns, until_ns = timeparse.time_range(args.since, args.until)
    a = report.job_summary(influx, args.job_a, since_ns, until_ns, args.host)
    b = report.job_summary(influx, args.job_b, since_ns, until_ns, args.host)
    print(report.render_json([a, b]) if args.json else report.render_compare(a, b))
    return 0
