"""Brute-force sweeps of a workload's search space into a Kernel Tuner cache file.

:func:`sweep` runs every valid configuration of a workload on any device backend
(``cupy`` on a real GPU; ``sim`` for a model's view and for CI) and
:func:`cache_document` turns the measurements into the JSON document Kernel Tuner
writes (and the files in ``../shared/data/tuning-spaces/`` hold): ``device_name``,
``kernel_name``, ``problem_size``, ``tune_params_keys``, ``tune_params``,
``objective`` and ``cache``, one entry per configuration keyed by its values
joined with commas, with ``time`` (mean, ms) and ``times`` (every launch, ms),
or a Kernel Tuner error string (``CompilationFailedConfig``,
``RuntimeFailedConfig``) as ``time`` for a configuration that failed.

``kernel_name`` is the kernelstream workload name (``matmul``, ...), so a
``trace`` device built from the file runs under the same workload name, space
and cost model as the built-in workload (:func:`kernels.load_cache`).

>>> from kernels import get_workload, open_device
>>> w = get_workload("stencil2d", (1024, 1024))
>>> dev = open_device("sim", model="A100-SXM4-80GB")
>>> result = sweep(dev, w, iterations=3)
>>> doc = cache_document(result)
>>> doc["kernel_name"], len(doc["cache"]) == w.space.size()
('stencil2d', True)
"""

from __future__ import annotations

import gzip
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from kernelstream.kernels.space import Config
from kernelstream.kernels.workloads.base import Workload

__all__ = [
    "COMPILE_FAILED",
    "RUNTIME_FAILED",
    "SweepResult",
    "cache_document",
    "cache_key",
    "default_sweep_path",
    "sweep",
    "write_cache",
]

COMPILE_FAILED = "CompilationFailedConfig"
RUNTIME_FAILED = "RuntimeFailedConfig"


@dataclass
class SweepResult:
    """What one sweep measured: per config id, launch times (ms) or a failure string."""

    device_name: str
    backend: str
    workload: Workload
    iterations: int
    times_ms: dict[str, list[float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    configs: dict[str, Config] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    started_at: str = ""
    seconds: float = 0.0
    total: int = 0

    @property
    def complete(self) -> bool:
        """Whether every configuration asked for was measured (or failed)."""
        return len(self.configs) >= self.total

    @property
    def best(self) -> tuple[str, float] | None:
        """(config id, mean ms) of the fastest configuration, or None."""
        means = {cid: float(np.mean(t)) for cid, t in self.times_ms.items()}
        if not means:
            return None
        cid = min(means, key=lambda c: means[c])
        return cid, means[cid]


def cache_key(keys: Iterable[str], config: Mapping[str, Any]) -> str:
    """Kernel Tuner's cache key: the parameter values in key order, joined with commas.

    >>> cache_key(["a", "b"], {"b": 2, "a": 16})
    '16,2'
    """
    return ",".join(str(config[k]) for k in keys)


def _device_name(device: Any) -> str:
    return str(getattr(device, "device_name", None) or device.spec.name)


def sweep(
    device: Any,
    workload: Workload,
    *,
    iterations: int = 32,
    warmup: int = 1,
    configs: Iterable[Config] | None = None,
    progress: Callable[[int, int], None] | None = None,
    compile_workers: int = 8,
    compile_chunk: int = 64,
    stop: Callable[[], bool] | None = None,
) -> SweepResult:
    """Launch every configuration (default: every valid one of the workload's space).

    Each configuration runs ``warmup`` launches that are not recorded (module
    load, caches), then ``iterations`` timed launches back to back. A device
    with a ``precompile`` method (cupy) compiles the configurations ahead of
    running them, ``compile_chunk`` at a time on ``compile_workers`` threads.
    ``progress(done, total)`` is called after each configuration; when ``stop()``
    turns true the sweep ends early and the result holds what was measured
    (``complete`` False), which is still a valid cache file.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    todo = list(workload.space if configs is None else configs)
    result = SweepResult(
        device_name=_device_name(device),
        backend=str(device.backend),
        workload=workload,
        iterations=iterations,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        total=len(todo),
    )
    start = time.monotonic()
    precompile = getattr(device, "precompile", None)
    chunk = max(1, compile_chunk)
    for first in range(0, len(todo), chunk):
        if stop is not None and stop():
            break
        part = todo[first : first + chunk]
        compile_errors: dict[str, str] = {}
        if callable(precompile):
            compile_errors = dict(precompile(workload, part, workers=compile_workers))
        for i, config in enumerate(part, start=first):
            if stop is not None and stop():
                break
            _measure(device, workload, config, result, compile_errors, warmup, iterations)
            if progress is not None:
                progress(i + 1, len(todo))
    result.seconds = time.monotonic() - start
    return result


def _measure(
    device: Any,
    workload: Workload,
    config: Config,
    result: SweepResult,
    compile_errors: Mapping[str, str],
    warmup: int,
    iterations: int,
) -> None:
    cid = workload.space.config_id(config)
    result.configs[cid] = dict(config)
    if cid in compile_errors:
        result.failed[cid] = COMPILE_FAILED
        result.reasons[cid] = compile_errors[cid]
        return
    if warmup > 0:
        device.launch(workload, config, warmup)
    r = device.launch(workload, config, iterations)
    if len(r) and bool(r.ok.all()):
        result.times_ms[cid] = [float(us) / 1000.0 for us in r.duration_us]
        return
    result.failed[cid] = RUNTIME_FAILED
    reason = getattr(device, "failure_reason", None)
    why = reason(workload, config) if callable(reason) else None
    result.reasons[cid] = why or "launch failed"


def cache_document(result: SweepResult) -> dict[str, Any]:
    """The Kernel Tuner cache document of a sweep (see the module docstring)."""
    w = result.workload
    keys = list(w.space.params)
    cache: dict[str, dict[str, Any]] = {}
    for cid, config in result.configs.items():
        entry: dict[str, Any] = {k: config[k] for k in keys}
        times = result.times_ms.get(cid)
        if times is not None:
            mean_ms = float(np.mean(times))
            entry["time"] = mean_ms
            entry["times"] = times
            seconds = mean_ms / 1000.0
            flops, nbytes = float(w.flops(config)), float(w.bytes_moved(config))
            if seconds > 0 and math.isfinite(seconds):
                entry["GFLOP/s"] = flops / seconds / 1e9
                entry["GB/s"] = nbytes / seconds / 1e9
        else:
            entry["time"] = result.failed.get(cid, RUNTIME_FAILED)
        entry["timestamp"] = result.started_at
        cache[cache_key(keys, config)] = entry
    return {
        "device_name": result.device_name,
        "kernel_name": w.name,
        "problem_size": list(w.problem_size),
        "tune_params_keys": keys,
        "tune_params": {k: list(v) for k, v in w.space.params.items()},
        "objective": "time",
        "cache": cache,
    }


def write_cache(doc: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``doc`` as JSON, gzip-compressed when ``path`` ends in ``.gz``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    if p.name.endswith(".gz"):
        # mtime=0: the same sweep gives the same bytes.
        with p.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
            fh.write(text.encode("utf-8"))
    else:
        p.write_text(text, encoding="utf-8")
    return p


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text.replace("NVIDIA", "")).strip("-") or "device"


def default_sweep_path(
    directory: str | Path, device_name: str, workload: str, date: str | None = None
) -> Path:
    """``<dir>/sweep-<workload>-<device>-<YYYY-MM-DD>.json.gz``.

    >>> default_sweep_path("out", "NVIDIA H200", "matmul", "2026-11-22").as_posix()
    'out/sweep-matmul-H200-2026-11-22.json.gz'
    """
    day = date or datetime.now(UTC).date().isoformat()
    return Path(directory) / f"sweep-{workload}-{_slug(device_name)}-{day}.json.gz"
