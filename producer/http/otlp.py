"""Each request as an OTLP span with what it made the GPU do (`--otlp URL`).

The span joins the caller's trace when the request carried a valid W3C `traceparent` (its
trace id, and the caller's span as parent); otherwise it starts a trace of its own. Its span
id is the request's id. Attributes follow OpenTelemetry's HTTP conventions (`http.request.method`,
`http.route`, `url.path`, `http.response.status_code`, `server.port`) and add gpuflight's:
launches, kernels, top kernels, GPU-seconds, bytes copied, CPU time blocked, cost, how the
request's share was attributed, and, when code paths are sampled (`trace --stacks`), the user
functions whose calls cost it most (`gpuflight.code.*`: estimates, each sample weighted by
1/p). A request whose caller did not sample its trace is not exported (the backend would hold
the span without its trace), unless asked.

opentelemetry's SDK and exporters are imported when an exporter is made, not with this module:
capture's start-up does not pay for them. Spans go out in batches from a background thread
(the SDK's BatchSpanProcessor); `close` flushes what is queued.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpuflight.producer.contract.errors import UsageError
from gpuflight.producer.http.parser import Request

log = logging.getLogger(__name__)

Protocol = Literal["http/protobuf", "grpc"]
SCOPE: Final = "gpuflight"
#: Cost fields (contract/costs.COST_FIELDS) exported as span attributes, under gpuflight.gpu.*.
EXPORTED_COSTS: Final = (
    "launches", "kernels", "weight", "graph_launches", "h2d_bytes", "d2h_bytes", "d2d_bytes",
    "other_copy_bytes", "memset_bytes", "allocs", "alloc_bytes", "syncs", "blocked_ns",
)


@dataclass(frozen=True)
class RequestSpan:
    """What one span says: the request, its costs, and how they were attributed."""

    request: Request
    #: Cost fields of costs.COST_FIELDS (Rollup.of(request_id)); gpu_ns becomes seconds.
    costs: Mapping[str, float] = field(default_factory=dict)
    #: (kernel name, launches) of its most launched kernels.
    top_kernels: Sequence[tuple[str, float]] = ()
    cost_usd: float | None = None
    #: "exact", "shared", "mixed" or "none": how its GPU work came to it.
    attribution: str = "none"
    #: Where its GPU time came from: "nvml", "queued", "mixed", or None.
    gpu_source: str | None = None
    #: Its costliest code paths' user functions: (function, launches, GPU ns).
    code_paths: Sequence[tuple[str, float, float]] = ()


class OtlpExporter:
    """Exports RequestSpans to an OTLP endpoint (a collector, Jaeger, Tempo...)."""

    def __init__(
        self,
        endpoint: str,
        *,
        protocol: Protocol = "http/protobuf",
        resource: Mapping[str, str | int] | None = None,
        wall_offset_ns: int = 0,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        export_unsampled: bool = False,
        max_queue: int = 8192,
    ) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise UsageError(f"--otlp needs opentelemetry-sdk ({exc}): pip install "
                             "opentelemetry-sdk opentelemetry-exporter-otlp") from exc
        self._exporter = _make_exporter(endpoint, protocol, headers or {}, timeout_s)
        self._resource = Resource.create({"service.name": "gpuflight", **(resource or {})})
        self._processor = BatchSpanProcessor(self._exporter, max_queue_size=max_queue)
        self._offset = wall_offset_ns
        self._unsampled = export_unsampled
        self.exported = 0
        self.skipped_unsampled = 0

    def export(self, item: RequestSpan) -> bool:
        """Queue one request's span; False when its caller did not sample its trace."""
        trace = item.request.trace
        if trace is not None and not trace.sampled and not self._unsampled:
            self.skipped_unsampled += 1
            return False
        self._processor.on_end(self._span(item))
        self.exported += 1
        return True

    def close(self, timeout_s: float = 10.0) -> bool:
        """Send what is queued and stop; False when the flush ran out of time."""
        flushed = self._processor.force_flush(int(timeout_s * 1000))
        self._processor.shutdown()  # type: ignore[no-untyped-call]
        if not flushed:
            log.warning("OTLP: spans still queued after %.0f s were dropped", timeout_s)
        return flushed

    def _span(self, item: RequestSpan) -> Any:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        r = item.request
        if r.trace is not None:
            trace_id = int(r.trace.trace_id, 16)
            flags = TraceFlags(r.trace.flags & 0xFF)
            parent = SpanContext(trace_id, int(r.trace.parent_id, 16), is_remote=True,
                                 trace_flags=flags)
        else:
            trace_id = secrets.randbits(128) or 1
            flags = TraceFlags(TraceFlags.SAMPLED)
            parent = None
        context = SpanContext(trace_id, r.request_id, is_remote=False, trace_flags=flags)
        status = Status(StatusCode.ERROR, f"HTTP {r.status}") if r.status >= 500 else Status(
            StatusCode.UNSET)
        return ReadableSpan(
            name=f"{r.method} {r.route}",
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=span_attributes(item),
            kind=SpanKind.SERVER,
            status=status,
            start_time=r.start_ns + self._offset,
            end_time=r.end_ns + self._offset,
            instrumentation_scope=InstrumentationScope(SCOPE),
        )


def span_attributes(item: RequestSpan) -> dict[str, Any]:
    """The attributes of a request's span."""
    r = item.request
    attrs: dict[str, Any] = {
        "http.request.method": r.method,
        "url.path": r.path,
        "http.route": r.route,
        "http.response.status_code": r.status,
        "server.port": r.lport,
        "process.pid": r.pid,
        "thread.id": r.tid,
        "http.request.body.size": r.bytes_in,
        "http.response.body.size": r.bytes_out,
        "gpuflight.request_id": r.request_id,
        "gpuflight.request.complete": r.complete,
        "gpuflight.attribution": item.attribution,
    }
    for name in EXPORTED_COSTS:
        if name in item.costs:
            attrs[f"gpuflight.gpu.{name}"] = float(item.costs[name])
    if "gpu_ns" in item.costs:
        attrs["gpuflight.gpu.seconds"] = float(item.costs["gpu_ns"]) / 1e9
    if item.gpu_source:
        attrs["gpuflight.gpu.seconds_source"] = item.gpu_source
    if item.cost_usd is not None:
        attrs["gpuflight.cost_usd"] = item.cost_usd
    if item.top_kernels:
        attrs["gpuflight.gpu.top_kernels"] = [name for name, _ in item.top_kernels]
        attrs["gpuflight.gpu.top_kernel_launches"] = [float(n) for _, n in item.top_kernels]
    if item.code_paths:
        attrs["gpuflight.code.top_functions"] = [name for name, _, _ in item.code_paths]
        attrs["gpuflight.code.top_function_launches"] = [float(n) for _, n, _ in item.code_paths]
        attrs["gpuflight.code.top_function_gpu_seconds"] = [
            float(ns) / 1e9 for _, _, ns in item.code_paths]
    return attrs


def _make_exporter(endpoint: str, protocol: Protocol, headers: Mapping[str, str],
                   timeout_s: float) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        target = endpoint.split("://", 1)[-1]
        insecure = not endpoint.startswith("https://")
        return GrpcExporter(endpoint=target, insecure=insecure, headers=dict(headers),
                            timeout=timeout_s)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        if not endpoint.startswith(("http://", "https://")):
            raise UsageError(f"--otlp {endpoint}: an OTLP/HTTP endpoint is an http(s):// URL")
        url = endpoint.rstrip("/")
        if not url.endswith("/v1/traces"):
            url += "/v1/traces"
        return HttpExporter(endpoint=url, headers=dict(headers), timeout=timeout_s)
    raise UsageError(f"unknown OTLP protocol {protocol!r} (http/protobuf or grpc)")


class SpanSink:
    """An EventSink that exports each answered request (requesttrack.Answered) as a span."""

    def __init__(self, exporter: OtlpExporter, kernels: Any = None,
                 prices: Any = None, gpu_name: str | None = None) -> None:
        self.name = "--otlp"
        self._exporter = exporter
        self._kernels = kernels  # kernels.KernelNames
        self._prices = prices  # pricing.PriceBook
        self._gpu_name = gpu_name
        self.takes_attribution = False

    def write(self, events: Any) -> None:
        pass

    def write_requests(self, pid: int, answered: Sequence[Any],
                       unattributed: Mapping[str, float]) -> None:
        for a in answered:
            top = sorted(a.kernels.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
            named = []
            for handle, n in top:
                name = self._kernels.name_of(pid, handle) if self._kernels is not None else None
                named.append((name.short if name else f"0x{handle:x}", n))
            usd = None
            if self._prices is not None and self._gpu_name:
                usd = self._prices.cost(a.record.cost_of("gpu_ns") / 1e9, self._gpu_name)
            self._exporter.export(RequestSpan(a.request, dict(a.record.cost), named, usd,
                                              a.mode, a.record.gpu_source,
                                              a.record.code_paths))

    def tick(self) -> None:
        pass

    def close(self) -> None:
        self._exporter.close()
