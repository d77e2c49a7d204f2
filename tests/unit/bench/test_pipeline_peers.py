"""The peers benchmark's equality check: reference windows and the comparison."""

from __future__ import annotations

import numpy as np

from kernelstream.agents.logic.windowing import Windower, WindowSpec, make_example_batch
from kernelstream.bench.pipeline_peers import compare_windows, reference_windows
from kernelstream.schemas.columnar import LaunchColumns


def _batches() -> list:
    rng = np.random.default_rng(3)
    t = np.sort(100.0 + rng.random(500) * 3).round(6)
    d = (rng.random(500) * 50).round(3)
    ok = (rng.random(500) > 0.1).astype(int)
    return [
        make_example_batch(t[:250].tolist(), d[:250].tolist(), ok[:250].tolist()),
        make_example_batch(t[250:].tolist(), d[250:].tolist(), ok[250:].tolist(), seq_start=250),
    ]


def _as_rows(windows: list) -> list[dict]:
    return [
        {
            "stream": f"{w.node}:{w.device_index}/{w.kernel}",
            "config_id": w.config_id,
            "window_start": w.window_start,
            "count": w.count,
            "mean": w.duration_mean_us,
            "p95": w.duration_p95_us,
        }
        for w in windows
    ]


def test_the_worker_windower_matches_the_reference_exactly() -> None:
    batches = _batches()
    ref = reference_windows(batches, 1.0)
    w = Windower(WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.0))
    for b in batches:
        w.add_columns(LaunchColumns.from_batch(b), 0.0)
    rows = _as_rows(w.flush_all())
    check = compare_windows(rows, ref)
    assert check["equal"] and check["matching"] == len(ref) == 3 and check["not_closed"] == 0


def test_a_window_that_differs_or_repeats_or_is_missing_is_reported() -> None:
    batches = _batches()
    ref = reference_windows(batches, 1.0)
    w = Windower(WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.0))
    for b in batches:
        w.add_columns(LaunchColumns.from_batch(b), 0.0)
    rows = _as_rows(w.flush_all())
    wrong = [rows[0] | {"count": rows[0]["count"] - 1}, rows[1] | {"p95": rows[1]["p95"] * 1.001}]
    check = compare_windows(wrong, ref)
    assert not check["equal"] and check["differing"] == 2 and check["not_closed"] == 1
    assert compare_windows([rows[0], rows[0]], ref)["differing"] == 1


def test_the_window_stage_is_split_by_step_per_message_and_per_window() -> None:
    from kernelstream.bench.pipeline_peers import _stage_lines

    stages = {"fetch": 0.1, "decode": 0.2, "window": 0.1, "close": 0.3, "emit": 0.4}
    r = {
        "input": {"messages": 1000, "reference_windows": 100, "launches": 200_000},
        # 200,000 launches at 160,000 a second: 1.25 s, 1,250 us a message, 1,100 in steps
        "worker_binary": {
            "rounds": [{"stage_s": stages}, {"stage_s": stages}],
            "median_per_s": 160_000.0,
        },
    }
    [line] = _stage_lines(r, {"binary": 20e6})
    assert "fetch 100.0, decode 200.0, window 100.0, close 300.0, emit 400.0" in line
    assert "between the steps 150.0; 1250.0 in all" in line
    assert "(per window: close 3000, emit 4000)" in line
    assert line.endswith("the binary ceiling: 10.0 us per message in all")
