"""Model-guided search: the tuner's default way to pick the next configuration.

Every configuration a fleet group has measured trains a small ensemble of randomized
regression trees (scikit-learn's ``ExtraTreesRegressor``, each tree on a bootstrap
sample and half the features, so the trees disagree where data is thin) that predicts
the log of a
configuration's mean duration from its parameters. The ensemble then scores every
configuration of the declared space that nobody has measured yet, and the next one to
try comes from a rotating *acquisition*:

1. **local**: the unmeasured config with the lowest lower confidence bound (below) that
   differs from the group's fastest in at most two parameters and keeps its switches
   (see *arm* below), which polishes a good region of the best's own code path;
2. **sample**: the minimum of one randomly chosen tree (Thompson sampling), which
   explores where the trees disagree;
3. **plane**: the best config, by the ensemble's mean minus one standard deviation
   across trees (a lower confidence bound), of the *plane* the model expects most of
   to be fast. A plane is one combination of the values of the space's few-valued
   parameters (at most ``plane_max_values`` values: switches, tile and unroll
   factors, which select a variant of the code), so what varies inside it is the
   launch geometry (block sizes). Planes are ranked by a low quantile of the lower
   confidence bound over their configs: a plane where many geometries look good,
   rather than the single most extreme prediction, which on rugged spaces is a
   lone cliff or a lone needle the trees cannot see.

When the search stalls (the group's best is older than ``stall`` evaluations), the
``plane`` slot becomes an **arm** step instead: an *arm* is one combination of the
values of the space's switches (two-valued parameters, which usually select code paths:
shared memory or not, a read-only cache or not; in a space with none, its few-valued
parameters, such as a three-way method selector). A bandit on the measurements alone
(UCB on each arm's best log duration, arms never measured first) picks an arm, and the
best-predicted config near that arm's best is tried. Trees extrapolate flat, so a
code path whose first samples were poor looks certain to be poor; the bandit does
not trust the model's confidence there. This is a restart rule in the spirit of
trust-region methods (TuRBO), with the regions given by the space's switches.

**Values past the measured range.** A tree splits only between values it was trained
on, so past the largest tile size measured it predicts the largest one's time and the
trees agree: the lower bound never points where a kernel's fastest tiles may lie. Where a
config has a parameter value outside the range its own arm (code path) has measured, its
uncertainty in the local step and its rank in the arm step get the measured log
durations' spread, scaled by the square root of how far past the range it lies, as a
Gaussian process's uncertainty grows away from its data (``beyond_range``).

An **exploration floor** bounds what a model sure of a plateau can cost: once the group's
best is ``floor_after`` (30) evaluations old and at least ``floor_plateau`` (10) measured
configs are within 2% of it, the ``sample`` slot draws a uniform random unmeasured
configuration, so a stall on a plateau spends a third of its evaluations as random search
does: a portfolio of the model and random search, the random share switched on by the
model's failure to improve. A lone best on a rugged space (no plateau) keeps the model's
samples, which is where they find needles.

More acquisitions can be put in the rotation: **confident** (the minimum of the lower
confidence bound over the whole space; the third slot until the plane step replaced
it), **mode** (local search inside each value of a two-valued switch in turn) and
**random**.

With ``warm_start`` (off by default) the search first tries the configs other device
models of the same kernel found fastest (at most ``n_warm`` of them) and then runs as it
would cold, on this group's other measurements only (``warm_mode="head"``): the other
GPU's fastest configs may sit on a code path that is slow here, and once they steer the
search (as the best so far, or as a model feature) they can cost far more than they
save. Kept out of the search, they cost at most ``n_warm`` evaluations against cold and
gain whenever one of them is already near this GPU's optimum.

Before the model has enough data it tries an initial design: alternately a random
configuration and a random one-parameter change of the best one so far. Concurrent proposals
(other nodes of the group are trying configs now) take the next slots of that alternation,
as they take the next acquisitions of the rotation later, and a concurrent random one is
drawn from the *arms* (code paths, above) that nobody has measured or is trying: a batch's
proposals share one step count, so without this they would all perturb the best, and four
nodes would not leave the default's neighbourhood before the model leads. With
``warm_mode="prior"`` (the earlier design), other device models' fastest configs open the
initial design and stay in the search's view, and their measurements enter the model as one
more feature (their own model's prediction).

Why trees: GPU search spaces are small (thousands of points), discrete, full of
interactions and cliffs (a tile that no longer fits in shared memory), so a model that
splits on parameter values fits them better than a smooth kernel does, and it fits in
milliseconds. Why a rotation: each acquisition alone stalls on some spaces (the local
one in a basin, the lower confidence bound on a deceptive region, sampling on a needle). The
measurements behind these defaults, and how far they are from the targets, are in
bench/results/tuning-*.txt (``kernelstream bench tuning``) and the README; every
variant tried, kept or not, is in docs/tuning-log.md.

The trees can be replaced by a *pairwise* model (``model="pairwise"``,
``pairwise_posterior``): one Gaussian process term per value of each parameter and per
pair of values of two parameters, the posterior in closed form; with the lowest bound
and posterior samples in rotation it gets the A100 convolution space within 5% on more
seeds than the trees, but the A4000 one on far fewer, so it is an option, not the
default (docs/tuning-log.md; ``bench/model_fit.py`` compares the two models' fits). What
the default does take from it (``arm_model``) is its mean, ``pairwise_mean``, to rank the
candidates of an arm step: it carries what one code path taught about pairs of values to
the others, where the trees know only that path's few samples.

Features are generic (nothing here knows a particular kernel): each parameter's
position in its value list, the log2 of positive numeric values, and, following the
Kernel Tuner naming convention, the log2 product of the ``block_size_*`` parameters
(threads per block), of the ``tile_size_*`` ones (work per thread), of both, and
per axis of ``block_size_a * tile_size_a`` (the extent one block covers).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kernelstream.kernels.space import Config, SearchSpace

if TYPE_CHECKING:
    from kernelstream.agents.logic.tuning import GroupStats, Proposal
    from kernelstream.schemas.records import Finding

__all__ = [
    "ModelGuidedSearch",
    "SpaceIndex",
    "pairwise_mean",
    "pairwise_posterior",
    "space_features",
]

ACQUISITIONS = ("local", "arm", "mode", "sample", "confident", "plane", "random")


def space_features(space: SearchSpace, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """The model's inputs for ``configs`` (rows) of ``space``; see the module docstring."""
    cols: list[np.ndarray] = []
    logs: dict[str, np.ndarray] = {}
    for p, values in space.params.items():
        if len(values) < 2:
            continue
        pos = {v: i for i, v in enumerate(values)}
        cols.append(np.array([pos[c[p]] for c in configs], dtype=np.float64))
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and all(float(v) > 0 for v in values):
            logs[p] = np.log2(np.array([float(c[p]) for c in configs], dtype=np.float64))
            cols.append(logs[p])
    products = []
    for prefix in ("block_size", "tile_size"):
        parts = [v for p, v in logs.items() if p.startswith(prefix)]
        if parts:
            products.append(np.sum(parts, axis=0))
            cols.append(products[-1])
    if len(products) == 2:
        cols.append(products[0] + products[1])
    # Per axis, block size times tile size: the extent of the work one block covers.
    for axis in ("x", "y", "z"):
        b, t = logs.get(f"block_size_{axis}"), logs.get(f"tile_size_{axis}")
        if b is not None and t is not None:
            cols.append(b + t)
    if not cols:
        return np.zeros((len(configs), 1))
    return np.column_stack(cols)


# Neighbourhoods a space index keeps (SpaceIndex.near); past it they are computed anew.
_NEAR_KEPT = 4096


@dataclass
class SpaceIndex:
    """Every valid configuration of a space, its id, position and features (built once)."""

    space: SearchSpace
    configs: list[Config]
    ids: list[str]
    position: dict[str, int]
    features: np.ndarray
    positions: np.ndarray | None = None
    _arms: dict[int, np.ndarray] = field(default_factory=dict)
    _arm_lists: dict[int, list[int]] = field(default_factory=dict)
    _planes: dict[int, list[np.ndarray] | None] = field(default_factory=dict)
    _alignments: np.ndarray | None = None
    _near: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    @classmethod
    def build(cls, space: SearchSpace) -> SpaceIndex:
        configs = list(space)
        ids = [space.config_id(c) for c in configs]
        return cls(
            space, configs, ids, {c: i for i, c in enumerate(ids)}, space_features(space, configs)
        )

    def positions_matrix(self) -> np.ndarray:
        """Each config's value positions, one column per parameter."""
        if self.positions is None:
            # each value's first position, as list.index finds it (a dict, not a scan)
            first: list[dict[Any, int]] = []
            for values in self.space.params.values():
                at: dict[Any, int] = {}
                for k, v in enumerate(values):
                    at.setdefault(v, k)
                first.append(at)
            names = list(self.space.params)
            self.positions = np.array(
                [[at[c[p]] for p, at in zip(names, first, strict=True)] for c in self.configs]
            ).reshape(len(self.configs), len(names))
        return self.positions

    def arms(self, max_arms: int, few_values: int = 2) -> np.ndarray | None:
        """Each config's arm (its switches' values as one number), or None.

        A space with no two-valued parameter takes its parameters with 2 to
        ``few_values`` values instead (a three-way method selector is a switch too),
        where it has a parameter with more values to vary inside each arm.
        None where no parameter qualifies or more than ``max_arms`` combinations occur.
        """
        if few_values not in self._arms:
            positions = self.positions_matrix()
            sizes = [len(v) for v in self.space.params.values()]
            flags = [k for k, n in enumerate(sizes) if n == 2]
            if not flags and max(sizes, default=0) > few_values:
                # Only where something else varies inside each arm: with every parameter
                # few-valued, every config would be an arm of its own.
                flags = [k for k, n in enumerate(sizes) if 2 <= n <= few_values]
            if flags:
                _, arm = np.unique(positions[:, flags], axis=0, return_inverse=True)
                self._arms[few_values] = arm.reshape(-1)
            else:
                self._arms[few_values] = np.zeros(len(self.configs), dtype=np.int64)
        arms = self._arms[few_values]
        n = int(arms.max()) + 1 if len(arms) else 0
        return arms if 1 < n <= max_arms else None

    def arm_codes(self, few_values: int) -> list[int]:
        """Each config's arm as :meth:`arms` with ``few_values`` numbers them (call that
        first), as a list, kept: read a config at a time, a list's items cost a tenth of
        an array's."""
        codes = self._arm_lists.get(few_values)
        if codes is None:
            codes = self._arm_lists[few_values] = self._arms[few_values].tolist()
        return codes

    def alignments(self) -> np.ndarray:
        """Per integer parameter whose values are not all powers of two: the largest power
        of two dividing each config's value (as a position among those seen), one column
        each (block widths 48 and 80 alike, 64 apart)."""
        if self._alignments is None:
            cols = []
            for p, values in self.space.params.items():
                if len(values) < 2 or not all(isinstance(v, int) and v > 0 for v in values):
                    continue
                v = np.array([int(c[p]) for c in self.configs])
                two = v & -v
                if not np.array_equal(two, v):
                    cols.append(np.unique(two, return_inverse=True)[1].reshape(-1))
            self._alignments = (
                np.column_stack(cols) if cols else np.zeros((len(self.configs), 0), dtype=np.int64)
            )
        return self._alignments

    def planes(self, max_values: int) -> list[np.ndarray] | None:
        """Config positions per plane (see the module docstring), or None.

        A plane is one combination of the values of the parameters with 2 to
        ``max_values`` values; None where no parameter qualifies or every config is
        in one plane.
        """
        if max_values not in self._planes:
            positions = self.positions_matrix()
            small = [
                k
                for k, values in enumerate(self.space.params.values())
                if 2 <= len(values) <= max_values
            ]
            result = None
            if small:
                _, plane = np.unique(positions[:, small], axis=0, return_inverse=True)
                plane = plane.reshape(-1)
                members = np.argsort(plane, kind="stable")
                split = np.split(members, np.flatnonzero(np.diff(plane[members])) + 1)
                result = split if len(split) > 1 else None
            self._planes[max_values] = result
        return self._planes[max_values]

    def plane_quantiles(self, max_values: int, values: np.ndarray, q: float) -> np.ndarray:
        """``np.quantile(values[m], q)`` for every plane ``m`` of :meth:`planes`, at once.

        The same numbers as numpy's default (linear) method, bit for bit, without a Python
        call per plane: where most parameters have few values (a GEMM space) nearly every
        config is a plane of its own, and 100k calls took 5 s per plane step.
        """
        planes = self.planes(max_values)
        assert planes is not None
        counts = np.array([len(m) for m in planes], dtype=np.intp)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        v = values[np.concatenate(planes)]
        ordered = v[np.lexsort((v, np.repeat(np.arange(len(planes)), counts)))]
        virtual = (counts - 1) * q
        below = np.floor(virtual)
        gamma = virtual - below
        lo = starts + below.astype(np.intp)
        hi = np.minimum(lo + 1, starts + counts - 1)
        a, b = ordered[lo], ordered[hi]
        diff = b - a
        # numpy's _lerp: from the upper neighbour when gamma >= 0.5.
        return np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)

    def near(self, i: int, distance: int) -> np.ndarray:
        """Configs differing from config ``i`` in 1 to ``distance`` parameters (any values).

        Kept (read-only): a group's proposals ask about its best config again and again,
        and a fleet's first proposals all about the default.
        """
        found = self._near.get((i, distance))
        if found is None:
            positions = self.positions_matrix()
            diff = (positions != positions[i]).sum(axis=1)
            found = np.flatnonzero((diff >= 1) & (diff <= distance))
            found.flags.writeable = False
            if len(self._near) >= _NEAR_KEPT:
                self._near.clear()
            self._near[(i, distance)] = found
        return found


@dataclass
class ModelGuidedSearch:
    """Tree-ensemble model-based search (see the module docstring).

    Args:
        n_trees: trees in the ensemble.
        n_init: measured configs (the start included) before the model leads.
        acquisitions: the rotation, a sequence of ``"local"``, ``"sample"`` and
            ``"plane"`` (or any of ``ACQUISITIONS``); the step (number of measured
            configs) picks the entry.
        seed: seeds the initial design and the trees; the same measurements and the
            same seed give the same proposal.
        failure_penalty: a config that failed to launch is taught to the model as
            this many times slower than the slowest measured one.
        local_distance: the ``local`` acquisition looks at configs that differ from the
            group's fastest in at most this many parameters (any values).
        local_arm: ... and keep its switches (its arm): the best's code path is
            polished; other paths are the arm steps' job.
        local_score: ``"lcb"`` ranks the local candidates by mean minus one standard
            deviation across trees, ``"mu"`` by the mean prediction.
        warm_start: use other device models of the same kernel (``related`` groups),
            as ``warm_mode`` says. Off by default; ``kernelstream bench tuning``
            measures it with this on.
        n_warm: with ``warm_start``, at most this many of other device models' fastest
            configs are tried first.
        max_arms: no arm steps in spaces with more switch combinations than this.
        arm_bonus: the bandit's exploration weight (log duration units).
        stall: evaluations without a new best after which the ``stall_mode``
            acquisition becomes an arm step; 0 never.
        warm_feature: with ``warm_mode="prior"``, other device models' predictions as a
            model feature.
        warm_mode: ``"head"`` (the default): other device models' ``n_warm`` fastest
            configs are tried first and then kept out of the search's view, so it runs
            as cold and the warm start costs at most ``n_warm`` evaluations; ``"prior"``:
            they open the initial design and stay in view, with the other models'
            predictions as a feature (``warm_feature``), which cost the A100 convolution
            space its last 5% (docs/tuning-log.md, "The warm start as a head start").
        plane_max_values: parameters with at most this many values (and at least two)
            span the planes of the ``plane`` acquisition.
        plane_quantile: planes are ranked by this quantile of their configs' lower
            confidence bounds.
        init_paths: concurrent random proposals of the initial design come from arms
            nobody has measured or is trying (one node alone draws from the whole space).
        model: ``"trees"`` (the default) or ``"pairwise"`` (``pairwise_posterior``: a
            Gaussian process with a term per parameter value and per pair of values,
            its posterior samples in the trees' place). Measured against the trees in
            docs/tuning-log.md ("A pairwise model"): better on the A100 convolution
            space, far worse on the A4000 one, so not the default.
        pairwise_alignment: the pairwise model also gets, per integer parameter whose
            values are not all powers of two, the largest power of two dividing the
            value as one more parameter (block widths 48 and 80 alike, 64 apart).
        arm_model: which model ranks the configs near an arm's best in an arm step:
            ``"pairwise"`` (the default since 2026-11-23 session 17: the pairwise model's
            mean, ``pairwise_mean``, fitted to the same measurements; the trees still do
            everything else) or ``"same"`` (the main model's mean, as before). On fresh
            A100 convolution seeds it reaches 5% within 200 evaluations on 146 of 160
            seeds instead of 135 (docs/tuning-log.md, session 17).
        switchless_arms: in a space with no two-valued parameter, the arms are the
            combinations of its parameters with at most ``plane_max_values`` values (a
            three-way method selector), so a stalled search still restarts on another
            code path. On by default: on a point-in-polygon space without switches,
            fresh seeds reached 5% within 200 evaluations on 20 of 20 instead of 17
            (the other three took 221-303); spaces with switches are
            unchanged (docs/tuning-log.md, "Spaces it was not shaped on").
        random_every: an exploration floor: every this many evaluations past the initial
            design, a uniform random unmeasured config (0: never).
        stall_random: while stalled, the ``local`` slot draws a uniform random
            unmeasured config instead of polishing the plateau (off: it cost the A100
            convolution space a third more evaluations, same log).
        floor_after: the exploration floor: once the group's best is this many
            evaluations old (and with ``floor_plateau``, on a plateau), the ``sample``
            slot draws a uniform random unmeasured config (0: never). Past that point
            every third evaluation is random search's, so the expected evaluations to a
            target are at most ``floor_after`` plus three times random search's.
        floor_plateau: the floor acts only while at least this many measured configs
            are within 2% of the best (0: always): the local steps keep finding configs
            as good as the best and none better, which is where a model is sure of a
            plateau. Without it the floor reached 5% within 200 evaluations on 29 of 30
            fresh point-in-polygon seeds instead of 24 but on 23 of 30 A100 convolution
            seeds instead of 28; with it, 30 of 30 and the A100, A4000, GEMM and RTX 3090
            convolution seeds as before (docs/tuning-log.md, "An exploration floor for
            long stalls").
        beyond_range: trees extrapolate flat, so a config with a parameter value past
            the range measured (in value order) gets the spread of the measured log
            durations as its uncertainty, times the square root of how far past it is
            (as a fraction of the value list): ``"arm"`` (the default) judges the range
            on the config's own arm, in the local step's lower bound and the arm step's
            ranking; ``"local"`` judges it on every measurement, in the local step only;
            ``"off"`` never. Fresh seeds, every space: the A4000 convolution and GEMM
            spaces need fewer evaluations (mean log ratio -0.30 and -0.16) and reach 5%
            within 200 on 20 of 20 seeds (18 and 19 before); the others even
            (docs/tuning-log.md, "Values past the measured range").
        resolution: measured means enter the search rounded to this relative step (on
            a log scale; 0: as measured). A config's mean depends on more than the config:
            the best so far runs on between trials and its mean keeps moving, so two runs
            that measured the same configs hold slightly different means, and trees
            fitted on those differences take another path. Rounded, the path depends on
            what was measured. This is what bounds a warm start's cost: on the A4000
            convolution space (seeds 0-39, warm from the A100) 25 of 40 warm runs are
            the cold run plus the two head evaluations, against 1 of 40 unrounded, and
            the paired standard error of warm against cold falls from 0.17 to 0.04. Cold
            runs are even (160 fresh A4000 seeds: mean log ratio +0.00, se 0.07; 40 fresh
            A100 seeds: +0.04, se 0.12; docs/tuning-log.md, "A resolution for the
            measurements").
    """

    n_trees: int = 30
    n_init: int = 8
    acquisitions: tuple[str, ...] = ("local", "sample", "plane")
    seed: int = 0
    failure_penalty: float = 2.0
    local_distance: int = 2
    max_features: float = 0.5
    bootstrap: bool = True
    n_warm: int = 2
    max_arms: int = 32
    arm_bonus: float = 0.5
    stall: int = 15
    stall_mode: str = "plane"
    warm_feature: bool = True
    local_arm: bool = True
    local_score: str = "lcb"
    plane_max_values: int = 4
    plane_quantile: float = 0.25
    init_paths: bool = True
    model: str = "trees"
    pairwise_alignment: bool = False
    warm_start: bool = False
    arm_model: str = "pairwise"
    switchless_arms: bool = True
    random_every: int = 0
    stall_random: bool = False
    floor_after: int = 30
    floor_plateau: int = 10
    beyond_range: str = "arm"
    warm_mode: str = "head"
    resolution: float = 0.01
    _index: dict[int, SpaceIndex] = field(default_factory=dict, repr=False)
    _model: tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = field(
        default=None, repr=False
    )
    _prior_cache: tuple[Any, np.ndarray] | None = field(default=None, repr=False)
    _arm_fit: tuple[Any, Callable[[np.ndarray], np.ndarray]] | None = field(
        default=None, repr=False
    )

    def __post_init__(self) -> None:
        bad = [a for a in self.acquisitions if a not in ACQUISITIONS]
        if bad or not self.acquisitions:
            raise ValueError(f"acquisitions must be drawn from {ACQUISITIONS}, got {bad}")
        if self.n_trees < 2 or self.n_init < 1:
            raise ValueError("ModelGuidedSearch needs n_trees >= 2 and n_init >= 1")
        if self.plane_max_values < 2 or not 0.0 <= self.plane_quantile <= 1.0:
            raise ValueError(
                "ModelGuidedSearch needs plane_max_values >= 2 and plane_quantile in [0, 1]"
            )
        if self.model not in ("trees", "pairwise"):
            raise ValueError(f"model must be 'trees' or 'pairwise', got {self.model!r}")
        if self.arm_model not in ("pairwise", "same"):
            raise ValueError(f"arm_model must be 'pairwise' or 'same', got {self.arm_model!r}")
        if self.floor_after < 0:
            raise ValueError(f"floor_after must be 0 (never) or more, got {self.floor_after}")
        if self.random_every < 0:
            raise ValueError(f"random_every must be 0 (never) or more, got {self.random_every}")
        if self.beyond_range not in ("off", "local", "arm"):
            raise ValueError(
                f"beyond_range must be 'off', 'local' or 'arm', got {self.beyond_range!r}"
            )
        if self.warm_mode not in ("head", "prior"):
            raise ValueError(f"warm_mode must be 'head' or 'prior', got {self.warm_mode!r}")
        if self.local_score not in ("mu", "lcb"):
            raise ValueError(f"local_score must be 'mu' or 'lcb', got {self.local_score!r}")

    def index(self, space: SearchSpace) -> SpaceIndex:
        idx = self._index.get(id(space))
        if idx is None or idx.space is not space:
            idx = self._index[id(space)] = SpaceIndex.build(space)
        return idx

    def propose(
        self,
        finding: Finding,
        space: SearchSpace,
        group: GroupStats,
        current: Config,
        allowed: Callable[[Config], bool],
        related: Sequence[GroupStats] = (),
    ) -> Proposal | None:
        from kernelstream.agents.logic.tuning import Proposal, id_check

        if not self.warm_start:
            related = ()
        idx = self.index(space)
        head = self._warm(idx, related)[: self.n_warm]
        # With the "head" warm start the other device models' fastest configs are
        # measured first and then kept out of the search's own view: it runs as the
        # cold search would, so the warm start costs at most ``n_warm`` evaluations
        # (the group's best, which the tuner keeps running, still counts them).
        hidden = {idx.ids[j] for j in head} if self.warm_mode == "head" else set()
        measured = [
            (idx.position[cid], self._resolved(m.mean_us))
            for cid, m in group.configs.items()
            if cid in idx.position and m.count > 0 and cid not in group.failed and cid not in hidden
        ]
        # Sorted: a set's order of strings changes with the process's hash seed, and the
        # order of the training rows decides the trees' bootstrap samples.
        failed = sorted(
            idx.position[cid] for cid in group.failed if cid in idx.position and cid not in hidden
        )
        step = len(measured) + len(failed)
        rng = np.random.default_rng([self.seed, step, len(group.trying)])
        # Nodes of the group trying configs now: each concurrent proposal takes the
        # next slot of the initial design or of the rotation (below), as if the
        # pending ones had been measured, so a batch mixes them.
        pending = group.pending()
        # The group's fastest measured config (None before the first measurement).
        best_i = min(measured, key=lambda m: m[1])[0] if measured else None

        ids, configs, done, failed_ids = idx.ids, idx.configs, group.configs, group.failed
        check = id_check(allowed)

        def first_allowed(order: Sequence[int] | np.ndarray) -> int | None:
            # ``allowed`` is checked lazily, best first: scoring is vectorized, the
            # predicate is not, and the first few candidates almost always pass.
            # Only unmeasured configs: the group's best is shared by the tuner itself.
            # A chunk of the order at a time as Python ints: where most of a large
            # group's candidates are being tried by other nodes, a scan runs through
            # much of the space.
            for at in range(0, len(order), 64):
                chunk = order[at : at + 64]
                for j in chunk.tolist() if isinstance(chunk, np.ndarray) else chunk:
                    cid = ids[j]
                    if cid not in done and cid not in failed_ids and check(configs[j], cid):
                        return int(j)
            return None

        if hidden:
            choice = first_allowed(head)
            if choice is not None:
                why = "warm start: fast on another device model of this kernel"
                return Proposal(idx.configs[choice], why, 0.0)
        if step < self.n_init or len(measured) < 2:
            choice = first_allowed(head) if self.warm_mode == "prior" else None
            why = "warm start: fast on another device model of this kernel"
            if choice is None and best_i is not None and (step + pending) % 2 == 1:
                # Half the initial design perturbs the best config so far in one
                # parameter: cheap insurance when the default is already nearly good.
                choice = first_allowed(rng.permutation(idx.near(best_i, 1)))
                why = "initial design: one parameter of the best so far changed at random"
            if choice is None and pending and self.init_paths:
                choice = first_allowed(self._untouched_arms(idx, group, rng))
                why = "initial design: random configuration of a code path nobody measured"
            if choice is None:
                choice = first_allowed(rng.permutation(len(idx.ids)))
                why = "initial design: random configuration"
            return None if choice is None else Proposal(idx.configs[choice], why, 0.0)
        # Refit only when the set of measured configs changed: later windows of known
        # configs refine their means a little, but a worker serving many nodes must not
        # spend a model fit on every one of their windows.
        key = (id(idx), frozenset(i for i, _ in measured), frozenset(failed))
        if self._model is None or self._model[0] != key:
            features = idx.features
            use_prior = self.warm_feature and self.warm_mode == "prior"
            prior = self._prior(idx, related, rng) if use_prior else None
            if prior is not None:
                features = np.column_stack([features, prior])
            self._model = (key, self._fit(features, measured, failed, rng, idx))
        mu, sd, trees = self._model[1]
        local_sd = sd
        if self.beyond_range != "off":
            in_arm = best_i if self.beyond_range == "arm" else None
            local_sd = self._beyond_range_sd(idx, measured, failed, sd, in_arm)
        # As in the initial design, ``pending`` shifts the rotation: a batch from one
        # model mixes acquisitions rather than taking the top few of one score.
        mode = self.acquisitions[(step + pending) % len(self.acquisitions)]
        assert best_i is not None  # len(measured) >= 2 past the initial design
        since = len(measured) - 1 - next(k for k, (i, _) in enumerate(measured) if i == best_i)
        stalled = bool(self.stall) and since >= self.stall
        if stalled and mode == self.stall_mode:
            # Stalled: the group's best is older than ``stall`` evaluations. Local
            # steps and the model have settled on one basin; try the other arms.
            mode = "arm"
        elif stalled and self.stall_random and mode == "local":
            # Polishing a plateau the model is sure of: a uniform draw instead.
            mode = "random"
        elif (
            self.floor_after
            and since >= self.floor_after
            and mode == "sample"
            and self._on_plateau(measured)
        ):
            # The exploration floor: a long stall is the model's own evidence that its
            # samples keep landing on what it already knows.
            mode = "random"
        if self.random_every and (step + pending) % self.random_every == 0:
            mode = "random"  # the exploration floor: never below random search's rate
        choice = None
        if mode == "local":
            near = idx.near(best_i, self.local_distance)
            arms = self._arms_of(idx) if self.local_arm else None
            if arms is not None:
                # Polish the best's own code path: a switch flipped next to the best
                # is the model's guess about another path, which arm steps handle.
                near = near[arms[near] == arms[best_i]]
            score = mu - local_sd if self.local_score == "lcb" else mu
            choice = first_allowed(near[np.argsort(score[near], kind="stable")])
            if choice is None:
                mode = "sample"
        if mode == "arm":
            if self.arm_model == "same":
                arm_score: Callable[[np.ndarray], np.ndarray] = mu.__getitem__
            else:
                arm_score = self._arm_mean(idx, measured, failed, key)
            if self.beyond_range == "arm":
                arm_score = self._arm_bonus(idx, measured, failed, arm_score)
            choice = self._arm_step(idx, measured, failed, arm_score, first_allowed)
            if choice is None:
                mode = "sample"
        if mode == "mode":
            choice = self._mode_step(idx, measured, mu, step, first_allowed)
            if choice is None:
                mode = "sample"
        if mode == "plane":
            choice = self._plane_step(idx, mu - sd, first_allowed)
            if choice is None:
                mode = "confident"
        if choice is None and mode == "random":
            choice = first_allowed(rng.permutation(len(idx.ids)))
        if choice is None:
            score = trees[int(rng.integers(len(trees)))] if mode == "sample" else mu - sd
            choice = first_allowed(np.argsort(score, kind="stable"))
        if choice is None:
            return None
        predicted = math.exp(mu[choice])
        best_us = min(m[1] for m in measured)
        cur = group.configs.get(space.config_id(current))
        # The gain over what the node runs now (the recommendation's from_config), as the
        # fleet-best step states it. Negative when the model expects the step to be slower:
        # an exploration step, chosen for what it teaches the model.
        base_us = cur.mean_us if cur is not None and cur.count > 0 else best_us
        return Proposal(
            idx.configs[choice],
            f"{finding.classification}: model ({mode}) predicts {predicted:.1f} us vs "
            f"{base_us:.1f} us now (best measured {best_us:.1f} us) after {step} configs",
            base_us / predicted - 1.0,
        )

    def _arm_bonus(
        self,
        idx: SpaceIndex,
        measured: list[tuple[int, float]],
        failed: list[int],
        rank: Callable[[np.ndarray], np.ndarray],
    ) -> Callable[[np.ndarray], np.ndarray]:
        """``rank`` less the uncertainty of values past the range the candidates' arm (one
        arm per call, as the arm step asks) has measured (:meth:`_beyond_range_sd`)."""
        zero = np.zeros(len(idx.configs))

        def score(configs: np.ndarray) -> np.ndarray:
            if not len(configs):
                return rank(configs)
            sd = self._beyond_range_sd(idx, measured, failed, zero, int(configs[0]))
            return rank(configs) - sd[configs]

        return score

    def _beyond_range_sd(
        self,
        idx: SpaceIndex,
        measured: list[tuple[int, float]],
        failed: list[int],
        sd: np.ndarray,
        in_arm: int | None = None,
    ) -> np.ndarray:
        """``sd``, raised at every config with a parameter value outside the range (in
        value order) of the measured configs (of ``in_arm``'s arm, where given) to the
        spread of the measured log durations times the square root of the distance past
        the range, as a fraction of the parameter's value list.

        Trees extrapolate flat: past the largest tile size measured they predict the
        largest one's time, with the trees agreeing, so the lower bound never points
        there. A Gaussian process's uncertainty grows away from its data; growing with the
        distance, the far end of a range is tried first, not each value in turn.
        """
        rows, y = self._training_rows(measured, failed)
        positions = idx.positions_matrix()
        seen = positions[rows]
        arms = self._arms_of(idx) if in_arm is not None else None
        if arms is not None:
            seen = seen[arms[rows] == arms[in_arm]]
            if not len(seen):
                return sd  # an arm nobody measured: the arm step's bandit explores it
        lo, hi = seen.min(axis=0), seen.max(axis=0)
        span = np.maximum(positions.max(axis=0), 1)
        # How far past the measured range, as a fraction of each parameter's value list.
        beyond = (np.maximum(lo - positions, 0) + np.maximum(positions - hi, 0)) / span
        return np.maximum(sd, float(np.std(y)) * np.sqrt(beyond.max(axis=1)))

    def _on_plateau(self, measured: list[tuple[int, float]]) -> bool:
        """At least ``floor_plateau`` measured configs within 2% of the best (0: always)."""
        if not self.floor_plateau:
            return True
        best_us = min(us for _, us in measured)
        return sum(us <= best_us * 1.02 for _, us in measured) >= self.floor_plateau

    def _arms_of(self, idx: SpaceIndex) -> np.ndarray | None:
        """The space's arms (``SpaceIndex.arms``), few-valued parameters standing in for
        switches where it has none and ``switchless_arms`` is on."""
        return idx.arms(self.max_arms, self._arm_values())

    def _arm_values(self) -> int:
        """The most values a parameter may have to count as a switch of the arms."""
        return self.plane_max_values if self.switchless_arms else 2

    def _untouched_arms(
        self, idx: SpaceIndex, group: GroupStats, rng: np.random.Generator
    ) -> np.ndarray:
        """Configs, in random order, of the arms nobody measured, saw fail or is trying."""
        arms = self._arms_of(idx)
        if arms is None:
            return np.array([], dtype=np.int64)
        # A mask over the arms (not np.isin: its sort costs four times as much on the
        # matmul space), filled until every arm is touched: a large group's trials touch
        # them all within its first proposals, and its measured, failed and tried
        # configs run to hundreds.
        codes = idx.arm_codes(self._arm_values())
        seen = bytearray(int(arms.max()) + 1)
        left = len(seen)
        position = idx.position
        for c in itertools.chain(group.configs, group.failed, group.trying):
            p = position.get(c)
            if p is not None and not seen[codes[p]]:
                seen[codes[p]] = 1
                left -= 1
                if not left:
                    break
        untouched = np.frombuffer(seen, dtype=bool)[arms]
        return rng.permutation(np.flatnonzero(~untouched))

    def _arm_step(
        self,
        idx: SpaceIndex,
        measured: list[tuple[int, float]],
        failed: list[int],
        rank: Callable[[np.ndarray], np.ndarray],
        first_allowed: Callable[[Sequence[int] | np.ndarray], int | None],
    ) -> int | None:
        """Polish the best config of one *arm*: a combination of the switches' values.

        Switches (two-valued parameters) select code paths, and the best path can hide
        behind a few bad first samples that make the model write it off. Arms are
        picked by a bandit on measurements alone (UCB on each arm's best log mean
        duration, unexplored arms first), not by the model's own confidence. ``rank``
        scores the candidates near the arm's best (lowest first): the pairwise model's
        mean by default (``arm_model``).
        """
        arms = self._arms_of(idx)
        if arms is None:
            return None
        n_arms = int(arms.max()) + 1
        counts = np.bincount(arms[[i for i, _ in measured] + failed], minlength=n_arms)
        best = np.full(n_arms, np.inf)
        at = np.full(n_arms, -1)
        for i, us in measured:
            a = arms[i]
            if math.log(us) < best[a]:
                best[a], at[a] = math.log(us), i
        total = max(1, int(counts.sum()))
        bonus = self.arm_bonus * np.sqrt(math.log(1 + total) / np.maximum(counts, 1))
        score = np.where(counts == 0, -np.inf, np.where(np.isfinite(best), best - bonus, np.inf))
        for a in np.argsort(score, kind="stable"):
            if at[a] >= 0:
                near = idx.near(int(at[a]), self.local_distance)
                near = near[arms[near] == a]
            else:
                near = np.flatnonzero(arms == a)
            choice = first_allowed(near[np.argsort(rank(near), kind="stable")])
            if choice is not None:
                return choice
        return None

    def _arm_mean(
        self,
        idx: SpaceIndex,
        measured: list[tuple[int, float]],
        failed: list[int],
        key: Any,
    ) -> Callable[[np.ndarray], np.ndarray]:
        """The pairwise model's mean log duration at given configs, fitted to the same rows
        as the main model (refitted only when they change), for the arm step's ranking."""
        if self._arm_fit is None or self._arm_fit[0] != key:
            rows, y = self._training_rows(measured, failed)
            self._arm_fit = (key, pairwise_mean(self._pairwise_positions(idx), rows, y))
        return self._arm_fit[1]

    def _pairwise_positions(self, idx: SpaceIndex) -> np.ndarray:
        """The pairwise model's parameters: each config's value positions, and with
        ``pairwise_alignment`` the alignment columns."""
        positions = idx.positions_matrix()
        if self.pairwise_alignment:
            positions = np.column_stack([positions, idx.alignments()])
        return positions

    def _training_rows(
        self, measured: list[tuple[int, float]], failed: list[int]
    ) -> tuple[list[int], np.ndarray]:
        """Measured configs at their log mean duration; failed ones at the slowest measured
        times ``failure_penalty``."""
        rows = [i for i, _ in measured]
        y = [math.log(us) for _, us in measured]
        if failed:
            worst = max(y) + math.log(self.failure_penalty)
            rows += failed
            y += [worst] * len(failed)
        return rows, np.asarray(y)

    def _plane_step(
        self,
        idx: SpaceIndex,
        lcb: np.ndarray,
        first_allowed: Callable[[Sequence[int] | np.ndarray], int | None],
    ) -> int | None:
        """The best config, by ``lcb``, of the plane whose configs look best overall.

        Planes are ranked by the ``plane_quantile`` of ``lcb`` over all their configs
        (measured ones too: a plane is judged as a whole); the first plane with an
        allowed unmeasured config gives its lowest-``lcb`` one.
        """
        planes = idx.planes(self.plane_max_values)
        if planes is None:
            return None
        ranked = np.argsort(
            idx.plane_quantiles(self.plane_max_values, lcb, self.plane_quantile), kind="stable"
        )
        for m in (planes[k] for k in ranked):
            choice = first_allowed(m[np.argsort(lcb[m], kind="stable")])
            if choice is not None:
                return choice
        return None

    def _mode_step(
        self,
        idx: SpaceIndex,
        measured: list[tuple[int, float]],
        mu: np.ndarray,
        step: int,
        first_allowed: Callable[[Sequence[int] | np.ndarray], int | None],
    ) -> int | None:
        """Local search inside one *mode*: one value of a two-valued parameter.

        Such a switch usually selects another code path of the kernel (shared memory
        or not, a read-only cache or not), whose best tiles and block sizes differ from
        the other path's. A model fitted mostly on one path can write the other off
        early; this keeps polishing the best config of every path, in turn.
        """
        positions = idx.positions_matrix()
        flags = [k for k, values in enumerate(idx.space.params.values()) if len(values) == 2]
        if not flags:
            return None
        modes = [(k, v) for k in flags for v in (0, 1)]
        per_cycle = max(1, self.acquisitions.count("mode"))
        slot = self.acquisitions[: step % len(self.acquisitions)].count("mode")
        k, v = modes[(step // len(self.acquisitions) * per_cycle + slot) % len(modes)]
        inside = [(i, us) for i, us in measured if positions[i, k] == v]
        if inside:
            best = min(inside, key=lambda m: m[1])[0]
            near = idx.near(best, self.local_distance)
            near = near[positions[near, k] == v]
        else:
            near = np.flatnonzero(positions[:, k] == v)
        return first_allowed(near[np.argsort(mu[near], kind="stable")])

    def _resolved(self, mean_us: float) -> float:
        """``mean_us`` rounded to the nearest power of ``1 + resolution``."""
        if self.resolution <= 0.0:
            return mean_us
        q = math.log1p(self.resolution)
        return math.exp(round(math.log(mean_us) / q) * q)

    @staticmethod
    def _warm(idx: SpaceIndex, related: Sequence[GroupStats]) -> list[int]:
        """Positions of configs other device models measured, fastest (relative) first."""
        ranked = sorted(
            (m.mean_us / _best_mean(g), cid)
            for g in related
            for cid, m in g.configs.items()
            if m.count > 0 and cid not in g.failed and cid in idx.position
        )
        return [idx.position[cid] for _, cid in ranked]

    def _prior(
        self, idx: SpaceIndex, related: Sequence[GroupStats], rng: np.random.Generator
    ) -> np.ndarray | None:
        """What other device models' measurements predict, as one more feature.

        A tree model of the related groups' log durations (each relative to its own
        group's best) over the whole space. The trees of this group's model split on it
        where it explains this group's measurements and not where the devices differ.
        """
        rows: dict[int, float] = {}
        for g in related:
            best = _best_mean(g)
            for cid, m in g.configs.items():
                if m.count > 0 and cid not in g.failed and cid in idx.position:
                    rows[idx.position[cid]] = math.log(m.mean_us / best)
        if len(rows) < 2:
            return None
        key = frozenset(rows.items())
        if self._prior_cache is None or self._prior_cache[0] != key:
            ordered = sorted(rows)
            measured = [(i, math.exp(rows[i])) for i in ordered]
            mu, _, _ = self._fit(idx.features, measured, [], rng, idx)
            self._prior_cache = (key, mu)
        return self._prior_cache[1]

    def _fit(
        self,
        features: np.ndarray,
        measured: list[tuple[int, float]],
        failed: list[int],
        rng: np.random.Generator,
        idx: SpaceIndex,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from sklearn.ensemble import ExtraTreesRegressor

        rows, y = self._training_rows(measured, failed)
        if self.model == "pairwise":
            extra = features[:, idx.features.shape[1] :]
            positions = self._pairwise_positions(idx)
            return pairwise_posterior(positions, extra, rows, y, self.n_trees, rng)
        model = ExtraTreesRegressor(
            n_estimators=self.n_trees,
            max_features=self.max_features,
            bootstrap=self.bootstrap,
            random_state=int(rng.integers(2**31)),
            n_jobs=1,
        )
        model.fit(features[rows], y)
        # Each tree's own predictions (the Thompson samples need them). The trees work in
        # float32: converting the space once, not once per tree as ``predict`` does, gives
        # the same numbers in a fifth less time (30 trees, 117k configs: 0.25 -> 0.20 s).
        x32 = np.ascontiguousarray(features, dtype=np.float32)
        trees = np.stack([t.tree_.predict(x32)[:, 0] for t in model.estimators_])
        return trees.mean(axis=0), trees.std(axis=0), trees


def _best_mean(g: GroupStats) -> float:
    means = [m.mean_us for cid, m in g.configs.items() if m.count > 0 and cid not in g.failed]
    return min(means) if means else math.inf


# Noise-to-signal ratios the pairwise model chooses from by marginal likelihood.
NOISE_GRID = (0.03, 0.1, 0.3, 1.0, 3.0)


def _varying(positions: np.ndarray) -> np.ndarray:
    """The columns of ``positions`` (value positions) that take more than one value."""
    return positions[:, [k for k in range(positions.shape[1]) if positions[:, k].max() > 0]]


def _agreement_cov(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The pairwise model's prior covariance of every row of ``a`` with every row of ``b``
    (parameter positions): ``m + m (m - 1) / 2``, ``m`` the parameters they agree on."""
    agree = np.zeros((len(a), len(b)))
    for k in range(a.shape[1]):
        agree += a[:, k, None] == b[None, :, k]
    return agree + agree * (agree - 1) / 2


def _pairwise_fit(
    gram: np.ndarray, yc: np.ndarray, noise_grid: Sequence[float]
) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, float]:
    """Noise level by marginal likelihood, scale by maximum likelihood, for centred ``yc``.

    Returns the eigenvectors ``q`` of ``gram``, ``q' yc``, the noise-to-signal ratio, the
    inverse eigenvalues of ``gram + lam I`` and the scale. One eigendecomposition serves
    every noise level: ``(gram + lam I)^-1 = Q (L + lam)^-1 Q'``.
    """
    n = len(yc)
    eig, q = np.linalg.eigh(gram)
    eig = np.maximum(eig, 0.0)
    qy = q.T @ yc

    def loglik(lam: float) -> float:
        scale = max(float((qy * qy / (eig + lam)).sum()) / n, 1e-12)
        return -0.5 * n * math.log(scale) - 0.5 * float(np.log(eig + lam).sum())

    lam = max(noise_grid, key=loglik)
    inv = 1.0 / (eig + lam)
    scale = max(float((qy * qy * inv).sum()) / n, 1e-12)
    return q, qy, lam, inv, scale


def pairwise_mean(
    positions: np.ndarray,
    rows: Sequence[int] | np.ndarray,
    y: np.ndarray,
    noise_grid: Sequence[float] = NOISE_GRID,
) -> Callable[[np.ndarray], np.ndarray]:
    """The posterior mean of :func:`pairwise_posterior` (no other device's predictions),
    fitted once to ``y`` at ``rows`` and returned as a function of config indices: it
    costs only the configs asked about (an arm step asks about a few dozen), not a matrix
    of every config of the space against every measurement."""
    pos = _varying(positions)
    at = pos[np.asarray(rows)]
    ybar = float(y.mean())
    q, qy, _, inv, _ = _pairwise_fit(_agreement_cov(at, at), y - ybar, noise_grid)
    alpha = q @ (qy * inv)

    def mean(configs: np.ndarray) -> np.ndarray:
        # Configs that agree alike with every measured one have the same mean; a matrix
        # product may differ in its last bits between rows (by their place in the
        # product), so the mean is rounded: a stable sort then breaks the tie by config
        # order, not by how many configs were asked about at once.
        return np.round(ybar + _agreement_cov(pos[configs], at) @ alpha, 9)

    return mean


def pairwise_posterior(
    positions: np.ndarray,
    extra: np.ndarray,
    rows: Sequence[int] | np.ndarray,
    y: np.ndarray,
    n_samples: int,
    rng: np.random.Generator,
    noise_grid: Sequence[float] = NOISE_GRID,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Posterior of a model with a weight per parameter value and per pair of them.

    ``y`` (at configs ``rows``) is modelled as an intercept plus one term per value of
    each parameter plus one per combination of the values of each pair of parameters
    (all terms independent, same prior variance), i.e. a Gaussian process whose
    covariance of two configs is ``m + m (m - 1) / 2``, ``m`` the number of
    parameters on which they agree (plus ``extra`` columns, other device models'
    predictions, as linear terms). The noise-to-signal ratio is chosen from
    ``noise_grid`` by marginal likelihood and the scale is its maximum-likelihood
    estimate. Returns the posterior mean and standard deviation at every config and
    ``n_samples`` joint posterior samples (Matheron's rule: a prior sample drawn term
    by term, corrected by the data), the role the trees play in the tree model.
    """
    pos = _varying(positions)
    rows = np.asarray(rows)
    cross = _agreement_cov(pos, pos[rows])
    d = pos.shape[1]
    prior_var = d + d * (d - 1) / 2
    if extra.shape[1]:
        # Standardized, with the prior variance of all the parameters' terms together:
        # another device model's prediction may explain as much as this model does.
        ex = (extra - extra.mean(axis=0)) / np.maximum(extra.std(axis=0), 1e-9)
        ex *= math.sqrt(prior_var)
        cross = cross + ex @ ex[rows].T
        prior_var = prior_var + (ex * ex).sum(axis=1)
    ybar = float(y.mean())
    yc = y - ybar
    n = len(rows)
    q, qy, lam, inv, scale = _pairwise_fit(cross[rows], yc, noise_grid)
    cq = cross @ q
    mu = ybar + cq @ (qy * inv)
    sd = np.sqrt(np.maximum(scale * (prior_var - (cq * cq) @ inv), 0.0))
    # Prior samples, term by term: a weight per parameter value, per pair of values.
    f0 = np.zeros((n_samples, len(pos)))
    sigma = math.sqrt(scale)
    sizes = pos.max(axis=0) + 1
    for a in range(d):
        f0 += rng.normal(0.0, sigma, (n_samples, sizes[a]))[:, pos[:, a]]
        for b in range(a + 1, d):
            table = rng.normal(0.0, sigma, (n_samples, sizes[a] * sizes[b]))
            f0 += table[:, pos[:, a] * sizes[b] + pos[:, b]]
    if extra.shape[1]:
        f0 += rng.normal(0.0, sigma, (n_samples, ex.shape[1])) @ ex.T
    noise = rng.normal(0.0, math.sqrt(scale * lam), (n_samples, n))
    resid = yc[None, :] - f0[:, rows] - noise
    samples = ybar + f0 + (cq @ ((q.T @ resid.T) * inv[:, None])).T
    return mu, sd, samples
