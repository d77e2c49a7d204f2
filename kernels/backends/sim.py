"""Simulated GPU: an analytic roofline + occupancy + waves + coalescing model.

Duration of one launch (microseconds)::

    t = max(bytes / BW_eff, flops / F_eff) * tail + launch_overhead
    BW_eff = peak_gbs * coalescing * sm_fraction * hide_mem
    F_eff  = peak_gflops * compute_efficiency * sm_fraction * hide_alu
    tail   = ceil(waves) / waves   when waves > 1, else 1

* ``sm_fraction``: SMs with at least one block / all SMs (small grids idle SMs).
* ``hide_mem``: latency hiding by Little's law. An SM must keep
  ``peak_gbs / sms * DRAM latency`` bytes in flight to draw its share of peak;
  it has ``resident warps * 32 * bytes_in_flight_per_thread``. The ratio passes
  through a smooth ``min(x, 1)``. Low occupancy or a thinly populated SM lowers it.
* ``hide_alu``: the same for arithmetic: about 16 independent warp instructions
  per SM (4 schedulers x ~4 cycles dependent-issue latency) keep the FMA pipes busy.
* Noise: multiplicative lognormal (sigma 2%), drawn from a NumPy generator seeded
  by (seed, workload, config id); the kernel time never drops below the roofline
  bound ``max(bytes / peak_bw, flops / peak_flops)``, so achieved bandwidth and
  FLOP/s never exceed the device's peaks.

Calibration: this model is not fitted to measurements. Against the trace files'
A100-PCIE-40GB convolution optimum (0.554 ms for 7.55 GFLOP, i.e. 70% of FP32
peak) its compute-bound optimum for matmul (~60% of peak) is of the same order;
expect errors of 2x on individual configurations. Use the trace backend for
real hardware behaviour.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kernelstream.kernels.backends.base import LaunchPlan, LaunchResult, make_plan, well_formed
from kernelstream.kernels.backends.sim_drift import DeviceDrift, device_state
from kernelstream.kernels.devices import DEVICE_SPECS, DeviceSpec, get_device_spec
from kernelstream.kernels.space import ParamValue
from kernelstream.kernels.workloads import WORKLOAD_NAMES, get_workload, scaled_problem_size
from kernelstream.kernels.workloads.base import Traits, Workload, smooth_min

__all__ = ["SIM_MODELS", "SimDevice", "SimEstimate", "estimate"]

SIM_MODELS: tuple[str, ...] = tuple(DEVICE_SPECS)

# DRAM load latency of ~600 ns: the order reported by microbenchmark studies of
# Volta/Ampere GPUs (e.g. Jia et al., "Dissecting the NVIDIA Volta GPU
# Architecture via Microbenchmarking", 2018). A modelling constant.
_DRAM_LATENCY_S = 600e-9
_ALU_WARPS_NEEDED = 16.0
_NOISE_SIGMA = 0.02


@dataclass(frozen=True)
class SimEstimate:
    """The noise-free model of one configuration and the terms it is made of."""

    kernel_us: float
    overhead_us: float
    floor_us: float
    sm_fraction: float
    achieved_occupancy: float
    hide_mem: float
    hide_alu: float
    tail: float

    @property
    def duration_us(self) -> float:
        return self.kernel_us + self.overhead_us


def estimate(spec: DeviceSpec, plan: LaunchPlan, traits: Traits) -> SimEstimate | None:
    """Noise-free modelled duration; None when no block fits on an SM (launch fails)."""
    blocks = plan.blocks
    resident = plan.resident_blocks_per_sm
    if resident <= 0 or blocks <= 0:
        return None
    warps_per_block = math.ceil(plan.threads_per_block / spec.warp_size)
    active_sms = min(spec.sms, blocks)
    blocks_per_sm = min(float(resident), blocks / active_sms)
    warps_per_sm = blocks_per_sm * warps_per_block
    sm_fraction = active_sms / spec.sms
    needed_bytes = spec.peak_gbs * 1e9 / spec.sms * _DRAM_LATENCY_S
    in_flight = warps_per_sm * spec.warp_size * traits.bytes_in_flight_per_thread
    hide_mem = smooth_min(in_flight / needed_bytes)
    hide_alu = smooth_min(warps_per_sm * traits.compute_ilp / _ALU_WARPS_NEEDED)
    t_mem = 0.0
    if plan.bytes_moved > 0:
        bw = spec.peak_gbs * 1e9 * traits.coalescing * sm_fraction * hide_mem
        t_mem = plan.bytes_moved / bw
    t_alu = 0.0
    if plan.flops > 0:
        f = spec.peak_gflops_fp32 * 1e9 * traits.compute_efficiency * sm_fraction * hide_alu
        t_alu = plan.flops / f
    tail = math.ceil(plan.waves) / plan.waves if plan.waves > 1.0 else 1.0
    floor = max(
        plan.bytes_moved / (spec.peak_gbs * 1e9), plan.flops / (spec.peak_gflops_fp32 * 1e9)
    )
    return SimEstimate(
        kernel_us=max(t_mem, t_alu, floor) * tail * 1e6,
        overhead_us=spec.launch_overhead_us,
        floor_us=floor * 1e6,
        sm_fraction=sm_fraction,
        achieved_occupancy=warps_per_sm / spec.max_warps_per_sm,
        hide_mem=hide_mem,
        hide_alu=hide_alu,
        tail=tail,
    )


@dataclass(frozen=True)
class _Entry:
    plan: LaunchPlan
    est: SimEstimate | None


class SimDevice:
    """A simulated GPU of a named model running the built-in workloads.

    >>> dev = SimDevice("A100-SXM4-80GB", seed=1)
    >>> w = dev.workloads()[0]
    >>> r = dev.launch(w, w.default, 4)
    >>> r.ok.tolist(), bool((r.duration_us > 0).all())
    ([True, True, True, True], True)
    """

    backend = "sim"

    def __init__(
        self,
        model: str = "A100-SXM4-80GB",
        *,
        device_index: int = 0,
        seed: int = 0,
        problem_scale: float = 1.0,
        drift: DeviceDrift | None = None,
    ) -> None:
        self.spec = get_device_spec(model)
        # The SM clock and memory in use: flat with jitter, or drifting as ``drift`` says.
        self.drift = drift or DeviceDrift()
        self._started = time.monotonic()
        self._state_rng = np.random.default_rng(np.random.SeedSequence([seed, device_index]))
        self.device_index = device_index
        self._seed = seed
        self._workloads: list[Workload] = [
            get_workload(n, None if problem_scale == 1.0 else scaled_problem_size(n, problem_scale))
            for n in WORKLOAD_NAMES
        ]
        self._cache: dict[tuple[str, tuple[int, ...], str], _Entry] = {}
        self._rngs: dict[tuple[str, str], np.random.Generator] = {}
        self._last: tuple[LaunchPlan, SimEstimate] | None = None

    def __repr__(self) -> str:
        return f"SimDevice({self.spec.name!r}, device_index={self.device_index}, seed={self._seed})"

    def workloads(self) -> list[Workload]:
        return list(self._workloads)

    def _entry(self, workload: Workload, config: Mapping[str, ParamValue]) -> _Entry:
        key = (workload.name, workload.problem_size, workload.space.config_id(config))
        entry = self._cache.get(key)
        if entry is None:
            plan = make_plan(self.spec, workload, config)
            entry = _Entry(plan, estimate(self.spec, plan, workload.traits(config)))
            self._cache[key] = entry
        return entry

    def plan(self, workload: Workload, config: Mapping[str, ParamValue]) -> LaunchPlan:
        return make_plan(self.spec, workload, well_formed(workload.space, config))

    def predict_us(self, workload: Workload, config: Mapping[str, ParamValue]) -> float | None:
        """Noise-free modelled duration, or None for a configuration that cannot run."""
        if not workload.space.is_valid(config):
            return None
        est = self._entry(workload, config).est
        return None if est is None else est.duration_us

    def _rng(self, workload: Workload, config_id: str) -> np.random.Generator:
        key = (workload.name, config_id)
        rng = self._rngs.get(key)
        if rng is None:
            words = [self._seed, zlib.crc32(workload.name.encode()), zlib.crc32(config_id.encode())]
            rng = np.random.default_rng(np.random.SeedSequence(words))
            self._rngs[key] = rng
        return rng

    def launch(self, workload: Workload, config: Mapping[str, ParamValue], n: int) -> LaunchResult:
        if n <= 0:
            return LaunchResult.failed(0)
        if not workload.space.is_valid(config):
            return LaunchResult.failed(n)
        entry = self._entry(workload, config)
        if entry.est is None:
            return LaunchResult.failed(n)
        est = entry.est
        noise = self._rng(workload, workload.space.config_id(config)).lognormal(
            0.0, _NOISE_SIGMA, size=n
        )
        kernel = np.maximum(est.kernel_us * noise, est.floor_us)
        self._last = (entry.plan, est)
        return LaunchResult(kernel + est.overhead_us, np.ones(n, dtype=bool))

    def sample(self) -> dict[str, float] | None:
        """Modelled utilization of the most recent launch (idle before any), with the
        SM clock and memory used (:mod:`kernels.backends.sim_drift`)."""
        hours = (time.monotonic() - self._started) / 3600.0
        return self._utilization() | device_state(self.spec, self.drift, hours, self._state_rng)

    def _utilization(self) -> dict[str, float]:
        if self._last is None:
            return {
                "sm_util_pct": 0.0,
                "power_w": self.spec.idle_w,
                "sm_occupancy_pct": 0.0,
                "dram_bw_util_pct": 0.0,
            }
        plan, est = self._last
        busy = est.kernel_us / est.duration_us
        bw_util = plan.bytes_moved / (est.kernel_us * 1e-6) / (self.spec.peak_gbs * 1e9)
        flop_util = plan.flops / (est.kernel_us * 1e-6) / (self.spec.peak_gflops_fp32 * 1e9)
        load = 0.3 * est.sm_fraction * busy + 0.7 * max(bw_util, flop_util) * busy
        return {
            "sm_util_pct": 100.0 * est.sm_fraction * busy,
            "power_w": self.spec.idle_w + (self.spec.tdp_w - self.spec.idle_w) * min(1.0, load),
            "sm_occupancy_pct": 100.0 * est.achieved_occupancy * busy,
            "dram_bw_util_pct": 100.0 * bw_util * busy,
        }

    def close(self) -> None:
        self._cache.clear()
        self._rngs.clear()
