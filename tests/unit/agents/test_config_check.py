"""ConfigCheck: verdicts remembered per config object give the same answers as judging anew."""

from __future__ import annotations

from kernelstream.agents.context import ConfigCheck
from kernelstream.agents.logic.windowing import make_example_batch
from kernelstream.kernels.space import SearchSpace


def _space(workload: str, size: tuple[int, ...], config: object = None) -> SearchSpace:
    return SearchSpace("s", {"block": [64, 128, 256]}, {"block": 128})


def test_a_shared_config_object_keeps_its_verdict_and_a_changed_one_is_judged() -> None:
    check = ConfigCheck(_space)
    good = make_example_batch([1.0]).model_copy(update={"config": {"block": 128}})
    bad = good.model_copy(update={"config": {"block": 100}})
    assert check(good) is None
    assert check(good.model_copy(update={"seq_start": 5})) is None  # same config object
    assert "not in the declared space" in (check(bad) or "")
    assert "not in the declared space" in (check(bad.model_copy(update={"seq_start": 9})) or "")
    # same object, another workload: judged for that workload, not taken from the cache
    other = bad.model_copy(update={"workload": "other"})
    assert other.config is bad.config
    assert "'other'" in (check(other) or "")


def test_a_built_in_workload_with_host_knobs_is_in_its_declared_space() -> None:
    from kernelstream.kernels.resolve import SpaceResolver
    from tests.bad_input import good_batch

    check = ConfigCheck(SpaceResolver().space_for)
    batch = good_batch("node-a", "matmul", 1.0e9, 2000, 0)  # a node's full batch
    knobs = {"pinned": 1, "streams": 2, "batch": 64, "sync_every": 0}
    hosted = batch.model_copy(update={"config": {**batch.config, **knobs}})
    assert check(hosted) is None
    some = batch.model_copy(update={"config": {**batch.config, "pinned": 0}})
    assert check(some) is None  # a kernel may declare some of them
    bad = batch.model_copy(update={"config": {**batch.config, **knobs, "streams": 3}})
    assert "streams=3 not in declared values [1, 2, 4]" in (check(bad) or "")
