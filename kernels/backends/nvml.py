"""NVML device samples taken on a thread of their own, off the launch loop.

:class:`NvmlSampler` reads utilization, memory used, power and clocks every
``interval_s``, plus the GPM metrics SM occupancy and DRAM bandwidth
utilization on GPUs that have GPM (Hopper and newer): those are averages over
the interval between two GPM samples, so each reading spans one interval. The
launch loop only ever reads :meth:`NvmlSampler.latest`, a reference to the last
finished reading: it never waits for NVML and NVML never waits for the GPU.

``nvidia-ml-py`` (module ``pynvml``) is imported lazily; without it, or without
a driver, the sampler reports nothing and :meth:`NvmlSampler.start` returns
False. Errors of single fields are dropped (a GPU may not report power, say).

>>> s = NvmlSampler(0, nvml=None)
>>> s.latest() is None
True
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["GPM_FIELDS", "NvmlSampler", "import_nvml"]

log = logging.getLogger("kernelstream.nvml")

#: DeviceSample field -> name of the pynvml GPM metric id constant.
GPM_FIELDS: dict[str, str] = {
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


def import_nvml() -> ModuleType | None:
    """``pynvml`` (from ``nvidia-ml-py``), or None when it is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class _Gpm:
    """Two GPM sample buffers; each read gives the metrics between the last two samples."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle
        self.ids = {field: int(getattr(nvml, const)) for field, const in GPM_FIELDS.items()}
        self.prev = nvml.nvmlGpmSampleAlloc()
        self.cur = nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(handle, self.prev)

    def read(self) -> dict[str, float]:
        nvml = self.nvml
        nvml.nvmlGpmSampleGet(self.handle, self.cur)
        get = nvml.c_nvmlGpmMetricsGet_t()
        get.version = nvml.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(self.ids)
        get.sample1, get.sample2 = self.prev, self.cur
        for i, metric_id in enumerate(self.ids.values()):
            get.metrics[i].metricId = metric_id
        nvml.nvmlGpmMetricsGet(get)
        self.prev, self.cur = self.cur, self.prev
        out: dict[str, float] = {}
        for i, field in enumerate(self.ids):
            metric = get.metrics[i]
            if int(getattr(metric, "nvmlReturn", 0)):  # this metric failed on its own
                continue
            value = float(metric.value)
            if value == value and value >= 0.0:  # NaN: not measured in this interval
                out[field] = value
        return out

    def free(self) -> None:
        for sample in (self.prev, self.cur):
            with contextlib.suppress(Exception):
                self.nvml.nvmlGpmSampleFree(sample)


class NvmlSampler:
    """Samples one GPU through NVML every ``interval_s`` on a daemon thread.

    ``pci_bus_id`` (as CUDA reports it) picks the NVML device when given, since
    NVML and CUDA may number devices differently; otherwise ``device_index``.
    ``nvml`` injects the module (tests); by default ``pynvml`` is imported.
    """

    def __init__(
        self,
        device_index: int,
        *,
        interval_s: float = 0.5,
        pci_bus_id: str | None = None,
        nvml: ModuleType | Any | bool | None = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.device_index = device_index
        self.interval_s = interval_s
        self.pci_bus_id = pci_bus_id
        self._nvml: Any = import_nvml() if nvml is True else (nvml or None)
        self._clock = clock
        self._handle: Any = None
        self._gpm: _Gpm | None = None
        self._latest: dict[str, float] | None = None
        self._latest_t: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.gpm_supported = False

    # -- lifecycle ---------------------------------------------------------------
    def _open(self) -> bool:
        nvml = self._nvml
        if nvml is None:
            return False
        try:
            nvml.nvmlInit()
            if self.pci_bus_id:
                self._handle = nvml.nvmlDeviceGetHandleByPciBusId(self.pci_bus_id)
            else:
                self._handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as ex:  # no driver, no device: no samples, not an error
            log.warning("NVML unavailable for device %s: %s", self.device_index, ex)
            self._nvml = None
            return False
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(self._handle)
            if int(getattr(support, "isSupportedDevice", 0)):
                self._gpm = _Gpm(nvml, self._handle)
                self.gpm_supported = True
        except Exception as ex:  # pre-Hopper GPU, old driver or old nvidia-ml-py
            log.info("NVML GPM metrics unavailable: %s", ex)
            self._gpm = None
        return True

    def start(self) -> bool:
        """Open NVML and start the thread; False (and no thread) when NVML is unusable."""
        if self._thread is not None:
            return True
        if not self._open():
            return False
        self._thread = threading.Thread(
            target=self._run, name=f"nvml-sampler-{self.device_index}", daemon=True
        )
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop the thread and release NVML (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 2 * self.interval_s))
            self._thread = None
        if self._gpm is not None:
            self._gpm.free()
            self._gpm = None
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None

    # -- sampling ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read_once()

    def read_once(self) -> dict[str, float]:
        """Take one reading now (on the caller's thread) and publish it as the latest."""
        nvml, h = self._nvml, self._handle
        out: dict[str, float] = {}
        if nvml is None:
            return out
        with contextlib.suppress(Exception):
            out["sm_util_pct"] = float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        with contextlib.suppress(Exception):
            out["mem_used_bytes"] = float(nvml.nvmlDeviceGetMemoryInfo(h).used)
        with contextlib.suppress(Exception):
            out["power_w"] = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        with contextlib.suppress(Exception):
            out["sm_clock_mhz"] = float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        with contextlib.suppress(Exception):
            out["mem_clock_mhz"] = float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))
        if self._gpm is not None:
            try:
                out.update(self._gpm.read())
            except Exception as ex:  # keep the plain NVML fields; stop asking GPM
                log.warning("NVML GPM read failed, GPM metrics off: %s", ex)
                self._gpm.free()
                self._gpm = None
        if out:
            # One reference assignment: a reader sees the old or the new dict, never half.
            self._latest, self._latest_t = out, self._clock()
            self.samples += 1
        return out

    def latest(self) -> dict[str, float] | None:
        """The last reading (a copy), or None before the first; never blocks."""
        latest = self._latest
        return dict(latest) if latest else None

    @property
    def latest_t(self) -> float | None:
        """Clock time of the last reading."""
        return self._latest_t

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
