"""``kernelstream kernels check``: the built-in workloads compile (CI fails otherwise), and a
configuration that does not compile fails the command with its compiler log."""

from __future__ import annotations

import gc
import importlib.util
import json
import sys
from collections.abc import Iterator
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
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # as if the extra were absent
    r = CliRunner().invoke(main, ["kernels", "check", "--workload", "transpose"])
    assert r.exit_code == 1
    assert "pip install 'kernelstream[compile]'" in r.output and "Traceback" not in r.output


# A user's module as they would write it for a GPU: the kernel is made without a device.
USER_MODULE = '''
import kernelstream

SOURCE = r"""
#if tile == 3
#error "a tile of 3 is not supported"
#endif
extern "C" __global__ void saxpy_tiled(float *y, const float *x, float a, int n) {
    int base = (blockIdx.x * block_size_x + threadIdx.x) * tile;
    for (int k = 0; k < tile; k++)
        if (base + k < n) y[base + k] = a * x[base + k] + y[base + k];
}
"""

saxpy = kernelstream.TunableKernel(
    "saxpy_tiled",
    SOURCE,
    1 << 20,
    {"block_size_x": [64, 128, 256], "tile": [1, 2, 3, 4]},
    grid_div_x=["block_size_x", "tile"],
)
'''


@pytest.fixture(autouse=True)
def _forget_user_modules(tmp_path: Path) -> Iterator[None]:
    """The kernels a check imports live as long as their module: drop the test's modules
    after it, so no later test's node finds these kernels in the process."""
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]
    gc.collect()


def test_a_users_kernel_is_checked_per_configuration_without_a_gpu(tmp_path: Path) -> None:
    (tmp_path / "user_kernels_mod.py").write_text(USER_MODULE)
    out = tmp_path / "check.json"
    args = ["--sample", "12", "--json", str(out), "--cache-dir", str(tmp_path / "cache")]
    spec = f"{tmp_path / 'user_kernels_mod.py'}:saxpy"
    r = CliRunner().invoke(main, ["kernels", "check", "--kernel", spec, *args])
    assert r.exit_code == 1, r.output
    doc = json.loads(out.read_text())
    assert {row["workload"] for row in doc["rows"]} == {"saxpy_tiled"}  # no built-in asked for
    assert doc["compiled"] == 24 and doc["failed"] == 6
    failed = [row for row in doc["rows"] if not row["ok"]]
    assert all(row["config"]["tile"] == 3 for row in failed)
    assert {row["arch"] for row in failed} == {"sm_80", "sm_90"}
    assert all("a tile of 3 is not supported" in row["log"] for row in failed)
    ok = [row for row in doc["rows"] if row["ok"]]
    assert all(row["registers"] > 0 and 0 < row["occupancy"] <= 1 for row in ok)
    assert "saxpy_tiled sm_90  FAILED  block_size_x=64,tile=3" in r.output
    assert "6 of 24 configurations failed to compile" in r.output
    assert "a tile of 3 is not supported" in r.output


def test_a_module_on_the_path_and_its_every_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "user_kernels_two.py").write_text(
        USER_MODULE + 'other = kernelstream.TunableKernel("other", SOURCE.replace('
        '"saxpy_tiled", "other"), 4096, {"block_size_x": [32, 64], "tile": [1]})\n'
    )
    monkeypatch.chdir(tmp_path)  # a module is found from the current folder, as with python -m
    r = CliRunner().invoke(
        main,
        ["kernels", "check", "--kernel", "user_kernels_two", "--workload", "transpose",
         "--arch", "sm_90", "--sample", "2", "--cache-dir", str(tmp_path / "cache")],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "nvrtc 12.9: 6 compiled, 0 failed" in r.output
    assert "other" in r.output and "saxpy_tiled" in r.output and "transpose" in r.output


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_here:k", "no module named 'no_such_module_here'"),
        ("/nowhere/k.py:k", "no such Python file"),
        ("{mod}:SOURCE", "SOURCE is a str, not a kernelstream.TunableKernel"),
        ("{mod}:nope", "has no attribute 'nope'"),
        ("{empty}", "defines no kernelstream.TunableKernel"),
        ("{raising}", "importing it raised ZeroDivisionError: division by zero"),
        ("{first_fails}", "raised KernelCompileError: kernel 'saxpy_tiled': its first"),
        ("{first_fails}", "a tile of 3 is not supported"),
        ("{on_gpu}", "made without device=, it is checked on any machine"),
    ],
)
def test_bad_kernel_specs_are_one_line_errors(tmp_path: Path, spec: str, message: str) -> None:
    if spec == "{on_gpu}" and importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here, so a kernel on cupy_device(0) can be made")
    (tmp_path / "mod.py").write_text(USER_MODULE)
    (tmp_path / "empty.py").write_text("x = 1\n")
    (tmp_path / "raising.py").write_text("x = 1 / 0\n")
    (tmp_path / "first.py").write_text(
        USER_MODULE.replace("    grid_div_x=", '    default={"block_size_x": 64, "tile": 3},\n'
                            "    grid_div_x=")
    )  # fmt: skip
    (tmp_path / "gpu.py").write_text(  # no CuPy here: the GPU's device cannot be made
        USER_MODULE.replace("    grid_div_x=", "    device=kernelstream.cupy_device(0),\n"
                            "    grid_div_x=")
    )  # fmt: skip
    spec = spec.format(
        on_gpu=tmp_path / "gpu.py",
        mod=tmp_path / "mod.py",
        empty=tmp_path / "empty.py",
        raising=tmp_path / "raising.py",
        first_fails=tmp_path / "first.py",
    )
    r = CliRunner().invoke(main, ["kernels", "check", "--kernel", spec])
    assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output
