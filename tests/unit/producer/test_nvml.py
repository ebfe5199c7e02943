# ruff: noqa: N802 (the fake's methods are named like pynvml's functions)
"""NVML sampler: the real Debian libnvidia-ml.so.1 on a machine without a driver, a missing
library, and decoding against a fake pynvml (real pynvml structs and errors, fake functions)."""

from __future__ import annotations

import ctypes
import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import orjson
import pytest

from gpuflight.producer.contract import wire
from gpuflight.producer.contract.errors import GpuflightError
from gpuflight.producer.contract.wire import GpuProcessSample, GpuSample
from gpuflight.producer.nvml import (
    LIBRARY_ENV,
    NvmlSampler,
    NvmlUnavailable,
    UtilReport,
    UtilWindow,
    run_sampler,
    start_sampler,
)
from tests.conftest import REPO, require

#: Unpacked by scripts/setup-nvml from Debian's libnvidia-ml1.
DEBIAN_NVML = REPO / ".cache" / "nvidia-driver" / "libnvidia-ml.so.1"

pynvml = importlib.import_module("pynvml")


@pytest.fixture(autouse=True)
def _no_library_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIBRARY_ENV, raising=False)


@pytest.fixture
def fresh_pynvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The real pynvml with no library loaded, put back as it was afterwards."""
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    return pynvml


# -- the real library --------------------------------------------------------------------------


def test_debian_library_loads_and_says_no_driver(fresh_pynvml: ModuleType) -> None:
    if not DEBIAN_NVML.exists():
        require(f"no {DEBIAN_NVML.relative_to(REPO)} (run scripts/setup-nvml)")
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("an NVIDIA driver is loaded on this machine")
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlSampler(DEBIAN_NVML)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("NVIDIA driver not loaded:")
    assert str(DEBIAN_NVML) in message
    assert isinstance(caught.value, GpuflightError)
    # The library really was loaded from that file (and the failure was NVML's own answer).
    assert Path(fresh_pynvml.nvmlLib._name) == DEBIAN_NVML


def test_debian_library_through_the_environment(
    fresh_pynvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not DEBIAN_NVML.exists():
        require(f"no {DEBIAN_NVML.relative_to(REPO)} (run scripts/setup-nvml)")
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("an NVIDIA driver is loaded on this machine")
    monkeypatch.setenv(LIBRARY_ENV, str(DEBIAN_NVML))
    with pytest.raises(NvmlUnavailable, match=r"^NVIDIA driver not loaded:"):
        NvmlSampler()


def test_missing_library_path(fresh_pynvml: ModuleType, tmp_path: Path) -> None:
    missing = tmp_path / "libnvidia-ml.so.1"
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlSampler(missing)
    assert str(caught.value) == (
        f"NVML library {missing} cannot be loaded: "
        "cannot open shared object file: No such file or directory"
    )
    assert fresh_pynvml.nvmlLib is None


def test_missing_library_from_the_environment(
    fresh_pynvml: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nvml.so"
    monkeypatch.setenv(LIBRARY_ENV, str(missing))
    with pytest.raises(NvmlUnavailable, match=f"^NVML library {missing} cannot be loaded: "):
        NvmlSampler()


def test_another_library_already_loaded() -> None:
    fake = FakeNvml().module()
    fake.nvmlLib = ctypes.CDLL("libc.so.6")
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlSampler("libm.so.6", nvml=fake)
    assert str(caught.value) == (
        "NVML is already loaded in this process from libc.so.6; cannot switch to libm.so.6"
    )


def test_same_library_twice_is_fine() -> None:
    fake = FakeNvml().module()
    NvmlSampler("libm.so.6", nvml=fake).close()
    first = fake.nvmlLib
    NvmlSampler("libm.so.6", nvml=fake).close()
    assert fake.nvmlLib is first


def test_bindings_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlUnavailable, match=r"nvidia-ml-py \(pynvml\) is missing$"):
        NvmlSampler()


# -- a fake pynvml ------------------------------------------------------------------------------

GIB = 1 << 30


class FakeNvml:
    """NVML as pynvml presents it, for two GPUs: an H100 that reports everything, and a GPU
    that lacks power, PCIe counters and per-process utilization (NVMLError_NotSupported)."""

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.init_error: BaseException | None = None
        self.lost: set[int] = set()
        self.shutdowns = 0
        self.util_calls: list[tuple[int, int]] = []
        self.samples: dict[int, list[Any]] = {
            0: [
                pynvml.c_nvmlProcessUtilizationSample_t(4242, 1_700_000_000_000_000, 50, 20, 0, 0),
                pynvml.c_nvmlProcessUtilizationSample_t(5151, 1_700_000_000_100_000, 3, 1, 0, 0),
                pynvml.c_nvmlProcessUtilizationSample_t(4242, 1_700_000_000_200_000, 91, 38, 0, 0),
            ],
        }

        #: Device utilization samples of GPU 0: one per driver sample period (100 ms).
        self.ticks: dict[int, list[int]] = {
            0: [1_699_999_999_900_000, 1_700_000_000_000_000, 1_700_000_000_100_000,
                1_700_000_000_200_000],
        }

    def module(self) -> Any:
        fake: Any = ModuleType("pynvml")
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError")) or name == "NVMLLibraryMismatchError":
                setattr(fake, name, getattr(pynvml, name))
        fake.nvmlLib = None
        fake.libLoadLock = threading.Lock()
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(fake, name, getattr(self, name))
        return fake

    @staticmethod
    def _not_supported() -> Exception:
        return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # type: ignore[no-any-return]

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return 1000 + index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-8a1f3c2e-77b0-4c1d-9e55-00000000000{handle - 1000}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H100 80GB HBM3" if handle == 1000 else "Tesla T4"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return pynvml.c_nvmlUtilization_t(*((87, 41) if handle == 1000 else (0, 0)))

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        if handle == 1000:
            return pynvml.c_nvmlMemory_t(80 * GIB, 48 * GIB, 32 * GIB)
        return pynvml.c_nvmlMemory_t(15 * GIB, 15 * GIB - (256 << 20), 256 << 20)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 1000:
            return 312_456
        raise self._not_supported()

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 64 if handle == 1000 else 38

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return 1980 if handle == 1000 else 585

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        if handle != 1000:
            raise self._not_supported()
        return {pynvml.NVML_PCIE_UTIL_RX_BYTES: 1_250_000, pynvml.NVML_PCIE_UTIL_TX_BYTES: 48_000}[
            counter
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        if handle != 1000:
            return []
        return [
            pynvml.nvmlFriendlyObject(
                {"pid": 4242, "usedGpuMemory": 16 * GIB, "gpuInstanceId": 0xFFFFFFFF,
                 "computeInstanceId": 0xFFFFFFFF}
            ),
            # pynvml turns NVML_VALUE_NOT_AVAILABLE into None
            pynvml.nvmlFriendlyObject(
                {"pid": 4343, "usedGpuMemory": None, "gpuInstanceId": 0xFFFFFFFF,
                 "computeInstanceId": 0xFFFFFFFF}
            ),
        ]

    def nvmlDeviceGetSamples(self, handle: int, kind: int, last_seen: int) -> tuple[int, list[Any]]:
        assert kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        if handle != 1000:
            raise self._not_supported()
        newer = [pynvml.c_nvmlSample_t(ts, pynvml.c_nvmlValue_t(uiVal=50))
                 for ts in self.ticks.get(handle - 1000, []) if ts > last_seen]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, newer

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen: int) -> list[Any]:
        self.util_calls.append((handle, last_seen))
        if handle != 1000:
            raise self._not_supported()
        newer = [s for s in self.samples.get(handle - 1000, []) if s.timeStamp > last_seen]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return newer


H100 = {
    "gpu": 0,
    "uuid": "GPU-8a1f3c2e-77b0-4c1d-9e55-000000000000",
    "name": "NVIDIA H100 80GB HBM3",
    "utilization_gpu_pct": 87,
    "utilization_memory_pct": 41,
    "memory_used_bytes": 34_359_738_368,
    "memory_total_bytes": 85_899_345_920,
    "power_w": 312.456,
    "temperature_c": 64,
    "sm_clock_mhz": 1980,
    "pcie_rx_bytes_per_s": 1_280_000_000,
    "pcie_tx_bytes_per_s": 49_152_000,
    "processes": [
        {"pid": 4242, "sm_util_pct": 91, "mem_util_pct": 38, "used_memory_bytes": 17_179_869_184},
        {"pid": 4343, "sm_util_pct": None, "mem_util_pct": None, "used_memory_bytes": None},
        {"pid": 5151, "sm_util_pct": 3, "mem_util_pct": 1, "used_memory_bytes": None},
    ],
}
T4 = {
    "gpu": 1,
    "uuid": "GPU-8a1f3c2e-77b0-4c1d-9e55-000000000001",
    "name": "Tesla T4",
    "utilization_gpu_pct": 0,
    "utilization_memory_pct": 0,
    "memory_used_bytes": 268_435_456,
    "memory_total_bytes": 16_106_127_360,
    "power_w": None,
    "temperature_c": 38,
    "sm_clock_mhz": 585,
    "pcie_rx_bytes_per_s": None,
    "pcie_tx_bytes_per_s": None,
    "processes": [],
}


def test_sample_decodes_every_gauge_and_none_for_unsupported() -> None:
    nvml = FakeNvml()
    with NvmlSampler(nvml=nvml.module()) as sampler:
        samples = sampler.sample()
    assert wire_form(samples) == [H100, T4]
    assert nvml.shutdowns == 1


def test_process_utilization_covers_the_time_since_the_last_sample() -> None:
    nvml = FakeNvml()
    sampler = NvmlSampler(nvml=nvml.module())
    sampler.sample()
    second = sampler.sample()[0]
    # Nothing new since the newest sample seen: utilization unknown, memory still reported.
    assert second.processes == (
        GpuProcessSample(4242, None, None, 17_179_869_184),
        GpuProcessSample(4343, None, None, None),
    )
    nvml.samples[0].append(
        pynvml.c_nvmlProcessUtilizationSample_t(4343, 1_700_000_001_000_000, 12, 5, 0, 0)
    )
    third = sampler.sample()[0]
    assert third.processes is not None
    assert third.processes[1] == GpuProcessSample(4343, 12, 5, None)
    assert [ts for handle, ts in nvml.util_calls if handle == 1000] == [
        0, 1_700_000_000_200_000, 1_700_000_000_200_000,
    ]


def test_process_samples_become_windows_of_the_driver_sample_period() -> None:
    """Each process sample covers the device sample period it ends (NVML gives none for a
    period a process was idle in); the device samples say up to when NVML has reported."""
    nvml = FakeNvml()
    sampler = NvmlSampler(nvml=nvml.module())
    sampler.sample()
    report = sampler.take_utilization()
    us = 1_000  # ns
    assert report.windows == (
        UtilWindow(0, 4242, 1_699_999_999_900_000 * us, 1_700_000_000_000_000 * us, 50),
        UtilWindow(0, 5151, 1_700_000_000_000_000 * us, 1_700_000_000_100_000 * us, 3),
        UtilWindow(0, 4242, 1_700_000_000_100_000 * us, 1_700_000_000_200_000 * us, 91),
    )
    assert report.covered_ns == {0: 1_700_000_000_200_000 * us}  # the T4 gives no samples
    assert report.windows[0].gpu_ns == 0.5 * 100_000_000
    assert sampler.take_utilization().windows == ()  # taken once
    # 800 ms later, a period no device sample was read for yet: one period (the median gap).
    nvml.samples[0].append(
        pynvml.c_nvmlProcessUtilizationSample_t(4343, 1_700_000_001_000_000, 12, 5, 0, 0))
    nvml.ticks[0].append(1_700_000_001_000_000)
    sampler.sample()
    (window,) = sampler.take_utilization().windows
    assert (window.start_ns, window.end_ns) == (1_700_000_000_900_000 * us,
                                                1_700_000_001_000_000 * us)
    assert sampler.covered_ns() == 1_700_000_001_000_000 * us


def test_no_device_samples_no_windows() -> None:
    """Without device samples the period of a process sample is unknown: no windows, and
    nothing covered (request GPU time stays queued time)."""
    nvml = FakeNvml(count=1)
    fake = nvml.module()

    def not_supported(*_args: object) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    fake.nvmlDeviceGetSamples = not_supported
    sampler = NvmlSampler(nvml=fake)
    (sample,) = sampler.sample()
    assert sample.processes is not None and sample.processes[0].sm_util_pct == 91
    assert sampler.take_utilization() == UtilReport((), {})
    assert sampler.covered_ns() is None


def test_zero_process_samples_reported_as_success() -> None:
    """pynvml raises NVMLError(NVML_SUCCESS) when NVML answers 'no samples' with success."""
    nvml = FakeNvml(count=1)

    def success(handle: int, last_seen: int) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_SUCCESS)

    fake = nvml.module()
    fake.nvmlDeviceGetProcessUtilization = success
    (sample,) = NvmlSampler(nvml=fake).sample()
    assert sample.processes == (
        GpuProcessSample(4242, None, None, 17_179_869_184),
        GpuProcessSample(4343, None, None, None),
    )


def test_no_process_figures_at_all_is_none() -> None:
    nvml = FakeNvml(count=1)
    fake = nvml.module()

    def not_supported(*_args: object) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    fake.nvmlDeviceGetProcessUtilization = not_supported
    fake.nvmlDeviceGetComputeRunningProcesses = not_supported
    (sample,) = NvmlSampler(nvml=fake).sample()
    assert sample.processes is None
    assert wire_form([sample])[0]["processes"] is None


def test_every_gauge_failing_still_gives_a_sample() -> None:
    """A GPU that fell off the bus: every call fails, the sample is all None."""
    nvml = FakeNvml(count=1)
    fake = nvml.module()

    def lost(*_args: object) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def mismatch(*_args: object) -> Any:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called ...")

    for name in dir(fake):
        if name.startswith("nvmlDeviceGet") and name not in {
            "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
        }:
            setattr(fake, name, lost)
    fake.nvmlDeviceGetComputeRunningProcesses = mismatch
    (sample,) = NvmlSampler(nvml=fake).sample()
    assert sample == GpuSample(0, *([None] * 12))


def test_gpu_without_a_handle_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(count=3)
    nvml.lost = {1}
    with caplog.at_level(logging.WARNING, logger="gpuflight.producer.nvml"):
        sampler = NvmlSampler(nvml=nvml.module())
    assert [d.index for d in sampler.devices] == [0, 2]
    assert caplog.messages == ["GPU 1 is skipped: NVML gives no handle (GPU is lost)"]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "NVML library not found: no libnvidia-ml.so.1 on the loader path (no NVIDIA driver "
            "installed here?); GPUFLIGHT_NVML_LIB can name the file",
        ),
        (
            pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
            "NVIDIA driver not loaded: NVML (libnvidia-ml.so.1) is there, but no kernel driver "
            "answers",
        ),
        (
            pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            "NVML library libnvidia-ml.so.1 does not match the loaded NVIDIA kernel driver",
        ),
        (
            pynvml.NVML_ERROR_NO_PERMISSION,
            "NVML has no permission to open the NVIDIA devices (/dev/nvidia*)",
        ),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML failed to initialise: Unknown Error"),
    ],
)
def test_init_errors_are_one_line(error: int, expected: str) -> None:
    nvml = FakeNvml()
    nvml.init_error = pynvml.NVMLError(error)
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlSampler(nvml=nvml.module())
    assert str(caught.value) == expected
    assert nvml.shutdowns == 0


def test_no_gpu() -> None:
    nvml = FakeNvml(count=0)
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlSampler(nvml=nvml.module())
    assert str(caught.value) == "no GPU: the NVIDIA driver is loaded but NVML sees no device"
    assert nvml.shutdowns == 1


def test_no_gpu_can_be_opened() -> None:
    nvml = FakeNvml(count=2)
    nvml.lost = {0, 1}
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlSampler(nvml=nvml.module())
    assert str(caught.value) == "no GPU: NVML sees 2 device(s) but can open none"
    assert nvml.shutdowns == 1


# -- the wire form ------------------------------------------------------------------------------


def wire_form(samples: list[GpuSample]) -> list[dict[str, Any]]:
    """The samples as the nvml topic carries them."""
    value = wire.encode_nvml(wire.NvmlRecord("node", 1, tuple(samples)))
    gpus: list[dict[str, Any]] = orjson.loads(value)["gpus"]
    return gpus


def from_wire(gpus: list[dict[str, Any]]) -> tuple[GpuSample, ...]:
    message = {"schema": wire.NVML_SCHEMA, "v": 1, "host": "node", "ts_ns": 1, "gpus": gpus}
    return wire.decode_nvml(orjson.dumps(message)).gpus


@pytest.mark.parametrize("data", [H100, T4], ids=["h100", "t4"])
def test_round_trip(data: dict[str, Any]) -> None:
    (sample,) = from_wire([data])
    assert wire_form([sample]) == [data]
    assert from_wire(wire_form([sample])) == (sample,)


def test_round_trip_of_sampled_values() -> None:
    samples = NvmlSampler(nvml=FakeNvml().module()).sample()
    assert from_wire(wire_form(samples)) == tuple(samples)


def test_power_as_a_json_integer() -> None:
    (sample,) = from_wire([{**H100, "power_w": 300}])
    assert sample.power_w == 300.0
    assert isinstance(sample.power_w, float)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"temperature_c": "64"},
         "Expected `int | null`, got `str` - at `$.gpus[0].temperature_c`"),
        ({"gpu": None}, "Expected `int`, got `null` - at `$.gpus[0].gpu`"),
        ({"uuid": 7}, "Expected `str | null`, got `int` - at `$.gpus[0].uuid`"),
        ({"power_w": True}, "Expected `float | null`, got `bool` - at `$.gpus[0].power_w`"),
        ({"memory_used_bytes": 1.5},
         "Expected `int | null`, got `float` - at `$.gpus[0].memory_used_bytes`"),
        ({"processes": {"pid": 1}},
         "Expected `array | null`, got `object` - at `$.gpus[0].processes`"),
        ({"processes": [{"pid": 1}]},
         "Object missing required field `sm_util_pct` - at `$.gpus[0].processes[0]`"),
    ],
)
def test_bad_fields_are_wire_errors(change: dict[str, object], message: str) -> None:
    with pytest.raises(wire.WireError) as caught:
        from_wire([{**H100, **change}])
    assert str(caught.value) == f"malformed gpuflight.nvml message: {message}"


def test_missing_field() -> None:
    data = dict(H100)
    del data["sm_clock_mhz"]
    with pytest.raises(wire.WireError,
                       match=r"missing required field `sm_clock_mhz` - at `\$\.gpus\[0\]`$"):
        from_wire([data])


# -- the loop -----------------------------------------------------------------------------------


def test_run_sampler_publishes_until_stopped(caplog: pytest.LogCaptureFixture) -> None:
    sampler = NvmlSampler(nvml=FakeNvml().module())
    stop = threading.Event()
    published: list[list[GpuSample]] = []

    def publish(samples: list[GpuSample]) -> None:
        published.append(samples)
        if len(published) == 2:
            raise BufferError("Local: Queue full")
        if len(published) == 4:
            stop.set()

    run_sampler(sampler, publish, 0.001, stop)
    assert len(published) == 4
    assert all(len(batch) == 2 for batch in published)
    assert caplog.messages == ["GPU sample not published"]


def test_start_sampler_thread_stops() -> None:
    sampler = NvmlSampler(nvml=FakeNvml().module())
    stop = threading.Event()
    got = threading.Event()
    publish: Callable[[list[GpuSample]], None] = lambda _samples: got.set()  # noqa: E731
    thread = start_sampler(sampler, publish, 60.0, stop)
    assert thread.name == "gpuflight-nvml"
    assert got.wait(5)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()


def test_run_sampler_rejects_a_bad_interval() -> None:
    with pytest.raises(ValueError, match="interval_s must be positive"):
        run_sampler(NvmlSampler(nvml=FakeNvml().module()), lambda _s: None, 0, threading.Event())


def test_trace_top_gets_gpu_time_and_names_from_the_trace_s_nvml(tmp_path: Path) -> None:
    """`trace --top`: the trace's NVML feed gives its screen's table each GPU's name and
    each process's GPU time (the capture takes the windows each turn and hands them on)."""
    from gpuflight.producer import trace
    from gpuflight.producer.top import TopFeed
    from gpuflight.producer.toptable import TopTable

    top = TopFeed(TopTable(proc_root=tmp_path), path=tmp_path / "top.sock",
                  ends_with_capture=False)
    capture = SimpleNamespace(requests=None, utilization=None, utilization_observers=[])
    _, feed = trace._utilization(capture, NvmlSampler(nvml=FakeNvml().module()),  # type: ignore[arg-type]
                                 "H100", tops=[top])
    assert feed is not None
    try:
        assert capture.utilization is feed
        assert capture.utilization_observers == [top.add_utilization]
        assert top.table.gpu_names is not None
        deadline = time.monotonic() + 10
        while not top.table.gpu_names():  # the sampler thread's first sample
            assert time.monotonic() < deadline, "no NVML sample"
            time.sleep(0.01)
        assert top.table.gpu_names()[0] == "NVIDIA H100 80GB HBM3"
    finally:
        feed.stop()
        feed.sampler.close()
