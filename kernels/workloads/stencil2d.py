"""5-point Jacobi stencil on an ``nx x ny`` float32 grid (``cuda/stencil2d.cu``), 8192^2.

Cost model: FLOPs ``6 nx ny`` (four adds, two multiplies per cell). DRAM bytes:
the output written once (``4 nx ny``) plus each block's input footprint, its
tile with a one-cell halo: ``4 nx ny (bx + 2)(by*iy + 2) / (bx * by*iy)``.
Halo rows start one float before a sector boundary, so a row segment of ``bx``
floats costs about ``bx + 4`` floats of sectors (coalescing ``bx / (bx + 4)``);
without shared memory, the five overlapping global loads per cell lose a further
15% to extra L1/L2 transactions (a modelling assumption).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernelstream.kernels.space import Constraint, ParamValue, SearchSpace
from kernelstream.kernels.workloads.base import CudaWorkload, Geometry, Traits

__all__ = ["Stencil2D"]

_SMEM_LIMIT = 48 * 1024


def _tile_y(c: Mapping[str, ParamValue]) -> int:
    return int(c["block_y"]) * int(c["items_y"])


def _smem(c: Mapping[str, ParamValue]) -> int:
    return 4 * (_tile_y(c) + 2) * (int(c["block_x"]) + 2) if int(c["use_shared"]) else 0


class Stencil2D(CudaWorkload):
    name = "stencil2d"
    kernel_name = "stencil2d_kernel"
    DEFAULT_SIZE = (8192, 8192)
    SMALL_SIZE = (512, 256)
    output_name = "out"

    def _build_space(self) -> SearchSpace:
        nx, ny = self._size
        constraints = (
            Constraint(
                "block_x*block_y is a multiple of 32 and <= 1024",
                lambda c: (t := int(c["block_x"]) * int(c["block_y"])) <= 1024 and t % 32 == 0,
            ),
            Constraint("nx divisible by block_x", lambda c: nx % int(c["block_x"]) == 0),
            Constraint("ny divisible by block_y*items_y", lambda c: ny % _tile_y(c) == 0),
            Constraint("shared tile fits in 48 KiB", lambda c: _smem(c) <= _SMEM_LIMIT),
        )
        return SearchSpace(
            "stencil2d",
            {
                "block_x": (8, 16, 32, 64, 128),
                "block_y": (1, 2, 4, 8, 16, 32),
                "items_y": (1, 2, 4, 8),
                "use_shared": (0, 1),
            },
            # Deliberately poor: narrow 8-wide blocks, one cell per thread, no shared memory.
            default={"block_x": 8, "block_y": 4, "items_y": 1, "use_shared": 0},
            constraints=constraints,
        )

    def bytes_moved(self, config: Mapping[str, ParamValue]) -> float:
        nx, ny = self._size
        bx, ty = int(config["block_x"]), _tile_y(config)
        footprint = (bx + 2) * (ty + 2) / (bx * ty)
        return 4.0 * nx * ny * (1.0 + footprint)

    def flops(self, config: Mapping[str, ParamValue]) -> float:
        nx, ny = self._size
        return 6.0 * nx * ny

    def geometry(self, config: Mapping[str, ParamValue]) -> Geometry:
        nx, ny = self._size
        bx, by = int(config["block_x"]), int(config["block_y"])
        regs = 20 + 4 * int(config["items_y"]) + 2 * int(config["use_shared"])
        return Geometry((nx // bx, ny // _tile_y(config), 1), (bx, by, 1), 0, regs)

    def traits(self, config: Mapping[str, ParamValue]) -> Traits:
        bx, iy = int(config["block_x"]), int(config["items_y"])
        shared = int(config["use_shared"])
        coalescing = bx / (bx + 4.0) * (1.0 if shared else 0.85)
        return Traits(
            coalescing=coalescing,
            bytes_in_flight_per_thread=4.0 * iy * (1.5 if shared else 1.0),
            compute_efficiency=0.3 if shared else 0.2,
            compute_ilp=float(iy),
            static_smem_bytes=_smem(config),
        )

    def make_inputs(self, rng: np.random.Generator, small: bool = False) -> dict[str, np.ndarray]:
        nx, ny = self._size_for(small)
        return {
            "x": rng.standard_normal((ny, nx), dtype=np.float32),
            "out": np.zeros((ny, nx), dtype=np.float32),
        }

    def kernel_args(self, arrays: Mapping[str, Any]) -> tuple[Any, ...]:
        ny, nx = arrays["x"].shape
        return (arrays["x"], arrays["out"], np.int32(nx), np.int32(ny))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        x = inputs["x"]
        out = x.copy()
        out[1:-1, 1:-1] = 0.5 * x[1:-1, 1:-1] + 0.125 * (
            x[1:-1, :-2] + x[1:-1, 2:] + x[:-2, 1:-1] + x[2:, 1:-1]
        )
        return out
