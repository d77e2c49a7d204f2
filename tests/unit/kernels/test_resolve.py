"""SpaceResolver: a workload's declared space from built-ins or the cache files of a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kernelstream.kernels.backends.trace as trace
from kernelstream.kernels.resolve import SpaceResolver


def _cache(path: Path, kernel: str, size: list[int], tiles: tuple[int, ...] = (1, 2)) -> Path:
    """A 2x2 space, or only the ``tiles`` given measured (a partial cache)."""
    params = {"block_size_x": [32, 64], "tile": [1, 2]}
    cache = {
        f"{bx},{t}": {"block_size_x": bx, "tile": t, "time": 1.0 + bx / 64 + t}
        for bx in params["block_size_x"]
        for t in tiles
    }
    doc = {
        "device_name": "NVIDIA A100-PCIE-40GB",
        "kernel_name": kernel,
        "problem_size": size,
        "tune_params_keys": list(params),
        "tune_params": params,
        "cache": cache,
    }
    path.write_text(json.dumps(doc))
    return path


def test_built_in_workloads_need_no_folder(tmp_path: Path) -> None:
    space = SpaceResolver(tmp_path / "absent").space_for("matmul", (512,))
    assert space.size() > 1


def test_a_broken_file_does_not_hide_the_others(tmp_path: Path) -> None:
    (tmp_path / "a-broken.json").write_text('{"kernel_name": "half a file", ')
    _cache(tmp_path / "b.json", "scale", [1024])
    (tmp_path / "scale.T1.json").write_text("{}")  # T1 files describe, they are not caches
    resolver = SpaceResolver(tmp_path)
    assert resolver.space_for("scale", (1024,)).size() == 4
    with pytest.raises(LookupError, match=r"declared-space file for it .*skipped a-broken.json"):
        resolver.space_for("scale", (2048,))


def test_a_lookup_parses_only_its_kernels_files_and_misses_read_nothing_again(
    tmp_path: Path, cache_reads: list[str]
) -> None:
    reads = cache_reads
    _cache(tmp_path / "a.json", "scale", [1024])
    _cache(tmp_path / "b.json", "shift", [1024])
    resolver = SpaceResolver(tmp_path)
    for _ in range(3):
        with pytest.raises(LookupError, match="unknown workload 'nobody'"):
            resolver.space_for("nobody", (1,))
    assert reads == []  # their headers name other kernels: neither file is parsed
    assert resolver.space_for("shift", (1024,)).size() == 4
    assert resolver.space_for("shift", (1024,)).size() == 4
    assert reads == ["b.json"]  # only the file of that kernel, once
    # A file added later is found: the listing changed, so the index starts anew.
    _cache(tmp_path / "c.json", "nobody", [1])
    assert resolver.space_for("nobody", (1,)).size() == 4
    assert reads == ["b.json", "c.json"]


def test_one_kernel_in_two_files_is_the_union(tmp_path: Path) -> None:
    # A session on a second GPU that measured only tile 1 so far sorts first.
    _cache(tmp_path / "a-partial.json", "scale", [1024], tiles=(1,))
    _cache(tmp_path / "b-full.json", "scale", [1024])
    space = SpaceResolver(tmp_path).space_for("scale", (1024,))
    assert space.size() == 4
    assert space.is_valid({"block_size_x": 64, "tile": 2})


def test_one_kernel_name_with_other_parameters_is_another_space(tmp_path: Path) -> None:
    # A later version of the kernel gained a parameter; both versions' caches are here.
    _cache(tmp_path / "a-v1.json", "scale", [1024])
    doc = json.loads(_cache(tmp_path / "b-v2.json", "scale", [1024]).read_text())
    doc["tune_params"]["unroll"] = [1, 4]
    doc["tune_params_keys"].append("unroll")
    doc["cache"] = {f"{k},{u}": {**v, "unroll": u} for k, v in doc["cache"].items() for u in (1, 4)}
    (tmp_path / "b-v2.json").write_text(json.dumps(doc))
    resolver = SpaceResolver(tmp_path)
    v1 = {"block_size_x": 64, "tile": 2}
    v2 = {**v1, "unroll": 4}
    assert resolver.space_for("scale", (1024,)).size() == 4  # no config: the first file's
    assert resolver.space_for("scale", (1024,), v1).is_valid(v1)
    assert resolver.space_for("scale", (1024,), v2).is_valid(v2)
    # host knobs a node run under a host pattern adds are not the kernel's parameters
    assert resolver.space_for("scale", (1024,), {**v2, "pinned": 1}).size() == 8


def test_the_shared_convolution_caches_of_two_kernel_versions_both_resolve() -> None:
    from kernelstream.agents.context import WorkerContext
    from kernelstream.agents.logic.windowing import make_example_batch
    from kernelstream.app.settings import Settings
    from kernelstream.kernels import default_tuning_spaces_dir
    from kernelstream.kernels.backends.trace import load_cache

    folder = Path(default_tuning_spaces_dir())
    files = [folder / "convolution_RTX_3090.json.gz", folder / "convolution_milo_A100.json.gz"]
    if not all(f.exists() for f in files):
        pytest.skip(f"the shared tuning spaces are not in {folder}")
    ctx = WorkerContext(Settings(tuning_spaces_dir=folder), {})
    for f in files:
        cache = load_cache(f)
        config = cache.space.start_config()
        size = list(cache.problem_size)
        batch = make_example_batch([1.0], kernel=cache.name, problem_size=size, config=config)
        assert batch.workload == cache.name and ctx.known_workload(cache.name, size)
        assert ctx.config_problem(batch) is None, f.name


@pytest.mark.realdata
def test_each_kernel_resolves_as_from_every_file_of_the_measured_spaces(
    real_spaces: Path,
) -> None:
    # Per kernel, only the files whose header names it are parsed; the spaces are the
    # ones every file of the folder, merged in order, gives.
    from kernelstream.kernels.resolve import _merge

    everything: dict[tuple[str, tuple[int, ...]], list[Any]] = {}
    traces, skipped = trace.load_caches_in(real_spaces)
    for t in traces:
        _merge(everything, t)
    assert everything and not skipped
    resolver = SpaceResolver(real_spaces)
    for (name, size), spaces in everything.items():
        for space in spaces:
            got = resolver.space_for(name, size, space.start_config())
            assert (dict(got.params), got.allowed) == (dict(space.params), space.allowed)


def test_names_nothing_declares_are_not_remembered(tmp_path: Path, cache_reads: list[str]) -> None:
    # A worker looks up the workload of every launch batch it has not placed yet: hostile
    # or mistaken names must not grow the resolver, nor read a file twice.
    _cache(tmp_path / "a.json", "scale", [1024])
    (tmp_path / "b-broken.json").write_text('{"kernel_name": "half a file", ')
    resolver = SpaceResolver(tmp_path)
    for i in range(200):
        with pytest.raises(LookupError):
            resolver.space_for(f"nobody-{i}", (1,))
    assert resolver._indexed == set() and resolver._index == {}
    assert cache_reads == ["b-broken.json"]  # the file whose header says nothing, once
    assert resolver.space_for("scale", (1024,)).size() == 4
    assert cache_reads == ["b-broken.json", "a.json"]
