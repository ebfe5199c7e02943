"""Options and values several commands share: Kafka, InfluxDB, capture, prices, and the argparse
types that check numbers, durations, process ids and bootstrap servers."""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.errors import ServiceError
from gpuflight.producer.contract.exposition import DEFAULT_ADDRESS as DEFAULT_METRICS_ADDRESS
from gpuflight.producer.settings import CaptureSettings

if TYPE_CHECKING:
    from gpuflight.producer.contract.exposition import MetricsEndpoint
    from gpuflight.producer.contract.pricing import PriceBook
    from gpuflight.producer.publish.kafkasink import KafkaSettings

    #: What each command's `add_parser` is handed: the `gpuflight` parser's subcommands.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

log = logging.getLogger("gpuflight")


def pages(text: str) -> int:
    value = int(text)
    if value < 1 or value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {text}")
    return value


def slots(text: str) -> int:
    """0, or a power of two."""
    value = int(text)
    if value < 0 or value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be 0 or a power of two, got {text}")
    return value


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ring-buffer-pages",
        type=pages,
        default=CaptureSettings.ringbuf_pages,
        metavar="N",
        help="event ring buffer size in pages, a power of two (default %(default)s = 32 MiB)",
    )
    parser.add_argument(
        "--cpu-buffer-slots",
        type=slots,
        default=CaptureSettings.cpu_slots,
        metavar="N",
        help="events each CPU's buffer holds before the ring takes them, 0 or a power of two "
        "(default %(default)s, 384 KiB a CPU; 0: the ring alone, ~35-60 ns a call dearer)",
    )
    parser.add_argument(
        "--no-http", dest="http", action="store_false",
        help="do not capture the HTTP/1.1 requests the processes serve (nor attribute CUDA "
        "calls to them)")


def bootstrap(text: str) -> str:
    """HOST:PORT[,HOST:PORT...] with every port in 1..65535 (IPv6 hosts in brackets)."""
    servers = [part.strip() for part in text.split(",")]
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or host in ("[", "[]"):
            raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {server!r}")
        # ASCII digits only: str.isdigit() and int() take "٩٠٩٢" too, librdkafka does not.
        if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise argparse.ArgumentTypeError(f"port must be 1-65535 in {server!r}")
    return ",".join(servers)


def add_kafka_options(parser: argparse.ArgumentParser, required: bool,
                      default: str | None = None) -> None:
    parser.add_argument("--kafka", required=required, metavar="HOST:PORT", type=bootstrap,
                        default=default,
                        help="Kafka bootstrap servers" + (" (default %(default)s)"
                                                          if default else ""))
    parser.add_argument("--topic-prefix", default=wire.DEFAULT_PREFIX,
                        help="topics are PREFIX.events.v1 etc. (default %(default)s)")
    parser.add_argument("--kafka-config", type=Path, metavar="FILE",
                        help="librdkafka properties (key=value lines), e.g. SASL/TLS; "
                        "GPUFLIGHT_KAFKA_* variables override (GPUFLIGHT_KAFKA_SASL_PASSWORD)")


def check_kafka(bootstrap: str, config: Mapping[str, str], *, required: bool) -> None:
    """A broker that refuses the credentials ends the command in one line (ServiceError, 4)
    within seconds; one that cannot be reached does too where the command needs it now
    (replay), and is logged where the command waits for it (the producer buffers, the stream
    worker waits for its topics)."""
    from gpuflight.producer.contract import kafkaconf

    why = kafkaconf.check_access(bootstrap, config)
    if why is None:
        return
    if required:
        raise ServiceError(f"cannot reach Kafka at {bootstrap}: {why}")
    log.warning("Kafka at %s does not answer yet (%s); going on", bootstrap, why)


def kafka_settings(args: argparse.Namespace, buffer_mb: int | None = None) -> KafkaSettings:
    from gpuflight.producer.publish.kafkasink import KafkaSettings, load_config

    settings = KafkaSettings(
        bootstrap=args.kafka,
        topic_prefix=args.topic_prefix,
        config=load_config(args.kafka_config),
    )
    if buffer_mb is not None:
        settings = replace(settings, buffer_bytes=buffer_mb << 20)
    if getattr(args, "kafka_close_timeout", None) is not None:
        settings = replace(settings, close_timeout_s=args.kafka_close_timeout)
    if getattr(args, "cmdline", None) is not None:
        settings = replace(settings, cmdline=args.cmdline)
    if getattr(args, "kafka_flush_interval", None) is not None:
        settings = replace(settings, flush_interval_s=args.kafka_flush_interval)
    return settings


#: `--stack-sampling auto`'s budget: what the walks may add to a recorded call, in ns as the
#: kernel times them (4 to 6 % of the probe's own 0.7 to 1 µs on NVIDIA's driver, measured with the
#: walks' other costs under 10 %: bench/results/stack_cost.md).
DEFAULT_STACK_COST_NS = 40


def stack_sampling(text: str) -> int:
    """`--stack-sampling`: `auto` (0: the rate the cost budget allows) or 1 call in N."""
    if text == "auto":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected auto or a whole number of calls, got {text!r}") from None
    if not 1 <= value <= 2**20:
        raise argparse.ArgumentTypeError(f"must be auto or 1 to 2^20 calls, got {text}")
    return value


def add_stack_options(parser: argparse.ArgumentParser, sampling: str | None) -> None:
    """Code paths' rate: `--stack-sampling auto|N` (default `sampling`; None: off unless
    given), `--stack-cost NS`, `--stack-max-walks W`."""
    parser.add_argument(
        "--stack-sampling", type=stack_sampling, default=sampling, metavar="auto|N",
        help="walk the Python stack of one call in N on average, each sample weighted N "
        "(1: every call, exact), or auto: as often as --stack-cost allows, each sample "
        "weighted by the period it was drawn with"
        + (" (default %(default)s)" if sampling is not None else " (off unless given)"))
    parser.add_argument(
        "--stack-cost", type=positive_int, default=DEFAULT_STACK_COST_NS, metavar="NS",
        help="with --stack-sampling auto: the most the walks may add to a recorded call, on "
        "average, in ns as the kernel times them (default %(default)s)")
    parser.add_argument(
        "--stack-max-walks", type=non_negative_int, default=2000, metavar="W",
        help="the most stacks a CPU walks a second when sampling: beyond, its period "
        "doubles, the weights following (default %(default)s; 0: no bound)")


def stack_rate(args: argparse.Namespace) -> tuple[int, int]:
    """(the least period, the cost budget in ns: 0 for a fixed period) of --stack-sampling."""
    sampling: int = args.stack_sampling  # argparse parses a default given as text, too
    return (1, args.stack_cost) if sampling == 0 else (sampling, 0)


def positive(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be positive (and finite), got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value <= 2**31:
        raise argparse.ArgumentTypeError(f"must be 0 to 2^31, got {text}")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


#: A day: the most any of the stream worker's durations may be (a window, its grace, how long
#: a host may be silent, how far ahead of the worker's clock an event may be). Beyond it the
#: worker would hold days of windows, and its nanosecond arithmetic leaves integers.
DAY_S = 86_400.0


def seconds(low: float, high: float = DAY_S) -> Callable[[str], float]:
    """An argparse type: seconds from `low` to `high`, both included (nan and inf are not)."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low:g} to {high:g} seconds, got {text}")
        return value

    return seconds


#: The highest process id Linux gives (PID_MAX_LIMIT on 64-bit kernels: 2^22).
PID_MAX = 4_194_304


def pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a process id, got {text!r}") from None
    if not 1 <= value <= PID_MAX:
        raise argparse.ArgumentTypeError(f"a process id is 1 to {PID_MAX}, got {text}")
    return value


def port(text: str) -> int:
    """A TCP port: 1-65535, ASCII digits."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {text!r}")
    return int(text)


def ip_address(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address, got {text!r}") from None


def add_metrics_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--metrics-port", type=port, default=None, metavar="PORT",
                        help=f"serve {what}'s own health as Prometheus metrics on "
                        "http://ADDRESS:PORT/metrics (default: off)")
    parser.add_argument("--metrics-address", type=ip_address, default=DEFAULT_METRICS_ADDRESS,
                        metavar="ADDRESS",
                        help="where --metrics-port listens (default %(default)s: this host "
                        "only; 0.0.0.0 or :: for every interface)")


def metrics_endpoint(args: argparse.Namespace) -> MetricsEndpoint | None:
    from gpuflight.producer.contract.exposition import MetricsEndpoint

    if args.metrics_port is None:
        return None
    return MetricsEndpoint(args.metrics_port, args.metrics_address)


def add_influx_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--influx", default=None, metavar="URL",
                        help="InfluxDB (default $GPUFLIGHT_INFLUX_URL or http://127.0.0.1:8086;"
                        " token from $GPUFLIGHT_INFLUX_TOKEN)")
    parser.add_argument("--bucket", default=None,
                        help="v2 bucket; on InfluxDB 1.8 DATABASE/RETENTION "
                        "(default $GPUFLIGHT_INFLUX_BUCKET or gpuflight/autogen)")


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """What the commands that read InfluxDB back share: where, which host, which time."""
    add_influx_options(parser)
    parser.add_argument("--host", help="only this host's windows")
    parser.add_argument("--since", default="7d", metavar="WHEN",
                        help="how far back: a duration (90s, 30m, 6h, 7d) or a TIME as for "
                        "replay (default %(default)s)")
    parser.add_argument("--until", default=None, metavar="TIME", help="up to (default: now)")


def add_price_options(parser: argparse.ArgumentParser) -> None:
    """--prices, as every command that prices GPU time takes it."""
    parser.add_argument("--prices", type=Path, action="append", default=[], metavar="FILE",
                        help="USD per GPU-hour by GPU model (TOML, [usd_per_gpu_hour] MODEL = "
                        "USD) over the illustrative defaults, model by model (repeatable; "
                        "later files win)")


def price_book(files: list[Path]) -> PriceBook:
    """The default price list with the user's files over it."""
    from gpuflight.producer.contract.pricing import DEFAULT_PRICES, PriceBook

    return PriceBook.load(DEFAULT_PRICES, *files)
