"""kernelstream.Node with the broker down: launches never wait, nothing is lost or raised."""

from __future__ import annotations

import time
from pathlib import Path

import kernelstream
from kernelstream.app.kafka.embedded import free_port
from kernelstream.app.settings import Settings
from tests.toy_cache import write_toy_cache

SRC = 'extern "C" __global__ void toy(float *out, const float *in, int n) { }'


def test_a_node_whose_broker_is_down_never_blocks_a_launch(tmp_path: Path) -> None:
    cache = tmp_path / "toy.json.gz"
    write_toy_cache(cache)
    kernel = kernelstream.TunableKernel(
        "toy",
        SRC,
        1024,
        {"block_size_x": [32, 64, 128, 256], "tile_size_x": [1, 2, 4]},
        device=kernelstream.trace_device(cache, pace=False),
    )
    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    settings = Settings(
        bootstrap=down, node_id="n-down", node_state_dir=tmp_path / "nodes", outbox_drain_s=0.5
    )
    seen: list[kernelstream.Recommendation] = []
    with kernelstream.Node(settings=settings, kernels=[kernel]) as node:
        node.on_recommendation(seen.append)
        deadline = time.monotonic() + 30
        calls = 0
        while node.report.launches < 20_000 and time.monotonic() < deadline:
            kernel(0, 0, 0)
            calls += 1
    assert node.error is None
    # Every launch the node drained went to its outbox (the broker never answered).
    assert node.report.launches >= 20_000
    assert node.report.outbox["sent"] == 0
    assert node.report.outbox["pending"] == node.report.batches
    assert calls >= node.report.launches
    assert not seen
    # The node let go of the kernel: it runs on without one.
    kernel(0, 0, 0)
    kernel.use({"block_size_x": 64, "tile_size_x": 2})
