"""Kernel Tuner cache files the tests make themselves (a toy one: 12 configs, one failed)."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any


def write_kt_cache(
    path: Path,
    params: dict[str, list[Any]],
    cache: dict[str, dict[str, Any]],
    kernel_name: str,
    problem_size: list[int],
    device_name: str = "NVIDIA A100-PCIE-40GB",
) -> None:
    """A gzipped Kernel Tuner cache file (on an A100 unless told) with these entries."""
    doc = {
        "device_name": device_name,
        "kernel_name": kernel_name,
        "problem_size": problem_size,
        "tune_params_keys": list(params),
        "tune_params": params,
        "objective": "time",
        "cache": cache,
    }
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)


def write_toy_cache(path: Path, device_name: str = "NVIDIA A100-PCIE-40GB") -> dict[str, float]:
    """Write the cache to ``path``; returns each valid config's true mean (us) by config id."""
    params = {"block_size_x": [32, 64, 128, 256], "tile_size_x": [1, 2, 4]}
    cache: dict[str, Any] = {}
    truth = {}
    for i, (bx, tx) in enumerate(itertools.product(*params.values())):
        rec: dict[str, Any] = {"block_size_x": bx, "tile_size_x": tx}
        if (bx, tx) == (256, 4):
            rec["time"] = "CompilationFailedConfig"
        else:
            ms = 1.0 + abs(i - 5) * 0.25
            rec.update(time=ms, times=[ms * 0.99, ms * 1.01])
            truth[f"block_size_x={bx},tile_size_x={tx}"] = ms * 1000.0
        cache[f"{bx},{tx}"] = rec
    write_kt_cache(path, params, cache, "toy", [1024], device_name)
    return truth
