"""``kernelstream kernels check``: the built-in workloads compile (CI fails otherwise), and a
configuration that does not compile fails the command with its compiler log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import kernelstream.kernels as kernels
from kernelstream.app.cli import main
from kernelstream.kernels import WORKLOAD_NAMES
from kernelstream.kernels.workloads.transpose import Transpose


def test_builtin_workloads_compile_for_sm80_and_sm90(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    r = CliRunner().invoke(
        main, ["kernels", "check", "--json", str(out), "--cache-dir", str(tmp_path / "cache")]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["failed"] == 0 and doc["compiled"] == len(doc["rows"]) >= len(WORKLOAD_NAMES) * 2 * 4
    assert {row["workload"] for row in doc["rows"]} == set(WORKLOAD_NAMES)
    assert {row["arch"] for row in doc["rows"]} == {"sm_80", "sm_90"}
    for row in doc["rows"]:
        assert row["ok"] and row["registers"] > 0 and 0 < row["occupancy"] <= 1
        assert row["device"] in ("A100-SXM4-80GB", "H100-SXM5-80GB")
    assert f"{doc['compiler']}: {doc['compiled']} compiled, 0 failed" in r.output


class _Broken(Transpose):
    """transpose with one declared value the source cannot compile (a zero-length tile)."""

    def __init__(self, source: Path, problem_size: tuple[int, ...] | None = None) -> None:
        super().__init__(problem_size)
        self._src = source

    @property
    def source(self) -> Path:
        return self._src


def test_a_failing_configuration_fails_the_command_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = Transpose()
    broken = tmp_path / "transpose.cu"
    text = good.source.read_text()
    broken.write_text(
        text + "\n#if TILES_PER_BLOCK == 8\n#error eight tiles per block unsupported\n#endif\n"
    )
    monkeypatch.setattr(kernels, "get_workload", lambda name: _Broken(broken))
    out = tmp_path / "check.json"
    r = CliRunner().invoke(
        main,
        [
            "kernels",
            "check",
            "--workload",
            "transpose",
            "--arch",
            "sm_90",
            "--sample",
            "12",
            "--json",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
    )
    assert r.exit_code == 1
    doc = json.loads(out.read_text())
    failed = [row for row in doc["rows"] if not row["ok"]]
    eights = [row for row in doc["rows"] if row["config"]["tiles_per_block"] == 8]
    assert failed == eights and len(eights) < len(doc["rows"]) == 12
    assert all("eight tiles per block unsupported" in row["log"] for row in failed)
    assert f"{len(failed)} of {doc['compiled']} configurations failed to compile" in r.output
    assert "eight tiles per block unsupported" in r.output


def test_unknown_workload_and_arch_are_one_line_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["kernels", "check", "--workload", "nope"])
    assert r.exit_code == 1 and "unknown workload 'nope'" in r.output
    r = runner.invoke(main, ["kernels", "check", "--workload", "transpose", "--arch", "90"])
    assert r.exit_code == 1 and "not of the form sm_XY" in r.output


def test_without_nvrtc_the_command_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # as if the extra were absent
    r = CliRunner().invoke(main, ["kernels", "check", "--workload", "transpose"])
    assert r.exit_code == 1
    assert "pip install 'kernelstream[compile]'" in r.output and "Traceback" not in r.output
