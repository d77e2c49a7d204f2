"""Real GPU backend: the built-in ``.cu`` workloads compiled and run with CuPy.

Each (workload, config) is compiled once with NVRTC, its tunable parameters
passed as ``-DNAME=value`` (compile-time constants); compiled functions are
cached per workload, problem size and config id (and CuPy caches the binaries
on disk). A batch of ``n`` launches is timed with a CUDA event before and after
every launch and a single synchronisation per batch, so host gaps between
launches are not counted as kernel time and telemetry never synchronises per
launch. Occupancy comes from the driver's occupancy query on the compiled
function (``cuOccupancyMaxActiveBlocksPerMultiprocessor``), falling back to
:func:`kernels.devices.theoretical_occupancy` with the function's register and
shared-memory counts. Peak bandwidth and FP32 FLOP/s come from the device's
attributes. Device samples come from :class:`kernels.backends.nvml.NvmlSampler`
on its own thread. CuPy and NVML (``nvidia-ml-py``) are imported lazily:
importing this module needs neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter as _clock
from types import ModuleType
from typing import Any

import numpy as np

from kernelstream.kernels.backends.base import LaunchPlan, LaunchResult, make_plan, well_formed
from kernelstream.kernels.backends.nvml import NvmlSampler
from kernelstream.kernels.devices import DeviceSpec, device_spec_for_name
from kernelstream.kernels.errors import BackendUnavailableError, UnknownDeviceError
from kernelstream.kernels.space import Config, ParamValue
from kernelstream.kernels.workloads import (
    WORKLOAD_NAMES,
    CudaWorkload,
    get_workload,
    scaled_problem_size,
)
from kernelstream.kernels.workloads.base import Workload

__all__ = [
    "INSTALL_HINT",
    "CupyDevice",
    "device_attributes",
    "fp32_lanes_per_sm",
    "import_cupy",
    "spec_from_attributes",
]

INSTALL_HINT = (
    "install the GPU extra: pip install 'kernelstream[gpu]' (CUDA 13: 'kernelstream[gpu-cuda13]')"
)

_Key = tuple[str, tuple[int, ...], str]


def import_cupy() -> ModuleType:
    """CuPy, or :class:`BackendUnavailableError` with the install hint."""
    try:
        return importlib.import_module("cupy")
    except ImportError as ex:
        raise BackendUnavailableError(f"the cupy backend needs CuPy: {INSTALL_HINT}") from ex


def fp32_lanes_per_sm(cc: tuple[int, int]) -> int:
    """FP32 FMA lanes per SM (CUDA C++ Programming Guide, arithmetic throughput table).

    64 on cc 6.0, 7.x and 8.0; 128 on 6.1/6.2, 8.6/8.7/8.9, 9.0 and newer.

    >>> fp32_lanes_per_sm((8, 0)), fp32_lanes_per_sm((9, 0)), fp32_lanes_per_sm((8, 6))
    (64, 128, 128)
    """
    if cc == (6, 0) or cc[0] == 7 or cc == (8, 0):
        return 64
    return 128


# The CUDA device attributes the spec reads, by their ``cudaDeviceAttr`` values (CUDA
# runtime API, ``driver_types.h``). ``cupy.cuda.Device.attributes`` is read first; an
# attribute it lacks is asked of ``cudaDeviceGetAttribute`` by value, so a CuPy release
# that names or omits attributes differently still gives the device's own limits.
_CUDA_ATTRIBUTES = {
    "ClockRate": 13,
    "MultiProcessorCount": 16,
    "MemoryClockRate": 36,
    "GlobalMemoryBusWidth": 37,
    "L2CacheSize": 38,
    "MaxThreadsPerMultiProcessor": 39,
    "ComputeCapabilityMajor": 75,
    "ComputeCapabilityMinor": 76,
    "MaxSharedMemoryPerMultiprocessor": 81,
    "MaxRegistersPerMultiprocessor": 82,
    "MaxSharedMemoryPerBlockOptin": 97,
    "MaxBlocksPerMultiprocessor": 106,
}


def device_attributes(cp: ModuleType, device_index: int) -> dict[str, int]:
    """The attributes :func:`spec_from_attributes` reads, for one device.

    Each comes from ``Device.attributes`` where CuPy has it, else from
    ``cudaDeviceGetAttribute``; the compute capability falls back to
    ``Device.compute_capability`` (``"90"``). An attribute no route gives is left out
    (the spec then keeps the datasheet value).
    """
    device = cp.cuda.Device(device_index)
    have: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        have = dict(device.attributes)
    out: dict[str, int] = {}
    for key, number in _CUDA_ATTRIBUTES.items():
        value = have.get(key)
        if value is None:
            with contextlib.suppress(Exception):
                value = cp.cuda.runtime.deviceGetAttribute(number, device_index)
        if value is not None:
            out[key] = int(value)
    if "ComputeCapabilityMajor" not in out or "ComputeCapabilityMinor" not in out:
        with contextlib.suppress(Exception):
            cc = str(device.compute_capability)
            out["ComputeCapabilityMajor"], out["ComputeCapabilityMinor"] = int(cc[:-1]), int(cc[-1])
    return out


def spec_from_attributes(name: str, attrs: Mapping[str, Any]) -> DeviceSpec:
    """The device's spec with peaks and per-SM limits from its CUDA attributes.

    ``attrs`` is ``cupy.cuda.Device(i).attributes`` (``cudaDeviceGetAttribute``
    names without the ``cudaDevAttr`` prefix). Peak DRAM bandwidth is
    ``2 x memory clock x bus width`` (double data rate), peak FP32 FLOP/s
    ``SMs x FP32 lanes x 2 x SM clock``. A model known by name (datasheet spec)
    keeps its name, power figures and launch overhead, so telemetry, the ``sim``
    model and trace files agree on the device model; an attribute that is missing
    or zero keeps the datasheet value (or a conservative default).

    >>> a = {"MultiProcessorCount": 132, "ClockRate": 1980000, "MemoryClockRate": 2619000,
    ...      "GlobalMemoryBusWidth": 5120, "ComputeCapabilityMajor": 9,
    ...      "ComputeCapabilityMinor": 0}
    >>> s = spec_from_attributes("NVIDIA H100 80GB HBM3 (unknown here)", a)
    >>> round(s.peak_gbs), round(s.peak_gflops_fp32)
    (3352, 66908)
    """
    known: DeviceSpec | None = None
    with contextlib.suppress(UnknownDeviceError):
        known = device_spec_for_name(name)
    base = known or DeviceSpec(
        name=name,
        sms=1,
        peak_gbs=1000.0,
        peak_gflops_fp32=10000.0,
        max_threads_per_sm=2048,
        max_blocks_per_sm=32,
        regs_per_sm=65536,
        smem_per_sm_bytes=64 * 1024,
        max_smem_per_block_bytes=48 * 1024,
        l2_bytes=0,
    )

    def attr(key: str, default: int) -> int:
        value = attrs.get(key)
        return int(value) if value else default

    cc = (
        attr("ComputeCapabilityMajor", base.compute_capability[0]),
        attr("ComputeCapabilityMinor", base.compute_capability[1]),
    )
    sms = attr("MultiProcessorCount", base.sms)
    clock_khz, mem_khz = attr("ClockRate", 0), attr("MemoryClockRate", 0)
    bus_bits = attr("GlobalMemoryBusWidth", 0)
    peak_gbs = base.peak_gbs
    if mem_khz and bus_bits:
        peak_gbs = 2.0 * mem_khz * 1e3 * bus_bits / 8.0 / 1e9
    peak_gflops = base.peak_gflops_fp32
    if clock_khz:
        peak_gflops = sms * fp32_lanes_per_sm(cc) * 2.0 * clock_khz * 1e3 / 1e9
    source = "peaks and limits from CUDA device attributes"
    if known is not None:
        source += (
            f" (datasheet of {known.name}: {known.peak_gbs:g} GB/s, "
            f"{known.peak_gflops_fp32:g} GFLOP/s FP32)"
        )
    return dataclasses.replace(
        base,
        sms=sms,
        peak_gbs=peak_gbs,
        peak_gflops_fp32=peak_gflops,
        compute_capability=cc,
        max_threads_per_sm=attr("MaxThreadsPerMultiProcessor", base.max_threads_per_sm),
        max_blocks_per_sm=attr("MaxBlocksPerMultiprocessor", base.max_blocks_per_sm),
        regs_per_sm=attr("MaxRegistersPerMultiprocessor", base.regs_per_sm),
        smem_per_sm_bytes=attr("MaxSharedMemoryPerMultiprocessor", base.smem_per_sm_bytes),
        max_smem_per_block_bytes=attr(
            "MaxSharedMemoryPerBlockOptin", base.max_smem_per_block_bytes
        ),
        l2_bytes=attr("L2CacheSize", base.l2_bytes),
        source=source,
    )


class CupyDevice:
    """One NVIDIA GPU running the built-in workloads through CuPy.

    ``nvml_interval_s`` is the NVML sampling period (None: no sampler thread).
    """

    backend = "cupy"
    realtime = True  # launches really run: the runner anchors event times to the clock

    def __init__(
        self,
        *,
        device_index: int = 0,
        seed: int = 0,
        problem_scale: float = 1.0,
        nvml_interval_s: float | None = 0.5,
    ) -> None:
        self._cp = import_cupy()
        self.device_index = device_index
        self._device = self._cp.cuda.Device(device_index)
        raw = self._cp.cuda.runtime.getDeviceProperties(device_index)["name"]
        self.device_name = raw.decode() if isinstance(raw, bytes) else str(raw)
        self.spec = spec_from_attributes(
            self.device_name, device_attributes(self._cp, device_index)
        )
        self._rng = np.random.default_rng(seed)
        self._workloads: list[CudaWorkload] = [
            get_workload(n, None if problem_scale == 1.0 else scaled_problem_size(n, problem_scale))
            for n in WORKLOAD_NAMES
        ]
        self._functions: dict[_Key, Any] = {}
        self._plans: dict[_Key, LaunchPlan] = {}
        self._failed: dict[_Key, str] = {}
        self._last_return = math.nan  # host clock when the stream's last launch call returned
        self._arrays: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
        self._events: list[Any] = []
        self.occupancy_source = "driver"
        self._sampler: NvmlSampler | None = None
        if nvml_interval_s is not None:
            bus_id = None
            with contextlib.suppress(Exception):
                bus_id = str(self._device.pci_bus_id)
            sampler = NvmlSampler(device_index, interval_s=nvml_interval_s, pci_bus_id=bus_id)
            if sampler.start():
                self._sampler = sampler

    @property
    def cupy(self) -> ModuleType:
        """The CuPy module this device runs on (benchmarks time raw launches with it)."""
        return self._cp

    def workloads(self) -> list[Workload]:
        return list(self._workloads)

    def _key(self, w: Workload, config: Mapping[str, ParamValue]) -> _Key:
        return (w.name, w.problem_size, w.space.config_id(config))

    # -- compilation ---------------------------------------------------------------
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
                _ = fn.num_regs  # forces NVRTC compile and module load now, not at launch
            self._functions[key] = fn
        return fn

    def precompile(
        self, workload: CudaWorkload, configs: Iterable[Config], *, workers: int = 8
    ) -> dict[str, str]:
        """Compile many configurations on a thread pool; returns {config id: error}.

        NVRTC runs without the GIL, so compiles overlap; failures are remembered
        and those configurations fail to launch.
        """
        todo = [c for c in configs if self._key(workload, c) not in self._functions]

        def one(config: Config) -> tuple[Config, str | None]:
            try:
                self.compile(workload, config)
                return config, None
            except Exception as ex:
                return config, f"{type(ex).__name__}: {ex}"

        errors: dict[str, str] = {}
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for config, err in pool.map(one, todo):
                if err is not None:
                    self._failed[self._key(workload, config)] = err
                    errors[workload.space.config_id(config)] = err
        return errors

    def arrays(self, workload: CudaWorkload) -> dict[str, Any]:
        """Device copies of the workload's inputs (allocated once per workload)."""
        key = (workload.name, workload.problem_size)
        if key not in self._arrays:
            host = workload.make_inputs(self._rng)
            with self._device:
                self._arrays[key] = {k: self._cp.asarray(v) for k, v in host.items()}
        return self._arrays[key]

    # -- plans ---------------------------------------------------------------------
    def _resident_blocks(self, fn: Any, threads: int, dynamic_smem: int) -> int | None:
        """Resident blocks per SM from the driver's occupancy query, or None."""
        try:
            with self._device:
                return int(
                    self._cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                        fn.kernel.ptr, threads, dynamic_smem
                    )
                )
        except Exception:  # old CuPy, HIP: fall back to our formula
            self.occupancy_source = "formula"
            return None

    def plan(self, workload: Workload, config: Mapping[str, ParamValue]) -> LaunchPlan:
        cfg = well_formed(workload.space, config)
        key = self._key(workload, cfg)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        plan: LaunchPlan | None = None
        if isinstance(workload, CudaWorkload) and workload.space.is_valid(cfg):
            try:
                fn = self.compile(workload, cfg)
                geo = workload.geometry(cfg)
                plan = make_plan(
                    self.spec,
                    workload,
                    cfg,
                    registers_per_thread=int(fn.num_regs),
                    static_smem_bytes=int(fn.shared_size_bytes),
                    resident_blocks_per_sm=self._resident_blocks(
                        fn, geo.threads_per_block, geo.dynamic_smem_bytes
                    ),
                    resources_source="cupy module",
                )
            except Exception:  # a compile failure shows up as a failed launch
                plan = None
        if plan is None:
            return make_plan(self.spec, workload, cfg)
        self._plans[key] = plan
        return plan

    # -- launches ------------------------------------------------------------------
    def _event_pool(self, count: int) -> list[Any]:
        while len(self._events) < count:
            self._events.append(self._cp.cuda.Event())
        return self._events

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
                events = self._event_pool(2 * n)
                # Host clock around each call, no device query: the gap is the host's
                # time between the stream's previous launch call returning and this one.
                starts, returns = np.empty(n), np.empty(n)
                for i in range(n):
                    starts[i] = _clock()
                    events[2 * i].record(stream)
                    fn(geo.grid, geo.block, args, shared_mem=geo.dynamic_smem_bytes)
                    events[2 * i + 1].record(stream)
                    returns[i] = _clock()
                events[2 * n - 1].synchronize()  # the one synchronisation of the batch
                ms = [cp.cuda.get_elapsed_time(events[2 * i], events[2 * i + 1]) for i in range(n)]
        except Exception as ex:  # compile or launch error: this config cannot run here
            self._failed[key] = f"{type(ex).__name__}: {ex}"
            return LaunchResult.failed(n)
        gaps, waited = self._host_gaps(starts, returns)
        return LaunchResult(
            np.asarray(ms, dtype=np.float64) * 1000.0, np.ones(n, dtype=bool), gaps, waited
        )

    def _host_gaps(self, starts: np.ndarray, returns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per launch the host gap (us) and whether the host waited on the device in it:
        the first launch of a batch follows the previous batch's synchronisation."""
        prev = np.concatenate([[self._last_return], returns[:-1]])
        waited = np.zeros(len(starts), dtype=bool)
        if math.isfinite(self._last_return):
            waited[0] = True
        else:
            prev[0] = starts[0]  # the stream's first launch: no previous one
        self._last_return = float(returns[-1])
        return np.maximum(starts - prev, 0.0) * 1e6, waited

    def failure_reason(self, workload: Workload, config: Mapping[str, ParamValue]) -> str | None:
        """Why ``config`` failed to compile or launch here, if it did."""
        if not isinstance(workload, CudaWorkload):
            return None
        return self._failed.get(self._key(workload, config))

    def check_reference(
        self, workload: CudaWorkload, config: Mapping[str, ParamValue], *, seed: int = 0
    ) -> float:
        """Run ``config`` once on the workload's small problem size; the largest
        absolute error against the NumPy reference, relative to the reference's scale."""
        small = workload.resized(workload.SMALL_SIZE)
        host = small.make_inputs(np.random.default_rng(seed))
        fn = self.compile(small, config)
        geo = small.geometry(config)
        with self._device:
            arrays = {k: self._cp.asarray(v) for k, v in host.items()}
            fn(geo.grid, geo.block, small.kernel_args(arrays), shared_mem=geo.dynamic_smem_bytes)
            got = self._cp.asnumpy(arrays[small.output_name])
        want = small.reference(host)
        scale = max(1.0, float(np.abs(want).max()))
        return float(np.abs(got.astype(np.float64) - want).max() / scale)

    # -- samples -------------------------------------------------------------------
    def sample(self) -> dict[str, float] | None:
        """The NVML sampler's latest reading (never blocks); None without ``nvidia-ml-py``."""
        return self._sampler.latest() if self._sampler is not None else None

    @property
    def sampler(self) -> NvmlSampler | None:
        return self._sampler

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        self._functions.clear()
        self._plans.clear()
        self._arrays.clear()
        self._events.clear()
