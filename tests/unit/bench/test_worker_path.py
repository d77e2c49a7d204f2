"""bench worker-path: both passes see every launch and the worker closes windows."""

from __future__ import annotations

from kernelstream.bench.worker_path import measure


def test_worker_path_measures_both_passes_on_the_same_input() -> None:
    r = measure(seconds=1.5, batch=500, rounds=1)
    assert r["launches"] > 0 and r["messages"] > 0
    # 64 streams (16 nodes x 4 kernels): the second of input before the last is closed.
    assert r["windows"] >= 64
    assert r["worker_ns_per_launch"] > 0 and r["ceiling_ns_per_launch"] > 0
    assert r["ratio"] == r["ceiling_ns_per_launch"] / r["worker_ns_per_launch"]


def test_the_aggregate_bound_computes_the_reference_windows() -> None:
    """The timed aggregates are the reference's count, mean and p95 (np.percentile)."""
    import math

    import numpy as np

    from kernelstream.bench.pipeline_input import FleetSpec, fleet_batches, recent_t0
    from kernelstream.bench.pipeline_peers import reference_windows
    from kernelstream.bench.worker_path import aggregates_pass, nonempty_windows

    fleet = FleetSpec(
        nodes=2, launches_per_s_per_kernel=3000.0, seconds=2.0, max_launches=400, t0=recent_t0(2)
    )
    batches = list(fleet_batches(fleet))
    ref = reference_windows(batches, 1.0)
    parts = nonempty_windows(batches, 1.0)
    assert len(parts) == len(ref) > 8
    before = [[p.copy() for p in ps] for ps in parts]
    want = sum(w["mean"] + w["p95"] for w in ref.values())
    assert math.isclose(aggregates_pass(parts), want, rel_tol=1e-12)
    # the parts are left as they were (not partitioned in place): every round times the
    # same work
    pairs = [
        (p, q) for ps, qs in zip(parts, before, strict=True) for p, q in zip(ps, qs, strict=True)
    ]
    assert all(np.array_equal(p, q) for p, q in pairs)


def test_binary_wire_prints_the_bound_of_any_worker() -> None:
    r = measure(seconds=1.5, batch=500, rounds=1, wire="binary")
    assert 0 < r["bound_vs_binary_ceiling"] < 1
    assert r["bound_vs_binary_ceiling"] == r["zstd_ns_per_launch"] / (
        r["zstd_ns_per_launch"] + r["aggregates_ns_per_launch"]
    )


def test_the_agent_pass_publishes_every_window_with_its_finding() -> None:
    """--agent: the window agent's own code over the fleet's messages; nothing refused, a
    roofline finding for every window it published, the steps inside the total."""
    r = measure(seconds=1.5, batch=500, rounds=1, wire="binary", agent=True)
    a = r["agent"]
    assert a["dead_letters"] == 0
    assert a["windows"] >= 64  # 64 streams: the second of input before the last is closed
    assert a["findings"] >= a["windows"]
    steps = sum(a["stage_s"][k] for k in ("decode", "window", "close", "emit"))
    assert 0 < steps <= a["seconds"]


def test_the_columnar_stage_closes_the_workers_windows() -> None:
    """--columnar: the columnar window stage over the same messages in the agent's polls
    closes exactly the worker's windows, each equal to it; printed beside the agent's steps."""
    from kernelstream.bench.worker_path import columnar_lines

    r = measure(seconds=1.5, batch=500, rounds=1, wire="binary", agent=True, columnar=True)
    c = r["columnar"]
    assert c["windows"] >= 64
    assert c["windows_equal"] == c["worker_windows"] == c["windows"]
    assert 0 < c["vs_binary_ceiling"] < 1
    text = columnar_lines(r)
    assert f"windows equal to the worker's: {c['windows']:,} of {c['windows']:,}" in text
    assert "x the columnar stage's" in text


def test_a_tuning_fleet_s_kernels_move_and_the_agent_s_memory_is_measured() -> None:
    """With ``config_every_s`` each kernel moves to another configuration of its space
    that often (each node from its own place), every batch of one configuration; the
    agent's pass windows the series byte for byte as the Python path does, and the memory
    it holds after the input is measured."""
    from kernelstream.bench.pipeline_input import FleetSpec, fleet_batches, recent_t0

    fleet = FleetSpec(
        nodes=4,
        launches_per_s_per_kernel=400.0,
        seconds=3.0,
        max_launches=186,
        t0=recent_t0(3),
        config_every_s=1.0,
    )
    batches = list(fleet_batches(fleet))
    series = {(b.stream_key, b.config_id) for b in batches}
    assert len(series) == 16 * 3  # 4 nodes x 4 kernels, three configurations each
    assert len({cid for _, cid in series}) > 4 * 3  # the nodes do not move in step
    r = measure(
        seconds=3.0,
        batch=186,
        rounds=1,
        nodes=4,
        rate_per_kernel=400.0,
        wire="binary",
        agent=True,
        config_every_s=1.0,
    )
    assert r["series"] == 48 and r["agent"]["held_bytes"] > 0
    # where the compiled module is built: the same windows and findings without it
    assert "agent_numpy" not in r or r["agent_numpy"]["same_windows"]
