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


def test_a_kernel_made_while_the_node_runs_joins_it(tmp_path: Path) -> None:
    import gc
    import itertools
    import threading

    from tests.toy_cache import write_kt_cache

    gc.collect()  # kernels of earlier tests, no longer referenced, leave the registry
    params = {"block_size_x": [32, 64], "tile_size_x": [1, 2]}
    for name in ("first", "second"):
        cache: dict[str, object] = {
            f"{b},{t}": {"block_size_x": b, "tile_size_x": t, "time": 1.0, "times": [1.0]}
            for b, t in itertools.product(*params.values())
        }
        write_kt_cache(tmp_path / f"{name}.json.gz", params, cache, name, [1024])  # type: ignore[arg-type]

    def make(name: str) -> kernelstream.TunableKernel:
        src = SRC.replace("toy", name)
        dev = kernelstream.trace_device(tmp_path / f"{name}.json.gz", pace=False)
        return kernelstream.TunableKernel(name, src, 1024, params, device=dev)

    first = make("first")
    settings = Settings(
        bootstrap=f"127.0.0.1:{free_port()}",
        node_id="n-adopt",
        node_state_dir=tmp_path / "nodes",
        outbox_drain_s=0.2,
    )
    node = kernelstream.Node(settings=settings, spaces_dir=tmp_path / "spaces").start()
    try:
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.extend(node.recommendations()))
        reader.start()
        second = make("second")
        deadline = time.monotonic() + 20
        while len(node.report.next_seq) < 2 and time.monotonic() < deadline:
            first(0, 0, 0)
            second(0, 0, 0)
            time.sleep(0.001)
        assert set(node.report.next_seq) == {"n-adopt:0/first", "n-adopt:0/second"}
        assert {p.name for p in (tmp_path / "spaces").iterdir()} == {
            "first.space.json",
            "second.space.json",
        }
    finally:
        node.stop()
    reader.join(5)
    assert not reader.is_alive() and got == []  # the iterator ends when the node stops


def test_the_node_serves_its_metrics_when_asked(tmp_path: Path) -> None:
    import urllib.request

    cache = tmp_path / "toy.json.gz"
    write_toy_cache(cache)
    kernel = kernelstream.TunableKernel(
        "toy",
        SRC,
        1024,
        {"block_size_x": [32, 64, 128, 256], "tile_size_x": [1, 2, 4]},
        device=kernelstream.trace_device(cache, pace=False),
    )
    port = free_port()
    settings = Settings(
        bootstrap=f"127.0.0.1:{free_port()}",
        node_id="n-metrics",
        node_state_dir=tmp_path / "nodes",
        outbox_drain_s=0.2,
    )
    with kernelstream.Node(settings=settings, kernels=[kernel], metrics_port=port) as node:
        deadline = time.monotonic() + 20
        body = ""
        # Wait for the duration series itself: other series of the kernel (launches,
        # host gaps) can be exported a scrape before it.
        while time.monotonic() < deadline and "kernel_duration_seconds{" not in body:
            for _ in range(1000):
                kernel(0, 0, 0)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(0.05)  # not serving yet
    assert node.error is None
    assert "kernelstream_node_launches_total" in body
    assert "kernelstream_node_kernel_duration_seconds{" in body and 'kernel="toy"' in body
    assert 'kernelstream_node_ready{node="n-metrics"} 0.0' in body  # the broker is down
