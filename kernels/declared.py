"""Declared-space files: a user kernel's search space as the worker reads it.

A worker's tuner proposes only configurations of a kernel's declared space, which it
finds by (kernel name, problem size) in its tuning-spaces folder. Built-in workloads and
Kernel Tuner caches are found there already; a user's own kernel is written there as a
``<kernel>.space.json`` file: its parameters and values, its default and the list of its
valid configurations (restrictions given as callables cannot travel as text, so the
valid points are listed, as a trace space lists its measured ones).

>>> import tempfile
>>> from kernelstream.kernels.workloads.user import UserWorkload
>>> w = UserWorkload("k", "__global__ void k(int n) {}", 64, {"b": [32, 64, 128]},
...                  restrictions=["b > 32"])
>>> with tempfile.TemporaryDirectory() as d:
...     name, size, space = read_space(write_space(w, d))
>>> name, size, space.size(), space.start_config()
('k', (64,), 2, {'b': 64})
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernelstream.kernels.errors import KernelDefinitionError
from kernelstream.kernels.space import SearchSpace
from kernelstream.kernels.workloads.user import UserWorkload

__all__ = ["SPACE_SUFFIX", "read_space", "space_files_in", "write_space"]

SPACE_SUFFIX = ".space.json"
_FORMAT = "kernelstream-space/1"


def write_space(workload: UserWorkload, directory: str | Path) -> Path:
    """Write ``workload``'s declared space under ``directory``; returns the file.

    Written to a temporary name and renamed, so a worker never reads half a file.
    """
    space = workload.space
    names = list(space.params)
    doc = {
        "format": _FORMAT,
        "kernel_name": workload.name,
        "problem_size": list(workload.problem_size),
        "tune_params": {p: list(v) for p, v in space.params.items()},
        "default": workload.default,
        "configs": [[c[p] for p in names] for c in space],
    }
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / f"{workload.name}{SPACE_SUFFIX}"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
    tmp.replace(path)
    return path


def read_space(path: str | Path) -> tuple[str, tuple[int, ...], SearchSpace]:
    """(kernel name, problem size, declared space) of a declared-space file."""
    p = Path(path)
    try:
        doc: Any = json.loads(p.read_text(encoding="utf-8"))
        if doc.get("format") != _FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {_FORMAT!r}")
        name = str(doc["kernel_name"])
        size = tuple(int(x) for x in doc["problem_size"])
        params = {str(k): list(v) for k, v in doc["tune_params"].items()}
        probe = SearchSpace(name, params, default={k: v[0] for k, v in params.items()})
        keys = list(params)
        allowed = frozenset(
            probe.config_id(dict(zip(keys, values, strict=True))) for values in doc["configs"]
        )
        space = SearchSpace(name, params, default=dict(doc["default"]), allowed=allowed)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as ex:
        raise KernelDefinitionError(f"{p}: not a readable declared-space file: {ex}") from ex
    return name, size, space


def space_files_in(directory: str | Path | None) -> list[Path]:
    """The declared-space files of a folder, by name."""
    if directory is None or not Path(directory).is_dir():
        return []
    return sorted(p for p in Path(directory).iterdir() if p.name.endswith(SPACE_SUFFIX))
