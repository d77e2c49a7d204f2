"""The NVML sampler's threading and record shape, against a fake ``pynvml``.

The fake stands in for NVML only to check our own logic (thread, latest reading,
GPM interval bookkeeping, degradation); it says nothing about real hardware,
where these calls are unverified until a GPU session runs ``pytest -m gpu``.
"""

from __future__ import annotations

import itertools
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from kernelstream.kernels.backends.nvml import NvmlSampler


class _MetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(16)]


class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_OCCUPANCY, NVML_GPM_METRIC_DRAM_BW_UTIL = 3, 10
    c_nvmlGpmMetricsGet_t = _MetricsGet  # noqa: N815

    def __init__(self, *, gpm: bool = True, gpm_breaks: bool = False) -> None:
        self.gpm, self.gpm_breaks = gpm, gpm_breaks
        self.calls: list[str] = []
        self.ticks = itertools.count()
        self.freed = 0
        self.lock = threading.Lock()

    def nvmlInit(self) -> None:  # noqa: N802
        self.calls.append("init")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:  # noqa: N802
        return f"index-{i}"

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> str:  # noqa: N802
        return f"bus-{bus}"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:  # noqa: N802
        return SimpleNamespace(used=3 * 2**30, total=141 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:  # noqa: N802
        return 412_500  # mW

    def nvmlDeviceGetClockInfo(self, h: str, which: int) -> int:  # noqa: N802
        return 1980 if which == self.NVML_CLOCK_SM else 2619

    def nvmlGpmQueryDeviceSupport(self, h: str) -> Any:  # noqa: N802
        return SimpleNamespace(isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self) -> Any:  # noqa: N802
        return SimpleNamespace(tick=None)

    def nvmlGpmSampleGet(self, h: str, sample: Any) -> None:  # noqa: N802
        with self.lock:
            sample.tick = next(self.ticks)

    def nvmlGpmMetricsGet(self, get: _MetricsGet) -> None:  # noqa: N802
        if self.gpm_breaks:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        assert get.version == 1 and get.numMetrics == 2
        assert get.sample1.tick < get.sample2.tick  # an interval: older sample first
        values = {3: 42.0, 10: 63.5}
        for m in get.metrics[: get.numMetrics]:
            m.value = values[m.metricId]

    def nvmlGpmSampleFree(self, sample: Any) -> None:  # noqa: N802
        self.freed += 1


def test_one_reading_has_every_field_and_gpm_spans_an_interval() -> None:
    nvml = FakeNvml()
    s = NvmlSampler(0, nvml=nvml, clock=lambda: 123.0)
    assert s._open() and s.gpm_supported
    first = s.read_once()
    second = s.read_once()  # uses the previous reading's GPM sample as its start
    for r in (first, second):
        assert r == {
            "sm_util_pct": 37.0,
            "mem_used_bytes": float(3 * 2**30),
            "power_w": 412.5,
            "sm_clock_mhz": 1980.0,
            "mem_clock_mhz": 2619.0,
            "sm_occupancy_pct": 42.0,
            "dram_bw_util_pct": 63.5,
        }
    assert s.latest() == second and s.latest_t == 123.0
    got = s.latest()
    assert got is not None
    got["power_w"] = -1.0  # a copy: the reader cannot corrupt the sampler's reading
    assert s.latest() == second


def test_thread_samples_in_the_background_and_stops() -> None:
    nvml = FakeNvml()
    s = NvmlSampler(1, interval_s=0.01, nvml=nvml, pci_bus_id="0000:19:00.0")
    assert s.start() and s.running
    deadline = time.monotonic() + 10.0
    while s.samples < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.samples >= 3
    assert s._handle == "bus-0000:19:00.0"
    s.stop()
    assert not s.running and nvml.calls[-1] == "shutdown" and nvml.freed == 2
    s.stop()  # idempotent


def test_without_nvml_there_are_no_samples() -> None:
    s = NvmlSampler(0, nvml=None)
    assert not s.start() and s.latest() is None and not s.running

    class Broken(FakeNvml):
        def nvmlInit(self) -> None:  # noqa: N802
            raise RuntimeError("NVML Shared Library Not Found")

    s = NvmlSampler(0, nvml=Broken())
    assert not s.start() and s.read_once() == {}


@pytest.mark.parametrize("kind", ["unsupported", "breaks"])
def test_gpm_missing_or_failing_keeps_the_plain_fields(kind: str) -> None:
    nvml = FakeNvml(gpm=kind != "unsupported", gpm_breaks=kind == "breaks")
    s = NvmlSampler(0, nvml=nvml)
    assert s._open()
    r = s.read_once()
    assert "sm_occupancy_pct" not in r and r["sm_util_pct"] == 37.0
    assert s._gpm is None  # a failing GPM is switched off, not retried every sample
