"""The fleet tuner: constraints, one outstanding recommendation, sharing, convergence."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from kernelstream.agents.logic.detection import Detector
from kernelstream.agents.logic.errors import LogicSettingsError, SnapshotError
from kernelstream.agents.logic.search import ModelGuidedSearch
from kernelstream.agents.logic.tuning import (
    MIN_MEAN_US,
    GuidedLocalSearch,
    Strategy,
    Tuner,
    group_of,
)
from kernelstream.agents.logic.windowing import Windower, WindowSpec, make_example_batch
from kernelstream.kernels.space import Config, Constraint, SearchSpace
from kernelstream.schemas.records import Finding, Recommendation, ReconfigOutcome

SPACE = SearchSpace(
    "tiny",
    {"block": (64, 128, 256, 512), "tile": (1, 2, 4), "use_smem": (False, True)},
    default={"block": 128, "tile": 1, "use_smem": False},
    constraints=(
        Constraint("block*tile <= 1024", lambda c: int(c["block"]) * int(c["tile"]) <= 1024),
    ),
)
START: Config = {"block": 128, "tile": 1, "use_smem": False}
GROUP = ("A100", "k", (1024,))


def finding(
    config: Config = START,
    mean: float = 100.0,
    *,
    node: str = "n1",
    count: int = 100,
    failures: int = 0,
    t: float = 0.0,
    classification: str = "memory_bottleneck",
    space: SearchSpace = SPACE,
) -> Finding:
    return Finding(
        id=f"{node}/{t}",
        node=node,
        device_index=0,
        device_model="A100",
        kernel="k",
        workload="k",
        problem_size=[1024],
        config=dict(config),
        config_id=space.config_id(config),
        window_start=t,
        window_end=t + 1.0,
        classification=classification,
        evidence={"bw_fraction": 0.2},
        summary="s.",
        count=count,
        failures=failures,
        duration_mean_us=mean,
    )


def outcome(
    rec: Recommendation, status: str, before: Config, space: SearchSpace = SPACE, **kw: Any
) -> ReconfigOutcome:
    return ReconfigOutcome(
        id=f"{rec.id}/{status}",
        recommendation_id=rec.id,
        node=rec.node,
        device_index=rec.device_index,
        device_model=rec.device_model,
        kernel=rec.kernel,
        workload=rec.workload,
        problem_size=rec.problem_size,
        status=status,
        reason="test",
        before_config=before,
        before_config_id=space.config_id(before),
        after_config=rec.config,
        after_config_id=rec.config_id,
        at=kw.pop("at", rec.issued_at + 1.0),
        **kw,
    )


def seen(tuner: Tuner, f: Finding, now: float = 0.0) -> Recommendation | None:
    tuner.observe_finding(f)
    return tuner.recommend(f, SPACE, now)


def test_needs_evidence_before_moving() -> None:
    t = Tuner()
    assert seen(t, finding(count=3)) is None  # too few launches in the window
    rec = seen(t, finding(t=1.0))
    assert rec is not None and rec.from_config_id == SPACE.config_id(START)


def test_recommendation_fields() -> None:
    rec = seen(Tuner(ttl_s=20.0), finding(), now=50.0)
    assert rec is not None
    assert rec.id == "rec/n1/0/k/1"
    assert (rec.issued_at, rec.expires_at) == (50.0, 70.0)
    assert rec.config_id == SPACE.config_id(rec.config) and SPACE.is_valid(rec.config)
    assert SPACE.steps(START, rec.config) == 1
    assert rec.evidence["classification"] == "memory_bottleneck"
    assert rec.evidence["current_mean_us"] == 100.0
    assert rec.expected_gain >= 0
    # memory_bottleneck prefers shared memory / tile changes over block size
    assert rec.config != {**START, "block": 64} and rec.config != {**START, "block": 256}


def test_one_outstanding_per_kernel_instance_and_expiry() -> None:
    t = Tuner(ttl_s=20.0)
    first = seen(t, finding(), now=0.0)
    assert first is not None
    assert seen(t, finding(t=1.0), now=10.0) is None
    assert t.outstanding("n1", 0, "k") == first.id
    # another node of the same group has its own slot
    assert seen(t, finding(node="n2"), now=10.0) is not None
    # "applied" is not the end of a trial; expiry frees the slot
    t.observe_outcome(outcome(first, "applied", START, at=5.0))
    assert seen(t, finding(first.config, 90.0, t=2.0), now=19.9) is None
    again = seen(t, finding(first.config, 90.0, t=3.0), now=20.0)
    assert again is not None and again.id != first.id


def test_terminal_outcome_frees_slot_and_moves_current() -> None:
    t = Tuner()
    rec = seen(t, finding())
    assert rec is not None
    t.observe_outcome(outcome(rec, "kept", START, before_mean_us=100.0, after_mean_us=80.0))
    assert t.outstanding("n1", 0, "k") is None
    nxt = seen(t, finding(rec.config, 80.0, t=2.0), now=1.0)
    assert nxt is not None and nxt.from_config_id == rec.config_id


@pytest.mark.parametrize("strategy", ["model", "local"])
def test_never_invalid_failed_rejected_or_current(strategy: str) -> None:
    t = Tuner(strategy=GuidedLocalSearch() if strategy == "local" else None)
    failed: Config = {"block": 128, "tile": 2, "use_smem": False}
    # n9 runs the failed config; what it is sent meanwhile is reserved for it
    r9 = seen(t, finding(failed, 0.0, count=0, failures=5, node="n9"))
    elsewhere = {r9.config_id} if r9 is not None else set()
    recommended: list[str] = []
    now = 0.0
    while (rec := seen(t, finding(t=now), now=now)) is not None:
        assert SPACE.is_valid(rec.config)
        assert rec.config_id != SPACE.config_id(START)
        assert rec.config_id != SPACE.config_id(failed)
        assert rec.config_id not in recommended
        recommended.append(rec.config_id)
        t.observe_outcome(outcome(rec, "rejected", START, at=now))
        now += 1.0
    if strategy == "local":  # every valid config within radius 2 of the start ...
        reachable = {SPACE.config_id(c) for c in SPACE.neighbors(START, 2)}
    else:  # ... or, model-guided, every valid config of the space
        reachable = {SPACE.config_id(c) for c in SPACE} - {SPACE.config_id(START)}
    expected = reachable - {SPACE.config_id(failed)}  # but the failed one
    assert expected - elsewhere <= set(recommended) <= expected
    assert "block=512,tile=4,use_smem=False" not in recommended  # violates the constraint


def test_failed_current_config_moves_to_fleet_best() -> None:
    t = Tuner()
    good: Config = {"block": 256, "tile": 1, "use_smem": False}
    seen(t, finding(good, 50.0, node="n2"))
    rec = seen(t, finding(START, 0.0, count=0, failures=10, t=1.0))
    assert rec is not None and rec.config == good


def test_fleet_sharing_node_b_gets_node_a_best() -> None:
    t = Tuner(share_after=0)
    best: Config = {"block": 256, "tile": 2, "use_smem": True}
    seen(t, finding(START, 100.0, node="a"))
    t.observe_finding(finding(best, 60.0, node="a", t=1.0))
    assert t.best(GROUP) == (best, 60.0)
    rec = seen(t, finding(START, 100.0, node="b", t=5.0))
    assert rec is not None and rec.node == "b"
    assert rec.config == best and "fleet best" in rec.reason
    assert rec.expected_gain == pytest.approx(100.0 / 60.0 - 1.0)


def test_a_fresh_fleet_best_is_shared_once_it_has_held() -> None:
    # While the group's best keeps moving, a node keeps exploring rather than spend a
    # window re-running a best that is soon superseded; once the group measured
    # ``share_after`` configs after it, the best goes to the node.
    t = Tuner(share_after=3)
    best: Config = {"block": 256, "tile": 2, "use_smem": True}
    seen(t, finding(START, 100.0, node="a"))
    t.observe_finding(finding(best, 60.0, node="a", t=1.0))
    rec = seen(t, finding(START, 100.0, node="b", t=5.0))
    assert rec is not None and rec.config != best
    group = t.group(GROUP)
    assert group is not None and group.since(SPACE.config_id(best)) == 0
    others = [c for c in SPACE if c not in (START, best)][:3]
    for k, c in enumerate(others):
        t.observe_finding(finding(c, 90.0, node="a", t=2.0 + k))
    assert group.since(SPACE.config_id(best)) == 3
    t.observe_outcome(outcome(rec, "rolled_back", START, after_mean_us=120.0, after_count=50))
    rec = seen(t, finding(START, 100.0, node="b", t=9.0), now=6.0)
    assert rec is not None and rec.config == best and "fleet best" in rec.reason


def test_best_within_noise_is_not_shared() -> None:
    t = Tuner(share_min_gain=0.03)
    other: Config = {"block": 256, "tile": 1, "use_smem": False}
    t.observe_finding(finding(other, 99.0, node="a"))
    rec = seen(t, finding(START, 100.0, node="b"))
    assert rec is None or rec.config != other


def test_rolled_back_config_not_sent_again_to_that_node() -> None:
    t = Tuner()
    rec = seen(t, finding())
    assert rec is not None
    t.observe_outcome(
        outcome(
            rec, "rolled_back", START, before_mean_us=100.0, after_mean_us=130.0, after_count=50
        )
    )
    group = t.group(GROUP)
    assert group is not None and group.configs[rec.config_id].mean_us == 130.0
    nxt = seen(t, finding(t=2.0), now=1.0)
    assert nxt is not None and nxt.config_id != rec.config_id
    assert nxt.from_config_id == SPACE.config_id(START)


def test_a_regressed_config_is_noticed_and_the_node_moves_to_the_group_best() -> None:
    # The environment changed: the node's config, the group's best, now runs 2x slower.
    # The detector's regression finding restarts the group's mean of that config from
    # the window, so the next-best config is clearly faster now and goes to the node.
    other: Config = {"block": 256, "tile": 1, "use_smem": False}
    start_id = SPACE.config_id(START)

    def history(t: Tuner) -> None:
        t.observe_finding(finding(other, 120.0, node="a"))
        for k in range(20):
            t.observe_finding(finding(START, 100.0, t=float(k)))
        assert t.best(GROUP) == (START, 100.0)

    t = Tuner(share_after=0)
    history(t)
    slow = finding(START, 200.0, t=20.0, classification="regression")
    rec = seen(t, slow, now=20.0)
    group = t.group(GROUP)
    assert group is not None and group.configs[start_id].mean_us == 200.0
    assert rec is not None and rec.config == other and "fleet best" in rec.reason
    # The table keeps the order configs were first measured in.
    assert list(group.configs) == [SPACE.config_id(other), start_id]
    # Once the mean reflects the slowdown, later regression findings (still judged
    # against the detector's old baseline) add to it instead of restarting it.
    t.observe_finding(finding(START, 220.0, t=21.0, classification="regression"))
    assert group.configs[start_id].mean_us == pytest.approx(210.0)
    assert group.configs[start_id].count == 200

    # The same window not classified as a regression only nudges 20 windows of history
    # (mean 104.8 us): the node stays where it is.
    quiet = Tuner(share_after=0)
    history(quiet)
    rec = seen(quiet, finding(START, 200.0, t=20.0), now=20.0)
    assert rec is None or rec.config != other
    with pytest.raises(LogicSettingsError, match="regression_restart"):
        Tuner(regression_restart=1.0)


def test_redelivered_window_is_counted_once() -> None:
    t = Tuner()
    f = finding()
    t.observe_finding(f)
    t.observe_finding(f)
    group = t.group(group_of(f))
    assert group is not None and group.configs[f.config_id].count == 100


def test_settings_validated() -> None:
    with pytest.raises(LogicSettingsError):
        Tuner(ttl_s=0.0)
    with pytest.raises(LogicSettingsError):
        Tuner(share_min_gain=1.5)


# -- closed loop: windows -> detector -> tuner -> simulated node ---------------------

LOOP_SPACE = SearchSpace(
    "loop",
    {"block": (32, 64, 128, 256, 512, 1024), "tile": (1, 2, 4, 8)},
    default={"block": 32, "tile": 1},
    constraints=(
        Constraint("block*tile <= 2048", lambda c: int(c["block"]) * int(c["tile"]) <= 2048),
    ),
)
OPTIMUM = {"block": 256, "tile": 2}


def _cost(c: Config) -> float:
    """Convex bowl with its minimum at OPTIMUM (50 us)."""
    b, t = math.log2(int(c["block"])), math.log2(int(c["tile"]))
    return 50.0 * (1 + 0.3 * (b - 8) ** 2 + 0.2 * (t - 1) ** 2)


def _run_loop(
    nodes: list[str], steps: int, strategy: Strategy | None = None
) -> tuple[Tuner, list[Recommendation], dict[str, int]]:
    """Each step: one window per node; a trial is judged on the next window.

    The fleet mechanics are tested with the deterministic neighbour search by default.
    """
    w = Windower(WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.0))
    det, tuner = Detector(), Tuner(ttl_s=5.0, strategy=strategy or GuidedLocalSearch())
    current = {n: LOOP_SPACE.start_config() for n in nodes}
    trial: dict[str, tuple[Recommendation, Config, float]] = {}
    reached: dict[str, int] = {}
    recs: list[Recommendation] = []
    seq = dict.fromkeys(nodes, 0)
    rng = np.random.default_rng(3)
    for step in range(steps):
        for n in nodes:
            d = _cost(current[n]) * (1 + 0.01 * rng.standard_normal(20))
            ts = step + 0.01 + 0.04 * np.arange(20)
            b = make_example_batch(
                ts.tolist(), d.tolist(), node=n, kernel="k", config=current[n], seq_start=seq[n]
            )
            seq[n] += 20
            w.add(b, now=float(step))
        for agg in w.flush_all():
            f = det.classify(agg)
            tuner.observe_finding(f)
            n = agg.node
            if n in trial:  # the node judges its trial like the reconfiguration agent
                rec, before, before_mean = trial.pop(n)
                worse = agg.duration_mean_us > before_mean * 1.02
                status = "rolled_back" if worse else "kept"
                if worse:
                    current[n] = before
                tuner.observe_outcome(
                    outcome(
                        rec,
                        status,
                        before,
                        LOOP_SPACE,
                        before_mean_us=before_mean,
                        after_mean_us=agg.duration_mean_us,
                        after_count=agg.count,
                        at=float(step) + 0.99,
                    )
                )
                continue
            new = tuner.recommend(f, LOOP_SPACE, now=float(step))
            if new is not None:
                recs.append(new)
                trial[n] = (new, current[n], agg.duration_mean_us)
                current[n] = dict(new.config)
        for n in nodes:
            if current[n] == OPTIMUM and n not in trial:
                reached.setdefault(n, step)
    return tuner, recs, reached


def test_single_node_converges_to_optimum() -> None:
    tuner, recs, reached = _run_loop(["n1"], steps=80)
    assert "n1" in reached and reached["n1"] <= 60, reached
    best = tuner.best(("A100-SXM4-80GB", "k", (1 << 20,)))
    assert best is not None and best[0] == OPTIMUM
    # once converged, it stops moving the node
    assert max(r.issued_at for r in recs) < 40
    for r in recs:
        assert LOOP_SPACE.is_valid(r.config)


def test_fleet_converges_faster_than_one_node() -> None:
    _, _, alone = _run_loop(["n1"], steps=80)
    _, recs, fleet = _run_loop(["n1", "n2", "n3"], steps=80)
    assert set(fleet) == {"n1", "n2", "n3"}
    assert min(fleet.values()) < alone["n1"]
    assert max(fleet.values()) <= alone["n1"]
    assert any("fleet best" in r.reason for r in recs)
    # nodes explore different candidates at the same time
    first_round = [r.config_id for r in recs if r.issued_at == recs[0].issued_at]
    assert len(first_round) == len(set(first_round)) == 3


def test_loop_is_deterministic() -> None:
    a = _run_loop(["n1", "n2"], steps=30)
    b = _run_loop(["n1", "n2"], steps=30)
    assert a[1] == b[1]
    assert a[0].snapshot() == b[0].snapshot()


def test_snapshot_restore_continues_identically() -> None:
    t = Tuner()
    rec = seen(t, finding())
    assert rec is not None
    t.observe_outcome(outcome(rec, "kept", START, after_mean_us=90.0, after_count=40))
    seen(t, finding(node="n2"))
    r = Tuner.restore(json.loads(json.dumps(t.snapshot())), strategy=ModelGuidedSearch())
    assert r.snapshot() == t.snapshot()
    f = finding(rec.config, 90.0, t=3.0)
    assert seen(r, f, now=2.0) == seen(t, f, now=2.0)
    with pytest.raises(SnapshotError):
        Tuner.restore({"version": 2})


def test_snapshot_keeps_rolled_back_configs_apart_and_reads_older_snapshots() -> None:
    t = Tuner(regression_restart=1.5)
    rec = seen(t, finding())
    assert rec is not None
    t.observe_outcome(outcome(rec, "rolled_back", START, after_mean_us=130.0, after_count=50))
    snap = json.loads(json.dumps(t.snapshot()))
    assert snap["settings"]["regression_restart"] == 1.5
    assert snap["slots"][0]["rolled_back"] == [rec.config_id]
    assert snap["slots"][0]["excluded"] == []
    assert Tuner.restore(snap).snapshot() == snap
    # Before the split a snapshot had no "rolled_back" (nor the setting) and kept
    # rolled-back configs in "excluded": they stay off that node.
    del snap["slots"][0]["rolled_back"], snap["settings"]["regression_restart"]
    snap["slots"][0]["excluded"] = [rec.config_id]
    old = Tuner.restore(snap).snapshot()
    assert old["settings"]["regression_restart"] == 1.2
    assert (old["slots"][0]["excluded"], old["slots"][0]["rolled_back"]) == ([rec.config_id], [])


@pytest.mark.parametrize("mean", [0.0, 5e-324])
def test_launches_timed_at_zero_us_keep_every_gain_finite(mean: float) -> None:
    # Valid findings (durations >= 0): a fleet best of 0 us is shared, as 1 ns.
    t = Tuner(share_after=0)
    best: Config = {"block": 256, "tile": 2, "use_smem": True}
    seen(t, finding(START, 100.0, node="a"))
    t.observe_finding(finding(best, mean, node="a", t=1.0))
    rec = seen(t, finding(START, 100.0, node="b", t=5.0))
    assert rec is not None and rec.config == best
    assert rec.expected_gain == 100.0 / MIN_MEAN_US - 1.0
    # The model-guided search takes logarithms of such measurements.
    t = Tuner(strategy=ModelGuidedSearch())
    config, issued = START, 0
    for step in range(16):
        rec = seen(t, finding(config, mean if step % 2 else 100.0, t=float(step)), float(step))
        if rec is not None:
            issued += 1
            assert math.isfinite(rec.expected_gain)
            t.observe_outcome(outcome(rec, "kept", config, at=step + 0.5))
            config = dict(rec.config)
    assert issued >= 4


def test_names_at_their_length_limit_give_valid_recommendations_and_outcomes() -> None:
    long = "n" * 200
    f = finding(node=long).model_copy(update={"id": f"{long}:0/{'k' * 200}/{'c' * 200}/0.0"})
    rec = seen(Tuner(), f)
    assert rec is not None and rec.node == long
    Recommendation.model_validate(rec.to_wire())  # its id and evidence within bounds
    ReconfigOutcome.model_validate(outcome(rec, "kept", START).to_wire())


def test_findings_at_their_largest_durations_and_counts_keep_the_tuner_finite() -> None:
    # The largest a finding may state (3.6e9 us, 2^53 launches), window after window.
    t = Tuner(strategy=ModelGuidedSearch())
    config, issued = START, 0
    for step in range(16):
        f = finding(config, 3.6e9 if step % 2 else 1e-3, count=1 << 53, t=float(step))
        rec = seen(t, f, float(step))
        if rec is not None:
            issued += 1
            Recommendation.model_validate(rec.to_wire())
            t.observe_outcome(outcome(rec, "kept", config, at=step + 0.5))
            config = dict(rec.config)
    assert issued >= 4


def test_a_recommendation_that_fails_to_build_does_not_hold_the_slot() -> None:
    t = Tuner()
    bad = finding().model_copy(update={"evidence": {"bw_fraction": math.inf}})  # a defect
    with pytest.raises(ValueError):
        seen(t, bad)
    assert t.outstanding("n1", 0, "k") is None
    assert seen(t, finding(t=1.0)) is not None  # the next finding is served at once


def excluded(t: Tuner, node: str = "n1") -> set[str]:
    [slot] = [s for s in t.snapshot()["slots"] if s["key"] == [node, 0, "k"]]
    return set(slot["excluded"])


@pytest.mark.parametrize("code", ["outside_space", "step_too_large", None])
def test_a_refusal_of_the_configuration_bars_it_from_the_node(code: str | None) -> None:
    t = Tuner()
    rec = seen(t, finding())
    assert rec is not None
    # No code: a node of ks.reconfig/1, whose refusals said nothing more.
    kw: dict[str, Any] = {"reject_code": code} if code else {"schema": "ks.reconfig/1"}
    t.observe_outcome(outcome(rec, "rejected", START, **kw))
    assert excluded(t) == {rec.config_id}
    assert t.outstanding("n1", 0, "k") is None


def test_a_node_busy_with_another_change_is_waited_for_not_barred() -> None:
    t = Tuner(ttl_s=20.0)
    rec = seen(t, finding(), now=0.0)
    assert rec is not None
    # The node is measuring a change this tuner holds no recommendation for (one that
    # expired here first, or one another worker issued before the group moved here).
    trial: Config = {"block": 64, "tile": 1, "use_smem": False}
    t.observe_outcome(outcome(rec, "rejected", trial, reject_code="busy", at=1.0))
    assert excluded(t) == set()
    assert seen(t, finding(t=1.0), now=2.0) is None  # held while the node measures
    # The node's own change is decided: the slot is free, the node runs what it kept.
    own = rec.model_copy(update={"id": "rec/n1/0/k/other", "config": trial})
    t.observe_outcome(outcome(own, "kept", START, at=3.0, before_mean_us=100.0, after_mean_us=80.0))
    nxt = seen(t, finding(trial, 80.0, t=4.0), now=4.0)
    assert nxt is not None and nxt.from_config_id == SPACE.config_id(trial)


def test_a_busy_node_that_never_reports_holds_the_slot_for_a_recommendation_lifetime() -> None:
    t = Tuner(ttl_s=20.0)
    rec = seen(t, finding(), now=0.0)
    assert rec is not None
    t.observe_outcome(outcome(rec, "rejected", START, reject_code="busy", at=1.0))
    assert seen(t, finding(t=1.0), now=20.9) is None
    assert seen(t, finding(t=2.0), now=21.0) is not None


@pytest.mark.parametrize("code", ["bad_signature", "expired", "stale", "replayed", "wrong_node"])
def test_a_refusal_of_the_message_is_retried_once_the_recommendation_expires(code: str) -> None:
    t = Tuner(ttl_s=20.0)
    rec = seen(t, finding(), now=0.0)
    assert rec is not None
    t.observe_outcome(outcome(rec, "rejected", START, reject_code=code, at=1.0))
    assert excluded(t) == set()
    assert seen(t, finding(t=1.0), now=5.0) is None  # no new message every window
    again = seen(t, finding(t=2.0), now=20.0)
    assert again is not None and again.id != rec.id


def test_a_node_already_running_the_configuration_moves_the_tuners_view_of_it() -> None:
    t = Tuner()
    rec = seen(t, finding())
    assert rec is not None
    t.observe_outcome(outcome(rec, "rejected", rec.config, reject_code="already_running"))
    assert excluded(t) == set() and t.outstanding("n1", 0, "k") is None
    nxt = seen(t, finding(rec.config, 90.0, t=2.0), now=2.0)
    assert nxt is not None and nxt.from_config_id == rec.config_id


def test_under_host_knobs_the_search_steps_through_the_kernels_own_space(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernelstream.kernels.transfers import host_declared

    host = {"pinned": 1, "streams": 2, "batch": 4, "sync_every": 0}
    elsewhere = {"pinned": 0, "streams": 1, "batch": 1, "sync_every": 1}
    wide = host_declared(SPACE, {**START, **host})  # 336 host settings per kernel config
    enumerated: list[tuple[str, ...]] = []
    enumerate_space = SearchSpace.__iter__

    def counted(self: SearchSpace) -> Any:
        enumerated.append(self.names)
        return enumerate_space(self)

    monkeypatch.setattr(SearchSpace, "__iter__", counted)

    def hosted(config: Config, mean: float, node: str, t: float) -> Finding:
        f = finding(config, mean, node=node, t=t)
        return f.model_copy(update={"config_id": wide.config_id(config)})

    t = Tuner()
    # Another node of the group measured kernel configurations under other host settings.
    measured_there = [
        {"block": 64, "tile": 1, "use_smem": False},
        {"block": 128, "tile": 2, "use_smem": False},
        {"block": 128, "tile": 1, "use_smem": True},
    ]
    for i, kernel in enumerate(measured_there):
        t.observe_finding(hosted({**kernel, **elsewhere}, 150.0 + i, "n2", float(i)))
    current: Config = {**START, **host}
    sent = []
    for step in range(6):
        f = hosted(current, 100.0 - step, "n1", 10.0 + step)
        t.observe_finding(f)
        rec = t.recommend(f, wide, 10.0 + step)
        assert rec is not None
        assert {k: rec.config[k] for k in host} == host  # the node's host settings kept
        assert rec.config_id == wide.config_id(rec.config) and wide.is_valid(rec.config)
        sent.append({p: rec.config[p] for p in SPACE.params})
        t.observe_outcome(outcome(rec, "kept", current, wide, at=10.5 + step))
        current = rec.config
    # What the group measured under any host settings counts for its kernel configuration.
    assert not [k for k in sent if k in measured_there]
    # Only the kernel's own space was ever enumerated, never the widened one.
    assert enumerated and set(enumerated) == {SPACE.names}


@pytest.mark.parametrize("code", ["unknown_kernel", "wrong_node", "bad_signature"])
def test_a_refusal_before_the_node_found_the_kernel_leaves_the_slots_view_alone(
    code: str,
) -> None:
    t = Tuner(ttl_s=20.0)
    rec = seen(t, finding(), now=0.0)
    assert rec is not None
    # Such an outcome's "before" is not this kernel's configuration on this node (empty
    # for a kernel the node does not run, another node's for a misaddressed message).
    refusal = outcome(rec, "rejected", START, reject_code=code, at=1.0)
    t.observe_outcome(refusal.model_copy(update={"before_config": {}, "before_config_id": "-"}))
    again = seen(t, finding(t=2.0), now=20.0)
    assert again is not None and again.from_config_id == SPACE.config_id(START)


def test_a_large_groups_proposals_turn_down_tried_configs_by_their_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # More nodes than configurations start at once: the last ones find every
    # configuration being tried by another node. Each proposal's scan turns the
    # candidates down by the ids the space index holds, so a node that gets nothing
    # costs a few ids built, not one for every configuration of the space.
    space = SearchSpace(
        "wide",
        {"a": tuple(range(12)), "b": tuple(range(12)), "c": (0, 1)},
        default={"a": 0, "b": 0, "c": 0},
    )
    start = space.start_config()
    nodes = [
        [finding(start, node=f"n{k}", t=float(w), space=space) for w in range(2)]
        for k in range(400)
    ]
    t = Tuner(strategy=ModelGuidedSearch(seed=0), max_step=None)
    built = [0]
    config_id = SearchSpace.config_id

    def counted(self: SearchSpace, config: Any) -> str:
        built[0] += 1
        return config_id(self, config)

    monkeypatch.setattr(SearchSpace, "config_id", counted)
    per_node, issued = [], 0
    for windows in nodes:
        got, before = False, built[0]
        for f in windows:
            t.observe_finding(f)
            rec = t.recommend(f, space, 0.0)
            got |= rec is not None
        issued += got
        per_node.append((got, built[0] - before))
    assert issued == space.size() - 1  # every configuration but the start, once
    idle = [n for got, n in per_node if not got]
    assert len(idle) == 400 - issued and max(idle) <= 16, sorted(idle)[-5:]
