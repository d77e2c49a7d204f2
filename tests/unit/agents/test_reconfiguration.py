"""The node's reconfiguration logic: what it accepts, what it rejects, when it rolls back."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from kernelstream.agents.logic.reconfiguration import (
    ReconfigPolicy,
    Reconfigurator,
    outcome_record,
)
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.space import Constraint, SearchSpace
from kernelstream.schemas import Recommendation
from kernelstream.schemas.signing import (
    Signer,
    Verifier,
    generate_keypair,
    load_private_key,
    load_public_key,
)

SPACE = SearchSpace(
    "toy",
    {"block": (32, 64, 128, 256, 512, 1024), "tile": (1, 2, 4, 8)},
    default={"block": 32, "tile": 1},
    constraints=(
        Constraint("block*tile <= 2048", lambda c: int(c["block"]) * int(c["tile"]) <= 2048),
    ),
)


def rec(
    config: dict[str, int],
    *,
    rid: str = "r1",
    node: str = "n1",
    device_index: int = 0,
    kernel: str = "k",
    expires_at: float = 100.0,
) -> Recommendation:
    return Recommendation(
        id=rid,
        node=node,
        device_index=device_index,
        device_model="A100",
        kernel=kernel,
        workload="toy",
        problem_size=[1],
        from_config_id="block=32,tile=1",
        config=config,
        config_id=SPACE.config_id(config) if set(config) == {"block", "tile"} else "x",
        reason="test",
        evidence={},
        expected_gain=1.1,
        issued_at=0.0,
        expires_at=expires_at,
    )


def make(policy: ReconfigPolicy | None = None) -> Reconfigurator:
    return Reconfigurator(
        "n1",
        0,
        {"k": SPACE},
        {"k": {"block": 32, "tile": 1}},
        policy or ReconfigPolicy(max_step=2, min_launches=10, min_eval_s=0.5),
    )


@pytest.mark.parametrize(
    ("r", "now", "reason", "code"),
    [
        (rec({"block": 64, "tile": 1}, node="n2"), 1.0, "addressed to node", "wrong_node"),
        (rec({"block": 64, "tile": 1}, device_index=3), 1.0, "addressed to device", "wrong_device"),
        (rec({"block": 64, "tile": 1}, expires_at=5.0), 6.0, "expired", "expired"),
        (rec({"block": 64, "tile": 1}, kernel="other"), 1.0, "unknown kernel", "unknown_kernel"),
        (rec({"block": 48, "tile": 1}), 1.0, "not in declared values", "outside_space"),
        (rec({"block": 1024, "tile": 4}), 1.0, "constraint violated", "outside_space"),
        (rec({"block": 64}), 1.0, "missing parameter", "outside_space"),
        (rec({"block": 32, "tile": 1}), 1.0, "already running", "already_running"),
        (rec({"block": 512, "tile": 1}), 1.0, "exceeds the allowed 2", "step_too_large"),
    ],
)
def test_rejections_name_their_reason(
    r: Recommendation, now: float, reason: str, code: str
) -> None:
    d = make().consider(r, now)
    assert d.action == "reject"
    assert reason in d.reason
    assert d.code == code
    # ... and the outcome the node publishes carries the code
    device = SimDevice("A100-SXM4-80GB", seed=1)
    before = {"block": 32, "tile": 1}
    out = outcome_record(r, "rejected", d.reason, before, r.config, device, now, reject_code=d.code)
    assert out.reject_code == code and out.schema_ == "ks.reconfig/2"


def test_replay_is_rejected() -> None:
    rc = make()
    r = rec({"block": 64, "tile": 1})
    assert rc.consider(r, 1.0).action == "apply"
    assert "replayed" in rc.consider(r, 1.0).reason


def feed(rc: Reconfigurator, mean: float, n: int, rng: np.random.Generator) -> None:
    rc.observe("k", rng.normal(mean, mean * 0.01, n), np.ones(n, dtype=bool))


def test_faster_change_is_kept_and_slower_is_rolled_back() -> None:
    rng = np.random.default_rng(0)
    rc = make()
    feed(rc, 100.0, 500, rng)
    r1 = rec({"block": 64, "tile": 1}, rid="fast")
    assert rc.consider(r1, 1.0).action == "apply"
    rc.apply(r1, 1.0)
    feed(rc, 60.0, 5, rng)
    assert rc.evaluate(1.1) == []  # not enough launches yet
    feed(rc, 60.0, 50, rng)
    assert rc.evaluate(1.2) == []  # not enough time yet
    [ev] = rc.evaluate(1.6)
    assert ev.status == "kept"
    assert ev.after_mean_us is not None and ev.before_mean_us is not None
    assert ev.after_mean_us < ev.before_mean_us
    assert rc.current["k"] == {"block": 64, "tile": 1}

    r2 = rec({"block": 128, "tile": 1}, rid="slow")
    assert rc.consider(r2, 2.0).action == "apply"
    rc.apply(r2, 2.0)
    busy = rc.consider(rec({"block": 64, "tile": 2}, rid="x"), 2.1)
    assert "still being measured" in busy.reason and busy.code == "busy"
    feed(rc, 90.0, 100, rng)
    [ev] = rc.evaluate(3.0)
    assert ev.status == "rolled_back" and "slower" in ev.reason
    assert rc.current["k"] == {"block": 64, "tile": 1}
    assert ev.before_config == {"block": 64, "tile": 1}


def test_launch_failures_roll_back_at_once() -> None:
    rc = make()
    feed(rc, 100.0, 100, np.random.default_rng(1))
    r = rec({"block": 64, "tile": 1})
    rc.apply(r, 1.0)
    rc.observe("k", np.zeros(20), np.zeros(20, dtype=bool))
    [ev] = rc.evaluate(1.01)
    assert ev.status == "rolled_back" and "failed" in ev.reason
    assert rc.current["k"] == {"block": 32, "tile": 1}


# -- signatures and durable replay memory ----------------------------------------


@pytest.fixture
def signing() -> tuple[Signer, Verifier]:
    priv, pub = generate_keypair()
    return Signer(load_private_key(priv)), Verifier(load_public_key(pub))


def signed_node(verifier: Verifier, seen: object = None) -> Reconfigurator:
    return Reconfigurator(
        "n1",
        0,
        {"k": SPACE},
        {"k": {"block": 32, "tile": 1}},
        ReconfigPolicy(max_step=2, min_launches=10, min_eval_s=0.5),
        verify=verifier.problem,
        seen=seen,  # type: ignore[arg-type]
    )


def test_with_signing_configured_unsigned_forged_and_foreign_are_rejected(
    signing: tuple[Signer, Verifier],
) -> None:
    signer, verifier = signing
    rc = signed_node(verifier)
    good = signer.sign(rec({"block": 64, "tile": 1}, rid="good"))
    forged = good.model_copy(update={"config": {"block": 128, "tile": 1}})
    other_priv, _ = generate_keypair()
    foreign = Signer(load_private_key(other_priv)).sign(rec({"block": 64, "tile": 1}, rid="f"))
    unsigned = rc.consider(rec({"block": 64, "tile": 1}, rid="u"), 1.0)
    assert "unsigned" in unsigned.reason and unsigned.code == "bad_signature"
    assert "forged" in rc.consider(forged, 1.0).reason
    assert "unknown key" in rc.consider(foreign, 1.0).reason
    # The forged copy carried the genuine id: it must not have burnt it.
    assert rc.consider(good, 1.0).action == "apply"
    replayed = rc.consider(good, 1.0)
    assert "replayed" in replayed.reason and replayed.code == "replayed"


def test_signed_but_invalid_recommendations_are_still_checked(
    signing: tuple[Signer, Verifier],
) -> None:
    signer, verifier = signing
    rc = signed_node(verifier)
    for r, reason in [
        (rec({"block": 64, "tile": 1}, node="n2", rid="a"), "addressed to node"),
        (rec({"block": 64, "tile": 1}, expires_at=0.5, rid="b"), "expired"),
        (rec({"block": 48, "tile": 1}, rid="c"), "not in declared values"),
        (rec({"block": 512, "tile": 1}, rid="d"), "exceeds the allowed 2"),
    ]:
        d = rc.consider(signer.sign(r), 1.0)
        assert d.action == "reject" and reason in d.reason


def test_replay_memory_survives_a_node_restart(
    signing: tuple[Signer, Verifier], tmp_path: Path
) -> None:
    from kernelstream.app.node.outbox import DurableSeenIds, NodeStore

    signer, verifier = signing
    good = signer.sign(rec({"block": 64, "tile": 1}, rid="once"))
    store = NodeStore(tmp_path / "n1")
    assert signed_node(verifier, DurableSeenIds(store)).consider(good, 1.0, 5).action == "apply"
    store.close()

    store = NodeStore(tmp_path / "n1")
    seen = DurableSeenIds(store)
    assert seen.handled("once", 5)  # re-read at its own offset: skipped quietly
    assert "replayed" in signed_node(verifier, seen).consider(good, 1.0, 9).reason
    store.close()


@pytest.mark.parametrize(
    ("issued_at", "expires_at", "now", "reason"),
    [
        (0.0, 10_000.0, 700.0, "stale: issued 700 s ago"),
        (0.0, 30 * 86_400.0, 1.0, "lifetime of 2592000 s exceeds"),
        (1_000.0, 1_020.0, 1.0, "in the future"),
    ],
)
def test_stale_or_overlong_recommendations_are_rejected(
    issued_at: float, expires_at: float, now: float, reason: str
) -> None:
    r = rec({"block": 64, "tile": 1}, expires_at=expires_at).model_copy(
        update={"issued_at": issued_at}
    )
    d = make().consider(r, now)
    assert d.action == "reject" and reason in d.reason, d.reason
    assert d.code == "stale"


def test_an_outcome_after_launches_timed_at_a_denormal_has_a_finite_speedup() -> None:
    device = SimDevice("A100-SXM4-80GB", seed=1)
    before, after = {"block": 32, "tile": 1}, {"block": 64, "tile": 1}
    out = outcome_record(
        rec(after),
        "kept",
        "faster",
        before,
        after,
        device,
        1.0,
        before_mean_us=100.0,
        after_mean_us=5e-324,
        after_count=10,
    )
    assert out.speedup == sys.float_info.max
