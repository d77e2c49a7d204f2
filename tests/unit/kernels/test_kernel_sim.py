"""Simulated device: determinism, roofline bounds, model shape, hill-climbing reachability."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from kernelstream.kernels import SIM_MODELS, WORKLOAD_NAMES, get_workload, open_device
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.space import ParamValue, SpaceError
from kernelstream.kernels.workloads.base import Workload


def test_deterministic_per_seed_and_vectorised() -> None:
    w = get_workload("matmul")
    a = open_device("sim", model="L4", seed=7).launch(w, w.default, 1000)
    b = open_device("sim", model="L4", seed=7).launch(w, w.default, 1000)
    c = open_device("sim", model="L4", seed=8).launch(w, w.default, 1000)
    assert a.duration_us.dtype == np.float64 and a.duration_us.shape == (1000,)
    np.testing.assert_array_equal(a.duration_us, b.duration_us)
    assert not np.array_equal(a.duration_us, c.duration_us)
    rel = a.duration_us.std() / a.duration_us.mean()
    assert 0.005 < rel < 0.05  # ~2% noise


def test_invalid_configs_fail_to_launch() -> None:
    dev = open_device("sim")
    w = get_workload("transpose")
    bad = {**w.default, "pad": 1}  # violates "pad only with use_shared"
    r = dev.launch(w, bad, 5)
    assert not r.ok.any() and (r.duration_us == 0).all()
    with pytest.raises(SpaceError):
        dev.plan(w, {**w.default, "tile_dim": 12})


@pytest.mark.parametrize("model", SIM_MODELS)
@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_roofline_bounded(model: str, name: str) -> None:
    dev = open_device("sim", model=model, seed=1)
    w = get_workload(name)
    configs = [*list(w.space)[::7], w.default]
    for config in configs:
        plan = dev.plan(w, config)
        r = dev.launch(w, config, 50)
        assert r.ok.all()
        t = r.duration_us.min() * 1e-6
        assert plan.bytes_moved / t <= dev.spec.peak_gbs * 1e9
        assert plan.flops / t <= dev.spec.peak_gflops_fp32 * 1e9
        assert 0 < plan.occupancy <= 1 and plan.waves > 0


def test_naive_transpose_much_slower_than_shared() -> None:
    dev = SimDevice("A100-SXM4-80GB")
    w = get_workload("transpose")
    naive = dev.predict_us(w, w.default)
    tiled = dev.predict_us(w, {**w.default, "use_shared": 1, "pad": 1})
    assert naive is not None and tiled is not None and naive > 2 * tiled


def test_small_grid_is_under_utilised() -> None:
    dev = SimDevice("H100-SXM5-80GB")
    w = get_workload("reduction")
    poor = dev.predict_us(w, w.default)
    wide = dev.predict_us(w, {**w.default, "num_blocks": 1024})
    assert poor is not None and wide is not None and poor > 3 * wide


def test_sample_is_modelled() -> None:
    dev = open_device("sim", model="RTX-A4000")
    idle = dev.sample()
    assert idle is not None and idle["sm_util_pct"] == 0
    w = get_workload("matmul")
    dev.launch(w, w.default, 3)
    s = dev.sample()
    assert s is not None and 0 < s["sm_util_pct"] <= 100
    assert dev.spec.idle_w < s["power_w"] <= dev.spec.tdp_w


def _climb(dev: SimDevice, w: Workload, steps: int) -> tuple[float, Mapping[str, ParamValue]]:
    """Greedy hill climbing over single-parameter neighbours (noise-free model)."""
    cur = w.space.start_config()
    t = dev.predict_us(w, cur)
    assert t is not None
    for _ in range(steps):
        best: tuple[float, dict[str, ParamValue]] | None = None
        for nb in w.space.neighbors(cur):
            tn = dev.predict_us(w, nb)
            if tn is not None and tn < t and (best is None or tn < best[0]):
                best = (tn, nb)
        if best is None:
            break
        t, cur = best
    return t, cur


@pytest.mark.parametrize("model", SIM_MODELS)
@pytest.mark.parametrize("name", ["matmul", "transpose"])
def test_optimum_reachable_by_hill_climbing(model: str, name: str) -> None:
    dev = SimDevice(model)
    w = get_workload(name)
    t_default = dev.predict_us(w, w.default)
    times = [t for c in w.space if (t := dev.predict_us(w, c)) is not None]
    assert t_default is not None
    assert t_default / min(times) >= 2.0
    t_climb, _ = _climb(dev, w, steps=25)
    assert t_default / t_climb >= 1.8


def test_problem_scale() -> None:
    dev = open_device("sim", problem_scale=0.25)
    sizes = {w.name: w.problem_size for w in dev.workloads()}
    assert sizes["transpose"] == (4096, 4096)
    assert set(sizes) == set(WORKLOAD_NAMES)
