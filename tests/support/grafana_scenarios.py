"""Events for the alert scenarios the demo workloads do not play (a bandwidth drop), and a
writer that puts the stream app's points into an InfluxDB database of the tests' own."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpuflight import stack
from gpuflight.producer.contract.abi import (
    API_IDS,
    COPY_KINDS,
    EVENT_DTYPE,
    F_HAS_RESULT,
    EventType,
)
from gpuflight.streams import measurements as m
from gpuflight.streams.measurements import Point

HOST = "gpu-node-1"
#: The stream app's default window.
WINDOW_S = 10.0


@dataclasses.dataclass(frozen=True)
class Work:
    """One window of a job: launches of one shape, then synchronous copies each way."""

    pid: int
    launches: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    copies: int  # H2D copies, and as many D2H
    copy_bytes: int
    copy_ns: int


#: Steady copies, enough per window (8 of 16 MiB each way) for the bandwidth detector.
COPIER = Work(4300, 10, (1, 1, 1), (32, 1, 1), 8, 16 << 20, 4_000_000)


def events(work: Work, window_start_ns: int) -> npt.NDArray[np.void]:
    k, c = work.launches, work.copies
    ev = np.zeros(k + 2 * c, dtype=EVENT_DTYPE)
    ev["ts_ns"] = window_start_ns + 1000 + np.arange(len(ev), dtype=np.uint64) * 1000
    ev["pid"] = ev["tid"] = work.pid
    ev["type"][:k] = int(EventType.LAUNCH)
    ev["api"][:k] = API_IDS["cudaLaunchKernel"]
    ev["dim"][:k] = [*work.grid, *work.block]
    ev["type"][k:] = int(EventType.MEMCPY)
    ev["api"][k:] = API_IDS["cudaMemcpy"]
    ev["flags"][k:] = F_HAS_RESULT
    ev["bytes"][k:] = work.copy_bytes
    ev["duration_ns"][k:] = work.copy_ns
    ev["dim"][k : k + c, 0] = COPY_KINDS.index("H2D")
    ev["dim"][k + c :, 0] = COPY_KINDS.index("D2H")
    return ev


def write_points(url: str, database: str, points: Sequence[Point]) -> None:
    """Write as the stream app's sink does (its line protocol, influxdb-client's v2 write API),
    into `database` (created if missing)."""
    from influxdb_client.client.influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import SYNCHRONOUS

    from gpuflight.streams.sink import line

    for point in points:
        m.validate(point)
    stack.create_database(url, database)
    with InfluxDBClient(url=url, token="", org="-") as client:
        client.write_api(write_options=SYNCHRONOUS).write(
            bucket=f"{database}/autogen", record=[line(p) for p in points], write_precision="ns")
