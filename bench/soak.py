"""Soak: the node agent and one stream worker under a steady mixed load, for --duration seconds.

Real Kafka, real InfluxDB, the real agent (`gpuflight producer`, bcc uprobes) and worker
(`gpuflight streams`). The load: short-lived CUDA processes on the simulated GPU's runtime (the
capture workload of tests/workloads, copied as `soakload` so its jobs are told from any other
CUDA process on the node), started at --rate a second, each with a random number of
iterations (launches, copies, memsets, syncs: a mixed load). Meanwhile:

- at 1/3 of the run Kafka goes away for --outage seconds (the agent buffers, then counts what
  it drops), and comes back;
- at 2/3 the worker is stopped with SIGKILL and started again (it recovers from its changelog).

Reported (JSON on stdout, a table on stderr):

- RSS and open file descriptors of the agent and the worker, sampled every 5 s, and their
  slope (least squares, per hour) after the first minute;
- accounting for the soak's jobs: launches the workload made (each process's are known
  exactly), launches in InfluxDB, events the pipeline counted lost (the agent's drops by job,
  events_lost, and the worker's events_uncounted) — "unaccounted" is what is in neither;
- after SIGTERM of the agent: no process left that holds its uprobes (bcc's uprobes are perf
  events, gone with the last process holding them: the agent and the probe releaser it forks),
  and none in tracefs's uprobe_events (where bcc names them after the agent's pid when it
  falls back to tracefs); the same after SIGKILL of a second agent, and how long the kernel
  took to end it (it releases the probes as the process exits).

Run as root (BPF), after scripts/setup test:  PYTHONPATH=. python bench/soak.py --duration 1800
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from gpuflight import stack
from gpuflight.demo.build import REAL_TIME
from tests.support.streams_support import StreamWorker, rows
from tests.workloads import build, expected

GPUFLIGHT = [sys.executable, "-m", "gpuflight"]
LOAD_NAME = "soakload"


@dataclass
class Sampler:
    """RSS (MiB) and open fds of a process over time; its slope after a warm-up."""

    name: str
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    #: The pid of each sample (the worker is restarted: two processes, each with its warm-up).
    pids: list[int] = field(default_factory=list)

    def sample(self, pid: int | None, t: float) -> None:
        if pid is None:
            return
        try:
            rss_kib = next(int(line.split()[1]) for line in
                           Path(f"/proc/{pid}/status").read_text().splitlines()
                           if line.startswith("VmRSS:"))
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, StopIteration):
            return
        self.samples.append((t, rss_kib / 1024, fds))
        self.pids.append(pid)

    def by_process(self, warmup_s: float) -> list[dict[str, float]]:
        """The summary of each process sampled, after its own warm-up (a restarted worker
        recovers its state from the changelog: a step, not a slope)."""
        out = []
        for pid in dict.fromkeys(self.pids):
            mine = [s for s, p in zip(self.samples, self.pids, strict=True) if p == pid]
            start = mine[0][0]
            part = Sampler(self.name, [(t - start, rss, fds) for t, rss, fds in mine])
            out.append({"pid": pid, "from_s": round(start), **part.summary(warmup_s)})
        return out

    def summary(self, warmup_s: float) -> dict[str, float]:
        kept = [s for s in self.samples if s[0] >= warmup_s]
        if len(kept) < 3:
            return {}
        t = np.array([s[0] for s in kept]) / 3600
        rss = np.array([s[1] for s in kept])
        fds = np.array([s[2] for s in kept], dtype=float)
        return {"rss_mib_first": round(float(rss[0]), 1), "rss_mib_last": round(float(rss[-1]), 1),
                "rss_mib_max": round(float(rss.max()), 1),
                "rss_mib_per_hour": round(float(np.polyfit(t, rss, 1)[0]), 2),
                "fds_first": int(fds[0]), "fds_last": int(fds[-1]), "fds_max": int(fds.max()),
                "fds_per_hour": round(float(np.polyfit(t, fds, 1)[0]), 2)}


def agent_pids(work: Path) -> list[int]:
    """The soak's agents and their probe releasers (forked from them: the same command line,
    which names the soak's directory) still on the node."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(work).encode() in cmdline and b"producer" in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if _alive(p)]
    return left


def uprobes_of(pids: list[int]) -> int:
    """uprobes the given agents registered that the kernel still has: bcc names each
    "..._bcc_PID" in tracefs's uprobe_events (other tracers' and other agents' are not
    counted)."""
    try:
        lines = Path("/sys/kernel/tracing/uprobe_events").read_text().splitlines()
    except OSError:
        return -1
    suffixes = tuple(f"_bcc_{pid}" for pid in pids)
    return sum(1 for line in lines if line.split(" ", 1)[0].endswith(suffixes))


def start_agent(bootstrap: str, status: Path, log: Path, prefix: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        agent = subprocess.Popen([*GPUFLIGHT, "producer", "--kafka", bootstrap,
                                  "--topic-prefix", prefix, "--status-file", str(status)],
                                 stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if status.exists() and json.loads(status.read_text() or "{}").get("state") == "ready":
            return agent
        if agent.poll() is not None:
            raise SystemExit(f"the agent exited: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    raise SystemExit("the agent was not ready within 180 s")


def wait_probed(status: Path, directory: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    log = status.with_suffix(".log")
    while time.monotonic() < deadline:
        skipped = [line for line in log.read_text(errors="replace").splitlines()
                   if f"skipping {directory}" in line]
        if skipped:
            raise SystemExit(f"soak: the agent could not probe the soak's runtime: {skipped[0]}")
        libraries = json.loads(status.read_text() or "{}").get("libraries", [])
        if any(lib["path"].startswith(str(directory)) and lib["kind"] == "runtime"
               for lib in libraries):
            return
        time.sleep(0.2)
    raise SystemExit(f"the agent did not probe the soak's runtime: {status.read_text()[-2000:]}")


def accounting(url: str, pids: set[int]) -> dict[str, int]:
    """The soak's processes in InfluxDB: by their job (soakload:PID), or, for a process whose
    identity the agent never read (gone before any scan saw it), unknown:PID."""

    def ours(job: str) -> str | None:
        kind, _, pid = job.partition(":")
        if kind in (LOAD_NAME, "unknown") and pid.isdigit() and int(pid) in pids:
            return kind
        return None

    out = {"influx_launches": 0, "influx_launches_without_identity": 0,
           "lost_by_agent": 0, "uncounted_by_worker": 0}
    for r in rows(url, "SELECT sum(count) AS n FROM launches GROUP BY job"):
        kind = ours(r["job"])
        if kind is not None:
            out["influx_launches"] += int(r["n"] or 0)
            if kind == "unknown":
                out["influx_launches_without_identity"] += int(r["n"] or 0)
    # events_lost holds counters since each agent started: the last value of each series.
    for r in rows(url, "SELECT last(dropped_kernel) AS k, last(dropped_user) AS u"
                       " FROM events_lost GROUP BY job"):
        if ours(r["job"]) is not None:
            out["lost_by_agent"] += int(r["k"] or 0) + int(r["u"] or 0)
    for r in rows(url, "SELECT sum(late_events) AS l, sum(future_events) AS f"
                       " FROM events_uncounted GROUP BY job"):
        if ours(r["job"]) is not None:
            out["uncounted_by_worker"] += int(r["l"] or 0) + int(r["f"] or 0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds (default 1800)")
    parser.add_argument("--rate", type=float, default=5.0, help="processes started a second")
    parser.add_argument("--max-iters", type=int, default=200, help="iterations a process, at most")
    parser.add_argument("--outage", type=float, default=40.0, help="Kafka outage, seconds")
    parser.add_argument("--exit-wait", type=float, default=120.0,
                        help="how long to wait for agents and their helpers to end, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    # SIGTERM (a timeout) ends the soak through its clean-up: no broker or database left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.geteuid() != 0:
        raise SystemExit("soak: run as root (the agent needs BPF)")

    work = Path(tempfile.mkdtemp(prefix="gpuflight-soak-"))
    # The workloads run on the simulated GPU on the wall clock (launches cost the CPU, syncs
    # wait), as its stub runtime always did before it became the simulated GPU's.
    os.environ.update(REAL_TIME)
    prefix = f"soak{os.getpid()}"
    rnd = random.Random(17)
    binary = build.build_capture(work / "bin", "stub")
    load = binary.with_name(LOAD_NAME)
    shutil.copy2(binary, load)

    kafka_dir, influx_dir = work / "kafka", work / "influx"
    port = stack.free_port()
    controller = stack.free_port(frozenset({port}))
    bootstrap = stack.kafka_up(kafka_dir, port, controller).bootstrap
    influx = stack.influx_up(influx_dir, stack.free_port())
    stack.create_database(influx.url, "gpuflight")
    worker = StreamWorker(bootstrap, influx.url, prefix, f"{prefix}-app", work, window_s=2.0,
                          grace_s=5.0)
    report: dict[str, Any] = {"machine": f"{platform.node()} {platform.platform()},"
                                         f" {os.cpu_count()} CPUs",
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "duration_s": args.duration, "rate_per_s": args.rate,
                              "outage_s": args.outage}
    agent: subprocess.Popen[bytes] | None = None
    holder: subprocess.Popen[bytes] | None = None
    running: list[tuple[subprocess.Popen[bytes], int]] = []
    pids: set[int] = set()
    try:
        agent_log, status = work / "agent.log", work / "agent.status"
        # One process that maps the runtime and waits: found by the agent's first scan, so the file
        # is probed before the short-lived ones start (each is then captured through the file's
        # probes, whether the agent ever scans it or not).
        holder = subprocess.Popen([str(load), "--iters", "0", "--start-delay-ms", "86400000"])
        agent = start_agent(bootstrap, status, agent_log, prefix)
        wait_probed(status, work / "bin")
        worker.start("w1")
        samplers = {"agent": Sampler("agent"), "worker": Sampler("worker")}
        launched = finished = failed = 0
        expected_launches = 0
        # InfluxDB's `launches` counts graph launches too (producer/contract/counting.py), under
        # their api.
        launch_types = ("launch", "graph_launch")
        per_iter = len([e for e in expected.capture_events(1, 1) if e["type"] in launch_types])
        per_zero = len([e for e in expected.capture_events(1, 0) if e["type"] in launch_types])
        t0 = time.monotonic()
        next_start = next_sample = 0.0
        outage_at, restart_at = args.duration / 3, 2 * args.duration / 3
        outage_done = restart_done = False
        kafka_back_at: float | None = None
        events: list[str] = []
        while (now := time.monotonic() - t0) < args.duration:
            if now >= next_start:
                iters = rnd.randint(1, args.max_iters)
                started = subprocess.Popen([str(load), "--iters", str(iters)],
                                           stdout=subprocess.DEVNULL)
                pids.add(started.pid)
                running.append((started, iters))
                launched += 1
                next_start += 1 / args.rate
            still = []
            for proc, iters in running:
                code = proc.poll()
                if code is None:
                    still.append((proc, iters))
                elif code == 0:
                    finished += 1
                    expected_launches += per_zero + (per_iter - per_zero) * iters
                else:
                    failed += 1
            running = still
            if now >= next_sample:
                samplers["agent"].sample(agent.pid, now)
                if worker.process is not None:
                    samplers["worker"].sample(worker.process.pid, now)
                next_sample += 5
            if not outage_done and now >= outage_at:
                stack.kafka_down(kafka_dir)
                events.append(f"{now:.0f} s: Kafka down")
                kafka_back_at = now + args.outage
                outage_done = True
            if kafka_back_at is not None and now >= kafka_back_at:
                stack.kafka_up(kafka_dir, port, controller)
                events.append(f"{time.monotonic() - t0:.0f} s: Kafka up")
                kafka_back_at = None
            if not restart_done and now >= restart_at:
                worker.kill()
                worker.start("w2")
                events.append(f"{now:.0f} s: worker killed (SIGKILL) and started again")
                restart_done = True
            time.sleep(0.01)
        for proc, iters in running:
            if proc.wait(120) == 0:
                finished += 1
                expected_launches += per_zero + (per_iter - per_zero) * iters
            else:
                failed += 1
        # The agent publishes what it holds, then stops (SIGTERM).
        time.sleep(3)
        agent.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        report["agent_sigterm_exit"] = agent.wait(args.exit_wait)
        report["agent_sigterm_exit_s"] = round(time.monotonic() - stopped_at, 1)
        # Every window closes (host time advances by the wall clock after --idle).
        settled, last = time.monotonic(), accounting(influx.url, pids)
        while time.monotonic() - settled < 20 and time.monotonic() - t0 < args.duration + 300:
            time.sleep(2)
            current = accounting(influx.url, pids)
            if current != last:
                settled, last = time.monotonic(), current
        report["accounting"] = {"processes_started": launched, "processes_ok": finished,
                                "processes_failed": failed,
                                "workload_launches": expected_launches, **last}
        report["accounting"]["unaccounted"] = (expected_launches - last["influx_launches"]
                                               - last["lost_by_agent"]
                                               - last["uncounted_by_worker"])
        print(f"soak: accounting {report['accounting']}", file=sys.stderr)
        # The agent has exited; the probe releaser it forked (same command line) holds its
        # uprobes until it has released them: every holder gone = no uprobe left.
        holders = agent_pids(work)
        report["after_sigterm"] = {"probe_holders": len(holders),
                                   "holders_left": wait_gone(holders, args.exit_wait),
                                   "tracefs_uprobes_left": uprobes_of([agent.pid])}
        print(f"soak: after SIGTERM {report['after_sigterm']}", file=sys.stderr)
        # A second agent, killed with SIGKILL once attached and capturing.
        killed = start_agent(bootstrap, work / "agent2.status", work / "agent2.log", prefix)
        wait_probed(work / "agent2.status", work / "bin")
        subprocess.run([str(load), "--iters", "3"], check=True, stdout=subprocess.DEVNULL)
        holders = [killed.pid, *agent_pids(work)]
        killed.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        # The kernel releases its probes as the process exits, one after another (slow on a
        # loaded machine): how long that took, or that it had not ended within the wait.
        try:
            killed.wait(args.exit_wait)
            exit_s: float | None = round(time.monotonic() - killed_at, 1)
        except subprocess.TimeoutExpired:
            exit_s = None
        report["after_sigkill"] = {"exit_s": exit_s,
                                   "holders_left": wait_gone(sorted(set(holders)), 10),
                                   "tracefs_uprobes_left": uprobes_of([killed.pid])}
        print(f"soak: after SIGKILL {report['after_sigkill']}", file=sys.stderr)
        report["samples"] = {name: s.summary(60.0) for name, s in samplers.items()}
        report["samples_by_process"] = {name: s.by_process(60.0) for name, s in samplers.items()}
        report["events"] = events
        report["worker_exit"] = worker.stop()
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(30)
        for proc, _ in running:
            proc.kill()
        if agent is not None and agent.poll() is None:
            agent.kill()
        worker.stop()
        stack.kafka_down(kafka_dir)
        stack.influx_down(influx_dir)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    table = [[k, v] for k, v in report["accounting"].items()]
    table += [[f"{name} {k}", v] for name, s in report["samples"].items() for k, v in s.items()]
    table += [[f"{name} pid {p['pid']} (from {p['from_s']} s) rss_mib_per_hour",
               p.get("rss_mib_per_hour")]
              for name, parts in report["samples_by_process"].items() for p in parts]
    table += [[f"after SIGTERM: {k}", v] for k, v in report["after_sigterm"].items()]
    table += [[f"after SIGKILL: {k}", v] for k, v in report["after_sigkill"].items()]
    print(tabulate(table, tablefmt="plain"), file=sys.stderr)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
