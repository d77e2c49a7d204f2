"""The pairwise model behind ``ModelGuidedSearch(model="pairwise")``, on toy data."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kernelstream.agents.logic.search import ModelGuidedSearch, pairwise_mean, pairwise_posterior

# Every combination of four parameters with 6, 4, 3 and 2 values.
POSITIONS = np.array(list(itertools.product(range(6), range(4), range(3), range(2))))


def _pairwise_truth(rng: np.random.Generator) -> np.ndarray:
    """A random function with a term per parameter value and per pair of values."""
    sizes = POSITIONS.max(axis=0) + 1
    y = np.zeros(len(POSITIONS))
    for a in range(len(sizes)):
        y += rng.normal(0, 1, sizes[a])[POSITIONS[:, a]]
        for b in range(a + 1, len(sizes)):
            y += rng.normal(0, 0.5, (sizes[a], sizes[b]))[POSITIONS[:, a], POSITIONS[:, b]]
    return y


def test_recovers_a_pairwise_function_from_part_of_the_space() -> None:
    rng = np.random.default_rng(0)
    y = _pairwise_truth(rng)
    rows = rng.choice(len(y), len(y) // 2, replace=False)
    mu, sd, samples = pairwise_posterior(POSITIONS, np.zeros((len(y), 0)), rows, y[rows], 30, rng)
    unseen = np.setdiff1d(np.arange(len(y)), rows)
    assert np.corrcoef(mu[unseen], y[unseen])[0, 1] > 0.95
    # The model is sure where it measured and less sure where it did not.
    assert sd[rows].mean() < sd[unseen].mean()
    assert samples.shape == (30, len(y))
    # The fastest config the model predicts among the unmeasured is nearly the true best.
    pick = unseen[np.argmin(mu[unseen])]
    assert y[pick] - y[unseen].min() < 0.5


def test_samples_scatter_as_the_posterior_standard_deviation_says() -> None:
    rng = np.random.default_rng(1)
    y = _pairwise_truth(rng)
    rows = rng.choice(len(y), 20, replace=False)
    mu, sd, samples = pairwise_posterior(POSITIONS, np.zeros((len(y), 0)), rows, y[rows], 400, rng)
    ratio = samples.std(axis=0) / sd
    assert 0.85 < np.median(ratio) < 1.15
    assert abs(float(np.median(samples.mean(axis=0) - mu))) < 0.2 * float(np.median(sd))


def test_an_extra_column_is_used_where_it_explains_the_data() -> None:
    # Another device model's prediction that explains this device's durations.
    rng = np.random.default_rng(2)
    other = rng.normal(0, 1, len(POSITIONS))
    y = 2.0 * other + rng.normal(0, 0.05, len(POSITIONS))
    rows = rng.choice(len(y), 15, replace=False)
    unseen = np.setdiff1d(np.arange(len(y)), rows)
    with_it, _, _ = pairwise_posterior(POSITIONS, other[:, None], rows, y[rows], 2, rng)
    without, _, _ = pairwise_posterior(POSITIONS, np.zeros((len(y), 0)), rows, y[rows], 2, rng)
    err_with = np.abs(with_it[unseen] - y[unseen]).mean()
    err_without = np.abs(without[unseen] - y[unseen]).mean()
    assert err_with < 0.3 * err_without


def test_constant_parameters_and_failures_do_not_break_it() -> None:
    # A parameter with one value adds nothing; equal measurements give a flat model.
    rng = np.random.default_rng(3)
    positions = np.column_stack([POSITIONS, np.zeros(len(POSITIONS), dtype=int)])
    rows = np.arange(10)
    mu, sd, samples = pairwise_posterior(
        positions, np.zeros((len(positions), 0)), rows, np.full(10, 2.0), 3, rng
    )
    assert np.allclose(mu, 2.0) and np.isfinite(sd).all() and np.isfinite(samples).all()


def test_alignment_columns_group_block_widths_by_the_power_of_two_dividing_them() -> None:
    from kernelstream.agents.logic.search import ModelGuidedSearch
    from kernelstream.kernels.space import SearchSpace

    space = SearchSpace(
        "align",
        {"block_size_x": (16, 32, 48, 64), "tile_size_x": (1, 2, 4), "flag": (0, 1)},
        default={"block_size_x": 16, "tile_size_x": 1, "flag": 0},
    )
    idx = ModelGuidedSearch().index(space)
    cols = idx.alignments()
    # Only block_size_x: tile_size_x is all powers of two, flag has a zero.
    assert cols.shape == (space.size(), 1)
    width = {16: 0, 32: 1, 48: 0, 64: 2}
    assert [int(a) for a in cols[:, 0]] == [width[int(c["block_size_x"])] for c in idx.configs]
    assert idx.alignments() is cols  # computed once per space


def test_the_mean_alone_is_the_posteriors_mean_where_asked() -> None:
    # The arm step ranks a few candidates by ``pairwise_mean``: the posterior's mean,
    # computed only at the configs asked about.
    rng = np.random.default_rng(2)
    y = _pairwise_truth(rng)
    rows = rng.choice(len(y), 40, replace=False)
    mu, _, _ = pairwise_posterior(POSITIONS, np.zeros((len(y), 0)), rows, y[rows], 2, rng)
    mean = pairwise_mean(POSITIONS, rows, y[rows])
    np.testing.assert_allclose(mean(np.arange(len(y))), mu)
    some = np.array([5, 3, 100, 7])
    np.testing.assert_allclose(mean(some), mu[some])


def test_configs_alike_to_every_measured_one_tie_exactly() -> None:
    # Only configs whose third parameter is 0 are measured: two configs that differ only
    # in it (1 or 2) agree alike with every measured one, so their means tie, exactly,
    # wherever they are asked about, and a stable sort ranks them by config order.
    rng = np.random.default_rng(3)
    y = _pairwise_truth(rng)
    rows = np.flatnonzero(POSITIONS[:, 2] == 0)[::3]
    mean = pairwise_mean(POSITIONS, rows, y[rows])
    every = mean(np.arange(len(y)))
    a = int(np.flatnonzero((POSITIONS == [1, 2, 1, 0]).all(axis=1))[0])
    b = int(np.flatnonzero((POSITIONS == [1, 2, 2, 0]).all(axis=1))[0])
    assert every[a] == every[b]
    assert mean(np.array([b, a]))[1] == every[a] == mean(np.array([a]))[0]


def test_the_arm_model_is_checked() -> None:
    assert ModelGuidedSearch().arm_model == "pairwise"
    ModelGuidedSearch(arm_model="same")
    with pytest.raises(ValueError, match="arm_model"):
        ModelGuidedSearch(arm_model="forest")
