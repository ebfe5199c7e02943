"""Capture throughput: the highest launch rate captured with zero drops, on one core.

    sudo .venv/bin/python bench/capture_throughput.py [--rounds R] [--seconds S]

A C workload (bench/rate.c, through a runtime whose cudaLaunchKernel starts with
`push rbp`) makes launches at a stepped rate (calls/s; 0 = as fast as it can) on
one core, while a reader pinned to the other core captures them. One core making
probed calls cannot outrun the reader (every call traps), so the last step ("max x2")
adds a second workload at full speed on the reader's own core: the reader then
keeps up on what is left of its core.

- gpuflight: the producer's capture loop (producer.capture.Capture, `--pid` mode:
  bpf/cudart.bpf.c, bulk ring-buffer drain, enrichment) with a sink that counts;
- naive: the same BPF program, bcc's `open_ring_buffer` + `ring_buffer_consume`
  and a Python callback that decodes each event (ctypes).

A step counts as sustained when the kernel's drop counter (the `drops` map, slot 0)
did not move, the reader got every call the workload made (no user-space loss), and
what was left in the ring when the load stopped drained within 0.1 s (the reader kept
up rather than living off the ring's 380k events of slack). Both
readers drain on the same schedule (every 5 ms when idle) from the same 32 MiB ring.
Also measured per reader: its CPU use and RSS, BPF compile and attach time, and
its drain capacity (a burst of 300k events written while it is paused, then timed).
Readers run interleaved, R rounds; medians and the ratio within the run are printed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

READER_CPU = 0
WORKLOAD_CPU = 1
RATES = [200_000, 300_000, 400_000, 500_000, 600_000, 750_000, 1_000_000, 0]
#: The last step: one workload at full speed on each core, the reader's too, because
#: one core making probed calls cannot outrun the reader (each call traps).
BOTH_CORES = -1
#: Kept up: when the load stopped, what was left in the ring drained within this.
MAX_LAG_S = 0.1
BURST = 300_000
POLL_S = 0.005  # the producer's poll interval (CaptureSettings.poll_interval_s)


def build(out: Path) -> tuple[Path, Path]:
    lib = out / "libcudart.so.12"
    subprocess.run(["cc", "-O2", "-fno-omit-frame-pointer", "-fPIC", "-shared",
                    "-Wl,-soname,libcudart.so.12", "-o", str(lib), str(BENCH / "fakert.c")],
                   check=True)
    rate = out / "rate"
    subprocess.run(["cc", "-O2", "-o", str(rate), str(BENCH / "rate.c"), f"-L{out}",
                    "-l:libcudart.so.12", f"-Wl,-rpath,{out}"], check=True)
    with lib.open("rb") as f:  # the probed function must start like libcudart's
        from elftools.elf.elffile import ELFFile
        from elftools.elf.sections import SymbolTableSection

        elf = ELFFile(f)
        dynsym, text = elf.get_section_by_name(".dynsym"), elf.get_section_by_name(".text")
        assert isinstance(dynsym, SymbolTableSection) and text is not None
        sym = (dynsym.get_symbol_by_name("cudaLaunchKernel") or [])[0]
        f.seek(sym["st_value"] - text["sh_addr"] + text["sh_offset"])
        assert f.read(1) == b"\x55", "cudaLaunchKernel does not start with push rbp"
    return lib, rate


# -- the reader processes ----------------------------------------------------------


def _memory_kib() -> tuple[int, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _reply(**fields: Any) -> None:
    rss, hwm = _memory_kib()
    sys.stdout.write(json.dumps({**fields, "cpu_s": _cpu_s(), "rss_kib": rss,
                                 "hwm_kib": hwm}) + "\n")
    sys.stdout.flush()


class _GfEvent(ctypes.Structure):
    """struct gf_event, as a naive reader would declare it."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("tid", ctypes.c_uint32),
        ("api", ctypes.c_uint16), ("type", ctypes.c_uint8), ("flags", ctypes.c_uint8),
        ("result", ctypes.c_int32), ("duration_ns", ctypes.c_uint64),
        ("handle", ctypes.c_uint64), ("stream", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
        ("dim", ctypes.c_uint32 * 6),
    ]


class _Counter:
    """The gpuflight reader's sink: counts the workload's events, keeps nothing."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = np.array(pids, dtype=np.uint32)
        self.count = 0

    def write(self, events: npt.NDArray[np.void]) -> None:
        self.count += int(np.count_nonzero(np.isin(events["pid"], self.pids)))

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass


def reader(kind: str, pids: list[int], lib: str, pages: int) -> int:
    """A reader child: pinned to one core; answers stat/pause/resume/quit on stdin."""
    os.sched_setaffinity(0, {READER_CPU})
    from gpuflight.producer.capture import Capture
    from gpuflight.producer.settings import CaptureSettings

    settings = CaptureSettings(pids=frozenset(pids), ringbuf_pages=pages)
    counted = [0]
    capture: Capture | None = None
    t0 = time.perf_counter()
    if kind == "gpuflight":
        sink = _Counter(pids)
        capture = Capture(settings, [sink])
        t1 = time.perf_counter()
        capture.start()
        probes = sum(a.probes for a in capture.probes.attached.values())

        def drain() -> None:
            assert capture is not None
            capture.drain()
            counted[0] = sink.count

        def step() -> None:
            assert capture is not None
            capture.step()
            counted[0] = sink.count

        def kernel_drops() -> int:
            assert capture is not None
            return capture.drops().events
    else:
        from bcc import BPF  # the naive baseline is plain bcc

        # Its events in the ring alone: what a naive reader of it reads.
        naive = CaptureSettings(pids=frozenset(pids), ringbuf_pages=pages, cpu_slots=0)
        bpf: Any = BPF(src_file=str(settings.bpf_dir / "cudart.bpf.c").encode(),
                       cflags=naive.cflags())
        t1 = time.perf_counter()
        scope = bpf["scope_pids"]
        for pid in pids:
            scope[scope.Key(pid)] = scope.Leaf(1)
        bpf.attach_uprobe(name=lib.encode(), sym=b"cudaLaunchKernel",
                          fn_name=b"cudaLaunchKernel_entry")
        probes = 1
        decoded: list[tuple[int, ...]] = []

        def on_event(_ctx: Any, data: Any, _size: int) -> None:
            ev = ctypes.cast(data, ctypes.POINTER(_GfEvent)).contents
            record = (ev.ts_ns, ev.pid, ev.tid, ev.api, ev.type, ev.flags, ev.result,
                      ev.duration_ns, ev.handle, ev.stream, ev.bytes, *ev.dim)
            if record[1] in pids:
                counted[0] += 1
            decoded.append(record)
            if len(decoded) >= 65536:
                decoded.clear()

        bpf["events"].open_ring_buffer(on_event)

        def drain() -> None:
            bpf.ring_buffer_consume()

        def step() -> None:
            before = counted[0]
            bpf.ring_buffer_consume()
            if counted[0] == before:
                select.select([sys.stdin], [], [], POLL_S)

        def kernel_drops() -> int:
            table = bpf["drops"]
            return sum(int(v) for v in table[table.Key(0)])

    t2 = time.perf_counter()
    _reply(ready=True, compile_s=t1 - t0, attach_s=t2 - t1, probes=probes)
    paused = False
    while True:
        if not paused:
            step()
            if not select.select([sys.stdin], [], [], 0)[0]:
                continue
        words = sys.stdin.readline().split()
        if not words or words[0] == "quit":
            break
        if words[0] == "stat":
            drain()
            _reply(events=counted[0], drops=kernel_drops())
        elif words[0] == "pause":
            paused = True
            _reply(paused=True)
        elif words[0] == "resume":  # drain a known number of waiting events, timed
            target = counted[0] + int(words[1])
            c0, w0 = _cpu_s(), time.perf_counter()
            while counted[0] < target and time.perf_counter() - w0 < 60:
                drain()
            wall, cpu = time.perf_counter() - w0, _cpu_s() - c0
            paused = False
            _reply(events=counted[0], drops=kernel_drops(), drain_wall_s=wall,
                   drain_cpu_s=cpu)
    if capture is not None:
        capture.close()
    else:
        bpf.cleanup()
    return 0


# -- the driver --------------------------------------------------------------------


class Reader:
    def __init__(self, kind: str, pids: list[int], lib: Path, pages: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--reader", kind,
             *(f"--pid={pid}" for pid in pids), "--lib", str(lib),
             "--ring-buffer-pages", str(pages)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the reader exited")
        result: dict[str, Any] = json.loads(line)
        return result

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def quit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def workload_run(works: list[subprocess.Popen[str]], rate: float,
                 seconds: float) -> tuple[int, float]:
    """Run the workload processes at once; their calls in all, and the longest wall time."""
    for work in works:
        assert work.stdin is not None
        work.stdin.write(f"{rate} {seconds}\n")
        work.stdin.flush()
    total, longest = 0, 0.0
    for work in works:
        assert work.stdout is not None
        calls, ns = work.stdout.readline().split()
        total, longest = total + int(calls), max(longest, int(ns) / 1e9)
    return total, longest


def measure(kind: str, *, rate_bin: Path, lib: Path, pages: int, seconds: float,
            log: IO[str]) -> dict[str, Any]:
    works = [subprocess.Popen([str(rate_bin)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    work, shared = works
    os.sched_setaffinity(work.pid, {WORKLOAD_CPU})
    os.sched_setaffinity(shared.pid, {READER_CPU})
    reader_proc = Reader(kind, [work.pid, shared.pid], lib, pages)
    steps: list[dict[str, Any]] = []
    lossy = 0
    try:
        for rate in [*RATES, BOTH_CORES]:
            before = reader_proc.ask("stat")
            t0 = time.perf_counter()
            if rate == BOTH_CORES:  # a second workload on the reader's own core
                calls, wall = workload_run(works, 0, seconds)
            else:
                calls, wall = workload_run([work], rate, seconds)
            t1 = time.perf_counter()
            after = reader_proc.ask("stat")
            t2 = time.perf_counter()
            step = {
                "target": rate, "calls": calls, "rate": calls / wall,
                "events": after["events"] - before["events"],
                "kernel_drops": after["drops"] - before["drops"],
                "cpu": (after["cpu_s"] - before["cpu_s"]) / (t2 - t0),
                "lag_s": t2 - t1,
                "rss_mib": after["rss_kib"] / 1024,
            }
            step["lossless"] = (step["kernel_drops"] == 0 and step["events"] == calls
                                and step["lag_s"] < MAX_LAG_S)
            steps.append(step)
            label = {0: "max", BOTH_CORES: "max x2"}.get(rate, rate)
            print(f"  {kind:9} target {label:>9} achieved {step['rate']:>11,.0f}/s "
                  f"events {step['events']:>10,}/{calls:<10,} kernel drops "
                  f"{step['kernel_drops']:>9,} lag {step['lag_s']:.3f} s "
                  f"reader CPU {step['cpu']:.0%}", file=log, flush=True)
            lossy = 0 if step["lossless"] else lossy + 1
            if lossy == 2:
                break
        pre = reader_proc.ask("stat")
        reader_proc.ask("pause")
        calls, _ = workload_run([work], 0, -BURST)
        burst = reader_proc.ask(f"resume {calls}")
        end = reader_proc.ask("stat")
        print(f"  {kind:9} burst of {calls:,} drained in {burst['drain_wall_s']:.3f} s, "
              f"events {burst['events'] - pre['events']:,}, kernel drops "
              f"{burst['drops'] - pre['drops']:,}", file=log, flush=True)
    finally:
        reader_proc.quit()
        for each in works:
            assert each.stdin is not None
            each.stdin.close()
            each.wait()
    good = [s["rate"] for s in steps if s["lossless"]]
    best = max(good) if good else 0.0
    best_step = next((s for s in steps if s["lossless"] and s["rate"] == best), None)
    return {
        "steps": steps,
        "sustained": best,
        "cpu_at_sustained": best_step["cpu"] if best_step else float("nan"),
        "drain_rate": BURST / burst["drain_wall_s"],
        "drain_per_cpu_s": BURST / max(burst["drain_cpu_s"], 1e-9),
        "burst_lossless": burst["drops"] == pre["drops"]
        and burst["events"] - pre["events"] == BURST,
        "hwm_mib": end["hwm_kib"] / 1024,
        "compile_s": reader_proc.ready["compile_s"],
        "attach_s": reader_proc.ready["attach_s"],
        "probes": reader_proc.ready["probes"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="per rate step")
    parser.add_argument("--ring-buffer-pages", type=int, default=8192)
    parser.add_argument("--reader", choices=["gpuflight", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--pid", type=int, action="append", help=argparse.SUPPRESS)
    parser.add_argument("--lib", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        return reader(args.reader, args.pid, args.lib, args.ring_buffer_pages)
    if os.cpu_count() is None or (os.cpu_count() or 0) < 2:
        print("needs two cores: one for the reader, one for the workload", file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, Any]]] = {"gpuflight": [], "naive": []}
    with tempfile.TemporaryDirectory() as tmp:
        lib, rate_bin = build(Path(tmp))
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
            for kind, runs in results.items():
                runs.append(measure(kind, rate_bin=rate_bin, lib=lib,
                                    pages=args.ring_buffer_pages, seconds=args.seconds,
                                    log=sys.stderr))
                time.sleep(2)  # let the background probe release finish
    med = {kind: {key: statistics.median(r[key] for r in runs)
                  for key in ("sustained", "cpu_at_sustained", "drain_rate", "drain_per_cpu_s",
                              "hwm_mib", "compile_s", "attach_s")}
           for kind, runs in results.items()}
    ratios = [g["sustained"] / n["sustained"] if n["sustained"] else float("inf")
              for g, n in zip(results["gpuflight"], results["naive"], strict=True)]
    drain_ratios = [g["drain_rate"] / n["drain_rate"]
                    for g, n in zip(results["gpuflight"], results["naive"], strict=True)]
    rows = []
    for kind, m in med.items():
        rows.append([
            kind,
            " / ".join(f"{r['sustained']:,.0f}" for r in results[kind]),
            f"{m['sustained']:,.0f}", f"{m['cpu_at_sustained']:.0%}",
            f"{m['drain_rate']:,.0f}", f"{m['drain_per_cpu_s']:,.0f}",
            f"{m['hwm_mib']:.0f}", f"{m['compile_s']:.2f}", f"{m['attach_s'] * 1000:.0f}",
            results[kind][0]["probes"],
        ])
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, kernel "
          f"{platform.release()}, {time.strftime('%Y-%m-%d')}; reader on cpu {READER_CPU}, "
          f"workload on cpu {WORKLOAD_CPU} (a second on cpu {READER_CPU} at max x2); "
          f"{args.rounds} rounds x {args.seconds:g} s steps, "
          f"ring {args.ring_buffer_pages} pages; load average {os.getloadavg()[0]:.2f}")
    print(tabulate(rows, headers=[
        "reader", "max lossless events/s (rounds)", "median", "reader CPU there",
        f"drain of {BURST // 1000}k burst /s", "per CPU-s", "RSS max MiB", "compile s",
        "attach ms", "probes"]))
    print(f"gpuflight / naive, sustained lossless rate: per round "
          f"{', '.join(f'{r:.2f}x' for r in ratios)}; median {statistics.median(ratios):.2f}x")
    print(f"gpuflight / naive, drain capacity: per round "
          f"{', '.join(f'{r:.1f}x' for r in drain_ratios)}; "
          f"median {statistics.median(drain_ratios):.1f}x")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
