"""A user's kernel compiles with NVRTC without a GPU: ``TunableKernel.check`` per configuration
and architecture with the compiler's log, ``compile_device``, and the compiled registers and
shared memory in the occupancy of its launches (with where they came from)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelstream
from kernelstream.kernels.backends.user import compile_device
from kernelstream.kernels.check import device_for_arch
from kernelstream.kernels.compile import compiler_version
from kernelstream.kernels.devices import theoretical_occupancy
from kernelstream.kernels.errors import KernelCompileError, KernelDefinitionError
from kernelstream.kernels.runner import LaunchBatcher
from kernelstream.kernels.tunable import KernelNodeDevice, KernelRunner, TunableKernel
from tests.toy_cache import write_toy_cache

# Each block stages its tiles in static shared memory (block_size_x * tile floats), so the
# compiled kernel's shared memory, not an estimate, decides how many blocks fit on an SM.
# A tile of 3 is refused by the source itself: a configuration that does not compile.
STAGED = r"""
#if tile == 3
#error "a tile of 3 is not supported"
#endif
extern "C" __global__ void staged(float *y, const float *x, int n) {
    __shared__ float s[block_size_x * tile * 8];
    int base = (blockIdx.x * block_size_x + threadIdx.x) * tile;
    for (int k = 0; k < tile; k++)
        s[threadIdx.x * tile + k] = base + k < n ? x[base + k] : 0.0f;
    __syncthreads();
    for (int k = 0; k < tile; k++)
        if (base + k < n) y[base + k] = 2.0f * s[(threadIdx.x * tile + k + 1) % (8 * tile)];
}
"""
PARAMS = {"block_size_x": [64, 128, 256], "tile": [1, 2, 3, 4]}


def staged(device: object, **kw: object) -> TunableKernel:
    return TunableKernel(
        "staged",
        STAGED,
        1 << 20,
        PARAMS,
        grid_div_x=["block_size_x", "tile"],
        device=device,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_check_reports_each_configuration_and_arch_with_the_compiler_log(
    tmp_path: Path,
) -> None:
    k = staged(compile_device("sm_80"))
    rows = k.check(sample=12, cache_dir=tmp_path)  # 12 of the 12: every configuration
    assert [r.arch for r in rows] == ["sm_80"] * 12 + ["sm_90"] * 12
    assert rows[0].config == k.workload.default
    failed = [r for r in rows if not r.result.ok]
    assert {r.config_id for r in failed} == {f"block_size_x={b},tile=3" for b in (64, 128, 256)}
    assert len(failed) == 6  # on both architectures
    for r in failed:
        assert "a tile of 3 is not supported" in r.result.log
        assert r.result.registers is None and r.occupancy is None
    for r in rows:
        if not r.result.ok:
            continue
        res, b, t = r.result, int(r.config["block_size_x"]), int(r.config["tile"])
        assert res.compiler == compiler_version() and f"for '{r.arch}'" in res.log
        assert res.registers is not None and 0 < res.registers <= 255
        assert res.static_smem_bytes == 4 * b * t * 8 and res.spills == 0
        spec = device_for_arch(r.arch)
        assert spec is not None and r.device == spec.name
        assert r.occupancy == theoretical_occupancy(spec, b, res.registers, 4 * b * t * 8)[0]
    # what check compiled is cached on disk: a second check compiles nothing
    again = k.check("sm_90", sample=3, cache_dir=tmp_path)
    assert all(r.result.cached for r in again) and len(again) == 3


def test_check_samples_the_default_and_a_spread_of_the_space(tmp_path: Path) -> None:
    k = staged(compile_device(), default={"block_size_x": 128, "tile": 2})
    rows = k.check("sm_90", sample=4, cache_dir=tmp_path)
    ids = [r.config_id for r in rows]
    assert ids[0] == "block_size_x=128,tile=2" and len(set(ids)) == len(ids) == 4
    assert {r.config["block_size_x"] for r in rows} == {64, 128, 256}
    with pytest.raises(ValueError, match="sm_XY"):
        k.check("90")
    with pytest.raises(ValueError, match="sample"):
        k.check(sample=0)


def test_a_kernel_on_a_trace_device_checks_its_source_too(tmp_path: Path) -> None:
    cache = tmp_path / "toy.json.gz"
    write_toy_cache(cache)
    src = 'extern "C" __global__ void toy(float *out, const float *in, int n) { out[0] = n; }'
    k = TunableKernel(
        "toy",
        src,
        1024,
        {"block_size_x": [32, 64, 128, 256], "tile_size_x": [1, 2, 4]},
        grid_div_x=["block_size_x", "tile_size_x"],
        device=kernelstream.trace_device(cache, pace=False),
    )
    rows = k.check("sm_80", every=True, cache_dir=tmp_path / "c")
    # every point its file lists, the one that failed when measured included
    assert len(rows) == k.space.size() == 12 and all(r.result.ok for r in rows)


def test_compile_device_compiles_the_first_configuration_and_runs_nothing() -> None:
    k = staged(compile_device("sm_90"))
    assert k.device.spec.name == "H100-SXM5-80GB"
    with pytest.raises(KernelDefinitionError, match="compiles kernels and runs none"):
        k(None, None, 0)
    with pytest.raises(KernelCompileError, match="a tile of 3 is not supported"):
        staged(compile_device(), default={"block_size_x": 64, "tile": 3})
    with pytest.raises(KernelCompileError, match="a tile of 3 is not supported"):
        k.use({"block_size_x": 64, "tile": 3})
    with pytest.raises(ValueError, match="sm_XY"):
        compile_device("hopper")


def test_default_device_gives_kernels_made_without_one_a_device() -> None:
    from kernelstream.kernels.tunable import default_device

    dev = compile_device("sm_80")
    with default_device(dev):
        inside = TunableKernel("staged", STAGED, 1 << 20, PARAMS)
    assert inside.device is dev


def test_launch_occupancy_uses_the_compiled_resources_and_says_so(tmp_path: Path) -> None:
    """A user kernel's launches carry the occupancy of its compiled registers and shared
    memory, and the compiler as its source, through the batch to the finding."""
    from kernelstream.agents.logic.detection import Detector
    from kernelstream.agents.logic.windowing import Windower

    k = staged(compile_device("sm_90"))
    cfg = {"block_size_x": 256, "tile": 4}  # 32 KiB of static shared memory per block
    (row,) = [r for r in k.check("sm_90", every=True) if r.config == cfg]
    plan = k.device.plan(k.workload, cfg)
    assert plan.resources_source == f"{compiler_version()} sm_90"
    assert plan.registers_per_thread == row.result.registers
    assert plan.occupancy == row.occupancy
    assert row.occupancy is not None and row.occupancy < 1.0  # shared memory limits it

    # the same through a node's batch, window and finding
    cache = tmp_path / "staged.json.gz"
    from tests.toy_cache import write_kt_cache

    write_kt_cache(
        cache,
        PARAMS,
        {
            f"{b},{t}": {"block_size_x": b, "tile": t, "time": 10.0, "times": [10.0] * 3}
            for b in PARAMS["block_size_x"]
            for t in PARAMS["tile"]
            if t != 3  # it does not compile: never measured
        },
        "staged",
        [1 << 20],
        "NVIDIA H100-SXM5-80GB",
    )
    traced = staged(kernelstream.trace_device(cache, pace=False), default=cfg)
    runner = KernelRunner(traced.device)
    runner.add(traced)
    try:
        for _ in range(20):
            traced(None, None, 0)
        batcher = LaunchBatcher(KernelNodeDevice(runner), "node-1")
        for chunk in runner.tick(0.0):
            batcher.add(chunk, 0.0)
        (node_batch,) = batcher.flush()
        batch = node_batch.record()
    finally:
        runner.detach_all()
    assert batch.device_model == "H100-SXM5-80GB"
    assert batch.resources_source == f"{compiler_version()} sm_90"
    assert batch.occupancy == pytest.approx(plan.occupancy)
    windower = Windower()
    windower.add(batch, 0.0)
    windows = windower.flush_all()  # the launches' wall-clock times may span two windows
    assert windows
    for window in windows:
        finding = Detector().classify(window)
        assert finding.evidence["occupancy_source"] == f"{compiler_version()} sm_90"


def test_a_configuration_that_does_not_compile_keeps_the_estimate() -> None:
    k = staged(compile_device("sm_90"))
    plan = k.device.plan(k.workload, {"block_size_x": 64, "tile": 3})
    assert plan.resources_source == "estimate"


def test_without_nvrtc_plans_use_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    k = staged(compile_device("sm_90"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # as if the extra were absent
    plan = k.device.plan(k.workload, {"block_size_x": 128, "tile": 1})
    assert plan.resources_source == "estimate"
