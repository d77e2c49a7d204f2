"""What-if: how other configurations would have done, from a trace file or the fleet's sweep.

Two sources score configurations the fleet did not settle on:

* a Kernel Tuner cache file (:func:`kernels.backends.trace.load_cache`) of the same
  kernel and problem size holds the measured mean of every configuration of its
  space; the configurations the fleet ran are looked up in it and the file's best
  ones are shown with the gain they would have brought over the configuration the
  fleet ran most at the end of the range;
* the fleet's own windows are a sweep: every configuration any node of a device model
  ran is scored by its count-weighted mean duration, and each node's final
  configuration is compared with the best one measured on that device model.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kernelstream.schemas import WindowAggregate

__all__ = ["fleet_sweep", "trace_files_in", "trace_what_if"]

log = logging.getLogger("kernelstream.report")

_TOP = 5


def trace_files_in(directory: Path | None) -> list[Path]:
    """Kernel Tuner cache files of a tuning-spaces directory (T1 descriptions excluded)."""
    from kernelstream.kernels.backends.trace import cache_files_in

    return cache_files_in(directory)


def _config_means(
    windows: Iterable[WindowAggregate],
) -> dict[str, tuple[float, int, dict[str, Any]]]:
    """config id -> (count-weighted mean us, launches, config)."""
    acc: dict[str, list[Any]] = {}
    for w in windows:
        if w.count == 0:
            continue
        a = acc.setdefault(w.config_id, [0.0, 0, dict(w.config)])
        a[0] += w.duration_mean_us * w.count
        a[1] += w.count
    return {cid: (s / n, n, cfg) for cid, (s, n, cfg) in acc.items()}


def _final_config(windows: Sequence[WindowAggregate]) -> str:
    """The configuration of the series' last windows (ties: most launches)."""
    last_end = max(w.window_end for w in windows)
    last = [w for w in windows if w.window_end == last_end]
    return max(last, key=lambda w: (w.count, w.config_id)).config_id


def trace_what_if(
    windows: Sequence[WindowAggregate], trace_paths: Sequence[Path]
) -> list[dict[str, Any]]:
    """One entry per (device model, workload, problem size) that a trace file covers."""
    from kernelstream.kernels.backends.trace import cache_kernel_name, load_cache
    from kernelstream.kernels.devices import device_spec_for_name
    from kernelstream.kernels.errors import KernelsError

    groups: dict[tuple[str, str, tuple[int, ...]], list[WindowAggregate]] = defaultdict(list)
    for w in windows:
        groups[(w.device_model, w.workload, tuple(w.problem_size))].append(w)
    workloads = {workload for _, workload, _ in groups}
    traces = []
    for path in trace_paths:
        named = cache_kernel_name(path)
        if named is not None and named not in workloads:
            continue  # a kernel the range did not run: not loaded
        try:
            t = load_cache(path)
        except KernelsError as ex:
            log.warning("what-if: skipping %s: %s", path, ex)
            continue
        try:
            model = device_spec_for_name(t.device_name).name
        except KernelsError:
            model = t.device_name
        traces.append((t, model))
    out = []
    for (model, workload, size), ws in sorted(groups.items()):
        cands = [(t, m) for t, m in traces if t.name == workload and t.problem_size == size]
        if not cands:
            continue
        trace, trace_model = next(((t, m) for t, m in cands if m == model), cands[0])
        means = {cid: float(v.mean()) for cid, v in trace.times_us.items()}
        ran = _config_means(ws)
        by_series: dict[str, list[WindowAggregate]] = defaultdict(list)
        for w in ws:
            by_series[w.stream_key].append(w)
        finals = sorted({_final_config(s) for s in by_series.values()})
        best = sorted(means.items(), key=lambda kv: (kv[1], kv[0]))[:_TOP]
        ref_id = max(finals, key=lambda c: (ran.get(c, (0, 0, {}))[1], c))
        ref = means.get(ref_id)
        out.append(
            {
                "device_model": model,
                "workload": workload,
                "problem_size": list(size),
                "trace_file": Path(trace.path).name,
                "trace_device_model": trace_model,
                "same_device_model": trace_model == model,
                "configs_in_file": len(means) + len(trace.failed),
                "reference_config_id": ref_id,
                "reference_trace_mean_us": ref,
                "ran": [
                    {
                        "config_id": cid,
                        "launches": n,
                        "measured_mean_us": mean,
                        "trace_mean_us": means.get(cid),
                        "trace_failed": cid in trace.failed,
                    }
                    for cid, (mean, n, _) in sorted(ran.items())
                ],
                "best_alternatives": [
                    {
                        "config_id": cid,
                        "trace_mean_us": m,
                        "expected_gain": (ref / m - 1.0) if ref and m > 0 else None,
                        "ran_by_fleet": cid in ran,
                    }
                    for cid, m in best
                ],
            }
        )
    return out


def fleet_sweep(windows: Sequence[WindowAggregate]) -> list[dict[str, Any]]:
    """Per device model and workload: each series' final config against the fleet's best."""
    groups: dict[tuple[str, str, tuple[int, ...]], list[WindowAggregate]] = defaultdict(list)
    for w in windows:
        groups[(w.device_model, w.workload, tuple(w.problem_size))].append(w)
    out = []
    for (model, workload, size), ws in sorted(groups.items()):
        ran = _config_means(ws)
        if not ran:
            continue
        best_id, (best_mean, best_n, _) = min(ran.items(), key=lambda kv: (kv[1][0], kv[0]))
        by_series: dict[str, list[WindowAggregate]] = defaultdict(list)
        for w in ws:
            by_series[w.stream_key].append(w)
        series = []
        for key, sws in sorted(by_series.items()):
            final = _final_config(sws)
            mean = ran.get(final, (math.nan, 0, {}))[0]
            series.append(
                {
                    "series": key,
                    "final_config_id": final,
                    "final_mean_us": mean,
                    "gain_if_best": (mean / best_mean - 1.0) if best_mean > 0 else None,
                }
            )
        out.append(
            {
                "device_model": model,
                "workload": workload,
                "problem_size": list(size),
                "configs_measured": len(ran),
                "best_config_id": best_id,
                "best_mean_us": best_mean,
                "best_launches": best_n,
                "series": series,
            }
        )
    return out
