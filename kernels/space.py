"""Declared tunable search spaces: parameters, their allowed values, constraints.

A :class:`SearchSpace` is what a workload promises it can run. The tuner only
proposes configurations inside it, and a node rejects any recommendation that is
not inside it. Spaces are enumerated: a declared one through the product of its
values, a measured one (``allowed``: the points a trace file lists) through its list, so
a listed space of 83k points in a product of 4.4M enumerates in under a second.

>>> s = SearchSpace("demo", {"block": (64, 128, 256), "tile": (1, 2, 4)},
...                 default={"block": 64, "tile": 1},
...                 constraints=(Constraint("block*tile <= 512",
...                                         lambda c: c["block"] * c["tile"] <= 512),))
>>> s.config_id({"tile": 2, "block": 128})
'block=128,tile=2'
>>> s.is_valid({"block": 256, "tile": 4})
False
>>> sorted(s.config_id(n) for n in s.neighbors({"block": 128, "tile": 2}))
['block=128,tile=1', 'block=128,tile=4', 'block=256,tile=2', 'block=64,tile=2']
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from kernelstream.schemas.errors import KernelstreamError

__all__ = ["Config", "Constraint", "ParamValue", "SearchSpace", "SpaceError"]

ParamValue = int | float | str | bool
Config = dict[str, ParamValue]


class SpaceError(KernelstreamError, ValueError):
    """A configuration is not in a workload's declared search space."""


@dataclass(frozen=True)
class Constraint:
    """A named predicate every valid configuration satisfies."""

    description: str
    check: Callable[[Mapping[str, ParamValue]], bool]

    def holds(self, config: Mapping[str, ParamValue]) -> bool:
        try:
            return bool(self.check(config))
        except (KeyError, ZeroDivisionError, TypeError, ValueError):
            return False


@dataclass(frozen=True)
class SearchSpace:
    """Parameters with ordered allowed values, a default, and constraints.

    ``params`` keeps insertion order; that order defines config ids and the
    "one step" neighbourhood (adjacent values in each parameter's list).
    ``allowed`` optionally restricts the space to an explicit set of config ids
    (used by trace spaces whose valid points come from measurements).
    """

    name: str
    params: Mapping[str, Sequence[ParamValue]]
    default: Mapping[str, ParamValue]
    constraints: tuple[Constraint, ...] = ()
    allowed: frozenset[str] | None = None
    _index: dict[str, dict[ParamValue, int]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    # A space widened with host knobs (kernels.transfers): the kernel's own space and the
    # knobs added. Not an init field, so a ``dataclasses.replace`` of it is not one.
    widened_from: tuple[SearchSpace, tuple[str, ...]] | None = field(
        default=None, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        for p, values in self.params.items():
            if len(values) == 0:
                raise SpaceError(f"space {self.name!r}: parameter {p!r} has no values")
            self._index[p] = {v: i for i, v in enumerate(values)}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.params)

    def config_id(self, config: Mapping[str, ParamValue]) -> str:
        """Canonical id: ``name=value`` pairs in declared parameter order."""
        return ",".join(f"{p}={config[p]}" for p in self.params)

    def violations(self, config: Mapping[str, ParamValue]) -> list[str]:
        """Every reason ``config`` is not in this space (empty list when it is)."""
        problems: list[str] = []
        extra = set(config) - set(self.params)
        if extra:
            problems.append(f"unknown parameters {sorted(extra)}")
        for p in self._index:
            if p not in config:
                problems.append(f"missing parameter {p!r}")
            elif not self._declared(p, config[p]):
                problems.append(f"{p}={config[p]!r} not in declared values {list(self.params[p])}")
        if problems:
            return problems
        for c in self.constraints:
            if not c.holds(config):
                problems.append(f"constraint violated: {c.description}")
        if self.allowed is not None and self.config_id(config) not in self.allowed:
            problems.append("configuration not among the space's valid points")
        return problems

    def _declared(self, p: str, value: ParamValue) -> bool:
        """Whether ``value`` is one of ``p``'s declared values (a bool exactly where the
        first declared value is one: ``True == 1`` in a dict)."""
        index = self._index[p]
        return value in index and isinstance(value, bool) == isinstance(next(iter(index)), bool)

    def is_valid(self, config: Mapping[str, ParamValue]) -> bool:
        return not self.violations(config)

    def check(self, config: Mapping[str, ParamValue]) -> Config:
        """Return ``config`` as a plain dict, or raise :class:`SpaceError` naming why not."""
        problems = self.violations(config)
        if problems:
            raise SpaceError(f"space {self.name!r}: {'; '.join(problems)}")
        return {p: config[p] for p in self.params}

    def __iter__(self) -> Iterator[Config]:
        """All valid configurations, in declared order."""
        listed = self._allowed_points
        if listed is not None:
            # Declared values and listed by construction: only the constraints can fail.
            yield from (dict(c) for c in listed if all(k.holds(c) for k in self.constraints))
            return
        # What violations() checks of one value alone (_declared) is checked once per
        # value here, not once per configuration: the product then needs only the
        # constraints (and the listed ids, where they could not be read back). 2.5x
        # faster to enumerate a declared space.
        names = tuple(self.params)
        values = [[v for v in vs if self._declared(p, v)] for p, vs in self.params.items()]
        constraints, allowed = self.constraints, self.allowed
        for combo in itertools.product(*values):
            config = dict(zip(names, combo, strict=True))
            if all(k.holds(config) for k in constraints) and (
                allowed is None or self.config_id(config) in allowed
            ):
                yield config

    @cached_property
    def _allowed_points(self) -> list[Config] | None:
        """The configurations ``allowed`` names, in declared order, read off their ids.

        A measured space (a trace) lists its valid points, which can be a small part of
        the product of its values (a hotspot space: 83k of 4.4M): enumerating the product
        to find them took 15-40 s, on the tuner's thread. None when there is no list, or
        when an id cannot be read back unambiguously (two values print alike, or a value or
        name holds ``,`` or ``=``); then the product is enumerated. Read once per space
        (a ``dataclasses.replace`` with another ``allowed`` is a new space, read anew).
        """
        if self.allowed is None:
            return None
        names = list(self.params)
        by_text: dict[str, dict[str, ParamValue]] = {}
        for p, values in self.params.items():
            texts = {str(v): v for v in values}
            if len(texts) != len(values) or any("," in t or "=" in t for t in [p, *texts]):
                return None
            by_text[p] = texts
        points: list[Config] = []
        for cid in self.allowed:
            parts = [part.partition("=") for part in cid.split(",")]
            if len(parts) == len(names) and all(
                key == p and text in by_text[p]
                for p, (key, _, text) in zip(names, parts, strict=True)
            ):
                points.append(
                    {p: by_text[p][text] for p, (_, _, text) in zip(names, parts, strict=True)}
                )
            # else: not a point of this space at all, so never valid
        points.sort(key=lambda c: tuple(self._index[p][c[p]] for p in names))
        return points

    def size(self) -> int:
        return sum(1 for _ in self)

    def steps(self, a: Mapping[str, ParamValue], b: Mapping[str, ParamValue]) -> int:
        """Largest number of positions any one parameter moves between ``a`` and ``b``."""
        return max(
            (abs(self._index[p][a[p]] - self._index[p][b[p]]) for p in self.params),
            default=0,
        )

    def neighbors(self, config: Mapping[str, ParamValue], radius: int = 1) -> list[Config]:
        """Valid configs that differ in one parameter by at most ``radius`` positions."""
        out: list[Config] = []
        for p, values in self.params.items():
            i = self._index[p][config[p]]
            for j in range(max(0, i - radius), min(len(values), i + radius + 1)):
                if j == i:
                    continue
                cand = dict(config)
                cand[p] = values[j]
                if self.is_valid(cand):
                    out.append(cand)
        return out

    def start_config(self) -> Config:
        """The default when valid, else the valid config differing in fewest parameters.

        Ties go to the first in declared enumeration order. Found once per space (the
        search may enumerate the whole space: seconds for one of 300k configurations).
        """
        return dict(self._start)

    @cached_property
    def _start(self) -> Config:
        if self.is_valid(self.default):
            return dict(self.default)
        best: Config | None = None
        best_diff = len(self.params) + 1
        for config in self:
            diff = sum(config[p] != self.default.get(p) for p in self.params)
            if diff < best_diff:
                best, best_diff = config, diff
        if best is None:
            raise SpaceError(f"space {self.name!r} has no valid configuration")
        return best
