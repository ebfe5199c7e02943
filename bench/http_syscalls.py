"""What the HTTP capture adds to a read or write: bench/tcploop.c side by side, with and without
the programs of bpf/http.bpf.h attached (through bpf/http_proto.bpf.c).

    sudo .venv/bin/python bench/http_syscalls.py [--rounds R]

One C loop, pinned to cpu 1, ping-pongs SIZE bytes over a TCP loopback connection: per round
the accepted (server) side writes and reads once, the client side too: 4 syscalls. Each round
of the benchmark runs the loop in four set-ups, interleaved, and medians are taken per set-up:

  off          no program attached
  floor        an empty program on each of the same tracepoints (bench/empty_syscalls.bpf.c):
               what a syscall tracepoint costs before any of gpuflight's code runs
  other        programs attached, the loop's process out of scope: what every other process
               on the node pays
  in scope     in scope, the connection accepted before the capture knew the pid: the fd
               lookups that find nothing (files, pipes, client sockets of a process in scope)
  captured     in scope, the server side tracked: 2 of the 4 syscalls captured (a record each)

Per syscall: other and in-scope figures are (set-up - off) / 4; a captured syscall is
(captured - off - 2 * in-scope share) / 2. The ring is drained between runs; records and
drops are counted.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO)]

from gpuflight.producer.http import abi  # noqa: E402
from gpuflight.producer.probe.bpfsource import bundle  # noqa: E402
from gpuflight.producer.probe.btf import Btf, socket_offsets  # noqa: E402

LOOP_CPU = "1"
SETUPS = ("off", "floor", "other", "in scope", "captured")
TRACEPOINTS = re.findall(r"TRACEPOINT_PROBE\(syscalls, (\w+)\)",
                         (REPO / "bpf" / "http.bpf.h").read_text())


class Attached:
    """A loaded bcc program whose syscall tracepoints can be detached and attached again."""

    def __init__(self, bpf: Any) -> None:
        self.bpf = bpf
        self.attached = True

    def attach(self, on: bool) -> None:
        if on == self.attached:
            return
        for name in TRACEPOINTS:
            tp = f"syscalls:{name}".encode()
            if on:
                self.bpf.attach_tracepoint(tp=tp, fn_name=f"tracepoint__syscalls__{name}".encode())
            else:
                self.bpf.detach_tracepoint(tp)
        self.attached = on


def build(out: Path) -> Path:
    binary = out / "tcploop"
    subprocess.run(["cc", "-O2", "-o", str(binary), str(BENCH / "tcploop.c")], check=True)
    return binary


STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
#: Programs whose own run time is reported (the kernel's BPF statistics).
TIMED = ("sys_enter_write", "sys_exit_write", "sys_enter_read", "sys_exit_read")


def run_stats(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a loaded program, from its fdinfo."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text()
                  .splitlines() if ":" in line)
    return int(fields["run_time_ns"]), int(fields["run_cnt"])


class Loaded(Attached):
    def __init__(self, head: int) -> None:
        from bcc import BPF  # the bench loads the prototype program directly

        cflags = [f"-I{REPO / 'bpf'}", "-DGF_FILTER_PIDS=1", "-DGF_HTTP_RINGBUF_PAGES=16384",
                  *abi.head_cflags(head), *socket_offsets(Btf.from_file()).cflags()]
        super().__init__(BPF(text=bundle(REPO / "bpf" / "http_proto.bpf.c").encode(),
                             cflags=cflags))
        self.records = 0
        self.bpf[b"http_events"].open_ring_buffer(self._count)
        self.scope = self.bpf[b"scope_pids"]

    def _count(self, _ctx: Any, _data: Any, _size: int) -> None:
        self.records += 1

    def drain(self) -> int:
        self.records = 0
        self.bpf.ring_buffer_consume()
        return self.records

    def stats(self) -> dict[str, tuple[int, int]]:
        return {name: run_stats(self.bpf.funcs[f"tracepoint__syscalls__{name}".encode()].fd)
                for name in TIMED}

    def dropped(self) -> int:
        table = self.bpf[b"http_drops"]
        return sum(int(v) for v in table[table.Key(abi.DROP_RING)])


def run(loop: Path, iterations: int, size: int, setup: str, loaded: Loaded) -> float:
    mode = "early" if setup == "in scope" else "late"
    proc = subprocess.Popen(["taskset", "-c", LOOP_CPU, str(loop), str(iterations), str(size),
                             mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin and proc.stdout
    pid = int(proc.stdout.readline())
    if setup in ("in scope", "captured"):
        loaded.scope[loaded.scope.Key(pid)] = loaded.scope.Leaf(1)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    ns = float(proc.stdout.readline())
    proc.wait()
    if setup in ("in scope", "captured"):
        del loaded.scope[loaded.scope.Key(pid)]
    return ns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--head", type=int, default=abi.DEFAULT_HEAD)
    parser.add_argument("--sizes", default="64,4096")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("http_syscalls: run as root (it loads BPF programs)", file=sys.stderr)
        return 1
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        loop = build(Path(tmp))
        results: dict[tuple[int, str], list[float]] = {}
        records: dict[int, int] = {}
        from bcc import BPF

        floor = Attached(BPF(src_file=str(BENCH / "empty_syscalls.bpf.c").encode()))
        loaded = Loaded(args.head)
        expected = {size: 0 for size in sizes}
        before_stats = STATS.read_text().strip()
        STATS.write_text("1")
        program_ns: dict[tuple[int, str], list[float]] = {}
        for _ in range(args.rounds):
            for size in sizes:
                iterations = 50_000 if size <= 1024 else 20_000
                for setup in SETUPS:
                    floor.attach(setup == "floor")
                    loaded.attach(setup not in ("off", "floor"))
                    start = loaded.stats()
                    ns = run(loop, iterations, size, setup, loaded)
                    if setup in ("other", "captured"):
                        for name, (t1, c1) in loaded.stats().items():
                            t0, c0 = start[name]
                            if c1 > c0:
                                program_ns.setdefault((size, f"{setup}: {name}"), []).append(
                                    (t1 - t0) / (c1 - c0))
                    results.setdefault((size, setup), []).append(ns)
                    got = loaded.drain()
                    if setup == "captured":
                        records[size] = records.get(size, 0) + got
                        expected[size] += 2 * iterations + 2  # + the accept and the close
        dropped = loaded.dropped()
        STATS.write_text(before_stats)
    rows = []
    for size in sizes:
        med = {s: statistics.median(results[(size, s)]) for s in SETUPS}
        off = med["off"]
        untracked = (med["in scope"] - off) / 4
        captured = (med["captured"] - off - 2 * untracked) / 2
        rows.append([
            size, f"{off:,.0f}", f"{med['other']:,.0f}", f"{med['in scope']:,.0f}",
            f"{med['floor']:,.0f}", f"{med['captured']:,.0f}", f"{med['captured'] / off:.3f}x",
            f"{(med['floor'] - off) / 4:+.0f}", f"{(med['other'] - off) / 4:+.0f}",
            f"{untracked:+.0f}", f"{captured:+.0f}",
        ])
    print(f"{platform.node()} {platform.release()} {platform.processor() or platform.machine()}, "
          f"{args.rounds} rounds, head {args.head} bytes, medians; ns per round of 4 syscalls")
    print(tabulate(rows, headers=[
        "bytes", "off", "other", "in scope", "floor", "captured", "captured / off",
        "per syscall: floor", "other", "in scope", "captured"], tablefmt="github"))
    print(f"records captured: {records} of {expected}, dropped: {dropped}")
    print("\nEach program's own run time (kernel BPF statistics), ns per run, medians:")
    print(tabulate([[size, label, f"{statistics.median(v):,.0f}"]
                    for (size, label), v in sorted(program_ns.items())],
                   headers=["bytes", "set-up: program", "ns/run"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
