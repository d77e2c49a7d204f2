"""Real GPU backend: the built-in ``.cu`` workloads compiled and run with CuPy.

Each (workload, config) is compiled once with NVRTC, its tunable parameters
passed as ``-DNAME=value``; a batch of ``n`` launches is timed with one CUDA
event per launch boundary and a single synchronisation per batch. Occupancy
uses the compiled kernel's register and static shared-memory counts. CuPy and
NVML (``nvidia-ml-py``) are imported lazily: importing this module needs neither.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from kernels.backends.base import LaunchPlan, LaunchResult, make_plan, well_formed
from kernels.devices import DeviceSpec, device_spec_for_name
from kernels.errors import BackendUnavailableError, UnknownDeviceError
from kernels.space import ParamValue
from kernels.workloads import WORKLOAD_NAMES, CudaWorkload, get_workload, scaled_problem_size
from kernels.workloads.base import Workload

__all__ = ["CupyDevice", "import_cupy"]

_INSTALL_HINT = "install the GPU extra: pip install 'kernelstream[gpu]'"


def import_cupy() -> ModuleType:
    """CuPy, or :class:`BackendUnavailableError` with the install hint."""
    try:
        return importlib.import_module("cupy")
    except ImportError as ex:
        raise BackendUnavailableError(f"the cupy backend needs CuPy: {_INSTALL_HINT}") from ex


def _spec_from_attributes(cp: ModuleType, index: int) -> DeviceSpec:
    """Known datasheet spec for the device's name, else peaks from its attributes."""
    props = cp.cuda.runtime.getDeviceProperties(index)
    raw = props["name"]
    name = raw.decode() if isinstance(raw, bytes) else str(raw)
    with contextlib.suppress(UnknownDeviceError):
        return device_spec_for_name(name)
    cc = (int(props["major"]), int(props["minor"]))
    # FP32 lanes per SM: 64 on cc 8.0 and 9.0, 128 on cc 8.6/8.9 (CUDA Programming Guide,
    # "Arithmetic Instructions" throughput table); 2 FLOPs per FMA.
    lanes = 64 if cc in ((8, 0), (9, 0)) else 128
    sms = int(props["multiProcessorCount"])
    clock_khz = float(props.get("clockRate", 0) or 1_500_000)
    mem_khz = float(props.get("memoryClockRate", 0) or 0)
    bus_bits = float(props.get("memoryBusWidth", 0) or 0)
    peak_gbs = 2.0 * mem_khz * 1e3 * bus_bits / 8.0 / 1e9 if mem_khz and bus_bits else 1000.0
    return DeviceSpec(
        name=name,
        sms=sms,
        peak_gbs=peak_gbs,
        peak_gflops_fp32=sms * lanes * 2.0 * clock_khz * 1e3 / 1e9,
        max_threads_per_sm=int(props["maxThreadsPerMultiProcessor"]),
        max_blocks_per_sm=int(props.get("maxBlocksPerMultiProcessor", 32)),
        regs_per_sm=int(props["regsPerMultiprocessor"]),
        smem_per_sm_bytes=int(props["sharedMemPerMultiprocessor"]),
        max_smem_per_block_bytes=int(props.get("sharedMemPerBlockOptin", 48 * 1024)),
        l2_bytes=int(props.get("l2CacheSize", 0)),
        compute_capability=cc,
        source="CUDA device attributes (cudaGetDeviceProperties)",
    )


class CupyDevice:
    """One NVIDIA GPU running the built-in workloads through CuPy."""

    backend = "cupy"

    def __init__(self, *, device_index: int = 0, seed: int = 0, problem_scale: float = 1.0) -> None:
        self._cp = import_cupy()
        self.device_index = device_index
        self._device = self._cp.cuda.Device(device_index)
        self.spec = _spec_from_attributes(self._cp, device_index)
        self._rng = np.random.default_rng(seed)
        self._workloads: list[CudaWorkload] = [
            get_workload(n, None if problem_scale == 1.0 else scaled_problem_size(n, problem_scale))
            for n in WORKLOAD_NAMES
        ]
        self._functions: dict[tuple[str, tuple[int, ...], str], Any] = {}
        self._failed: dict[tuple[str, tuple[int, ...], str], str] = {}
        self._arrays: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
        self._nvml: Any = None
        self._nvml_handle: Any = None

    def workloads(self) -> list[Workload]:
        return list(self._workloads)

    def _key(
        self, w: CudaWorkload, config: Mapping[str, ParamValue]
    ) -> tuple[str, tuple[int, ...], str]:
        return (w.name, w.problem_size, w.space.config_id(config))

    def compile(self, workload: CudaWorkload, config: Mapping[str, ParamValue]) -> Any:
        """The compiled kernel function of ``config`` (cached per workload and config id)."""
        key = self._key(workload, config)
        fn = self._functions.get(key)
        if fn is None:
            options = ("-std=c++14", *(f"-D{k}={v}" for k, v in workload.defines(config).items()))
            code = workload.source.read_text(encoding="utf-8")
            with self._device:
                module = self._cp.RawModule(code=code, options=options)
                fn = module.get_function(workload.kernel_name)
            self._functions[key] = fn
        return fn

    def arrays(self, workload: CudaWorkload) -> dict[str, Any]:
        """Device copies of the workload's inputs (allocated once per workload)."""
        key = (workload.name, workload.problem_size)
        if key not in self._arrays:
            host = workload.make_inputs(self._rng)
            with self._device:
                self._arrays[key] = {k: self._cp.asarray(v) for k, v in host.items()}
        return self._arrays[key]

    def plan(self, workload: Workload, config: Mapping[str, ParamValue]) -> LaunchPlan:
        cfg = well_formed(workload.space, config)
        if isinstance(workload, CudaWorkload) and workload.space.is_valid(cfg):
            try:
                fn = self.compile(workload, cfg)
                return make_plan(
                    self.spec,
                    workload,
                    cfg,
                    registers_per_thread=int(fn.num_regs),
                    static_smem_bytes=int(fn.shared_size_bytes),
                )
            except Exception:  # a compile failure shows up as a failed launch
                pass
        return make_plan(self.spec, workload, cfg)

    def launch(self, workload: Workload, config: Mapping[str, ParamValue], n: int) -> LaunchResult:
        if n <= 0 or not isinstance(workload, CudaWorkload) or not workload.space.is_valid(config):
            return LaunchResult.failed(max(n, 0))
        key = self._key(workload, config)
        if key in self._failed:
            return LaunchResult.failed(n)
        cp = self._cp
        try:
            fn = self.compile(workload, config)
            geo = workload.geometry(config)
            args = workload.kernel_args(self.arrays(workload))
            with self._device:
                stream = cp.cuda.get_current_stream()
                events = [cp.cuda.Event() for _ in range(n + 1)]
                events[0].record(stream)
                for i in range(n):
                    fn(geo.grid, geo.block, args, shared_mem=geo.dynamic_smem_bytes)
                    events[i + 1].record(stream)
                events[-1].synchronize()
                ms = [cp.cuda.get_elapsed_time(events[i], events[i + 1]) for i in range(n)]
        except Exception as ex:  # compile or launch error: this config cannot run here
            self._failed[key] = f"{type(ex).__name__}: {ex}"
            return LaunchResult.failed(n)
        return LaunchResult(np.asarray(ms, dtype=np.float64) * 1000.0, np.ones(n, dtype=bool))

    def failure_reason(self, workload: Workload, config: Mapping[str, ParamValue]) -> str | None:
        """Why ``config`` failed to compile or launch here, if it did."""
        if not isinstance(workload, CudaWorkload):
            return None
        return self._failed.get(self._key(workload, config))

    def _nvml_init(self) -> bool:
        if self._nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
                nvml.nvmlInit()
                self._nvml_handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
                self._nvml = nvml
            except Exception:  # NVML missing or unusable: no samples, not an error
                self._nvml = False
        return bool(self._nvml)

    def sample(self) -> dict[str, float] | None:
        """NVML utilization, memory, power and clocks; None without ``nvidia-ml-py``."""
        if not self._nvml_init():
            return None
        nvml, h = self._nvml, self._nvml_handle
        out: dict[str, float] = {}
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
        return out or None

    def close(self) -> None:
        self._functions.clear()
        self._arrays.clear()
        if self._nvml:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._nvml = None
