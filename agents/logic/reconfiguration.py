"""The reconfiguration agent's logic on a node: accept, apply, measure, roll back.

Pure: the node's adapter (:mod:`agents.reconfig_agent`) feeds it recommendations
and measured durations and carries out what it decides. A recommendation is
applied only if its signature is valid (when the node is given a verifier), it is
for this node and device, unexpired, not seen before, inside the workload's
declared space and within the allowed step size; anything else is rejected with
a reason. Ids are remembered only once the signature checked out, so a forged
copy of an id cannot block the genuine recommendation; the memory of ids seen is
pluggable so a node keeps it on disk across restarts. After a change the node measures the new
configuration on at least ``min_launches`` launches over ``min_eval_s`` seconds
and rolls back when it is slower than the configuration it replaced.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from kernelstream.agents.logic.ratios import finite_ratio
from kernelstream.kernels.space import Config, SearchSpace
from kernelstream.schemas import Recommendation, ReconfigOutcome
from kernelstream.schemas.records import RejectCode

__all__ = [
    "Decision",
    "Evaluation",
    "MemorySeenIds",
    "ReconfigPolicy",
    "Reconfigurator",
    "SeenIds",
    "outcome_record",
]


class SeenIds(Protocol):
    """The ids of recommendations a node has considered (replay protection)."""

    def __contains__(self, rec_id: object) -> bool: ...

    def add(self, rec_id: str, expires_at: float, offset: int | None) -> None:
        """Remember ``rec_id`` (read at ``offset``); called again for each replay."""


class MemorySeenIds:
    """In-memory :class:`SeenIds`, bounded: the oldest ids are forgotten first."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._ids: dict[str, None] = {}

    def __contains__(self, rec_id: object) -> bool:
        return rec_id in self._ids

    def add(self, rec_id: str, expires_at: float, offset: int | None) -> None:
        if rec_id in self._ids:
            return
        self._ids[rec_id] = None
        if len(self._ids) > self.capacity:
            self._ids.pop(next(iter(self._ids)))

    def __iter__(self) -> Any:
        return iter(self._ids)


@dataclass(frozen=True)
class ReconfigPolicy:
    """How cautious a node is. ``tolerance``: slowdown accepted as noise (2%)."""

    max_step: int = 8
    min_launches: int = 30
    min_eval_s: float = 0.5
    tolerance: float = 0.02
    baseline_launches: int = 2000
    seen_capacity: int = 100_000
    # A recommendation is a command for now: one issued long ago (a captured message
    # replayed to a node that forgot its id) or valid for hours is refused.
    max_age_s: float = 600.0
    max_lifetime_s: float = 3600.0
    max_clock_skew_s: float = 300.0


@dataclass(frozen=True)
class Decision:
    """What to do with one recommendation."""

    action: Literal["apply", "reject"]
    reason: str
    recommendation: Recommendation
    # Why a recommendation was rejected, for the outcome record (None when applied).
    code: RejectCode | None = None


@dataclass(frozen=True)
class Evaluation:
    """The verdict on an applied change: keep it or roll it back."""

    kernel: str
    status: Literal["kept", "rolled_back"]
    reason: str
    recommendation: Recommendation
    before_config: Config
    after_config: Config
    before_mean_us: float | None
    after_mean_us: float | None
    before_count: int
    after_count: int


@dataclass
class _Trial:
    rec: Recommendation
    before_config: Config
    before: np.ndarray
    applied_at: float
    after: list[np.ndarray] = field(default_factory=list)
    after_failures: int = 0


class Reconfigurator:
    """Per-node state: recent durations per kernel, trials in progress, ids seen."""

    def __init__(
        self,
        node: str,
        device_index: int,
        spaces: Mapping[str, SearchSpace],
        current: Mapping[str, Config],
        policy: ReconfigPolicy | None = None,
        *,
        verify: Callable[[Recommendation], str] | None = None,
        seen: SeenIds | None = None,
    ) -> None:
        self.node = node
        self.device_index = device_index
        self.spaces = dict(spaces)
        self.current: dict[str, Config] = {k: dict(v) for k, v in current.items()}
        self.policy = policy or ReconfigPolicy()
        self._recent: dict[str, deque[np.ndarray]] = {k: deque() for k in self.spaces}
        self._recent_n: dict[str, int] = dict.fromkeys(self.spaces, 0)
        self._trials: dict[str, _Trial] = {}
        self.verify = verify
        self._seen: SeenIds = seen if seen is not None else MemorySeenIds(self.policy.seen_capacity)

    def add_kernel(self, kernel: str, space: SearchSpace, config: Config) -> None:
        """Take on a kernel that joined the node while it runs (a user's new kernel)."""
        self.spaces[kernel] = space
        self.current[kernel] = dict(config)
        self._recent[kernel] = deque()
        self._recent_n[kernel] = 0

    # -- recommendations --------------------------------------------------------
    def consider(self, rec: Recommendation, now: float, offset: int | None = None) -> Decision:
        """Decide whether ``rec`` may be applied.

        Marks its id as seen whether applied or rejected, but only when its
        signature is valid: an id carried by a forged message is not burnt.
        ``offset`` (where the node read it) is remembered with the id.
        """
        bad_signature = self.verify(rec) if self.verify is not None else ""
        if bad_signature:
            return Decision("reject", bad_signature, rec, "bad_signature")
        refusal = self._reject_reason(rec, now)
        self._seen.add(rec.id, rec.expires_at, offset)
        if refusal is not None:
            return Decision("reject", refusal[1], rec, refusal[0])
        return Decision("apply", "valid recommendation", rec)

    def _reject_reason(self, rec: Recommendation, now: float) -> tuple[RejectCode, str] | None:
        if rec.node != self.node:
            return "wrong_node", f"addressed to node {rec.node!r}, this is {self.node!r}"
        if rec.device_index != self.device_index:
            return "wrong_device", (
                f"addressed to device {rec.device_index}, this node runs device {self.device_index}"
            )
        if rec.id in self._seen:
            return "replayed", f"replayed: recommendation {rec.id!r} was seen before"
        if rec.expires_at <= now:
            return "expired", f"expired {now - rec.expires_at:.1f} s ago"
        stale = self._stale_reason(rec, now)
        if stale:
            return "stale", stale
        space = self.spaces.get(rec.kernel)
        if space is None:
            return "unknown_kernel", f"unknown kernel {rec.kernel!r} on this node"
        problems = space.violations(rec.config)
        if problems:
            return "outside_space", "outside the declared space: " + "; ".join(problems)
        if rec.kernel in self._trials:
            return "busy", "another change of this kernel is still being measured"
        current = self.current[rec.kernel]
        if space.config_id(rec.config) == space.config_id(current):
            return "already_running", "already running this configuration"
        step = space.steps(current, rec.config)
        if step > self.policy.max_step:
            return "step_too_large", (
                f"step of {step} positions exceeds the allowed {self.policy.max_step}"
            )
        return None

    def _stale_reason(self, rec: Recommendation, now: float) -> str:
        p = self.policy
        if rec.issued_at > now + p.max_clock_skew_s:
            return (
                f"issued {rec.issued_at - now:.0f} s in the future "
                f"(clock skew limit {p.max_clock_skew_s:.0f} s)"
            )
        if now - rec.issued_at > p.max_age_s:
            return f"stale: issued {now - rec.issued_at:.0f} s ago (limit {p.max_age_s:.0f} s)"
        if rec.expires_at - rec.issued_at > p.max_lifetime_s:
            return (
                f"lifetime of {rec.expires_at - rec.issued_at:.0f} s exceeds the allowed "
                f"{p.max_lifetime_s:.0f} s"
            )
        return ""

    def apply(self, rec: Recommendation, now: float) -> Config:
        """Start a trial of ``rec`` (the caller switches the kernel at a safe point)."""
        before = self._baseline(rec.kernel)
        self._trials[rec.kernel] = _Trial(rec, dict(self.current[rec.kernel]), before, now)
        self.current[rec.kernel] = dict(rec.config)
        self._recent[rec.kernel].clear()
        self._recent_n[rec.kernel] = 0
        return dict(rec.config)

    # -- measurements -----------------------------------------------------------
    def observe(self, kernel: str, duration_us: np.ndarray, ok: np.ndarray) -> None:
        """Record durations measured for ``kernel`` under its current configuration."""
        good = np.asarray(duration_us, dtype=float)[np.asarray(ok, dtype=bool)]
        trial = self._trials.get(kernel)
        if trial is not None:
            trial.after.append(good)
            trial.after_failures += int(len(ok) - len(good))
            return
        recent = self._recent[kernel]
        recent.append(good)
        self._recent_n[kernel] += len(good)
        while recent and self._recent_n[kernel] - len(recent[0]) >= self.policy.baseline_launches:
            self._recent_n[kernel] -= len(recent.popleft())

    def _baseline(self, kernel: str) -> np.ndarray:
        chunks = list(self._recent[kernel])
        data = np.concatenate(chunks) if chunks else np.empty(0)
        return data[-self.policy.baseline_launches :]

    def evaluate(self, now: float) -> list[Evaluation]:
        """Verdicts for trials with enough evidence; a rollback restores ``current``."""
        out: list[Evaluation] = []
        for kernel, trial in list(self._trials.items()):
            after = np.concatenate(trial.after) if trial.after else np.empty(0)
            failed = trial.after_failures > 0 and len(after) == 0
            enough = len(after) >= self.policy.min_launches and now - trial.applied_at >= (
                self.policy.min_eval_s
            )
            if not (failed or enough):
                continue
            del self._trials[kernel]
            b_mean = float(trial.before.mean()) if len(trial.before) else None
            a_mean = float(after.mean()) if len(after) else None
            status: Literal["kept", "rolled_back"]
            if failed:
                status, reason = "rolled_back", f"{trial.after_failures} launches failed"
            elif (
                b_mean is not None
                and a_mean is not None
                and a_mean > b_mean * (1 + self.policy.tolerance)
            ):
                status = "rolled_back"
                reason = f"slower: {a_mean:.1f} us vs {b_mean:.1f} us before"
            else:
                status, reason = "kept", _kept_reason(b_mean, a_mean)
            if status == "rolled_back":
                self.current[kernel] = dict(trial.before_config)
                self._recent[kernel].clear()
                self._recent_n[kernel] = 0
                self.observe(kernel, trial.before, np.ones(len(trial.before), dtype=bool))
            else:
                self.observe(kernel, after, np.ones(len(after), dtype=bool))
            out.append(
                Evaluation(
                    kernel,
                    status,
                    reason,
                    trial.rec,
                    trial.before_config,
                    dict(trial.rec.config),
                    b_mean,
                    a_mean,
                    len(trial.before),
                    len(after),
                )
            )
        return out

    def in_trial(self, kernel: str) -> bool:
        return kernel in self._trials

    def snapshot(self) -> dict[str, Any]:
        seen = list(self._seen) if isinstance(self._seen, MemorySeenIds) else None
        return {"current": self.current, "seen": seen}


def _kept_reason(before: float | None, after: float | None) -> str:
    if before is None or after is None or after <= 0:
        return "no baseline to compare; kept"
    return f"{before / after:.2f}x: {after:.1f} us vs {before:.1f} us before"


def outcome_record(
    rec: Recommendation,
    status: Literal["applied", "kept", "rolled_back", "rejected"],
    reason: str,
    before: dict[str, Any],
    after: dict[str, Any],
    device: Any,
    at: float,
    *,
    reject_code: RejectCode | None = None,
    **measured: Any,
) -> ReconfigOutcome:
    """Build the outcome record a node publishes for ``rec`` (``reject_code``: why it
    was rejected, :attr:`Decision.code`)."""
    space = None
    for w in device.workloads():
        if w.name == rec.kernel:
            space = w.space

    def cid(c: dict[str, Any]) -> str:
        if space is not None and c and set(c) == set(space.names):
            return str(space.config_id(c))
        return ",".join(f"{k}={v}" for k, v in c.items()) or "-"

    before_mean, after_mean = measured.get("before_mean_us"), measured.get("after_mean_us")
    speedup = finite_ratio(before_mean, after_mean) if before_mean and after_mean else None
    return ReconfigOutcome(
        id=f"{rec.id}/{status}/{round(at * 1e6)}",
        recommendation_id=rec.id,
        node=rec.node,
        device_index=rec.device_index,
        device_model=device.spec.name,
        kernel=rec.kernel,
        workload=rec.workload,
        problem_size=rec.problem_size,
        status=status,
        reason=reason,
        before_config=before,
        before_config_id=cid(before),
        after_config=after,
        after_config_id=cid(after),
        before_count=measured.get("before_count", 0),
        after_count=measured.get("after_count", 0),
        before_mean_us=before_mean,
        after_mean_us=after_mean,
        speedup=speedup,
        at=at,
        reject_code=reject_code,
    )
