"""What every workload provides: space, launch geometry, analytic cost model, traits.

A workload is a kernel plus a problem size. Its search space says which
configurations it can run; for each configuration it states the launch geometry
and an analytic cost model (DRAM bytes, FLOPs) that telemetry uses to place a
launch on the roofline, and :class:`Traits` the simulated device needs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from kernelstream.kernels.space import Config, ParamValue, SearchSpace

__all__ = ["CudaWorkload", "Geometry", "Traits", "Workload", "ceil_div", "smooth_min"]

_CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"


_MAX_DIM = 2**31 - 1


class Geometry(NamedTuple):
    """Launch geometry of one configuration; unpacks as ``grid, block, smem, regs``."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int
    registers_per_thread: int | None

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


@dataclass(frozen=True)
class Traits:
    """How one configuration uses the memory system and the ALUs (for the sim model).

    ``coalescing``: useful / transferred DRAM bytes in (0, 1] (sector waste, and
    shared-memory bank-conflict serialisation folded in). ``bytes_in_flight_per_thread``:
    independent memory bytes a thread has outstanding (items per thread x vector
    width x 4): the memory-level parallelism that hides DRAM latency.
    ``compute_efficiency``: useful FP32 FLOPs per issue slot in (0, 1] (load and
    loop instructions compete with FMAs). ``compute_ilp``: independent arithmetic
    chains per thread. ``static_smem_bytes``: shared memory per block.
    """

    coalescing: float = 1.0
    bytes_in_flight_per_thread: float = 4.0
    compute_efficiency: float = 1.0
    compute_ilp: float = 1.0
    static_smem_bytes: int = 0


@runtime_checkable
class Workload(Protocol):
    """The interface backends use; built-in CUDA workloads and trace spaces provide it."""

    @property
    def name(self) -> str: ...
    @property
    def kernel_name(self) -> str: ...
    @property
    def source(self) -> Path | None: ...
    @property
    def problem_size(self) -> tuple[int, ...]: ...
    @property
    def space(self) -> SearchSpace: ...
    @property
    def default(self) -> Config: ...
    def bytes_moved(self, config: Mapping[str, ParamValue]) -> float: ...
    def flops(self, config: Mapping[str, ParamValue]) -> float: ...
    def geometry(self, config: Mapping[str, ParamValue]) -> Geometry: ...
    def traits(self, config: Mapping[str, ParamValue]) -> Traits: ...


def smooth_min(x: float, p: float = 4.0) -> float:
    """``min(x, 1)`` with a smooth knee: ``x / (1 + x**p) ** (1/p)``, for x >= 0."""
    if x <= 0.0:
        return 0.0
    return x / (1.0 + x**p) ** (1.0 / p)


def _int(config: Mapping[str, ParamValue], name: str) -> int:
    return int(config[name])


class CudaWorkload(ABC):
    """A built-in workload with a CUDA source in ``kernels/cuda/<name>.cu``.

    Subclasses set ``name``, ``kernel_name``, ``DEFAULT_SIZE``, ``SMALL_SIZE`` and
    implement the model. Tunable parameters reach the kernel as ``-D`` macros
    named by upper-casing the parameter name, except ``LAUNCH_PARAMS``: those only
    shape the launch (e.g. the number of blocks), so configurations differing only
    in them share one compiled module.
    """

    name: str = ""
    kernel_name: str = ""
    LAUNCH_PARAMS: frozenset[str] = frozenset()
    DEFAULT_SIZE: tuple[int, ...] = ()
    SMALL_SIZE: tuple[int, ...] = ()

    def __init__(self, problem_size: tuple[int, ...] | None = None) -> None:
        size = tuple(int(s) for s in (problem_size or self.DEFAULT_SIZE))
        if len(size) != len(self.DEFAULT_SIZE) or any(s <= 0 for s in size):
            raise ValueError(
                f"workload {self.name!r}: problem size {size} must be "
                f"{len(self.DEFAULT_SIZE)} positive integers"
            )
        if any(s > _MAX_DIM for s in size):
            # The kernels index with 32-bit ints: a larger dimension is not one they run.
            raise ValueError(
                f"workload {self.name!r}: problem size {size} has a dimension over {_MAX_DIM}"
            )
        self._size = size
        self._space = self._build_space()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(problem_size={self._size})"

    @property
    def problem_size(self) -> tuple[int, ...]:
        return self._size

    @property
    def space(self) -> SearchSpace:
        return self._space

    @property
    def default(self) -> Config:
        return dict(self._space.default)

    @property
    def source(self) -> Path:
        return _CUDA_DIR / f"{self.name}.cu"

    def defines(self, config: Mapping[str, ParamValue]) -> dict[str, int]:
        """Compile-time macros for ``config`` (``-DNAME=value``), after a space check."""
        checked = self._space.check(config)
        return {p.upper(): int(v) for p, v in checked.items() if p not in self.LAUNCH_PARAMS}

    def resized(self, problem_size: tuple[int, ...]) -> CudaWorkload:
        """The same workload on another problem size."""
        return type(self)(problem_size)

    @abstractmethod
    def _build_space(self) -> SearchSpace: ...

    @abstractmethod
    def bytes_moved(self, config: Mapping[str, ParamValue]) -> float: ...

    @abstractmethod
    def flops(self, config: Mapping[str, ParamValue]) -> float: ...

    @abstractmethod
    def geometry(self, config: Mapping[str, ParamValue]) -> Geometry: ...

    @abstractmethod
    def traits(self, config: Mapping[str, ParamValue]) -> Traits: ...

    @abstractmethod
    def make_inputs(self, rng: np.random.Generator, small: bool = False) -> dict[str, np.ndarray]:
        """Input and output arrays for ``self.problem_size`` (``SMALL_SIZE`` when ``small``).

        With ``small=True`` use ``self.resized(self.SMALL_SIZE)`` for geometry.
        """

    @abstractmethod
    def kernel_args(self, arrays: Mapping[str, Any]) -> tuple[Any, ...]:
        """Positional kernel arguments: the arrays (host or device) and scalar sizes."""

    @abstractmethod
    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """NumPy result the kernel's output must match."""

    output_name: str = "out"

    def _size_for(self, small: bool) -> tuple[int, ...]:
        return self.SMALL_SIZE if small else self._size


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
