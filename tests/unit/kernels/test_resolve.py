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


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = trace.load_cache

    def counted(path: Any) -> Any:
        reads.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(trace, "load_cache", counted)
    return reads


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


def test_misses_do_not_read_the_folder_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _counting(monkeypatch)
    _cache(tmp_path / "a.json", "scale", [1024])
    _cache(tmp_path / "b.json", "shift", [1024])
    resolver = SpaceResolver(tmp_path)
    for _ in range(3):
        with pytest.raises(LookupError, match="unknown workload 'nobody'"):
            resolver.space_for("nobody", (1,))
    assert sorted(reads) == ["a.json", "b.json"]  # once, for the first miss
    assert resolver.space_for("shift", (1024,)).size() == 4
    assert len(reads) == 2  # answered from the index
    # A file added later is found: the listing changed, so the folder is read again.
    _cache(tmp_path / "c.json", "nobody", [1])
    assert resolver.space_for("nobody", (1,)).size() == 4
    assert sorted(reads) == ["a.json", "a.json", "b.json", "b.json", "c.json"]


def test_one_kernel_in_two_files_is_the_union(tmp_path: Path) -> None:
    # A session on a second GPU that measured only tile 1 so far sorts first.
    _cache(tmp_path / "a-partial.json", "scale", [1024], tiles=(1,))
    _cache(tmp_path / "b-full.json", "scale", [1024])
    space = SpaceResolver(tmp_path).space_for("scale", (1024,))
    assert space.size() == 4
    assert space.is_valid({"block_size_x": 64, "tile": 2})
