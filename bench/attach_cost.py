"""What the kernel takes to attach and release uprobes, by the way they are attached.

    sudo .venv/bin/python bench/attach_cost.py [--probes N] [--rounds R] [--holder import|plain]

N uprobes on N functions of the simulated GPU's runtime (gpuflight/simgpu, libcudart.so.13),
while a process maps it and waits, each way producer/probe/probes.py can attach (UprobeLinks):

  perf PMU         perf_event_open(2) of a uprobe, then a BPF link (kernels before 6.6)
  uprobe_multi     a BPF uprobe_multi link per probe (6.6+: what gpuflight uses)

and then released: one after another (what a process exiting does), or 32 at a time (what
gpuflight's releaser does). Each is timed on a quiet kernel, and while another process releases
200 perf-PMU uprobes one after another (`busy`: what the releaser of an earlier trace, or an
earlier gpuflight, left the kernel doing; a test suite or a node running one traced job after
another is in that state). `--holder import` (default) is the process PyTorch makes of a
start-up, `import torch` on the simulated GPU (the frameworks venv of scripts/setup-frameworks,
or $GF_FRAMEWORKS_PYTHON): the case of a traced PyTorch program, held while its runtime is
attached; `plain` is a small C-free Python that maps the file alone. Rounds alternate the ways;
medians. The program attached is bench/empty.bpf.c's.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tabulate import tabulate

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO)]

from gpuflight.producer.discover import elfsyms  # noqa: E402  (the repository is on the path)
from gpuflight.producer.probe.bpfload import BPF_TRACE_UPROBE_MULTI  # noqa: E402
from gpuflight.producer.probe.uprobes import UprobeLinks  # noqa: E402

WAYS = {"perf PMU": False, "uprobe_multi": True}
HOLD = "import os, sys; {setup}; os.write(1, b'ready\\n'); sys.stdin.read()"


def frameworks_python() -> str:
    env = os.environ.get("GF_FRAMEWORKS_PYTHON")
    path = Path(env) if env else REPO / ".cache" / "frameworks" / "venv" / "bin" / "python"
    if not path.is_file():
        sys.exit("no frameworks venv: run scripts/setup-frameworks, set GF_FRAMEWORKS_PYTHON, "
                 "or use --holder plain")
    return str(path)


def holder(kind: str, library: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A process that maps `library` and waits (until its stdin closes)."""
    if kind == "import":
        argv = [frameworks_python(), "-c", HOLD.format(
            setup="import torch; torch.ones(4, device='cuda')")]
    else:
        argv = [sys.executable, "-c", HOLD.format(
            setup=f"import ctypes; ctypes.CDLL({str(library)!r})")]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    if proc.stdout.readline() != b"ready\n":
        sys.exit(f"the holder ({kind}) did not start")
    return proc


def offsets(library: Path, n: int) -> list[int]:
    """File offsets of n functions of the library, spread over its exports."""
    addresses = elfsyms.function_addresses(str(library), _exported(library))
    unique = sorted(set(addresses.values()))
    chosen = unique[:: max(1, len(unique) // n)][:n]
    found = [elfsyms.vaddr_to_file_offset(str(library), address) for address in chosen]
    return [o for o in found if o is not None]


def _exported(library: Path) -> frozenset[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True,
                         text=True, check=True).stdout
    return frozenset(f[2].split("@", 1)[0] for f in (line.split() for line in out.splitlines())
                     if len(f) == 3 and f[1] in "Tt")


def releasing(library: Path, where: list[int]) -> subprocess.Popen[bytes]:
    """Another process that attached 200 perf-PMU uprobes and releases them one by one."""
    proc = subprocess.Popen([sys.executable, __file__, "--release-perf", str(library),
                             *map(str, where)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    if proc.stdout.readline() != b"releasing\n":
        sys.exit("the releasing process did not start")
    return proc


def release_perf(library: str, where: list[int]) -> None:
    """(--release-perf) Attach 200 perf-PMU uprobes, say so, and close them one by one."""
    from bcc import BPF

    bpf: Any = BPF(src_file=str(BENCH / "empty.bpf.c").encode())
    prog = bpf.load_func(b"empty", BPF.KPROBE).fd
    links = UprobeLinks(multi=False)
    fds = [links.attach(prog, library, where[i % len(where)], retprobe=bool(i // len(where) % 2))
           for i in range(200)]
    os.write(1, b"releasing\n")
    for fd in fds:
        os.close(fd)
    os._exit(0)


def one_way(multi: bool, library: Path, where: list[int], bpf: Any) -> dict[str, float]:
    """Attach one probe at each offset, release them one after another; then again, released
    32 at a time. Seconds each."""
    from bcc import BPF

    links = UprobeLinks(multi=multi)
    name = b"empty_multi" if multi else b"empty"
    prog = bpf.load_func(name, BPF.KPROBE,
                         attach_type=BPF_TRACE_UPROBE_MULTI if multi else -1).fd
    times: dict[str, float] = {}
    for release in ("one after another", "32 at a time"):
        started = time.perf_counter()
        fds = [links.attach(prog, str(library), offset, retprobe=False) for offset in where]
        times["attach"] = times.get("attach", 0.0) + (time.perf_counter() - started) / 2
        started = time.perf_counter()
        if release == "32 at a time":
            with ThreadPoolExecutor(max_workers=32) as pool:
                list(pool.map(os.close, fds))
        else:
            for fd in fds:
                os.close(fd)
        times[f"release, {release}"] = time.perf_counter() - started
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--holder", choices=("import", "plain"), default="import")
    parser.add_argument("--release-perf", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.release_perf:
        release_perf(args.release_perf[0], [int(o) for o in args.release_perf[1:]])
    if os.geteuid() != 0:
        sys.exit("attach_cost needs root (BPF): run it with sudo")
    from bcc import BPF

    from gpuflight.simgpu.build import build

    print(f"{platform.node()} Linux {platform.release()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with tempfile.TemporaryDirectory(prefix="gf-attach-") as tmp:
        sim = build(Path(tmp) / "simgpu")
        library = Path(sim.env(devices=1)["LD_PRELOAD"].split()[0])
        env = {**os.environ, **sim.env(devices=1, counts=Path(tmp) / "counts.json")}
        where = offsets(library, args.probes)
        bpf: Any = BPF(src_file=str(BENCH / "empty.bpf.c").encode())
        proc = holder(args.holder, library, env)
        try:
            results: dict[str, list[dict[str, float]]] = {
                f"{way}, {state}": [] for state in ("quiet", "busy") for way in WAYS}
            for r in range(args.rounds):
                order = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))
                for way in order:
                    results[f"{way}, quiet"].append(one_way(WAYS[way], library, where, bpf))
                    busy = releasing(library, where)
                    try:
                        results[f"{way}, busy"].append(one_way(WAYS[way], library, where, bpf))
                    finally:
                        busy.kill()
                        busy.communicate()
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            bpf.cleanup()
    n = len(where)
    rows = []
    for way, runs in results.items():
        row = [way]
        for key in ("attach", "release, one after another", "release, 32 at a time"):
            median = statistics.median(run[key] for run in runs)
            row.append(f"{median:.3f} s ({median / n * 1000:.2f} ms a probe)")
        rows.append(row)
    print(f"\n{n} probes on {library.name}, mapped by the holder ({args.holder}); median of "
          f"{args.rounds} rounds:\n")
    print(tabulate(rows, headers=["way", "attach", "release, one after another",
                                  "release, 32 at a time"], tablefmt="github"))


if __name__ == "__main__":
    main()
