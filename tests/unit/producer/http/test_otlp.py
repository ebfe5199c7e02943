"""producer/http/otlp.py: requests as OTLP spans, received by a real OpenTelemetry Collector."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.http.otlp import OtlpExporter, RequestSpan, span_attributes
from gpuflight.producer.http.parser import Request, TraceContext
from tests.conftest import REPO

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


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
                    attribution="exact", gpu_source="nvml",
                    code_paths=[("Model.forward (srv/model.py)", 10.0, 2e8),
                                ("tokenize (srv/text.py)", 2.0, 5e7)]),
        RequestSpan(request(12), {"launches": 0.5, "gpu_ns": 1e6}, attribution="shared"),
        RequestSpan(request(13, TraceContext(TRACE, PARENT, 0))),  # not sampled by its caller
        RequestSpan(request(14, status=503), attribution="none"),
    ]


def test_importing_the_module_leaves_opentelemetry_out() -> None:
    code = ("import sys, gpuflight.producer.http.otlp; "
            "print(any(m.startswith('opentelemetry') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO)
    assert out.stdout.strip() == "False"


def test_span_attributes() -> None:
    attrs = span_attributes(spans()[0])
    assert attrs["http.request.method"] == "POST" and attrs["http.route"] == "/v1/infer/{id}"
    assert attrs["url.path"] == "/v1/infer/11" and attrs["http.response.status_code"] == 200
    assert attrs["gpuflight.gpu.launches"] == 12.0 and attrs["gpuflight.gpu.seconds"] == 0.25
    assert attrs["gpuflight.gpu.top_kernels"] == ["gemm_kernel", "softmax"]
    assert attrs["gpuflight.cost_usd"] == 0.0002 and attrs["gpuflight.attribution"] == "exact"
    assert "gpuflight.cost_usd" not in span_attributes(spans()[1])
    assert attrs["gpuflight.gpu.seconds_source"] == "nvml"
    assert "gpuflight.gpu.seconds_source" not in span_attributes(spans()[1])
    assert attrs["gpuflight.code.top_functions"] == ["Model.forward (srv/model.py)",
                                                     "tokenize (srv/text.py)"]
    assert attrs["gpuflight.code.top_function_launches"] == [10.0, 2.0]
    assert attrs["gpuflight.code.top_function_gpu_seconds"] == [0.2, 0.05]
    assert not any(k.startswith("gpuflight.code.") for k in span_attributes(spans()[1]))


def test_bad_endpoints_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="http"):
        OtlpExporter("collector:4318")
    with pytest.raises(UsageError, match="protocol"):
        OtlpExporter("http://x", protocol="carrier-pigeon")  # type: ignore[arg-type]
