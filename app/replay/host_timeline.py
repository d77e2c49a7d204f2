"""The replay report's copies-and-host-gaps timeline.

Per series (node, device, kernel) and window: the share of the step spent in copies,
in host gaps and after waits on the device, and the achieved copy bandwidth per
direction against the device's link peak. Drawn from the host-side summaries the
offline analysis keeps (:attr:`app.replay.analysis.AnalysisResult.host_windows`),
which are the same numbers the host-side findings were decided on.
"""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelstream.agents.logic.transfers import TransferSummary
from kernelstream.kernels.devices import device_spec_for_name
from kernelstream.schemas import WindowAggregate

__all__ = ["host_section", "host_timeline", "render_host_plots"]


def _gbs(s: TransferSummary, direction: str) -> float | None:
    legs = [leg for (d, _), leg in s.legs.items() if d == direction]
    us = sum(leg.us for leg in legs)
    return sum(leg.bytes for leg in legs) / (us * 1e3) if us > 0 else None


def host_timeline(
    host_windows: Sequence[tuple[WindowAggregate, TransferSummary]],
) -> list[dict[str, Any]]:
    """One entry per series with its windows' host-side shares and copy bandwidths."""
    by_series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    models: dict[str, str] = {}
    for agg, s in host_windows:
        series = f"{agg.node}:{agg.device_index}/{agg.kernel}"
        models[series] = agg.device_model
        pageable = sum(leg.us for (_, pinned), leg in s.legs.items() if not pinned)
        by_series[series].append(
            {
                "window_start": agg.window_start,
                "config_id": agg.config_id,
                "launches": s.launches,
                "copy_share": round(s.share(s.copy_us - s.overlap_us), 4),
                "pageable_copy_share": round(s.share(pageable), 4),
                "gap_share": round(s.share(s.gap_us), 4),
                "waited_share": round(s.waited / s.launches, 4) if s.launches else 0.0,
                "h2d_gbs": _gbs(s, "h2d"),
                "d2h_gbs": _gbs(s, "d2h"),
            }
        )
    return [
        {
            "series": series,
            "device_model": models[series],
            "pcie_peak_gbs": device_spec_for_name(models[series]).pcie_gbs,
            "windows": sorted(points, key=lambda p: p["window_start"]),
        }
        for series, points in sorted(by_series.items())
    ]


def _mean(points: list[dict[str, Any]], key: str) -> float | None:
    values = [p[key] for p in points if p[key] is not None]
    return sum(values) / len(values) if values else None


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def host_section(summary: dict[str, Any], plots: dict[str, list[tuple[str, Path]]]) -> list[str]:
    """The HTML section: a table per series over the range, and the timeline plots."""
    timeline = summary.get("host_timeline") or []
    if not timeline:
        return []
    rows = []
    for s in timeline:
        w = s["windows"]
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(c))}</td>"
                for c in (
                    s["series"],
                    len(w),
                    _fmt(_mean(w, "copy_share"), ".0%"),
                    _fmt(_mean(w, "pageable_copy_share"), ".0%"),
                    _fmt(_mean(w, "gap_share"), ".0%"),
                    _fmt(_mean(w, "waited_share"), ".0%"),
                    f"{_fmt(_mean(w, 'h2d_gbs'), '.1f')} / {_fmt(_mean(w, 'd2h_gbs'), '.1f')}"
                    f" of {s['pcie_peak_gbs']:g}",
                )
            )
            + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "series",
            "windows",
            "copies (not hidden)",
            "pageable copies",
            "host gaps",
            "launches after a wait",
            "h2d / d2h GB/s of link peak",
        )
    )
    out = [
        "<h2>Copies and host gaps</h2>",
        "<p class='muted'>Share of each step (kernels, host gaps and copies no kernel hid) "
        "per window, averaged over the range; the plots show it window by window.</p>",
        f"<table><tr>{head}</tr>{''.join(rows)}</table>",
    ]
    for title, path in plots.get("host", []):
        data = base64.b64encode(path.read_bytes()).decode()  # the page is self-contained
        out.append(f'<img alt="{html.escape(title)}" src="data:image/png;base64,{data}">')
    return out


def render_host_plots(summary: dict[str, Any], out: Path) -> list[tuple[str, Path]]:
    """One PNG per series: copy, gap and wait shares per window over time."""
    timeline = summary.get("host_timeline") or []
    if not timeline:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(p["window_start"] for s in timeline for p in s["windows"])
    made = []
    for i, s in enumerate(timeline):
        fig, ax = plt.subplots(figsize=(8, 3))
        t = [p["window_start"] - t0 for p in s["windows"]]
        for key, label in (
            ("copy_share", "copies"),
            ("gap_share", "host gaps"),
            ("waited_share", "launches after a wait"),
        ):
            # one point per window and configuration: configurations share a window
            ax.plot(t, [p[key] for p in s["windows"]], ".", label=label)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("s from the first window")
        ax.set_ylabel("share of the step")
        ax.set_title(s["series"])
        ax.legend(loc="upper right", fontsize=8)
        path = out / f"host-{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
        made.append((f"Copies and host gaps {s['series']}", path))
    return made
