"""Model-guided search and the closed loop, on small spaces the tests make themselves."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kernelstream.agents.logic.closed_loop import ClosedLoop
from kernelstream.agents.logic.reconfiguration import ReconfigPolicy
from kernelstream.agents.logic.search import ModelGuidedSearch, space_features
from kernelstream.agents.logic.tuning import GroupStats, Measurement, Tuner
from kernelstream.kernels.backends.trace import TraceDevice, load_cache
from kernelstream.kernels.space import Config, Constraint, SearchSpace
from tests.toy_cache import write_kt_cache

# A rugged space: a smooth trend plus a needle that no neighbour points to.
SPACE = SearchSpace(
    "rugged",
    {
        "block_size_x": (16, 32, 64, 128, 256),
        "block_size_y": (1, 2, 4, 8),
        "tile_size_x": (1, 2, 4),
        "use_smem": (0, 1),
    },
    default={"block_size_x": 16, "block_size_y": 1, "tile_size_x": 1, "use_smem": 0},
    constraints=(
        Constraint(
            "threads <= 1024", lambda c: int(c["block_size_x"]) * int(c["block_size_y"]) <= 1024
        ),
    ),
)
NEEDLE = {"block_size_x": 64, "block_size_y": 4, "tile_size_x": 2, "use_smem": 1}


def cost(c: Mapping[str, Any]) -> float:
    threads = int(c["block_size_x"]) * int(c["block_size_y"])
    base = 100.0 * (1 + 0.25 * abs(math.log2(threads) - 8) + 0.1 * abs(int(c["tile_size_x"]) - 2))
    base *= 0.8 if c["use_smem"] else 1.0
    return base * (0.5 if c == NEEDLE else 1.0)


def search(strategy: ModelGuidedSearch, budget: int, noise: float = 0.01) -> list[str]:
    """Drive the strategy like the tuner does; return the config ids in measuring order."""
    rng = np.random.default_rng(1)
    group = GroupStats()
    current = SPACE.start_config()
    order: list[str] = []
    f = SimpleNamespace(classification="memory_bottleneck")
    for _ in range(budget):
        cid = SPACE.config_id(current)
        order.append(cid)
        mean = cost(current) * (1 + noise * rng.standard_normal())
        group.configs[cid] = Measurement(dict(current), count=100, sum_us=100 * mean, windows=1)
        p = strategy.propose(f, SPACE, group, current, lambda c: True)  # type: ignore[arg-type]
        if p is None:
            break
        assert SPACE.is_valid(p.config)
        current = p.config
    return order


def test_proposes_each_config_once_and_covers_the_space() -> None:
    order = search(ModelGuidedSearch(seed=0, n_trees=4), budget=500)
    assert len(order) == len(set(order)) == SPACE.size()


@pytest.mark.parametrize("model", ["trees", "pairwise"])
def test_finds_the_needle_far_sooner_than_exhaustive(model: str) -> None:
    # Not a speed test: a count of evaluations, over seeds, against the space size.
    needle = SPACE.config_id(NEEDLE)
    found = [
        search(ModelGuidedSearch(seed=s, n_trees=10, model=model), budget=SPACE.size()).index(
            needle
        )
        + 1
        for s in range(3)
    ]
    assert np.median(found) < SPACE.size() / 3, found


def test_the_pairwise_model_proposes_each_config_once() -> None:
    order = search(ModelGuidedSearch(seed=0, n_trees=4, model="pairwise"), budget=500)
    assert len(order) == len(set(order)) == SPACE.size()


def test_same_seed_same_proposals() -> None:
    assert search(ModelGuidedSearch(seed=7), 30) == search(ModelGuidedSearch(seed=7), 30)
    assert search(ModelGuidedSearch(seed=7), 30) != search(ModelGuidedSearch(seed=8), 30)


def test_respects_allowed_and_measured() -> None:
    s = ModelGuidedSearch(seed=0, n_init=1)
    group = GroupStats()
    for c in itertools.islice(SPACE, 10):
        group.configs[SPACE.config_id(c)] = Measurement(dict(c), 10, 10 * cost(c), 1)
    group.failed.add(SPACE.config_id(NEEDLE))
    only_smem = lambda c: c["use_smem"] == 1  # noqa: E731
    f = SimpleNamespace(classification="x")
    for _ in range(5):
        p = s.propose(f, SPACE, group, SPACE.start_config(), only_smem)  # type: ignore[arg-type]
        assert p is not None and p.config["use_smem"] == 1
        cid = SPACE.config_id(p.config)
        assert not group.measured(cid)
        group.configs[cid] = Measurement(dict(p.config), 10, 10 * cost(p.config), 1)
    nothing = s.propose(f, SPACE, group, SPACE.start_config(), lambda c: False)  # type: ignore[arg-type]
    assert nothing is None


def test_warm_start_tries_the_other_device_models_best_first() -> None:
    other = GroupStats()
    for c, us in ((NEEDLE, 10.0), (SPACE.start_config(), 50.0)):
        other.configs[SPACE.config_id(c)] = Measurement(dict(c), 10, 10 * us, 1)
    group = GroupStats()
    start = SPACE.start_config()
    group.configs[SPACE.config_id(start)] = Measurement(start, 10, 1000.0, 1)
    f = SimpleNamespace(classification="x")
    p = ModelGuidedSearch(warm_start=True).propose(f, SPACE, group, start, lambda c: True, [other])  # type: ignore[arg-type]
    assert p is not None and p.config == NEEDLE and "warm start" in p.reason
    # Off by default: other device models are ignored.
    q = ModelGuidedSearch().propose(f, SPACE, group, start, lambda c: True, [other])  # type: ignore[arg-type]
    assert q is not None and "warm start" not in q.reason


def _drive(strategy: ModelGuidedSearch, budget: int, related: list[GroupStats]) -> list[str]:
    """As ``search`` without noise, with other device models' groups passed on."""
    group, current, order = GroupStats(), SPACE.start_config(), []
    f = SimpleNamespace(classification="x")
    for _ in range(budget):
        cid = SPACE.config_id(current)
        order.append(cid)
        group.configs[cid] = Measurement(dict(current), 10, 10 * cost(current), 1)
        p = strategy.propose(f, SPACE, group, current, lambda c: True, related)  # type: ignore[arg-type]
        assert p is not None
        current = p.config
    return order


def test_warm_start_costs_at_most_its_head_start_against_cold() -> None:
    # The other device model's two fastest configs are tried first; then the search
    # runs as the cold one does, not steered by them: its proposals are the cold run's.
    cold = _drive(ModelGuidedSearch(seed=3, n_trees=8), 40, [])
    configs = {SPACE.config_id(c): dict(c) for c in SPACE}
    far = [cid for cid in configs if cid not in cold]
    other = GroupStats()
    for k, cid in enumerate(far[:2] + far[-30:]):
        other.configs[cid] = Measurement(configs[cid], 10, 10.0 * (k + 1), 1)
    warm = _drive(ModelGuidedSearch(seed=3, n_trees=8, warm_start=True), 42, [other])
    assert warm[1:3] == far[:2]
    assert [warm[0], *warm[3:]] == cold
    # The earlier design (the other model as a feature, its configs shaping the search)
    # does not keep to the cold run.
    prior = ModelGuidedSearch(seed=3, n_trees=8, warm_start=True, warm_mode="prior")
    assert [(p := _drive(prior, 42, [other]))[0], *p[3:]] != cold


def _measured(configs: list[Config], best: int = 0) -> GroupStats:
    """The configs measured in this order; the one at ``best`` 3x faster than the rest."""
    group = GroupStats()
    for k, c in enumerate(configs):
        us = cost(c) * (1.0 if k == best else 3.0)
        group.configs[SPACE.config_id(c)] = Measurement(dict(c), 10, 10 * us, 1)
    return group


def test_arms_are_the_switch_combinations() -> None:
    idx = ModelGuidedSearch().index(SPACE)
    arms = idx.arms(max_arms=8)
    assert arms is not None
    assert {
        a: {c["use_smem"] for c, b in zip(idx.configs, arms, strict=True) if b == a}
        for a in set(arms.tolist())
    } == {0: {0}, 1: {1}}
    assert idx.arms(max_arms=1) is None  # too few arms allowed: no arm step
    no_switch = SearchSpace("s", {"a": (1, 2, 3)}, default={"a": 1})
    assert ModelGuidedSearch().index(no_switch).arms(max_arms=8) is None


def test_a_space_without_switches_takes_its_few_valued_parameters_as_arms() -> None:
    # A point-in-polygon kernel selects its method with a three-valued parameter and has
    # no two-valued one: without this, it had no arms and a stalled search no restart.
    space = SearchSpace(
        "methods",
        {"method": (0, 1, 2), "block_size_x": tuple(range(32, 544, 32)), "tile": (1, 2, 4, 8, 16)},
        default={"method": 0, "block_size_x": 32, "tile": 1},
    )
    idx = ModelGuidedSearch().index(space)
    assert idx.arms(max_arms=32) is None  # switches only: none
    arms = idx.arms(max_arms=32, few_values=4)
    assert arms is not None
    by_arm = {
        a: {c["method"] for c, b in zip(idx.configs, arms, strict=True) if b == a}
        for a in set(arms.tolist())
    }
    assert sorted(by_arm.values(), key=min) == [{0}, {1}, {2}]
    # where the space has switches they are the arms, whatever else it has
    assert ModelGuidedSearch().index(SPACE).arms(max_arms=8, few_values=4) is not None
    assert ModelGuidedSearch(switchless_arms=True)._arms_of(idx) is not None
    # every parameter few-valued: no parameter would vary inside an arm, so no arms
    small = SearchSpace("small", {"a": (1, 2, 3), "b": (1, 2, 4, 8)}, default={"a": 1, "b": 1})
    assert ModelGuidedSearch().index(small).arms(max_arms=32, few_values=4) is None
    assert ModelGuidedSearch(switchless_arms=False)._arms_of(idx) is None


def test_a_stalled_search_draws_at_random_instead_of_polishing_its_plateau() -> None:
    off = [c for c in SPACE if c["use_smem"] == 0][:12]
    f = SimpleNamespace(classification="x")
    for stall_random, mode in ((True, "(random)"), (False, "(local)")):
        s = ModelGuidedSearch(
            seed=0, n_init=1, acquisitions=("local",), stall=5, stall_random=stall_random
        )
        p = s.propose(f, SPACE, _measured(off), off[0], lambda c: True)  # type: ignore[arg-type]
        assert p is not None and mode in p.reason
        # not stalled (the best was measured last): the local step either way
        group = _measured(off, best=len(off) - 1)
        p = s.propose(f, SPACE, group, off[-1], lambda c: True)  # type: ignore[arg-type]
        assert p is not None and "(local)" in p.reason


def test_a_long_stall_gives_the_sample_slot_to_random_search() -> None:
    # The exploration floor: once the best is ``floor_after`` evaluations old, the
    # Thompson sample (trees sure of a plateau) gives way to a uniform draw.
    configs = [c for c in SPACE if c["use_smem"] == 0][:12]
    f = SimpleNamespace(classification="x")
    s = ModelGuidedSearch(
        seed=0, n_init=1, acquisitions=("sample",), stall=0, floor_after=8, floor_plateau=0
    )
    stalled = _measured(configs[:9])  # the best is the first measured: 8 evaluations old
    p = s.propose(f, SPACE, stalled, configs[0], lambda c: True)  # type: ignore[arg-type]
    assert p is not None and "(random)" in p.reason
    # a shorter stall: the sample step
    short = _measured(configs[:9], best=1)
    p = s.propose(f, SPACE, short, configs[1], lambda c: True)  # type: ignore[arg-type]
    assert p is not None and "(sample)" in p.reason
    # off: the sample step however long the stall
    off = ModelGuidedSearch(seed=0, n_init=1, acquisitions=("sample",), stall=0, floor_after=0)
    p = off.propose(f, SPACE, stalled, configs[0], lambda c: True)  # type: ignore[arg-type]
    assert p is not None and "(sample)" in p.reason
    with pytest.raises(ValueError, match="floor_after"):
        ModelGuidedSearch(floor_after=-1)


def test_the_floor_waits_for_a_plateau_when_asked_to() -> None:
    # floor_plateau: the floor acts only where the local steps keep finding configs as
    # good as the best and none better (many within 2% of it), not on a lone best.
    configs = [c for c in SPACE if c["use_smem"] == 0][:12]
    f = SimpleNamespace(classification="x")
    s = ModelGuidedSearch(seed=0, n_init=1, acquisitions=("sample",), stall=0, floor_after=8)
    assert ModelGuidedSearch().floor_after > 0 and s.floor_plateau > 0  # on by default
    s.floor_plateau = 5
    lone = _measured(configs[:9])  # the best 3x faster than every other
    p = s.propose(f, SPACE, lone, configs[0], lambda c: True)  # type: ignore[arg-type]
    assert p is not None and "(sample)" in p.reason
    plateau = GroupStats()
    for k, c in enumerate(configs[:9]):
        us = 100.0 if k == 0 else (101.0 if k < 5 else 300.0)  # the best and 4 within 2%
        plateau.configs[SPACE.config_id(c)] = Measurement(dict(c), 10, 10 * us, 1)
    p = s.propose(f, SPACE, plateau, configs[0], lambda c: True)  # type: ignore[arg-type]
    assert p is not None and "(random)" in p.reason


def test_every_kth_step_is_random_with_an_exploration_floor() -> None:
    configs = list(SPACE)[:12]
    f = SimpleNamespace(classification="x")
    s = ModelGuidedSearch(seed=0, n_init=1, acquisitions=("local",), random_every=4, stall=0)
    reasons = []
    for n in range(8, 12):
        group = _measured(configs[:n], best=n - 1)
        p = s.propose(f, SPACE, group, configs[n - 1], lambda c: True)  # type: ignore[arg-type]
        assert p is not None
        reasons.append("(random)" in p.reason)
    assert reasons == [True, False, False, False]  # steps 8, 9, 10, 11


def test_a_stalled_search_tries_the_switch_combination_it_never_measured() -> None:
    # The best is the first of many measured configs, all with the switch off: the
    # search has stalled, so the stall acquisition becomes an arm step, and the arm
    # never measured (use_smem=1) comes first whatever the model thinks of it.
    off = [c for c in SPACE if c["use_smem"] == 0][:12]
    group = _measured(off)
    s = ModelGuidedSearch(seed=0, n_init=1, acquisitions=("plane",), stall=5)
    f = SimpleNamespace(classification="x")
    p = s.propose(f, SPACE, group, off[0], lambda c: True)  # type: ignore[arg-type]
    assert p is not None and p.config["use_smem"] == 1 and "(arm)" in p.reason
    # Not stalled (the best was measured last): the rotation's own acquisition.
    group = _measured(off, best=len(off) - 1)
    p = s.propose(f, SPACE, group, off[-1], lambda c: True)  # type: ignore[arg-type]
    assert p is not None and "(plane)" in p.reason


def test_concurrent_proposals_take_the_next_acquisitions_of_the_rotation() -> None:
    # Configs other nodes of the group are trying now shift the rotation: a batch of
    # proposals from one model mixes acquisitions instead of repeating one.
    group = _measured(list(itertools.islice(SPACE, 12)), best=11)
    s = ModelGuidedSearch(seed=0, n_init=1, acquisitions=("local", "sample", "confident"))
    f = SimpleNamespace(classification="x")
    step = len(group.configs)
    modes = []
    for _ in range(3):
        p = s.propose(f, SPACE, group, SPACE.start_config(), lambda c: True)  # type: ignore[arg-type]
        assert p is not None
        modes.append(p.reason.split("(")[1].split(")")[0])
        group.trying[SPACE.config_id(p.config)] = math.inf  # a node tries it now
    rotation = s.acquisitions
    assert modes == [rotation[(step + k) % 3] for k in range(3)], modes
    assert len(set(modes)) == 3


def test_concurrent_initial_proposals_alternate_and_spread_over_code_paths() -> None:
    # Only the default is measured (use_smem=0) and four nodes ask at once. The batch
    # takes the initial design's slots in turn (a one-parameter change of the best, then
    # a random config, ...), and a concurrent random one goes to a code path (switch
    # combination) nobody measured or is trying: here use_smem=1.
    start = SPACE.start_config()
    group = _measured([start])
    s = ModelGuidedSearch(seed=0)
    f = SimpleNamespace(classification="x")
    reasons, configs = [], []
    for _ in range(4):
        p = s.propose(f, SPACE, group, start, lambda c: True)  # type: ignore[arg-type]
        assert p is not None
        reasons.append(p.reason)
        configs.append(p.config)
        group.trying[SPACE.config_id(p.config)] = math.inf
    assert ["one parameter" in r for r in reasons] == [True, False, True, False], reasons
    assert "code path nobody measured" in reasons[1] and configs[1]["use_smem"] == 1
    # Both arms are touched by then: the fourth is an ordinary random configuration.
    assert reasons[3] == "initial design: random configuration"
    assert len({SPACE.config_id(c) for c in configs}) == 4
    # One node alone (nothing pending) keeps the plain random configuration.
    alone = _measured([start, configs[0]])
    p = s.propose(f, SPACE, alone, start, lambda c: True)  # type: ignore[arg-type]
    assert p is not None and p.reason == "initial design: random configuration"


def test_planes_are_the_few_valued_parameter_combinations() -> None:
    idx = ModelGuidedSearch().index(SPACE)
    planes = idx.planes(max_values=3)  # tile_size_x (3 values) x use_smem (2)
    assert planes is not None and len(planes) == 6
    assert sorted(int(i) for m in planes for i in m) == list(range(SPACE.size()))
    for m in planes:
        assert len({(idx.configs[i]["tile_size_x"], idx.configs[i]["use_smem"]) for i in m}) == 1
    assert len(idx.planes(max_values=4) or []) == 24  # block_size_y has 4 values
    assert idx.planes(max_values=2) is not None
    no_small = SearchSpace("s", {"a": tuple(range(8))}, default={"a": 0})
    assert ModelGuidedSearch().index(no_small).planes(max_values=4) is None


@pytest.mark.parametrize("max_values", [2, 3, 4, 5])
def test_plane_quantiles_are_numpys_bit_for_bit(max_values: int) -> None:
    # One vectorized pass in place of a np.quantile call per plane (100k planes on a
    # GEMM-like space): the plane step's ranking, and so every trajectory, is unchanged.
    idx = ModelGuidedSearch().index(SPACE)
    planes = idx.planes(max_values)
    assert planes is not None
    rng = np.random.default_rng(max_values)
    for q in (0.0, 0.1, 0.25, 0.5, 0.75, 1 / 3, 1.0):
        values = rng.normal(size=len(idx.ids))
        values[rng.integers(len(values), size=10)] = 0.5  # ties
        expected = np.array([np.quantile(values[m], q) for m in planes])
        assert np.array_equal(idx.plane_quantiles(max_values, values, q), expected)


def test_the_plane_step_picks_the_plane_most_of_whose_configs_look_fast() -> None:
    # One config of a poor plane is predicted fastest of all (a lone extreme the model
    # cannot back up); another plane is predicted fast almost everywhere. The plane
    # step goes to that plane, to its best config, not to the lone extreme.
    s = ModelGuidedSearch(plane_max_values=3)
    idx = s.index(SPACE)
    planes = idx.planes(3)
    assert planes is not None
    lcb = np.full(SPACE.size(), 5.0)
    lone = int(planes[0][0])
    lcb[lone] = -10.0
    broad = planes[4]
    lcb[broad] = 1.0
    lcb[broad[3]] = 0.5
    assert int(np.argmin(lcb)) == lone
    assert s._plane_step(idx, lcb, lambda order: int(order[0])) == int(broad[3])
    # Everything of that plane taken: the next plane by the same rule.
    taken = {int(i) for i in broad}
    first_outside = lambda order: next((int(j) for j in order if int(j) not in taken), None)  # noqa: E731
    assert s._plane_step(idx, lcb, first_outside) == lone
    # Through the rotation: the plane acquisition says so in the reason.
    group = _measured(list(itertools.islice(SPACE, 12)), best=11)
    p = ModelGuidedSearch(seed=0, n_init=1, acquisitions=("plane",)).propose(
        SimpleNamespace(classification="x"),  # type: ignore[arg-type]
        SPACE,
        group,
        SPACE.start_config(),
        lambda c: True,
    )
    assert p is not None and "(plane)" in p.reason
    assert not group.measured(SPACE.config_id(p.config))


def test_other_device_models_inform_the_model_as_a_feature() -> None:
    # The related group measured the whole space: its model ranks the needle first.
    other = _measured(list(SPACE))
    s = ModelGuidedSearch(seed=0, n_init=1)
    idx = s.index(SPACE)
    prior = s._prior(idx, [other], np.random.default_rng(0))
    assert prior is not None and prior.shape == (SPACE.size(),)
    assert int(np.argmin(prior)) == idx.position[SPACE.config_id(NEEDLE)]
    assert s._prior(idx, [], np.random.default_rng(0)) is None


def test_features_are_generic_and_finite() -> None:
    x = space_features(SPACE, list(SPACE))
    assert x.shape[0] == SPACE.size() and np.isfinite(x).all()
    # position + log2 per numeric parameter, plus threads per block and the x-axis extent
    assert x.shape[1] >= 2 * 3 + 1 + 2


def test_bad_settings() -> None:
    with pytest.raises(ValueError):
        ModelGuidedSearch(acquisitions=("greedy",))
    with pytest.raises(ValueError):
        ModelGuidedSearch(n_trees=1)
    with pytest.raises(ValueError):
        ModelGuidedSearch(plane_max_values=1)
    with pytest.raises(ValueError):
        ModelGuidedSearch(plane_quantile=1.5)
    with pytest.raises(ValueError):
        ModelGuidedSearch(model="gp")


# -- the closed loop on a trace cache the test writes ---------------------------------


def _trace_cache(path: Path) -> tuple[Path, dict[str, float]]:
    params = {
        "block_size_x": [16, 32, 64, 128, 256],
        "block_size_y": [1, 2, 4],
        "tile_size_x": [1, 2, 4],
    }
    cache: dict[str, Any] = {}
    truth: dict[str, float] = {}
    rng = np.random.default_rng(0)
    for values in itertools.product(*params.values()):
        rec: dict[str, Any] = dict(zip(params, values, strict=True))
        c = {
            "block_size_x": values[0],
            "block_size_y": values[1],
            "tile_size_x": values[2],
            "use_smem": 1,
        }
        if values == (256, 4, 4):
            rec["time"] = "RuntimeFailedConfig"
        else:
            ms = cost(c) / 100.0
            rec["time"] = ms
            rec["times"] = list(ms * (1 + 0.02 * rng.standard_normal(8)))
            truth[",".join(f"{k}={v}" for k, v in rec.items() if k in params)] = float(
                np.mean(rec["times"]) * 1000
            )
        cache[",".join(str(v) for v in values)] = rec
    write_kt_cache(path, params, cache, "toy_kernel", [4096, 4096])
    return path, truth


def test_closed_loop_converges_through_windows_and_rollbacks(tmp_path: Path) -> None:
    path, truth = _trace_cache(tmp_path / "toy.json.gz")
    opt = min(truth.values())
    ts = load_cache(path)
    tuner = Tuner(strategy=ModelGuidedSearch(seed=0))
    loop = ClosedLoop(
        [TraceDevice(path, seed=1)],
        ts.name,
        tuner,
        truth=truth,
        policy=ReconfigPolicy(max_step=8, min_eval_s=0.0),
    )
    trace = loop.run(400, stop=lambda tr: bool(tr.best_true) and tr.best_true[-1] <= opt)
    assert trace.best_true[-1] == opt
    n = trace.evaluations_to(opt)
    assert n is not None and n < ts.space.size()
    # slower trials were rolled back; the node ends on the best config it measured
    assert trace.outcomes.get("rolled_back", 0) > 0
    best = tuner.best(("A100-PCIE-40GB", "toy_kernel", (4096, 4096)))
    assert best is not None
    assert truth[ts.space.config_id(best[0])] == opt
    # evaluations are unique configs, in the order they were first measured
    ids = [cid for cid, _ in trace.evaluated]
    assert len(ids) == len(set(ids))


def test_a_node_evaluates_a_new_config_every_window(tmp_path: Path) -> None:
    # The node ticks like a real one (a short first tick per window): the window after
    # a change holds the new config's launches, so the tuner has the window and the
    # keep/rollback outcome before the next window and no window is spent idle.
    path, truth = _trace_cache(tmp_path / "toy.json.gz")
    loop = ClosedLoop(
        [TraceDevice(path, seed=1)],
        load_cache(path).name,
        Tuner(strategy=ModelGuidedSearch(seed=0)),
        truth=truth,
        policy=ReconfigPolicy(max_step=8, min_eval_s=0.0),
    )
    trace = loop.run(20)
    rounds = [r for _, r in trace.evaluated]
    # The start config's first window closes in round 2, whose window tries the first
    # proposal; every later window tries another one and is decided within its round.
    assert rounds == [2, *range(2, 21)], rounds
    assert sum(trace.outcomes.values()) == 19
    with pytest.raises(ValueError):
        ClosedLoop([TraceDevice(path)], load_cache(path).name, Tuner(), tick_s=0.5)


def test_four_nodes_sharing_need_fewer_windows(tmp_path: Path) -> None:
    path, truth = _trace_cache(tmp_path / "toy.json.gz")
    opt = min(truth.values())
    name = load_cache(path).name
    rounds = {}
    for nodes in (1, 4):
        got = []
        for seed in range(3):
            loop = ClosedLoop(
                [TraceDevice(path, seed=seed * 10 + i) for i in range(nodes)],
                name,
                Tuner(strategy=ModelGuidedSearch(seed=seed)),
                truth=truth,
                policy=ReconfigPolicy(max_step=8, min_eval_s=0.0),
            )
            tr = loop.run(400, stop=lambda tr: bool(tr.best_true) and tr.best_true[-1] <= opt)
            got.append(tr.rounds_to(opt))
        rounds[nodes] = float(np.median([r for r in got if r is not None]))
    assert rounds[4] < rounds[1], rounds


def test_model_steps_state_their_gain_over_the_current_config() -> None:
    """Past the initial design every proposal's expected gain is current / predicted - 1,
    as its reason says: negative for an exploration step (it was clamped to 0 before, so
    every model step read 'gain 0.0%'), positive where the model expects a gain."""
    rng = np.random.default_rng(3)
    strategy = ModelGuidedSearch(seed=0, n_trees=8)
    group = GroupStats()
    current = SPACE.start_config()
    gains = []
    f = SimpleNamespace(classification="memory_bottleneck")
    for _ in range(40):
        cid = SPACE.config_id(current)
        mean = cost(current) * (1 + 0.01 * rng.standard_normal())
        group.configs[cid] = Measurement(dict(current), count=100, sum_us=100 * mean, windows=1)
        p = strategy.propose(f, SPACE, group, current, lambda c: True)  # type: ignore[arg-type]
        assert p is not None
        if "predicts" in p.reason:
            predicted, now = (float(x) for x in re.findall(r"([\d.]+) us", p.reason)[:2])
            assert p.expected_gain == pytest.approx(now / predicted - 1.0, abs=2e-3)
            assert p.expected_gain > -1.0
            gains.append(p.expected_gain)
        current = p.config
    assert gains and min(gains) < 0 < max(gains), gains


def test_configs_past_the_measured_range_are_uncertain() -> None:
    # Trees extrapolate flat: past the largest tile size measured they are sure of the
    # largest one's time. ``beyond_range`` gives such configs the measurements' spread,
    # growing with the distance past the range, so the lower bound points there.
    s = ModelGuidedSearch(seed=0, beyond_range="local")
    idx = s.index(SPACE)
    measured = [(i, cost(c)) for i, c in enumerate(idx.configs) if c["tile_size_x"] == 1]
    spread = float(np.std([math.log(us) for _, us in measured]))
    sd = s._beyond_range_sd(idx, measured, [], np.zeros(len(idx.configs)))
    tiles = np.array([c["tile_size_x"] for c in idx.configs])
    assert np.all(sd[tiles == 1] == 0.0)  # inside the range: the trees' own spread
    assert np.allclose(sd[tiles == 2], spread * math.sqrt(0.5))
    assert np.allclose(sd[tiles == 4], spread)
    # judged per arm (code path): tile 4 measured on the other path does not count
    other = next(i for i, c in enumerate(idx.configs) if c["tile_size_x"] == 4)
    mine = next(
        i for i, _ in measured if idx.configs[i]["use_smem"] != idx.configs[other]["use_smem"]
    )
    sd_all = s._beyond_range_sd(idx, [*measured, (other, 100.0)], [], np.zeros(len(tiles)))
    sd_arm = s._beyond_range_sd(idx, [*measured, (other, 100.0)], [], np.zeros(len(tiles)), mine)
    path = np.array([c["use_smem"] for c in idx.configs]) == idx.configs[mine]["use_smem"]
    assert np.all(sd_all[tiles == 4] == 0.0) and np.all(sd_arm[(tiles == 4) & path] > 0.0)
    with pytest.raises(ValueError, match="beyond_range"):
        ModelGuidedSearch(beyond_range="sometimes")


def test_the_local_step_tries_a_value_past_the_measured_range() -> None:
    # Every measured config has the smallest tile; the trees predict the others alike,
    # so without the rule the local step polishes block sizes; with it, it tries a tile.
    f = SimpleNamespace(classification="x")
    configs = [c for c in SPACE if c["tile_size_x"] == 1 and c["use_smem"] == 1][:16]
    group = GroupStats()
    for c in configs:
        group.configs[SPACE.config_id(c)] = Measurement(dict(c), 10, 10 * cost(c), 1)
    best = min(configs, key=cost)
    tiles = {}
    for rule in ("off", "local", "arm"):
        # Unrounded means: rounded, the trees' ties among the unmeasured tiles fall
        # another way and "off" may pick a tile too, which is not what this compares.
        s = ModelGuidedSearch(
            seed=0, n_init=1, acquisitions=("local",), beyond_range=rule, resolution=0.0
        )
        p = s.propose(f, SPACE, group, best, lambda c: True)  # type: ignore[arg-type]
        assert p is not None and "(local)" in p.reason
        tiles[rule] = p.config["tile_size_x"]
    assert tiles == {"off": 1, "local": 4, "arm": 4}


def test_measurements_enter_the_search_at_its_resolution() -> None:
    s = ModelGuidedSearch(resolution=0.01)
    centre = 1.01**500
    assert s._resolved(centre * 1.004) == s._resolved(centre / 1.004) == pytest.approx(centre)
    assert s._resolved(centre * 1.006) == pytest.approx(centre * 1.01)
    assert ModelGuidedSearch(resolution=0.0)._resolved(centre * 1.004) == centre * 1.004

    def group(jitter: float) -> GroupStats:
        # the same configs, their means on the resolution's grid, moved by +-jitter
        g = GroupStats()
        for k, c in enumerate(itertools.islice(SPACE, 12)):
            us = 1.01 ** round(math.log(cost(c)) / math.log(1.01)) * (1 + jitter * (-1) ** k)
            g.configs[SPACE.config_id(c)] = Measurement(dict(c), 10, 10 * us, 1)
        return g

    f = SimpleNamespace(classification="x")
    for seed in range(6):
        a, b = (
            ModelGuidedSearch(seed=seed).propose(
                f,  # type: ignore[arg-type]
                SPACE,
                group(jitter),
                SPACE.start_config(),
                lambda c: True,
            )
            for jitter in (0.0, 0.003)
        )
        assert a is not None and b is not None and a.config == b.config


def test_a_group_counts_its_pending_configs_from_either_side() -> None:
    # GroupStats.pending counts over the smaller of "being tried" and "measured or
    # failed"; both ways must give the naive count, overlaps included.
    rng = np.random.default_rng(3)
    ids = [SPACE.config_id(c) for c in SPACE]
    for _ in range(300):
        g = GroupStats()
        for cid in rng.choice(ids, int(rng.integers(0, 40)), replace=False):
            g.configs[str(cid)] = Measurement({}, count=1, sum_us=1.0, windows=1)
        g.failed = {str(c) for c in rng.choice(ids, int(rng.integers(0, 10)), replace=False)}
        for cid in rng.choice(ids, int(rng.integers(0, 40)), replace=False):
            g.trying[str(cid)] = float(rng.random())
        assert g.pending() == sum(1 for cid in g.trying if not g.measured(cid))


def _untouched_reference(s: ModelGuidedSearch, group: GroupStats) -> np.ndarray:
    """The configs of the arms nobody measured, saw fail or is trying, by a mask over
    every config the group knows (no early end), in index order."""
    idx = s.index(SPACE)
    arms = idx.arms(s.max_arms, 2)
    assert arms is not None
    touched = [
        idx.position[c] for c in (*group.configs, *group.failed, *group.trying) if c in idx.position
    ]
    return np.flatnonzero(~np.isin(arms, arms[touched]))


def test_the_untouched_arms_are_those_nobody_measured_failed_or_is_trying() -> None:
    s = ModelGuidedSearch(seed=0)
    configs = list(SPACE)
    rng = np.random.default_rng(5)
    for n in range(12):
        for _ in range(20):
            g = GroupStats()
            for k, i in enumerate(rng.choice(len(configs), n, replace=False)):
                cid = SPACE.config_id(configs[int(i)])
                if k % 3 == 0:
                    g.configs[cid] = Measurement({})
                elif k % 3 == 1:
                    g.failed.add(cid)
                else:
                    g.trying[cid] = 1.0
            g.trying["not in the space"] = 1.0
            got = s._untouched_arms(s.index(SPACE), g, np.random.default_rng(0))
            want = _untouched_reference(s, g)
            assert np.array_equal(got, np.random.default_rng(0).permutation(want))


def test_a_strategy_given_ids_proposes_what_it_proposes_without_them() -> None:
    # KnownId hands the strategy's candidates' ids to the predicate: the same proposals
    # as the plain predicate, each id the config's own in the space.
    from kernelstream.agents.logic.tuning import KnownId

    checked = []

    def check(config: Config, config_id: str | None) -> bool:
        if config_id is not None:
            assert config_id == SPACE.config_id(config)
            checked.append(config_id)
        return int(config["block_size_y"]) != 2

    start = SPACE.start_config()
    for strategy in (ModelGuidedSearch(seed=1), ModelGuidedSearch(seed=2, n_init=3)):
        f = SimpleNamespace(classification="memory_bottleneck")
        plain, known = _measured([start]), _measured([start])
        for _ in range(12):
            a = strategy.propose(f, SPACE, plain, start, lambda c: check(c, None))  # type: ignore[arg-type]
            b = strategy.propose(f, SPACE, known, start, KnownId(check))  # type: ignore[arg-type]
            assert a == b
            if a is None:
                break
            for g in (plain, known):
                g.trying[SPACE.config_id(a.config)] = math.inf
    assert checked
