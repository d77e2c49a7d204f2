"""The Kernel Tuner peers of ``kernelstream bench tuning`` give the same run for the same seed.

Without it a peer's row moves between two runs of the benchmark on its own, and a
comparison of one tuner change against the peers is noise. Kernel Tuner is a bench extra.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from kernelstream.bench.tuning import _run_kt

pytest.importorskip("kernel_tuner", reason="Kernel Tuner is a bench extra: pip install '.[bench]'")


def _plain_cache(path: Path) -> Path:
    """An uncompressed Kernel Tuner cache (as the benchmark hands Kernel Tuner) of 256
    configurations with a rugged made-up duration, large enough for bayes_opt's initial
    sample of 20."""
    params: dict[str, list[Any]] = {
        "block_size_x": [16, 32, 64, 128],
        "block_size_y": [1, 2, 4, 8],
        "tile_size_x": [1, 2, 3, 4],
        "use_shmem": [0, 1],
        "read_only": [0, 1],
    }
    cache: dict[str, Any] = {}
    for i, values in enumerate(itertools.product(*params.values())):
        ms = 1.0 + ((i * 97) % 256) / 64.0  # every duration distinct
        rec = dict(zip(params, values, strict=True)) | {"time": ms, "times": [ms, ms]}
        cache[",".join(str(v) for v in values)] = rec
    doc = {
        "device_name": "NVIDIA A100-PCIE-40GB",
        "kernel_name": "toy",
        "problem_size": [1024],
        "tune_params_keys": list(params),
        "tune_params": params,
        "objective": "time",
        "cache": cache,
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize("strategy", ["nsga2", "bayes_opt", "genetic_algorithm"])
def test_a_peer_repeats_its_run_for_a_seed(tmp_path: Path, strategy: str) -> None:
    # nsga2 seeds from Kernel Tuner's ``seed`` and bayes_opt's initial Latin hypercube from
    # nothing that the global generators reach: both differed from run to run before.
    cache = str(_plain_cache(tmp_path / "toy.json"))
    first = _run_kt(cache, strategy, seed=4, budget=40)["curve"]
    again = _run_kt(cache, strategy, seed=4, budget=40)["curve"]
    assert len(first) == 40
    assert first == again
    others = [_run_kt(cache, strategy, seed=s, budget=40)["curve"] for s in (5, 6)]
    assert any(o != first for o in others)  # the seed is used, not a constant stream
