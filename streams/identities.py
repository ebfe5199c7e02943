"""Who a process is: every worker reads the whole processes topic (compacted, small) into a
directory, from the start, in a thread of its own. The events topic is partitioned by host and
the processes topic by process, so a worker cannot rely on owning the partitions of the
processes its events come from; reading all of them keeps every worker's view complete.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Final

from gpuflight.producer.contract import wire

log = logging.getLogger(__name__)

#: The job of a process the directory does not know (after waiting for it).
UNKNOWN_JOB_FORMAT: Final = "unknown:{pid}"


class Directory:
    """(host, pid, start_time) → job, filled from processes.v1 records (`malformed` counts the
    messages that were not valid ones).

    A job that was one process (COMM:PID) ends with it: the agent publishes the process's
    record again with its exit, and once the worker has closed and forgotten the job's state
    (`forget_job`), the process is forgotten here too, so thousands of short-lived processes
    an hour do not pile up. Processes of pods and SLURM jobs stay (fewer, and a job outlives
    its processes)."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, int, int], str] = {}
        self._latest: dict[tuple[str, int], str] = {}
        self._namespaces: dict[tuple[str, int, int], str] = {}
        self._teams: dict[tuple[str, int, int], str] = {}
        #: (host, job) of a job that was one process, gone → (pid, start_time, exited_ns).
        self._ended: dict[tuple[str, str], tuple[int, int, int]] = {}
        self._lock = threading.Lock()
        self.records = 0
        self.malformed = 0

    def add(self, record: wire.ProcessRecord) -> None:
        key = (record.host, record.pid, record.start_time)
        with self._lock:
            self._jobs[key] = record.job
            self._latest[key[:2]] = record.job
            if record.namespace:
                self._namespaces[key] = record.namespace
            if record.team:
                self._teams[key] = record.team
            if record.own_job:
                job_key = (record.host, record.job)
                if record.exited_ns is not None:
                    self._ended[job_key] = (record.pid, record.start_time, record.exited_ns)
                elif self._ended.get(job_key, (0, record.start_time))[1] != record.start_time:
                    del self._ended[job_key]  # the pid again, the same command: the job again
            self.records += 1

    def ended(self, host: str, job: str) -> int | None:
        """When the one process of a COMM:PID job exited (wall clock, ns), if it did."""
        found = self._ended.get((host, job))
        return None if found is None else found[2]

    def forget_job(self, host: str, job: str) -> None:
        """The state of an ended one-process job is gone: its process is not looked up again."""
        with self._lock:
            found = self._ended.pop((host, job), None)
            if found is None:
                return
            pid, start_time, _ = found
            key = (host, pid, start_time)
            for table in (self._jobs, self._namespaces, self._teams):
                table.pop(key, None)
            if self._latest.get((host, pid)) == job:
                del self._latest[host, pid]

    def __len__(self) -> int:
        """Processes known."""
        return len(self._jobs)

    def job(self, host: str, pid: int, start_time: int) -> str | None:
        return self._jobs.get((host, pid, start_time))

    def namespace(self, host: str, pid: int, start_time: int) -> str | None:
        """The Kubernetes namespace of a process, if it runs in one."""
        return self._namespaces.get((host, pid, start_time))

    def team(self, host: str, pid: int, start_time: int) -> str | None:
        """The team a process's cost goes to ($GPUFLIGHT_TEAM in its environment), if any."""
        return self._teams.get((host, pid, start_time))

    def latest_job(self, host: str, pid: int) -> str | None:
        """The job of the latest process with this pid on `host` (NVML reports pids only)."""
        return self._latest.get((host, pid))


class DirectoryReader:
    """A thread consuming every partition of the processes topic into a `Directory`."""

    def __init__(self, bootstrap: str, topic: str, directory: Directory,
                 config: Mapping[str, str] | None = None) -> None:
        self.topic = topic
        self.directory = directory
        self._config = {
            "bootstrap.servers": bootstrap,
            "group.id": "gpuflight-streams-directory",  # required; offsets are never committed
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **(config or {}),
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="processes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(self._config)
        try:
            assigned = False
            while not self._stop.is_set():
                if not assigned:
                    metadata = consumer.list_topics(self.topic, timeout=5)
                    topic = metadata.topics.get(self.topic)
                    if topic is None or topic.error is not None or not topic.partitions:
                        self._stop.wait(1.0)
                        continue
                    consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                                     for p in topic.partitions])
                    assigned = True
                for message in consumer.consume(1000, timeout=0.5):
                    if message.error() is not None or message.value() is None:
                        continue  # tombstones of the compacted topic; transient errors
                    try:
                        record = wire.decode_process(message.value())
                    except wire.WireError:
                        self.directory.malformed += 1
                        continue
                    self.directory.add(record)
        except Exception as exc:
            log.error("processes topic reader stopped: %s", exc)
        finally:
            consumer.close()
