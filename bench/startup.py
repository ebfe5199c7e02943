"""Start-up cost: a PyTorch program alone and under `gpuflight trace`, and the CPU the node
agent spends on each new library file.

    sudo .venv/bin/python bench/startup.py [--rounds R] [--scripts import,mlp] [--baseline REV]
        [--no-trace] [--no-files] [--verdict-cache warm|off|both]

Wall time: real PyTorch (the frameworks venv of scripts/setup-frameworks, or
$GF_FRAMEWORKS_PYTHON) on the simulated GPU (gpuflight/simgpu), two programs:

  import   python -c 'import torch; torch.ones(1024, device="cuda") * 2'
  mlp      tests/frameworks/compile_mlp.py (torch.compile max-autotune of a small MLP, fresh
           Inductor and Triton caches each run)

run alone and under `gpuflight trace`, alternating (which goes first alternates too), R
rounds; the table gives the median of each and their ratio. The traced runs use a cache
folder of their own (GPUFLIGHT_CACHE_DIR: the library verdicts and the compiled BPF program),
filled by one untimed traced run first, as every run after a machine's first finds it
(`--verdict-cache off`: classify every file and compile the program each run; `both`: the
two side by side).

Per new library file: the CPU time (this thread's) that classifying a file the agent has not
seen costs — what discovery reads (the runtime and driver functions it defines, and, for a
runtime, the ones its code calls: the part a held process waits for) — then what kernel
naming reads (nvcc's `__handle` statics, read once the process runs again) and every
function by address (naming's fallback, at a launch), for libtorch_cuda.so, libtorch_cpu.so,
libcublasLt.so.13, libnccl.so.2, libnvshmem_host.so.3 and a generated library with a 48 MB
.symtab of 2 million symbols (issue 17, defect 6). With `--baseline REV` the same runs in a
`git archive` of REV too, side by side in fresh interpreters.

Classification from the verdict cache (producer/verdictcache.py, issue 14): the files a PyTorch
start-up maps (those `import torch` maps, and every shared object under torch/lib and
nvidia/) classified by procmaps.scan in fresh interpreters with the cache off, with an empty
cache (the first run: it saves what it learned), and with that saved cache (every later run).
`--no-files` skips the per-file table.

Needs root (BPF) for the traced runs; the per-file figures need none (`--no-trace`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
IMPORT_SCRIPT = 'import torch; torch.ones(1024, device="cuda") * 2'
FILES = (
    "torch/lib/libtorch_cuda.so",
    "torch/lib/libtorch_cpu.so",
    "nvidia/cu13/lib/libcublasLt.so.13",
    "nvidia/nccl/lib/libnccl.so.2",
    "nvidia/nvshmem/lib/libnvshmem_host.so.3",
)
BIG_SYMTAB = "generated: 2M-symbol .symtab"


def frameworks_python() -> Path:
    env = os.environ.get("GF_FRAMEWORKS_PYTHON")
    path = Path(env) if env else ROOT / ".cache" / "frameworks" / "venv" / "bin" / "python"
    if not path.is_file():
        sys.exit("no frameworks venv: run scripts/setup-frameworks or set GF_FRAMEWORKS_PYTHON")
    return path


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )
    return Path(out.stdout.strip())


# --- wall time ---------------------------------------------------------------------------------


def command(script: str, python: Path) -> list[str]:
    if script == "import":
        return [str(python), "-c", IMPORT_SCRIPT]
    # max-autotune: the matmuls go through Triton templates (cuBLAS cannot start on the
    # simulated GPU).
    return [str(python), str(ROOT / "tests" / "frameworks" / "compile_mlp.py"), "max-autotune"]


#: What trace's summary says of the command: its own wall time (exec to exit), and its holds.
_COMMAND_TIME = re.compile(r"\(([0-9.]+) s, \d+ process\(es\)")
_HOLDS = re.compile(r"held while probing: (\d+) time\(s\), ([0-9.]+) s in all, longest (\d+) ms")
#: Per traced run: (the command's own seconds, holds, seconds held, longest hold in ms).
TRACED_DETAILS: dict[str, list[tuple[float, int, float, int]]] = {}
#: Per traced variant ("script, variant"): its wall times by whether the run just before it
#: was traced too (a trace's end leaves the kernel releasing its probes for a while).
AFTER_TRACED: dict[str, dict[bool, list[float]]] = {}


def timed(argv: list[str], env: dict[str, str], traced: bool, tmp: Path,
          variant: str = "") -> float:
    """Wall seconds of `argv`, alone or under `gpuflight trace` (its verdict cache: env's
    GPUFLIGHT_CACHE_DIR); a traced run's own figures go to TRACED_DETAILS[variant]."""
    run_env = dict(env)
    cache = Path(tempfile.mkdtemp(dir=tmp))
    run_env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    run_env["TRITON_CACHE_DIR"] = str(cache / "triton")
    # The command's environment (LD_PRELOAD of the simulated GPU) reaches it through env, not
    # gpuflight's own Python, and alone the same command runs: the two differ by `trace` only.
    argv = ["env", f"LD_PRELOAD={run_env.pop('LD_PRELOAD')}", *argv]
    if traced:
        run_env["PYTHONPATH"] = str(ROOT)
        argv = [sys.executable, "-m", "gpuflight", "trace", "--", *argv]
    started = time.perf_counter()
    proc = subprocess.run(argv, env=run_env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:6])}… failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if traced and variant:
        own = _COMMAND_TIME.search(proc.stderr)
        holds = _HOLDS.search(proc.stderr)
        TRACED_DETAILS.setdefault(variant, []).append((
            float(own.group(1)) if own else float("nan"),
            int(holds.group(1)) if holds else 0,
            float(holds.group(2)) if holds else 0.0,
            int(holds.group(3)) if holds else 0,
        ))
    return elapsed


def wall_times(
    scripts: list[str], rounds: int, python: Path, tmp: Path, caches: list[str]
) -> dict[str, dict[str, list[float]]]:
    """Per script: the wall times alone and traced with each verdict cache in `caches`:
    "warm" (one of our own, filled by an untimed traced run first) or "off"; never the
    machine's. Which variant goes first rotates from round to round."""
    from gpuflight.simgpu.build import build

    sim = build(tmp / "simgpu")
    env = {**os.environ, **sim.env(devices=1, counts=tmp / "counts.json")}
    # Python's compiled modules as an installed gpuflight has them (a shell that says
    # PYTHONDONTWRITEBYTECODE would make each traced run compile gpuflight's sources again).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    envs = {"alone": env}
    for cache in caches:
        folder = str(tmp / "verdicts") if cache == "warm" else "off"
        envs[f"traced, cache {cache}"] = {**env, "GPUFLIGHT_CACHE_DIR": folder}
    results: dict[str, dict[str, list[float]]] = {}
    for script in scripts:
        argv = command(script, python)
        timed(argv, env, False, tmp)  # warm the page cache: the first run reads 6 GB of wheels
        if "warm" in caches:
            timed(argv, envs["traced, cache warm"], True, tmp)  # fills the verdict cache
        times: dict[str, list[float]] = {variant: [] for variant in envs}
        variants = list(envs)
        previous_traced = "warm" in caches
        for i in range(rounds):
            for variant in variants[i % len(variants):] + variants[:i % len(variants)]:
                t = timed(argv, envs[variant], variant != "alone", tmp, f"{script}, {variant}")
                times[variant].append(t)
                if variant != "alone":
                    AFTER_TRACED.setdefault(f"{script}, {variant}", {True: [], False: []})[
                        previous_traced].append(t)
                previous_traced = variant != "alone"
                print(f"  {script} {variant:<20} {t:7.2f} s", file=sys.stderr)
        results[script] = times
    return results


# --- CPU per new library file -------------------------------------------------------------------

_FILE_COSTS = r"""
import json, os, sys, time
from gpuflight.producer.discover import procmaps, elfsyms
from gpuflight.producer.contract.abi import RUNTIME_NAME_FUNCTIONS
out = {}
# As discovery asks (a tree from before the rule reads .symtab always).
unless = getattr(discover, "_DYNAMIC_RUNTIME_MARKERS", None)
for label, path in json.loads(sys.argv[1]):
    elfsyms.clear_cache()
    started = time.thread_time()
    wanted = procmaps.RUNTIME_SYMBOLS | procmaps.DRIVER_SYMBOLS
    if unless is None:
        found = elfsyms.defined_functions(path, wanted)
    else:
        found = elfsyms.defined_functions(path, wanted, unless)
    called = None
    if found & procmaps.RUNTIME_SYMBOLS and hasattr(elfsyms, "referenced_functions"):
        wanted = procmaps.RUNTIME_SYMBOLS | RUNTIME_NAME_FUNCTIONS
        called = elfsyms.referenced_functions(path, wanted)
    classify = time.thread_time() - started
    started = time.thread_time()
    statics = elfsyms.local_statics(path, "__handle")
    statics_cpu = time.thread_time() - started
    started = time.thread_time()
    elfsyms.file_offset_to_vaddr(path, 0)  # every function, by address (naming fallback)
    out[label] = {
        "cpu_s": classify,
        "statics_cpu_s": statics_cpu,
        "table_cpu_s": time.thread_time() - started,
        "mb": os.path.getsize(path) / 1e6,
        "runtime_functions": len(found & procmaps.RUNTIME_SYMBOLS),
        "probed": None if called is None else len(called),
        "handle_statics": 0 if statics is None else len(statics.objects),
    }
print(json.dumps(out))
"""


def big_symtab(path: Path, symbols: int = 2_000_000) -> Path:
    """A shared object whose .symtab holds `symbols` functions (24 bytes each) and one
    cudaMalloc: the shape of the file in issue 17, defect 6."""
    import numpy as np

    sym = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                    ("value", "<u8"), ("size", "<u8")])
    table = np.zeros(symbols + 3, sym)
    strings = b"\0filler_function\0cudaMalloc\0_ZZ4stubvE8__handle\0"
    table["name"][1:-2] = 1
    table["name"][-2] = 17
    table["name"][-1] = 28
    table["info"][-1] = 0x11  # global object: nvcc's __handle static
    table["info"][1:-1] = 0x12  # global function
    table["shndx"][1:] = 1
    table["value"][1:] = np.arange(symbols + 2, dtype=np.uint64) * 16 + 0x1000
    body = bytearray(64)
    strtab_at = len(body)
    body += strings + b"\0" * (-len(strings) % 8)
    symtab_at = len(body)
    body += table.tobytes()
    shoff = len(body)
    body += bytes(64)
    body += struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, strtab_at, len(strings), 0, 0, 1, 0)
    body += struct.pack("<IIQQQQIIQQ", 0, 2, 0, 0, symtab_at, table.nbytes, 1, 0, 8, 24)
    body[:64] = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 3, 62, 1,
                            0, 0, shoff, 0, 64, 56, 0, 64, 3, 0)
    path.write_bytes(bytes(body))
    return path


def file_costs(tree: Path, files: list[tuple[str, str]], rounds: int) -> dict[str, Any]:
    """Per file: the median CPU over `rounds` fresh interpreters running `tree`'s code."""
    runs: list[dict[str, Any]] = []
    for _ in range(rounds):
        proc = subprocess.run(
            [sys.executable, "-c", _FILE_COSTS, json.dumps(files)],
            env={**os.environ, "PYTHONPATH": str(tree)},
            cwd=tree,  # -c puts the working directory first on sys.path
            capture_output=True, text=True, check=True,
        )
        runs.append(json.loads(proc.stdout))
    merged: dict[str, Any] = {}
    for label in runs[0]:
        merged[label] = dict(runs[0][label])
        for key in ("cpu_s", "statics_cpu_s", "table_cpu_s"):
            merged[label][key] = statistics.median(r[label][key] for r in runs)
    return merged


# --- classification from the verdict store (producer/verdictcache.py) -----------------------------

_STORE_COSTS = r"""
import json, sys, time
from pathlib import Path
from gpuflight.producer.discover import procmaps
proc, cache = sys.argv[1], sys.argv[2]
wall, cpu = time.perf_counter(), time.thread_time()
store = procmaps.open_verdict_store(Path(cache) if cache else None)
load = (time.perf_counter() - wall, time.thread_time() - cpu)
wall, cpu = time.perf_counter(), time.thread_time()
found = procmaps.scan(Path(proc), cache=procmaps.Classifier(store=store)).libraries
scan = (time.perf_counter() - wall, time.thread_time() - cpu)
wall, cpu = time.perf_counter(), time.thread_time()
store.save_if_dirty()
save = (time.perf_counter() - wall, time.thread_time() - cpu)
kinds = sorted(lib.kind for lib in found.values())
print(json.dumps({"load": load, "scan": scan, "save": save, "kinds": kinds,
                  "entries": len(store), "hits": store.hits}))
"""


_FULL_STORE = r"""
import json, sys, time
from pathlib import Path
from gpuflight.producer.discover import procmaps, verdictcache
cache = Path(sys.argv[1])
store = procmaps.open_verdict_store(cache)
if not len(store):  # the first run fills it: files that define nothing, the common case
    nothing = verdictcache.Stored(frozenset(), frozenset(), None)
    t = 1_700_000_000_000_000_000
    for n in range(verdictcache.DEFAULT_MAX_ENTRIES):
        store.put((2049, n, 4096 + n, t + n, t + n), nothing)
    store.save_if_dirty()
    print(json.dumps(None))
else:
    wall, cpu = time.perf_counter(), time.thread_time()
    store = procmaps.open_verdict_store(cache)
    print(json.dumps([len(store), time.perf_counter() - wall, time.thread_time() - cpu,
                      (cache / verdictcache.FILE_NAME).stat().st_size]))
"""


def full_store_cost(rounds: int, tmp: Path) -> tuple[int, float, float, int]:
    """(entries, wall s, CPU s, bytes) of opening a full cache, median of fresh interpreters."""
    runs = []
    for n in range(rounds + 1):
        out = subprocess.run(
            [sys.executable, "-c", _FULL_STORE, str(tmp / "full")],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
            capture_output=True, text=True, check=True,
        ).stdout
        if n:
            runs.append(json.loads(out))
    return (runs[0][0], statistics.median(r[1] for r in runs),
            statistics.median(r[2] for r in runs), runs[0][3])


def startup_files(python: Path, site: Path) -> list[str]:
    """The files `import torch` maps executable, and every shared object under torch/lib and
    nvidia/ (what a CUDA start-up dlopens next): the files a traced PyTorch start-up has
    classified while it is held."""
    maps = subprocess.run(
        [str(python), "-c", "import torch; print(open('/proc/self/maps').read())"],
        capture_output=True, text=True, check=True,
    ).stdout
    files = {f[5] for f in (line.split() for line in maps.splitlines())
             if len(f) >= 6 and "x" in f[1] and f[5].startswith("/")}
    for folder in (site / "torch" / "lib", site / "nvidia"):
        files |= {str(p) for p in folder.rglob("*.so*") if p.is_file()}
    return sorted(f for f in files if os.path.isfile(f))


def fake_proc(files: list[str], into: Path) -> Path:
    """A /proc with one process that maps `files` (its root is the real /)."""
    pid = into / "4242"
    pid.mkdir(parents=True)
    (pid / "root").symlink_to("/")
    lines = []
    for i, path in enumerate(files):
        st = os.stat(path)
        start = 0x7F0000000000 + i * 0x100000
        lines.append(f"{start:x}-{start + 0x1000:x} r-xp 00001000 {os.major(st.st_dev):02x}:"
                     f"{os.minor(st.st_dev):02x} {st.st_ino}    {path}")
    (pid / "maps").write_text("\n".join(lines) + "\n")
    (pid / "stat").write_text("4242 (python) S 1 4242 4242 0 -1 4194304 0\n")
    return into


def store_costs(files: list[str], rounds: int, tmp: Path) -> dict[str, dict[str, Any]]:
    """Classifying `files` in fresh interpreters with the cache off, with an empty cache, and
    with the cache the empty run saved: the median (wall, CPU) of each phase."""
    proc = fake_proc(files, tmp / "proc")
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "cold": [], "warm": []}
    for n in range(rounds):
        cache = tmp / f"cache{n}"
        for mode, folder in (("off", ""), ("cold", str(cache)), ("warm", str(cache))):
            out = subprocess.run(
                [sys.executable, "-c", _STORE_COSTS, str(proc), folder],
                env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                capture_output=True, text=True, check=True,
            ).stdout
            runs[mode].append(json.loads(out))
        runs["cold"][-1]["bytes"] = (cache / "verdictcache.json").stat().st_size
    merged: dict[str, dict[str, Any]] = {}
    for mode, results in runs.items():
        merged[mode] = dict(results[0])
        for phase in ("load", "scan", "save"):
            merged[mode][phase] = [statistics.median(r[phase][i] for r in results)
                                   for i in (0, 1)]
    return merged


def archive(rev: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True,
                         check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return into


# --- report -------------------------------------------------------------------------------------


def print_file_costs(site: Path, rounds: int, baseline: str | None, tmp: Path) -> None:
    files = [(f, str(site / f)) for f in FILES if (site / f).exists()]
    files.append((BIG_SYMTAB, str(big_symtab(tmp / "libbig.so"))))
    costs = {"this tree": file_costs(ROOT, files, rounds)}
    if baseline:
        costs[baseline] = file_costs(archive(baseline, tmp / "base"), files, rounds)
    print("\nCPU per new library file (median of fresh interpreters):\n")
    head = " | ".join(f"{tree}: classify / statics / all functions" for tree in costs)
    print(f"| file | MB | {head} | runtime functions defined | probed |")
    print("| --- | --- |" + " --- |" * len(costs) + " --- | --- |")
    for label, _ in files:
        mine = costs["this tree"][label]
        cells = " | ".join(
            f"{c[label]['cpu_s']:.3f} s / {c[label]['statics_cpu_s']:.2f} s / "
            f"{c[label]['table_cpu_s']:.2f} s"
            for c in costs.values()
        )
        probed = "all" if mine["probed"] is None else mine["probed"]
        if not mine["runtime_functions"]:
            probed = "-"
        print(f"| {label} | {mine['mb']:.0f} | {cells} | {mine['runtime_functions']} "
              f"| {probed} |")


def print_store_costs(files: list[str], rounds: int, tmp: Path) -> None:
    costs = store_costs(files, rounds, tmp)
    cold = costs["cold"]
    kinds = ", ".join(f"{cold['kinds'].count(k)} {k}" for k in sorted(set(cold["kinds"])))
    print(f"\nClassifying a PyTorch start-up's files: {len(files)} paths, {cold['entries']} "
          f"distinct files ({kinds}), fresh interpreters, median of {rounds}; wall / CPU:\n")
    print("| verdict cache | open the cache | classify (procmaps.scan) | save | total |")
    print("| --- | --- | --- | --- | --- |")
    labels = {"off": "off", "cold": "empty (first run)", "warm": "as the first run saved it"}
    for mode, c in costs.items():
        cells = [f"{c[p][0] * 1e3:.1f} / {c[p][1] * 1e3:.1f} ms" for p in ("load", "scan", "save")]
        total = sum(c[p][0] for p in ("load", "scan", "save"))
        print(f"| {labels[mode]} | {' | '.join(cells)} | {total * 1e3:.1f} ms |")
    print(f"\nThe saved cache: {cold['entries']} entries, {cold['bytes']:,} bytes; "
          f"the second run's hits: {costs['warm']['hits']}.")
    entries, wall, cpu, size = full_store_cost(rounds, tmp)
    print(f"A full cache ({entries:,} entries of files that define nothing, {size:,} bytes) "
          f"opens in {wall * 1e3:.1f} ms ({cpu * 1e3:.1f} ms CPU).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scripts", default="import,mlp")
    parser.add_argument("--baseline", help="a git revision to compare the per-file CPU with")
    parser.add_argument("--no-trace", action="store_true", help="per-file CPU only")
    parser.add_argument("--no-files", action="store_true",
                        help="skip the per-file CPU table (the verdict cache figures stay)")
    parser.add_argument("--verdict-cache", choices=("warm", "off", "both"), default="warm",
                        help="the traced runs' verdict cache: filled by an untimed traced run "
                             "first (default), off, or both side by side")
    args = parser.parse_args()
    python = frameworks_python()
    site = site_packages(python)
    print(f"{platform.node()} {platform.machine()} Linux {platform.release()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with tempfile.TemporaryDirectory(prefix="gf-startup-") as tmp_name:
        tmp = Path(tmp_name)
        if not args.no_files:
            print_file_costs(site, args.rounds, args.baseline, tmp)
        print_store_costs(startup_files(python, site), args.rounds, tmp)
        if args.no_trace:
            return
        if os.geteuid() != 0:
            sys.exit("the traced runs need root (BPF): run with sudo, or --no-trace")
        caches = ["warm", "off"] if args.verdict_cache == "both" else [args.verdict_cache]
        walls = wall_times(args.scripts.split(","), args.rounds, python, tmp, caches)
    print(f"\nWall time, {args.rounds} rounds alternating (median, all runs):\n")
    variants = list(next(iter(walls.values())))
    traced = variants[1:]
    print("| program | " + " | ".join(variants) + " | " + " | ".join(
        f"{v} / alone" for v in traced) + " |")
    print("| --- |" + " --- |" * (len(variants) + len(traced)))

    def runs(times: list[float]) -> str:
        return " / ".join(f"{t:.1f}" for t in times)

    for script, w in walls.items():
        alone = statistics.median(w["alone"])
        cells = [f"{statistics.median(w[v]):.2f} s ({runs(w[v])})" for v in variants]
        ratios = [f"{statistics.median(w[v]) / alone:.2f}x" for v in traced]
        print(f"| {script} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    print("\nThe traced runs by the run just before them (median, / alone): an untraced one, or "
          "a traced one, whose end leaves the kernel releasing its probes and tracepoints for "
          "a while:\n")
    print("| program | variant | after an untraced run | after a traced run |")
    print("| --- | --- | --- | --- |")
    for script, w in walls.items():
        alone = statistics.median(w["alone"])
        for v in traced:
            split = AFTER_TRACED.get(f"{script}, {v}", {})
            medians = {k: statistics.median(split[k]) for k in (False, True) if split.get(k)}
            cells = [f"{medians[k]:.2f} s ({medians[k] / alone:.2f}x, {len(split[k])} runs)"
                     if k in medians else "—" for k in (False, True)]
            print(f"| {script} | {v} | {' | '.join(cells)} |")
    print("\nUnder trace, the command itself (exec to exit, as trace's summary gives it; the "
          "rest of the wall time is gpuflight's own start and exit) and how it was held "
          "(median of the runs; the longest hold is the longest of any run):\n")
    print("| program | variant | command | / alone | holds | held in all | longest hold |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for script, w in walls.items():
        alone = statistics.median(w["alone"])
        for v in traced:
            details = TRACED_DETAILS.get(f"{script}, {v}", [])
            if not details:
                continue
            own = statistics.median(d[0] for d in details)
            print(f"| {script} | {v} | {own:.2f} s | {own / alone:.2f}x | "
                  f"{statistics.median(d[1] for d in details):.0f} | "
                  f"{statistics.median(d[2] for d in details):.2f} s | "
                  f"{max(d[3] for d in details)} ms |")


if __name__ == "__main__":
    main()
