"""The device interface every backend (sim, trace, cupy) implements.

A node asks a :class:`Device` for the static facts of a configuration
(:meth:`Device.plan`), launches it ``n`` times back to back
(:meth:`Device.launch`), and now and then takes a device sample
(:meth:`Device.sample`, off the hot path).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from kernelstream.kernels.compile import arch_for
from kernelstream.kernels.devices import DeviceSpec, theoretical_occupancy, waves
from kernelstream.kernels.resources import compiled_resources
from kernelstream.kernels.space import Config, ParamValue, SearchSpace, SpaceError
from kernelstream.kernels.workloads.base import Workload

__all__ = ["Device", "LaunchPlan", "LaunchResult", "make_plan", "well_formed"]


@dataclass(frozen=True)
class LaunchPlan:
    """Static facts of one (workload, config) on one device."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int
    registers_per_thread: int | None
    occupancy: float
    waves: float
    bytes_moved: float
    flops: float
    resident_blocks_per_sm: int = 0
    # Where registers and static shared memory came from: "estimate" (the workload's
    # model), the compiler ("nvrtc 12.9 sm_90", kernels/cuda/resources.json.gz) or the
    # module loaded on the GPU ("cupy module").
    resources_source: str = "estimate"

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class LaunchResult:
    """``n`` launches: durations in microseconds (0 where a launch failed) and success flags."""

    duration_us: np.ndarray
    ok: np.ndarray
    # Measured by a real device (cupy): per launch, the host's time since the previous
    # launch call on the stream returned, and whether the host waited on the device then.
    host_gap_us: np.ndarray | None = None
    host_waited: np.ndarray | None = None

    @classmethod
    def failed(cls, n: int) -> LaunchResult:
        return cls(np.zeros(n, dtype=np.float64), np.zeros(n, dtype=bool))

    def __len__(self) -> int:
        return int(self.duration_us.shape[0])


@runtime_checkable
class Device(Protocol):
    """One GPU (real, simulated or trace-driven) that runs workloads."""

    backend: str
    spec: DeviceSpec
    device_index: int

    def workloads(self) -> list[Workload]:
        """The workloads this device can run."""
        ...

    def plan(self, workload: Workload, config: Mapping[str, ParamValue]) -> LaunchPlan:
        """Geometry, occupancy, waves and the analytic cost of ``config``."""
        ...

    def launch(self, workload: Workload, config: Mapping[str, ParamValue], n: int) -> LaunchResult:
        """Run ``n`` launches back to back; configurations the device cannot run fail."""
        ...

    def sample(self) -> dict[str, float] | None:
        """Device sample fields (``sm_util_pct``, ``power_w``, ...), or None."""
        ...

    def close(self) -> None: ...


def make_plan(
    spec: DeviceSpec,
    workload: Workload,
    config: Mapping[str, ParamValue],
    *,
    registers_per_thread: int | None = None,
    static_smem_bytes: int | None = None,
    resident_blocks_per_sm: int | None = None,
    resources_source: str = "estimate",
) -> LaunchPlan:
    """A plan from the workload's own geometry and model; backends may pass measured
    register and shared-memory counts (the cupy backend reads them off the compiled kernel)
    and the driver's count of resident blocks per SM, which then decides occupancy.

    Without measured counts, the compiler's counts for the device's architecture are used
    where the resource table has them (:func:`kernelstream.kernels.resources.compiled_resources`),
    the workload's estimate otherwise; ``resources_source`` of the plan says which."""
    if registers_per_thread is None and static_smem_bytes is None and spec.peaks_known:
        compiled = compiled_resources(workload, config, arch_for(spec.compute_capability))
        if compiled is not None:
            registers_per_thread = compiled.registers
            static_smem_bytes = compiled.static_smem_bytes
            resources_source = compiled.source
    geo = workload.geometry(config)
    regs = geo.registers_per_thread if registers_per_thread is None else registers_per_thread
    static = (
        workload.traits(config).static_smem_bytes
        if static_smem_bytes is None
        else static_smem_bytes
    )
    occ, resident = theoretical_occupancy(
        spec, geo.threads_per_block, regs, geo.dynamic_smem_bytes + static
    )
    if resident_blocks_per_sm is not None:
        resident = max(0, resident_blocks_per_sm)
        warps = -(-geo.threads_per_block // spec.warp_size)
        occ = min(1.0, resident * warps / spec.max_warps_per_sm) if spec.max_warps_per_sm else 0.0
    return LaunchPlan(
        grid=geo.grid,
        block=geo.block,
        dynamic_smem_bytes=geo.dynamic_smem_bytes,
        registers_per_thread=regs,
        occupancy=occ,
        waves=waves(spec, geo.blocks, resident),
        bytes_moved=float(workload.bytes_moved(config)),
        flops=float(workload.flops(config)),
        resident_blocks_per_sm=resident,
        resources_source=resources_source,
    )


def well_formed(space: SearchSpace, config: Mapping[str, ParamValue]) -> Config:
    """``config`` with exactly the space's parameters, each a declared value.

    Constraints and measured validity are not checked: a plan can be made for a
    configuration that then fails to launch. Raises :class:`SpaceError` otherwise.
    """
    problems = [
        v
        for v in space.violations(config)
        if not v.startswith("constraint violated") and "valid points" not in v
    ]
    if problems:
        raise SpaceError(f"space {space.name!r}: {'; '.join(problems)}")
    return {p: config[p] for p in space.params}
