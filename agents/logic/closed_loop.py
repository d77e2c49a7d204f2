"""The tuning loop without Kafka: nodes, windows, detector, tuner, reconfiguration.

:class:`ClosedLoop` wires the pipeline's own parts the way the worker and the nodes
do, with simulated time in place of the broker: each round every node runs its
kernel for one window (:class:`kernels.runner.WorkloadRunner`), its launches are
batched (:class:`kernels.runner.LaunchBatcher`) and windowed
(:class:`agents.logic.windowing.Windower`), each closed window is classified
(:class:`agents.logic.detection.Detector`) and handed to the
:class:`agents.logic.tuning.Tuner`, whose recommendations the nodes vet, apply at
the next round and keep or roll back (:class:`agents.logic.reconfiguration.Reconfigurator`).

It is how ``kernelstream bench tuning`` scores the tuner on measured search spaces,
and how tests check tuning behaviour quickly. The tuner sees the device only through
measured launches; ``truth`` (a config id -> mean duration map, e.g. a cache file's
own means) is used for scoring alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernelstream.agents.logic.detection import Detector
from kernelstream.agents.logic.reconfiguration import ReconfigPolicy, Reconfigurator, outcome_record
from kernelstream.agents.logic.tuning import Tuner, group_of
from kernelstream.agents.logic.windowing import Windower, WindowSpec
from kernelstream.kernels.runner import LaunchBatcher, WorkloadRunner
from kernelstream.schemas.records import Recommendation, RejectCode

__all__ = ["ClosedLoop", "LoopNode", "LoopTrace"]


@dataclass
class LoopTrace:
    """What happened, in the order it happened.

    ``evaluated`` lists each config id the group measured (or saw fail) for the first
    time, with the round it happened in; ``best_true`` the scoring truth of the best
    config evaluated so far after each evaluation (None without a truth).
    """

    evaluated: list[tuple[str, int]] = field(default_factory=list)
    best_true: list[float] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    rounds: int = 0

    def evaluations_to(self, target: float) -> int | None:
        """Evaluations until the best evaluated config's truth is at most ``target``."""
        return next((i + 1 for i, b in enumerate(self.best_true) if b <= target), None)

    def rounds_to(self, target: float) -> int | None:
        """Rounds (windows per node) until that happened."""
        n = self.evaluations_to(target)
        return None if n is None else self.evaluated[n - 1][1]


@dataclass
class LoopNode:
    """One simulated node: a device, its runner and batcher, its reconfigurator."""

    name: str
    device: Any
    workload: Any
    runner: WorkloadRunner
    batcher: LaunchBatcher
    reconf: Reconfigurator
    pending: list[Recommendation] = field(default_factory=list)
    newest: float = -math.inf  # event time of its latest launch


class ClosedLoop:
    """N nodes of one device model tuning one workload through the pipeline's logic.

    Args:
        devices: one device per node (e.g. :class:`kernels.backends.trace.TraceDevice`
            with different seeds); all must offer ``workload_name``.
        workload_name: the kernel to tune.
        tuner: shared by all nodes, as the worker's tuner is; pass one that already
            learned from another device model, with a strategy that uses it
            (``ModelGuidedSearch(warm_start=True)``), to measure a warm start.
        window_s: event-time window length (simulated seconds).
        policy: the nodes' reconfiguration policy.
        truth: config id -> true mean duration, for scoring only.
        tick_s: the nodes' first tick of each window (a node ticks every 50 ms); see
            :meth:`step`.
        node_prefix: the nodes are named ``{node_prefix}-0``, ``-1``, ... The tuner keeps
            per-node state (what a node runs, what was rolled back on it, its latest
            window), so loops that share a tuner and stand for different machines (another
            GPU model tuned first, for a warm start) need prefixes of their own.
    """

    def __init__(
        self,
        devices: Sequence[Any],
        workload_name: str,
        tuner: Tuner,
        *,
        window_s: float = 1.0,
        policy: ReconfigPolicy | None = None,
        truth: Mapping[str, float] | None = None,
        max_launches_per_s: float = 20_000.0,
        tick_s: float = 0.05,
        node_prefix: str = "node",
    ) -> None:
        if not devices:
            raise ValueError("ClosedLoop needs at least one device")
        if not 0 < 2 * tick_s < window_s:
            raise ValueError(f"tick_s must be in (0, window_s / 2), got {tick_s}")
        self.tuner = tuner
        self.window_s = window_s
        self.tick_s = tick_s
        self.truth = truth
        self.windower = Windower(
            WindowSpec(
                size_s=window_s,
                out_of_orderness_s=0.0,
                allowed_lateness_s=0.0,
                idle_timeout_s=1e9,
            )
        )
        self.detector = Detector()
        self.policy = policy or ReconfigPolicy(min_eval_s=0.0)
        self.nodes: list[LoopNode] = []
        for i, device in enumerate(devices):
            by_name = {w.name: w for w in device.workloads()}
            if workload_name not in by_name:
                raise ValueError(f"device {i} has no workload {workload_name!r}")
            w = by_name[workload_name]
            name = f"{node_prefix}-{i}"
            runner = WorkloadRunner(device, [w], max_launches_per_s=max_launches_per_s)
            self.nodes.append(
                LoopNode(
                    name,
                    device,
                    w,
                    runner,
                    LaunchBatcher(device, name, max_launches=1 << 20, max_delay_s=window_s),
                    Reconfigurator(
                        name,
                        getattr(device, "device_index", 0),
                        {w.name: w.space},
                        {w.name: runner.config_of(w.name)},
                        self.policy,
                    ),
                )
            )
        self.space = self.nodes[0].workload.space
        self.trace = LoopTrace()
        self._seen: set[str] = set()
        self._best = math.inf
        self._now = 0.0

    def run(self, rounds: int, stop: Callable[[LoopTrace], bool] | None = None) -> LoopTrace:
        """Run up to ``rounds`` windows per node, or until ``stop(trace)`` is true."""
        for _ in range(rounds):
            self.step()
            if stop is not None and stop(self.trace):
                break
        return self.trace

    def step(self) -> None:
        """One round (window) of every node, ticking as a node does.

        1. The nodes tick (``tick_s``) until every node's launches passed the end of
           the previous window, which closes it (usually the first tick; a node that
           just rolled back measures its config with one launch first); each closed
           window is classified and tuned, and the recommendations go out.
        2. Each node applies what it got at that safe point, runs its next tick (a new
           configuration's first tick measures it with one launch, as the runner does)
           and the rest of the window; its reconfigurator keeps or rolls back the change.

        A node's window therefore holds (almost) only the configuration it tries, and
        the tuner has both the window and the keep/rollback outcome before the next
        round, as a worker has them within a tick or two of the window's end.
        """
        self._now += self.window_s
        now = self._now
        start = t = now - self.window_s
        while t + 2 * self.tick_s < now and (
            t == start or any(node.newest < start for node in self.nodes)
        ):
            t += self.tick_s
            for node in self.nodes:
                self._run(node, t)
            self._close(t)
        for node in self.nodes:
            for rec in node.pending:
                self._deliver(node, rec, t)
            node.pending.clear()
            self._run(node, t + self.tick_s)
            self._run(node, now)
            for ev in node.reconf.evaluate(now):
                if ev.status == "rolled_back":
                    node.runner.set_config(node.workload.name, dict(ev.before_config))
                self._outcome(node, ev.recommendation, ev.status, ev, now)
        self.trace.rounds += 1

    def _run(self, node: LoopNode, until: float) -> None:
        """The node's launches up to ``until`` (one tick), into its reconfigurator and windows."""
        kernel = node.workload.name
        for chunk in node.runner.tick(until):
            if len(chunk.t_end):
                node.newest = max(node.newest, float(chunk.t_end[-1]))
            node.reconf.observe(kernel, chunk.duration_us, chunk.ok)
            for batch in node.batcher.add(chunk, until):
                self.windower.add_runs(batch.record(), until)
        for batch in node.batcher.flush():
            self.windower.add_runs(batch.record(), until)

    def _close(self, now: float) -> None:
        """Classify and tune every window the launches so far completed."""
        for agg in self.windower.poll(now):
            finding = self.detector.classify(agg)
            self.tuner.observe_finding(finding)
            self._score(group_of(finding))
            proposed = self.tuner.recommend(finding, self.space, now)
            if proposed is not None:
                target = next(n for n in self.nodes if n.name == proposed.node)
                target.pending.append(proposed)

    def _deliver(self, node: LoopNode, rec: Recommendation, now: float) -> None:
        decision = node.reconf.consider(rec, now)
        if decision.action == "apply":
            node.runner.set_config(rec.kernel, node.reconf.apply(rec, now))
        else:
            self._outcome(
                node, rec, "rejected", None, now, reason=decision.reason, code=decision.code
            )

    def _outcome(
        self,
        node: LoopNode,
        rec: Recommendation,
        status: str,
        ev: Any,
        now: float,
        reason: str = "",
        code: RejectCode | None = None,
    ) -> None:
        self.trace.outcomes[status] = self.trace.outcomes.get(status, 0) + 1
        before = dict(ev.before_config) if ev else node.reconf.current[rec.kernel]
        measured = (
            {
                "before_count": ev.before_count,
                "after_count": ev.after_count,
                "before_mean_us": ev.before_mean_us,
                "after_mean_us": ev.after_mean_us,
            }
            if ev
            else {}
        )
        outcome = outcome_record(
            rec,
            status,  # type: ignore[arg-type]
            ev.reason if ev else reason,
            before,
            dict(rec.config),
            node.device,
            now,
            reject_code=code,
            **measured,
        )
        self.tuner.observe_outcome(outcome)
        self._score(group_of(outcome))

    def _score(self, key: Any) -> None:
        g = self.tuner.group(key)
        if g is None:
            return
        for cid in [*g.configs, *sorted(g.failed)]:  # sorted: set order varies per process
            if cid in self._seen:
                continue
            self._seen.add(cid)
            self.trace.evaluated.append((cid, self.trace.rounds + 1))
            if self.truth is not None:
                self._best = min(self._best, self.truth.get(cid, math.inf))
                self.trace.best_true.append(self._best)
