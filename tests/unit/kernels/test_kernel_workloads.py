"""Workloads: spaces, constraints, analytic models, geometry, references."""

from __future__ import annotations

import numpy as np
import pytest

from kernelstream.kernels import WORKLOAD_NAMES, get_workload
from kernelstream.kernels.errors import UnknownWorkloadError
from kernelstream.kernels.space import SpaceError
from kernelstream.kernels.workloads import scaled_problem_size


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_space_enumerates_and_default_is_valid(name: str) -> None:
    w = get_workload(name)
    assert 150 <= w.space.size() <= 5000
    assert w.space.is_valid(w.default)
    assert w.source.is_file() and w.kernel_name in w.source.read_text()


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_every_valid_config_has_sane_geometry(name: str) -> None:
    w = get_workload(name)
    for config in w.space:
        grid, block, smem, regs = w.geometry(config)
        threads = block[0] * block[1] * block[2]
        assert 32 <= threads <= 1024 and threads % 32 == 0
        assert min(grid) >= 1 and smem >= 0 and (regs is None or regs > 0)
        t = w.traits(config)
        assert 0 < t.coalescing <= 1 and 0 < t.compute_efficiency <= 1
        assert t.static_smem_bytes <= 48 * 1024
        assert w.bytes_moved(config) > 0 and w.flops(config) >= 0


def test_constraints_reject_bad_configs() -> None:
    mm = get_workload("matmul")
    big = {**mm.default, "block_x": 32, "block_y": 32, "items_per_thread": 8}
    big.update(use_shared=1, tile_k=64)
    assert not mm.space.is_valid(big)  # (256x64 + 64x32) floats > 48 KiB
    assert any("48 KiB" in v for v in mm.space.violations(big))
    tr = get_workload("transpose")
    assert not tr.space.is_valid({**tr.default, "pad": 1})  # pad needs shared memory
    assert not tr.space.is_valid({**tr.default, "block_rows": 64 // 2, "tile_dim": 64})
    with pytest.raises(SpaceError):
        tr.defines({**tr.default, "tile_dim": 7})


def test_matmul_model_numbers() -> None:
    w = get_workload("matmul", (1024,))
    assert w.flops(w.default) == 2 * 1024**3
    shared = {**w.default, "use_shared": 1, "block_x": 32, "block_y": 8, "items_per_thread": 4}
    # more on-chip reuse, less DRAM traffic; never below compulsory 3 matrices
    assert w.bytes_moved(shared) < w.bytes_moved(w.default)
    assert w.bytes_moved(shared) >= 3 * 4 * 1024**2
    n = 1024
    assert w.bytes_moved(shared) == 4 * n**3 * (1 / 32 + 1 / 32) + 4 * n**2


def test_transpose_and_reduction_models() -> None:
    tr = get_workload("transpose")
    assert tr.bytes_moved(tr.default) == 8 * 8192 * 8192 and tr.flops(tr.default) == 0
    naive, tiled = tr.traits(tr.default), tr.traits({**tr.default, "use_shared": 1, "pad": 1})
    assert naive.coalescing < 0.5 < tiled.coalescing == 1.0
    red = get_workload("reduction")
    assert red.flops(red.default) == 2**26
    assert red.geometry(red.default).grid == (32, 1, 1)


def test_registry_and_scaling() -> None:
    with pytest.raises(UnknownWorkloadError, match="known workloads"):
        get_workload("fft")
    assert scaled_problem_size("matmul", 0.5) == (1024,)
    assert get_workload("stencil2d", (1024, 512)).problem_size == (1024, 512)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_reference_on_small_inputs(name: str) -> None:
    w = get_workload(name)
    small = w.resized(w.SMALL_SIZE)
    inputs = w.make_inputs(np.random.default_rng(0), small=True)
    ref = w.reference(inputs)
    assert ref.dtype == np.float32 and np.isfinite(ref).all()
    assert len(small.kernel_args(inputs)) >= 3
    assert small.space.is_valid(small.default)


def test_a_hosted_workload_declares_the_space_a_worker_reads_off_its_configs() -> None:
    from kernelstream.kernels.transfers import HostPattern, host_declared
    from kernelstream.kernels.workloads.hosted import HostedWorkload

    for name in WORKLOAD_NAMES:
        base = get_workload(name)
        w = HostedWorkload(base, HostPattern(1 << 20, 0, pinned=False, batch=4, sync_every=1))
        start = w.space.start_config()
        assert {k: start[k] for k in ("pinned", "streams", "batch", "sync_every")} == {
            "pinned": 0,
            "streams": 1,
            "batch": 4,
            "sync_every": 1,
        }
        worker = host_declared(get_workload(name).space, start)
        for config in (start, {**start, "pinned": 1}, {**start, "batch": 64, "streams": 4}):
            assert worker.is_valid(config) and w.space.is_valid(config)
            assert worker.config_id(config) == w.space.config_id(config)
        # The kernel is the same whatever the knobs say.
        assert w.geometry({**start, "pinned": 1}) == base.geometry(base.space.start_config())
        assert not worker.is_valid({**start, "pinned": 2})
        assert not worker.is_valid({**start, "batch": 3})


def test_a_host_pattern_outside_the_declared_knob_values_is_refused() -> None:
    from kernelstream.kernels.transfers import HostPattern, with_host_knobs

    with pytest.raises(ValueError, match="batch=3"):
        with_host_knobs(get_workload("matmul").space, HostPattern(batch=3))
