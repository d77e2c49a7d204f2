"""The pipeline benchmark's side-by-side table of two brokers' runs."""

from __future__ import annotations

from kernelstream.bench.pipeline import _side_by_side


def test_side_by_side_puts_each_broker_in_a_column() -> None:
    runs = {
        "tansu": {
            "broker": "tansu",
            "ceiling_a": {"median_per_s": 6_900_000.0},
            "worker_c": {"median_per_s": 3_450_000.0},
            "ratios": {"c_over_a": 0.5},
            "ready_f": {"median_s": 1.25},
        },
        "kafka": {
            "broker": "kafka 4.1.1",
            "ceiling_a": {"median_per_s": 5_000_000.0},
            "worker_c": {"median_per_s": 3_000_000.0},
            "ratios": {"c_over_a": 0.6},
        },
    }
    table = _side_by_side(runs).splitlines()
    assert table[0] == "| figure | tansu | kafka 4.1.1 |"
    assert "| (c) worker, launches/s | 3,450,000 | 3,000,000 |" in table
    assert "| (f) ready, s | 1.25 | - |" in table  # a figure one run lacks
    assert not any("naive" in line for line in table)  # neither run has it


def test_side_by_side_has_a_row_per_latency_phase() -> None:
    def phase(label: str, p50: float, p99: float) -> dict[str, object]:
        return {"label": label, "p50_s": p50, "p99_s": p99}

    runs = {
        "tansu": {
            "broker": "tansu",
            "latency_d": [phase("defaults@10%", 0.71, 1.215), phase("defaults@90%", 1.05, 1.54)],
        },
        "kafka": {"broker": "kafka 4.1.1", "latency_d": [phase("defaults@10%", 0.73, 1.22)]},
    }
    table = _side_by_side(runs).splitlines()
    assert table[2:] == [
        "| latency p50 / p99 s, defaults@10% | 0.71 / 1.22 | 0.73 / 1.22 |",
        "| latency p50 / p99 s, defaults@90% | 1.05 / 1.54 | - |",
    ]
