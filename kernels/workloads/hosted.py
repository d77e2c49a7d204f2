"""A workload run under a host pattern: its space declares the host knobs.

A node that models the host side of its kernels (setting ``host_pattern``) runs each
workload wrapped in :class:`HostedWorkload`: the kernel is the same, but its declared
space also holds ``pinned``, ``streams``, ``batch`` and ``sync_every``
(:func:`kernels.transfers.with_host_knobs`), starting at the pattern's values. So a
host-side finding's change (pin the buffers, a second stream, batch the launches,
stop synchronizing) is a configuration change like any other: recommended inside the
space, applied at a safe point, measured, kept or rolled back.

>>> from kernelstream.kernels.workloads import get_workload
>>> w = HostedWorkload(get_workload("transpose"), HostPattern(h2d_bytes=1 << 20, pinned=False))
>>> c = w.default
>>> c["pinned"], w.geometry(c) == w.inner.geometry(w.inner.default)
(0, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelstream.kernels.space import Config, ParamValue, SearchSpace
from kernelstream.kernels.transfers import HostPattern, with_host_knobs
from kernelstream.kernels.workloads.base import Geometry, Traits, Workload

__all__ = ["HostedWorkload"]


class HostedWorkload:
    """``inner`` with the host knobs in its space; everything else is ``inner``'s."""

    def __init__(self, inner: Workload, pattern: HostPattern) -> None:
        self.inner = inner
        self.pattern = pattern
        self._space = with_host_knobs(inner.space, pattern)
        self._own = frozenset(inner.space.params)

    def __repr__(self) -> str:
        return f"HostedWorkload({self.inner!r}, {self.pattern!r})"

    def __getattr__(self, name: str) -> Any:
        # What the wrapper does not define (cost_model_known, make_inputs, ...) is the
        # kernel's own.
        return getattr(self.inner, name)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def kernel_name(self) -> str:
        return self.inner.kernel_name

    @property
    def source(self) -> Path | None:
        return self.inner.source

    @property
    def problem_size(self) -> tuple[int, ...]:
        return self.inner.problem_size

    @property
    def space(self) -> SearchSpace:
        return self._space

    @property
    def default(self) -> Config:
        return dict(self._space.default)

    def kernel_config(self, config: Mapping[str, ParamValue]) -> Config:
        """The kernel's own parameters of ``config`` (the host knobs left out)."""
        return {k: v for k, v in config.items() if k in self._own}

    def bytes_moved(self, config: Mapping[str, ParamValue]) -> float:
        return self.inner.bytes_moved(self.kernel_config(config))

    def flops(self, config: Mapping[str, ParamValue]) -> float:
        return self.inner.flops(self.kernel_config(config))

    def geometry(self, config: Mapping[str, ParamValue]) -> Geometry:
        return self.inner.geometry(self.kernel_config(config))

    def traits(self, config: Mapping[str, ParamValue]) -> Traits:
        return self.inner.traits(self.kernel_config(config))

    def defines(self, config: Mapping[str, ParamValue]) -> dict[str, int]:
        """The kernel's compile-time macros: the host knobs are not the kernel's."""
        defines: dict[str, int] = self.inner.defines(self.kernel_config(config))  # type: ignore[attr-defined]
        return defines
