"""BPF program run time per call: the shipped probes against an empty program.

    sudo .venv/bin/python bench/probe_cost.py [--calls N] [--rounds R] [--baseline REV]

Wall-clock time per call (bench/overhead.py) moves with everything else on a shared
VM; the kernel's own BPF statistics (`kernel.bpf_stats_enabled=1`: `run_time_ns` and
`run_cnt` in each program's fdinfo) time only the program, so they say which part of
the per-call cost is gpuflight's code, and track it from one change to the next.

The C loop of bench/overhead.py (pinned to cpu 1) calls a runtime and a driver whose
functions start with `push rbp`; each program below is loaded from bpf/ with the
producer's node-wide cflags, attached alone, and timed while a reader on cpu 0 takes the
events out as the producer does (each CPU's buffer each ms, the ring in bulk each turn).
Rounds interleave the programs; medians.
The counting itself adds the same ~50 ns to every row. `--baseline REV` also times the launch
programs of bpf/ as it was at git revision REV, interleaved in the same rounds (its records
may have another size: the reader skips them, counted, as the producer would).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]

from overhead import READER_CPU, build, loop_args  # noqa: E402  (bench/ is on the path)

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")

#: label → (source, program, library, symbol, bench/overhead.py loop mode)
PROGRAMS: dict[str, tuple[Path, str, str, str, str]] = {
    "empty (the floor's program)": (BENCH / "empty.bpf.c", "empty", "libcudart.so.12",
                                    "cudaLaunchKernel", "launch"),
    "cudaLaunchKernel_entry": (REPO / "bpf" / "cudart.bpf.c", "cudaLaunchKernel_entry",
                               "libcudart.so.12", "cudaLaunchKernel", "launch"),
    "cudaMemcpyAsync_entry": (REPO / "bpf" / "cudart.bpf.c", "cudaMemcpyAsync_entry",
                              "libcudart.so.12", "cudaMemcpyAsync", "copies"),
    "cuLaunchKernel_entry (driver)": (REPO / "bpf" / "cudart.bpf.c", "cuLaunchKernel_entry",
                                      "libcuda.so.1", "cuLaunchKernel", "driver"),
}


def _run_stats(fd: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text()
                  .splitlines() if ":" in line)
    return int(fields["run_time_ns"]), int(fields["run_cnt"])


def add_baseline(rev: str, into: Path) -> None:
    """PROGRAMS gains the launch programs of bpf/ at git revision `rev` (exported to `into`)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "bpf"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for label in ("cudaLaunchKernel_entry", "cuLaunchKernel_entry (driver)"):
        _, program, library, symbol, mode = PROGRAMS[label]
        PROGRAMS[f"{label} @{rev}"] = (into / "bpf" / "cudart.bpf.c", program, library, symbol,
                                       mode)


def measure(label: str, calls_bin: Path, n: int) -> float:
    """ns per run of one program over one loop of n iterations."""
    from bcc import BPF

    from gpuflight.producer.capture import BATCH_EVENTS
    from gpuflight.producer.contract.abi import PROBES
    from gpuflight.producer.discover import attachplan
    from gpuflight.producer.probe.cpubuffers import MOVE_INTERVAL_S, CpuBuffers
    from gpuflight.producer.probe.ringbuf import RingBufferReader
    from gpuflight.producer.probe.uprobes import UprobeLinks
    from gpuflight.producer.settings import CaptureSettings

    source, program, library, symbol, mode = PROGRAMS[label]
    settings = CaptureSettings()
    cflags = [f if not f.startswith("-I") else f"-I{source.parent}" for f in settings.cflags()]
    bpf: Any = BPF(src_file=str(source).encode(), cflags=cflags)
    # As the producer attaches: the program a row runs (with attach cookies, its family's,
    # told the row by the cookie), at the offset its plan gives, through a BPF link.
    row = next((p for p in PROBES if f"{p.name}_entry" == program), None)
    cookie = 0
    if row is not None:
        program = row.program("entry", settings.attach_cookies)
        cookie = row.cookie if settings.attach_cookies else 0
    fn = bpf.load_func(program.encode(), BPF.KPROBE)
    path = str(calls_bin.parent / library)
    kind = "driver" if library.startswith("libcuda.") else "runtime"
    offset = attachplan.read_plan(path, kind, os.stat(path).st_size).offset(symbol)
    if offset is None:
        raise RuntimeError(f"{label}: no {symbol} in {path}")
    links = UprobeLinks(multi=False)  # a kprobe program as bcc loads it: the uprobe PMU
    link = links.attach(fn.fd, path, offset, retprobe=False, cookie=cookie)
    stop = threading.Event()
    reader = None
    if source.name == "cudart.bpf.c":
        ring = RingBufferReader(bpf["events"].map_fd, settings.ringbuf_bytes)
        # As the producer reads them: each CPU's buffer each ms (the mover), the ring each turn.
        cpus = None
        with contextlib.suppress(KeyError):  # none before Linux 5.12 or in an older baseline
            cpus = CpuBuffers.open(bpf["cpu_events"].map_fd, bpf["cpu_heads"].map_fd,
                                   settings.ncpus, settings.cpu_slots)

        def drain() -> None:
            turn = time.monotonic()
            while not stop.is_set():
                if cpus is not None:
                    cpus.take()
                if time.monotonic() >= turn:
                    while len(ring.drain(BATCH_EVENTS)) == BATCH_EVENTS:
                        pass
                    turn = time.monotonic() + settings.poll_interval_s
                time.sleep(MOVE_INTERVAL_S if cpus is not None else settings.poll_interval_s)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
    try:
        t0, c0 = _run_stats(fn.fd)
        subprocess.run(loop_args(calls_bin, n, mode), check=True, capture_output=True)
        t1, c1 = _run_stats(fn.fd)
    finally:
        stop.set()
        if reader is not None:
            reader.join()
            ring.close()
            if cpus is not None:
                cpus.close()
        links.detach(link)
        bpf.cleanup()
    if c1 - c0 < n:
        raise RuntimeError(f"{label}: {c1 - c0} runs for {n} calls")
    return (t1 - t0) / (c1 - c0)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", metavar="REV",
                        help="also time the launch programs of bpf/ at this git revision")
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(READER_CPU)})
    before = STATS.read_text().strip()
    STATS.write_text("1")
    samples: dict[str, list[float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.baseline:
                add_baseline(args.baseline, Path(tmp) / "baseline")
            samples = {label: [] for label in PROGRAMS}
            calls_bin = build(Path(tmp))
            for _ in range(args.rounds):
                for label in PROGRAMS:
                    samples[label].append(measure(label, calls_bin, args.calls))
    finally:
        STATS.write_text(before)
    floor = statistics.median(samples["empty (the floor's program)"])
    rows = [[label, f"{statistics.median(v):.0f}",
             " / ".join(f"{x:.0f}" for x in v), f"{statistics.median(v) - floor:+.0f}"]
            for label, v in samples.items()]
    print(f"machine: {platform.node()} {platform.machine()}, kernel {platform.release()}, "
          f"{time.strftime('%Y-%m-%d')}, {args.calls:,} calls x {args.rounds} rounds, medians")
    print(tabulate(rows, headers=["program", "ns/run", "rounds", "vs empty"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
