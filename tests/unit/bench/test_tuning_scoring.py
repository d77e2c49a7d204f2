"""``bench tuning`` scoring: optimum and gaps come from the cache file's own measurements."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from kernelstream.bench.tuning import (
    _evals_to,
    _gap_at,
    _run_fleet,
    _run_kernelstream,
    _run_random,
    _speedup_interval,
    _summary,
    format_table,
    run_benchmark,
)
from tests.toy_cache import write_toy_cache


def _bench(directory: Path, echo: Any = None, **over: Any) -> dict[str, Any]:
    """``run_benchmark`` at a toy's scale: 1 seed, 12 evaluations, no peers, no warm start."""
    kwargs: dict[str, Any] = dict(
        seeds=1, budget=12, strategies=[], jobs=1, fleet_seeds=1, warm_seeds=0
    )
    return run_benchmark(directory, **(kwargs | over), echo=echo or (lambda m: None))


def test_curves_and_summary_use_the_files_means(tmp_path: Path) -> None:
    truth = write_toy_cache(tmp_path / "toy.json.gz")
    opt = min(truth.values())
    out = _run_random(str(tmp_path / "toy.json.gz"), seed=0, budget=12)
    curve = out["curve"]
    # every configuration of the space, the failed one included, exactly once
    assert len(curve) == 12
    assert curve[-1] == pytest.approx(opt)
    assert all(a >= b for a, b in itertools.pairwise(curve))  # best-so-far
    n5 = _evals_to(curve, opt * 1.05)
    assert n5 is not None and curve[n5 - 1] <= opt * 1.05
    assert _gap_at(curve, 100, opt) == pytest.approx(0.0)  # past the end: the last value
    s = _summary([curve, [math.inf] * 3], opt, budget=12)
    # a run that never got there counts as budget + 1, never as a success
    assert s["within_5pct"]["reached"] == 1
    assert s["within_5pct"]["per_seed"][1] is None
    assert s["within_5pct"]["median"] == pytest.approx((n5 + 13) / 2)
    # the second run stopped after 3 of its 12 evaluations: said, not hidden in the misses
    assert s["evaluations"] == {"median": 7.5, "ended_early_unreached": 1}


def test_kernelstream_run_only_sees_measured_launches(tmp_path: Path) -> None:
    truth = write_toy_cache(tmp_path / "toy.json.gz")
    opt = min(truth.values())
    out = _run_kernelstream(str(tmp_path / "toy.json.gz"), seed=0, budget=12)
    curve = out["curve"]
    assert curve and curve[-1] == pytest.approx(opt)  # it found the optimum of 11
    assert len(curve) <= 12
    assert out["rounds_to_5"] is not None


def test_a_gpu_missing_from_the_device_table_is_tuned_all_the_same(tmp_path: Path) -> None:
    # Measured spaces of other GPUs (AMD ones among them) have no DeviceSpec here.
    from kernelstream.kernels.backends.trace import TraceDevice

    path = tmp_path / "toy_mi250x.json.gz"
    truth = write_toy_cache(path, device_name="AMD Instinct MI250X")
    device = TraceDevice(path)
    assert device.spec.name == "AMD Instinct MI250X" and not device.spec.peaks_known
    out = _run_kernelstream(str(path), seed=0, budget=12)
    assert out["curve"][-1] == pytest.approx(min(truth.values()))
    report = _bench(tmp_path)
    assert report["spaces"]["toy_mi250x.json.gz"]["device"] == "AMD Instinct MI250X"


def test_fleet_sizes_get_the_same_window_budget(tmp_path: Path) -> None:
    write_toy_cache(tmp_path / "toy.json.gz")
    report = _bench(tmp_path, fleet_seeds=2, fleet_windows=30)
    assert report["fleet_windows"] == 30
    fleet = report["spaces"]["toy.json.gz"]["fleet"]
    for nodes in ("1_node", "4_node"):
        per_seed = fleet[nodes]["per_seed"]
        assert len(per_seed) == 2 and fleet[nodes]["seeds"] == 2
        # windows per node until within 5%, never past the shared window budget
        assert all(r is None or 1 <= r <= 30 for r in per_seed)
    assert "fleet: windows per node" in format_table(report)
    # Seed 0's one-node figure is taken from its single-node run (seeds=1), seed 1's
    # from a fleet run: both are what a one-node fleet run gives.
    path = str(tmp_path / "toy.json.gz")
    assert fleet["1_node"]["per_seed"] == [
        _run_fleet(path, seed, 1, windows=30)["rounds_to_5"] for seed in (0, 1)
    ]


def test_files_that_are_not_caches_are_skipped_with_their_reason(tmp_path: Path) -> None:
    import gzip
    import json

    import click

    write_toy_cache(tmp_path / "toy.json.gz")
    with gzip.open(tmp_path / "toy_T4.json.gz", "wt") as fh:
        json.dump({"schema_version": "1.0.0", "results": []}, fh)
    said: list[str] = []
    report = _bench(tmp_path, echo=said.append)
    assert list(report["spaces"]) == ["toy.json.gz"]  # the cache is still scored
    assert list(report["skipped_files"]) == ["toy_T4.json.gz"]
    assert "T4 results file" in report["skipped_files"]["toy_T4.json.gz"]
    assert any(m.startswith("skipped toy_T4.json.gz") for m in said)
    assert "skipped toy_T4.json.gz" in format_table(report)
    (tmp_path / "toy.json.gz").unlink()
    with pytest.raises(click.UsageError, match=r"no readable .*toy_T4\.json\.gz: .*T4 results"):
        _bench(tmp_path)


def test_a_run_that_raises_is_reported_and_left_out_not_fatal(tmp_path: Path) -> None:
    # An unknown strategy (or, without the bench extra, Kernel Tuner itself missing).
    write_toy_cache(tmp_path / "toy.json.gz")
    said: list[str] = []
    report = _bench(tmp_path, echo=said.append, seeds=2, strategies=["no_such_strategy"])
    space = report["spaces"]["toy.json.gz"]
    assert "no_such_strategy" not in space["methods"]  # no figures from failed runs
    assert space["best_kernel_tuner"] is None
    errs = space["failed_runs"]["no_such_strategy"]
    assert len(errs) == 2 and errs[0].startswith("seed 0: ")
    assert space["methods"]["kernelstream"]["seeds"] == 2  # the rest of the run stands
    assert any("no_such_strategy on toy.json.gz, seed 1" in m for m in said)
    assert "no_such_strategy: 2 runs failed and are left out" in format_table(report)


def test_a_second_run_of_the_day_keeps_the_first_ones_files(tmp_path: Path) -> None:
    from kernelstream.bench.tuning import _dated

    out = tmp_path / "elsewhere.json"
    assert _dated(tmp_path, "2026-01-02", out).name == "tuning-2026-01-02.json"
    (tmp_path / "tuning-2026-01-02.json").write_text("{}")
    assert _dated(tmp_path, "2026-01-02", out).name == "tuning-2026-01-02-run2.json"
    mine = tmp_path / "tuning-2026-01-02-run2.json"
    assert _dated(tmp_path, "2026-01-02", mine) == mine


def test_fleet_speedup_interval_brackets_the_ratio_and_pairs_seeds() -> None:
    one = [100, 120, 80, 150, None, 90, 110, 130, 95, 105]
    many = [30, 40, 25, 50, 140, 28, 36, 45, 31, 33]
    interval = _speedup_interval(one, many, windows=400)
    assert interval is not None
    low, high = interval
    ratio = 105 / 34.5  # medians; the unreached seed counts as 401 windows
    assert low < ratio < high
    # Paired: fleet runs that track their single-node seeds exactly give a tight
    # interval around the common ratio, however spread the seeds are.
    exact = [3 * w for w in many]
    interval = _speedup_interval(exact, many, windows=400)
    assert interval is not None
    low, high = interval
    assert low == pytest.approx(3.0) and high == pytest.approx(3.0)
    # Nothing to resample: identical seeds, or too few.
    assert _speedup_interval([2] * 5, [2] * 5, windows=400) is None
    assert _speedup_interval([5], [2], windows=400) is None


def test_an_empty_device_name_is_tuned_like_any_other(tmp_path: Path) -> None:
    # Some real Kernel Tuner caches store "device_name": "". Every launch record names its
    # device model, so each kernelstream run failed validation and left no row at all.
    truth = write_toy_cache(tmp_path / "toy_a.json.gz", device_name="")
    write_toy_cache(tmp_path / "toy_b.json.gz", device_name="  ")
    report = _bench(tmp_path)
    for name in ("toy_a.json.gz", "toy_b.json.gz"):
        space = report["spaces"][name]
        assert space["failed_runs"] == {}
        assert space["methods"]["kernelstream"]["seeds"] == 1
        # named after its file: two unnamed GPUs are not pooled as one model
        assert space["device"] == f"unknown GPU ({name})"
    out = _run_kernelstream(str(tmp_path / "toy_a.json.gz"), seed=0, budget=12)
    assert out["curve"][-1] == pytest.approx(min(truth.values()))


def test_cumulative_regret_counts_windows_at_the_optimum() -> None:
    from kernelstream.bench.tuning_score import cumulative_regret, never_tune

    inf = math.inf
    # each evaluation one window; a failed one runs the best so far; after the end the
    # best so far runs on
    assert cumulative_regret([4.0, 2.0, inf], start_us=4.0, opt_us=1.0, n=4) == 2.5
    # a failure before anything ran costs the start configuration's window
    assert cumulative_regret([inf, 1.0], start_us=3.0, opt_us=1.0, n=2) == 2.0
    assert cumulative_regret([], start_us=3.0, opt_us=1.5, n=10) == 2.0  # never tuned
    assert cumulative_regret([1.0] * 5, start_us=3.0, opt_us=1.0, n=3) == 1.0
    assert never_tune(3.0, 1.5, budget=120) == {"after_50": 2.0, "after_100": 2.0}


def test_the_report_has_each_methods_regret_and_the_never_tune_row(tmp_path: Path) -> None:
    truth = write_toy_cache(tmp_path / "toy.json.gz")
    report = _bench(tmp_path, seeds=2, budget=60)
    space = report["spaces"]["toy.json.gz"]
    start = space["start_vs_optimum"]
    assert space["never_tune_regret"] == {"after_50": pytest.approx(start)}
    for method in ("kernelstream", "random"):
        regret = space["methods"][method]["regret"]["after_50"]
        # every config of the toy is at most 2.25x the optimum
        assert 1.0 <= regret <= max(truth.values()) / min(truth.values())
    table = format_table(report)
    assert "online cost: cumulative regret" in table
    assert "never tune" in table


def test_verdict_against_the_best_peer() -> None:
    from kernelstream.bench.tuning_score import verdict

    def m(reached: int, median: float) -> dict[str, Any]:
        return {"within_5pct": {"reached": reached, "median": median}}

    peers = ["random", "pso"]
    # the best peer is the lowest median: pso, not random
    assert verdict({"kernelstream": m(10, 50), "random": m(10, 90), "pso": m(9, 60)}, peers) == {
        "result": "beats",
        "peer": "pso",
        "reached": [10, 9],
        "median": [50, 60],
    }
    got = verdict({"kernelstream": m(10, 50), "random": m(10, 50)}, peers)
    assert got is not None and got["result"] == "ties"
    # more seeds but a higher median, or a lower median but fewer seeds: both lose
    for ours in (m(10, 70), m(8, 40)):
        got = verdict({"kernelstream": ours, "pso": m(9, 60)}, peers)
        assert got is not None and got["result"] == "loses"
    assert verdict({"random": m(10, 50)}, peers) is None


def test_the_command_prints_a_verdict_per_space_and_fails_on_failed_runs(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from kernelstream.bench.tuning import command

    write_toy_cache(tmp_path / "toy.json.gz")

    def invoke(strategies: str) -> Any:
        args = ["--spaces", str(tmp_path), "--json", str(tmp_path / "out" / "t.json")]
        args += ["--seeds", "1", "--budget", "12", "--fleet-seeds", "1", "--no-warm"]
        args += ["--jobs", "1", "--results-dir", str(tmp_path / "out")]
        return CliRunner().invoke(command, [*args, "--strategies", strategies])

    ok = invoke("")  # kernelstream and random search only: no Kernel Tuner needed
    assert ok.exit_code == 0, ok.output
    assert "kernelstream against the best peer" in ok.output
    assert any(line.startswith("toy.json.gz: ") for line in ok.output.splitlines())
    pytest.importorskip("kernel_tuner", reason="Kernel Tuner is a bench extra")
    bad = invoke("no_such_strategy")
    assert bad.exit_code == 1
    assert "incomplete run: toy.json.gz: 1 no_such_strategy runs failed" in bad.output


def test_warm_start_comes_from_the_same_kernel_over_the_same_parameters(
    tmp_path: Path,
) -> None:
    from tests.toy_cache import write_kt_cache

    # Kernel Tuner's own convolution example and the hub's convolution share a kernel
    # name but not their parameters: such a file was taken as the warm start's source.
    write_toy_cache(tmp_path / "toy_a100.json.gz")
    params = {"block_size_x": [32, 64], "unroll": [1, 2]}
    cache = {
        f"{b},{u}": {"block_size_x": b, "unroll": u, "time": 1.0 + b / 64 + u, "times": [1.0]}
        for b in (32, 64)
        for u in (1, 2)
    }
    write_kt_cache(tmp_path / "toy_a0.json.gz", params, cache, "toy", [1024], "NVIDIA RTX A4000")
    report = _bench(tmp_path, warm_seeds=1)
    assert "warm_from" not in report["spaces"]["toy_a100.json.gz"]
    assert "no other GPU of this kernel" in format_table(report)
    write_toy_cache(tmp_path / "toy_a4000.json.gz", device_name="NVIDIA RTX A4000")
    report = _bench(tmp_path, warm_seeds=1)
    assert report["spaces"]["toy_a100.json.gz"]["warm_from"] == "toy_a4000.json.gz"
    assert report["spaces"]["toy_a100.json.gz"]["methods"]["warm"]["seeds"] == 1


def test_the_warm_run_gets_a_node_of_its_own(tmp_path: Path) -> None:
    from kernelstream.agents.logic.search import ModelGuidedSearch
    from kernelstream.agents.logic.tuning import Tuner
    from kernelstream.bench.tuning import _loop, tuned_first
    from tests.toy_cache import write_kt_cache

    # The other GPU is another machine. Where the warm run reused its node's name, the node
    # began barred from every config the other GPU had rolled back (the ids are the same on
    # both), and with the clock starting again its first windows passed for redeliveries.
    params = {"block_size_x": [32, 64, 128, 256], "tile_size_x": [1, 2, 4]}
    cache = {}
    for i, (bx, tx) in enumerate(itertools.product(*params.values())):
        ms = 1.0 + abs(i - 9) * 0.25  # fastest elsewhere than on the toy A100
        cache[f"{bx},{tx}"] = {"block_size_x": bx, "tile_size_x": tx, "time": ms, "times": [ms]}
    write_kt_cache(tmp_path / "toy_a4000.json.gz", params, cache, "toy", [1024], "RTX A4000")
    truth = write_toy_cache(tmp_path / "toy_a100.json.gz")
    tuner = Tuner(strategy=ModelGuidedSearch(seed=0, warm_start=True, n_init=4))
    tuner = tuned_first(str(tmp_path / "toy_a4000.json.gz"), 0, tuner)
    loop = _loop([str(tmp_path / "toy_a100.json.gz")], 0, 1, budget=12, tuner=tuner)
    assert loop.trace.best_true[-1] == min(truth.values())
    rounds = [r for _, r in loop.trace.evaluated]
    # A new config in every window from the second on, as a cold node has (the first
    # window measures the start config), until the optimum is found.
    assert len(rounds) >= 4 and rounds == [2, *range(2, len(rounds) + 1)], rounds


def test_the_fleets_nodes_draw_one_noise_source_with_the_one_node_run(tmp_path: Path) -> None:
    from kernelstream.bench.tuning import _loop

    # Paired fleet figures: a config launched by any node of four sees the durations the
    # single node of the same seed sees for it (each node drew its own before, so the
    # one-node and four-node runs of a seed differed in their noise as well).
    write_toy_cache(tmp_path / "toy.json.gz")
    path = str(tmp_path / "toy.json.gz")
    fleet, one = _loop([path], 3, 4, budget=0), _loop([path], 3, 1, budget=0)
    w = one.nodes[0].workload
    config = {"block_size_x": 64, "tile_size_x": 2}
    first = one.nodes[0].device.launch(w, config, 40).duration_us
    got = [fleet.nodes[i].device.launch(w, config, 10).duration_us for i in (2, 0, 3, 1)]
    assert list(itertools.chain(*got)) == list(first)


def test_paired_log_ratio_counts_misses_and_brackets_the_mean() -> None:
    from kernelstream.bench.tuning_score import paired_log_ratio

    r = paired_log_ratio([40, 90, None, 60], [10, 30, 100, 20], miss=401)
    assert r is not None and r["seeds"] == 4
    logs = [math.log(4), math.log(3), math.log(4.01), math.log(3)]
    assert r["mean"] == pytest.approx(sum(logs) / 4)
    low, high = r["ci90"]
    assert low < r["mean"] < high and r["se"] > 0
    # The same ratio on every seed: no spread, however spread the seeds' counts are.
    exact = paired_log_ratio([30, 300, 3], [10, 100, 1], miss=401)
    assert exact is not None and exact["ci90"] == pytest.approx([math.log(3)] * 2)
    assert paired_log_ratio([5], [2], miss=401) is None
    with pytest.raises(ValueError, match="different lengths"):
        paired_log_ratio([5, 6], [2], miss=401)


def test_fleet_and_warm_lines_give_the_paired_ratio_on_their_own_seeds(tmp_path: Path) -> None:
    truth = write_toy_cache(tmp_path / "toy_a100.json.gz")
    write_toy_cache(tmp_path / "toy_a4000.json.gz", device_name="NVIDIA RTX A4000")
    # More warm and fleet seeds than seeds: the extra seeds get cold runs of their own.
    report = _bench(tmp_path, seeds=1, fleet_seeds=3, warm_seeds=2)
    sp = report["spaces"]["toy_a100.json.gz"]
    assert sp["fleet"]["1_node"]["seeds"] == 3 and sp["fleet"]["paired"]["seeds"] == 3
    warm = sp["warm"]
    assert warm["seeds"] == [0, 1] and len(warm["cold_per_seed"]) == 2
    assert warm["paired"]["seeds"] == 2
    path = str(tmp_path / "toy_a100.json.gz")
    cold = _run_kernelstream(path, seed=1, budget=12)["curve"]
    assert warm["cold_per_seed"][1] == _evals_to(cold, min(truth.values()) * 1.05)
    table = format_table(report)
    assert "paired mean log(one node / four)" in table
    assert "paired mean log(warm / cold)" in table and "over 2 seeds" in table
