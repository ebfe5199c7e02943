"""The Kafka wire contract, version 1 — the one module producers and streams share.

Topics (PREFIX defaults to "gpuflight"; the major version is in the name, and
changes within a version are additive only):

  PREFIX.events.v1     raw events, many per message: one message holds one
                       process's events of one flush interval, as columns.
                       Key: the host, so per-process order holds within a
                       partition and every per-host table needs no repartition.
                       Kafka timestamp: the first event's wall-clock time (ms).
                       Kept (no retention limit) so time ranges can be replayed.
  PREFIX.processes.v1  one identity per process (compacted; key host/pid/start).
  PREFIX.metrics.v1    producer self-metrics, every few seconds (key: host).
  PREFIX.nvml.v1       per-GPU samples from NVML, every second (key: host).

An events message (orjson):

  {"schema": "gpuflight.events", "v": 1, "host": str, "pid": int,
   "start_time": int,          # process start, clock ticks since boot (/proc stat)
   "count": N, "ts0": int,     # first event's wall-clock ns
   "columns": {NAME: [N ints], ...},
   "kernels": {HANDLE: [SHORT, FULL], ...}}   # optional (additive in v1)

"kernels" names every launched `handle` of the message whose name the node knows: FULL is the
demangled name (or the symbol as it is when it does not demangle), SHORT the same without
template arguments and parameter lists (the stream app's bounded `kernel` tag); a kernel of
unknown name is "MODULE+0xOFFSET". Each message carries its own names, so any replayed range
decodes on its own.

Columns are those of struct gf_event (bpf/events.h) after enrichment (wall
clock, free sizes), with "ts" as deltas from ts0 and "dim" flattened to 6·N
values; a column that is all zeros is left out. Decoding gives back exactly the
records, hence exactly the events `--output` writes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt
import orjson

from producer.errors import GpuflightError
from producer.records import EVENT_DTYPE

log = logging.getLogger(__name__)

VERSION: Final = 1
EVENTS_SCHEMA: Final = "gpuflight.events"
PROCESS_SCHEMA: Final = "gpuflight.process"
METRICS_SCHEMA: Final = "gpuflight.metrics"
NVML_SCHEMA: Final = "gpuflight.nvml"
DEFAULT_PREFIX: Final = "gpuflight"

#: Columns of an events message, in struct order ("ts" holds ts_ns - ts0).
COLUMNS: Final[tuple[str, ...]] = (
    "ts", "tid", "api", "type", "flags", "result", "duration_ns",
    "handle", "stream", "bytes", "dim",
)
_FIELD_OF: Final = {"ts": "ts_ns"}
_DIMS: Final = 6


class WireError(GpuflightError):
    """A message that is not a valid gpuflight message of this version."""


@dataclass(frozen=True)
class Topics:
    events: str
    processes: str
    metrics: str
    nvml: str

    @classmethod
    def with_prefix(cls, prefix: str = DEFAULT_PREFIX) -> Topics:
        return cls(
            events=f"{prefix}.events.v{VERSION}",
            processes=f"{prefix}.processes.v{VERSION}",
            metrics=f"{prefix}.metrics.v{VERSION}",
            nvml=f"{prefix}.nvml.v{VERSION}",
        )


class KernelName(NamedTuple):
    short: str
    full: str


@dataclass(frozen=True)
class EventBatch:
    """One events message: a process's records (records.EVENT_DTYPE)."""

    host: str
    pid: int
    start_time: int
    events: npt.NDArray[np.void]
    #: Launch handle → name, for the launches of `events` whose name is known.
    kernels: Mapping[int, KernelName] = field(default_factory=dict)

    @property
    def first_ts_ns(self) -> int:
        return int(self.events["ts_ns"][0]) if len(self.events) else 0


def host_key(host: str) -> bytes:
    return host.encode()


def process_key(host: str, pid: int, start_time: int) -> bytes:
    return f"{host}/{pid}/{start_time}".encode()


def encode_events(batch: EventBatch) -> bytes:
    events = batch.events
    if len(events) == 0:
        raise ValueError("an events message holds at least one event")
    ts = events["ts_ns"].astype(np.int64)
    ts0 = int(ts[0])
    columns: dict[str, npt.NDArray[Any]] = {}
    for name in COLUMNS:
        if name == "ts":
            column = ts - ts0
        elif name == "dim":
            column = np.ascontiguousarray(events["dim"]).reshape(-1)
        else:
            column = np.ascontiguousarray(events[_FIELD_OF.get(name, name)])
        if column.any():
            columns[name] = column.astype(np.int64)
    message = {
        "schema": EVENTS_SCHEMA,
        "v": VERSION,
        "host": batch.host,
        "pid": batch.pid,
        "start_time": batch.start_time,
        "count": len(events),
        "ts0": ts0,
        "columns": columns,
    }
    if batch.kernels:
        message["kernels"] = {
            str(handle): [name.short, name.full] for handle, name in batch.kernels.items()
        }
    return orjson.dumps(message, option=orjson.OPT_SERIALIZE_NUMPY)


def _load(value: bytes | None, schema: str) -> dict[str, Any]:
    if not value:
        raise WireError("empty message")
    try:
        message = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(message, dict) or message.get("schema") != schema:
        raise WireError(f"not a {schema} message")
    if message.get("v") != VERSION:
        raise WireError(f"{schema} version {message.get('v')!r}, this reader knows {VERSION}")
    return message


def decode_events(value: bytes | None) -> EventBatch:
    message = _load(value, EVENTS_SCHEMA)
    try:
        count = int(message["count"])
        host, pid = str(message["host"]), int(message["pid"])
        start_time = int(message["start_time"])
        ts0 = int(message["ts0"])
        columns = message["columns"]
        if count <= 0 or not isinstance(columns, dict):
            raise WireError("no events")
        events = np.zeros(count, dtype=EVENT_DTYPE)
        events["pid"] = pid
        for name, values in columns.items():
            if name not in COLUMNS:
                continue  # a later, additive column
            column = np.asarray(values, dtype=np.int64)
            expected = count * _DIMS if name == "dim" else count
            if column.shape != (expected,):
                raise WireError(f"column {name} has {column.size} values, not {expected}")
            if name == "dim":
                events["dim"] = column.reshape(count, _DIMS)
            elif name == "ts":
                events["ts_ns"] = column + ts0
            else:
                events[_FIELD_OF.get(name, name)] = column
        if "ts" not in columns:
            events["ts_ns"] = ts0
        kernels = _kernel_names(message.get("kernels", {}))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"malformed events message: {exc}") from None
    return EventBatch(
        host=host, pid=pid, start_time=start_time, events=events, kernels=kernels
    )


def _kernel_names(names: Any) -> dict[int, KernelName]:
    if not isinstance(names, dict):
        raise WireError("kernels is not an object")
    out: dict[int, KernelName] = {}
    for handle, name in names.items():
        if (
            not isinstance(name, list)
            or len(name) != 2
            or not all(isinstance(part, str) and part for part in name)
        ):
            raise WireError(f"kernel {handle}: not a [short, full] pair of names")
        out[int(handle)] = KernelName(name[0], name[1])
    return out


def encode_record(schema: str, record: dict[str, Any]) -> bytes:
    """A processes, metrics or nvml message: a flat record with schema and version."""
    return orjson.dumps({"schema": schema, "v": VERSION, **record})


def decode_record(value: bytes | None, schema: str) -> dict[str, Any]:
    message = _load(value, schema)
    del message["schema"], message["v"]
    return message


# -- topics ----------------------------------------------------------------------------------

def topic_configs(topics: Topics) -> dict[str, dict[str, str]]:
    return {
        topics.events: {"retention.ms": "-1"},  # kept for postmortem replay
        topics.processes: {"cleanup.policy": "compact"},
        topics.metrics: {"retention.ms": str(30 * 24 * 3600 * 1000)},
        topics.nvml: {"retention.ms": "-1"},
    }


def ensure_topics(
    admin: Any,
    wanted: Mapping[str, Mapping[str, str]],
    partitions: int,
    timeout_s: float = 10.0,
) -> bool:
    """Create the topics if missing; False if the broker could not be asked."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    # Replication: the broker's default.replication.factor.
    new = [NewTopic(name, partitions, -1, config=dict(config)) for name, config in wanted.items()]
    try:
        futures = admin.create_topics(new, request_timeout=timeout_s)
        for future in futures.values():
            try:
                future.result(timeout=timeout_s)
            except Exception as exc:
                error = exc.args[0] if exc.args else None
                if getattr(error, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    except Exception as exc:
        log.warning("cannot create Kafka topics yet (%s); retrying in the background", exc)
        return False
    return True
