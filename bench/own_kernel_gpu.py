"""A user's own kernel under the whole loop on a real GPU (``python -m
kernelstream.bench.own_kernel_gpu [SECONDS]``; ``bench/gpu_session.sh`` runs it).

The saxpy of the guide ([your own kernels](../docs/guide/own-kernels.md), "On a GPU") runs
in a loop for SECONDS (default 90) under ``kernelstream.Node()``, the embedded broker and
a worker: every call a launch, the node publishing them, the worker recommending, the node
switching configurations between calls. It prints the configuration in force every 10 s
and each change. Then, with the node stopped, every configuration of the space is timed
directly (200 launches between two CUDA events), so the configuration the loop ended on
can be compared with the space's best measured on the same GPU in the same run.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

import kernelstream

_SOURCE = """
extern "C" __global__ void saxpy(float *y, const float *x, float a, int n) {
    int base = (blockIdx.x * block_size_x + threadIdx.x) * tile;
    for (int k = 0; k < tile; k++)
        if (base + k < n) y[base + k] = a * x[base + k] + y[base + k];
}
"""
_N = 1 << 24


def _loop(kernel: kernelstream.TunableKernel, args: tuple[Any, ...], seconds: float) -> list:
    """Call the kernel for ``seconds`` under a node; the (time, config id) of each change."""
    changes: list[tuple[float, str]] = []
    t0, calls, last, next_print = time.time(), 0, kernel.config_id, 10
    with kernelstream.Node():
        while (elapsed := time.time() - t0) < seconds:
            kernel(*args)
            calls += 1
            if kernel.config_id != last:
                last = kernel.config_id
                changes.append((round(elapsed, 1), last))
            if elapsed > next_print:
                print(f"{next_print:4d} s: {calls} calls, running {last}", flush=True)
                next_print += 10
    return changes


def _time_space(kernel: kernelstream.TunableKernel, args: tuple[Any, ...], cp: Any) -> dict:
    """Mean us per launch of every configuration, 200 launches between two events."""
    stream = cp.cuda.get_current_stream()
    times = {}
    for config in kernel.space:
        kernel.use(config)
        for _ in range(20):
            kernel(*args)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        stream.synchronize()
        start.record(stream)
        for _ in range(200):
            kernel(*args)
        end.record(stream)
        end.synchronize()
        times[kernel.space.config_id(config)] = cp.cuda.get_elapsed_time(start, end) * 1000 / 200
    return times


def main(seconds: float) -> None:
    import cupy as cp

    kernel = kernelstream.TunableKernel(
        "saxpy",
        _SOURCE,
        _N,
        {"block_size_x": [64, 128, 256, 512, 1024], "tile": [1, 2, 4, 8]},
        grid_div_x=["block_size_x", "tile"],
        flops=lambda config, size: 2.0 * size[0],
        bytes=lambda config, size: 12.0 * size[0],
    )
    x, y = cp.ones(_N, dtype=cp.float32), cp.zeros(_N, dtype=cp.float32)
    args = (y, x, np.float32(2.0), np.int32(_N))
    first = kernel.config_id
    changes = _loop(kernel, args, seconds)
    print("started at", first, "; changes (s, config):", changes[:40], "... total", len(changes))
    final = kernel.config_id
    times = _time_space(kernel, args, cp)
    best = min(times, key=times.__getitem__)
    print(
        f"space of {len(times)}: best {best} {times[best]:.2f} us; start {first} "
        f"{times[first]:.2f} us ({times[first] / times[best]:.2f}x); final {final} "
        f"{times[final]:.2f} us ({times[final] / times[best]:.3f}x of best)"
    )
    for cid, us in sorted(times.items(), key=lambda kv: kv[1])[:6]:
        print(f"   {cid:28s} {us:8.2f} us")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 90.0)
