"""Calibration of the sim model against sweep files with known errors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from kernelstream.kernels import get_workload, open_device
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.calibration import calibrate, calibrate_file, format_table, spearman
from kernelstream.kernels.errors import CalibrationError
from kernelstream.kernels.sweep import RUNTIME_FAILED, cache_document, cache_key, sweep, write_cache

_MODEL = "H100-SXM5-80GB"


def _doc(name: str, factor: Any, *, device: str = "NVIDIA H100") -> dict[str, Any]:
    """A cache whose measured times are the model's prediction x ``factor(rank)``."""
    w = get_workload(name, get_workload(name).SMALL_SIZE)
    sim = SimDevice(_MODEL)
    keys = list(w.space.params)
    predicted = [(c, sim.predict_us(w, c)) for c in w.space]
    preds = [(c, p) for c, p in predicted if p is not None]
    cache = {}
    for i, (c, p) in enumerate(sorted(preds, key=lambda cp: cp[1])):
        cache[cache_key(keys, c)] = {**c, "time": p * factor(i, len(preds)) / 1000.0}
    return {
        "device_name": device,
        "kernel_name": name,
        "problem_size": list(w.problem_size),
        "tune_params_keys": keys,
        "tune_params": {k: list(v) for k, v in w.space.params.items()},
        "objective": "time",
        "cache": cache,
    }


def test_exact_model_has_no_error() -> None:
    c = calibrate(_doc("transpose", lambda i, n: 1.0))
    assert c.model == _MODEL and c.compared > 50
    assert c.median_rel_error == pytest.approx(0.0, abs=1e-12)
    assert c.spearman == pytest.approx(1.0)
    assert c.model_best_true_rank == 1 and c.model_best_slowdown == pytest.approx(1.0)


def test_uniformly_slower_hardware() -> None:
    # measured = 1.25 x predicted: |p - m| / m = 0.25 / 1.25 = 0.2 everywhere.
    c = calibrate(_doc("stencil2d", lambda i, n: 1.25))
    assert c.median_rel_error == pytest.approx(0.2)
    assert c.p90_rel_error == pytest.approx(0.2)
    assert c.median_ratio == pytest.approx(0.8)
    assert c.spearman == pytest.approx(1.0) and c.model_best_true_rank == 1


def test_model_that_ranks_backwards() -> None:
    # the model's fastest is measured slowest (model ties keep it from exactly -1)
    def reverse(i: int, n: int) -> float:
        return 1e6 / (1.0 + i) ** 3

    c = calibrate(_doc("transpose", reverse))
    assert c.spearman < -0.95
    assert c.model_best_true_rank > 0.9 * c.compared
    assert c.model_best_slowdown > 1.0


def test_half_the_configs_off_by_a_factor_of_two() -> None:
    # every odd-ranked config measured 2x its prediction: rel. error 0.5 on half of them
    c = calibrate(_doc("transpose", lambda i, n: 2.0 if i % 2 else 1.0))
    assert c.p90_rel_error == pytest.approx(0.5)
    assert c.median_rel_error in (pytest.approx(0.0), pytest.approx(0.25), pytest.approx(0.5))


def test_failures_disagreeing_with_the_model_are_counted() -> None:
    doc = _doc("transpose", lambda i, n: 1.0)
    first = next(iter(doc["cache"].values()))
    first["time"] = RUNTIME_FAILED
    c = calibrate(doc)
    assert c.measured_failed_model_ran == 1


def test_a_sim_sweep_calibrates_to_its_noise(tmp_path: Path) -> None:
    w = get_workload("reduction", get_workload("reduction").SMALL_SIZE)
    result = sweep(open_device("sim", model=_MODEL, seed=5), w, iterations=16)
    path = write_cache(cache_document(result), tmp_path / "r.json.gz")
    c = calibrate_file(path)
    assert c.median_rel_error < 0.02  # 2% lognormal launch noise, mean of 16
    assert c.spearman > 0.9
    assert "reduction" in format_table([c])


def test_errors_name_what_is_missing(tmp_path: Path) -> None:
    doc = _doc("transpose", lambda i, n: 1.0, device="NVIDIA GeForce GTX 480")
    with pytest.raises(CalibrationError, match="no sim model"):
        calibrate(doc)
    assert calibrate(doc, model=_MODEL).model == _MODEL
    with pytest.raises(CalibrationError, match="not a built-in workload"):
        calibrate({**doc, "kernel_name": "convolution_kernel"}, model=_MODEL)
    with pytest.raises(CalibrationError, match="does not exist"):
        calibrate_file(tmp_path / "missing.json")
    with pytest.raises(CalibrationError, match="not a Kernel Tuner cache"):
        calibrate({"cache": {}})


def test_spearman_ties_and_degenerate_input() -> None:
    assert spearman([1, 1, 2], [1, 1, 2]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(spearman([1.0], [2.0]))
    assert math.isnan(spearman([1.0, 1.0], [1.0, 2.0]))
