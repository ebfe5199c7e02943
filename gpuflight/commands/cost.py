"""`gpuflight cost`: GPU cost from InfluxDB over a time range, per job, route, namespace or
team (and `report --by`, which is the same table)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpuflight.commands.options import add_report_options

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("cost", help="GPU cost from InfluxDB over a time range, per job "
                            "(or --by route, namespace, team)")
    parser.add_argument("--by", choices=("job", "route", "namespace", "team"), default="job",
                        help="(default %(default)s)")
    parser.add_argument("--job", help="only this job's")
    add_report_options(parser)
    parser.set_defaults(since="24h")
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuflight import timeparse
    from gpuflight.streams import costs
    from gpuflight.streams.settings import InfluxSettings

    influx = InfluxSettings.from_environment(args.influx, args.bucket)
    since_ns, until_ns = timeparse.time_range(args.since, args.until)
    table = costs.cost_table(influx, args.by, since_ns, until_ns, host=args.host, job=args.job)
    print(costs.render_json(table) if args.json else costs.render(table))
    return 0
