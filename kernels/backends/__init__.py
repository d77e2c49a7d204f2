"""Device backends behind one interface: ``sim``, ``trace`` and ``cupy``.

>>> dev = open_device("sim", model="L4", seed=3)
>>> dev.backend, dev.spec.name
('sim', 'L4')
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kernelstream.kernels.backends.base import Device, LaunchPlan, LaunchResult
from kernelstream.kernels.backends.sim import SIM_MODELS, SimDevice
from kernelstream.kernels.backends.sim_drift import DeviceDrift
from kernelstream.kernels.backends.trace import (
    TraceDevice,
    TraceSpace,
    default_tuning_spaces_dir,
    load_cache,
)
from kernelstream.kernels.errors import TraceFileError, UnknownDeviceError

__all__ = [
    "BACKENDS",
    "SIM_MODELS",
    "Device",
    "LaunchPlan",
    "LaunchResult",
    "TraceSpace",
    "default_tuning_spaces_dir",
    "load_cache",
    "open_device",
]

BACKENDS: tuple[str, ...] = ("sim", "trace", "cupy")


def open_device(
    backend: str,
    *,
    model: str | None = None,
    device_index: int = 0,
    seed: int = 0,
    trace_file: str | Path | Sequence[str | Path] | None = None,
    problem_scale: float = 1.0,
    drift: DeviceDrift | None = None,
) -> Device:
    """Open one device.

    ``sim``: ``model`` names a GPU of :data:`SIM_MODELS` (default A100-SXM4-80GB).
    ``trace``: ``trace_file`` is one cache file or several measured on the same GPU.
    ``cupy``: the real GPU ``device_index``. ``problem_scale`` scales the built-in
    workloads' total work (sim and cupy; e.g. 0.25 for quick runs). ``drift`` makes a sim
    device's SM clock and memory drift (:class:`kernels.backends.sim_drift.DeviceDrift`).
    """
    if backend == "sim":
        return SimDevice(
            model or SIM_MODELS[0],
            device_index=device_index,
            seed=seed,
            problem_scale=problem_scale,
            drift=drift,
        )
    if backend == "trace":
        if trace_file is None:
            raise TraceFileError(
                "the trace backend needs trace_file: a Kernel Tuner cache, e.g. one under "
                f"{default_tuning_spaces_dir()}"
            )
        return TraceDevice(trace_file, device_index=device_index, seed=seed)
    if backend == "cupy":
        from kernelstream.kernels.backends.cupy import (
            CupyDevice,  # keeps CuPy out of sim/trace imports
        )

        return CupyDevice(device_index=device_index, seed=seed, problem_scale=problem_scale)
    raise UnknownDeviceError(f"unknown backend {backend!r}; choose one of {list(BACKENDS)}")
