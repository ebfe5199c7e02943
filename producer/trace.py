"""`gpuflight trace -- CMD`: run a command under capture and summarise it.

The command starts once what it needs from its first instruction is loaded (the CUDA
programs go on loading meanwhile: producer/probe/probes.py) and it is in scope, and
every library it maps (at start-up, by dlopen, after exec) is attached while
it is held, so not even its first call is missed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Final

from gpuflight.producer.capture import Capture
from gpuflight.producer.contract.errors import SetupError, UsageError
from gpuflight.producer.contract.pricing import PriceBook
from gpuflight.producer.decode.codepaths import PathSample
from gpuflight.producer.decode.enrich import Enricher
from gpuflight.producer.decode.pysamples import IN_BACKWARD, LAUNCHES_VARIANCE, NO_FRAMES
from gpuflight.producer.decode.sinks import EventSink, JsonLinesSink, SummarySink
from gpuflight.producer.decode.summary import ProbedFile, Summary, render
from gpuflight.producer.discover import procmaps
from gpuflight.producer.http.routes import RouteTable, render_http, route_table
from gpuflight.producer.http.routes import render as render_routes
from gpuflight.producer.nvml import NvmlSampler, UtilizationFeed
from gpuflight.producer.probe.holdguard import HoldGuard
from gpuflight.producer.probe.preflight import TRACE_CAPABILITIES, check_can_probe
from gpuflight.producer.probe.probes import CUDA_KINDS, DropCounts, Probes, StackRate
from gpuflight.producer.settings import CaptureSettings
from gpuflight.producer.top import TopFeed

if TYPE_CHECKING:
    from gpuflight.producer.contract.wire import GpuSample
    from gpuflight.producer.decode.kernels import KernelNames
    from gpuflight.producer.http.requesttrack import Answered

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceResult:
    exit_code: int
    wall_s: float
    summary: Summary
    dropped: int
    events: int
    #: The library files probed, once each, with their probe counts.
    probed: tuple[ProbedFile, ...] = ()
    #: The HTTP requests the command served (with the HTTP capture on), and their table.
    requests: tuple[Answered, ...] = ()
    routes: RouteTable | None = None
    #: How often the command was held while its new library files were probed (at a dlopen
    #: or exec), how long in all, and the longest hold, in seconds.
    holds: int = 0
    held_s: float = 0.0
    longest_hold_s: float = 0.0
    #: The dlopens let through unheld: they mapped only files known to hold nothing probed.
    unheld: int = 0
    #: What turned the events' CLOCK_MONOTONIC times into the wall-clock `ts_ns` of the
    #: output: a time the command took with time.monotonic_ns(), plus this, is on the
    #: events' time line, whatever the wall clock did meanwhile.
    clock_offset_ns: int = 0
    #: Calls of the command whose probe the kernel single-stepped (ProbedFile.stepped); None:
    #: not counted (a kernel without attach cookies).
    stepped_calls: int | None = None


@dataclass(frozen=True)
class StackOptions:
    """Code paths (issue 28): where they go, and one call in how many is walked."""

    folded: Path | None = None
    profile: Path | None = None
    #: One call in `period` walked; with a budget (ns a recorded call, as the kernel times
    #: the walks: settings.stack_budget_ns), the least period, the rate adapting above it.
    period: int = 1
    budget_ns: int = 40
    #: What --stacks folds by (codepaths.FOLDED_WEIGHTS).
    weight: str = "launches"
    #: The most stacks a CPU walks a second (settings.stack_max_walks).
    max_walks: int = 2000


@dataclass(frozen=True)
class RequestOptions:
    """What trace does with requests: price them, export them."""

    prices: PriceBook | None = None
    #: The GPU model to price at (else NVML's first GPU's name).
    gpu_model: str | None = None
    #: --otlp URL, and its protocol.
    otlp: str | None = None
    otlp_protocol: str = "http/protobuf"


#: How often trace reads NVML (per-process utilisation for request cost), in seconds.
NVML_INTERVAL_S = 1.0


def open_nvml() -> NvmlSampler | None:
    """NVML, or None (logged: request GPU time is then the time work was queued)."""
    try:
        return NvmlSampler()
    except Exception as exc:  # NvmlUnavailable, and anything the library throws
        # Quiet: the route table says where GPU time came from ("no NVML on this machine").
        log.debug("NVML: %s; request GPU time is the time work was queued", exc)
        return None


def gpu_name(explicit: str | None, nvml: NvmlSampler | None = None) -> str | None:
    """The GPU to price at: the one named, else NVML's first GPU, else None."""
    if explicit:
        return explicit
    if nvml is not None:
        return next((d.name for d in nvml.devices if d.name), None)
    try:
        with NvmlSampler() as sampler:
            return gpu_name(None, sampler)
    except Exception as exc:  # no NVML, no GPU: no price
        log.debug("no GPU name from NVML: %s", exc)
    return None


#: The exit code of a trace whose command succeeded but whose --output could not be written
#: in full (sysexits' EX_IOERR); otherwise the command's own exit code is trace's.
EXIT_OUTPUT_INCOMPLETE = 74
#: The exit code of a trace whose command succeeded but in which no CUDA library file could be
#: probed while some file failed to be (sysexits' EX_UNAVAILABLE): a summary of nothing.
EXIT_NOT_TRACED = 69


#: What each kind of file is, in the summary's words.
_WHAT: Final = {"runtime": "CUDA library", "driver": "CUDA library", "loader": "dynamic loader",
                "autograd": "PyTorch's autograd engine", "exit": "exit hook"}


def attach_report(probes: Probes) -> tuple[list[str], bool]:
    """The summary's lines about files that could not be probed, in full or in part, and
    whether nothing was traced at all: no CUDA file probed, and some file skipped."""
    lines: list[str] = []
    for skipped in sorted(probes.failed.values(), key=lambda s: s.library.path):
        what = _WHAT.get(skipped.library.kind, "library")
        lines.append(f"  NOT PROBED: {what} {skipped.library.path} ({skipped.library.kind}): "
                     f"{skipped.reason}")
    for attached in sorted(probes.attached.values(), key=lambda a: a.library.path):
        if attached.unprobed:
            names = ", ".join(f"{name} ({why})" for name, why in sorted(attached.unprobed.items()))
            lines.append(f"  partly probed: {attached.library.path}: {len(attached.unprobed)} "
                         f"function(s) not probed, calls to them are not counted: {names}")
    probed = any(a.library.kind in CUDA_KINDS for a in probes.attached.values())
    nothing = bool(probes.failed) and not probed
    if nothing:
        lines.append("  nothing was traced: no CUDA library of the command could be probed")
    return lines, nothing


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def _close(capture: Capture) -> DropCounts:
    """Close the capture; a failure to detach or flush is logged, never fatal: the events
    drained so far are summarised and written all the same."""
    try:
        return capture.close()
    except Exception as exc:
        log.warning("closing the capture failed (%s); what was captured is kept", _reason(exc))
        log.debug("the close failure", exc_info=exc)
        try:
            return capture.drops()
        except Exception:
            return DropCounts(events=0, loader=0)


def _probed(capture: Capture) -> tuple[ProbedFile, ...]:
    """The files the probes were attached to: one entry per file (device, inode). Never
    fails: the summary is printed without the list rather than lost."""
    try:
        return tuple(
            ProbedFile(path=str(a.library.path), kind=a.library.kind, probes=a.probes,
                       stepped=len(a.stepped))
            for a in list(capture.probes.attached.values())
        )
    except Exception as exc:
        log.debug("the probed files cannot be listed: %s", exc)
        return ()


def _untrace(capture: Capture) -> None:
    """Take every process out of scope, so that no probe holds one while the probes are being
    released (that takes seconds, and the command goes on meanwhile)."""
    try:
        capture.probes.clear_scope()
    except Exception as exc:
        log.debug("clearing the scope failed: %s", exc)


def _continue_tree(proc_root: Path, pid: int) -> None:
    """SIGCONT the command and its descendants: none may stay held by a capture that ended."""
    for member in procmaps.process_tree(proc_root, pid) or {pid}:
        with contextlib.suppress(OSError):
            os.kill(member, signal.SIGCONT)


def _let_go(guard: HoldGuard, proc_root: Path, pid: int) -> None:
    """Continue what the probes hold (of the command's tree: only they are in scope), and not
    a process the user stopped; where the holds cannot be read, every process of the tree."""
    if guard.let_go() is None:
        _continue_tree(proc_root, pid)


def _wait(pid: int, proc_root: Path, guard: HoldGuard) -> int:
    """Wait for the command, untraced. A process of its tree that a probe stopped in the
    moment the capture ended (a fork seen as the scope was cleared, then its exec) is
    continued again every half second: nothing stays held by a capture that is over."""
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if done:
            return status
        time.sleep(0.5)  # polling a child we cannot wait on otherwise without blocking
        _let_go(guard, proc_root, pid)


def _utilization(
    capture: Capture, nvml: NvmlSampler | None, gpu: str | None,
    samples: Callable[[list[GpuSample]], None] | None = None,
    tops: Sequence[TopFeed] = (),
) -> tuple[str | None, UtilizationFeed | None]:
    """(The NVML opener's thread.) NVML, opened now if not before: the GPU's name (unless
    named), and the per-process utilisation feed requests are costed from, handed to the
    capture (whose loop takes it up from its next turn); each sample to `samples` too (the
    timeline's counters); each process's GPU time and its GPU's name to `tops` (`--top`'s
    GPU-seconds and $/h). Never raises."""
    try:
        if nvml is None:
            nvml = open_nvml()
            if nvml is not None and gpu is None:
                gpu = gpu_name(None, nvml)
        if nvml is None:
            return gpu, None
        if capture.requests is not None or samples is not None or tops:  # never the loop's
            feed = UtilizationFeed(nvml, NVML_INTERVAL_S, samples)
            for top in tops:
                top.table.gpu_names = feed.gpu_names
                capture.utilization_observers.append(top.add_utilization)
            # Taken by the capture each turn even for the timeline's counters alone: the
            # per-process windows the sampler reads would pile up otherwise.
            capture.utilization = feed
            return gpu, feed
        nvml.close()
    except Exception as exc:
        log.warning("NVML failed (%s): request GPU time is the time work was queued",
                    _reason(exc))
    return gpu, None


def _write_code_paths(capture: Capture, stacks: StackOptions, wall_s: float,
                      lost: int, usd_per_gpu_hour: float | None) -> tuple[list[str], bool]:
    """Write --stacks and --profile (never through a symlink: files/open_output); the
    summary's lines on code paths, and whether every file was written. A file that cannot
    be is said in one line; the trace's other outputs are kept."""
    from gpuflight.producer.decode.codepaths import write_folded, write_profile

    assert capture.stacks is not None
    paths = capture.stacks.paths(usd_per_gpu_hour)
    rate = capture.stacks.rate
    written = True
    outputs: list[tuple[Path | None, str, Callable[[Path], None]]] = [
        (stacks.folded, "--stacks", lambda target: write_folded(target, paths, stacks.weight)),
        (stacks.profile, "--profile", lambda target: write_profile(
            target, paths, duration_ns=int(wall_s * 1e9),
            comments=[f"gpuflight trace, {_rate_words(stacks, rate)}"])),
    ]
    for target, what, write in outputs:
        if target is None:
            continue
        try:
            write(target)
        except (OSError, UsageError) as exc:
            log.error("%s %s not written: %s", what, target,
                      exc.strerror if isinstance(exc, OSError) else exc)
            written = False
    samples = capture.stacks.samples
    out = [f"  code paths: {len(paths)} stack(s), {samples.walks:,} walk(s), "
           f"{_rate_words(stacks, rate)}"
           + (f", {samples.unknown_stacks} sample(s) of unknown stacks"
              if samples.unknown_stacks else "")
           + (f", {samples.unjoined} sample(s) whose call was not recorded"
              if samples.unjoined else "")
           + (f", {lost} sample(s) lost (their ring was full)" if lost else "")]
    def launches(path: PathSample) -> str:
        # Each call is walked with a known chance (1 in the period in force when it was
        # made): a count estimated at v has a variance of Σ w(w-1) over its samples.
        value = path.values.get("launches", 0.0)
        spread = 2 * math.sqrt(path.values.get(LAUNCHES_VARIANCE, 0.0))
        exact = stacks.period == 1 and not stacks.budget_ns
        return f"{value:,.0f}" if exact else f"{value:,.0f} ±{spread:,.0f}"

    out.extend(_top_paths(paths, "launches", "of launches", launches))
    out.extend(_top_paths(paths, "gpu_ns", "of GPU time",
                          lambda p: f"{p.values.get('gpu_ns', 0.0) / 1e6:,.3f} ms"))
    launched = sum(p.values.get("launches", 0.0) for p in paths)
    alone = sum(p.values.get("launches", 0.0) for p in paths if p.frames[:1] == (NO_FRAMES,))
    backward = sum(p.values.get("launches", 0.0) for p in paths if IN_BACKWARD in p.frames)
    if launched and backward:
        out.append(f"    {100 * backward / launched:.1f}% of the launches were made by autograd's"
                   " threads for a backward pass: counted to the stack that entered it")
    if launched and alone:
        out.append(f"    {100 * alone / launched:.1f}% of the launches came from threads with no"
                   " Python frames (native threads, or autograd's outside a backward pass seen"
                   " to start): by native caller only")
    return out, written


def _rate_words(stacks: StackOptions, rate: StackRate) -> str:
    """How many calls were walked, and why: the period asked for, or the cost budget's."""
    if not stacks.budget_ns:
        return f"1 call in {stacks.period:,} walked" + (
            f" (1 in up to {rate.peak:,} on a CPU that reached {stacks.max_walks:,} walks a"
            f" second: doubled {rate.raised} time(s))" if rate.peak > stacks.period else "")
    if not rate.walks:
        return f"no call walked (the rate kept to {stacks.budget_ns:,} ns a recorded call)"
    calls = max(1, rate.calls)
    known = (f"they took {rate.known_spent_ns / calls:,.0f} ns, "
             f"{rate.known_spent_ns / rate.known_walks:,.0f} ns a walk" if rate.known_walks
             else "none walked yet")
    new = (f"; the first walks of {rate.new_walks:,} new stack(s), which it does not follow,"
           f" {rate.new_spent_ns / calls:,.0f} ns more, {rate.new_spent_ns / rate.new_walks:,.0f}"
           " ns each" if rate.new_walks else "")
    return (f"1 call in {rate.calls / rate.walks:,.0f} walked on average (the rate kept the"
            f" walks of known stacks to {stacks.budget_ns:,} ns a recorded call: {known}{new};"
            f" a CPU's period reached {rate.peak:,})")


def _top_paths(paths: Sequence[PathSample], value: str, what: str,
               shown: Callable[[PathSample], str]) -> list[str]:
    """The summary's five heaviest code paths by `value`, each by its innermost two Python
    frames and its native caller (none if no path has any)."""
    total = sum(p.values.get(value, 0.0) for p in paths)
    if not total:
        return []
    ranked = sorted(paths, key=lambda p: -p.values.get(value, 0.0))[:5]
    out = [f"    top code paths {what}" + (" (±: two standard deviations)" if "±" in
                                               shown(ranked[0]) else "") + ":"]
    for path in ranked:
        share = path.values.get(value, 0.0) / total
        if not share:
            break
        frames = path.frames
        native = frames[-1:] if frames and frames[-1].line is None and not (
            frames[-1].function.startswith("[")) else ()  # not [truncated], [unknown code]…
        where = " → ".join(f.folded() for f in (*frames[:len(frames) - len(native)][-2:],
                                                 *native)) or "-"
        out.append(f"    {100 * share:5.1f}% {shown(path):>18}  {where}")
    return out


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def _spawn_held(argv: Sequence[str],
                stdio: tuple[int, int, int] | None = None) -> tuple[int, int]:
    """Fork a child that execs argv once we write to the returned pipe (its stdin, stdout and
    stderr `stdio`'s descriptors if given, else ours)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(write_end)
            os.read(read_end, 1)
            if stdio is not None:
                for target, fd in enumerate(stdio):
                    os.dup2(fd, target)
            os.closerange(3, 65536)  # BPF maps and perf events stay with us
            os.execvp(argv[0], list(argv))
        except OSError as exc:
            os.write(2, f"gpuflight: cannot run {argv[0]}: {exc.strerror}\n".encode())
        os._exit(127)
    os.close(read_end)
    return pid, write_end


def run(
    argv: Sequence[str],
    output: Path | None = None,
    settings: CaptureSettings | None = None,
    print_summary: bool = True,
    requests: RequestOptions | None = None,
    *,
    timeline: Path | None = None,
    watchers: Callable[[KernelNames], Sequence[EventSink]] | None = None,
    command_stdio: tuple[int, int, int] | None = None,
    on_end: Callable[[int], None] | None = None,
    stacks: StackOptions | None = None,
) -> TraceResult:
    """Run argv under capture. `watchers`: the sinks of a live view (`trace --top`'s feed),
    given the capture's kernel names;
    `command_stdio`: the command's stdin, stdout and stderr (a view owns the terminal);
    `on_end(exit code)`: once the command is over and the capture closed, before the summary
    is printed (the view ends there)."""
    if not argv:
        raise UsageError("trace needs a command: gpuflight trace [--output FILE] -- CMD [ARGS...]")
    if shutil.which(argv[0]) is None:
        raise UsageError(f"command not found: {argv[0]}")
    check_can_probe(capabilities=TRACE_CAPABILITIES)
    base = settings or CaptureSettings()
    settings = replace(base, pids=frozenset(), follow_forks=True, hold_on_load=True,
                       stack_period=stacks.period if stacks is not None else None,
                       stack_budget_ns=stacks.budget_ns if stacks is not None else 0,
                       stack_max_walks=(stacks.max_walks if stacks is not None
                                        else base.stack_max_walks))
    summary_sink = SummarySink()
    sinks: list[EventSink] = [summary_sink]
    enricher = Enricher(proc_root=settings.proc_root)
    if output is not None:
        sinks.append(JsonLinesSink(output, enricher.kernels))
    timeline_sink = None
    if timeline is not None:
        from gpuflight.producer.decode.timeline import TimelineSink

        timeline_sink = TimelineSink(timeline, enricher.kernels)
        sinks.append(timeline_sink)
    options = requests or RequestOptions()
    # NVML (the GPU's name, per-process utilisation) is opened once the command runs: its
    # initialisation takes tens to hundreds of ms on a GPU node, which the command need not
    # wait for. Only an OTLP export that needs the GPU's name from its first span opens it
    # before.
    nvml = open_nvml() if settings.http and options.otlp and not options.gpu_model else None
    gpu = (options.gpu_model or gpu_name(None, nvml)) if nvml is not None else options.gpu_model
    if not settings.http:
        gpu = None
    if settings.http and options.otlp:
        from gpuflight.producer.http.otlp import OtlpExporter, SpanSink

        exporter = OtlpExporter(options.otlp, protocol=options.otlp_protocol,  # type: ignore[arg-type]
                                wall_offset_ns=enricher.clock_offset_ns)
        sinks.append(SpanSink(exporter, enricher.kernels, options.prices, gpu))
    tops: list[TopFeed] = []
    if watchers is not None:
        watching = watchers(enricher.kernels)
        sinks.extend(watching)
        tops = [w for w in watching if isinstance(w, TopFeed)]
    capture = Capture(settings, sinks, enricher)
    if capture.requests is not None and options.otlp:
        capture.requests.count_kernels = True
    pid, release = _spawn_held(argv, command_stdio)
    capture.probes.add_to_scope([pid])
    capture.watch_http([pid])
    # With exec watched, the child is held at exec and scanned then. Without,
    # scan it now, while it is still a copy of us: that attaches our own loader
    # (usually the command's too), and the loader probe reports the rest.
    capture.start(initial_scan=not capture.settings.watch_exec)
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)}
    forward = signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
    # Before the command can be held (from its exec on): a watchdog that continues what the
    # probes hold, should this process die holding it (producer/probe/holdguard.py).
    guard = HoldGuard(capture.probes.holds, capture.probes.scope_map)
    started = time.monotonic()
    os.write(release, b"x")
    os.close(release)
    # NVML on a thread of its own: importing and initialising it (~10 ms here, where it is
    # not even installed; tens to hundreds of ms on a GPU node) would otherwise hold up the
    # capture loop, and with it the command at its first hold (its exec).
    opened: list[tuple[str | None, UtilizationFeed | None]] = []
    opener: threading.Thread | None = None
    gpu_samples = timeline_sink.add_gpu_samples if timeline_sink is not None else None
    if settings.http or gpu_samples is not None or tops:
        opener = threading.Thread(target=lambda: opened.append(
                                      _utilization(capture, nvml, gpu, gpu_samples, tops)),
                                  name="gf-nvml", daemon=True)
        opener.start()
    status: int | None = None
    ended = started
    #: A BPF program that failed to load after the command started (Probes.check_loaded):
    #: the command runs on untraced, and trace ends with that error once it is over.
    unloaded: SetupError | None = None
    try:
        while status is None:
            try:
                capture.step()
            except SetupError as exc:
                unloaded = exc
                log.error("%s: %s runs on, untraced from here", exc, argv[0])
                break
            except Exception as exc:  # capture broke: the command must not pay for it
                log.error("capture failed (%s): %s runs on, untraced from here",
                          _reason(exc), argv[0])
                log.debug("the capture failure", exc_info=exc)
                break
            done, waited = os.waitpid(pid, os.WNOHANG)
            if done:
                status, ended = waited, time.monotonic()
    finally:
        if status is None:  # the loop broke: no probe may hold the command from here on
            _untrace(capture)
        if opener is not None:  # before the last drain: it takes NVML's last word
            opener.join()
            if opened:
                gpu = opened[0][0]
                own = opened[0][1]
                if own is not None and capture.requests is None:  # the timeline's alone:
                    own.stop()  # its last word now (closed with the capture's, below)
        drops = _close(capture)
        if capture.utilization is not None:
            capture.utilization.stop()
            capture.utilization.sampler.close()
        if status is None:  # wait for the command, released from any hold
            _let_go(guard, settings.proc_root, pid)
            status, ended = _wait(pid, settings.proc_root, guard), time.monotonic()
        guard.close()
        wall_s = ended - started
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGTERM, forward)
    exit_code = _exit_code(status)
    if on_end is not None:
        on_end(exit_code)
    path_lines: list[str] = []
    paths_written = True
    if stacks is not None and capture.stacks is not None:
        model = options.gpu_model or gpu or gpu_name(None)
        per_hour = options.prices.per_hour(model) if options.prices and model else None
        path_lines, paths_written = _write_code_paths(capture, stacks, wall_s,
                                                      drops.py_samples, per_hour)
    failed = capture.failed_sinks()
    for sink in failed:
        log.error("%s is incomplete: %s (%d events not written)", sink.name, sink.failure,
                  sink.lost)
    if (failed or not paths_written) and exit_code == 0:
        exit_code = EXIT_OUTPUT_INCOMPLETE
    attach_lines, nothing_traced = attach_report(capture.probes)
    if nothing_traced:
        log.error("nothing was traced: %s", "; ".join(
            f"{s.library.path}: {s.reason}" for s in capture.probes.failed.values()))
        if exit_code == 0:
            exit_code = EXIT_NOT_TRACED
    routes = None
    if capture.requests is not None:
        shared = [a.record.request_id for a in summary_sink.requests
                  if a.mode in ("shared", "mixed")]
        routes = route_table([a.record for a in summary_sink.requests],
                             summary_sink.unattributed, options.prices, gpu, shared,
                             nvml=capture.utilization is not None)
    result = TraceResult(
        exit_code=exit_code,
        wall_s=wall_s,
        summary=summary_sink.summary,
        dropped=drops.events,
        events=capture.stats.events,
        probed=_probed(capture),
        requests=tuple(summary_sink.requests),
        routes=routes,
        holds=capture.stats.held_released,
        held_s=capture.stats.held_ns_total / 1e9,
        longest_hold_s=capture.stats.held_ns_max / 1e9,
        unheld=drops.quiet_loads,
        clock_offset_ns=enricher.clock_offset_ns,
        stepped_calls=drops.stepped if capture.settings.attach_cookies else None,
    )
    if result.holds:
        attach_lines.append(
            f"  held while probing: {result.holds} time(s), {result.held_s:.2f} s in all, "
            f"longest {result.longest_hold_s * 1000:.0f} ms")
    if result.unheld:
        attach_lines.append(f"  not held: {result.unheld} dlopen(s) of files known to hold "
                            "nothing probed")
    if capture.stats.held_at_exit:
        attach_lines.append(
            f"  held at exit: {capture.stats.held_at_exit} time(s), until their new stacks were"
            f" read ({capture.stats.held_at_exit_ns / 1e6:.1f} ms in all)")
    if print_summary:
        title = " ".join(argv)
        text = "\n".join([
            render(result.summary, title, wall_s, drops.events, probed=result.probed,
                   stepped_calls=result.stepped_calls),
            *attach_lines,
            *path_lines,
        ])
        print("\n" + text + "\n", file=sys.stderr)
        table = render_routes(routes, gpu) if routes is not None else ""
        if table:
            print(table, file=sys.stderr)
        if capture.requests is not None and capture.requests.stats():
            print(render_http(capture.requests.stats()) + "\n", file=sys.stderr)
    if drops.events:
        log.warning("%d events were dropped in the kernel (ring buffer full)", drops.events)
    if drops.names:
        log.warning("%d kernel-name records were dropped in the kernel (their ring was full): "
                    "those kernels' launches are named by address", drops.names)
    if unloaded is not None:  # as when it failed before the command started: the same error
        raise unloaded
    return result
