"""``kernelstream sweep``, ``calibrate`` and the GPU-only commands without a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import kernelstream.kernels as kernels
from kernelstream.app.cli import main
from kernelstream.kernels import load_cache


def test_sim_sweep_then_calibrate(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "stencil.json.gz"
    args = ["sweep", "--backend", "sim", "--model", "L4", "--workload", "stencil2d"]
    r = runner.invoke(
        main, [*args, "--iterations", "3", "--problem-scale", "0.05", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert "stencil2d" in r.output and "0 failed" in r.output
    assert load_cache(out).name == "stencil2d"
    r = runner.invoke(
        main, ["sweep", "--backend", "sim", "--workload", "transpose", "--out", str(tmp_path)]
    )
    assert r.exit_code == 0, r.output
    (dated,) = tmp_path.glob("sweep-transpose-A100-SXM4-80GB-*.json.gz")
    report = tmp_path / "calibration.json"
    r = runner.invoke(
        main, ["calibrate", "--sweep", str(out), "--sweep", str(dated), "--json", str(report)]
    )
    assert r.exit_code == 0, r.output
    assert "spearman" in r.output
    results = json.loads(report.read_text())["results"]
    assert [c["workload"] for c in results] == ["stencil2d", "transpose"]
    assert all(c["median_rel_error"] < 0.05 for c in results)


def test_sweep_usage_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["sweep", "--backend", "sim", "--workload", "nope"])
    assert r.exit_code != 0 and "unknown workload" in r.output
    r = runner.invoke(main, ["sweep", "--backend", "sim", "--out", str(tmp_path / "one.json")])
    assert r.exit_code != 0 and "exactly one" in r.output


@pytest.mark.parametrize(
    "args",
    [
        ["sweep", "--backend", "cupy"],
        ["bench", "telemetry-overhead"],
        ["bench", "telemetry-timing"],
        ["demo", "--cupy", "--duration", "1"],
        ["node", "--backend", "cupy", "--duration", "1"],
    ],
)
def test_gpu_commands_name_the_gpu_extra_without_cupy(args: list[str], tmp_path: Path) -> None:
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here; the missing-CuPy path cannot be exercised")
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path) as cwd:
        r = runner.invoke(main, args)
        assert r.exit_code == 1
        assert "kernelstream[gpu]" in r.output
        assert not (Path(cwd) / "var").exists()  # failed before starting a broker


@pytest.mark.parametrize("command", ["sweep", "calibrate"])
def test_help(command: str) -> None:
    r = CliRunner().invoke(main, [command, "--help"])
    assert r.exit_code == 0 and "Usage" in r.output


def test_sigterm_ends_a_sweep_that_still_writes_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = kernels.open_device

    class Terminated:
        """A sim device whose third launch is interrupted by SIGTERM (as `timeout` does)."""

        def __init__(self) -> None:
            self.inner = real_open("sim", problem_scale=0.05)
            self.launches = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def launch(self, *args: Any) -> Any:
            self.launches += 1
            if self.launches == 6:  # warm-up + timed launch of the third config
                os.kill(os.getpid(), signal.SIGTERM)
            return self.inner.launch(*args)

    monkeypatch.setattr(kernels, "open_device", lambda *a, **kw: Terminated())
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "partial.json"
    r = CliRunner().invoke(
        main, ["sweep", "--backend", "sim", "--workload", "transpose", "--out", str(out)]
    )
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is restored
    assert r.exit_code == 143, r.output
    assert "PARTIAL" in r.output
    assert load_cache(out).space.size() == 3


def test_api_overhead_without_the_data_folder_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU machine without the tuning-spaces folder: the trace case is skipped with its
    reason (the cupy case would still run); with nothing to run, a one-line error."""
    monkeypatch.setenv("KERNELSTREAM_TUNING_SPACES_DIR", str(tmp_path / "none"))
    r = CliRunner().invoke(
        main, ["bench", "api-overhead", "--no-cupy", "--results-dir", str(tmp_path)]
    )
    assert r.exit_code == 1 and r.exception is not None
    assert isinstance(r.exception, SystemExit)  # a click error, not a traceback
    assert "no case could run here" in r.output and "KERNELSTREAM_TUNING_SPACES_DIR" in r.output
    assert not list(tmp_path.glob("api-overhead-*"))
