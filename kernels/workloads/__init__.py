"""Built-in CUDA workloads and their registry.

>>> w = get_workload("matmul")
>>> w.problem_size, w.flops(w.default)
((2048,), 17179869184.0)
"""

from __future__ import annotations

from kernelstream.kernels.errors import UnknownWorkloadError
from kernelstream.kernels.workloads.base import CudaWorkload, Geometry, Traits, Workload
from kernelstream.kernels.workloads.matmul import Matmul
from kernelstream.kernels.workloads.reduction import Reduction
from kernelstream.kernels.workloads.stencil2d import Stencil2D
from kernelstream.kernels.workloads.transpose import Transpose

__all__ = [
    "WORKLOAD_NAMES",
    "CudaWorkload",
    "Geometry",
    "Traits",
    "Workload",
    "get_workload",
    "scaled_problem_size",
]

_REGISTRY: dict[str, type[CudaWorkload]] = {
    cls.name: cls for cls in (Matmul, Reduction, Transpose, Stencil2D)
}
WORKLOAD_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get_workload(name: str, problem_size: tuple[int, ...] | None = None) -> CudaWorkload:
    """The built-in workload ``name`` on ``problem_size`` (its default size when None)."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise UnknownWorkloadError(
            f"unknown workload {name!r}; known workloads: {list(WORKLOAD_NAMES)}"
        ) from None
    return cls(problem_size)


def scaled_problem_size(name: str, scale: float) -> tuple[int, ...]:
    """The default problem size of ``name`` scaled by ``scale`` in total work.

    Each dimension is scaled by ``scale ** (1/ndim)`` and rounded to a multiple of
    256 (at least 256) so the tile-divisibility constraints keep most of the space.

    >>> scaled_problem_size("transpose", 0.25)
    (4096, 4096)
    """
    if scale <= 0:
        raise ValueError(f"problem scale must be positive, got {scale}")
    base = get_workload(name).problem_size
    factor = scale ** (1.0 / len(base))
    return tuple(max(256, round(d * factor / 256) * 256) for d in base)
