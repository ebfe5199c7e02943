"""Test data built by hand, in one place: CUDA event records (abi.EVENT_DTYPE) from rows of
fields by name, and the requests and attributions the wire carries with them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import EVENT_DTYPE, F_ASYNC, F_HAS_RESULT, EventType

Events = npt.NDArray[np.void]

#: When hand-made events happen (2026-12-01), in ns since the epoch.
T0 = 1_796_000_000_000_000_000


def build_events(rows: Iterable[Mapping[str, Any]]) -> Events:
    """The records of `rows`, one each: its fields by name, every other field zero."""
    rows = list(rows)
    out = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, row in enumerate(rows):
        for key, value in row.items():
            out[key][i] = value
    return out


def stamped_events(rows: Iterable[Mapping[str, Any]]) -> Events:
    """As build_events, each row over ts_ns T0 + its index, pid 10 and tid 11."""
    return build_events({"ts_ns": T0 + i, "pid": 10, "tid": 11, **row}
                        for i, row in enumerate(rows))


def call(ts: int, tid: int = 1, type_: int = EventType.LAUNCH, **kw: Any) -> dict[str, Any]:
    """A row of one call of pid 9: a launch (async, of one thread) unless `type_` says;
    a sync has a result."""
    row: dict[str, Any] = {"ts_ns": ts, "tid": tid, "type": type_, "pid": 9}
    if type_ == EventType.LAUNCH:
        row["dim"] = kw.pop("dim", [1, 1, 1, 1, 1, 1])
        row["flags"] = F_ASYNC
    if type_ == EventType.SYNC:
        row["flags"] = F_HAS_RESULT
    row.update(kw)
    return row


def request_record(rid: int, **over: object) -> wire.RequestRecord:
    """A request as the wire carries it (request id `rid`), its fields overridden by `over`."""
    fields: dict[str, object] = dict(
        request_id=rid, tid=4243, method="POST", path=f"/v1/models/{rid}", route="/v1/models/{id}",
        status=200, start_ns=1_796_000_000_000_000_000, end_ns=1_796_000_000_002_000_000,
        bytes_in=120, bytes_out=4000, trace_id="0af7651916cd43dd8448eb211c80319c",
        parent_span_id="b7ad6b7169203331", complete=True, port=8080,
        cost={"launches": 3.0, "gpu_ns": 1500.5, "h2d_bytes": 4096.0})
    fields.update(over)
    return wire.RequestRecord(**fields)  # type: ignore[arg-type]


def attribution(n: int) -> wire.EventAttribution:
    """Of `n` events: the first 5 request 11's, then 3 shared by 11 and 12, 1 by 11, 12, 13."""
    rid = np.zeros(n, dtype=np.uint64)
    rset = np.zeros(n, dtype=np.int64)
    rid[:5] = 11
    rset[5:8] = 1
    rset[8:9] = 2
    return wire.EventAttribution(rid, rset, (((11, 0.5), (12, 0.5)),
                                             ((11, 1 / 3), (12, 1 / 3), (13, 1 / 3))))
