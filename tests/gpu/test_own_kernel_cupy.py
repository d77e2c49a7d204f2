"""TunableKernel on a real GPU: NVRTC compiles with -D defines, results, timing, fallback.

Needs CuPy and a CUDA device; skips with the reason otherwise. Also run by
``bench/gpu_session.sh`` with the rest of tests/gpu.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import numpy as np
import pytest

from kernelstream.kernels.errors import KernelArgumentError
from kernelstream.kernels.tunable import KernelRunner, TunableKernel

pytestmark = pytest.mark.gpu

# ``tile`` elements per thread; tile == 3 does not compile (a user's config that fails).
SOURCE = """
#if tile == 3
#error "tile 3 is not supported"
#endif
extern "C" __global__ void saxpy_tiled(float *y, const float *x, float a, int n) {
    int base = (blockIdx.x * block_size_x + threadIdx.x) * tile;
    for (int k = 0; k < tile; k++) {
        int i = base + k;
        if (i < n) y[i] = a * x[i] + y[i];
    }
}
"""


@pytest.fixture(scope="module")
def cp() -> Any:
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy not installed: pip install 'kernelstream[gpu]'")
    import cupy

    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device visible")
    except cupy.cuda.runtime.CUDARuntimeError as ex:
        pytest.skip(f"no usable CUDA device: {ex}")
    return cupy


def test_own_kernel_on_cupy(cp: Any) -> None:
    from kernelstream.kernels.backends.user import cupy_device

    n = 1 << 20
    k = TunableKernel(
        "saxpy_tiled",
        SOURCE,
        n,
        {"block_size_x": [64, 128, 256], "tile": [1, 2, 3, 4]},
        grid_div_x=["block_size_x", "tile"],
        flops=lambda c, p: 2.0 * p[0],
        bytes=lambda c, p: 12.0 * p[0],
        device=cupy_device(0),
    )
    x = cp.arange(n, dtype=cp.float32)
    for cfg in ({"block_size_x": 64, "tile": 1}, {"block_size_x": 256, "tile": 4}):
        k.use(cfg)
        y = cp.ones(n, dtype=cp.float32)
        k(y, x, np.float32(2.0), np.int32(n))
        np.testing.assert_allclose(cp.asnumpy(y), 2.0 * np.arange(n) + 1.0)
    with pytest.raises(KernelArgumentError):
        k(x, np.float32(2.0), np.int32(n))

    runner = KernelRunner(k.device)
    runner.add(k)
    y = cp.ones(n, dtype=cp.float32)
    for _ in range(50):
        k(y, x, np.float32(1.0), np.int32(n))
    runner.set_config("saxpy_tiled", {"block_size_x": 128, "tile": 3})  # does not compile
    for _ in range(10):
        k(y, x, np.float32(1.0), np.int32(n))
    cp.cuda.get_current_stream().synchronize()
    time.sleep(0.01)
    chunks = runner.tick(time.time())
    ok = [c for c in chunks if c.ok.all()]
    failed = [c for c in chunks if not c.ok.any()]
    assert sum(len(c.ok) for c in ok) == 60 and sum(len(c.ok) for c in failed) == 10
    assert all(c.config_id == "block_size_x=256,tile=4" for c in ok)
    assert all(np.all(c.duration_us > 0) for c in ok)
    assert "tile 3 is not supported" in k.failures["block_size_x=128,tile=3"]
    # 60 float32 additions past 2**24 round: the reference makes the same 60 roundings
    want = np.ones(n, dtype=np.float32)
    for _ in range(60):
        want += np.arange(n, dtype=np.float32)
    np.testing.assert_array_equal(cp.asnumpy(y), want)
    runner.detach_all()


def test_own_kernel_plan_reads_the_loaded_module_as_nvrtc_compiled_it(cp: Any) -> None:
    """A user kernel's plan on the GPU takes the loaded module's registers and shared
    memory, and they are those ``kernel.check()`` reads from NVRTC without a GPU."""
    pytest.importorskip("cuda.bindings", reason="the compile extra: pip install '.[compile]'")
    from kernelstream.kernels.backends.user import cupy_device
    from kernelstream.kernels.check import compile_workload
    from kernelstream.kernels.compile import arch_for

    k = TunableKernel(
        "saxpy_tiled",
        SOURCE,
        1 << 20,
        {"block_size_x": [64, 128, 256], "tile": [1, 2, 4]},
        grid_div_x=["block_size_x", "tile"],
        device=cupy_device(0),
    )
    arch = arch_for(k.device.spec.compute_capability)
    for config in ({"block_size_x": 64, "tile": 1}, {"block_size_x": 256, "tile": 4}):
        k.use(config)
        plan = k.device.plan(k.workload, config)
        compiled = compile_workload(k.workload, config, arch)  # what check() compiles
        assert plan.resources_source == "cupy module" and plan.resident_blocks_per_sm > 0
        nvrtc = cp.cuda.nvrtc.getVersion()  # a different NVRTC may allocate differently
        assert compiled.ok and plan.registers_per_thread == compiled.registers, (config, nvrtc)
