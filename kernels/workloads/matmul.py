"""Tiled SGEMM ``C = A @ B`` on square ``N x N`` float32 matrices (``cuda/matmul.cu``).

Cost model (documented, deliberately simple):

* FLOPs: ``2 N^3`` (one multiply and one add per inner-product term).
* DRAM bytes: ``4 N^2`` for writing C plus the re-reads of A and B. A block
  computing a ``Tm x Tn`` output tile reads ``Tm x N`` of A and ``N x Tn`` of B,
  so A is read ``N / Tn`` times and B ``N / Tm`` times:
  ``4 N^3 (1/Tn + 1/Tm)``. With shared memory the reuse tile is the block's
  output tile (``Tm = block_y * items_per_thread``, ``Tn = block_x``). Without
  it only what one warp touches together is reused (A values broadcast within a
  warp row, B values coalesced): ``Tn = min(block_x, 32)``,
  ``Tm = (32 / Tn) * items_per_thread``. L2 hits are not modelled, so this is
  the traffic the kernel asks of the memory system beyond its on-chip reuse.
* Compute efficiency: per k step a thread issues ``ipt`` FMAs plus ``ipt + 1``
  loads (cost 0.5 of an issue slot from shared memory, 1 from global memory)
  plus loop overhead ``2 / unroll``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernelstream.kernels.space import Constraint, ParamValue, SearchSpace
from kernelstream.kernels.workloads.base import CudaWorkload, Geometry, Traits

__all__ = ["Matmul"]

_SMEM_LIMIT = 48 * 1024  # static shared memory per block without opt-in (CUDA Guide)


def _tiles(c: Mapping[str, ParamValue]) -> tuple[int, int, int]:
    """(tile_m, tile_n, tile_k) of the block's output tile."""
    return int(c["block_y"]) * int(c["items_per_thread"]), int(c["block_x"]), int(c["tile_k"])


class Matmul(CudaWorkload):
    name = "matmul"
    kernel_name = "matmul_kernel"
    DEFAULT_SIZE = (2048,)
    SMALL_SIZE = (256,)
    output_name = "c"

    def _build_space(self) -> SearchSpace:
        n = self._size[0]

        def smem(c: Mapping[str, ParamValue]) -> int:
            tm, tn, tk = _tiles(c)
            return 4 * (tm * tk + tk * tn) if int(c["use_shared"]) else 0

        constraints = (
            Constraint(
                "block_x*block_y is a multiple of 32 and <= 1024",
                lambda c: (t := int(c["block_x"]) * int(c["block_y"])) <= 1024 and t % 32 == 0,
            ),
            Constraint("N divisible by block_y*items_per_thread", lambda c: n % _tiles(c)[0] == 0),
            Constraint("N divisible by block_x", lambda c: n % _tiles(c)[1] == 0),
            Constraint("N divisible by tile_k", lambda c: n % int(c["tile_k"]) == 0),
            Constraint("shared tiles fit in 48 KiB", lambda c: smem(c) <= _SMEM_LIMIT),
            Constraint(
                "tile_k divisible by unroll",
                lambda c: int(c["tile_k"]) % int(c["unroll"]) == 0,
            ),
        )
        return SearchSpace(
            "matmul",
            {
                "block_x": (8, 16, 32),
                "block_y": (2, 4, 8, 16, 32),
                "items_per_thread": (1, 2, 4, 8),
                "tile_k": (8, 16, 32, 64),
                "use_shared": (0, 1),
                "unroll": (1, 2, 4),
            },
            # Deliberately poor: small tiles, one output per thread, no shared memory.
            default={
                "block_x": 8,
                "block_y": 8,
                "items_per_thread": 1,
                "tile_k": 8,
                "use_shared": 0,
                "unroll": 1,
            },
            constraints=constraints,
        )

    def _reuse(self, c: Mapping[str, ParamValue]) -> tuple[int, int]:
        tm, tn, _ = _tiles(c)
        if int(c["use_shared"]):
            return tm, tn
        wn = min(int(c["block_x"]), 32)
        return (32 // wn) * int(c["items_per_thread"]), wn

    def bytes_moved(self, config: Mapping[str, ParamValue]) -> float:
        n = float(self._size[0])
        rm, rn = self._reuse(config)
        return 4.0 * n * n * n * (1.0 / rn + 1.0 / rm) + 4.0 * n * n

    def flops(self, config: Mapping[str, ParamValue]) -> float:
        n = float(self._size[0])
        return 2.0 * n**3

    def geometry(self, config: Mapping[str, ParamValue]) -> Geometry:
        n = self._size[0]
        tm, tn, _ = _tiles(config)
        ipt = int(config["items_per_thread"])
        regs = 24 + 2 * ipt + 4 * int(config["use_shared"]) + 2 * int(config["unroll"])
        return Geometry(
            (n // tn, n // tm, 1), (int(config["block_x"]), int(config["block_y"]), 1), 0, regs
        )

    def traits(self, config: Mapping[str, ParamValue]) -> Traits:
        tm, tn, tk = _tiles(config)
        ipt = int(config["items_per_thread"])
        shared = int(config["use_shared"])
        load_cost = 0.5 if shared else 1.0
        eff = ipt / (ipt + load_cost * (ipt + 1) + 2.0 / int(config["unroll"]))
        # Sub-warp rows (block_x < 32 without shared memory) split a warp's B loads
        # into several row segments; a row segment of 8 floats still fills a sector.
        return Traits(
            coalescing=1.0,
            bytes_in_flight_per_thread=4.0 * (ipt + 1) * (2.0 if shared else 1.0),
            compute_efficiency=eff,
            compute_ilp=float(ipt),
            static_smem_bytes=4 * (tm * tk + tk * tn) if shared else 0,
        )

    def make_inputs(self, rng: np.random.Generator, small: bool = False) -> dict[str, np.ndarray]:
        (n,) = self._size_for(small)
        return {
            "a": rng.standard_normal((n, n), dtype=np.float32),
            "b": rng.standard_normal((n, n), dtype=np.float32),
            "c": np.zeros((n, n), dtype=np.float32),
        }

    def kernel_args(self, arrays: Mapping[str, Any]) -> tuple[Any, ...]:
        return (arrays["a"], arrays["b"], arrays["c"], np.int32(arrays["a"].shape[0]))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        a = inputs["a"].astype(np.float64)
        return (a @ inputs["b"].astype(np.float64)).astype(np.float32)
