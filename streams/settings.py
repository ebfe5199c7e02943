"""The stream app's settings: one frozen object, built by the CLI (flags, then environment)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.contract.exposition import MetricsEndpoint
from gpuflight.producer.contract.pricing import PriceBook
from gpuflight.producer.contract.wire import DEFAULT_PREFIX
from gpuflight.streams.stalls import STALL_S
from gpuflight.streams.windows import WindowSettings

DEFAULT_INFLUX_URL: Final = "http://127.0.0.1:8086"
DEFAULT_DATABASE: Final = "gpuflight"
#: InfluxDB 1.8 takes "database/retention policy" as the v2 bucket.
DEFAULT_BUCKET: Final = f"{DEFAULT_DATABASE}/autogen"
DEFAULT_APP_ID: Final = "gpuflight-streams"


@dataclass(frozen=True)
class InfluxSettings:
    """Where the stream app writes and `report` reads, with which credentials.

    Credentials, one kind or none (GPUFLIGHT_INFLUX_* in the environment):
      token (_TOKEN)                      an API token (2.x/3.x), sent as "Authorization: Token
                                          …" by the writer and the InfluxQL client alike; 1.8
                                          with auth-enabled takes "user:password" as a token too
      username, password (_USERNAME,      an InfluxDB 1.8 user: basic auth for InfluxQL, and the
                          _PASSWORD)      token "username:password" for the v2 write API
    TLS: an https:// URL is verified against the system's CAs, or ca_file (_CA_FILE).
    """

    url: str = DEFAULT_INFLUX_URL
    #: v2 bucket; on InfluxDB 1.8 "database/retention policy".
    bucket: str = DEFAULT_BUCKET
    org: str = "-"
    token: str = field(default="", repr=False)
    username: str = ""
    password: str = field(default="", repr=False)
    #: A CA bundle (PEM) to verify an https:// InfluxDB against, instead of the system's.
    ca_file: str | None = None
    batch_points: int = 5000
    max_pending_points: int = 200_000
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.token and self.username:
            raise UsageError("set GPUFLIGHT_INFLUX_TOKEN or GPUFLIGHT_INFLUX_USERNAME and"
                             " GPUFLIGHT_INFLUX_PASSWORD, not both")
        if self.password and not self.username:
            raise UsageError("GPUFLIGHT_INFLUX_PASSWORD needs GPUFLIGHT_INFLUX_USERNAME")

    @property
    def database(self) -> str:
        """The InfluxQL database of the bucket."""
        return self.bucket.split("/", 1)[0]

    @property
    def write_token(self) -> str:
        """What influxdb-client sends as its token: the token, or 1.8's "username:password"."""
        return self.token or (f"{self.username}:{self.password}" if self.username else "")

    @classmethod
    def from_environment(cls, url: str | None = None, bucket: str | None = None) -> InfluxSettings:
        env = os.environ
        return cls(
            url=url or env.get("GPUFLIGHT_INFLUX_URL", DEFAULT_INFLUX_URL),
            bucket=bucket or env.get("GPUFLIGHT_INFLUX_BUCKET", DEFAULT_BUCKET),
            org=env.get("GPUFLIGHT_INFLUX_ORG", "-"),
            token=env.get("GPUFLIGHT_INFLUX_TOKEN", ""),
            username=env.get("GPUFLIGHT_INFLUX_USERNAME", ""),
            password=env.get("GPUFLIGHT_INFLUX_PASSWORD", ""),
            ca_file=env.get("GPUFLIGHT_INFLUX_CA_FILE") or None,
        )


@dataclass(frozen=True)
class StreamSettings:
    kafka: str = "127.0.0.1:9092"
    #: librdkafka security properties (--kafka-config, GPUFLIGHT_KAFKA_*): verbatim for the
    #: confluent-kafka clients, translated for Faust's (producer.contract.kafkaconf). Out of the
    #: repr: it may hold a password.
    kafka_config: Mapping[str, str] = field(default_factory=dict, repr=False)
    topic_prefix: str = DEFAULT_PREFIX
    #: The Faust app id: the consumer group (workers with the same id share partitions) and
    #: the prefix of its changelog topics.
    app_id: str = DEFAULT_APP_ID
    worker: str = field(default_factory=socket.gethostname)
    influx: InfluxSettings = field(default_factory=InfluxSettings)
    windows: WindowSettings = field(default_factory=WindowSettings)
    data_dir: Path = field(
        default_factory=lambda: Path.home() / ".local" / "share" / "gpuflight" / "streams"
    )
    #: Wall-clock seconds between passes over the jobs (writes, closing windows).
    tick_s: float = 1.0
    #: A host silent this long has its time advanced by the wall clock (see streams/worker.py).
    host_idle_s: float = 5.0
    #: Events stamped, and requests ending, more than this ahead of the worker's wall clock are
    #: not counted (dead letters, reason "future"). Within it, one message moves no host's time
    #: on its own either (streams/clock.py).
    max_future_s: float = 300.0
    #: How long a message waits for its process's identity before the job falls back to
    #: "COMM?:PID" (the processes topic normally has it first).
    identity_wait_s: float = 5.0
    #: Jobs with nothing open are forgotten (their baselines too) after this long.
    forget_idle_s: float = 3600.0
    #: A job that was one process (COMM:PID) is forgotten once nothing of it is open and its
    #: host's time is this far past the process's exit (the agent publishes it): its last
    #: events are in by then, and their offsets committed (a redelivery finds its state).
    forget_ended_after_s: float = 60.0
    #: Worker self-metrics every this many seconds.
    metrics_s: float = 5.0
    #: A partition whose messages wait untaken this long, while the worker takes others, is
    #: read again from its first message not taken (streams/stalls.py).
    stall_s: float = STALL_S
    #: Consume from the start of the topics the first time the group runs (a replay).
    from_beginning: bool = True
    #: USD per GPU-hour by GPU model, for the cost of requests and jobs (none: no cost).
    prices: PriceBook | None = None
    #: The GPU model of hosts whose NVML names none (no NVML, or a process it does not list).
    gpu_model: str | None = None
    #: Where the worker serves its own health as Prometheus metrics (--metrics-port); None: off.
    metrics: MetricsEndpoint | None = None

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.topic_prefix}.deadletter.v1"

    @property
    def alerts_topic(self) -> str:
        return f"{self.topic_prefix}.alerts.v1"

    @property
    def ticks_topic(self) -> str:
        return f"{self.app_id}.ticks"
