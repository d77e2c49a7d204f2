"""Sum of ``N`` float32 values (``cuda/reduction.cu``), default ``N = 2**26``.

Cost model: FLOPs ``N`` (one add per element); DRAM bytes ``4 N`` (each element
read once) plus ``4 * num_blocks`` for the per-block atomic partial sums. The
grid size is a tunable parameter: the deliberately poor default launches 32
blocks, far fewer than the SMs of any modelled GPU (under-utilization).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernelstream.kernels.space import Constraint, ParamValue, SearchSpace
from kernelstream.kernels.workloads.base import CudaWorkload, Geometry, Traits

__all__ = ["Reduction"]


def _elements_per_pass(c: Mapping[str, ParamValue]) -> int:
    return (
        int(c["num_blocks"]) * int(c["block_size"]) * int(c["items_per_thread"]) * int(c["vector"])
    )


class Reduction(CudaWorkload):
    name = "reduction"
    kernel_name = "reduce_sum_kernel"
    LAUNCH_PARAMS = frozenset({"num_blocks"})  # the grid size, not a macro of reduction.cu
    DEFAULT_SIZE = (1 << 26,)
    SMALL_SIZE = (1 << 20,)

    def _build_space(self) -> SearchSpace:
        n = self._size[0]
        constraints = (
            Constraint(
                "N divisible by vector (aligned vector loads)", lambda c: n % int(c["vector"]) == 0
            ),
            Constraint(
                "one grid pass covers at most N elements (no idle blocks)",
                lambda c: _elements_per_pass(c) <= n,
            ),
        )
        return SearchSpace(
            "reduction",
            {
                "block_size": (32, 64, 128, 256, 512, 1024),
                "items_per_thread": (1, 2, 4, 8, 16),
                "num_blocks": tuple(16 << i for i in range(10)),  # 16 .. 8192
                "vector": (1, 2, 4),
            },
            # Deliberately poor: 32 blocks leave most SMs idle, scalar loads.
            default={"block_size": 256, "items_per_thread": 1, "num_blocks": 32, "vector": 1},
            constraints=constraints,
        )

    def bytes_moved(self, config: Mapping[str, ParamValue]) -> float:
        return 4.0 * self._size[0] + 4.0 * int(config["num_blocks"])

    def flops(self, config: Mapping[str, ParamValue]) -> float:
        return float(self._size[0])

    def geometry(self, config: Mapping[str, ParamValue]) -> Geometry:
        regs = 16 + 4 * int(config["vector"]) + int(config["items_per_thread"])
        return Geometry(
            (int(config["num_blocks"]), 1, 1), (int(config["block_size"]), 1, 1), 0, regs
        )

    def traits(self, config: Mapping[str, ParamValue]) -> Traits:
        ipt, vec = int(config["items_per_thread"]), int(config["vector"])
        return Traits(
            coalescing=1.0,
            bytes_in_flight_per_thread=4.0 * ipt * vec,
            compute_efficiency=0.25,  # an add per element amid address and loop arithmetic
            compute_ilp=float(ipt * vec),
            static_smem_bytes=4 * max(1, int(config["block_size"]) // 32),
        )

    def make_inputs(self, rng: np.random.Generator, small: bool = False) -> dict[str, np.ndarray]:
        (n,) = self._size_for(small)
        return {
            "x": rng.standard_normal(n, dtype=np.float32),
            "out": np.zeros(1, dtype=np.float32),
        }

    def kernel_args(self, arrays: Mapping[str, Any]) -> tuple[Any, ...]:
        return (arrays["x"], arrays["out"], np.int64(arrays["x"].shape[0]))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.array([inputs["x"].astype(np.float64).sum()], dtype=np.float32)
