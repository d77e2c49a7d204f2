"""Sweeps write Kernel Tuner cache files that the trace backend (and Kernel Tuner) load."""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernelstream.kernels import get_workload, load_cache, open_device
from kernelstream.kernels.backends.base import LaunchResult
from kernelstream.kernels.backends.trace import TraceDevice
from kernelstream.kernels.space import Config, ParamValue
from kernelstream.kernels.sweep import (
    COMPILE_FAILED,
    RUNTIME_FAILED,
    cache_document,
    cache_key,
    sweep,
    write_cache,
)
from kernelstream.kernels.workloads.base import Workload

_KEYS = {"device_name", "kernel_name", "problem_size", "tune_params_keys", "tune_params"}


def _small(name: str) -> Any:
    w = get_workload(name)
    return w.resized(w.SMALL_SIZE)


def test_sim_sweep_document_has_kernel_tuner_shape(tmp_path: Path) -> None:
    w = _small("transpose")
    dev = open_device("sim", model="H200-SXM-141GB", seed=3)
    result = sweep(dev, w, iterations=5)
    doc = cache_document(result)
    assert _KEYS | {"objective", "cache"} == set(doc)
    assert doc["device_name"] == "H200-SXM-141GB" and doc["kernel_name"] == "transpose"
    assert doc["problem_size"] == list(w.SMALL_SIZE)
    assert doc["tune_params_keys"] == list(w.space.params)
    assert len(doc["cache"]) == w.space.size() == len(result.times_ms)
    for key, entry in doc["cache"].items():
        assert key == cache_key(doc["tune_params_keys"], entry)
        assert len(entry["times"]) == 5
        assert entry["time"] == pytest.approx(np.mean(entry["times"]))
        assert entry["GB/s"] > 0
    # the reference file format, for comparison: same top-level keys
    path = write_cache(doc, tmp_path / "t.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        assert json.load(fh) == doc


def test_round_trip_through_the_trace_backend(tmp_path: Path) -> None:
    w = _small("stencil2d")
    result = sweep(open_device("sim", model="L4", seed=1), w, iterations=4)
    path = write_cache(cache_document(result), tmp_path / "stencil.json.gz")
    space = load_cache(path)
    assert space.name == "stencil2d" and space.builtin is not None
    assert space.default == w.default and "built-in" in space.start_note
    assert space.space.size() == w.space.size()
    dev = TraceDevice(path, seed=2)
    assert dev.spec.name == "L4"
    (tw,) = dev.workloads()
    for cid, times in list(result.times_ms.items())[:10]:
        config = result.configs[cid]
        r = dev.launch(tw, config, 20)
        assert r.ok.all()
        assert set(np.round(r.duration_us, 6)) <= set(np.round(np.asarray(times) * 1000.0, 6))
        # the built-in cost model and geometry, not the generic trace one
        assert tw.bytes_moved(config) == w.bytes_moved(config)
        assert dev.plan(tw, config).grid == w.geometry(config).grid


class _Flaky:
    """A sim device on which one config fails at run time and one fails to compile."""

    backend = "sim"

    def __init__(self, runtime_bad: str, compile_bad: str) -> None:
        self._sim = open_device("sim", model="A100-SXM4-80GB")
        self.spec = self._sim.spec
        self.device_index = 0
        self.runtime_bad, self.compile_bad = runtime_bad, compile_bad
        self.launched: list[str] = []

    def precompile(self, workload: Workload, configs: list[Config], workers: int) -> dict:
        assert workers == 3
        return {self.compile_bad: "NVRTCError: boom"}

    def launch(self, workload: Workload, config: Mapping[str, ParamValue], n: int) -> LaunchResult:
        cid = workload.space.config_id(config)
        self.launched.append(cid)
        if cid == self.runtime_bad:
            return LaunchResult.failed(n)
        return self._sim.launch(workload, config, n)

    def failure_reason(self, workload: Workload, config: Mapping[str, ParamValue]) -> str:
        return "CUDADriverError: too many resources requested"


def test_failed_configs_carry_kernel_tuner_error_strings(tmp_path: Path) -> None:
    w = _small("transpose")
    ids = [w.space.config_id(c) for c in w.space]
    dev = _Flaky(runtime_bad=ids[1], compile_bad=ids[2])
    done: list[tuple[int, int]] = []
    result = sweep(
        dev, w, iterations=3, compile_workers=3, progress=lambda a, b: done.append((a, b))
    )
    assert done[-1] == (len(ids), len(ids))
    assert ids[2] not in dev.launched  # a config that did not compile is never launched
    assert result.failed == {ids[1]: RUNTIME_FAILED, ids[2]: COMPILE_FAILED}
    assert "too many resources" in result.reasons[ids[1]]
    doc = cache_document(result)
    by_id = {w.space.config_id(e): e for e in doc["cache"].values()}
    assert by_id[ids[1]]["time"] == RUNTIME_FAILED and "times" not in by_id[ids[1]]
    trace = TraceDevice(write_cache(doc, tmp_path / "f.json"))
    (tw,) = trace.workloads()
    assert not trace.launch(tw, result.configs[ids[1]], 2).ok.any()
    assert trace.launch(tw, result.configs[ids[0]], 2).ok.all()


def test_kernel_tuner_reads_the_file(tmp_path: Path) -> None:
    util = pytest.importorskip("kernel_tuner.util")
    w = _small("transpose")
    ids = [w.space.config_id(c) for c in w.space]
    result = sweep(_Flaky(ids[0], ids[1]), w, iterations=2, compile_workers=3)
    path = write_cache(cache_document(result), tmp_path / "kt.json")
    data = util.read_cache(str(path), open_cache=False)
    assert len(data["cache"]) == len(ids)
    errors = [e for e in data["cache"].values() if "__error__" in e]
    assert len(errors) == 2


def test_sweep_rejects_zero_iterations() -> None:
    with pytest.raises(ValueError, match="iterations"):
        sweep(open_device("sim"), _small("transpose"), iterations=0)


def test_a_stopped_sweep_keeps_what_it_measured(tmp_path: Path) -> None:
    w = _small("transpose")
    done: list[int] = []
    result = sweep(
        open_device("sim"),
        w,
        iterations=2,
        compile_chunk=4,
        progress=lambda a, b: done.append(a),
        stop=lambda: len(done) >= 7,
    )
    assert not result.complete and result.total == w.space.size()
    assert len(result.configs) == len(result.times_ms) == 7
    trace = TraceDevice(write_cache(cache_document(result), tmp_path / "partial.json.gz"))
    (tw,) = trace.workloads()
    assert tw.space.size() == 7
