"""``bench.model_fit``: how each model ranks a space's fast configs from random samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelstream.bench.model_fit import MODELS, main, score
from kernelstream.kernels.backends.trace import load_cache
from tests.toy_cache import write_toy_cache


@pytest.mark.parametrize("model", MODELS)
def test_scores_a_model_on_the_configs_it_was_not_given(tmp_path: Path, model: str) -> None:
    path = tmp_path / "toy.json.gz"
    truth = write_toy_cache(path)
    got = score(load_cache(path), model, n=6, seed=0)
    unseen = len(truth) - 6
    assert 0 <= got["rank"] < unseen
    assert -1.0 <= got["corr"] <= 1.0
    # Every unseen config is among the 20 best-ranked here: top20 is the fastest of them.
    assert 1.0 <= got["top20"] <= max(truth.values()) / min(truth.values())


def test_prints_one_row_per_space_size_and_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_toy_cache(tmp_path / "toy.json.gz")
    main(["--spaces", str(tmp_path), "--samples", "4,6", "--seeds", "2"])
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 1 + 2 * len(MODELS)
    assert all(r.startswith("toy") for r in rows[1:])
