"""producer/http/otlp.py: requests as OTLP spans, received by a real OpenTelemetry Collector."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflight.producer.http.otlp import OtlpExporter, RequestSpan
from gpuflight.producer.http.parser import Request, TraceContext
from tests.support.otlp_fixture import Collector, running_collector


@pytest.fixture
def otlp_collector(tmp_path: Path) -> Iterator[Collector]:
    with running_collector(tmp_path) as collector:
        yield collector


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
OFFSET = 1_700_000_000_000_000_000  # monotonic → wall clock


def request(rid: int, trace: TraceContext | None = None, status: int = 200) -> Request:
    return Request(
        request_id=rid, pid=321, tid=322, fd=9, conn_id=5, method="POST", path=f"/v1/infer/{rid}",
        route="/v1/infer/{id}", status=status, start_ns=1_000_000 + rid, end_ns=3_000_000 + rid,
        bytes_in=512, bytes_out=2048, trace=trace, complete=True, lport=8000,
    )


COSTS = {"launches": 12.0, "kernels": 14.0, "weight": 4096.0, "h2d_bytes": 1e6,
         "d2h_bytes": 2e3, "blocked_ns": 5e5, "gpu_ns": 2.5e8, "syncs": 2.0}


def spans() -> list[RequestSpan]:
    return [
        RequestSpan(request(11, TraceContext(TRACE, PARENT, 1)), COSTS,
                    [("gemm_kernel", 10.0), ("softmax", 2.0)], cost_usd=0.0002,
                    attribution="exact", gpu_source="nvml"),
        RequestSpan(request(12), {"launches": 0.5, "gpu_ns": 1e6}, attribution="shared"),
        RequestSpan(request(13, TraceContext(TRACE, PARENT, 0))),  # not sampled by its caller
        RequestSpan(request(14, status=503), attribution="none"),
    ]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_spans_reach_a_real_collector(otlp_collector: Collector, protocol: str) -> None:
    endpoint = otlp_collector.http if protocol == "http/protobuf" else otlp_collector.grpc
    exporter = OtlpExporter(endpoint, protocol=protocol,  # type: ignore[arg-type]
                            resource={"host.name": "node-7", "k8s.namespace.name": "ml"},
                            wall_offset_ns=OFFSET)
    sent = [exporter.export(s) for s in spans()]
    assert sent == [True, True, False, True]
    assert exporter.close()
    assert (exporter.exported, exporter.skipped_unsampled) == (3, 1)
    got = {int(s["spanId"], 16): s for s in otlp_collector.wait_for(3)}
    assert sorted(got) == [11, 12, 14]
    joined, alone, failed = got[11], got[12], got[14]
    # The caller's trace, and the caller's span as parent.
    assert (joined["traceId"], joined["parentSpanId"]) == (TRACE, PARENT)
    assert joined["name"] == "POST /v1/infer/{id}" and joined["kind"] == 2  # SERVER
    assert int(joined["startTimeUnixNano"]) == OFFSET + 1_000_011
    assert int(joined["endTimeUnixNano"]) == OFFSET + 3_000_011
    attrs = {a["key"]: a["value"] for a in joined["attributes"]}
    assert attrs["gpuflight.gpu.launches"] == {"doubleValue": 12}
    assert attrs["gpuflight.gpu.seconds"] == {"doubleValue": 0.25}
    assert attrs["http.response.status_code"] == {"intValue": "200"}
    assert attrs["gpuflight.request_id"] == {"intValue": "11"}
    assert [v["stringValue"] for v in attrs["gpuflight.gpu.top_kernels"]["arrayValue"]["values"]
            ] == ["gemm_kernel", "softmax"]
    assert joined["resource"]["host.name"] == "node-7"
    assert joined["resource"]["service.name"] == "gpuflight" and joined["scope"] == "gpuflight"
    # No traceparent: a trace of its own, no parent.
    assert alone["traceId"] not in ("", TRACE) and alone.get("parentSpanId", "") == ""
    assert {a["key"]: a["value"] for a in alone["attributes"]}["gpuflight.attribution"] == {
        "stringValue": "shared"}
    # A server error is an error span.
    assert failed["status"].get("code") == 2 and "503" in failed["status"].get("message", "")
    assert joined["status"].get("code", 0) == 0
