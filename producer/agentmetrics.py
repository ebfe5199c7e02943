"""The node agent's health on /metrics (`gpuflight producer --metrics-port PORT`).

What the agent already counts for its status file and its metrics.v1 records, as Prometheus
metrics: events captured, aggregated, published and dropped (by reason), probes attached and
single-stepped, library files probed and skipped, how full a drain found the ring, the Kafka
queue and its delivery failures, the holds at library loads, HTTP requests, and with code
paths on (`--stack-sampling`) what the stack sampler walked and what that cost. Taken on the
agent's own thread when a scrape asks (producer/contract/exposition.py): nothing is read from
BPF maps or librdkafka between scrapes, and nothing from the HTTP server's thread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuflight.producer.contract.exposition import SnapshotExchange

if TYPE_CHECKING:
    from gpuflight.producer.capture import Capture
    from gpuflight.producer.contract import wire
    from gpuflight.producer.probe.probes import StackRate
    from gpuflight.producer.publish.kafkasink import KafkaSink

PREFIX: Final = "gpuflight_agent"

#: Why events were lost, as the `reason` label of gpuflight_agent_events_dropped_total.
DROPPED_RING_FULL: Final = "ring_full"
DROPPED_KAFKA_QUEUE: Final = "kafka_queue_full"
DROPPED_AGENT_KILLED: Final = "agent_killed"


@dataclass(frozen=True)
class AgentHealth:
    """One snapshot of the agent, taken on its own thread."""

    started_unix_s: float
    record: wire.MetricsRecord
    #: kind ("runtime" | "driver" | "loader" | "autograd") → probed files, probes, probes
    #: single-stepped, functions defined but not probed.
    files: dict[str, int] = field(default_factory=dict)
    probes: dict[str, int] = field(default_factory=dict)
    stepped: dict[str, int] = field(default_factory=dict)
    unprobed: dict[str, int] = field(default_factory=dict)
    files_skipped: int = 0
    stepped_calls: int = 0
    ring_fill_max: float = 0.0
    holds: int = 0
    held_s: float = 0.0
    kafka_failed_events: int = 0
    #: sink name → (1 if it failed and was switched off else 0, events it did not write).
    outputs: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Code paths (None: off): what the sampler did, its budget (ns a recorded call; 0: a
    #: fixed period), samples lost in the kernel and sampled calls whose event never came.
    code_paths: StackRate | None = None
    code_path_budget_ns: int = 0
    code_path_samples_lost: int = 0
    code_path_samples_unjoined: int = 0


def take(capture: Capture, kafka: KafkaSink | None, record: wire.MetricsRecord,
         started_unix_s: float) -> AgentHealth:
    """The agent's health now (on the capture's thread): `record` is metrics.v1's."""
    files: Counter[str] = Counter()
    probes: Counter[str] = Counter()
    stepped: Counter[str] = Counter()
    unprobed: Counter[str] = Counter()
    for attached in capture.probes.attached.values():
        kind = attached.library.kind
        files[kind] += 1
        probes[kind] += attached.probes
        stepped[kind] += len(attached.stepped)
        unprobed[kind] += len(attached.unprobed)
    stats = capture.stats
    drops = capture.drops()
    stacks = capture.stacks
    return AgentHealth(
        started_unix_s=started_unix_s,
        record=record,
        files=dict(files),
        probes=dict(probes),
        stepped=dict(stepped),
        unprobed=dict(unprobed),
        files_skipped=len(capture.probes.failed),
        stepped_calls=drops.stepped,
        ring_fill_max=capture.probes.take_ring_fill_max(),
        holds=stats.held_released,
        held_s=stats.held_ns_total / 1e9,
        kafka_failed_events=kafka.failed_events if kafka is not None else 0,
        outputs={s.name: (int(s.failure is not None), s.lost) for s in capture.sinks},
        code_paths=capture.probes.stack_rate() if stacks is not None else None,
        code_path_budget_ns=capture.settings.stack_budget_ns,
        code_path_samples_lost=drops.py_samples,
        code_path_samples_unjoined=stacks.samples.unjoined if stacks is not None else 0,
    )


class AgentCollector:
    """Renders the latest AgentHealth as metric families on each scrape."""

    def __init__(self, exchange: SnapshotExchange[AgentHealth]) -> None:
        self._exchange = exchange

    def collect(self) -> Iterator[Metric]:
        health, age = self._exchange.latest()
        if health is None:
            return
        yield from families(health, age)


def families(h: AgentHealth, age_s: float = 0.0) -> Iterator[Metric]:
    """The metric families of one snapshot (`age_s`: how old it is when served)."""
    r = h.record

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

    yield gauge("start_time_seconds", "When the agent started (Unix time).", h.started_unix_s)
    yield gauge("snapshot_age_seconds",
                "How old the figures served are: 0 unless the agent was too busy to take "
                "new ones within the scrape's wait.", round(age_s, 3))
    yield counter("events_captured", "CUDA events read from the kernel's ring.", r.captured)
    yield counter("events_aggregated",
                  "Events the kernel counted under overload instead of recording them (in "
                  "every count all the same; their details shed).", r.events_aggregated)
    yield counter("events_produced", "Events handed to the Kafka client.", r.produced)
    yield counter("events_published", "Events the Kafka broker acknowledged.", r.published)
    dropped = CounterMetricFamily(f"{PREFIX}_events_dropped", "Events lost, by why.",
                                  labels=["reason"])
    dropped.add_metric([DROPPED_RING_FULL], r.dropped_kernel)
    dropped.add_metric([DROPPED_KAFKA_QUEUE], r.dropped_user)
    dropped.add_metric([DROPPED_AGENT_KILLED], r.dropped_agent_died)
    yield dropped
    yield counter("kafka_delivery_failed_events",
                  "Events the Kafka broker refused or never acknowledged (among the dropped).",
                  h.kafka_failed_events)
    yield gauge("kafka_queue_messages", "Messages waiting in the Kafka client's queue.",
                r.queue_messages)
    yield counter("kernel_names_dropped", "Kernel-name records lost in the kernel.",
                  r.dropped_names)
    yield counter("driver_calls_forwarded",
                  "Driver calls a probed runtime made, recorded once as the runtime's.",
                  r.forwarded_driver_calls)
    yield counter("single_stepped_calls",
                  "Probed calls the kernel single-stepped (~15 us each on a VM).",
                  h.stepped_calls)
    yield gauge("ring_fill_ratio",
                "The fullest a drain found the events ring since the last scrape (0-1).",
                round(h.ring_fill_max, 6))
    for name, doc, values in (
        ("library_files", "Library files probed, by kind.", h.files),
        ("probes_attached", "Probes attached, by kind of file.", h.probes),
        ("probes_single_stepped",
         "Probes at an instruction the kernel single-steps, by kind of file.", h.stepped),
        ("functions_unprobed",
         "Functions probed files define that could not be probed, by kind of file.",
         h.unprobed),
    ):
        family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["kind"])
        for kind in ("runtime", "driver", "loader"):
            family.add_metric([kind], values.get(kind, 0))
        yield family
    yield gauge("library_files_skipped", "CUDA library files that could not be probed at all.",
                h.files_skipped)
    yield counter("holds", "Processes held at a library load until probed, then continued.",
                  h.holds)
    yield counter("held_seconds", "How long those holds lasted, in all.", round(h.held_s, 6))
    yield counter("http_requests", "HTTP requests answered (with --http).", r.requests)
    yield counter("http_records_lost", "HTTP records lost in the kernel (ring full).",
                  r.http_records_lost)
    yield counter("http_connections_untracked",
                  "Accepted connections not followed (table full).",
                  r.http_connections_untracked)
    failed = GaugeMetricFamily(f"{PREFIX}_output_failed",
                               "1 when an output failed and was switched off.",
                               labels=["output"])
    lost = CounterMetricFamily(f"{PREFIX}_output_lost_events",
                               "Events an output did not write after it failed.",
                               labels=["output"])
    for name, (is_failed, n) in sorted(h.outputs.items()):
        failed.add_metric([name], is_failed)
        lost.add_metric([name], n)
    yield failed
    yield lost
    if h.code_paths is not None:
        yield from _code_paths(h)


def _code_paths(h: AgentHealth) -> Iterator[Metric]:
    rate = h.code_paths
    assert rate is not None
    yield CounterMetricFamily(f"{PREFIX}_code_path_calls",
                              "Recorded calls the Python stack sampler counted down.",
                              value=rate.calls)
    yield CounterMetricFamily(f"{PREFIX}_code_path_walks", "Python stacks walked (samples).",
                              value=rate.walks)
    yield CounterMetricFamily(f"{PREFIX}_code_path_walk_seconds",
                              "Time the kernel took walking them (what sampling adds to the "
                              "sampled processes, less the countdown).",
                              value=round(rate.spent_ns / 1e9, 9))
    yield CounterMetricFamily(f"{PREFIX}_code_path_new_stack_walks",
                              "Of those walks, the first of each new stack (its frames sent "
                              "with it; the cost budget does not follow them).",
                              value=rate.new_walks)
    yield CounterMetricFamily(f"{PREFIX}_code_path_new_stack_walk_seconds",
                              "Time the kernel took walking them (in the walk seconds).",
                              value=round(rate.new_spent_ns / 1e9, 9))
    yield GaugeMetricFamily(f"{PREFIX}_code_path_period_max",
                            "The highest sampling period (1 call in N) a CPU came to.",
                            value=rate.peak)
    yield GaugeMetricFamily(f"{PREFIX}_code_path_cost_budget_seconds",
                            "What the walks may add to a recorded call on average "
                            "(--stack-cost; 0: a fixed period, --stack-sampling N).",
                            value=h.code_path_budget_ns / 1e9)
    yield CounterMetricFamily(f"{PREFIX}_code_path_samples_lost",
                              "Samples lost in the kernel, their ring full.",
                              value=h.code_path_samples_lost)
    yield CounterMetricFamily(f"{PREFIX}_code_path_samples_unjoined",
                              "Sampled calls whose event never came (counted as calls alone).",
                              value=h.code_path_samples_unjoined)
