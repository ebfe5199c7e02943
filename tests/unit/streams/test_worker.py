"""The stream worker's logic without services: its report tables, its directory, its GPU
samples, its sink's contract checks, and (through tests/support/streams_support.py's Harness)
messages handled one by one. tests/system/test_streams.py runs it against Kafka and InfluxDB.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from faust.types import TP

from gpuflight.producer.contract import wire
from gpuflight.streams import measurements as m
from tests.support.streams_support import Harness, Message, launches


def test_the_report_shows_a_table_per_device_when_there_are_several() -> None:
    from gpuflight.streams import report

    summary = report.JobSummary("train:1", 0, 10**9, hosts=["h"], window_s=1.0, devices={
        "0": {"launches": 1200, "copies": 3, "bytes": 3 << 20, "syncs": 2, "sync_ns": 10**9,
              "copy_ns": 5 * 10**8, "H2D": 2 << 20, "D2D": 1 << 20},
        "1": {"launches": 7, "copies": 1, "bytes": 4096, "syncs": 0, "sync_ns": 0,
              "copy_ns": 0, "D2H": 4096}})
    lines = report.render_job(summary).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("device"))
    assert lines[at].split() == ["device", "kernel", "launches", "copies", "H2D", "D2H", "D2D",
                                 "CPU", "blocked", "on", "the", "GPU"]
    assert lines[at + 2].split() == ["0", "1,200", "3", "2.0", "MiB", "-", "1.0", "MiB",
                                     "1.500", "s"]
    assert lines[at + 3].split() == ["1", "7", "1", "-", "4.0", "KiB", "-", "0.000", "s"]
    assert orjson.loads(report.render_json([summary]))[0]["devices"]["1"]["D2H"] == 4096
    one = report.JobSummary("train:1", 0, 10**9, devices={"0": summary.devices["0"]})
    assert not any(line.startswith("device") for line in report.render_job(one).splitlines())


def test_the_directory_forgets_an_ended_one_process_job_only() -> None:
    """A COMM:PID job ends with its process (the agent's exit record); once the worker forgot
    its state, its process goes from the directory too. A pod's process does not end its job,
    and the pid used again by the same command is the job again, not ended."""
    from gpuflight.streams.identities import Directory

    def record(pid: int, start: int, job: str, exited: int | None = None,
               pod: str | None = None) -> wire.ProcessRecord:
        return wire.ProcessRecord("h", pid, start, None, "c", (), None, None, None, pod,
                                  "ns" if pod else None, None, job, exited_ns=exited)

    directory = Directory()
    for pid in range(1, 1001):
        directory.add(record(pid, 10, f"c:{pid}"))
        directory.add(record(pid, 10, f"c:{pid}", exited=5_000 + pid))
    directory.add(record(5000, 10, "k8s:ns/pod", pod="pod"))
    directory.add(record(5000, 10, "k8s:ns/pod", exited=7_000, pod="pod"))
    assert len(directory) == 1001 and directory.ended("h", "c:7") == 5_007
    assert directory.ended("h", "k8s:ns/pod") is None
    for pid in range(1, 1000):
        directory.forget_job("h", f"c:{pid}")
    directory.forget_job("h", "k8s:ns/pod")  # not an ended one-process job: kept
    assert len(directory) == 2
    assert directory.job("h", 7, 10) is None and directory.latest_job("h", 7) is None
    assert directory.job("h", 1000, 10) == "c:1000"
    assert directory.job("h", 5000, 10) == "k8s:ns/pod"
    # pid 1000 used again by the same command: its job lives again.
    directory.add(record(1000, 99, "c:1000"))
    assert directory.ended("h", "c:1000") is None
    directory.forget_job("h", "c:1000")
    assert directory.job("h", 1000, 99) == "c:1000"


def test_a_forgotten_job_leaves_no_gpu_samples() -> None:
    """NVML samples are kept per job for its verdicts and cost: a job the worker forgets
    (an ended one-process job, or one idle an hour) takes its samples and GPU with it."""
    from gpuflight.streams.identities import Directory
    from gpuflight.streams.worker import GpuUtilization

    directory = Directory()
    gpu = GpuUtilization()
    for pid in range(1, 501):
        directory.add(wire.ProcessRecord("h", pid, 1, None, "c", (), None, None, None, None,
                                         None, None, f"c:{pid}"))
        sample = wire.GpuSample(0, None, "NVIDIA H100", 50, None, None, None, None, None, None,
                                None, None, (wire.GpuProcessSample(pid, 30, None, None),))
        gpu.add(wire.NvmlRecord("h", 10 + pid, (sample,)), directory)
    assert gpu.mean("h", "c:7", 0, 1000) == 30 and gpu.gpu_name("h", "c:7") == "NVIDIA H100"
    for pid in range(1, 500):
        gpu.forget("h", f"c:{pid}")
    assert len(gpu._job) == len(gpu._job_gpu) == 1  # only c:500's
    assert gpu.mean("h", "c:7", 0, 1000) == 50  # the host's mean, as for any unknown job


# -- the worker's logic, without services (tests/support/streams_support.py: Harness) -------


def request(request_id: int, end_ns: int, gpu_ns: float = 1000.0) -> wire.RequestRecord:
    return wire.RequestRecord(request_id, 1, "GET", "/infer", "/infer", 200, end_ns - 10**6,
                              end_ns, 100, 200, None, None, True, 8080, {"gpu_ns": gpu_ns})


def test_the_sink_leaves_out_a_point_that_breaks_the_contract_alone() -> None:
    import asyncio
    import math

    from gpuflight.streams.settings import InfluxSettings
    from gpuflight.streams.sink import Batch, InfluxSink

    written: list[object] = []
    sink = InfluxSink(InfluxSettings(), on_written=written.append)
    good = m.Point("memset", {"host": "h", "job": "j"}, {"count": 1, "bytes": 2}, 5)
    bad = [m.Point("memset", {"host": "", "job": "j"}, {"count": 1, "bytes": 2}, 5),
           m.Point("memset", {"host": "h", "job": "j"}, {"count": 1, "bytes": 2**64}, 5),
           m.Point("job_cost", {"host": "h", "job": "j", "namespace": "-", "team": "-"},
                   {"cost_usd": math.inf}, 5)]
    asyncio.run(sink.put(Batch([bad[0], good, *bad[1:]], token="t1")))
    assert [p for b in sink._queue for p in b.points] == [good]
    assert sink.stats.rejected_points == 3 and sink.stats.pending_points == 1
    asyncio.run(sink.put(Batch(bad, token="t2")))  # nothing left: done at once
    assert written == ["t2"]


# -- what one message may cost the stream, with Kafka's limits ------------------------------


def test_nvml_samples_of_a_process_not_known_yet_wait_for_its_identity() -> None:
    """A short job's NVML samples can come before its identity (another topic, read by
    another thread): parked, they reach the job once it is known, not the unknown job; a pid
    whose identity never comes is waited for once, then written as unknown at once."""
    from gpuflight.streams import measurements as m
    from tests.support.streams_support import Harness

    harness = Harness(identity_wait_s=3600.0)
    harness.nvml("n1", 1_000, {42: 30})
    assert harness.points(m.GPU_PROCESS.name) == []  # parked: pid 42 has no job yet
    harness.process("n1", 42, 7, "train:42")
    harness.tick()
    (point,) = harness.points(m.GPU_PROCESS.name)
    assert point.tags["job"] == "train:42" and point.fields[m.Fields.SM_UTIL_PCT] == 30
    assert len(harness.points(m.GPU.name)) == 1
    # A restarted worker finds nothing left parked: the record went once.
    again = harness.restart()
    again.tick()
    assert again.points(m.GPU_PROCESS.name) == []

    impatient = Harness(identity_wait_s=0.0)
    impatient.nvml("n1", 1_000, {43: 10})
    impatient.tick()  # waited long enough: as the unknown job
    impatient.nvml("n1", 2_000, {43: 20})  # not waited for again
    jobs = [p.tags["job"] for p in impatient.points(m.GPU_PROCESS.name)]
    assert len(jobs) == 2 and len(set(jobs)) == 1 and jobs[0] != "train:43"


class _Consumer:
    """What the worker asks of Faust's consumer to read a partition again: its seeks."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.seeks: list[int] = []

    def assignment(self) -> set[TP]:
        return {TP(self.topic, 0)}

    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        self.seeks += list(offsets.values())

    def highwater(self, tp: TP) -> int | None:
        return None  # (the stall watch's: not what these tests are about)


def _taking(**settings: Any) -> tuple[Harness, _Consumer, Callable[[int], int]]:
    """A worker whose consumer records its seeks, and `give(offset)`: the events message at
    that offset of partition 0 (one launch, of its own second), handed to the worker; the
    events counted so far."""
    harness = Harness(**settings)
    consumer = _Consumer(harness.topics.events)
    harness.app.consumer = consumer  # type: ignore[attr-defined]
    harness.process("h", 7, 1, "train:7")
    t0 = 1_700_000_000 * 10**9

    def give(offset: int) -> int:
        batch = wire.EventBatch("h", 7, 1, launches([t0 + offset * 10**9], 7, 8, 32))
        asyncio.run(harness.worker.handle(
            Message(harness.topics.events, 0, offset, b"h", wire.encode_events(batch))))
        return harness.worker.stats.events

    return harness, consumer, give


def test_messages_the_consumer_lost_are_read_again_in_order() -> None:
    """A message past one never taken: the partition is read again from the one missing, and
    what comes past it meanwhile is left (it comes again after it); nothing counted twice."""
    harness, consumer, give = _taking()
    assert [give(0), give(1)] == [1, 2]
    assert give(3) == 2 and consumer.seeks == [2]  # 2 never came: read again from it
    assert give(4) == 2  # fetched before the seek: left, it comes again
    assert [give(2), give(3), give(4)] == [3, 4, 5]
    assert consumer.seeks == [2] and harness.worker.stats.rereads == 1
    assert harness.worker.stats.skipped_messages == 0


def test_a_read_again_whose_seek_was_undone_is_sought_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Faust's loop can undo a seek (it hands over what it fetched before, moving its read
    offset past the seek's, and drops what then comes again below it): while the offset
    awaited does not come, the partition is sought again each RESEEK_S, not after stall_s."""
    from gpuflight.streams import worker as worker_module

    harness, consumer, give = _taking()
    assert [give(0), give(1), give(3)] == [1, 2, 2] and consumer.seeks == [2]
    asyncio.run(harness.worker.check_partitions())
    assert consumer.seeks == [2]  # sought just now: not yet
    monkeypatch.setattr(worker_module, "RESEEK_S", 0.0)
    asyncio.run(harness.worker.check_partitions())
    assert consumer.seeks == [2, 2]  # nothing came: sought again
    assert [give(2), give(3)] == [3, 4]
    asyncio.run(harness.worker.check_partitions())
    assert consumer.seeks == [2, 2]  # it came: no more
    assert harness.worker.stats.rereads == 1 and harness.worker.stats.skipped_messages == 0


def test_messages_gone_from_the_log_are_counted_and_passed() -> None:
    """Read again, the missing message never comes (retention took it): once stall_s has
    passed, the partition goes on from the first message that did come, the loss counted."""
    harness, consumer, give = _taking(stall_s=0.0)
    assert [give(0), give(1)] == [1, 2]
    assert give(4) == 2 and consumer.seeks == [2]
    assert give(3) == 2 and consumer.seeks == [2, 3]  # 2 and … gone: on from 3 (the lowest)
    assert [give(3), give(4)] == [3, 4]
    assert harness.worker.stats.skipped_messages == 1  # offset 2


def test_a_gap_that_cannot_be_read_again_is_counted_and_passed() -> None:
    """No consumer to seek with (none yet, or the partition revoked): the messages missing are
    counted as lost, and the one past them is taken."""
    harness, _, give = _taking()
    del harness.app.consumer  # type: ignore[attr-defined]
    assert [give(0), give(3), give(4)] == [1, 2, 3]
    assert harness.worker.stats.skipped_messages == 2 and harness.worker.stats.rereads == 1
