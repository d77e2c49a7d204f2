"""TunableKernel: declaration in Kernel Tuner's vocabulary, bad input, safe switches."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import kernelstream
from kernelstream.kernels.backends.trace import default_tuning_spaces_dir
from kernelstream.kernels.errors import (
    KernelArgumentError,
    KernelCompileError,
    KernelDefinitionError,
)
from kernelstream.kernels.tunable import KernelRunner, TunableKernel
from kernelstream.kernels.workloads.user import UserWorkload
from tests.toy_cache import write_toy_cache

SRC = 'extern "C" __global__ void toy(float *out, const float *in, int n) { }'
PARAMS = {"block_size_x": [32, 64, 128, 256], "tile_size_x": [1, 2, 4]}


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    path = tmp_path / "toy.json.gz"
    write_toy_cache(path)  # kernel "toy" on [1024]; (256, 4) failed to compile
    return path


def toy(cache: Path, **kw: object) -> TunableKernel:
    args: dict[str, object] = {
        "grid_div_x": ["block_size_x", "tile_size_x"],
        "device": kernelstream.trace_device(cache, pace=False),
    }
    args.update(kw)
    return TunableKernel("toy", SRC, 1024, PARAMS, **args)  # type: ignore[arg-type]


def test_geometry_and_defines_follow_kernel_tuner() -> None:
    w = UserWorkload(
        "toy",
        SRC,
        (1000, 30),
        {"bx": [32, 64], "by": [2, 4], "t": [1, 3]},
        block_size_names=["bx", "by"],
        grid_div_x=["bx", "t"],
    )
    c = {"bx": 64, "by": 4, "t": 3}
    geo = w.geometry(c)
    # x: ceil(1000 / (64*3)); y: Kernel Tuner's default divisor is the y block size.
    assert geo.grid == (6, 8, 1) and geo.block == (64, 4, 1)
    d = w.defines(c)
    assert d["bx"] == "64" and d["grid_size_x"] == "6" and d["block_size_z"] == "1"
    # Without block-size parameters Kernel Tuner's x block is 256.
    w2 = UserWorkload("toy", SRC, 1024, {"unroll": [1, 2]})
    assert w2.geometry({"unroll": 1}).block == (256, 1, 1)


def test_restrictions_as_strings_and_callables() -> None:
    w = UserWorkload(
        "toy",
        SRC,
        1024,
        PARAMS,
        restrictions=["block_size_x * tile_size_x <= 256", lambda p: p["tile_size_x"] != 2],
    )
    got = {(c["block_size_x"], c["tile_size_x"]) for c in w.space}
    assert got == {(32, 1), (64, 1), (128, 1), (256, 1), (32, 4), (64, 4)}


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tune_params": {"block_size_x": 128}}, "tune_params['block_size_x'] must be a list"),
        ({"tune_params": {"block_size_x": "128"}}, "must be a list of values, got str"),
        ({"tune_params": {"block_size_x": []}}, "has no values"),
        ({"tune_params": [32, 64]}, "tune_params must be a non-empty dict"),
        ({"restrictions": ["block_size_y > 1"]}, "unknown parameter(s) ['block_size_y']"),
        ({"restrictions": ["block_size_x >"]}, "is not a Python expression"),
        ({"restrictions": [lambda p: p["tile"] > 1]}, "reads unknown parameter 'tile'"),
        ({"restrictions": [3]}, "neither a string expression nor a callable"),
        ({"restrictions": ["block_size_x > 4096"]}, "has no valid configuration"),
        ({"grid_div_x": ["block_size_x", "tiles"]}, "grid_div_x: 'tiles' names unknown"),
        ({"problem_size": (0, 5)}, "problem_size (0, 5) must be 1 to 3 positive integers"),
        ({"source": "__global__ void other(int n) {}"}, "no '__global__ void toy(...)'"),
        ({"flops": lambda c, p: c["nope"]}, "flops(config, problem_size) failed"),
        ({"bytes": lambda c, p: -1.0}, "bytes returned -1.0"),
    ],
)
def test_bad_definitions_name_what_is_wrong(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"source": SRC, "problem_size": 1024, "tune_params": PARAMS}
    args.update(kwargs)
    with pytest.raises(KernelDefinitionError) as info:
        UserWorkload("toy", **args)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_a_cache_file_of_another_kernel_is_refused(tmp_path: Path, cache: Path) -> None:
    dev = kernelstream.trace_device(cache)
    with pytest.raises(KernelDefinitionError, match="holds kernel 'toy', not 'vadd'"):
        TunableKernel("vadd", SRC.replace("toy", "vadd"), 1024, PARAMS, device=dev)
    with pytest.raises(KernelDefinitionError, match=r"missing: \['tile_size_x'\]"):
        TunableKernel("toy", SRC, 1024, {"block_size_x": [32, 64]}, device=dev)
    with pytest.raises(KernelDefinitionError, match="measured on problem size"):
        TunableKernel("toy", SRC, 2048, PARAMS, device=dev)


def test_wrong_number_of_arguments(cache: Path) -> None:
    k = toy(cache)
    with pytest.raises(KernelArgumentError) as info:
        k(1, 2)
    assert "takes 3 arguments (float *out, const float *in, int n), got 2" in str(info.value)


def test_a_first_config_that_cannot_run_raises(cache: Path) -> None:
    with pytest.raises(KernelCompileError, match="CompilationFailedConfig"):
        toy(cache, default={"block_size_x": 256, "tile_size_x": 4})


def test_a_failing_config_falls_back_and_is_reported(cache: Path) -> None:
    k = toy(cache)
    runner = KernelRunner(k.device)
    runner.add(k)
    k(0, 0, 0)
    good = k.config_id
    runner.set_config("toy", {"block_size_x": 256, "tile_size_x": 4})  # the node's switch
    for _ in range(3):
        k(0, 0, 0)  # never raises: records a failure, runs the last good config
    chunks = runner.tick(0.0)
    assert [(c.config_id, list(c.ok)) for c in chunks] == [
        (good, [True]),
        ("block_size_x=256,tile_size_x=4", [False]),
        (good, [True]),
        ("block_size_x=256,tile_size_x=4", [False]),
        (good, [True]),
        ("block_size_x=256,tile_size_x=4", [False]),
        (good, [True]),
    ]
    assert [c.seq_start for c in chunks] == list(range(7))
    assert "CompilationFailedConfig" in k.failures["block_size_x=256,tile_size_x=4"]


def test_switches_take_effect_between_calls_and_durations_are_measured(cache: Path) -> None:
    k = toy(cache)
    runner = KernelRunner(k.device)
    runner.add(k)
    for _ in range(5):
        k(0, 0, 0)
    runner.set_config("toy", {"block_size_x": 64, "tile_size_x": 2})
    for _ in range(4):
        k(0, 0, 0)
    first, second = runner.tick(0.0)
    assert (len(first.ok), len(second.ok)) == (5, 4)
    assert second.config_id == "block_size_x=64,tile_size_x=2"
    # toy cache: config index 4 -> 1.25 ms +-1% (in us)
    assert np.all(np.abs(second.duration_us - 1250.0) <= 13.0)
    assert np.all(np.diff(np.concatenate([first.t_end, second.t_end])) > 0)
    assert runner.tick(0.0) == []
    with pytest.raises(KernelDefinitionError, match=r"node.apply\(rec\)"):
        k.use({"block_size_x": 32, "tile_size_x": 1})
    runner.detach_all()
    k.use({"block_size_x": 32, "tile_size_x": 1})
    assert k.config_id == "block_size_x=32,tile_size_x=1"


def test_two_kernels_of_one_name_on_one_node_are_refused(cache: Path) -> None:
    a, b = toy(cache), toy(cache)
    runner = KernelRunner(a.device)
    runner.add(a)
    with pytest.raises(KernelDefinitionError, match="already runs a kernel named 'toy'"):
        runner.add(b)


def test_the_api_is_imported_lazily() -> None:
    import subprocess
    import sys

    code = (
        "import sys, kernelstream; "
        "print(any(m.startswith('kernelstream.kernels') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert set(kernelstream.__all__) >= {"TunableKernel", "trace_device", "Node"}


@pytest.mark.realdata
def test_the_rtx_3090_gemm_cache_declares_as_a_kernel() -> None:
    path = default_tuning_spaces_dir() / "gemm_RTX_3090.json.gz"
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    k = TunableKernel(
        "Xgemm",
        "__global__ void Xgemm(const int kSizeM, const int kSizeN, const int kSizeK, "
        "const float alpha, const float beta, const float *agm, const float *bgm, float *cgm) {}",
        tuple(doc["problem_size"]),
        doc["tune_params"],
        block_size_names=["MDIMC", "NDIMC"],
        grid_div_x=["MWG"],
        grid_div_y=["NWG"],
        device=kernelstream.trace_device(path),
    )
    measured = sum(1 for r in doc["cache"].values() if not isinstance(r["time"], str))
    assert k.space.size() >= measured
    assert k.device.prepare(k.workload, k.config).failure is None


def test_a_declared_space_reaches_the_worker_resolver_over_a_cache(
    tmp_path: Path, cache: Path
) -> None:
    from kernelstream.kernels.resolve import SpaceResolver

    spaces = tmp_path / "spaces"
    spaces.mkdir()
    (spaces / cache.name).symlink_to(cache)  # the cache alone: all 12 points
    resolver = SpaceResolver(spaces)
    assert resolver.space_for("toy", (1024,)).size() == 12
    k = toy(cache, restrictions=["block_size_x * tile_size_x <= 128"])
    path = k.write_space(spaces)
    # A fresh resolver (a worker started later) and the running one (its folder changed)
    # both take the kernel's declared space: measured, and within its restrictions.
    for r in (SpaceResolver(spaces), resolver):
        space = r.space_for("toy", (1024,))
        assert {space.config_id(c) for c in space} == {k.space.config_id(c) for c in k.space}
        assert space.size() == 6
    path.write_text("{not json")
    broken = SpaceResolver(spaces)
    assert broken.space_for("toy", (1024,)).size() == 12  # skipped with its reason
    with pytest.raises(LookupError, match=r"toy\.space\.json: not a readable declared-space"):
        broken.space_for("nope", (1,))


def test_copies_a_kernel_reports_travel_with_its_launches(cache: Path) -> None:
    from kernelstream.kernels.runner import LaunchBatcher
    from kernelstream.schemas.columnar import decode_launch_columns

    k = toy(cache)
    k.record_copy("h2d", 1 << 20, 80.0, pinned=False)  # no node yet: nothing kept
    runner = KernelRunner(k.device)
    runner.add(k)
    for _ in range(3):
        k.record_copy("h2d", 1 << 20, 80.0, pinned=False)
        k(0, 0, 0)
        k.record_copy("d2h", 4096, 2.0, pinned=True, stream=3)
    (chunk,) = runner.tick(0.0)
    assert chunk.copies is not None
    # each copy goes with the first launch that ends after it (the trace device queues
    # launches ahead of the host clock, as a GPU does)
    launch = chunk.copies["launch"]
    assert launch == sorted(launch) and max(launch) < 3
    batcher = LaunchBatcher(runner.device, "n1")
    batcher.add(chunk, 0.0)
    (batch,) = batcher.flush()
    cols = decode_launch_columns(batch.wire())
    assert cols.copies is not None and cols.host_gap_us is not None
    assert cols.copies.direction == ["h2d", "d2h"] * 3
    assert cols.copies.stream == [0, 3] * 3 and cols.copies.pinned == [0, 1] * 3
    runner.detach_all()


def test_host_gaps_and_waits_of_a_users_kernel_travel_with_its_launches(cache: Path) -> None:
    import time

    from kernelstream.agents.logic.transfers import summarize, transfer_findings
    from kernelstream.kernels.devices import get_device_spec
    from kernelstream.kernels.runner import LaunchBatcher
    from kernelstream.schemas.columnar import decode_launch_columns

    k = toy(cache)
    k.record_wait()  # no node yet: nothing kept
    runner = KernelRunner(k.device)
    runner.add(k)
    k(0, 0, 0)
    time.sleep(0.005)
    k.record_wait()
    k(0, 0, 0)
    k(0, 0, 0)
    (chunk,) = runner.tick(0.0)
    assert chunk.host_gap_us is not None and chunk.host_waited is not None
    assert chunk.host_gap_us[0] == 0.0  # the first launch the node saw
    assert chunk.host_gap_us[1] >= 5000.0  # the sleep, measured on the host clock
    assert chunk.host_waited.tolist() == [False, True, False]
    batcher = LaunchBatcher(runner.device, "n1")
    batcher.add(chunk, 0.0)
    (batch,) = batcher.flush()
    cols = decode_launch_columns(batch.wire())
    assert cols.host_waited is not None and cols.host_waited.tolist() == [0, 1, 0]
    # A step that waits before every launch is found, as for the node's own kernels.
    for _ in range(20):
        k.record_wait()
        k(0, 0, 0)
    chunks = runner.tick(1.0)
    batcher.add(chunks[0], 1.0)
    s = summarize([decode_launch_columns(b.wire()) for b in batcher.flush()])
    assert s is not None and s.waited == 20
    found = transfer_findings(s, get_device_spec("A100-PCIE-40GB"), chunks[0].config)
    assert "host_sync" in {f.classification for f in found}
    runner.detach_all()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("sideways", 1, 1.0), "copy direction 'sideways'"),
        (("h2d", -1, 1.0), "copy size -1"),
        (("h2d", 1, -2.0), "copy duration -2.0"),
        (("h2d", 1, float("nan")), "copy duration nan"),
    ],
)
def test_a_copy_that_is_not_one_is_refused_at_the_call(
    cache: Path, args: tuple[str, int, float], needle: str
) -> None:
    with pytest.raises(KernelArgumentError, match=needle):
        toy(cache).record_copy(*args, pinned=True)
