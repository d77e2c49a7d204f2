"""The local step of model-guided search stays on the code path of the group's best."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from kernelstream.agents.logic.search import ModelGuidedSearch
from kernelstream.agents.logic.tuning import GroupStats, Measurement
from kernelstream.kernels.space import Config, SearchSpace

SPACE = SearchSpace(
    "paths",
    {
        "block_size_x": (16, 32, 64, 128),
        "tile_size_x": (1, 2, 3, 4),
        "use_smem": (0, 1),
        "read_only": (0, 1),
    },
    default={"block_size_x": 16, "tile_size_x": 1, "use_smem": 0, "read_only": 0},
)


def _group(configs: list[Config], us: list[float]) -> GroupStats:
    g = GroupStats()
    for c, t in zip(configs, us, strict=True):
        g.configs[SPACE.config_id(c)] = Measurement(dict(c), 10, 10 * t, 1)
    return g


def _differs(a: Config, b: Config) -> list[str]:
    return [p for p in a if a[p] != b[p]]


def _best_on_a_slower_path() -> tuple[Config, GroupStats]:
    """The best is on the (smem, read-only) path; every other path measured faster on average."""
    best: Config = {"block_size_x": 64, "tile_size_x": 2, "use_smem": 1, "read_only": 1}
    others = [c for c in itertools.islice(SPACE, 0, None, 3) if c != best][:14]
    us = [60.0 if (c["use_smem"], c["read_only"]) == (1, 1) else 40.0 for c in others]
    return best, _group([best, *others], [10.0, *us])


def test_local_steps_keep_the_switches_of_the_best() -> None:
    # The best is on the (smem, read-only) path; every other path was measured as
    # slightly faster on average, so an unrestricted model would happily flip a switch
    # next to the best. The local step polishes the best's own path instead.
    best, group = _best_on_a_slower_path()
    f = SimpleNamespace(classification="x")
    s = ModelGuidedSearch(seed=0, n_init=1, acquisitions=("local",), stall=0)
    for _ in range(6):
        p = s.propose(f, SPACE, group, best, lambda c: True)  # type: ignore[arg-type]
        assert p is not None and "(local)" in p.reason
        assert (p.config["use_smem"], p.config["read_only"]) == (1, 1), p.config
        assert 1 <= len(_differs(best, p.config)) <= 2
        group.configs[SPACE.config_id(p.config)] = Measurement(dict(p.config), 10, 500.0, 1)


def test_without_local_arm_the_local_step_may_flip_a_switch() -> None:
    # The same group without the restriction: the model's favourite neighbour of the
    # best is on another path (the other paths measured faster on average).
    best, group = _best_on_a_slower_path()
    f = SimpleNamespace(classification="x")
    s = ModelGuidedSearch(seed=0, n_init=1, acquisitions=("local",), stall=0, local_arm=False)
    flipped = 0
    for _ in range(6):
        p = s.propose(f, SPACE, group, best, lambda c: True)  # type: ignore[arg-type]
        assert p is not None
        flipped += (p.config["use_smem"], p.config["read_only"]) != (1, 1)
        group.configs[SPACE.config_id(p.config)] = Measurement(dict(p.config), 10, 500.0, 1)
    assert flipped > 0


def test_local_score_is_validated() -> None:
    assert ModelGuidedSearch().local_arm and ModelGuidedSearch().local_score == "lcb"
    with pytest.raises(ValueError):
        ModelGuidedSearch(local_score="mean")
