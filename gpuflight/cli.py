"""The `gpuflight` command: argument parsing, logging set-up and exit codes."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from producer import wire
from producer.errors import GpuflightError, ServiceError, UsageError
from producer.files import check_target
from producer.redact import CMDLINE_MODES
from producer.settings import CaptureSettings

if TYPE_CHECKING:
    from producer.pricing import PriceBook
    from producer.publish import KafkaSettings
    from producer.trace import RequestOptions

log = logging.getLogger("gpuflight")


def _pages(text: str) -> int:
    value = int(text)
    if value < 1 or value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {text}")
    return value


def _add_capture_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ring-buffer-pages",
        type=_pages,
        default=CaptureSettings.ringbuf_pages,
        metavar="N",
        help="event ring buffer size in pages, a power of two (default %(default)s = 32 MiB)",
    )
    parser.add_argument(
        "--no-http", dest="http", action="store_false",
        help="do not capture the HTTP/1.1 requests the processes serve (nor attribute CUDA "
        "calls to them)")


def _bootstrap(text: str) -> str:
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


def _add_kafka_options(parser: argparse.ArgumentParser, required: bool,
                       default: str | None = None) -> None:
    parser.add_argument("--kafka", required=required, metavar="HOST:PORT", type=_bootstrap,
                        default=default,
                        help="Kafka bootstrap servers" + (" (default %(default)s)"
                                                          if default else ""))
    parser.add_argument("--topic-prefix", default=wire.DEFAULT_PREFIX,
                        help="topics are PREFIX.events.v1 etc. (default %(default)s)")
    parser.add_argument("--kafka-config", type=Path, metavar="FILE",
                        help="librdkafka properties (key=value lines), e.g. SASL/TLS; "
                        "GPUFLIGHT_KAFKA_* variables override (GPUFLIGHT_KAFKA_SASL_PASSWORD)")


def _check_kafka(bootstrap: str, config: Mapping[str, str], *, required: bool) -> None:
    """A broker that refuses the credentials ends the command in one line (ServiceError, 4)
    within seconds; one that cannot be reached does too where the command needs it now
    (replay), and is logged where the command waits for it (the producer buffers, the stream
    worker waits for its topics)."""
    from producer import kafkaconf

    why = kafkaconf.check_access(bootstrap, config)
    if why is None:
        return
    if required:
        raise ServiceError(f"cannot reach Kafka at {bootstrap}: {why}")
    log.warning("Kafka at %s does not answer yet (%s); going on", bootstrap, why)


def _positive(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be positive (and finite), got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


#: A day: the most any of the stream worker's durations may be (a window, its grace, how long
#: a host may be silent, how far ahead of the worker's clock an event may be). Beyond it the
#: worker would hold days of windows, and its nanosecond arithmetic leaves integers.
DAY_S = 86_400.0


def _seconds(low: float, high: float = DAY_S) -> Callable[[str], float]:
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


def _pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a process id, got {text!r}") from None
    if not 1 <= value <= PID_MAX:
        raise argparse.ArgumentTypeError(f"a process id is 1 to {PID_MAX}, got {text}")
    return value


def _add_influx_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--influx", default=None, metavar="URL",
                        help="InfluxDB (default $GPUFLIGHT_INFLUX_URL or http://127.0.0.1:8086;"
                        " token from $GPUFLIGHT_INFLUX_TOKEN)")
    parser.add_argument("--bucket", default=None,
                        help="v2 bucket; on InfluxDB 1.8 DATABASE/RETENTION "
                        "(default $GPUFLIGHT_INFLUX_BUCKET or gpuflight/autogen)")


def _add_report_options(parser: argparse.ArgumentParser) -> None:
    _add_influx_options(parser)
    parser.add_argument("--host", help="only this host's windows")
    parser.add_argument("--since", default="7d", metavar="WHEN",
                        help="how far back: a duration (90s, 30m, 6h, 7d) or a TIME as for "
                        "replay (default %(default)s)")
    parser.add_argument("--until", default=None, metavar="TIME", help="up to (default: now)")


def _add_price_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prices", type=Path, action="append", default=[], metavar="FILE",
                        help="USD per GPU-hour by GPU model (TOML, [usd_per_gpu_hour]); "
                        "overrides the illustrative defaults model by model (repeatable)")


def _price_book(files: Sequence[Path]) -> PriceBook:
    from producer.pricing import PriceBook

    return PriceBook.load(default_price_file(), *files)


def _add_request_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--otlp", metavar="URL", default=None,
                        help="export each HTTP request as an OTLP span (with its GPU work) to "
                        "this collector, e.g. http://127.0.0.1:4318")
    parser.add_argument("--otlp-protocol", choices=("http/protobuf", "grpc"),
                        default="http/protobuf", help="(default %(default)s)")
    parser.add_argument("--prices", type=Path, action="append", metavar="FILE", default=[],
                        help="a price file ([usd_per_gpu_hour] MODEL = USD) over the default "
                        "list (repeatable; later files win, model by model)")
    parser.add_argument("--gpu-model", metavar="NAME", default=None,
                        help="the GPU to price requests at (default: NVML's name of GPU 0)")


def default_price_file() -> Path:
    """gpuflight's default price list (illustrative; gpuflight/prices.toml)."""
    import importlib.resources

    return Path(str(importlib.resources.files("gpuflight") / "prices.toml"))


def _request_options(args: argparse.Namespace) -> RequestOptions:
    from producer.pricing import PriceBook
    from producer.trace import RequestOptions

    prices = PriceBook.load(default_price_file(), *args.prices)
    return RequestOptions(prices=prices, gpu_model=args.gpu_model,
                                        otlp=args.otlp, otlp_protocol=args.otlp_protocol)


def _kafka_settings(args: argparse.Namespace, buffer_mb: int | None = None) -> KafkaSettings:
    from producer.publish import KafkaSettings, load_config

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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuflight",
        description="See what GPU applications do: eBPF uprobes on the CUDA runtime.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    trace = sub.add_parser("trace", help="run a command under capture and summarise it")
    trace.add_argument("--output", "-o", type=Path, help="write events as JSON lines ('-': stdout)")
    _add_capture_options(trace)
    _add_request_options(trace)
    trace.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")

    producer = sub.add_parser("producer", help="capture node-wide until SIGTERM/SIGINT")
    producer.add_argument("--output", "-o", type=Path, help="write events as JSON lines")
    _add_kafka_options(producer, required=False)
    producer.add_argument(
        "--buffer-mb",
        type=_positive_int,
        default=256,
        help="bound of the Kafka publish queue; beyond it batches are dropped and counted "
        "(default %(default)s)",
    )
    producer.add_argument(
        "--kafka-close-timeout",
        type=_non_negative,
        default=30.0,
        metavar="S",
        help="at shutdown, how long to wait for Kafka to take what is queued (default 30)",
    )
    producer.add_argument(
        "--kafka-flush-interval",
        type=_positive,
        default=0.25,
        metavar="S",
        help="how long a process's events wait to be sent together (default %(default)s)",
    )
    producer.add_argument(
        "--cmdline", choices=CMDLINE_MODES, default="redacted",
        help="command lines on the processes topic: in full, with what looks like a secret "
        "(--password X, --api-key=X, TOKEN=X, https://user:pass@…) replaced by <redacted>, "
        "or none (default %(default)s)")
    producer.add_argument(
        "--pid", type=_pid, action="append", help="capture only this process (repeatable)"
    )
    producer.add_argument("--status-file", type=Path, metavar="FILE",
                          help="keep a JSON status here (ready, probed files, counters), "
                          "replaced atomically: what scripts and tests wait on")
    producer.add_argument("--proc", type=Path, default=Path("/proc"), help=argparse.SUPPRESS)
    _add_capture_options(producer)

    replay = sub.add_parser("replay", help="re-emit the events of a time range from Kafka")
    _add_kafka_options(replay, required=True)
    replay.add_argument("--from", dest="from_time", required=True, metavar="TIME",
                        help="ISO 8601 (UTC unless it says), or since the epoch: seconds, "
                        "or an integer with a unit (…ns, …ms) for an exact bound")
    replay.add_argument("--to", dest="to_time", required=True, metavar="TIME")
    replay.add_argument("--host", help="only this host's events")
    replay.add_argument("--pid", type=_pid, help="only this process's events")
    where = replay.add_mutually_exclusive_group(required=True)
    where.add_argument("--output", "-o", type=Path, help="write JSON lines ('-': stdout)")
    where.add_argument("--to-topic", metavar="TOPIC", help="re-publish into this topic")

    stack = sub.add_parser(
        "stack", help="local Kafka and InfluxDB on loopback, for one machine and tests"
    )
    stack.add_argument("action", choices=("up", "down", "status"))
    stack.add_argument("--dir", type=Path, default=None, metavar="DIR",
                       help="where the stack keeps its data (default "
                       "~/.local/share/gpuflight/stack)")

    streams = sub.add_parser(
        "streams", help="a stream worker: Kafka → windowed aggregates → InfluxDB (Faust)"
    )
    _add_kafka_options(streams, required=False, default="127.0.0.1:9092")
    _add_influx_options(streams)
    # A window shorter than a second is not one the worker can close on time (it closes
    # windows on a 1 s tick) nor one a dashboard shows; 1e-10 s is 0 ns, no window at all.
    streams.add_argument("--window", type=_seconds(1.0), default=10.0, metavar="S",
                         help="tumbling window, 1 s to 1 day (default %(default)s s)")
    streams.add_argument("--grace", type=_seconds(0.0), default=5.0, metavar="S",
                         help="how late events may come and still count, up to 1 day "
                         "(default %(default)s s)")
    streams.add_argument("--app-id", default="gpuflight-streams",
                         help="Faust app id: workers with the same id share the partitions "
                         "(default %(default)s)")
    streams.add_argument("--worker", default=None, help="this worker's name (default: host)")
    streams.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                         help="Faust's local data (default ~/.local/share/gpuflight/streams)")
    streams.add_argument("--identity-wait", type=_non_negative, default=5.0, metavar="S",
                         help=argparse.SUPPRESS)
    streams.add_argument("--tick", type=_positive, default=1.0, help=argparse.SUPPRESS)
    streams.add_argument("--max-pending-points", type=int, default=200_000, metavar="N",
                         help="points waiting for InfluxDB before the worker stops taking "
                         "messages (default %(default)s)")
    streams.add_argument("--idle", type=_seconds(0.0), default=5.0, metavar="S",
                         help="after S seconds without events from a host, its windows close "
                         "by the wall clock, 0 to 1 day (default %(default)s)")
    # Under a second, a host whose clock is a little ahead (NTP keeps clocks within ms, not
    # better) would have its events dead-lettered.
    streams.add_argument("--max-future", type=_seconds(1.0), default=300.0, metavar="S",
                         help="events stamped, or requests ending, more than S seconds ahead "
                         "of this worker's clock are not counted (dead letters), 1 s to 1 day "
                         "(default %(default)s)")
    streams.add_argument("--metrics-interval", type=_positive, default=5.0, metavar="S",
                         help="worker metrics (the streams measurement) every S seconds "
                         "(default %(default)s)")
    _add_price_options(streams)
    streams.add_argument("--gpu-model", default=None, metavar="NAME",
                         help="the GPU model of hosts whose NVML names none (e.g. H100), "
                         "for the cost of requests and jobs")

    report = sub.add_parser("report", help="a job's aggregates from InfluxDB, as a table; or "
                            "requests and GPU cost by route, job, namespace or team (--by)")
    report.add_argument("--job", help="the job (its aggregates; with --by: only its requests)")
    report.add_argument("--by", choices=("route", "job", "namespace", "team"),
                        help="requests, latency, GPU work and cost per route, job, namespace "
                        "or team label")
    _add_report_options(report)
    report.add_argument("--json", action="store_true", help="JSON instead of a table")

    cost = sub.add_parser("cost", help="GPU cost from InfluxDB over a time range, per job "
                          "(or --by route, namespace, team)")
    cost.add_argument("--by", choices=("job", "route", "namespace", "team"), default="job",
                      help="(default %(default)s)")
    cost.add_argument("--job", help="only this job's")
    _add_report_options(cost)
    cost.set_defaults(since="24h")
    cost.add_argument("--json", action="store_true", help="JSON instead of a table")

    compare = sub.add_parser("compare", help="two jobs side by side, with ratios (B vs A)")
    compare.add_argument("job_a", metavar="JOB_A")
    compare.add_argument("job_b", metavar="JOB_B")
    _add_report_options(compare)
    compare.add_argument("--json", action="store_true", help="JSON instead of a table")

    demo = sub.add_parser("demo", help="the kernel-fusion showcase on a simulated GPU")
    demo.add_argument("--steps", type=_positive_int, default=None,
                      help="training steps per run")
    demo.add_argument("--python", type=Path, default=None,
                      help="a Python with CUDA PyTorch: the showcase on real PyTorch (eager vs "
                      "torch.compile); default: the frameworks venv if there, else the C showcase")
    demo.add_argument("--c", action="store_true", dest="c_showcase",
                      help="the C showcase even where PyTorch is installed")
    demo.add_argument("--pipeline", action="store_true",
                      help="through the whole pipeline: producer → Kafka → streams → InfluxDB, "
                      "then the comparison from InfluxDB")
    demo.add_argument("--serve", action="store_true",
                      help="an inference-like HTTP server on the simulated GPU under load: "
                      "its per-route table with the cost of 1,000 requests")
    demo.add_argument("--clients", type=_positive_int, default=4, help="(--serve) clients")
    demo.add_argument("--requests", type=_positive_int, default=100,
                      help="(--serve) requests per client")
    return parser


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="gpuflight: %(message)s",
        stream=sys.stderr,
    )


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "trace":
        from producer import trace

        argv = list(args.argv)
        if argv and argv[0] == "--":
            argv = argv[1:]
        check_target(args.output, "--output")  # a FIFO there would hang; before CMD runs
        settings = CaptureSettings(ringbuf_pages=args.ring_buffer_pages, http=args.http)
        return trace.run(argv, output=args.output, settings=settings,
                         requests=_request_options(args)).exit_code
    if args.command == "producer":
        from producer import node

        check_target(args.output, "--output")
        check_target(args.status_file, "--status-file", replaced=True)
        pids = frozenset(args.pid) if args.pid else None
        settings = CaptureSettings(
            proc_root=args.proc, pids=pids, ringbuf_pages=args.ring_buffer_pages, http=args.http
        )
        kafka = _kafka_settings(args, args.buffer_mb) if args.kafka is not None else None
        if kafka is not None:
            from producer.environment import check_can_probe

            check_can_probe()  # what the machine lacks comes first
            _check_kafka(kafka.bootstrap, kafka.config, required=False)
        return node.run(settings, args.output, kafka, status_file=args.status_file)
    if args.command == "replay":
        from producer import replay, timeparse

        check_target(args.output, "--output")
        kafka = _kafka_settings(args)
        from_ns = timeparse.parse_time(args.from_time)
        to_ns = timeparse.parse_time(args.to_time)
        _check_kafka(kafka.bootstrap, kafka.config, required=True)
        stats = replay.replay(
            kafka,
            from_ns=from_ns,
            to_ns=to_ns,
            host=args.host,
            pid=args.pid,
            output=args.output,
            to_topic=args.to_topic,
        )
        log.info("replayed %d events and %d requests from %d messages (%d skipped as "
                 "malformed)", stats.events, stats.requests, stats.messages,
                 stats.skipped_malformed)
        return 0
    if args.command == "stack":
        from gpuflight import stack

        data_dir = args.dir or stack.default_data_dir()
        if args.action == "up":
            stack.stack_up(data_dir)
        elif args.action == "down":
            stack.stack_down(data_dir)
        for line in stack.stack_status(data_dir):
            print(line)
        return 0
    if args.command == "streams":
        from producer.kafkaconf import ClientSecurity
        from producer.publish import load_config
        from streams import app as stream_app
        from streams.settings import InfluxSettings, StreamSettings
        from streams.windows import WindowSettings

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
            metrics_s=args.metrics_interval,
            host_idle_s=args.idle,
            max_future_s=args.max_future,
            prices=_price_book(args.prices),
            gpu_model=args.gpu_model,
        )
        if args.worker:
            stream_settings = replace(stream_settings, worker=args.worker)
        if args.data_dir:
            stream_settings = replace(stream_settings, data_dir=args.data_dir)
        _check_kafka(args.kafka, kafka_config, required=False)
        stream_app.run(stream_settings, loglevel="DEBUG" if args.verbose else "WARNING")
        return 0
    if args.command == "cost" or (args.command == "report" and args.by):
        from producer import timeparse
        from streams import costs
        from streams.settings import InfluxSettings

        influx = InfluxSettings.from_environment(args.influx, args.bucket)
        since_ns, until_ns = timeparse.time_range(args.since, args.until)
        table = costs.cost_table(influx, args.by, since_ns, until_ns, host=args.host,
                                 job=args.job)
        print(costs.render_json(table) if args.json else costs.render(table))
        return 0
    if args.command == "report" and not args.job:
        raise UsageError("report needs --job JOB, or --by route|job|namespace|team")
    if args.command in ("report", "compare"):
        from producer import timeparse
        from streams import report
        from streams.settings import InfluxSettings

        influx = InfluxSettings.from_environment(args.influx, args.bucket)
        since_ns, until_ns = timeparse.time_range(args.since, args.until)
        if args.command == "report":
            summary = report.job_summary(influx, args.job, since_ns, until_ns, args.host)
            print(report.render_json([summary]) if args.json else report.render_job(summary))
        else:
            a = report.job_summary(influx, args.job_a, since_ns, until_ns, args.host)
            b = report.job_summary(influx, args.job_b, since_ns, until_ns, args.host)
            print(report.render_json([a, b]) if args.json else report.render_compare(a, b))
        return 0
    if args.command == "demo":
        if args.serve:
            from gpuflight.demo import serve

            return serve.run(clients=args.clients, requests=args.requests)
        if args.pipeline:
            from gpuflight.demo import pipeline as pipeline_demo

            return pipeline_demo.run(steps=args.steps)
        from gpuflight.demo import showcase, torch_showcase

        if args.python is not None:
            return torch_showcase.run(torch_showcase.prepare(args.python), steps=args.steps)
        python = None if args.c_showcase else torch_showcase.frameworks_python()
        if python is not None:
            try:
                prepared = torch_showcase.prepare(python)
            except GpuflightError as exc:
                log.warning("the PyTorch showcase cannot run (%s): the C showcase instead", exc)
            else:
                return torch_showcase.run(prepared, steps=args.steps)
        return int(showcase.run(steps=args.steps))
    raise UsageError(f"unknown command {args.command}")


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
