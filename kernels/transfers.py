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
from kernelstream.kernels.space import ParamValue, SearchSpace

__all__ = [
    "HOST_KNOBS",
    "HOST_KNOB_VALUES",
    "HostPattern",
    "HostTimeline",
    "copy_us",
    "host_declared",
    "kernel_space",
    "simulate_host",
    "with_host_knobs",
]

_PINNED_EFFICIENCY = 0.85
_PAGEABLE_FACTOR = 0.5
_LAUNCH_CALL_US = 10.0
_WAKE_US = 10.0
_BATCHED_GAP_US = 0.5  # launches inside one batched call or graph: the device's own gap

#: Configuration parameters a pattern reads, when a kernel's declared space has them.
HOST_KNOBS = ("pinned", "streams", "batch", "sync_every")

#: The values a kernel run under a host pattern declares for the knobs its own space
#: lacks (:func:`with_host_knobs`); a worker reads the same values back off a
#: configuration that names them (:func:`host_declared`), so both sides agree on the
#: space without a file. ``pinned`` is 0 or 1 (not a bool: configurations travel as
#: JSON numbers), ``sync_every`` 0 means never between launches.
HOST_KNOB_VALUES: dict[str, tuple[int, ...]] = {
    "pinned": (0, 1),
    "streams": (1, 2, 4),
    "batch": (1, 2, 4, 8, 16, 32, 64),
    "sync_every": (0, 1, 2, 4, 8, 16, 32, 64),
}


@dataclass(frozen=True)
class HostPattern:
    """The host side of one kernel's step (see the module docstring)."""

    h2d_bytes: int = 0
    d2h_bytes: int = 0
    pinned: bool = True
    streams: int = 1
    batch: int = 1
    sync_every: int = 0  # 0: never waits on the device between launches

    def knobs(self) -> dict[str, int]:
        """The pattern's knobs as configuration values (``HOST_KNOBS``)."""
        return {
            "pinned": int(self.pinned),
            "streams": self.streams,
            "batch": self.batch,
            "sync_every": self.sync_every,
        }

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


def with_host_knobs(space: SearchSpace, pattern: HostPattern) -> SearchSpace:
    """``space`` with the host knobs it does not declare itself, starting at ``pattern``'s.

    The knobs come after the kernel's own parameters (config ids keep their order);
    their values are :data:`HOST_KNOB_VALUES`. Raises ValueError when a knob of the
    pattern is not among them (the worker could not read it back).

    >>> s = SearchSpace("k", {"block": (64, 128)}, {"block": 64})
    >>> w = with_host_knobs(s, HostPattern(pinned=False, batch=4))
    >>> w.config_id(w.start_config())
    'block=64,pinned=0,streams=1,batch=4,sync_every=0'
    """
    knobs = pattern.knobs()
    for name, value in knobs.items():
        if value not in HOST_KNOB_VALUES[name]:
            raise ValueError(
                f"host pattern {name}={value} is not one of the declared values "
                f"{list(HOST_KNOB_VALUES[name])}"
            )
    added = tuple(k for k in HOST_KNOBS if k not in space.params)
    return _extend(space, added, knobs)


def _extend(space: SearchSpace, added: tuple[str, ...], start: Mapping[str, int]) -> SearchSpace:
    """``space`` with the knobs ``added`` (every value of each), defaults from ``start``."""
    params: dict[str, tuple[ParamValue, ...]] = {p: tuple(v) for p, v in space.params.items()}
    params.update({k: HOST_KNOB_VALUES[k] for k in added})
    default = {**dict(space.default), **{k: start[k] for k in added}}
    allowed = space.allowed
    if allowed is not None and added:
        # A listed space (a trace's measured points): each point with every knob value.
        tails = [""]
        for k in added:
            tails = [f"{t},{k}={v}" for t in tails for v in HOST_KNOB_VALUES[k]]
        allowed = frozenset(cid + t for cid in allowed for t in tails)
    wide = SearchSpace(space.name, params, default, space.constraints, allowed)
    if added:
        object.__setattr__(wide, "widened_from", (space, added))  # a frozen dataclass
    return wide


def kernel_space(space: SearchSpace) -> tuple[SearchSpace, tuple[str, ...]]:
    """The kernel's own space of a space widened with host knobs, and the knobs added.

    ``(space, ())`` for a space this module did not widen (a kernel that declares a
    knob itself keeps it as its own parameter).

    >>> s = SearchSpace("k", {"block": (64, 128)}, {"block": 64})
    >>> own, added = kernel_space(host_declared(s, {"block": 64, "pinned": 1}))
    >>> own is s, added
    (True, ('pinned',))
    >>> kernel_space(s) == (s, ())
    True
    """
    return space.widened_from or (space, ())


_DECLARED: dict[tuple[int, tuple[str, ...]], tuple[SearchSpace, SearchSpace]] = {}


def host_declared(space: SearchSpace, config: Mapping[str, Any]) -> SearchSpace:
    """The space a configuration declares: ``space`` plus the host knobs it names.

    A node that runs a kernel under a host pattern adds the knobs to the kernel's own
    space (:func:`with_host_knobs`) and sends them in every configuration; the worker's
    tuner and its configuration check take the space the same way from any
    configuration that names them. The default of an added knob is its first value.

    >>> s = SearchSpace("k", {"block": (64, 128)}, {"block": 64})
    >>> host_declared(s, {"block": 64}) is s
    True
    >>> host_declared(s, {"block": 64, "pinned": 1}).names
    ('block', 'pinned')
    """
    added = tuple(k for k in HOST_KNOBS if k in config and k not in space.params)
    if not added:
        return space
    key = (id(space), added)
    hit = _DECLARED.get(key)
    if hit is not None and hit[0] is space:
        return hit[1]
    wide = _extend(space, added, {k: v[0] for k, v in HOST_KNOB_VALUES.items()})
    if len(_DECLARED) >= 1024:
        _DECLARED.clear()
    _DECLARED[key] = (space, wide)
    return wide
