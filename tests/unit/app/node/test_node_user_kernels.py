"""The node's steps over a user's kernels: what counts as evidence for a trial."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import kernelstream
from kernelstream.agents.logic.tuning import Tuner, group_of
from kernelstream.app.node.outbox import NodeStore
from kernelstream.app.node.runtime import _Node
from kernelstream.app.settings import Settings
from kernelstream.kernels.tunable import KernelNodeDevice, KernelRunner
from kernelstream.schemas import Recommendation, ReconfigOutcome
from kernelstream.schemas.signing import Signer, generate_keypair, load_private_key
from tests.toy_cache import write_toy_cache

SRC = 'extern "C" __global__ void toy(float *out, const float *in, int n) { }'
_PRIVATE, _PUBLIC = generate_keypair()
_SIGNER = Signer(load_private_key(_PRIVATE))


def _rec(config: dict[str, int], now: float) -> Recommendation:
    """A recommendation signed by the recommender whose public key the node holds."""
    return _SIGNER.sign(_unsigned(config, now))


def _unsigned(config: dict[str, int], now: float) -> Recommendation:
    return Recommendation(
        id="r1",
        node="n1",
        device_index=0,
        device_model="A100-PCIE-40GB",
        kernel="toy",
        workload="toy",
        problem_size=[1024],
        from_config_id="-",
        config=config,
        config_id=",".join(f"{k}={v}" for k, v in config.items()),
        reason="test",
        evidence={},
        expected_gain=0.1,
        issued_at=now,
        expires_at=now + 60,
    )


def test_launches_of_the_config_left_are_not_evidence_for_the_trial(tmp_path: Path) -> None:
    cache = tmp_path / "toy.json.gz"
    write_toy_cache(cache)
    kernel = kernelstream.TunableKernel(
        "toy",
        SRC,
        1024,
        {"block_size_x": [32, 64, 128, 256], "tile_size_x": [1, 2, 4]},
        device=kernelstream.trace_device(cache, pace=False),
    )
    runner = KernelRunner(kernel.device)
    runner.add(kernel)
    device = KernelNodeDevice(runner)
    settings = Settings(
        bootstrap="127.0.0.1:9",
        node_id="n1",
        node_state_dir=tmp_path / "n",
        signing_public_key=_PUBLIC.decode(),
    )
    store = NodeStore(settings.node_dir())
    node = _Node(settings, "127.0.0.1:9", store, None, parts=(device, device.workloads(), runner))
    try:
        before = kernel.config_id
        for _ in range(100):
            kernel(0, 0, 0)  # launched before the switch, drained after it
        now = time.time()
        node.consider(_rec({"block_size_x": 64, "tile_size_x": 2}, now), 0, now)
        for _ in range(10):
            kernel(0, 0, 0)
        chunks = runner.tick(now)
        assert [(c.config_id, len(c.ok)) for c in chunks] == [
            (before, 100),
            ("block_size_x=64,tile_size_x=2", 10),
        ]
        node.launches(chunks, now)
        assert node.reconf.in_trial("toy")
        trial = node.reconf._trials["toy"]
        # Only the 10 launches of the new configuration are its evidence.
        assert sum(len(a) for a in trial.after) == 10
    finally:
        node.audit.close()
        store.close()


def test_a_config_that_cannot_run_is_rolled_back_with_its_reason(tmp_path: Path) -> None:
    import orjson

    cache = tmp_path / "toy.json.gz"
    write_toy_cache(cache)  # (256, 4) failed to compile when measured
    kernel = kernelstream.TunableKernel(
        "toy",
        SRC,
        1024,
        {"block_size_x": [32, 64, 128, 256], "tile_size_x": [1, 2, 4]},
        device=kernelstream.trace_device(cache, pace=False),
        default={"block_size_x": 128, "tile_size_x": 4},
    )
    runner = KernelRunner(kernel.device)
    runner.add(kernel)
    device = KernelNodeDevice(runner)
    settings = Settings(
        bootstrap="127.0.0.1:9",
        node_id="n1",
        node_state_dir=tmp_path / "n",
        signing_public_key=_PUBLIC.decode(),
    )
    store = NodeStore(settings.node_dir())
    node = _Node(settings, "127.0.0.1:9", store, None, parts=(device, device.workloads(), runner))
    published: list[ReconfigOutcome] = []
    publish = node.publish_outcome

    def capture(outcome: ReconfigOutcome, **audit: Any) -> None:
        published.append(outcome)
        publish(outcome, **audit)

    node.publish_outcome = capture  # type: ignore[method-assign]
    try:
        good = kernel.config_id
        now = time.time()
        node.consider(_rec({"block_size_x": 256, "tile_size_x": 4}, now), 0, now)
        for _ in range(5):
            kernel(0, 0, 0)  # never raises: the good config runs
        node.launches(runner.tick(now), now)
        node.evaluate(now + 1)
        assert kernel.config_id == good
        lines = (settings.node_dir() / "audit.jsonl").read_bytes().splitlines()
        last = orjson.loads(lines[-1])
        assert last["status"] == "rolled_back"
        assert "5 launches failed: CompilationFailedConfig" in last["reason"]
        # The worker's tuner reads that outcome as a failed configuration, which it never
        # proposes again.
        tuner = Tuner()
        tuner.observe_outcome(published[-1])
        stats = tuner.group(group_of(published[-1]))
        assert stats is not None and "block_size_x=256,tile_size_x=4" in stats.failed
    finally:
        node.audit.close()
        store.close()
