"""Find the declared search space of a workload by name, for workers and replay.

Built-in workloads come from :mod:`kernels.workloads`; any other name is looked
up among the Kernel Tuner cache files of the tuning-spaces directory (a trace
workload is named by its cache's ``kernel_name``).
"""

from __future__ import annotations

from pathlib import Path

from kernels.space import SearchSpace

__all__ = ["SpaceResolver"]


class SpaceResolver:
    """Caches spaces by (workload, problem size); raises LookupError for unknown ones."""

    def __init__(self, tuning_spaces_dir: Path | None = None) -> None:
        self._dir = tuning_spaces_dir
        self._cache: dict[tuple[str, tuple[int, ...]], SearchSpace] = {}

    def space_for(self, workload: str, problem_size: tuple[int, ...]) -> SearchSpace:
        key = (workload, tuple(problem_size))
        if key not in self._cache:
            self._cache[key] = self._find(workload, key[1])
        return self._cache[key]

    def _find(self, workload: str, problem_size: tuple[int, ...]) -> SearchSpace:
        from kernels import WORKLOAD_NAMES, default_tuning_spaces_dir, get_workload, load_cache

        if workload in WORKLOAD_NAMES:
            return get_workload(workload, problem_size).space
        d = self._dir or default_tuning_spaces_dir()
        if d is not None and Path(d).is_dir():
            for path in sorted(Path(d).glob("*.json*")):
                if path.name.endswith(".T1.json"):
                    continue
                trace = load_cache(path)
                if trace.name == workload and tuple(trace.problem_size) == problem_size:
                    return trace.space
        raise LookupError(
            f"unknown workload {workload!r} with problem size {problem_size}: not built in "
            f"({', '.join(WORKLOAD_NAMES)}) and no cache file for it in {d}"
        )
