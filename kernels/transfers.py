"""A model of what the host does around each launch: copies, launch calls, waits.

A :class:`HostPattern` describes an application step around one kernel: it copies
``h2d_bytes`` to the device before each launch and ``d2h_bytes`` back after it,
from pinned or pageable host memory, on one stream (copies and kernels serialized)
or on two or more (double buffering: copies hide under the neighbouring launches),
issuing ``batch`` launches per host call (a CUDA graph or a batched launch pays the
host's launch cost once for the batch) and synchronizing after every ``sync_every``
launches. :func:`simulate_host` turns the pattern into the telemetry a node sends
(``host_gap_us``, ``host_waited`` and the copies' columns) and the time each step
takes on the device's timeline. The sim backend and the demo use it; a real GPU
measures the same quantities with CUDA events.

Modelling constants (not datasheet numbers): pinned copies reach 85% of the link's
theoretical peak (PCIe packet and protocol overhead; ``bandwidthTest`` from the CUDA
samples reports numbers of that order on PCIe hosts); pageable copies are staged by
the driver through a pinned bounce buffer, modelled at half the pinned rate; a host
launch call from Python costs 10 us (CuPy kernel launches are of that order) and
waking up from a synchronization 10 us.

>>> from kernelstream.kernels.devices import get_device_spec
>>> spec = get_device_spec("A100-SXM4-80GB")
>>> p = HostPattern(h2d_bytes=8 << 20, d2h_bytes=0, pinned=False)
>>> round(copy_us(spec, p.h2d_bytes, "h2d", pinned=False))
627
>>> round(copy_us(spec, p.h2d_bytes, "h2d", pinned=True))
313
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from kernelstream.kernels.devices import DeviceSpec

__all__ = ["HOST_KNOBS", "HostPattern", "HostTimeline", "copy_us", "simulate_host"]

_PINNED_EFFICIENCY = 0.85
_PAGEABLE_FACTOR = 0.5
_LAUNCH_CALL_US = 10.0
_WAKE_US = 10.0
_BATCHED_GAP_US = 0.5  # launches inside one batched call or graph: the device's own gap

#: Configuration parameters a pattern reads, when a kernel's declared space has them.
HOST_KNOBS = ("pinned", "streams", "batch", "sync_every")


@dataclass(frozen=True)
class HostPattern:
    """The host side of one kernel's step (see the module docstring)."""

    h2d_bytes: int = 0
    d2h_bytes: int = 0
    pinned: bool = True
    streams: int = 1
    batch: int = 1
    sync_every: int = 0  # 0: never waits on the device between launches

    def with_config(self, config: Mapping[str, Any]) -> HostPattern:
        """The pattern with the knobs a configuration sets (``HOST_KNOBS``)."""
        changes: dict[str, Any] = {}
        if "pinned" in config:
            changes["pinned"] = bool(config["pinned"])
        for name in ("streams", "batch", "sync_every"):
            if name in config:
                changes[name] = max(0 if name == "sync_every" else 1, int(config[name]))
        return replace(self, **changes)


def copy_us(spec: DeviceSpec, nbytes: float, direction: str, *, pinned: bool) -> float:
    """Modelled duration of one copy over the device's host link (or its memory, d2d)."""
    if nbytes <= 0:
        return 0.0
    if direction == "d2d":
        gbs = spec.peak_gbs / 2  # read and write the same memory
    else:
        gbs = spec.pcie_gbs * _PINNED_EFFICIENCY * (1.0 if pinned else _PAGEABLE_FACTOR)
    if gbs <= 0:
        raise ValueError(f"the links of {spec.name!r} are not known: no copy can be modelled")
    return float(nbytes / (gbs * 1e3))


@dataclass(frozen=True)
class HostTimeline:
    """``n`` steps of a pattern: per launch the host gap, the wait and the lead time.

    ``lead_us`` is what comes before each kernel in its step on the device's
    timeline: its host gap and the copies no kernel hides. ``copies`` holds the
    columns of :class:`schemas.records.CopyColumns` but ``t_end``; instead
    ``copy_launch`` is the launch each copy belongs to and ``copy_end_us`` its end
    relative to that kernel's end (negative: before it).
    """

    host_gap_us: npt.NDArray[np.float64]
    host_waited: npt.NDArray[np.bool_]
    lead_us: npt.NDArray[np.float64]
    copies: dict[str, list[Any]]
    copy_launch: npt.NDArray[np.int64]
    copy_end_us: npt.NDArray[np.float64]


def simulate_host(
    spec: DeviceSpec, pattern: HostPattern, kernel_us: npt.NDArray[np.float64]
) -> HostTimeline:
    """Lay ``kernel_us`` launches out with the pattern's gaps, waits and copies."""
    n = len(kernel_us)
    i = np.arange(n)
    gap = np.where(i % pattern.batch == 0, _LAUNCH_CALL_US, _BATCHED_GAP_US)
    waited = (i % pattern.sync_every == 0) if pattern.sync_every > 0 else np.zeros(n, bool)
    gap = gap + np.where(waited, _WAKE_US, 0.0)
    legs = [
        (d, b, copy_us(spec, b, d, pinned=pattern.pinned))
        for d, b in (("d2h", pattern.d2h_bytes), ("h2d", pattern.h2d_bytes))
        if b > 0
    ]
    total = sum(us for _, _, us in legs)
    ends: list[float] = []
    if pattern.streams > 1:
        # Double buffering: the next step's input and the last step's output move on
        # another stream while this kernel runs; only what the kernel cannot hide shows.
        exposed = np.maximum(0.0, total - kernel_us)
        t = 0.0
        for _, _, us in legs:
            t += us
            ends.append(t)  # from the kernel's start
        offsets = np.asarray(ends)[None, :] - kernel_us[:, None]
    else:
        # One stream: the last step's output, then this step's input, then the kernel.
        exposed = np.full(n, total)
        t = -total
        for _, _, us in legs:
            t += us
            ends.append(t)
        offsets = np.asarray(ends)[None, :] - kernel_us[:, None]
    k = len(legs)
    stream = [0 if pattern.streams == 1 else 1 + (j % (pattern.streams - 1)) for j in range(k)]
    copies: dict[str, list[Any]] = {
        "direction": [d for d, _, _ in legs] * n,
        "bytes": [int(b) for _, b, _ in legs] * n,
        "duration_us": [round(us, 3) for _, _, us in legs] * n,
        "pinned": [int(pattern.pinned)] * (k * n),
        "stream": stream * n,
    }
    return HostTimeline(
        gap,
        waited,
        gap + exposed,
        copies,
        np.repeat(i, k),
        offsets.reshape(-1) if k else np.empty(0),
    )
