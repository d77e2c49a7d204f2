"""``kernelstream watch`` output: aligned table rows per record type, filters."""

from __future__ import annotations

from kernelstream.app.cli.watch import TableFormatter, format_row, matches


def rec(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "schema": "ks.recommendation/1",
        "node": "n1",
        "device_index": 0,
        "device_model": "A100-SXM4-80GB",
        "kernel": "matmul",
        "config_id": "block_x=16,unroll=2",
        "expected_gain": 0.25,
        "issued_at": 1_790_000_000.5,
        "reason": "fleet best",
    }
    return base | kw


def test_table_has_a_header_per_record_type_and_aligned_rows() -> None:
    t = TableFormatter()
    first = t.lines(rec())
    assert len(first) == 2 and first[0].split()[:4] == ["issued", "device", "model", "kernel"]
    second = t.lines(rec(node="n2", expected_gain=0.031))
    assert len(second) == 1  # same type: no new header
    assert first[1].index("matmul") == second[0].index("matmul")
    assert "25.0%" in first[1] and "3.1%" in second[0] and "fleet best" in first[1]
    finding = t.lines(
        {
            "schema": "ks.finding/1",
            "node": "n1",
            "device_index": 0,
            "device_model": "A100",
            "kernel": "matmul",
            "classification": "memory_bottleneck",
            "duration_mean_us": 12.345,
            "window_start": 1_790_000_000.0,
            "summary": "slow",
        }
    )
    assert finding[0].startswith("window") and "memory_bottleneck" in finding[1]
    assert "12.3" in finding[1]


def test_long_values_are_cut_and_unknown_types_fall_back() -> None:
    row = TableFormatter().lines(rec(config_id="x" * 80))[1]
    assert "x" * 47 + "~" in row
    assert format_row({"schema": "other", "node": "n", "duration_mean_us": 1.23456}) == (
        "node=n  duration_mean_us=1.235"
    )


def test_filters() -> None:
    assert matches(rec(), "n1", "matmul") and matches(rec(), None, None)
    assert not matches(rec(), "n2", None) and not matches(rec(), None, "transpose")
