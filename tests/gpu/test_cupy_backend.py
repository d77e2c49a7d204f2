"""CuPy backend on a real GPU: reference checks, timing, driver occupancy, NVML, sweeps.

Every test here needs CuPy and a CUDA device and skips with the reason otherwise
(``pip install 'kernelstream[gpu]'``). ``bench/gpu_session.sh`` runs them.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernelstream.kernels import WORKLOAD_NAMES, get_workload
from kernelstream.kernels.backends.cupy import CupyDevice
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.devices import device_spec_for_name, theoretical_occupancy
from kernelstream.kernels.workloads import CudaWorkload

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


@pytest.fixture(scope="module")
def dev() -> Any:
    _skip_without_gpu()
    d = CupyDevice(nvml_interval_s=0.1)
    yield d
    d.close()


def _configs(small: Any) -> list[dict[str, Any]]:
    """Default, first, middle, last and the sim model's best of the small space."""
    configs = list(small.space)
    sim = SimDevice("A100-SXM4-80GB")
    best = min(configs, key=lambda c: sim.predict_us(small, c) or float("inf"))
    chosen = [small.default, configs[0], configs[len(configs) // 2], configs[-1], best]
    return [dict(c) for c in {small.space.config_id(c): c for c in chosen}.values()]


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_workload_matches_reference(dev: CupyDevice, name: str) -> None:
    small = get_workload(name, get_workload(name).SMALL_SIZE)
    for config in _configs(small):
        err = dev.check_reference(small, config)
        assert err < 2e-3, f"{name} {small.space.config_id(config)}: relative error {err:.2e}"


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_launch_timing_and_driver_occupancy(dev: CupyDevice, name: str) -> None:
    w = next(x for x in dev.workloads() if x.name == name)
    r = dev.launch(w, w.default, 5)
    assert r.ok.all() and (r.duration_us > 0).all()
    plan = dev.plan(w, w.default)
    assert dev.occupancy_source == "driver"
    assert 0 < plan.occupancy <= 1 and plan.resident_blocks_per_sm >= 1
    assert plan.registers_per_thread and plan.registers_per_thread > 0


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_formula_occupancy_agrees_with_the_driver(dev: CupyDevice, name: str) -> None:
    w = next(x for x in dev.workloads() if x.name == name)
    assert isinstance(w, CudaWorkload)  # workloads() is typed list[Workload]; CuPy's are CUDA
    for config in _configs(w)[:3]:
        plan = dev.plan(w, config)
        smem = plan.dynamic_smem_bytes + int(dev.compile(w, config).shared_size_bytes)
        _, formula = theoretical_occupancy(
            dev.spec, plan.threads_per_block, plan.registers_per_thread, smem
        )
        assert formula == plan.resident_blocks_per_sm, (name, config)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_compiler_table_matches_the_loaded_module(dev: CupyDevice, name: str) -> None:
    """The registers and static shared memory in kernels/cuda/resources.json.gz (NVRTC,
    no GPU) are those of the module CuPy loads on this GPU, where the table has its arch."""
    from kernelstream.kernels.compile import arch_for
    from kernelstream.kernels.resources import compiled_resources

    w = next(x for x in dev.workloads() if x.name == name)
    assert isinstance(w, CudaWorkload)
    arch = arch_for(dev.spec.compute_capability)
    if compiled_resources(w, w.default, arch) is None:
        pytest.skip(f"the resource table has no {arch} entries")
    for config in _configs(w):
        table = compiled_resources(w, config, arch)
        fn = dev.compile(w, config)
        assert table is not None, (name, config)
        got = (int(fn.num_regs), int(fn.shared_size_bytes))
        nvrtc = dev.cupy.cuda.nvrtc.getVersion()  # a different NVRTC may allocate differently
        assert got == (table.registers, table.static_smem_bytes), (
            name,
            config,
            table.source,
            nvrtc,
        )


def test_peaks_from_attributes_are_near_the_datasheet(dev: CupyDevice) -> None:
    try:
        sheet = device_spec_for_name(dev.device_name)
    except LookupError:
        pytest.skip(f"no datasheet spec for {dev.device_name!r}")
    assert dev.spec.name == sheet.name
    assert 0.7 < dev.spec.peak_gbs / sheet.peak_gbs < 1.3
    assert 0.7 < dev.spec.peak_gflops_fp32 / sheet.peak_gflops_fp32 < 1.3


def test_nvml_samples_off_the_launch_path(dev: CupyDevice) -> None:
    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py not installed: pip install 'kernelstream[gpu]'")
    sampler = dev.sampler
    assert sampler is not None and sampler.running
    w = next(x for x in dev.workloads() if x.name == "matmul")
    deadline = time.monotonic() + 10.0
    while sampler.samples < 3 and time.monotonic() < deadline:
        dev.launch(w, w.default, 3)
    sample = dev.sample()
    assert sample is not None and "sm_util_pct" in sample and "mem_used_bytes" in sample
    if sampler.gpm_supported:
        assert "sm_occupancy_pct" in sample and "dram_bw_util_pct" in sample


def test_sweep_of_a_small_space_loads_as_a_trace(dev: CupyDevice, tmp_path: Path) -> None:
    from kernelstream.kernels.backends.trace import TraceDevice
    from kernelstream.kernels.sweep import cache_document, sweep, write_cache

    w = get_workload("transpose", get_workload("transpose").SMALL_SIZE)
    result = sweep(dev, w, iterations=3)
    assert len(result.times_ms) + len(result.failed) == w.space.size()
    path = write_cache(cache_document(result), tmp_path / "transpose.json.gz")
    trace = TraceDevice(path)
    (tw,) = trace.workloads()
    assert trace.launch(tw, tw.default, 4).ok.all()
    assert np.isfinite(trace.plan(tw, tw.default).occupancy)


def test_host_gaps_are_measured_per_launch(dev: CupyDevice) -> None:
    """The host's gap before each launch and the wait after a batch's synchronisation."""
    w = next(x for x in dev.workloads() if x.name == "transpose")
    dev.launch(w, w.default, 3)
    r = dev.launch(w, w.default, 50)
    assert r.host_gap_us is not None and r.host_waited is not None
    assert len(r.host_gap_us) == 50 and (r.host_gap_us >= 0).all()
    assert r.host_waited.tolist() == [True] + [False] * 49
    # back-to-back calls from Python: the host gaps between them are microseconds
    assert float(np.median(r.host_gap_us[1:])) < 1000.0
