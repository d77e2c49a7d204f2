"""The compiler's resource table (kernels/cuda/resources.json.gz) is current, and the occupancy
model and the sim device use its numbers instead of the workloads' estimates."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from kernelstream.kernels import WORKLOAD_NAMES, get_workload
from kernelstream.kernels.backends.base import make_plan
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.check import sample_configs
from kernelstream.kernels.compile import arch_for, compile_config
from kernelstream.kernels.devices import DEVICE_SPECS, get_device_spec, theoretical_occupancy
from kernelstream.kernels.resources import (
    TABLE_PATH,
    compiled_resources,
    load_table,
    source_sha256,
)

REGENERATE = (
    "kernels/cuda/resources.json.gz is stale: run kernelstream kernels check --all "
    + " ".join(
        f"--arch {a}"
        for a in sorted({arch_for(s.compute_capability) for s in DEVICE_SPECS.values()})
    )
    + " --table kernels/cuda/resources.json.gz"
)
ARCHS = sorted({arch_for(s.compute_capability) for s in DEVICE_SPECS.values()})


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_table_covers_every_configuration_of_the_current_sources(name: str) -> None:
    w = get_workload(name)
    per_arch = load_table()["workloads"][name]
    assert sorted(per_arch) == ARCHS, REGENERATE
    for arch, entry in per_arch.items():
        assert entry["source_sha256"] == source_sha256(w.source), f"{name} {arch}: {REGENERATE}"
        assert set(entry["configs"]) == {w.space.config_id(c) for c in w.space}, REGENERATE
        assert all(v is not None for v in entry["configs"].values()), f"{name} {arch} failed"


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_table_matches_a_fresh_compile(name: str, tmp_path: Path) -> None:
    w = get_workload(name)
    for arch in ("sm_80", "sm_90"):
        for config in sample_configs(w, 3):
            fresh = compile_config(
                w.source, w.kernel_name, w.defines(config), arch, cache_dir=tmp_path
            )
            table = compiled_resources(w, config, arch)
            assert table is not None and table.source == f"{fresh.compiler} {arch}", REGENERATE
            got = (table.registers, table.static_smem_bytes, table.local_bytes, table.spills)
            assert got == (
                fresh.registers,
                fresh.static_smem_bytes,
                fresh.local_bytes,
                fresh.spills,
            )


def test_a_changed_source_falls_back_to_the_estimate(tmp_path: Path) -> None:
    w = get_workload("transpose")
    doc = load_table()
    doc["workloads"]["transpose"]["sm_90"]["source_sha256"] = "0" * 64
    stale = tmp_path / "resources.json.gz"
    stale.write_bytes(gzip.compress(orjson.dumps(doc)))
    assert compiled_resources(w, w.default, "sm_90", table=stale) is None
    assert compiled_resources(w, w.default, "sm_90", table=TABLE_PATH) is not None
    assert compiled_resources(w, w.default, "sm_90", table=tmp_path / "missing.json.gz") is None
    garbage = tmp_path / "garbage.json.gz"
    garbage.write_bytes(b"not gzip")
    assert compiled_resources(w, w.default, "sm_90", table=garbage) is None


def test_plans_use_the_compiler_numbers_and_say_so() -> None:
    w = get_workload("transpose")
    # the largest shared-memory tiles: the estimate says 24 registers, the compiler more
    config = list(w.space)[-1]
    for model in ("A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB"):
        spec = get_device_spec(model)
        arch = arch_for(spec.compute_capability)
        real = compiled_resources(w, config, arch)
        assert real is not None
        plan = SimDevice(model).plan(w, config)
        assert plan.resources_source == f"{real.source}" and real.source.startswith("nvrtc 12.")
        assert (
            plan.registers_per_thread == real.registers != w.geometry(config).registers_per_thread
        )
        geo = w.geometry(config)
        occ, resident = theoretical_occupancy(
            spec,
            geo.threads_per_block,
            real.registers,
            geo.dynamic_smem_bytes + real.static_smem_bytes,
        )
        assert (plan.occupancy, plan.resident_blocks_per_sm) == (occ, resident)


def test_sim_durations_follow_the_compiled_occupancy() -> None:
    """On H100, transpose's largest tiles use 43 registers (not the estimated 24): half the
    resident blocks, so the sim model's duration differs from the estimate-based one."""
    w = get_workload("transpose")
    config = list(w.space)[-1]
    spec = get_device_spec("H100-SXM5-80GB")
    compiled = make_plan(spec, w, config)
    estimated = make_plan(
        spec,
        w,
        config,
        registers_per_thread=w.geometry(config).registers_per_thread,
        static_smem_bytes=w.traits(config).static_smem_bytes,
    )
    assert estimated.resources_source == "estimate"
    assert compiled.resident_blocks_per_sm < estimated.resident_blocks_per_sm
    from kernelstream.kernels.backends.sim import estimate

    fast = estimate(spec, estimated, w.traits(config))
    slow = estimate(spec, compiled, w.traits(config))
    assert fast is not None and slow is not None
    assert slow.achieved_occupancy < fast.achieved_occupancy


def test_unknown_gpu_keeps_zero_occupancy() -> None:
    from kernelstream.kernels.devices import DeviceSpec

    w = get_workload("transpose")
    plan = make_plan(DeviceSpec.unknown("Some GPU"), w, w.default)
    assert plan.occupancy == 0.0 and plan.resources_source == "estimate"


def test_the_source_travels_from_the_sim_node_to_the_finding() -> None:
    from kernelstream.agents.logic.detection import Detector
    from kernelstream.agents.logic.windowing import Windower
    from kernelstream.kernels.runner import LaunchBatcher, WorkloadRunner
    from kernelstream.schemas import LaunchBatch
    from kernelstream.schemas.codec import decode

    dev = SimDevice("H100-SXM5-80GB")
    w = next(x for x in dev.workloads() if x.name == "transpose")
    runner = WorkloadRunner(dev, [w])
    batcher = LaunchBatcher(dev, "node-1")
    for chunk in runner.tick(0.0) + runner.tick(0.05):
        batcher.add(chunk, 0.05)
    (batch,) = batcher.flush()
    back = decode(batch.wire(binary=False), LaunchBatch)
    assert back.resources_source == "nvrtc 12.9 sm_90"
    windower = Windower()
    windower.add(back, 0.05)
    (window,) = windower.flush_all()
    assert window.resources_source == "nvrtc 12.9 sm_90"
    assert Detector().classify(window).evidence["occupancy_source"] == "nvrtc 12.9 sm_90"
