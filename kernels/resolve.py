"""Find the declared search space of a workload by name, for workers and replay.

Built-in workloads come from :mod:`kernels.workloads`; any other name is looked
up among the declared-space files (a user's own kernel, :mod:`kernels.declared`) and the
Kernel Tuner cache files of the tuning-spaces directory (a trace workload is named by its
cache's ``kernel_name``); a declared space wins over a cache of the same kernel, since it
carries the user's restrictions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kernelstream.kernels.space import SearchSpace

__all__ = ["SpaceResolver"]

log = logging.getLogger("kernelstream.resolve")


class SpaceResolver:
    """Caches spaces by (workload, problem size); raises LookupError for unknown ones.

    The tuning-spaces directory is read once, into an index of its cache files by
    (kernel name, problem size), and again only when its listing changes (a file
    added, removed or rewritten): a finding of a workload nobody knows is answered
    from the index, not by parsing every cache file again (about 1.4 s for the four
    files here, on the tuner's thread). A file that cannot be read is skipped with a
    warning, so one broken or foreign file does not hide the good ones; the error for
    an unknown workload names the skipped files and why.
    """

    def __init__(self, tuning_spaces_dir: Path | None = None) -> None:
        self._dir = tuning_spaces_dir
        self._cache: dict[tuple[str, tuple[int, ...]], SearchSpace] = {}
        self._listing: tuple[tuple[str, int, int], ...] | None = None
        # (kernel, problem size) -> its spaces, one per set of parameters, first-file first
        self._index: dict[tuple[str, tuple[int, ...]], list[SearchSpace]] = {}
        self._skipped: dict[str, str] = {}

    def space_for(
        self,
        workload: str,
        problem_size: tuple[int, ...],
        config: Mapping[str, Any] | None = None,
    ) -> SearchSpace:
        """A built-in's space (cached), else the folder's, as the folder is now: a file
        added later (a user kernel's declared space) is found, one rewritten is read anew
        (the listing's sizes and times are compared, the files read only on a change).

        Files may declare one kernel name at one problem size with different parameters
        (two versions of a kernel, two kernels sharing a name): ``config`` tells them
        apart, by the parameters it names (host knobs aside). Without it, or where none
        has exactly its parameters, the space of the first file (by name) is given.
        """
        key = (workload, tuple(problem_size))
        space = self._cache.get(key)
        return space if space is not None else self._find(workload, key[1], config)

    def _find(
        self, workload: str, problem_size: tuple[int, ...], config: Mapping[str, Any] | None
    ) -> SearchSpace:
        from kernelstream.kernels import WORKLOAD_NAMES, default_tuning_spaces_dir, get_workload

        if workload in WORKLOAD_NAMES:
            builtin = get_workload(workload, problem_size).space
            self._cache[(workload, problem_size)] = builtin
            return builtin
        d = Path(self._dir or default_tuning_spaces_dir())
        self._scan(d)
        spaces = self._index.get((workload, problem_size))
        if spaces:
            return _by_parameters(spaces, config)
        skipped = "".join(f"; skipped {name}: {why}" for name, why in self._skipped.items())
        raise LookupError(
            f"unknown workload {workload!r} with problem size {problem_size}: not built in "
            f"({', '.join(WORKLOAD_NAMES)}) and no cache or declared-space file for it in "
            f"{d}{skipped}"
        )

    def _scan(self, d: Path) -> None:
        """(Re)build the index if the directory's cache files changed since last time."""
        from kernelstream.kernels.backends.trace import cache_files_in, load_caches_in
        from kernelstream.kernels.declared import space_files_in

        sigs = []
        for path in [*cache_files_in(d), *space_files_in(d)]:
            try:
                st = path.stat()
            except OSError:
                continue  # removed since the listing
            sigs.append((path.name, st.st_mtime_ns, st.st_size))
        listing = tuple(sigs)
        if listing == self._listing:
            return
        index: dict[tuple[str, tuple[int, ...]], list[SearchSpace]] = {}
        traces, unreadable = load_caches_in(d)  # logs each file it skips, and why
        skipped = {path.name: why for path, why in unreadable.items()}
        for trace in traces:
            spaces = index.setdefault((trace.name, tuple(trace.problem_size)), [])
            names = set(trace.space.params)
            same = [i for i, have in enumerate(spaces) if set(have.params) == names]
            if not same:
                # Other parameters: another version of the kernel, or another kernel of
                # that name. Kept beside the first; a config's parameters pick one.
                spaces.append(trace.space)
                continue
            have = spaces[same[0]]
            if (
                dict(have.params) == dict(trace.space.params)
                and have.allowed is not None
                and trace.space.allowed is not None
            ):
                # The same kernel measured on two GPUs (or a session's partial cache
                # beside a finished one): the declared space is every config either
                # file holds, whichever file sorts first.
                spaces[same[0]] = replace(have, allowed=have.allowed | trace.space.allowed)
            else:
                log.warning(
                    "tuning spaces: %s declares %s %s with the parameters of an earlier "
                    "file but other values or restrictions; the earlier one is used",
                    trace.path,
                    trace.name,
                    trace.problem_size,
                )
        self._add_declared(d, index, skipped)
        self._listing, self._index, self._skipped = listing, index, skipped

    @staticmethod
    def _add_declared(
        d: Path,
        index: dict[tuple[str, tuple[int, ...]], list[SearchSpace]],
        skipped: dict[str, str],
    ) -> None:
        from kernelstream.kernels.declared import read_space, space_files_in
        from kernelstream.kernels.errors import KernelDefinitionError

        for path in space_files_in(d):
            try:
                name, size, space = read_space(path)
            except KernelDefinitionError as ex:
                skipped[path.name] = str(ex)
                log.warning("tuning spaces: skipped %s", ex)
                continue
            # Declared wins over a cache of the same parameters (it carries the user's
            # restrictions), and comes first.
            names = set(space.params)
            others = [have for have in index.get((name, size), []) if set(have.params) != names]
            index[(name, size)] = [space, *others]


def _by_parameters(spaces: list[SearchSpace], config: Mapping[str, Any] | None) -> SearchSpace:
    """The space whose parameters ``config`` names (host knobs aside), else the first."""
    if config is None or len(spaces) == 1:
        return spaces[0]
    from kernelstream.kernels.transfers import HOST_KNOBS

    names = set(config) - set(HOST_KNOBS)
    for space in spaces:
        if set(space.params) == names:
            return space
    return spaces[0]
