"""How close the ``sim`` model is to a real GPU: a sweep file against the model.

For one Kernel Tuner cache file of a built-in workload (``kernelstream sweep``
on a GPU) :func:`calibrate` predicts every measured configuration with the
``sim`` model of the same GPU (by ``device_name``, or ``model``) and reports:

* the median and 90th percentile of the relative error of the predicted
  duration, ``|predicted - measured| / measured``, and the median ratio
  ``predicted / measured`` (below 1: the model is optimistic);
* the Spearman rank correlation of predicted and measured durations (does the
  model order configurations correctly);
* the true rank of the model's best configuration (1: the model's favourite
  really is the fastest) and how much slower than the true best it is;
* configurations on which model and measurement disagree about running at all.

>>> spearman([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0])
1.0
>>> spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0])
-1.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.backends.trace import is_measured_time, read_cache_document
from kernelstream.kernels.devices import device_spec_for_name, get_device_spec
from kernelstream.kernels.errors import CalibrationError, UnknownDeviceError, UnknownWorkloadError
from kernelstream.kernels.workloads import get_workload

__all__ = ["Calibration", "calibrate", "calibrate_file", "format_table", "spearman"]


@dataclass(frozen=True)
class Calibration:
    """The ``sim`` model of one GPU against one sweep of one workload."""

    workload: str
    problem_size: list[int]
    device_name: str
    model: str
    compared: int
    median_rel_error: float
    p90_rel_error: float
    median_ratio: float
    spearman: float
    model_best: str
    model_best_true_rank: int
    model_best_slowdown: float
    true_best: str
    true_best_ms: float
    measured_failed_model_ran: int
    measured_ran_model_failed: int
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation (scipy's, ties at their average rank); NaN when undefined."""
    from scipy.stats import spearmanr

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(spearmanr(x, y).statistic)


def _model_name(device_name: str, model: str | None) -> str:
    try:
        return get_device_spec(model).name if model else device_spec_for_name(device_name).name
    except UnknownDeviceError as ex:
        raise CalibrationError(
            f"no sim model for device {device_name!r}: {ex}; pass a model name explicitly"
        ) from ex


def calibrate(doc: Mapping[str, Any], *, model: str | None = None, source: str = "") -> Calibration:
    """Compare a sweep document (Kernel Tuner cache of a built-in workload) with the model."""
    where = source or "sweep document"
    try:
        name = str(doc["kernel_name"])
        size = tuple(int(s) for s in doc["problem_size"])
        device_name = str(doc["device_name"])
        keys = list(doc["tune_params_keys"])
        cache: Mapping[str, Mapping[str, Any]] = doc["cache"]
    except (KeyError, TypeError, ValueError) as ex:
        raise CalibrationError(f"{where}: not a Kernel Tuner cache ({ex!r})") from ex
    try:
        workload = get_workload(name, size)
    except (UnknownWorkloadError, ValueError) as ex:
        raise CalibrationError(
            f"{where}: kernel {name!r} is not a built-in workload; only sweeps of "
            f"built-in workloads can be compared with the sim model ({ex})"
        ) from ex
    if list(workload.space.params) != keys:
        raise CalibrationError(f"{where}: parameters {keys} are not those of {name!r}")
    model_name = _model_name(device_name, model)
    sim = SimDevice(model_name)
    ids: list[str] = []
    predicted: list[float] = []
    measured: list[float] = []
    measured_failed_model_ran = measured_ran_model_failed = 0
    for rec in cache.values():
        config = {k: rec[k] for k in keys}
        t = rec.get("time")
        ran = is_measured_time(t)
        pred = sim.predict_us(workload, config)
        if ran and pred is None:
            measured_ran_model_failed += 1
        elif not ran and pred is not None:
            measured_failed_model_ran += 1
        if ran and pred is not None and float(t) > 0:  # type: ignore[arg-type]
            ids.append(workload.space.config_id(config))
            predicted.append(pred)
            measured.append(float(t) * 1000.0)  # type: ignore[arg-type]
    if not ids:
        raise CalibrationError(f"{where}: no configuration both measured and modelled")
    p, m = np.asarray(predicted), np.asarray(measured)
    rel = np.abs(p - m) / m
    best_model = int(np.argmin(p))
    best_true = int(np.argmin(m))
    return Calibration(
        workload=name,
        problem_size=list(size),
        device_name=device_name,
        model=model_name,
        compared=len(ids),
        median_rel_error=float(np.median(rel)),
        p90_rel_error=float(np.percentile(rel, 90)),
        median_ratio=float(np.median(p / m)),
        spearman=spearman(p, m),
        model_best=ids[best_model],
        model_best_true_rank=1 + int((m < m[best_model]).sum()),
        model_best_slowdown=float(m[best_model] / m[best_true]),
        true_best=ids[best_true],
        true_best_ms=float(m[best_true] / 1000.0),
        measured_failed_model_ran=measured_failed_model_ran,
        measured_ran_model_failed=measured_ran_model_failed,
        source=source,
    )


def calibrate_file(path: str | Path, *, model: str | None = None) -> Calibration:
    """:func:`calibrate` on a cache file (``.json`` or ``.json.gz``)."""
    p = Path(path)
    if not p.is_file():
        raise CalibrationError(f"sweep file {p} does not exist")
    return calibrate(read_cache_document(p), model=model, source=str(p))


def format_table(results: Sequence[Calibration]) -> str:
    """A plain-text table, one row per sweep."""
    head = (
        f"{'workload':10} {'device':22} {'model':16} {'n':>5} {'med err':>8} {'p90 err':>8} "
        f"{'pred/meas':>9} {'spearman':>8} {'best rank':>9} {'slowdown':>8}"
    )
    rows = [head, "-" * len(head)]
    for c in results:
        rows.append(
            f"{c.workload:10} {c.device_name[:22]:22} {c.model[:16]:16} {c.compared:5d} "
            f"{c.median_rel_error:8.1%} {c.p90_rel_error:8.1%} {c.median_ratio:9.2f} "
            f"{c.spearman:8.3f} {c.model_best_true_rank:9d} {c.model_best_slowdown:7.2f}x"
        )
    return "\n".join(rows)
