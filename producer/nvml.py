"""GPU-side gauges from NVML (nvidia-ml-py's `pynvml`), one `GpuSample` per GPU and call.

`GpuSample` and `GpuProcessSample` are the wire contract's (producer/contract/wire.py, nvml.v1): the
sampler makes what the topic carries. pynvml is imported when a sampler is made, never before.

The eBPF probes see what applications ask of CUDA; NVML says what the GPUs did meanwhile:
utilization, memory, power, temperature, SM clock, PCIe traffic and per-process use.

    sampler = NvmlSampler()          # NvmlUnavailable: log it once and carry on without GPU gauges
    samples = sampler.sample()       # never raises for a gauge a GPU or driver lacks: it is None

A gauge the GPU or driver does not give (NVMLError_NotSupported, NoPermission, GpuIsLost, an
older driver without the function...) is None in the sample, never an exception.

NVML is found by the name libnvidia-ml.so.1, as pynvml does, unless a file is named: the
`library_path` argument or GPUFLIGHT_NVML_LIB. pynvml keeps one library per process, so the first
sampler's choice holds for the process; asking for another file afterwards is NvmlUnavailable.

Per-process utilisation for request cost: each `sample()` also turns NVML's per-process samples
(nvmlDeviceGetProcessUtilization: one per process that kept the SMs busy in a driver sample
period, `timeStamp` the period's end in CPU µs since the epoch, `smUtil` percent of it) into
`UtilWindow`s, the period each covers taken from the driver's own device samples
(nvmlDeviceGetSamples, NVML_GPU_UTILIZATION_SAMPLES: one per period, busy or not). The newest
device sample read before the process samples says up to when NVML has told everything
(`UtilReport.covered_ns`). `take_utilization()` hands them on (thread-safe).

Costs: NVML's PCIe throughput counter is read over a 20 ms window per call, two calls per GPU,
so a sample of an 8-GPU node takes about a third of a second; sample from its own thread
(`start_sampler`), never from the capture loop.
"""

from __future__ import annotations

import bisect
import ctypes
import importlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final, TypeVar

from gpuflight.producer.contract.errors import GpuflightError
from gpuflight.producer.contract.wire import GpuProcessSample, GpuSample

log = logging.getLogger(__name__)

#: Names a specific libnvidia-ml.so.1 (e.g. one unpacked from a driver package).
LIBRARY_ENV: Final = "GPUFLIGHT_NVML_LIB"
#: The name pynvml (and the driver's own tools) load NVML by.
DEFAULT_LIBRARY: Final = "libnvidia-ml.so.1"
#: NVML reports PCIe throughput in KB/s, KB being 1024 bytes.
_PCIE_KB: Final = 1024

T = TypeVar("T")


class NvmlUnavailable(GpuflightError):  # noqa: N818 (the name says what callers check)
    """NVML cannot be used on this machine (no library, no driver, no GPU): one line saying why."""


@dataclass
class _Device:
    index: int
    handle: object
    uuid: str | None
    name: str | None
    #: NVML CPU timestamp (µs) of the newest process-utilization sample seen; 0: none yet.
    last_util_us: int = 0
    #: The newest device utilization samples' timestamps (µs): the driver's sample periods.
    ticks: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class UtilWindow:
    """NVML's word on one process on one GPU over one driver sample period: its SMs were busy
    `sm_util_pct` percent of (start_ns, end_ns] (wall clock ns)."""

    gpu: int
    pid: int
    start_ns: int
    end_ns: int
    sm_util_pct: int

    @property
    def gpu_ns(self) -> float:
        return self.sm_util_pct / 100 * (self.end_ns - self.start_ns)


@dataclass(frozen=True)
class UtilReport:
    """What `take_utilization()` hands on: the windows, and per GPU the time (wall ns) up to
    which NVML has reported every process (a process with no window there used no SM time)."""

    windows: tuple[UtilWindow, ...]
    covered_ns: dict[int, int]


#: Device sample timestamps kept per GPU (to find the period a process sample covers).
_TICKS_KEPT: Final = 4096


class NvmlSampler:
    """Initialises NVML once, finds the GPUs, and reads their gauges on each `sample()`.

    `nvml` is the pynvml module (a fake one in tests); `library_path` (else GPUFLIGHT_NVML_LIB,
    else the loader's libnvidia-ml.so.1) names the NVML library file.
    """

    def __init__(
        self,
        library_path: str | os.PathLike[str] | None = None,
        *,
        nvml: ModuleType | None = None,
    ) -> None:
        #: pynvml has no type information: its functions and structs are Any here.
        self._nvml: Any = nvml if nvml is not None else _import_pynvml()
        if library_path is None:
            library_path = os.environ.get(LIBRARY_ENV) or None
        self.library = os.fspath(library_path) if library_path is not None else DEFAULT_LIBRARY
        if library_path is not None:
            _preload(self._nvml, self.library)
        self._init()
        self._closed = False
        self._unsupported: set[tuple[int, str]] = set()
        self._util_lock = threading.Lock()
        self._windows: list[UtilWindow] = []
        self._covered: dict[int, int] = {}
        try:
            self.devices = self._enumerate()
        except BaseException:
            self.close()
            raise

    def _init(self) -> None:
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError_LibraryNotFound:
            raise NvmlUnavailable(
                f"NVML library not found: no {DEFAULT_LIBRARY} on the loader path (no NVIDIA "
                f"driver installed here?); {LIBRARY_ENV} can name the file"
            ) from None
        except nv.NVMLError_DriverNotLoaded:
            raise NvmlUnavailable(
                f"NVIDIA driver not loaded: NVML ({self.library}) is there, but no kernel "
                "driver answers"
            ) from None
        except nv.NVMLError_LibRmVersionMismatch:
            raise NvmlUnavailable(
                f"NVML library {self.library} does not match the loaded NVIDIA kernel driver"
            ) from None
        except nv.NVMLError_NoPermission:
            raise NvmlUnavailable(
                "NVML has no permission to open the NVIDIA devices (/dev/nvidia*)"
            ) from None
        except nv.NVMLError as e:
            raise NvmlUnavailable(f"NVML failed to initialise: {_one_line(e)}") from None

    def _enumerate(self) -> list[_Device]:
        nv = self._nvml
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as e:
            raise NvmlUnavailable(f"NVML cannot count the GPUs: {_one_line(e)}") from None
        if count == 0:
            raise NvmlUnavailable("no GPU: the NVIDIA driver is loaded but NVML sees no device")
        devices: list[_Device] = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            except nv.NVMLError as e:
                log.warning("GPU %d is skipped: NVML gives no handle (%s)", index, _one_line(e))
                continue
            devices.append(self._device(index, handle))
        if not devices:
            raise NvmlUnavailable(f"no GPU: NVML sees {count} device(s) but can open none")
        return devices

    def _device(self, index: int, handle: object) -> _Device:
        nv = self._nvml
        return _Device(
            index,
            handle,
            uuid=self._read(index, "uuid", lambda: str(nv.nvmlDeviceGetUUID(handle))),
            name=self._read(index, "name", lambda: str(nv.nvmlDeviceGetName(handle))),
        )

    def _read(self, gpu: int, what: str, get: Callable[[], T]) -> T | None:
        """`get()`, or None (logged once per GPU and gauge) when NVML cannot give it."""
        nv = self._nvml
        try:
            return get()
        except (nv.NVMLError, nv.NVMLLibraryMismatchError) as e:
            if (gpu, what) not in self._unsupported:
                self._unsupported.add((gpu, what))
                log.debug("GPU %d: no %s from NVML (%s)", gpu, what, _one_line(e))
            return None

    def sample(self) -> list[GpuSample]:
        """Every GPU's gauges now; per-process figures cover the time since the last call."""
        return [self._sample(d) for d in self.devices]

    def _sample(self, dev: _Device) -> GpuSample:
        nv = self._nvml
        h = dev.handle
        i = dev.index
        util = self._read(i, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        mem = self._read(i, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        power_mw = self._read(i, "power", lambda: int(nv.nvmlDeviceGetPowerUsage(h)))
        rx_kb = self._read(
            i, "pcie_rx", lambda: int(nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))
        )
        tx_kb = self._read(
            i, "pcie_tx", lambda: int(nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES))
        )
        temperature = self._read(
            i, "temperature", lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        )
        return GpuSample(
            gpu=i,
            uuid=dev.uuid,
            name=dev.name,
            utilization_gpu_pct=None if util is None else int(util.gpu),
            utilization_memory_pct=None if util is None else int(util.memory),
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            power_w=None if power_mw is None else power_mw / 1000,
            temperature_c=temperature,
            sm_clock_mhz=self._read(
                i, "sm_clock", lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            ),
            pcie_rx_bytes_per_s=None if rx_kb is None else rx_kb * _PCIE_KB,
            pcie_tx_bytes_per_s=None if tx_kb is None else tx_kb * _PCIE_KB,
            processes=self._processes(dev),
        )

    def take_utilization(self) -> UtilReport:
        """The per-process utilisation windows read since the last call (thread-safe)."""
        with self._util_lock:
            windows, self._windows = self._windows, []
            return UtilReport(tuple(windows), dict(self._covered))

    def covered_ns(self) -> int | None:
        """The time (wall ns) up to which every GPU's NVML has reported every process."""
        with self._util_lock:
            return min(self._covered.values()) if self._covered else None

    def _ticks(self, dev: _Device) -> int | None:
        """Read the device's new utilization samples (their times are the driver's sample
        periods); the newest, in µs, or None when NVML gives none."""
        nv = self._nvml
        since = dev.ticks[-1] if dev.ticks else 0
        try:
            _kind, samples = nv.nvmlDeviceGetSamples(dev.handle, nv.NVML_GPU_UTILIZATION_SAMPLES,
                                                     since)
        except nv.NVMLError_NotFound:
            return since or None
        new = sorted({int(s.timeStamp) for s in samples if int(s.timeStamp) > since})
        dev.ticks.extend(new)
        del dev.ticks[:-_TICKS_KEPT]
        return dev.ticks[-1] if dev.ticks else None

    def _windows_of(self, dev: _Device, utils: list[Any]) -> list[UtilWindow]:
        """Each process sample as the period it covers: from the device sample before it (the
        driver samples every process at the same ticks) to its own time."""
        ticks = dev.ticks
        gaps = sorted(b - a for a, b in itertools.pairwise(ticks) if b > a)
        period = gaps[len(gaps) // 2] if gaps else None
        out = []
        for s in utils:
            end = int(s.timeStamp)
            k = bisect.bisect_left(ticks, end)
            if k > 0 and (period is None or end - ticks[k - 1] <= 2 * period):
                start = ticks[k - 1]
            elif period is not None:
                start = end - period
            else:
                continue  # no period known yet: this sample cannot be placed
            out.append(UtilWindow(dev.index, int(s.pid), start * 1000, end * 1000,
                                  min(100, int(s.smUtil))))
        return out

    def _processes(self, dev: _Device) -> tuple[GpuProcessSample, ...] | None:
        nv = self._nvml
        h = dev.handle
        # Device samples first: every process sample up to the newest is there to be read.
        covered = self._read(dev.index, "utilization_samples", lambda: self._ticks(dev))
        running = self._read(
            dev.index, "processes", lambda: list(nv.nvmlDeviceGetComputeRunningProcesses(h))
        )
        utils = self._read(dev.index, "process_utilization", lambda: self._utilization(dev))
        if covered is not None and utils is not None:
            windows = self._windows_of(dev, utils)
            with self._util_lock:
                self._windows.extend(windows)
                self._covered[dev.index] = covered * 1000
        if running is None and utils is None:
            return None
        memory: dict[int, int | None] = {}
        for p in running or ():
            used = p.usedGpuMemory  # pynvml gives None where NVML has no figure
            memory[int(p.pid)] = None if used is None else int(used)
        latest: dict[int, Any] = {}
        for s in utils or ():
            pid = int(s.pid)
            if pid not in latest or int(s.timeStamp) >= int(latest[pid].timeStamp):
                latest[pid] = s
        return tuple(
            GpuProcessSample(
                pid=pid,
                sm_util_pct=int(latest[pid].smUtil) if pid in latest else None,
                mem_util_pct=int(latest[pid].memUtil) if pid in latest else None,
                used_memory_bytes=memory.get(pid),
            )
            for pid in sorted(memory.keys() | latest.keys())
        )

    def _utilization(self, dev: _Device) -> list[Any]:
        """Process-utilization samples newer than the last ones seen (advances the mark)."""
        nv = self._nvml
        try:
            samples = list(nv.nvmlDeviceGetProcessUtilization(dev.handle, dev.last_util_us))
        except nv.NVMLError_NotFound:
            return []  # no process had a sample since the mark
        except nv.NVMLError as e:
            if e.value == nv.NVML_SUCCESS:
                return []  # pynvml raises "Success" when NVML reports zero samples
            raise
        if samples:
            dev.last_util_us = max(dev.last_util_us, *(int(s.timeStamp) for s in samples))
        return samples

    def close(self) -> None:
        """Shut NVML down (once); the sampler cannot sample afterwards."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        nv = self._nvml
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as e:
            log.debug("nvmlShutdown: %s", _one_line(e))

    def __enter__(self) -> NvmlSampler:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _import_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailable(
            "NVML bindings not installed: the Python package nvidia-ml-py (pynvml) is missing"
        ) from None


def _preload(nv: Any, path: str) -> None:
    """Make pynvml use the NVML library at `path` (it would dlopen libnvidia-ml.so.1 by name).

    pynvml loads the library into its module global `nvmlLib` on the first nvmlInit unless it is
    already set, so setting it first is the supported way to choose the file.
    """
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        reason = _one_line(e).removeprefix(f"{path}: ")
        raise NvmlUnavailable(f"NVML library {path} cannot be loaded: {reason}") from None
    with nv.libLoadLock:
        loaded = nv.nvmlLib
        if loaded is None:
            nv.nvmlLib = lib
        elif loaded._handle != lib._handle:  # dlopen gives one handle per loaded file
            raise NvmlUnavailable(
                f"NVML is already loaded in this process from {loaded._name}; "
                f"cannot switch to {path}"
            )


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def run_sampler(
    sampler: NvmlSampler,
    publish: Callable[[list[GpuSample]], None],
    interval_s: float,
    stop: threading.Event,
) -> None:
    """Sample and publish every `interval_s` (on a fixed schedule) until `stop` is set.

    A failing `publish` (or an unexpected error) is logged and the loop goes on; ticks missed
    because a sample ran long are skipped, not caught up.
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, not {interval_s}")
    next_at = time.monotonic()
    while not stop.is_set():
        try:
            publish(sampler.sample())
        except Exception:
            log.exception("GPU sample not published")
        now = time.monotonic()
        next_at += interval_s
        if next_at < now:
            next_at = now + interval_s - (now - next_at) % interval_s
        stop.wait(next_at - now)


def start_sampler(
    sampler: NvmlSampler,
    publish: Callable[[list[GpuSample]], None],
    interval_s: float,
    stop: threading.Event,
) -> threading.Thread:
    """`run_sampler` in a started daemon thread named gpuflight-nvml; set `stop`, then join."""
    thread = threading.Thread(
        target=run_sampler,
        args=(sampler, publish, interval_s, stop),
        name="gpuflight-nvml",
        daemon=True,
    )
    thread.start()
    return thread


class UtilizationFeed:
    """NVML for request cost: a sampler on its own thread (never the capture loop's), whose
    per-process windows the capture takes (`take`) each turn; `publish` gets each sample too
    (the node's nvml topic). `last` stops the thread and reads NVML until it has reported up to
    `until_ns` (wall clock; at most `wait_s`), so the end of a trace has its GPU time too."""

    def __init__(self, sampler: NvmlSampler, interval_s: float,
                 publish: Callable[[list[GpuSample]], None] | None = None) -> None:
        self.sampler = sampler
        self._stop = threading.Event()
        #: Each GPU's name by index, as its samples give it (what GPU time is priced by).
        self._names: dict[int, str] = {}

        def sampled(samples: list[GpuSample]) -> None:
            self._names.update({s.gpu: s.name for s in samples if s.name})
            if publish is not None:
                publish(samples)
        self._thread = start_sampler(sampler, sampled, interval_s, self._stop)

    def gpu_names(self) -> dict[int, str]:
        """Each GPU's name by index, from the samples so far (any thread)."""
        return dict(self._names)

    def take(self) -> UtilReport:
        return self.sampler.take_utilization()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def last(self, until_ns: int | None = None, wait_s: float = 2.0) -> None:
        self.stop()
        if self._thread.is_alive():
            return  # a sample still running after 10 s: NVML is stuck, read no more
        until = time.time_ns() if until_ns is None else until_ns
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.sampler.sample()
            except Exception as exc:
                log.debug("the last NVML sample failed: %s", exc)
                return
            covered = self.sampler.covered_ns()
            if covered is None or covered >= until or time.monotonic() >= deadline:
                return
            self._stop.wait(0.05)
