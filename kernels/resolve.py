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
from typing import Any, NamedTuple

from kernelstream.kernels.space import SearchSpace

__all__ = ["SpaceResolver"]

log = logging.getLogger("kernelstream.resolve")


class SpaceResolver:
    """Caches spaces by (workload, problem size); raises LookupError for unknown ones.

    The tuning-spaces directory is indexed by (kernel name, problem size) a kernel at a
    time: the first lookup of a kernel parses only the cache files whose header names
    it (:func:`kernels.backends.trace.cache_kernel_name`, the first 64 KiB of a file)
    or names nothing readable, and the index answers every later lookup until the
    folder's listing changes (a file added, removed or rewritten). Parsing every cache
    of the measured spaces took about 2 s on a 2-core machine, on the thread of the
    first finding or launch batch of a trace workload; one kernel's files take a
    fraction of that. A file that cannot be read is skipped with a warning, so one
    broken or foreign file does not hide the good ones; the error for an unknown
    workload names the skipped files and why.
    """

    def __init__(self, tuning_spaces_dir: Path | None = None) -> None:
        self._dir = tuning_spaces_dir
        self._cache: dict[tuple[str, tuple[int, ...]], SearchSpace] = {}
        self._listing: tuple[tuple[str, int, int], ...] | None = None
        # (kernel, problem size) -> its spaces, one per set of parameters, first-file first,
        # for the kernels in ``_indexed``
        self._index: dict[tuple[str, tuple[int, ...]], list[SearchSpace]] = {}
        self._indexed: set[str] = set()
        self._skipped: dict[str, str] = {}
        self._declared: list[tuple[str, tuple[int, ...], SearchSpace]] = []
        # per cache file of the listing: the kernel its header names, and what the file
        # read declares (None: unreadable, the reason in ``_skipped``); the measured
        # times are not kept
        self._names: dict[Path, str | None] = {}
        self._traces: dict[Path, _Declared | None] = {}
        self._caches: list[Path] = []  # the cache files of the listing, in order

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
        self._index_kernel(workload)
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
        """Start the index anew if the directory's files changed since last time (its
        declared-space files are read then; cache files when a kernel is looked up)."""
        from kernelstream.kernels.backends.trace import cache_files_in
        from kernelstream.kernels.declared import space_files_in

        caches = cache_files_in(d)
        sigs = []
        for path in [*caches, *space_files_in(d)]:
            try:
                st = path.stat()
            except OSError:
                continue  # removed since the listing
            sigs.append((path.name, st.st_mtime_ns, st.st_size))
        listing = tuple(sigs)
        if listing == self._listing:
            return
        self._index, self._indexed, self._skipped = {}, set(), {}
        self._names, self._traces, self._caches = {}, {}, caches
        self._declared = self._read_declared(d, self._skipped)
        self._listing = listing

    def _index_kernel(self, kernel: str) -> None:
        """Index the cache files of ``kernel`` (once per listing), then its declared spaces.

        The spaces of (kernel, size) are merged from the files that hold that kernel, in
        the folder's order, as a scan of every file would: the files a header says hold
        another kernel are the only ones not read.
        """
        if kernel in self._indexed:
            return
        from kernelstream.kernels.backends import trace as trace_module

        index: dict[tuple[str, tuple[int, ...]], list[SearchSpace]] = {}
        for path in self._caches:  # as listed by the scan just before
            if path not in self._names:
                self._names[path] = trace_module.cache_kernel_name(path)
            if self._names[path] not in (None, kernel):
                continue
            if path not in self._traces:
                try:
                    t = trace_module.load_cache(path)
                    self._traces[path] = _Declared(t.name, tuple(t.problem_size), t.space, path)
                except trace_module.TraceFileError as ex:
                    self._traces[path] = None
                    self._skipped[path.name] = str(ex)
                    log.warning("skipped (not read as a Kernel Tuner cache): %s", ex)
            trace = self._traces[path]
            if trace is not None and trace.name == kernel:
                _merge(index, trace)
        for name, size, space in self._declared:
            if name != kernel:
                continue
            # Declared wins over a cache of the same parameters (it carries the user's
            # restrictions), and comes first.
            names = set(space.params)
            others = [have for have in index.get((name, size), []) if set(have.params) != names]
            index[(name, size)] = [space, *others]
        if index:
            # A name nothing declares is not remembered: launch batches can carry any
            # number of names, and a lookup of one again reads no file anyway.
            self._index.update(index)
            self._indexed.add(kernel)

    @staticmethod
    def _read_declared(
        d: Path, skipped: dict[str, str]
    ) -> list[tuple[str, tuple[int, ...], SearchSpace]]:
        from kernelstream.kernels.declared import read_space, space_files_in
        from kernelstream.kernels.errors import KernelDefinitionError

        out = []
        for path in space_files_in(d):
            try:
                name, size, space = read_space(path)
            except KernelDefinitionError as ex:
                skipped[path.name] = str(ex)
                log.warning("tuning spaces: skipped %s", ex)
                continue
            out.append((name, tuple(size), space))
        return out


class _Declared(NamedTuple):
    """What a cache file declares: its kernel, problem size and space."""

    name: str
    problem_size: tuple[int, ...]
    space: SearchSpace
    path: Path


def _merge(index: dict[tuple[str, tuple[int, ...]], list[SearchSpace]], trace: Any) -> None:
    """Add a cache file's space to ``index`` beside the earlier files' of its kernel."""
    spaces = index.setdefault((trace.name, tuple(trace.problem_size)), [])
    names = set(trace.space.params)
    same = [i for i, have in enumerate(spaces) if set(have.params) == names]
    if not same:
        # Other parameters: another version of the kernel, or another kernel of that
        # name. Kept beside the first; a config's parameters pick one.
        spaces.append(trace.space)
        return
    have = spaces[same[0]]
    if (
        dict(have.params) == dict(trace.space.params)
        and have.allowed is not None
        and trace.space.allowed is not None
    ):
        # The same kernel measured on two GPUs (or a session's partial cache beside a
        # finished one): the declared space is every config either file holds,
        # whichever file sorts first.
        spaces[same[0]] = replace(have, allowed=have.allowed | trace.space.allowed)
    else:
        log.warning(
            "tuning spaces: %s declares %s %s with the parameters of an earlier "
            "file but other values or restrictions; the earlier one is used",
            trace.path,
            trace.name,
            trace.problem_size,
        )


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
