"""The SM clock and memory a simulated device reports, and how they drift over hours.

A real GPU's samples (NVML) say what clock its SMs run at and how much of its memory
is in use. Under a steady load both are flat with some jitter; trouble shows as a
trend: the clock sagging as the GPU throttles (heat, a failing fan, a power cap) or
memory filling as a process leaks allocations. :class:`DeviceDrift` describes such a
trend, :func:`device_state` gives the modelled sample at a time, so a sim node and
``kernelstream bench alerts`` produce the same shapes.

>>> from kernelstream.kernels.devices import get_device_spec
>>> spec = get_device_spec("A100-SXM4-80GB")
>>> leak = DeviceDrift(memory_per_h=0.1, start_h=1.0, clock_cv=0.0, memory_cv=0.0)
>>> s = device_state(spec, leak, 3.0, np.random.default_rng(0))
>>> round(s["sm_clock_mhz"]), round(s["mem_used_bytes"] / (1 << 30), 1)
(1410, 32.0)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from kernelstream.kernels.devices import DeviceSpec, clocks_memory

__all__ = ["DeviceDrift", "device_state"]


@dataclass(frozen=True)
class DeviceDrift:
    """How a simulated device's clock and memory move, from ``start_h`` to ``stop_h`` hours.

    Args:
        clock_sag_per_h: the SM clock falls by this fraction of the boost clock per hour.
        clock_step: a sudden drop of the clock by this fraction, at ``step_h``.
        memory_per_h: memory used grows by this fraction of the device's memory per hour.
        memory_step: memory used jumps by this fraction of the device's memory at ``step_h``.
        memory_base: the share of the device's memory in use before any drift.
        stop_h: the drifts stop here (a leak fixed, a fan replaced); steps stay.
        clock_cv, memory_cv: noise, as a fraction of the boost clock and of the memory.
    """

    clock_sag_per_h: float = 0.0
    clock_step: float = 0.0
    memory_per_h: float = 0.0
    memory_step: float = 0.0
    memory_base: float = 0.2
    start_h: float = 0.0
    stop_h: float = float("inf")
    step_h: float = float("inf")
    clock_cv: float = 0.01
    memory_cv: float = 0.002

    @classmethod
    def parse(cls, text: str) -> DeviceDrift:
        """A drift from a JSON object of its fields (the ``sim_drift`` setting);
        ValueError saying what is wrong.

        >>> DeviceDrift.parse('{"clock_sag_per_h": 0.05, "start_h": 1}').clock_sag_per_h
        0.05
        """
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"sim_drift is not JSON: {exc}") from exc
        if not isinstance(fields, dict):
            raise ValueError("sim_drift must be a JSON object")
        unknown = set(fields) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"sim_drift has unknown fields {sorted(unknown)}")
        bad = [k for k, v in fields.items() if type(v) not in (int, float) or not math.isfinite(v)]
        if bad:
            raise ValueError(f"sim_drift fields {sorted(bad)} must be finite numbers")
        return cls(**{k: float(v) for k, v in fields.items()})


def device_state(
    spec: DeviceSpec, drift: DeviceDrift, hours: float, rng: np.random.Generator
) -> dict[str, float]:
    """The SM clock (MHz) and memory used (bytes) at ``hours`` since the device started;
    empty for a model whose clocks and memory are not known (kernels/devices.py)."""
    boost_mhz, memory_bytes, _ = clocks_memory(spec.name)
    if not boost_mhz or not memory_bytes:
        return {}
    ramp = min(max(hours - drift.start_h, 0.0), max(drift.stop_h - drift.start_h, 0.0))
    stepped = hours >= drift.step_h
    clock = 1.0 - drift.clock_sag_per_h * ramp - (drift.clock_step if stepped else 0.0)
    clock += drift.clock_cv * float(rng.standard_normal())
    used = drift.memory_base + drift.memory_per_h * ramp + (drift.memory_step if stepped else 0.0)
    used += drift.memory_cv * float(rng.standard_normal())
    return {
        # A throttled GPU still clocks at a few hundred MHz; memory cannot exceed the total.
        "sm_clock_mhz": boost_mhz * min(max(clock, 0.2), 1.0),
        "mem_used_bytes": memory_bytes * min(max(used, 0.0), 1.0),
    }
