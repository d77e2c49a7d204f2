"""A host-side change goes through the node's apply / measure / keep-or-roll-back loop.

The node measures a kernel with host telemetry by its whole step (host gap, copies no
kernel hid, kernel), so pinning pageable copies is kept for the time it saves and a
synchronization after every launch is rolled back for the time it costs, although the
kernel itself runs equally fast in both.
"""

from __future__ import annotations

import numpy as np

from kernelstream.agents.logic.reconfiguration import ReconfigPolicy, Reconfigurator
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.runner import WorkloadRunner
from kernelstream.kernels.space import SearchSpace
from kernelstream.kernels.transfers import HostPattern
from kernelstream.schemas import Recommendation

DEFAULT = {"pinned": 0, "sync_every": 0}
SPACE = SearchSpace("staged", {"pinned": (0, 1), "sync_every": (0, 1)}, DEFAULT)
MIB = 1 << 20


def steps(pattern: HostPattern, config: dict[str, int], scale: float) -> tuple[np.ndarray, ...]:
    """Step times and ok flags of a second of a sim transpose under ``pattern``."""
    dev = SimDevice("A100-SXM4-80GB", seed=5, problem_scale=scale)
    work = [w for w in dev.workloads() if w.name == "transpose"]
    runner = WorkloadRunner(dev, work, host_patterns={"transpose": pattern.with_config(config)})
    chunks = [c for k in range(21) for c in runner.tick(10.0 + 0.05 * k)]
    assert all(c.step_us is not None for c in chunks)
    return (
        np.concatenate([c.step_us for c in chunks if c.step_us is not None]),
        np.concatenate([c.ok for c in chunks]),
        np.concatenate([c.duration_us for c in chunks]),
    )


def rec(config: dict[str, int], rid: str) -> Recommendation:
    return Recommendation(
        id=rid,
        node="n1",
        device_index=0,
        device_model="A100-SXM4-80GB",
        kernel="k",
        workload="staged",
        problem_size=[1],
        from_config_id="x",
        config=config,
        config_id=SPACE.config_id(config),
        reason="host-side finding",
        evidence={},
        expected_gain=0.5,
        issued_at=0.0,
        expires_at=100.0,
    )


def trial(pattern: HostPattern, after: dict[str, int], scale: float) -> tuple[str, float]:
    """Apply ``after`` over the default; the verdict and after/before kernel durations."""
    node = Reconfigurator(
        "n1", 0, {"k": SPACE}, {"k": dict(DEFAULT)}, ReconfigPolicy(min_eval_s=0.0)
    )
    step, ok, kern_before = steps(pattern, dict(DEFAULT), scale)
    node.observe("k", step, ok)
    r = rec(after, "r1")
    assert node.consider(r, 1.0).action == "apply"
    node.apply(r, 1.0)
    step, ok, kern_after = steps(pattern, after, scale)
    node.observe("k", step, ok)
    (verdict,) = node.evaluate(2.0)
    return verdict.status, float(kern_after.mean() / kern_before.mean())


def test_pinning_pageable_copies_is_kept_for_the_step_time_it_saves() -> None:
    status, kernel_ratio = trial(
        HostPattern(32 * MIB, 8 * MIB), {"pinned": 1, "sync_every": 0}, 1.0
    )
    assert status == "kept"
    assert abs(kernel_ratio - 1) < 0.02  # the kernel alone is no faster


def test_a_synchronization_after_every_launch_is_rolled_back() -> None:
    status, kernel_ratio = trial(HostPattern(), {"pinned": 0, "sync_every": 1}, 1e-4)
    assert status == "rolled_back"
    assert abs(kernel_ratio - 1) < 0.02
