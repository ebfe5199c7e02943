"""One frozen settings object for capture, built once at the entry point."""

from __future__ import annotations

import importlib.resources
import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

#: Processes the tally of a killed agent's events follows at once (publish/deadagents.py: the
#: pinned maps' size; past it, events are not committed and are counted lost in the kernel
#: instead: bpf/cudart.bpf.c gf_commit).
TALLY_PIDS: Final = 65536


def _default_bpf_dir() -> Path:
    """Where the BPF sources are: $GPUFLIGHT_BPF_DIR, else the package data
    `gpuflight.producer.bpf`
    (the repository's bpf/, installed with the package)."""
    override = os.environ.get("GPUFLIGHT_BPF_DIR")
    if override:
        return Path(override)
    return Path(str(importlib.resources.files("gpuflight.producer.bpf")))


DEFAULT_BPF_DIR = _default_bpf_dir()

#: GPUFLIGHT_CACHE_DIR values that turn the verdict cache off.
CACHE_OFF = frozenset({"", "off", "none", "0", "false", "no"})


#: The CPU numbers the kernel may use (bpf_get_smp_processor_id is below the highest + 1).
POSSIBLE_CPUS: Final = Path("/sys/devices/system/cpu/possible")


def possible_cpus(path: Path = POSSIBLE_CPUS) -> int:
    """One past the highest CPU number in `path` ("0-3", "0,2-5"); os.cpu_count() where it
    cannot be read."""
    try:
        text = path.read_text().strip()
        return max(int(part.rsplit("-", 1)[-1]) for part in text.split(",")) + 1
    except (OSError, ValueError):
        return os.cpu_count() or 1


def default_cache_dir(
    environ: Mapping[str, str] | None = None, euid: int | None = None
) -> Path | None:
    """Where classification verdicts (producer/discover/verdictcache.py) and compiled BPF programs
    (producer/probe/bpfimage.py) are kept across runs, or None
    (off): $GPUFLIGHT_CACHE_DIR if set ('' or 'off': off), else /var/cache/gpuflight for
    root, else $XDG_CACHE_HOME/gpuflight or ~/.cache/gpuflight."""
    env = os.environ if environ is None else environ
    override = env.get("GPUFLIGHT_CACHE_DIR")
    if override is not None:
        return None if override.strip().lower() in CACHE_OFF else Path(override)
    if (os.geteuid() if euid is None else euid) == 0:
        return Path("/var/cache/gpuflight")
    xdg = env.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative path is to be ignored
        return Path(xdg) / "gpuflight"
    home = env.get("HOME") or os.path.expanduser("~")
    if not os.path.isabs(home):
        return None  # no home to keep a cache in
    return Path(home) / ".cache" / "gpuflight"


def kernel_at_least(major: int, minor: int, release: str | None = None) -> bool:
    """Whether the running kernel (or `release`, uname -r) is `major`.`minor` or later; a
    release that does not parse is taken as older."""
    parts = (release or os.uname().release).split(".")
    try:
        have = (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "0"))
    except (IndexError, ValueError):
        return False
    return have >= (major, minor)


@dataclass(frozen=True)
class CaptureSettings:
    """How capture runs; every field has a named default."""

    #: Where processes are read from; tests point this at fake trees.
    proc_root: Path = Path("/proc")
    #: Event ring buffer size in pages (a power of two): 8192 pages = 32 MiB,
    #: about 380k events, a third of a second at a million events a second.
    ringbuf_pages: int = 8192
    #: Slots of each CPU's event buffer (a power of two; 0: events go to the ring alone): an
    #: event is written there while it has room, 35-60 ns a call cheaper than the ring
    #: (bpf/cudart.bpf.c GF_CPU_SLOTS, producer/probe/cpubuffers.py). 4096 slots, 384 KiB a
    #: CPU, hold ~3 ms of a tight launch loop on one CPU; the reader moves them out each ms.
    cpu_slots: int = 4096
    #: How long the reader waits for loader notifications between drains.
    poll_interval_s: float = 0.005
    #: Full /proc rescans, the safety net behind the loader probe (<= 1 s keeps
    #: the promise that a new library file is covered within a second).
    rescan_interval_s: float = 0.5
    #: Capture only these processes (None: every process on the node).
    pids: frozenset[int] | None = None
    #: Children of processes in scope join the scope (trace mode).
    follow_forks: bool = False
    #: Stop a process in scope while we attach to a library it just mapped.
    hold_on_load: bool = False
    #: Report exec like a link-map change (needs tracefs).
    watch_exec: bool = True
    bpf_dir: Path = field(default=DEFAULT_BPF_DIR)
    #: Capture the HTTP/1.1 requests the captured processes serve, and attribute every CUDA
    #: call to its request(s) (bpf/http.bpf.h, producer/http/requesttrack.py).
    http: bool = False
    #: Node-wide: a probed library file that no process has mapped for this long is detached
    #: (a finished job's, a deleted image's): its probes hold file descriptors and kernel
    #: memory. Negative: never.
    detach_unmapped_after_s: float = 60.0
    #: With `http` in trace mode (a scope, holds): set the HTTP capture up at the first
    #: listen(2) of a process in scope, held meanwhile, rather than at start (needs tracefs).
    http_at_listen: bool = True
    #: Where what each library file defines, and the compiled BPF programs, are kept across
    #: runs, so that a file is classified and a program compiled once, not once per run
    #: (default_cache_dir; None: not kept).
    verdict_cache_dir: Path | None = field(default_factory=default_cache_dir)
    #: Node agent with Kafka: the bpffs directory of this agent's pinned tally (what the kernel
    #: committed per pid, what became of it), which a killed agent leaves for the next one to
    #: report (producer/publish/deadagents.py). None: no tally.
    tally_dir: Path | None = None
    #: With holds (trace): a dlopen that maps only files known to define nothing we probe
    #: (the verdicts) is neither held nor rescanned: the kernel tells, from a map user space
    #: fills (bpf/cudart.bpf.c, GF_QUIET_LOADS). A PyTorch start-up makes ~70 dlopens, ~60
    #: of them of such files.
    quiet_loads: bool = True
    #: Code paths (issue 28): the Python stack of one recorded call in `stack_period` on
    #: average is walked in the kernel and sent with the call's weight (1: every call);
    #: None: off (bpf/cudart.bpf.c GF_PY_STACKS).
    stack_period: int | None = None
    #: The most Python stacks a CPU walks a second when sampling (stack_period > 1): each
    #: time it is reached the CPU's period doubles (and halves back in a second far under it),
    #: the weights following, so estimates stay unbiased; 0: no bound. Every-call mode (1) has
    #: none.
    stack_max_walks: int = 2000
    #: With a budget (ns, > 0), the sampling period adapts above `stack_period` (then the
    #: least period) so that the walks, as the kernel times them, add at most this much to a
    #: recorded call on average (bpf/cudart.bpf.c gf_py_period_for); 0: the period is fixed.
    stack_budget_ns: int = 0
    #: The deepest Python stack walked, in frames (a power of two; deeper ones are cut there,
    #: and flagged).
    stack_depth: int = 64
    #: The rings of the samples and of the stacks' frames, in pages (powers of two).
    stack_ring_pages: int = 1024

    @property
    def ringbuf_bytes(self) -> int:
        return self.ringbuf_pages * mmap.PAGESIZE

    @property
    def cpu_buffers(self) -> bool:
        """Whether events go to each CPU's buffer first: asked for (`cpu_slots`), and the
        kernel has the compare-and-swap a program takes a slot with (Linux 5.12)."""
        return bool(self.cpu_slots) and kernel_at_least(5, 12)

    @property
    def ncpus(self) -> int:
        """The CPU numbers the kernel may run a probe on (the per-CPU buffers' count)."""
        return possible_cpus()

    @property
    def filter_pids(self) -> bool:
        return self.pids is not None

    @property
    def http_on_listen(self) -> bool:
        """Whether the HTTP capture waits for a listen(2) in scope: compiling it costs ~1.8 s,
        which a command that serves nothing (most do not) never pays then, and a server
        accepts nothing before it listens, so no request is missed."""
        return self.http and self.http_at_listen and self.filter_pids and self.hold_on_load

    @property
    def quiet_loads_on(self) -> bool:
        """Whether dlopens of quiet files go unheld: only where processes are held (trace), so
        that the node agent adds no syscall tracepoint for it."""
        return self.quiet_loads and self.hold_on_load and self.filter_pids

    @property
    def attach_cookies(self) -> bool:
        """Whether programs read attach cookies (bpf_get_attach_cookie, Linux 5.15+): one
        program then serves a whole family of the probe table (bpf/cudart.bpf.c)."""
        return kernel_at_least(5, 15)

    def cflags(self) -> list[str]:
        return [
            f"-I{self.bpf_dir}",
            f"-DGF_RINGBUF_PAGES={self.ringbuf_pages}",
            *([f"-DGF_CPU_SLOTS={self.cpu_slots}", f"-DGF_NCPUS={self.ncpus}"]
              if self.cpu_buffers else []),
            f"-DGF_FILTER_PIDS={int(self.filter_pids)}",
            f"-DGF_FOLLOW_FORKS={int(self.follow_forks)}",
            f"-DGF_HOLD_ON_LOAD={int(self.hold_on_load)}",
            f"-DGF_WATCH_EXEC={int(self.watch_exec)}",
            f"-DGF_HOLD_ON_LISTEN={int(self.http_on_listen)}",
            f"-DGF_ATTACH_COOKIE={int(self.attach_cookies)}",
            f"-DGF_QUIET_LOADS={int(self.quiet_loads_on)}",
            *(["-DGF_TALLY_DIR_SET=1", f'-DGF_TALLY_DIR="{self.tally_dir}"',
               f"-DGF_TALLY_PIDS={TALLY_PIDS}"] if self.tally_dir is not None else []),
            *(["-DGF_PY_STACKS=1", f"-DGF_PY_MAX_DEPTH={self.stack_depth}",
               f"-DGF_PY_STACKS_PAGES={self.stack_ring_pages}"]
              if self.stack_period is not None else []),
        ]
