"""`gpuflight report`: a job's aggregates from InfluxDB as a table; with --by, requests and
GPU cost by route, job, namespace or team (cost's table), or what each code path's user
function cost (--by function), per route (--by route,function)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpuflight.commands import cost
from gpuflight.commands.options import add_report_options
from gpuflight.producer.contract.errors import UsageError

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser("report", help="a job's aggregates from InfluxDB, as a table; or "
                            "requests and GPU cost by route, job, namespace or team, or GPU "
                            "cost by code path's function (--by)")
    parser.add_argument("--job", help="the job (its aggregates; with --by: only its requests)")
    parser.add_argument("--by", choices=("route", "job", "namespace", "team", "function",
                                         "route,function"),
                        help="requests, latency, GPU work and cost per route, job, namespace "
                        "or team label; or GPU work and cost per user function of the code "
                        "paths (function), per route of the requests they served "
                        "(route,function)")
    add_report_options(parser)
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.by in ("function", "route,function"):
        return _functions(args)
    if args.by:
        return cost.run(args)
    if not args.job:
        raise UsageError("report needs --job JOB, or --by route|job|namespace|team|function|"
                         "route,function")
    from gpuflight import timeparse
    from gpuflight.streams import report
    from gpuflight.streams.settings import InfluxSettings

    influx = InfluxSettings.from_environment(args.influx, args.bucket)
    since_ns, until_ns = timeparse.time_range(args.since, args.until)
    summary = report.job_summary(influx, args.job, since_ns, until_ns, args.host)
    print(report.render_json([summary]) if args.json else report.render_job(summary))
    return 0


def _functions(args: argparse.Namespace) -> int:
    from gpuflight import timeparse
    from gpuflight.streams import costs
    from gpuflight.streams.settings import InfluxSettings

    influx = InfluxSettings.from_environment(args.influx, args.bucket)
    since_ns, until_ns = timeparse.time_range(args.since, args.until)
    table = costs.function_table(influx, since_ns, until_ns, host=args.host, job=args.job,
                                 by_route=args.by == "route,function")
    print(costs.render_functions_json(table) if args.json else costs.render_functions(table))
    return 0
