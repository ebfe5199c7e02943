"""How far above the floor any per-call recorder sits here: the least recorders against gpuflight.

    sudo .venv/bin/python bench/lower_bound.py [--calls N] [--rounds R]

The C loop of bench/overhead.py calls NVIDIA's own libcuda 535 `cuLaunchKernel` (without a
GPU each call fails at once). Each round, interleaved: no probe; an empty program where
gpuflight attaches (the floor: the `je` after the entry's `cmp`, through a uprobe_multi link
as gpuflight attaches); the least recorders (bench/least_record.bpf.c: the clock, the stacked
arguments in one read, an 88-byte event, no filter and no lookup) writing into the ring, and
into a slot of the CPU's buffer as gpuflight's programs do, each drained every millisecond on
the other CPU by the producer's readers, every event counted; and `gpuflight trace` as
shipped. Between runs the loop is run until it is back at its untraced
speed, so that no run pays for probes an earlier one is still releasing.

Besides the medians, each column's ratio to the floor of its own round, as a median and a
range: the floor itself moves by a fifth from round to round on a shared VM.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]

from overhead import (  # noqa: E402  (bench/ is on the path)
    LOOP_CPU,
    NVIDIA_LIBCUDA,
    READER_CPU,
    build,
    nvidia_probe_offset,
    run_calls,
    run_gpuflight,
)

MODE = "nvidia"
SYMBOL = "cuLaunchKernel"
#: The untraced loop is ~20-30 ns a call: above this, a probe is still attached.
UNTRACED_NS = 100.0
SETTLE_S = 90.0


def settle(calls: Path) -> None:
    """Until the untraced loop runs at its own speed again (a probe being released still
    fires): a release takes the kernel up to ~100 ms a probe."""
    deadline = time.monotonic() + SETTLE_S
    while run_calls(calls, 100_000, MODE) > UNTRACED_NS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the loop is still probed {SETTLE_S:.0f} s after a run")
        time.sleep(0.5)


class Programs:
    """bench/least_record.bpf.c loaded for uprobe_multi links, its ring and CPU buffers read
    as the producer reads them."""

    def __init__(self) -> None:
        from bcc import BPF

        from gpuflight.producer.discover import elfsyms
        from gpuflight.producer.probe.bpfload import BPF_TRACE_UPROBE_MULTI, possible_cpus
        from gpuflight.producer.probe.cpubuffers import CpuBuffers
        from gpuflight.producer.probe.ringbuf import RingBufferReader
        from gpuflight.producer.probe.uprobes import UprobeLinks

        ncpus = possible_cpus()
        self.bpf: Any = BPF(src_file=str(BENCH / "least_record.bpf.c").encode(),
                            cflags=[f"-I{REPO / 'bpf'}", f"-DGF_NCPUS={ncpus}"])
        self.links = UprobeLinks(multi=True)
        self.fds = {name: self.bpf.load_func(name.encode(), BPF.KPROBE,
                                             attach_type=BPF_TRACE_UPROBE_MULTI).fd
                    for name in ("empty_multi", "least_record", "least_record_cpu")}
        self.ring = RingBufferReader(self.bpf["events"].map_fd, 4096 * 4096)
        self.cpus = CpuBuffers.open(self.bpf["cpu_events"].map_fd,
                                    self.bpf["cpu_heads"].map_fd, ncpus, 4096)
        self.path = str(NVIDIA_LIBCUDA.resolve())
        entry = elfsyms.vaddr_to_file_offset(
            self.path, elfsyms.function_addresses(self.path, frozenset({SYMBOL}))[SYMBOL])
        assert entry is not None
        self.offset = entry + nvidia_probe_offset(SYMBOL)

    @contextlib.contextmanager
    def attached(self, name: str) -> Iterator[list[int]]:
        """`name` attached where gpuflight attaches; with the ring's reader running (the
        events it took, in the list yielded) for the recorder."""
        link = self.links.attach(self.fds[name], self.path, self.offset, retprobe=False)
        taken = [0]
        stop = threading.Event()

        def drain() -> None:
            while not stop.wait(0.001):
                taken[0] += len(self.ring.drain()) + len(self.cpus.take())

        reader = threading.Thread(target=drain)
        reader.start()
        try:
            yield taken
        finally:
            os.close(link)
            stop.set()
            reader.join()
            taken[0] += len(self.ring.drain()) + len(self.cpus.take())

    def unplaced(self) -> int:
        """Events the per-CPU recorder could not place (its buffer and the ring full)."""
        return int(self.bpf["unplaced"][0].value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if not NVIDIA_LIBCUDA.exists():
        print(f"{NVIDIA_LIBCUDA} is not unpacked (scripts/setup)", file=sys.stderr)
        return 1
    os.sched_setaffinity(0, {int(READER_CPU)})  # the loop runs on LOOP_CPU
    programs = Programs()
    columns = ["no probe", "empty (floor)", "least recorder, ring",
               "least recorder, CPU buffer", "gpuflight"]
    samples: dict[str, list[float]] = {column: [] for column in columns}
    with tempfile.TemporaryDirectory() as tmp:
        calls = build(Path(tmp))
        for round_ in range(args.rounds):
            samples["no probe"].append(run_calls(calls, args.calls, MODE))
            for column, name in (("empty (floor)", "empty_multi"),
                                 ("least recorder, ring", "least_record"),
                                 ("least recorder, CPU buffer", "least_record_cpu")):
                unplaced = programs.unplaced()
                with programs.attached(name) as taken:
                    samples[column].append(run_calls(calls, args.calls, MODE))
                settle(calls)
                lost = programs.unplaced() - unplaced
                if name != "empty_multi" and (taken[0] != args.calls or lost):
                    raise RuntimeError(f"{column}: {taken[0]:,} of {args.calls:,} events "
                                       f"read, {lost:,} not placed")
            ns, events, dropped = run_gpuflight(calls, args.calls, MODE)
            if events != args.calls or dropped:
                raise RuntimeError(f"gpuflight kept {events:,} of {args.calls:,} events "
                                   f"({dropped:,} dropped)")
            samples["gpuflight"].append(ns)
            settle(calls)
            print(f"round {round_ + 1}: " + ", ".join(
                f"{column} {values[-1]:.0f}" for column, values in samples.items()),
                  file=sys.stderr, flush=True)
    floor = samples["empty (floor)"]
    rows = []
    for column in columns:
        ratios = [value / base for value, base in zip(samples[column], floor, strict=True)]
        rows.append([column, f"{statistics.median(samples[column]):.0f}",
                     f"{min(samples[column]):.0f}-{max(samples[column]):.0f}",
                     f"{statistics.median(ratios):.2f}x",
                     f"{min(ratios):.2f}-{max(ratios):.2f}x"])
    print(f"{platform.node()} · {platform.release()} · {os.cpu_count()} CPUs · "
          f"{args.calls:,} calls x {args.rounds} rounds · loop on cpu {LOOP_CPU}, "
          f"readers on cpu {READER_CPU} · {time.strftime('%Y-%m-%d')}")
    print(tabulate(rows, headers=["column", "ns a call (median)", "range",
                                  "vs its round's floor (median)", "range"],
                   tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
