"""Out-of-place float32 matrix transpose (``cuda/transpose.cu``), default 8192 x 8192.

Cost model: FLOPs 0; DRAM bytes ``8 R C`` (every element read once and written
once). What separates configurations is how well those bytes use DRAM sectors:

* reads are coalesced (a warp reads rows of ``tile_dim`` consecutive floats,
  at least one full 32-byte sector);
* naive writes (``use_shared=0``) go down a column: a warp writes ``k`` consecutive
  floats per output row, ``k = min(block_rows, 32 / tile_dim)`` (1 for tiles of
  32 and more), so a 32-byte sector carries ``4k`` useful bytes. We take store
  efficiency ``min(1, 0.2 k)``: 1/8 sector use, improved by a factor 1.6 for L2
  write combining (a modelling assumption, not a measurement);
* shared-memory writes are coalesced, but without ``pad`` reading a tile column
  hits one bank ``min(tile_dim, 32)``-fold; serialised shared accesses are
  folded into the efficiency as 0.6 (0.8 for 8-wide tiles), padding removes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernelstream.kernels.space import Constraint, ParamValue, SearchSpace
from kernelstream.kernels.workloads.base import CudaWorkload, Geometry, Traits

__all__ = ["Transpose"]

_SMEM_LIMIT = 48 * 1024


def _smem(c: Mapping[str, ParamValue]) -> int:
    t = int(c["tile_dim"])
    return 4 * t * (t + int(c["pad"])) if int(c["use_shared"]) else 0


class Transpose(CudaWorkload):
    name = "transpose"
    kernel_name = "transpose_kernel"
    DEFAULT_SIZE = (8192, 8192)
    SMALL_SIZE = (512, 1024)
    output_name = "out"

    def _build_space(self) -> SearchSpace:
        rows, cols = self._size
        constraints = (
            Constraint(
                "block_rows divides tile_dim",
                lambda c: int(c["tile_dim"]) % int(c["block_rows"]) == 0,
            ),
            Constraint(
                "tile_dim*block_rows is a multiple of 32 and <= 1024",
                lambda c: (t := int(c["tile_dim"]) * int(c["block_rows"])) <= 1024 and t % 32 == 0,
            ),
            Constraint(
                "pad only with use_shared",
                lambda c: bool(int(c["use_shared"])) or not int(c["pad"]),
            ),
            Constraint("shared tile fits in 48 KiB", lambda c: _smem(c) <= _SMEM_LIMIT),
            Constraint("rows divisible by tile_dim", lambda c: rows % int(c["tile_dim"]) == 0),
            Constraint(
                "cols divisible by tile_dim*tiles_per_block",
                lambda c: cols % (int(c["tile_dim"]) * int(c["tiles_per_block"])) == 0,
            ),
        )
        return SearchSpace(
            "transpose",
            {
                "tile_dim": (8, 16, 32, 64),
                "block_rows": (1, 2, 4, 8, 16, 32),
                "use_shared": (0, 1),
                "pad": (0, 1),
                "tiles_per_block": (1, 2, 4, 8),
            },
            # Deliberately poor: the naive kernel with strided, uncoalesced writes.
            default={
                "tile_dim": 32,
                "block_rows": 8,
                "use_shared": 0,
                "pad": 0,
                "tiles_per_block": 1,
            },
            constraints=constraints,
        )

    def bytes_moved(self, config: Mapping[str, ParamValue]) -> float:
        rows, cols = self._size
        return 8.0 * rows * cols

    def flops(self, config: Mapping[str, ParamValue]) -> float:
        return 0.0

    def geometry(self, config: Mapping[str, ParamValue]) -> Geometry:
        rows, cols = self._size
        t, br, tpb = (
            int(config["tile_dim"]),
            int(config["block_rows"]),
            int(config["tiles_per_block"]),
        )
        regs = 16 + 2 * (t // br) // 2 + 4 * int(config["use_shared"])
        return Geometry((cols // (t * tpb), rows // t, 1), (t, br, 1), 0, regs)

    def traits(self, config: Mapping[str, ParamValue]) -> Traits:
        t, br = int(config["tile_dim"]), int(config["block_rows"])
        if int(config["use_shared"]):
            store = 1.0
            conflicts = 1.0 if int(config["pad"]) else (0.8 if t <= 8 else 0.6)
        else:
            consecutive = min(br, max(1, 32 // t))
            store = min(1.0, 0.2 * consecutive)
            conflicts = 1.0
        # Harmonic mix: equal read and write bytes, writes at ``store`` efficiency.
        coalescing = conflicts * 2.0 / (1.0 + 1.0 / store)
        return Traits(
            coalescing=coalescing,
            bytes_in_flight_per_thread=4.0 * (t // br),
            compute_efficiency=1.0,
            compute_ilp=float(t // br),
            static_smem_bytes=_smem(config),
        )

    def make_inputs(self, rng: np.random.Generator, small: bool = False) -> dict[str, np.ndarray]:
        rows, cols = self._size_for(small)
        return {
            "x": rng.standard_normal((rows, cols), dtype=np.float32),
            "out": np.zeros((cols, rows), dtype=np.float32),
        }

    def kernel_args(self, arrays: Mapping[str, Any]) -> tuple[Any, ...]:
        rows, cols = arrays["x"].shape
        return (arrays["x"], arrays["out"], np.int32(rows), np.int32(cols))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.ascontiguousarray(inputs["x"].T)
