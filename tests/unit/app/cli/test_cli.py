"""Every command answers --help; the demo summary comes from window aggregates and says
what was refused."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelstream.app.cli import main
from kernelstream.app.cli.demo import SummaryBuilder
from kernelstream.schemas import DeadLetter, ReconfigOutcome, WindowAggregate


@pytest.mark.parametrize("command", ["demo", "broker", "worker", "node", "watch"])
def test_help(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def window(start: float, config_id: str, mean: float, count: int = 100) -> WindowAggregate:
    z = 0.0
    return WindowAggregate(
        node="n1",
        device_index=0,
        device_model="A100",
        kernel="matmul",
        workload="matmul",
        problem_size=[2048],
        config={"c": config_id},
        config_id=config_id,
        window_start=start,
        window_end=start + 1,
        count=count,
        failures=0,
        duration_mean_us=mean,
        duration_p50_us=mean,
        duration_p95_us=mean,
        duration_min_us=mean,
        duration_max_us=mean,
        duration_std_us=z,
        busy_fraction=z,
        idle_gap_mean_us=z,
        achieved_gbs=z,
        achieved_gflops=z,
        bw_fraction=z,
        flops_fraction=z,
        arithmetic_intensity=z,
        occupancy=z,
        waves=z,
        peak_gbs=1.0,
        peak_gflops=1.0,
        launch_overhead_us=3.0,
        seq_min=0,
        seq_max=count,
    )


def outcome(status: str, after: str, at: float) -> ReconfigOutcome:
    return ReconfigOutcome(
        id=f"o{at}",
        recommendation_id=f"r{at}",
        node="n1",
        device_index=0,
        device_model="A100",
        kernel="matmul",
        workload="matmul",
        problem_size=[2048],
        status=status,
        reason="measured",
        before_config={},
        before_config_id="default",
        after_config={},
        after_config_id=after,
        at=at,
    )


def test_summary_shows_default_best_kept_and_current() -> None:
    """A run that ends while the node tries a slow configuration still reports the fast
    one it kept: default 200 us, best kept 50 us (4x), current trial 400 us."""
    b = SummaryBuilder()
    b.add(window(0, "default", 300.0, count=100))
    b.add(window(1, "default", 100.0, count=100))  # default mean is count-weighted: 200
    b.add(window(2, "mid", 150.0))
    b.add(outcome("rolled_back", "mid", 2.5))
    for t in range(3, 8):
        b.add(window(t, "best", 50.0))
    b.add(outcome("kept", "best", 5.0))
    b.add(window(8, "fast-unkept", 20.0))  # measured faster, but rolled back: not held
    b.add(outcome("rolled_back", "fast-unkept", 8.5))
    b.add(window(9, "trial", 400.0))  # what the node runs as the run stops
    [row] = b.rows()
    assert row["default_config_id"] == "default" and row["default_mean_us"] == 200.0
    assert row["best_kept_config_id"] == "best" and row["best_kept_mean_us"] == 50.0
    assert row["current_config_id"] == "trial" and row["current_mean_us"] == 400.0
    assert not row["current_is_kept"]
    assert row["speedup"] == 4.0 and row["current_speedup"] == 0.5
    assert (row["kept"], row["rolled_back"]) == (1, 2)


def test_summary_without_outcomes_keeps_the_default() -> None:
    b = SummaryBuilder()
    b.add(window(0, "default", 100.0))
    b.add(window(1, "other", 10.0))
    [row] = b.rows()
    assert row["best_kept_config_id"] == "default" and row["speedup"] == 1.0


def test_demo_trace_node_replays_the_first_file_that_is_a_cache(tmp_path: Path) -> None:
    import gzip
    import json

    from kernelstream.app.cli.demo import _find_trace_file
    from kernelstream.app.settings import Settings
    from tests.toy_cache import write_toy_cache

    # "A100_T4" sorts before "B" but is a T4 results file, not a Kernel Tuner cache.
    with gzip.open(tmp_path / "A100_T4.json.gz", "wt") as fh:
        json.dump({"schema_version": "1.0.0", "results": []}, fh)
    write_toy_cache(tmp_path / "B.json.gz")
    settings = Settings(tuning_spaces_dir=tmp_path)
    assert _find_trace_file(settings, None) == tmp_path / "B.json.gz"
    (tmp_path / "B.json.gz").unlink()
    assert _find_trace_file(settings, None) is None


def _letter(key: bytes | None, code: str, reason: str) -> DeadLetter:
    return DeadLetter(
        stage="window",
        topic="ks.launches",
        key_b64=base64.b64encode(key).decode() if key is not None else None,
        value_b64="",
        reason=reason,
        reason_code=code,
        at=0.0,
    )


def test_summary_says_what_was_refused_and_from_where(capsys: pytest.CaptureFixture[str]) -> None:
    """A node whose every batch is refused has no row; the dead letters say why."""
    from kernelstream.app.cli.demo import _print_dead_letters

    b = SummaryBuilder()
    _print_dead_letters(b.dead_letters)
    assert "Dead letters: none" in capsys.readouterr().out
    unknown = "unknown kernel: workload 'convolution_kernel' with problem size [4096, 4096]"
    for _ in range(186):
        b.add(_letter(b"trace-1:0/convolution_kernel", "unknown_kernel", unknown))
    b.add(_letter(b"sim-a100:0/matmul", "bad_timestamp", "event time 1.000 is 9 s ahead"))
    b.add(_letter(None, "invalid_json", "invalid JSON: unexpected character"))
    b.add(_letter(b"\xff\xfe", "invalid_json", "invalid JSON: unexpected character"))
    assert len(b.dead_letters) == 189 and b.rows() == []
    _print_dead_letters(b.dead_letters)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "Dead letters: 189 messages refused (topic ks.deadletter, recorded too):"
    assert out[2] == f"    186  window/unknown_kernel from trace-1:0/convolution_kernel: {unknown}"
    assert out[3].startswith("      2  window/invalid_json from (no key), (key //4=)")
    assert out[4].startswith("      1  window/bad_timestamp from sim-a100:0/matmul: event time")
    [row] = [d for d in b.dead_letters.as_dict() if d["reason_code"] == "unknown_kernel"]
    assert row["count"] == 186 and row["keys"] == {"trace-1:0/convolution_kernel": 186}


def test_demo_children_run_the_demos_kernelstream_not_the_current_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started in a folder that holds another ``kernelstream`` package (a second checkout),
    the demo's children import the one the demo runs."""
    from kernelstream.app.cli.demo import ChildProcesses

    decoy = tmp_path / "kernelstream"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit('the decoy kernelstream was imported')\n")
    monkeypatch.chdir(tmp_path)
    children = ChildProcesses(tmp_path, dict(os.environ))
    children.spawn("probe", ["--help"])
    [(_, proc)] = children.procs
    assert proc.wait(timeout=60) == 0
    log = (tmp_path / "probe.log").read_text()
    assert "decoy" not in log and "Usage" in log
