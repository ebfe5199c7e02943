"""The node agent's /metrics: names Prometheus' linter accepts, and each figure where the
agent's own counters put it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from gpuflight.producer import agentmetrics
from gpuflight.producer.contract import wire
from gpuflight.producer.contract.exposition import SnapshotExchange
from tests.support.promlint import lint, samples


def _health() -> agentmetrics.AgentHealth:
    record = wire.MetricsRecord(
        host="node-1", ts_ns=1, uptime_s=5.0, captured=1000, produced=990, published=980,
        dropped_kernel=7, dropped_kernel_by_pid={42: 7}, dropped_user=10,
        dropped_user_by_pid={42: 10}, queue_messages=3, libraries_attached=2,
        driver_libraries_attached=1, dropped_names=2, forwarded_driver_calls=400, requests=12,
        http_records_lost=1, http_connections_untracked=4, dropped_agent_died=5,
        dropped_agent_died_by_pid={7: 5}, events_aggregated=250)
    return agentmetrics.AgentHealth(
        started_unix_s=1_764_900_000.5, record=record,
        files={"runtime": 2, "driver": 1}, probes={"runtime": 114, "driver": 73},
        stepped={"driver": 2}, unprobed={"runtime": 1}, files_skipped=1, stepped_calls=31,
        ring_fill_max=0.25, holds=3, held_s=0.042, kafka_failed_events=6,
        outputs={"--output events.jsonl": (0, 0), "Kafka": (1, 16)})


def _text(health: agentmetrics.AgentHealth) -> str:
    exchange: SnapshotExchange[agentmetrics.AgentHealth] = SnapshotExchange(wait_s=0)
    exchange.offer(health)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(agentmetrics.AgentCollector(exchange))
    return generate_latest(registry).decode()


def test_every_name_passes_promtools_linter() -> None:
    assert lint(_text(_health())) == []


def test_each_figure_is_the_agents_own_count() -> None:
    got = samples(_text(_health()))
    p = "gpuflight_agent_"
    want = {
        (f"{p}events_captured_total", ()): 1000,
        (f"{p}events_aggregated_total", ()): 250,
        (f"{p}events_produced_total", ()): 990,
        (f"{p}events_published_total", ()): 980,
        (f"{p}events_dropped_total", (("reason", "ring_full"),)): 7,
        (f"{p}events_dropped_total", (("reason", "kafka_queue_full"),)): 10,
        (f"{p}events_dropped_total", (("reason", "agent_killed"),)): 5,
        (f"{p}kafka_delivery_failed_events_total", ()): 6,
        (f"{p}kafka_queue_messages", ()): 3,
        (f"{p}kernel_names_dropped_total", ()): 2,
        (f"{p}driver_calls_forwarded_total", ()): 400,
        (f"{p}single_stepped_calls_total", ()): 31,
        (f"{p}ring_fill_ratio", ()): 0.25,
        (f"{p}library_files", (("kind", "runtime"),)): 2,
        (f"{p}library_files", (("kind", "driver"),)): 1,
        (f"{p}library_files", (("kind", "loader"),)): 0,
        (f"{p}probes_attached", (("kind", "runtime"),)): 114,
        (f"{p}probes_attached", (("kind", "driver"),)): 73,
        (f"{p}probes_single_stepped", (("kind", "driver"),)): 2,
        (f"{p}probes_single_stepped", (("kind", "runtime"),)): 0,
        (f"{p}functions_unprobed", (("kind", "runtime"),)): 1,
        (f"{p}library_files_skipped", ()): 1,
        (f"{p}holds_total", ()): 3,
        (f"{p}held_seconds_total", ()): 0.042,
        (f"{p}http_requests_total", ()): 12,
        (f"{p}http_records_lost_total", ()): 1,
        (f"{p}http_connections_untracked_total", ()): 4,
        (f"{p}output_failed", (("output", "Kafka"),)): 1,
        (f"{p}output_failed", (("output", "--output events.jsonl"),)): 0,
        (f"{p}output_lost_events_total", (("output", "Kafka"),)): 16,
        (f"{p}start_time_seconds", ()): 1_764_900_000.5,
    }
    assert {k: got.get(k) for k in want} == want
    assert got[(f"{p}snapshot_age_seconds", ())] >= 0


def test_nothing_is_served_before_the_first_snapshot() -> None:
    exchange: SnapshotExchange[agentmetrics.AgentHealth] = SnapshotExchange(wait_s=0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(agentmetrics.AgentCollector(exchange))
    assert generate_latest(registry) == b""


def test_the_stack_sampler_s_walks_and_their_cost_with_code_paths_on() -> None:
    """`--stack-sampling`: what the sampler counted down, walked and spent, from the kernel's
    per-CPU counters summed (Probes.stack_rate), its budget and what it lost; nothing of it
    without code paths."""
    from dataclasses import replace

    from gpuflight.producer.probe.probes import StackRate

    p = "gpuflight_agent_code_path_"
    assert not any(name.startswith(p) for name, _ in samples(_text(_health())))
    health = replace(_health(), code_paths=StackRate(peak=64, raised=3, calls=120_000,
                                                     walks=2_500, spent_ns=3_250_000,
                                                     new_walks=12, new_spent_ns=600_000),
                     code_path_budget_ns=40, code_path_samples_lost=2,
                     code_path_samples_unjoined=9)
    text = _text(health)
    assert lint(text) == []
    got = {k: v for k, v in samples(text).items() if k[0].startswith(p)}
    assert got == {
        (f"{p}calls_total", ()): 120_000,
        (f"{p}walks_total", ()): 2_500,
        (f"{p}walk_seconds_total", ()): 0.00325,
        (f"{p}new_stack_walks_total", ()): 12,
        (f"{p}new_stack_walk_seconds_total", ()): 0.0006,
        (f"{p}period_max", ()): 64,
        (f"{p}cost_budget_seconds", ()): 4e-08,
        (f"{p}samples_lost_total", ()): 2,
        (f"{p}samples_unjoined_total", ()): 9,
    }
