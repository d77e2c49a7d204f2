"""Per series (node, device, kernel): the default, the best kept and the current configuration.

One function, used by the demo's summary and by the replay report, so both say the
same thing about the same recording:

* **default**: the configuration of the series' first window;
* **best kept**: the fastest configuration the node held, that is the default or a
  configuration a ``kept`` outcome left in place, scored by its windows;
* **current**: the configuration of the series' last windows: what the node was
  running when the range ended, which may be a trial the node has not judged yet.

Every mean is count-weighted over all windows of that configuration in the series.
Plain Python over records: no Kafka, no Faust.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from kernelstream.schemas import ReconfigOutcome, WindowAggregate

__all__ = ["series_summary"]


def _means(windows: Iterable[WindowAggregate]) -> dict[str, tuple[float, int]]:
    """config id -> (count-weighted mean duration in us, launches)."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for w in windows:
        a = acc[w.config_id]
        a[0] += w.duration_mean_us * w.count
        a[1] += w.count
    return {cid: (s / n, int(n)) for cid, (s, n) in acc.items()}


def _current(windows: Sequence[WindowAggregate]) -> WindowAggregate:
    """The window of the configuration running at the end (ties: most launches)."""
    last_end = max(w.window_end for w in windows)
    return max(
        (w for w in windows if w.window_end == last_end), key=lambda w: (w.count, w.config_id)
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def series_summary(
    windows: Iterable[WindowAggregate], outcomes: Iterable[ReconfigOutcome] = ()
) -> list[dict[str, Any]]:
    """One row per (node, device index, device model, kernel), sorted by those.

    Windows with no launches are ignored. ``speedup`` is default over best kept (what
    tuning gained and held); ``current_speedup`` default over current.
    """
    by_series: dict[tuple[str, int, str, str], list[WindowAggregate]] = defaultdict(list)
    for w in windows:
        if w.count > 0:
            by_series[(w.node, w.device_index, w.device_model, w.kernel)].append(w)
    kept: dict[tuple[str, int, str], set[str]] = defaultdict(set)
    statuses: dict[tuple[str, int, str], dict[str, int]] = defaultdict(
        lambda: {"applied": 0, "kept": 0, "rolled_back": 0, "rejected": 0}
    )
    for o in outcomes:
        statuses[(o.node, o.device_index, o.kernel)][o.status] += 1
        if o.status == "kept":
            kept[(o.node, o.device_index, o.kernel)].add(o.after_config_id)
    rows = []
    for (node, index, model, kernel), ws in sorted(by_series.items()):
        ws.sort(key=lambda w: (w.window_start, w.config_id))
        means = _means(ws)
        configs = {w.config_id: w.config for w in ws}
        default, current = ws[0], _current(ws)
        held = ({default.config_id} | kept[(node, index, kernel)]) & means.keys()
        best_id = min(held, key=lambda c: (means[c][0], c))
        default_mean, best_mean = means[default.config_id][0], means[best_id][0]
        current_mean = means[current.config_id][0]
        rows.append(
            {
                "node": node,
                "device_index": index,
                "device_model": model,
                "kernel": kernel,
                "windows": len(ws),
                "configs_measured": len(means),
                "default_config_id": default.config_id,
                "default_config": dict(default.config),
                "default_mean_us": default_mean,
                "best_kept_config_id": best_id,
                "best_kept_config": dict(configs[best_id]),
                "best_kept_mean_us": best_mean,
                "current_config_id": current.config_id,
                "current_config": dict(current.config),
                "current_mean_us": current_mean,
                "current_is_kept": current.config_id in held,
                "speedup": _ratio(default_mean, best_mean),
                "current_speedup": _ratio(default_mean, current_mean),
                **statuses[(node, index, kernel)],
            }
        )
    return rows
