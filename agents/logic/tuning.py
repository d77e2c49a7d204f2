"""The fleet tuner: learns from every node's windows and outcomes, recommends configs.

Nodes with the same device model, workload and problem size form a *group* and
share one table of measured configs, so what one node measured, every node of the
group benefits from. Per (node, device, kernel) the tuner keeps a *slot*: what that
kernel runs now, what was rejected or rolled back there, and the one outstanding
recommendation (there is never more than one, so measurements are not confounded).

How to move is a :class:`Strategy`; :class:`agents.logic.search.ModelGuidedSearch`
(a tree-ensemble model of the group's measurements) is the default and
:class:`GuidedLocalSearch` (hint-ranked neighbours) the simple alternative. The tuner
itself only decides *whether* to move (enough evidence, no outstanding
recommendation), keeps every proposal within the nodes' step limit, and shares the
group's best directly when it is clearly better.

>>> t = Tuner()
>>> t.recommend_count
0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelstream.agents.logic.errors import LogicSettingsError, SnapshotError
from kernelstream.agents.logic.transfers import is_host_finding
from kernelstream.kernels.space import Config, SearchSpace
from kernelstream.kernels.transfers import HOST_KNOBS, kernel_space
from kernelstream.schemas.records import (
    Finding,
    Recommendation,
    ReconfigOutcome,
    WindowAggregate,
)

__all__ = [
    "GroupKey",
    "GroupStats",
    "GuidedLocalSearch",
    "Measurement",
    "Proposal",
    "SlotKey",
    "Strategy",
    "Tuner",
    "group_of",
]

_SNAPSHOT_VERSION = 1

GroupKey = tuple[str, str, tuple[int, ...]]
"""(device_model, workload, problem_size): nodes that share measurements."""
SlotKey = tuple[str, int, str]
"""(node, device_index, kernel): one tuned kernel instance."""


def group_of(record: WindowAggregate | Finding | ReconfigOutcome | Recommendation) -> GroupKey:
    """The fleet group a record belongs to."""
    return (record.device_model, record.workload, tuple(record.problem_size))


def _slot_of(record: WindowAggregate | Finding | ReconfigOutcome) -> SlotKey:
    return (record.node, record.device_index, record.kernel)


#: One nanosecond: no kernel launch completes faster. A mean below it (launches timed at
#: 0 us, below the timer's resolution, or denormal numbers a node sent) counts as it, so
#: that the ratios and logarithms of durations the tuner and its model take stay finite.
MIN_MEAN_US = 1e-3


@dataclass
class Measurement:
    """Count-weighted duration of one config in one group."""

    config: Config
    count: int = 0
    sum_us: float = 0.0
    windows: int = 0  # windows with at least the tuner's ``min_launches``

    @property
    def mean_us(self) -> float:
        """The mean duration, at least :data:`MIN_MEAN_US` (inf when nothing was counted)."""
        return max(self.sum_us / self.count, MIN_MEAN_US) if self.count else math.inf


@dataclass
class GroupStats:
    """What a fleet group measured: durations per config id, and configs that failed."""

    configs: dict[str, Measurement] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    # Configs some node of the group is trying now (config id -> expiry), so that
    # nodes explore different candidates in parallel instead of the same one.
    trying: dict[str, float] = field(default_factory=dict)

    def measured(self, config_id: str) -> bool:
        return config_id in self.configs or config_id in self.failed

    def pending(self) -> int:
        """Configs being tried that nobody has measured yet.

        Counted over the smaller side: in a large group's first proposals nearly every
        config being tried is new and few are measured, later the other way round (a
        count over ``trying`` made the first proposals of 1,024 nodes quadratic).
        """
        trying, configs, failed = self.trying, self.configs, self.failed
        if len(trying) <= len(configs) + len(failed):
            return sum(1 for cid in trying if not self.measured(cid))
        done = sum(1 for cid in configs if cid in trying)
        done += sum(1 for cid in failed if cid in trying and cid not in configs)
        return len(trying) - done

    def since(self, config_id: str) -> int:
        """Configs first measured after ``config_id`` (its age, in evaluations)."""
        ids = list(self.configs)
        return len(ids) - 1 - ids.index(config_id) if config_id in self.configs else 0

    def best(self, min_windows: int) -> tuple[str, Measurement] | None:
        """Fastest non-failed config with at least ``min_windows`` good windows."""
        ranked = [
            (m.mean_us, cid, m)
            for cid, m in self.configs.items()
            if cid not in self.failed and m.windows >= min_windows
        ]
        if not ranked:
            return None
        _, cid, m = min(ranked, key=lambda r: (r[0], r[1]))
        return cid, m


@dataclass(frozen=True)
class Proposal:
    """A strategy's answer: where to go, why, and the expected relative speedup over
    the current configuration (``current / expected - 1``: negative for a step
    expected to be slower, such as an exploration step)."""

    config: Config
    reason: str
    expected_gain: float


class KnownId:
    """A strategy's ``allowed`` predicate that can also take the config's id.

    ``KnownId(check)(config)`` is ``check(config, None)``; a strategy that has the id at
    hand (a space index holds every config's) calls ``with_id(config, config_id)``
    instead, and ``check`` skips building it: where most of a large group's candidates
    are being tried by other nodes, a scan rejects hundreds of configs by their ids.
    ``config_id`` must be ``space.config_id(config)`` in the space the strategy was
    given (:func:`id_check`).
    """

    __slots__ = ("check",)

    def __init__(self, check: Callable[[Config, str | None], bool]) -> None:
        self.check = check

    def __call__(self, config: Config) -> bool:
        return self.check(config, None)

    def with_id(self, config: Config, config_id: str) -> bool:
        return self.check(config, config_id)


def id_check(allowed: Callable[[Config], bool]) -> Callable[[Config, str], bool]:
    """``allowed`` as a predicate of (config, its id in the strategy's space): its
    :meth:`KnownId.with_id` where it has one, else ``allowed`` ignoring the id."""
    if isinstance(allowed, KnownId):
        return allowed.check  # its with_id without the frame: a scan calls it per candidate
    with_id: Callable[[Config, str], bool] | None = getattr(allowed, "with_id", None)
    if with_id is not None:
        return with_id
    return lambda config, config_id: allowed(config)


class Strategy(Protocol):
    """Chooses the next config to try for one kernel instance."""

    def propose(
        self,
        finding: Finding,
        space: SearchSpace,
        group: GroupStats,
        current: Config,
        allowed: Callable[[Config], bool],
        related: Sequence[GroupStats] = (),
    ) -> Proposal | None:
        """A config with ``allowed(config)`` true, or None when nothing is worth trying.

        ``related`` are the groups of the same workload and problem size on other
        device models: a strategy may warm-start from them, but only ``group``'s own
        measurements say what is fast here.
        """
        ...


# Which parameters are likely to help, by classification. Parameter names are the
# workload's own, so these are substrings; the direction is +1 (raise the value),
# -1 (lower it) or 0 (either). Earlier hints rank higher.
_HINTS: dict[str, tuple[tuple[str, int], ...]] = {
    "memory_bottleneck": (
        ("smem", 0),
        ("shared", 0),
        ("tile", 0),
        ("vec", 0),
        ("coalesc", 0),
        ("use_", 0),
    ),
    # More blocks and more resident warps: fewer items per thread, smaller tiles.
    "under_utilization": (
        ("per_thread", -1),
        ("items", -1),
        ("ipt", -1),
        ("tile", -1),
        ("grid", +1),
        ("block", 0),
        ("threads", 0),
    ),
    # Amortize the launch: more work per thread or per launch.
    "launch_bound": (
        ("per_thread", +1),
        ("items", +1),
        ("ipt", +1),
        ("batch", +1),
        ("work", +1),
    ),
    "compute_bound": (("unroll", 0), ("tile", 0), ("ilp", 0)),
    "memory_efficient": (("vec", 0), ("items", 0), ("tile", 0)),
}

_EXPLORE_GAIN = 0.05
"""Expected gain of an unmeasured neighbour: a small prior, not a promise."""


@dataclass(frozen=True)
class GuidedLocalSearch:
    """Try unmeasured neighbours of the group's best config, most promising first.

    Radius 1 first, then wider radii when every closer neighbour is measured.
    Candidates are ranked by how well the changed parameter matches what the
    finding suggests (see ``_HINTS``), then by enumeration order, so the choice is
    deterministic.
    """

    radii: tuple[int, ...] = (1, 2)

    def propose(
        self,
        finding: Finding,
        space: SearchSpace,
        group: GroupStats,
        current: Config,
        allowed: Callable[[Config], bool],
        related: Sequence[GroupStats] = (),
    ) -> Proposal | None:
        best = group.best(min_windows=1)
        center = best[1].config if best is not None and space.is_valid(best[1].config) else current
        hints = _HINTS.get(finding.classification, ())
        check = id_check(allowed)
        for radius in self.radii:
            candidates = [
                c
                for c in space.neighbors(center, radius)
                if not group.measured(cid := space.config_id(c)) and check(c, cid)
            ]
            if candidates:
                ranked = sorted(
                    enumerate(candidates),
                    key=lambda ic: (-_hint_score(space, center, ic[1], hints), ic[0]),
                )
                choice = ranked[0][1]
                changed = _changed_param(center, choice)
                return Proposal(
                    config=choice,
                    reason=(
                        f"{finding.classification}: explore {changed}="
                        f"{choice.get(changed)!r} next to {space.config_id(center)} "
                        f"(radius {radius})"
                    ),
                    expected_gain=_EXPLORE_GAIN,
                )
        return None


def _changed_param(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    return next((p for p in a if a[p] != b.get(p)), "")


def _hint_score(
    space: SearchSpace, center: Config, cand: Config, hints: tuple[tuple[str, int], ...]
) -> int:
    p = _changed_param(center, cand)
    values = list(space.params[p])
    direction = 1 if values.index(cand[p]) > values.index(center[p]) else -1
    for rank, (needle, want) in enumerate(hints):
        if needle in p.lower() and want in (0, direction):
            return len(hints) - rank
    return 0


# Refusals of the configuration itself (schemas.records.RejectCode): the node will not
# take it, however often it is sent.
_BARRING_REFUSALS = frozenset({"outside_space", "step_too_large"})

# Refusals a node makes after it found the recommendation's kernel among its own
# (agents.logic.reconfiguration checks in this order): their "before" configuration is
# what the node runs.
_KERNEL_CHECKED_REFUSALS = frozenset({"outside_space", "busy", "already_running", "step_too_large"})

# The rec_id of a slot held for a change the node is measuring that this tuner did not
# issue (a refusal with reject_code "busy").
_NODES_OWN_CHANGE = ""


@dataclass
class _Outstanding:
    rec_id: str
    config_id: str
    expires_at: float


@dataclass
class _Slot:
    current: Config | None = None
    current_id: str | None = None
    current_at: float = -math.inf
    # Configs this node must not get again: rejected by it (its policy says no) ...
    excluded: set[str] = field(default_factory=set)
    # ... or rolled back on it: slower than what it ran then, until its environment
    # changes (a regression restart forgets these).
    rolled_back: set[str] = field(default_factory=set)
    outstanding: _Outstanding | None = None
    # Last window start seen per config: a redelivered window is not counted twice.
    last_window: dict[str, float] = field(default_factory=dict)
    # A host-side change that came while a step was on trial: it goes before the next
    # search step (not snapshotted: the next window's finding brings it again).
    host_next: Finding | None = None

    def barred(self, config_id: str) -> bool:
        """Whether this node must not be sent ``config_id`` (rejected or rolled back)."""
        return config_id in self.excluded or config_id in self.rolled_back


def _host_of(config: Mapping[str, Any]) -> Config:
    """The host knobs (pinned buffers, streams, batching, syncs) of a configuration."""
    return {k: config[k] for k in HOST_KNOBS if k in config}


def _gain(finding: Finding) -> float:
    """The expected gain a host-side finding states (0 when it states none)."""
    value = finding.evidence.get("expected_gain", 0.0)
    return float(value) if isinstance(value, int | float) else 0.0


def _kernel_view(g: GroupStats, own: SearchSpace) -> GroupStats:
    """``g`` by the kernel's own configuration (``own``'s parameters): the measurements
    of one kernel configuration under several host settings counted together.

    Ids of the widened space are the kernel's id followed by the host knobs
    (:func:`kernels.transfers.kernel_space`), so a failed or tried id without a
    measurement is read off its first parameters.
    """
    n = len(own.params)

    def own_id(cid: str) -> str:
        m = g.configs.get(cid)
        return own.config_id(m.config) if m is not None else ",".join(cid.split(",")[:n])

    view = GroupStats()
    for m in g.configs.values():
        if not all(p in m.config for p in own.params):
            continue  # another space's configuration (a related group's kernel differs)
        config = {p: m.config[p] for p in own.params}
        v = view.configs.setdefault(own.config_id(config), Measurement(config))
        v.count += m.count
        v.sum_us += m.sum_us
        v.windows += m.windows
    view.failed = {own_id(cid) for cid in g.failed}
    for cid, until in g.trying.items():
        oid = own_id(cid)
        view.trying[oid] = max(until, view.trying.get(oid, -math.inf))
    return view


def _keeps_host(config: Mapping[str, Any], host: Config) -> bool:
    """Whether a search step to ``config`` leaves the host knobs ``host`` (the current
    configuration's, :func:`_host_of`) as they are.

    They change only through a host-side finding (:meth:`Tuner.recommend_knob`), which
    the node measures by its whole step; the windows a search learns from time the
    kernel alone, which the host knobs do not change.
    """
    return all(config.get(k) == v for k, v in host.items())


class Tuner:
    """Fleet-wide tuner state and the decision to recommend.

    Args:
        ttl_s: a recommendation expires (and frees its slot) this long after issue.
        min_launches: a window needs this many successful launches to count as evidence.
        min_windows: the current config needs this many such windows before moving.
        share_min_gain: the group's best is sent to a node when it is at least this
            much faster (relative mean duration) than what the node runs.
        share_after: ... and once the group measured this many configs after it (or
            when the strategy has nothing left to try, or the node's config fails).
            While the group's best keeps moving, a fresh best is usually soon
            superseded, and a node's window spent re-running it is one new candidate
            fewer; so nodes keep exploring (each trial is still judged against what the
            node runs) and move to the best once it has held. 0 shares at once.
        strategy: how to explore; :class:`agents.logic.search.ModelGuidedSearch` by
            default.
        max_step: the nodes' step limit (positions any one parameter may move in one
            change, ``ReconfigPolicy.max_step``); None for no limit. Proposals beyond it
            would only be rejected.
        regression_restart: the environment changed: a ``regression`` finding (the
            detector's evidence that a config runs slower than its own baseline) for the
            config a node runs, whose window is at least this many times the group's
            mean for the config, restarts that mean from the window, so the group's
            table says what the config does now, not what its history averages to, and
            the node's rolled-back configs may be tried again (they were slower than
            what it ran then). The node then gets the group's best if another config is
            now clearly faster, each move still kept or rolled back on its own
            measurements. A mean that already reflects the slowdown is not restarted
            again.
    """

    def __init__(
        self,
        *,
        ttl_s: float = 20.0,
        min_launches: int = 10,
        min_windows: int = 1,
        share_min_gain: float = 0.03,
        share_after: int = 15,
        strategy: Strategy | None = None,
        max_step: int | None = None,
        regression_restart: float = 1.2,
    ) -> None:
        if not regression_restart > 1.0:
            raise LogicSettingsError(
                f"Tuner.regression_restart must be > 1, got {regression_restart!r}"
            )
        self.regression_restart = regression_restart
        if max_step is not None and max_step < 1:
            raise LogicSettingsError(f"Tuner.max_step must be >= 1 or None, got {max_step}")
        if not (math.isfinite(ttl_s) and ttl_s > 0):
            raise LogicSettingsError(f"Tuner.ttl_s must be > 0, got {ttl_s!r}")
        if min_launches < 1 or min_windows < 1:
            raise LogicSettingsError("Tuner.min_launches and min_windows must be >= 1")
        if not 0 <= share_min_gain < 1:
            raise LogicSettingsError(
                f"Tuner.share_min_gain must be in [0, 1), got {share_min_gain}"
            )
        self.ttl_s = ttl_s
        self.min_launches = min_launches
        self.min_windows = min_windows
        if share_after < 0:
            raise LogicSettingsError(f"Tuner.share_after must be >= 0, got {share_after}")
        self.share_min_gain = share_min_gain
        self.share_after = share_after
        if strategy is None:
            from kernelstream.agents.logic.search import ModelGuidedSearch

            strategy = ModelGuidedSearch()
        self.strategy: Strategy = strategy
        self.max_step = max_step
        self.recommend_count = 0
        self._groups: dict[GroupKey, GroupStats] = {}
        self._slots: dict[SlotKey, _Slot] = {}

    # -- learning -------------------------------------------------------------

    def observe_window(self, agg: WindowAggregate) -> None:
        """Learn from one window aggregate (idempotent for a redelivered window)."""
        self._observe(
            group_of(agg),
            _slot_of(agg),
            dict(agg.config),
            agg.config_id,
            agg.window_start,
            agg.count,
            agg.failures,
            agg.duration_mean_us,
        )

    def observe_finding(self, finding: Finding) -> None:
        """Learn from the measurement a finding carries (same as its window).

        Feed each window through either this or :meth:`observe_window`; both at once
        is harmless, since a window already seen is ignored.
        """
        self._observe(
            group_of(finding),
            _slot_of(finding),
            dict(finding.config),
            finding.config_id,
            finding.window_start,
            finding.count,
            finding.failures,
            finding.duration_mean_us,
            regressed=finding.classification == "regression",
        )

    def _observe(
        self,
        group: GroupKey,
        slot_key: SlotKey,
        config: Config,
        config_id: str,
        window_start: float,
        count: int,
        failures: int,
        mean_us: float,
        regressed: bool = False,
    ) -> None:
        slot = self._slot(slot_key)
        last = slot.last_window.get(config_id)
        if last is not None and window_start <= last:
            return
        slot.last_window[config_id] = window_start
        g = self._group(group)
        if count == 0 and failures > 0:
            g.failed.add(config_id)
        elif count > 0:
            m = g.configs.get(config_id)
            if (
                regressed
                and config_id == slot.current_id
                and m is not None
                and mean_us >= m.mean_us * self.regression_restart
            ):
                # Only the config the node settled on: a trial's slow window is the
                # rollback's to judge, and restarting every config a node tries after a
                # fleet-wide slowdown would walk the node through all the stale ones.
                # In place: the table's order is the order configs were first measured.
                m.count = m.sum_us = m.windows = 0
                # What this node rolled back was slower than what it ran *then*.
                slot.rolled_back.clear()
            self._record(g, config_id, config, count, mean_us)
        if window_start >= slot.current_at:
            slot.current, slot.current_id, slot.current_at = config, config_id, window_start

    def _record(
        self, g: GroupStats, config_id: str, config: Config, count: int, mean: float
    ) -> None:
        m = g.configs.get(config_id)
        if m is None:  # built for a new config only, not on every finding
            m = g.configs[config_id] = Measurement(dict(config))
        m.count += count
        m.sum_us += mean * count
        m.windows += count >= self.min_launches

    def observe_outcome(self, outcome: ReconfigOutcome) -> None:
        """Learn what a node did with a recommendation."""
        slot = self._slot(_slot_of(outcome))
        g = self._group(group_of(outcome))
        after_id = outcome.after_config_id
        if outcome.status == "rejected":
            g.trying.pop(after_id, None)
            self._refused(slot, outcome)
            return
        if outcome.status in ("kept", "rolled_back"):
            g.trying.pop(after_id, None)
            held = slot.outstanding
            if held and held.rec_id in (outcome.recommendation_id, _NODES_OWN_CHANGE):
                slot.outstanding = None
        if outcome.after_mean_us is not None and after_id not in g.configs:
            # Windows usually bring this measurement too; the outcome matters when the
            # node rolled back before a window of the new config closed.
            count = max(outcome.after_count, 1)
            self._record(g, after_id, dict(outcome.after_config), count, outcome.after_mean_us)
        if outcome.status == "rolled_back":
            slot.rolled_back.add(after_id)
            if outcome.after_mean_us is None and outcome.after_count == 0:
                g.failed.add(after_id)  # rolled back with nothing measured: it failed
            self._set_current(slot, outcome.before_config, outcome.before_config_id, outcome.at)
        else:
            self._set_current(slot, outcome.after_config, outcome.after_config_id, outcome.at)

    def _refused(self, slot: _Slot, outcome: ReconfigOutcome) -> None:
        """A node refused a recommendation: what its reason says about the slot.

        Only a refusal of the configuration itself (outside the node's declared space,
        a larger step than the node allows; or a refusal without a code, from a node
        of ``ks.reconfig/1``) bars it from the node. A node that was still measuring
        another change of the kernel (one whose recommendation expired here first, or
        one another worker issued before the fleet group moved here) is waited for: the
        slot is held until that change is kept or rolled back, or for a
        recommendation's lifetime. A refusal of the message (its signature, its
        address, its age, a replay) keeps the slot held until the refused
        recommendation expires, then the tuner tries again.
        """
        code = outcome.reject_code
        ours = slot.outstanding is not None and (
            slot.outstanding.rec_id == outcome.recommendation_id
        )
        if code in _KERNEL_CHECKED_REFUSALS:
            # What the node runs now (the change on trial, when it is measuring one). Only
            # from a node that found the kernel: before that check (another node's
            # message, an unknown kernel) the outcome's "before" is not this slot's.
            self._set_current(slot, outcome.before_config, outcome.before_config_id, outcome.at)
        if code is None or code in _BARRING_REFUSALS:
            slot.excluded.add(outcome.after_config_id)
        elif code == "busy":
            if slot.outstanding is None or ours:
                slot.outstanding = _Outstanding(_NODES_OWN_CHANGE, "", outcome.at + self.ttl_s)
            return
        elif code != "already_running":
            return
        if ours:
            slot.outstanding = None

    @staticmethod
    def _set_current(slot: _Slot, config: Config, config_id: str, at: float) -> None:
        if at >= slot.current_at:
            slot.current, slot.current_id, slot.current_at = dict(config), config_id, at

    # -- deciding -------------------------------------------------------------

    def recommend(self, finding: Finding, space: SearchSpace, now: float) -> Recommendation | None:
        """A new config for the finding's kernel instance, or None.

        None while a recommendation is outstanding, while the current config lacks
        evidence, and when the strategy has nothing left to try.
        """
        slot = self._slot(_slot_of(finding))
        if slot.outstanding is not None:
            if now < slot.outstanding.expires_at:
                return None
            slot.outstanding = None
        host, slot.host_next = slot.host_next, None
        if host is not None:
            # A host-side change (its gain measured, not guessed) before a search step.
            rec = self.recommend_knob(host, space, now)
            if rec is not None:
                return rec
        g = self._group(group_of(finding))
        current = slot.current if slot.current is not None else dict(finding.config)
        cur_id = slot.current_id or finding.config_id
        cur = g.configs.get(cur_id)
        cur_failed = cur_id in g.failed
        if not cur_failed and (cur is None or cur.windows < self.min_windows):
            return None

        knobs = _host_of(current)  # the host knobs a search step keeps

        def allowed(config: Config) -> bool:
            if set(config) != set(space.names):
                return False
            cid = space.config_id(config)
            return (
                cid != cur_id
                and cid not in g.failed
                and not slot.barred(cid)
                and _keeps_host(config, knobs)
                and (self.max_step is None or space.steps(current, config) <= self.max_step)
                and space.is_valid(config)
            )

        def untried(config: Config, config_id: str | None) -> bool:
            # Strategies propose from the space's own enumeration or neighbours, which
            # are valid by construction; validity is checked once, on the proposal. The
            # checks by id come first: in a large group's first proposals most
            # candidates are being tried by another node, and a rejection costs a
            # lookup instead of the config's id and host knobs (the checks are pure,
            # so their order does not change the answer).
            cid = space.config_id(config) if config_id is None else config_id
            return (
                g.trying.get(cid, -math.inf) <= now
                and cid != cur_id
                and cid not in g.failed
                and not slot.barred(cid)
                and _keeps_host(config, knobs)
                and (self.max_step is None or space.steps(current, config) <= self.max_step)
            )

        proposal = self._share_best(g, cur, cur_id, cur_failed, allowed, self.share_after)
        if proposal is None:
            key = group_of(finding)
            related = [o for k, o in self._groups.items() if k[1:] == key[1:] and k != key]
            proposal = self._search(finding, space, g, current, KnownId(untried), related)
        if proposal is None:
            proposal = self._share_best(g, cur, cur_id, cur_failed, allowed, 0)
        # The kernel's own start, under the node's host settings (the widened space's
        # start would be a search of the whole widened space when the default is invalid).
        start = {**kernel_space(space)[0].start_config(), **_host_of(current)}
        if proposal is None and cur_failed and allowed(start):
            proposal = Proposal(start, "current config fails: back to start", 0.0)
        if proposal is None or not allowed(proposal.config):
            return None
        return self._issue(finding, space, slot, g, cur, cur_id, proposal, now)

    def _search(
        self,
        finding: Finding,
        space: SearchSpace,
        g: GroupStats,
        current: Config,
        untried: Callable[[Config], bool],
        related: Sequence[GroupStats],
    ) -> Proposal | None:
        """The strategy's step, in the kernel's own space.

        Under host knobs (a kernel run under a host pattern) a search step keeps them as
        they are (:func:`_keeps_host`), and the windows it learns from time the kernel
        alone, which they do not change: so the strategy searches the kernel's own
        parameters, with every measurement of the group under any host settings
        counted for its kernel configuration, and the step keeps the node's host
        settings. Searching the widened space instead enumerated it whole (336 host
        combinations for each kernel configuration: 450k configurations for the
        matmul workload, 8-20 s per step on the tuner's thread).
        """
        own, added = kernel_space(space)
        if not added:
            return self.strategy.propose(finding, space, g, current, untried, related)
        host = {k: current[k] for k in added}
        proposal = self.strategy.propose(
            finding,
            own,
            _kernel_view(g, own),
            {p: current[p] for p in own.params},
            lambda config: untried({**config, **host}),
            [_kernel_view(o, own) for o in related],
        )
        if proposal is None:
            return None
        return Proposal({**proposal.config, **host}, proposal.reason, proposal.expected_gain)

    def _share_best(
        self,
        g: GroupStats,
        cur: Measurement | None,
        cur_id: str,
        cur_failed: bool,
        allowed: Callable[[Config], bool],
        min_age: int,
    ) -> Proposal | None:
        best = g.best(self.min_windows)
        if best is None or best[0] == cur_id or not allowed(best[1].config):
            return None
        best_id, m = best
        if cur_failed or cur is None:
            return Proposal(m.config, f"current config fails; fleet best is {best_id}", 0.0)
        if m.mean_us > cur.mean_us * (1.0 - self.share_min_gain) or g.since(best_id) < min_age:
            return None
        return Proposal(
            m.config,
            f"fleet best {best_id}: {m.mean_us:.1f} us vs {cur.mean_us:.1f} us on "
            f"{m.count} launches",
            cur.mean_us / m.mean_us - 1.0,
        )

    def recommend_for(
        self, finding: Finding, space: SearchSpace, now: float
    ) -> Recommendation | None:
        """:meth:`recommend_knob` for a host-side finding, :meth:`recommend` otherwise
        (the live tuner agent and replay both decide through this)."""
        if is_host_finding(finding):
            return self.recommend_knob(finding, space, now)
        return self.recommend(finding, space, now)

    def recommend_knob(
        self, finding: Finding, space: SearchSpace, now: float
    ) -> Recommendation | None:
        """The configuration change a host-side finding carries, or None.

        The change (``knob_param``/``knob_value`` in the evidence, e.g. pinned buffers
        or a second stream) goes through the same outstanding/barred bookkeeping as a
        search step, so the node measures it and keeps it or rolls it back.
        """
        param, value = finding.evidence.get("knob_param"), finding.evidence.get("knob_value")
        if not isinstance(param, str) or value is None:
            return None
        slot = self._slot(_slot_of(finding))
        if slot.outstanding is not None and now < slot.outstanding.expires_at:
            # First in line once the step on trial is decided; of one window's host
            # findings, the one that expects to gain most.
            waiting = slot.host_next
            if (
                waiting is None
                or waiting.window_end != finding.window_end
                or _gain(finding) > _gain(waiting)
            ):
                slot.host_next = finding
            return None
        slot.outstanding = None
        slot.host_next = None
        # The change goes onto what the node runs now (a search step kept since the
        # finding's window leaves the knob as it was), unless the knob moved meanwhile.
        base = slot.current if slot.current is not None else dict(finding.config)
        if base.get(param) != finding.config.get(param):
            return None
        config = {**base, param: value}
        if set(config) != set(space.names) or not space.is_valid(config):
            return None
        if slot.barred(space.config_id(config)):
            return None
        gain = _gain(finding)
        reason = f"{finding.classification}: {finding.summary}"
        g = self._group(group_of(finding))
        cur_id = slot.current_id or finding.config_id
        proposal = Proposal(config, reason, gain)
        return self._issue(finding, space, slot, g, g.configs.get(cur_id), cur_id, proposal, now)

    def _issue(
        self,
        finding: Finding,
        space: SearchSpace,
        slot: _Slot,
        g: GroupStats,
        cur: Measurement | None,
        cur_id: str,
        proposal: Proposal,
        now: float,
    ) -> Recommendation:
        self.recommend_count += 1
        config_id = space.config_id(proposal.config)
        rec_id = (
            f"rec/{finding.node}/{finding.device_index}/{finding.kernel}/{self.recommend_count}"
        )
        evidence = dict(finding.evidence)
        evidence.update(
            finding_id=finding.id,
            classification=finding.classification,
            measured_configs=len(g.configs),
        )
        if cur is not None and cur.count:
            evidence["current_mean_us"] = cur.mean_us
        target = g.configs.get(config_id)
        if target is not None and target.count:
            evidence["target_mean_us"] = target.mean_us
        rec = Recommendation(
            id=rec_id,
            node=finding.node,
            device_index=finding.device_index,
            device_model=finding.device_model,
            kernel=finding.kernel,
            workload=finding.workload,
            problem_size=list(finding.problem_size),
            from_config_id=cur_id,
            config=dict(proposal.config),
            config_id=config_id,
            reason=proposal.reason,
            evidence=evidence,
            expected_gain=proposal.expected_gain,
            issued_at=now,
            expires_at=now + self.ttl_s,
        )
        # Only a recommendation that exists holds the slot: one that failed to build
        # (a defect) must not leave the kernel waiting for its expiry.
        slot.outstanding = _Outstanding(rec_id, config_id, now + self.ttl_s)
        g.trying[config_id] = now + self.ttl_s
        return rec

    # -- queries --------------------------------------------------------------

    def best(self, group: GroupKey) -> tuple[Config, float] | None:
        """The group's fastest measured config and its mean duration (us)."""
        g = self._groups.get(group)
        found = g.best(self.min_windows) if g else None
        return (dict(found[1].config), found[1].mean_us) if found else None

    def group(self, group: GroupKey) -> GroupStats | None:
        return self._groups.get(group)

    def outstanding(self, node: str, device_index: int, kernel: str) -> str | None:
        """Id of the outstanding recommendation of a kernel instance (expiry not applied)."""
        slot = self._slots.get((node, device_index, kernel))
        held = slot.outstanding if slot else None
        return held.rec_id if held and held.rec_id != _NODES_OWN_CHANGE else None

    # Looked up first, made only when missing (a setdefault would build a throwaway
    # GroupStats or _Slot, with their sets and dicts, on every finding).
    def _group(self, key: GroupKey) -> GroupStats:
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = GroupStats()
        return g

    def _slot(self, key: SlotKey) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        return slot

    # -- state ----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state; the strategy is not part of it (pass it to :meth:`restore`)."""
        return {
            "version": _SNAPSHOT_VERSION,
            "settings": {
                "ttl_s": self.ttl_s,
                "min_launches": self.min_launches,
                "min_windows": self.min_windows,
                "share_min_gain": self.share_min_gain,
                "share_after": self.share_after,
                "max_step": self.max_step,
                "regression_restart": self.regression_restart,
            },
            "recommend_count": self.recommend_count,
            "groups": [
                {
                    "key": [k[0], k[1], list(k[2])],
                    "configs": {
                        cid: {
                            "config": m.config,
                            "count": m.count,
                            "sum_us": m.sum_us,
                            "windows": m.windows,
                        }
                        for cid, m in g.configs.items()
                    },
                    "failed": sorted(g.failed),
                    "trying": g.trying,
                }
                for k, g in self._groups.items()
            ],
            "slots": [
                {
                    "key": list(k),
                    "current": s.current,
                    "current_id": s.current_id,
                    "current_at": s.current_at if math.isfinite(s.current_at) else None,
                    "excluded": sorted(s.excluded),
                    "rolled_back": sorted(s.rolled_back),
                    "outstanding": None
                    if s.outstanding is None
                    else {
                        "rec_id": s.outstanding.rec_id,
                        "config_id": s.outstanding.config_id,
                        "expires_at": s.outstanding.expires_at,
                    },
                    "last_window": s.last_window,
                }
                for k, s in self._slots.items()
            ],
        }

    @classmethod
    def restore(cls, snapshot: Mapping[str, Any], strategy: Strategy | None = None) -> Tuner:
        """Rebuild a tuner from :meth:`snapshot` output."""
        if snapshot.get("version") != _SNAPSHOT_VERSION:
            raise SnapshotError(
                f"tuner snapshot version {snapshot.get('version')!r} is not "
                f"{_SNAPSHOT_VERSION}; discard it and replay the findings and reconfig topics"
            )
        try:
            self = cls(strategy=strategy, **snapshot["settings"])
            self.recommend_count = int(snapshot["recommend_count"])
            for raw in snapshot["groups"]:
                model, workload, size = raw["key"]
                self._groups[(model, workload, tuple(size))] = GroupStats(
                    configs={cid: Measurement(**m) for cid, m in raw["configs"].items()},
                    failed=set(raw["failed"]),
                    trying=dict(raw["trying"]),
                )
            for raw in snapshot["slots"]:
                node, device_index, kernel = raw["key"]
                out = raw["outstanding"]
                self._slots[(node, int(device_index), kernel)] = _Slot(
                    current=raw["current"],
                    current_id=raw["current_id"],
                    current_at=-math.inf if raw["current_at"] is None else raw["current_at"],
                    excluded=set(raw["excluded"]),
                    # Snapshots before the split kept rolled-back configs in "excluded".
                    rolled_back=set(raw.get("rolled_back", ())),
                    outstanding=None if out is None else _Outstanding(**out),
                    last_window=dict(raw["last_window"]),
                )
        except (KeyError, TypeError, ValueError) as ex:
            raise SnapshotError(f"malformed tuner snapshot: {ex!r}") from ex
        return self
