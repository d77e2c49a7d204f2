"""What the report page shows: every kernel accounted for on the rooflines, labels that do
not cover each other, and recommendations summarised per series with details on demand."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from kernelstream.app.replay import plots
from kernelstream.app.replay.analysis import AnalysisResult
from kernelstream.app.replay.report import build_summary, render_html
from kernelstream.schemas import Recommendation, ReconfigOutcome, WindowAggregate


def window(kernel: str, config_id: str, t: float, *, flops: bool = True) -> WindowAggregate:
    ai = 4.0 if flops else 0.0
    return WindowAggregate(
        node="n1",
        device_index=0,
        device_model="A100-SXM4-80GB",
        kernel=kernel,
        workload=kernel,
        problem_size=[1024],
        config={"c": config_id},
        config_id=config_id,
        window_start=t,
        window_end=t + 1,
        count=10,
        failures=0,
        duration_mean_us=100.0,
        duration_p50_us=100.0,
        duration_p95_us=110.0,
        duration_min_us=90.0,
        duration_max_us=120.0,
        duration_std_us=5.0,
        busy_fraction=0.5,
        idle_gap_mean_us=10.0,
        achieved_gbs=1500.0,
        achieved_gflops=6000.0 if flops else 0.0,
        bw_fraction=0.74,
        flops_fraction=0.3 if flops else 0.0,
        arithmetic_intensity=ai,
        occupancy=0.5,
        waves=2.0,
        peak_gbs=2039.0,
        peak_gflops=19500.0,
        launch_overhead_us=3.0,
        seq_min=0,
        seq_max=10,
    )


def recommendation(i: int, kernel: str) -> Recommendation:
    return Recommendation(
        id=f"rec/n1/0/{kernel}/{i}",
        node="n1",
        device_index=0,
        device_model="A100-SXM4-80GB",
        kernel=kernel,
        workload=kernel,
        problem_size=[1024],
        from_config_id="a",
        config={"c": "b"},
        config_id="b",
        reason="explore",
        evidence={"classification": "memory_bottleneck"},
        expected_gain=0.1,
        issued_at=float(i),
        expires_at=float(i) + 20,
    )


def outcome(i: int, kernel: str, status: str) -> ReconfigOutcome:
    return ReconfigOutcome(
        id=f"o{i}",
        recommendation_id=f"rec/n1/0/{kernel}/{i}",
        node="n1",
        device_index=0,
        device_model="A100-SXM4-80GB",
        kernel=kernel,
        workload=kernel,
        problem_size=[1024],
        status=status,
        reason="measured",
        before_config={"c": "a"},
        before_config_id="a",
        after_config={"c": "b"},
        after_config_id="b",
        speedup=1.5,
        at=float(i) + 1,
    )


def _keep(figs: list[Any]) -> Any:
    """A stand-in for ``plots._save`` that keeps the figure open for inspection."""

    def save(fig: Any, path: Path) -> Path:
        figs.append(fig)
        return path

    return save


def summary_of(res: AnalysisResult) -> dict[str, Any]:
    return build_summary(res, input_info={"description": "test"}, options={})


def test_a_kernel_without_flop_is_named_not_dropped_from_the_roofline() -> None:
    res = AnalysisResult(
        windows=[window("matmul", "a", 0), window("transpose", "a", 0, flops=False)]
    )
    summary = summary_of(res)
    [model] = summary["roofline"]
    [off] = model["off_roofline"]
    assert off["kernel"] == "transpose" and off["best_achieved_gbs"] == 1500.0
    page = render_html(summary, {})
    assert "Not on a roofline" in page and "transpose on A100-SXM4-80GB" in page
    assert "74.0% of peak bandwidth" in page


def _text_boxes(fig: Any) -> list[tuple[str, Any]]:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = [t for t in ax.texts if t.get_text()]
    return [(t.get_text(), t.get_window_extent(renderer)) for t in texts]


def test_roofline_labels_do_not_cover_each_other(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A kernel whose best point sits at the ridge: its label went over the roof's labels."""
    figs: list[Any] = []
    monkeypatch.setattr(plots, "_save", _keep(figs))
    ridge = 19500.0 / 2039.0
    model = {
        "device_model": "A100-SXM4-80GB",
        "peak_gbs": 2039.0,
        "peak_gflops": 19500.0,
        "points": [
            {
                "kernel": k,
                "arithmetic_intensity": ai,
                "achieved_gflops": gf,
                "launches": 100,
                "config_id": f"{k}{ai}",
            }
            for k, ai, gf in (
                ("matmul", ridge, 18000.0),
                ("matmul", ridge / 2, 8000.0),
                ("stencil", 0.3, 600.0),
                ("stencil", 0.31, 550.0),
            )
        ],
        "off_roofline": [],
    }
    plots._roofline(plots._plt(), model, tmp_path)
    boxes = _text_boxes(figs[0])
    assert len(boxes) >= 3  # ridge, bandwidth and compute roof labels
    for (a, ba), (b, bb) in itertools.combinations(boxes, 2):
        assert not ba.overlaps(bb), f"{a!r} covers {b!r}"


def test_timeline_outcomes_do_not_sit_on_their_recommendations(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Applied and kept/rolled back follow within a second: each kind has its own row."""
    figs: list[Any] = []
    monkeypatch.setattr(plots, "_save", _keep(figs))
    series = [
        {
            "node": "n1",
            "windows": [{"t": t, "mean_us": 100.0, "p95_us": 110.0, "count": 5} for t in range(5)],
            "recommendations": [{"t": 1.0}],
            "outcomes": [{"t": 1.2, "status": "applied"}, {"t": 1.4, "status": "kept"}],
        }
    ]
    plots._timeline(plots._plt(), "matmul", series, 0.0, tmp_path)
    events = figs[0].axes[1]
    rows = {float(line.get_ydata()[0]) for line in events.get_lines() if len(line.get_xdata()) == 1}
    assert len(rows) == 3, rows  # recommended, applied, kept: three heights


def test_recommendations_are_summarised_per_series_with_details_on_demand() -> None:
    recs = [recommendation(i, k) for i in range(30) for k in ("matmul", "stencil")]
    outs = [
        outcome(i, k, "kept" if i % 3 == 0 else "rolled_back")
        for i in range(30)
        for k in ("matmul", "stencil")
    ]
    res = AnalysisResult(
        windows=[window("matmul", "a", 0), window("stencil", "a", 0)],
        recorded_recommendations=recs,
        recorded_outcomes=outs,
    )
    page = render_html(summary_of(res), {})
    section = page[page.index("<h2>Recommendations") :]
    overview = section[: section.index("<details>")]
    assert overview.count("<tr>") == 1 + 2  # header + one row per series
    assert '<td class="n">60</td>' not in overview  # counted per series, not in total
    assert '<td class="n">30</td>' in overview and '<td class="n">10</td>' in overview
    assert "Every recommendation (60" in section
