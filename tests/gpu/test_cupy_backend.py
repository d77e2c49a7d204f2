"""CuPy backend on a real GPU: every workload matches its NumPy reference (small sizes)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from kernels import WORKLOAD_NAMES, get_workload
from kernels.backends.cupy import CupyDevice

pytestmark = pytest.mark.gpu


def _skip_without_gpu() -> None:
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy not installed: pip install 'kernelstream[gpu]'")
    import cupy

    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device visible")
    except cupy.cuda.runtime.CUDARuntimeError as ex:
        pytest.skip(f"no usable CUDA device: {ex}")


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_workload_matches_reference(name: str) -> None:
    _skip_without_gpu()
    import cupy

    small = get_workload(name, get_workload(name).SMALL_SIZE)
    dev = CupyDevice()
    try:
        host = small.make_inputs(np.random.default_rng(0))
        configs = list(small.space)
        for config in (small.default, configs[len(configs) // 2], configs[-1]):
            arrays = {k: cupy.asarray(v) for k, v in host.items()}
            fn = dev.compile(small, config)
            geo = small.geometry(config)
            fn(geo.grid, geo.block, small.kernel_args(arrays), shared_mem=geo.dynamic_smem_bytes)
            got = cupy.asnumpy(arrays[small.output_name])
            np.testing.assert_allclose(got, small.reference(host), rtol=2e-3, atol=2e-3)
        r = dev.launch(small, small.default, 5)
        assert r.ok.all() and (r.duration_us > 0).all()
        assert 0 < dev.plan(small, small.default).occupancy <= 1
    finally:
        dev.close()
