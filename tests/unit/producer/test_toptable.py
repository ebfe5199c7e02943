"""`gpuflight top`'s table: each interval's events per process as rates, by the counting core,
with requests' p99 and NVML's GPU time priced; the agent's feed carries the rows whole."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.abi import API_IDS, F_ASYNC, F_HAS_RESULT, EventType
from gpuflight.producer.contract.errors import SetupError
from gpuflight.producer.contract.pricing import PriceBook
from gpuflight.producer.top import (
    FeedEnded,
    FeedSource,
    TopFeed,
    connect_feed,
    decode_rows,
    encode_rows,
)
from gpuflight.producer.toptable import TopTable, p99_ms
from tests.support.builders import T0, build_events, request_record

MS = 1_000_000


@dataclass
class _Answered:
    record: wire.RequestRecord


def _identity(pid: int) -> wire.ProcessRecord:
    return wire.ProcessRecord(
        host="n", pid=pid, start_time=1, started_at_ns=None, comm=f"train{pid}",
        cmdline=("python",), exe=None, container_id="c" * 64, pod_uid=None,
        pod="trainer-0" if pid == 10 else None, namespace="ml" if pid == 10 else None,
        slurm_job_id=None, job="k8s:ml/trainer-0" if pid == 10 else f"train:{pid}", team=None)


def _table(tmp_path: Path, **kw: object) -> TopTable:
    return TopTable(proc_root=tmp_path, identify=_identity, **kw)  # type: ignore[arg-type]


def _events() -> object:
    launch = {"type": EventType.LAUNCH, "api": API_IDS["cudaLaunchKernel"], "flags": F_ASYNC,
              "dim": [64, 1, 1, 128, 1, 1], "handle": 0xA000, "pid": 10, "tid": 10}
    return build_events(
        [{**launch, "ts_ns": T0 + i} for i in range(30)]
        + [{**launch, "ts_ns": T0 + 100 + i, "dim": [8, 2, 1, 32, 1, 1], "device": 1}
           for i in range(10)]
        + [{"type": EventType.MEMCPY, "api": API_IDS["cudaMemcpy"], "flags": F_HAS_RESULT,
            "ts_ns": T0 + 200, "duration_ns": 250 * MS, "bytes": 2_000_000_000,
            "dim": [1, 0, 0, 0, 0, 0], "pid": 10, "tid": 10},
           {"type": EventType.SYNC, "api": API_IDS["cudaDeviceSynchronize"],
            "flags": F_HAS_RESULT, "ts_ns": T0 + 300, "duration_ns": 250 * MS, "pid": 10,
            "tid": 10},
           {**launch, "pid": 20, "tid": 20, "ts_ns": T0 + 400}])


def test_an_interval_becomes_rates_per_process(tmp_path: Path) -> None:
    table = _table(tmp_path, http=True)
    table.snapshot(now=100.0)
    table.write(_events())  # type: ignore[arg-type]
    table.write_requests(10, [_Answered(request_record(i, start_ns=T0, end_ns=T0 + i * MS))
                              for i in range(1, 101)], {})
    rows = {r.pid: r for r in table.snapshot(now=102.0)}  # a 2 s interval
    row = rows[10]
    assert row.launches_per_s == 20.0  # 40 launches in 2 s
    assert row.blocks_per_launch == (30 * 64 + 10 * 16) / 40
    assert row.top_kernel == "function@0xa000"
    assert row.h2d_gb_per_s == 1.0 and row.d2h_gb_per_s == 0.0
    assert row.blocked_pct == 25.0  # 0.5 s of 2 s in the copy and the sync
    assert row.devices == (0, 1)
    assert row.requests_per_s == 50.0 and row.p99_ms == 99.0
    assert (row.pod, row.job, row.command, row.container) == (
        "ml/trainer-0", "k8s:ml/trainer-0", "train10", "c" * 12)
    assert [(s.grid, s.block, s.launches_per_s) for s in row.shapes] == [
        ("64x1x1", "128x1x1", 15.0), ("8x2x1", "32x1x1", 5.0)]
    assert [(k.name, k.share) for k in row.kernels] == [("function@0xa000", 1.0)]
    assert rows[20].launches_per_s == 0.5 and rows[20].pod == "-"
    assert rows[20].gpu_s_per_s is None and rows[20].usd_per_h is None  # no NVML
    # The next interval starts empty: a quiet process that is gone has no row.
    assert table.snapshot(now=103.0) == []


def test_a_process_alive_but_quiet_keeps_its_row_at_zero(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.write(_events())  # type: ignore[arg-type]
    table.snapshot(now=1.0)
    (tmp_path / "20").mkdir()  # 20 is alive, 10 is gone
    (row,) = table.snapshot(now=2.0)
    assert row.pid == 20 and row.launches_per_s == 0 and row.requests_per_s is None


def test_nvml_gpu_time_is_gpu_seconds_per_second_and_priced(tmp_path: Path) -> None:
    prices = PriceBook({"H100": 2.0})
    table = _table(tmp_path, prices=prices, gpu_names=lambda: {0: "NVIDIA H100 80GB HBM3"})
    table.snapshot(now=0.0)
    table.write(_events())  # type: ignore[arg-type]
    table.add_gpu_time(10, 0, 1.5e9)
    rows = {r.pid: r for r in table.snapshot(now=2.0)}
    assert rows[10].gpu_s_per_s == 0.75 and rows[10].usd_per_h == 1.5
    assert rows[20].gpu_s_per_s == 0.0 and rows[20].usd_per_h is None  # no GPU named for it


def test_the_agents_rows_carry_gpu_time_and_model_and_top_prices_them(tmp_path: Path) -> None:
    """The agent has NVML but no price book: its rows carry GPU-seconds a second and the
    model of the GPU (Capture.utilization_observers → TopFeed.add_utilization); top prices
    them with its own (--prices), as its own capture would. A field this top does not know
    (a newer agent's) is left out."""
    from gpuflight.producer.nvml import UtilReport, UtilWindow

    table = _table(tmp_path)  # the agent's: no prices
    path = tmp_path / "run" / "top.sock"
    feed = TopFeed(table, interval_s=0.05, path=path)
    table.gpu_names = lambda: {0: "NVIDIA H100 80GB HBM3"}
    assert feed.start()
    try:
        source = connect_feed(path)
        assert isinstance(source, FeedSource)
        source.prices = PriceBook({"H100": 2.0})
        try:
            while not feed.reading:
                os.sched_yield()
            feed.write(_events())
            # 60 % of the SMs over 1 s of NVML's windows: 0.6 GPU-seconds.
            feed.add_utilization(UtilReport((UtilWindow(0, 10, 0, 10**9, 60),), {0: 10**9}))
            got = None
            while got is None:
                got = next((r for r in source.next_rows() if r.pid == 10 and r.gpu_s_per_s),
                           None)
            assert got.gpu == "NVIDIA H100 80GB HBM3" and got.gpu_s_per_s is not None
            assert got.usd_per_h == pytest.approx(got.gpu_s_per_s * 2.0)
        finally:
            source.close()
    finally:
        feed.close()
    fresh = _table(tmp_path)
    fresh.snapshot(now=0.0)
    fresh.write(_events())  # type: ignore[arg-type]
    line = encode_rows(fresh.snapshot(now=1.0), 1.0)
    newer = line.replace(b'"pid":', b'"from_a_newer_agent":1,"pid":')
    assert newer != line and decode_rows(newer) == decode_rows(line)


def test_p99_is_the_nearest_rank() -> None:
    assert p99_ms([]) is None
    assert p99_ms([5 * MS]) == 5.0
    assert p99_ms([i * MS for i in range(1, 201)]) == 198.0


def test_the_feed_carries_rows_whole(tmp_path: Path) -> None:
    table = _table(tmp_path, http=True)
    table.snapshot(now=0.0)
    table.write(_events())  # type: ignore[arg-type]
    rows = table.snapshot(now=1.0)
    assert decode_rows(encode_rows(rows, 1.25)) == (rows, 1.25)
    with pytest.raises(ValueError):
        decode_rows(b'{"v": 99, "rows": []}')


def test_the_agents_feed_counts_only_while_read_and_serves_each_reader(tmp_path: Path) -> None:
    table = _table(tmp_path)
    path = tmp_path / "run" / "top.sock"
    feed = TopFeed(table, interval_s=0.05, path=path)
    assert feed.start()
    try:
        feed.write(_events())  # nobody reads: not counted
        assert not feed.reading
        source = connect_feed(path)
        assert isinstance(source, FeedSource)
        try:
            while not feed.reading:  # accepted on the feed's thread
                os.sched_yield()
            feed.write(_events())
            seen: list[int] = []
            while not seen:  # an interval may close before the events are in
                seen = [r.pid for r in source.next_rows() if r.launches_per_s > 0]
            assert sorted(seen) == [10, 20]
        finally:
            source.close()
        assert (path.stat().st_mode & 0o777) == 0o600
        assert (path.parent.stat().st_mode & 0o777) == 0o700
        # A second agent does not take the socket of the first.
        assert not TopFeed(table, path=path).start()
    finally:
        feed.close()
    assert not path.exists()
    assert connect_feed(path) is None


def test_the_feed_changes_and_removes_nothing_it_did_not_make(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # /tmp-like: others may write there
    assert not TopFeed(_table(tmp_path), path=shared / "top.sock").start()
    assert (shared.stat().st_mode & 0o7777) == 0o1777  # left as it was
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    data = mine / "data.db"
    data.write_text("keep")
    assert not TopFeed(_table(tmp_path), path=data).start()  # not a socket: not removed
    assert data.read_text() == "keep"


def test_an_interval_larger_than_a_socket_buffer_reaches_the_reader(tmp_path: Path) -> None:
    table = _table(tmp_path)
    path = tmp_path / "run" / "top.sock"
    feed = TopFeed(table, interval_s=0.05, path=path)
    rows = _table(tmp_path)
    rows.snapshot(now=0.0)
    rows.write(_events())  # type: ignore[arg-type]
    big = [replace(r, kernels=r.kernels * 20000) for r in rows.snapshot(now=1.0)]  # MBs
    table.snapshot = lambda now=None: big  # type: ignore[method-assign]
    assert len(encode_rows(big, 1.0)) > 1 << 20
    assert feed.start()
    source = connect_feed(path)
    try:
        assert isinstance(source, FeedSource)
        assert [len(r.kernels) for r in source.next_rows()] == [len(r.kernels) for r in big]
    finally:
        if source is not None:
            source.close()
        feed.shutdown()


def test_a_reader_is_told_whose_feed_it_is_and_when_it_ends_for_good(tmp_path: Path) -> None:
    path = tmp_path / "run" / "top.sock"
    feed = TopFeed(_table(tmp_path), interval_s=0.05, path=path, source="trace of ./train",
                   ends_with_capture=False)
    assert feed.start()
    source = connect_feed(path)
    try:
        assert isinstance(source, FeedSource)
        assert source.description == "trace of ./train"
        while not feed.reading:  # accepted on the feed's thread
            os.sched_yield()
        feed.close()  # the capture closes its sinks first: this feed goes on
        assert feed.reading and path.exists()
        feed.shutdown(end="./train exited (3)")
        with pytest.raises(FeedEnded, match=r"exited \(3\)"):
            while True:  # the intervals served before the end, then the end
                source.next_rows()
    finally:
        if source is not None:
            source.close()
        feed.shutdown()


def test_something_that_is_not_a_feed_is_refused(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "other.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)
        done = threading.Event()

        def answer() -> None:
            peer, _ = server.accept()
            with peer:
                peer.sendall(b"HTTP/1.1 400 Bad Request\n")
                done.wait(10)

        threading.Thread(target=answer, daemon=True).start()
        try:
            with pytest.raises(SetupError, match="not a top feed"):
                connect_feed(path)
        finally:
            done.set()


def test_a_routes_p99_samples_the_whole_interval_not_its_first_requests(
        tmp_path: Path) -> None:
    table = _table(tmp_path, http=True)
    table.snapshot(now=0.0)
    fast = [request_record(i, start_ns=T0, end_ns=T0 + 1 * MS) for i in range(1500)]
    slow = [request_record(i, start_ns=T0, end_ns=T0 + 100 * MS) for i in range(1500, 3000)]
    table.write_requests(10, [_Answered(r) for r in fast + slow], {})
    (row,) = [r for r in table.snapshot(now=1.0) if r.pid == 10]
    (route,) = row.routes
    assert route.requests_per_s == 3000.0
    assert route.p99_ms == 100.0  # half its requests were slow; the first 1,000 were not
