"""PNG plots of a replay report (matplotlib, Agg backend: no display needed).

Every plot is drawn from the report summary alone, so what the page shows is what
``summary.json`` says.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["render_plots"]

_DPI = 110
_OUTCOME_STYLE = {
    "applied": ("o", "#1f77b4"),
    "kept": ("o", "#2ca02c"),
    "rolled_back": ("X", "#d62728"),
    "rejected": ("x", "#7f7f7f"),
}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "x"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def render_plots(summary: dict[str, Any], out: Path) -> dict[str, list[tuple[str, Path]]]:
    """Draw every plot into ``out``; return section -> [(title, path)]."""
    plt = _plt()
    plots: dict[str, list[tuple[str, Path]]] = defaultdict(list)
    if summary["gpu_time"]["by_series"]:
        plots["gpu_share"].append(("GPU time share", _gpu_share(plt, summary, out)))
    for model in summary["roofline"]:
        title = f"Roofline {model['device_model']}"
        plots["roofline"].append((title, _roofline(plt, model, out)))
    by_kernel: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in summary["timeline"]:
        by_kernel[s["kernel"]].append(s)
    t0 = min((w["t"] for s in summary["timeline"] for w in s["windows"]), default=0.0)
    for kernel, series in sorted(by_kernel.items()):
        plots["timeline"].append((f"Timeline {kernel}", _timeline(plt, kernel, series, t0, out)))
    return dict(plots)


def _gpu_share(plt: Any, summary: dict[str, Any], out: Path) -> Path:
    rows = summary["gpu_time"]["by_series"]
    total = summary["gpu_time"]["total_s"] or 1.0
    kernels = [k["kernel"] for k in summary["gpu_time"]["by_kernel"]][::-1]  # largest on top
    models = [m["device_model"] for m in summary["gpu_time"]["by_device_model"]]
    share: dict[tuple[str, str], float] = defaultdict(float)
    for r in rows:
        share[(r["kernel"], r["device_model"])] += r["gpu_time_s"] / total
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * len(kernels)))
    left = [0.0] * len(kernels)
    cmap = plt.get_cmap("tab10")
    for i, model in enumerate(models):
        vals = [share[(k, model)] * 100 for k in kernels]
        ax.barh(kernels, vals, left=left, color=cmap(i % 10), label=model, height=0.6)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    for y, v in enumerate(left):
        ax.text(v + 0.5, y, f"{v:.1f}%", va="center", fontsize=9)
    ax.set_xlim(0, max(left) * 1.15 + 1)
    ax.set_xlabel("share of GPU time in the range (%)")
    ax.set_title("GPU time by kernel and device model")
    ax.legend(loc="lower right", fontsize=8, title="device model", title_fontsize=8)
    ax.grid(axis="y", visible=False)
    return _save(fig, out / "gpu_share.png")


def _roofline(plt: Any, model: dict[str, Any], out: Path) -> Path:
    import numpy as np
    from matplotlib.lines import Line2D

    pts = model["points"]
    peak_bw, peak_fl = model["peak_gbs"], model["peak_gflops"]
    ais = [p["arithmetic_intensity"] for p in pts if p["arithmetic_intensity"] > 0]
    ridge = peak_fl / peak_bw
    lo = min([*ais, ridge]) / 4
    hi = max([*ais, ridge]) * 4
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.plot(x, np.minimum(peak_fl, x * peak_bw), color="black", lw=2, label="roof")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.text(ridge, peak_fl * 1.15, f"ridge {ridge:.1f} FLOP/B", ha="center", fontsize=8)
    ax.text(lo * 1.2, lo * 1.2 * peak_bw * 1.3, f"{peak_bw:.0f} GB/s", fontsize=8, rotation=0)
    ax.text(hi / 1.2, peak_fl * 0.8, f"{peak_fl:.0f} GFLOP/s", ha="right", fontsize=8)
    cmap = plt.get_cmap("tab10")
    kernels = sorted({p["kernel"] for p in pts})
    max_n = max((p["launches"] for p in pts), default=1)
    for i, k in enumerate(kernels):
        kp = [p for p in pts if p["kernel"] == k and p["arithmetic_intensity"] > 0]
        if not kp:
            continue
        sizes = [20 + 180 * math.sqrt(p["launches"] / max_n) for p in kp]
        ax.scatter(
            [p["arithmetic_intensity"] for p in kp],
            [max(p["achieved_gflops"], 1e-6) for p in kp],
            s=sizes,
            color=cmap(i % 10),
            alpha=0.7,
            edgecolor="black",
            linewidth=0.5,
            label=f"{k} ({len(kp)} configs)",
        )
        # The best configuration of each kernel: a star on the point itself (a text
        # label next to it collided with the roof labels and with other kernels').
        best = max(kp, key=lambda p: p["achieved_gflops"])
        ax.scatter(
            [best["arithmetic_intensity"]],
            [max(best["achieved_gflops"], 1e-6)],
            s=260,
            marker="*",
            color=cmap(i % 10),
            edgecolor="black",
            linewidth=0.8,
            zorder=3,
        )
    ymin = min([p["achieved_gflops"] for p in pts if p["achieved_gflops"] > 0] or [1.0]) / 4
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(ymin, peak_fl * 2)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"Roofline: {model['device_model']} (point size: launches)")
    handles, labels = ax.get_legend_handles_labels()
    star = Line2D([], [], ls="", marker="*", ms=12, color="white", mec="black")
    ax.legend(
        handles=[*handles, star],
        labels=[*labels, "best config of a kernel"],
        loc="lower right",
        fontsize=8,
    )
    off = model.get("off_roofline", [])
    if off:
        note = "; ".join(
            f"{o['kernel']} ({o['reason']}, best {o['best_achieved_gbs']:.0f} GB/s = "
            f"{o['best_bw_fraction']:.0%} of peak)"
            for o in off
        )
        fig.text(0.01, -0.02, f"Not on the roofline: {note}", fontsize=8, ha="left", va="top")
    return _save(fig, out / f"roofline_{_safe(model['device_model'])}.png")


def _per_window(windows: list[dict[str, Any]]) -> list[tuple[float, float, float]]:
    """(t, count-weighted mean, largest p95) per window time: a config change mid-window
    splits a window in two aggregates, and the line should show what the kernel ran."""
    acc: dict[float, list[float]] = {}
    for w in windows:
        if not w["count"]:
            continue
        a = acc.setdefault(w["t"], [0.0, 0.0, 0.0])
        a[0] += w["mean_us"] * w["count"]
        a[1] += w["count"]
        a[2] = max(a[2], w["p95_us"])
    return [(t, s / n, p95) for t, (s, n, p95) in sorted(acc.items())]


def _timeline(plt: Any, kernel: str, series: list[dict[str, Any]], t0: float, out: Path) -> Path:
    from matplotlib.lines import Line2D

    fig, (ax, ev) = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(10, 4.2 + 0.35 * len(series)),
        gridspec_kw={"height_ratios": [4, 0.6 + 0.4 * len(series)], "hspace": 0.08},
    )
    cmap = plt.get_cmap("tab10")
    all_means: list[float] = []
    for i, s in enumerate(series):
        pts = _per_window(s["windows"])
        if not pts:
            continue
        t = [p[0] - t0 for p in pts]
        mean = [p[1] for p in pts]
        all_means += mean
        color = cmap(i % 10)
        ax.plot(t, mean, "-", color=color, lw=1.6, marker=".", ms=4, label=s["node"])
        ax.fill_between(t, mean, [p[2] for p in pts], color=color, alpha=0.12, lw=0)
        # Events in their own strip, one row per device, so they never hide the line.
        y = len(series) - 1 - i
        ev.axhline(y, color=color, lw=0.6, alpha=0.5)
        # Three sub-rows (recommended, applied, judged): an outcome follows its
        # recommendation within a second or two, and on one row their markers overlapped.
        rec_t = [r["t"] - t0 for r in s["recommendations"]]
        ev.plot(rec_t, [y + 0.28] * len(rec_t), "v", color="#555555", ms=5, alpha=0.8)
        for status, (marker, c) in _OUTCOME_STYLE.items():
            ot = [o["t"] - t0 for o in s["outcomes"] if o["status"] == status]
            row = y if status == "applied" else y - 0.28
            ev.plot(ot, [row] * len(ot), marker, color=c, ms=5, mec="black", mew=0.4)
    if all_means and max(all_means) / max(min(all_means), 1e-9) > 20:
        ax.set_yscale("log")
    ax.set_ylabel("mean duration (us)")
    ax.set_title(f"{kernel}: mean duration per window (shaded to p95)")
    ax.legend(loc="upper right", fontsize=8, title="device", title_fontsize=8)
    ev.set_yticks(range(len(series)))
    ev.set_yticklabels([s["node"] for s in reversed(series)], fontsize=8)
    ev.set_ylim(-0.7, len(series) - 0.3)
    ev.grid(axis="y", visible=False)
    ev.set_xlabel("time since the start of the range (s)")
    handles = [
        Line2D([], [], ls="", marker="v", color="#555555", label="recommended"),
        *(
            Line2D(
                [], [], ls="", marker=m, color=c, mec="black", mew=0.4, label=k.replace("_", " ")
            )
            for k, (m, c) in _OUTCOME_STYLE.items()
        ),
    ]
    ev.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.55 - 0.1 * len(series)),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    return _save(fig, out / f"timeline_{_safe(kernel)}.png")
