"""``bench.tuning_variants``: paired per-seed comparison of tuner variants."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from kernelstream.bench.tuning_variants import compare, format_comparison, main, run
from tests.toy_cache import write_toy_cache


def _doc(evals: dict[int, int | None], windows: int = 400, space: str = "s") -> dict[str, Any]:
    return {
        "space": space,
        "nodes": 1,
        "kwargs": {},
        "windows": windows,
        "commit": None,
        "seeds": [{"seed": s, "evals": e, "windows": e} for s, e in evals.items()],
    }


def test_compare_pairs_seeds_and_counts_a_miss_as_the_budget_plus_one() -> None:
    base = _doc({1: 100, 2: 50, 3: None, 4: 10})
    variant = _doc({1: 50, 2: 50, 3: 200, 5: 7})  # seed 4 and 5 are not in both
    c = compare(base, variant)
    assert c["seeds"] == 3
    logs = [math.log(50 / 100), 0.0, math.log(200 / 401)]
    assert c["mean_log_ratio"] == pytest.approx(sum(logs) / 3)
    mean = sum(logs) / 3
    se = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2) / math.sqrt(3)
    assert c["se"] == pytest.approx(se)
    assert c["base"] == {"median": 100, "within_200": 2, "within_60": 1}
    assert c["variant"] == {"median": 50, "within_200": 3, "within_60": 2}
    assert "3 seeds" in format_comparison(c)


def test_compare_refuses_runs_of_different_spaces() -> None:
    with pytest.raises(ValueError, match="same space"):
        compare(_doc({1: 1, 2: 2}), _doc({1: 1, 2: 2}, space="other"))
    with pytest.raises(ValueError, match="metric"):
        compare(_doc({1: 1, 2: 2}), _doc({1: 1, 2: 2}), metric="time")


def test_run_is_reproducible_and_scores_with_the_files_means(tmp_path: Path) -> None:
    path = str(tmp_path / "toy.json.gz")
    write_toy_cache(tmp_path / "toy.json.gz")
    first = run(path, range(3), kwargs={"n_init": 4}, windows=60)
    again = run(path, range(3), kwargs={"n_init": 4}, windows=60, jobs=2)
    assert first["seeds"] == again["seeds"]
    assert first["kwargs"] == {"n_init": 4}
    # 11 valid configs: every seed gets within 5% of the optimum in at most all of them
    assert all(r["evals"] is not None and 1 <= r["evals"] <= 12 for r in first["seeds"])
    assert all(r["windows"] is not None and r["windows"] >= r["evals"] for r in first["seeds"])
    same = compare(first, again)
    assert same["mean_log_ratio"] == 0.0 and same["se"] == 0.0


def test_command_line_runs_and_compares(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_toy_cache(tmp_path / "toy.json.gz")
    space, out = str(tmp_path / "toy.json.gz"), tmp_path / "a.json"
    assert main(["run", "--space", space, "--seeds", "0-2", "--jobs", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["space"] == space
    assert main(["compare", str(out), str(out)]) == 0
    assert "mean log ratio +0.000" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", "--space", space, "--kwargs", "[1]", "--out", str(out)])
    assert main(["compare", str(out), str(tmp_path / "missing.json")]) == 2
    assert "error:" in capsys.readouterr().err
