"""`gpuflight streams`: a stream worker, Kafka → windowed aggregates → InfluxDB (Faust)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflight.commands.options import (
    add_influx_options,
    add_kafka_options,
    add_metrics_options,
    add_price_options,
    check_kafka,
    metrics_endpoint,
    non_negative,
    positive,
    price_book,
    seconds,
)

if TYPE_CHECKING:
    from gpuflight.commands.options import Subparsers


def add_parser(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "streams", help="a stream worker: Kafka → windowed aggregates → InfluxDB (Faust)"
    )
    add_kafka_options(parser, required=False, default="127.0.0.1:9092")
    add_influx_options(parser)
    # A window shorter than a second is not one the worker can close on time (it closes
    # windows on a 1 s tick) nor one a dashboard shows; 1e-10 s is 0 ns, no window at all.
    parser.add_argument("--window", type=seconds(1.0), default=10.0, metavar="S",
                        help="tumbling window, 1 s to 1 day (default %(default)s s)")
    parser.add_argument("--grace", type=seconds(0.0), default=5.0, metavar="S",
                        help="how late events may come and still count, up to 1 day "
                        "(default %(default)s s)")
    parser.add_argument("--app-id", default="gpuflight-streams",
                        help="Faust app id: workers with the same id share the partitions "
                        "(default %(default)s)")
    parser.add_argument("--worker", default=None, help="this worker's name (default: host)")
    parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                        help="Faust's local data (default ~/.local/share/gpuflight/streams)")
    parser.add_argument("--identity-wait", type=non_negative, default=5.0, metavar="S",
                        help=argparse.SUPPRESS)
    parser.add_argument("--tick", type=positive, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--stall-after", type=positive, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--max-pending-points", type=int, default=200_000, metavar="N",
                        help="points waiting for InfluxDB before the worker stops taking "
                        "messages (default %(default)s)")
    parser.add_argument("--idle", type=seconds(0.0), default=5.0, metavar="S",
                        help="after S seconds without events from a host, its windows close "
                        "by the wall clock, 0 to 1 day (default %(default)s)")
    # Under a second, a host whose clock is a little ahead (NTP keeps clocks within ms, not
    # better) would have its events dead-lettered.
    parser.add_argument("--max-future", type=seconds(1.0), default=300.0, metavar="S",
                        help="events stamped, or requests ending, more than S seconds ahead "
                        "of this worker's clock are not counted (dead letters), 1 s to 1 day "
                        "(default %(default)s)")
    parser.add_argument("--metrics-interval", type=positive, default=5.0, metavar="S",
                        help="worker metrics (the streams measurement) every S seconds "
                        "(default %(default)s)")
    add_price_options(parser)
    add_metrics_options(parser, "the worker")
    parser.add_argument("--log-level", choices=("warning", "info", "debug"), default="warning",
                        help="what Faust and its Kafka client log: info adds the group's "
                        "joins, assignments and table recovery (default %(default)s; -v: debug)")
    parser.add_argument("--gpu-model", default=None, metavar="NAME",
                        help="the GPU model of hosts whose NVML names none (e.g. H100), "
                        "for the cost of requests and jobs")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuflight.producer.contract.kafkaconf import ClientSecurity
    from gpuflight.producer.publish.kafkasink import load_config
    from gpuflight.streams import app as stream_app
    from gpuflight.streams.settings import InfluxSettings, StreamSettings
    from gpuflight.streams.stalls import STALL_S
    from gpuflight.streams.windows import WindowSettings

    kafka_config = load_config(args.kafka_config)
    ClientSecurity.from_config(kafka_config)  # a setting Faust cannot honour: usage error
    stream_settings = StreamSettings(
        kafka=args.kafka,
        kafka_config=kafka_config,
        topic_prefix=args.topic_prefix,
        app_id=args.app_id,
        influx=replace(InfluxSettings.from_environment(args.influx, args.bucket),
                       max_pending_points=max(args.max_pending_points, 1)),
        windows=WindowSettings(window_s=args.window, grace_s=args.grace),
        identity_wait_s=args.identity_wait,
        tick_s=args.tick,
        stall_s=STALL_S if args.stall_after is None else args.stall_after,
        metrics_s=args.metrics_interval,
        host_idle_s=args.idle,
        max_future_s=args.max_future,
        prices=price_book(args.prices),
        gpu_model=args.gpu_model,
        metrics=metrics_endpoint(args),
    )
    if args.worker:
        stream_settings = replace(stream_settings, worker=args.worker)
    if args.data_dir:
        stream_settings = replace(stream_settings, data_dir=args.data_dir)
    check_kafka(args.kafka, kafka_config, required=False)
    stream_app.run(stream_settings, loglevel="DEBUG" if args.verbose else args.log_level.upper())
    return 0
