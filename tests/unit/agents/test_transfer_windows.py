"""Host-side findings per launch window, and the tuner turning them into changes."""

from __future__ import annotations

from typing import Any

from kernelstream.agents.logic.detection import finding_id
from kernelstream.agents.logic.transfers import (
    TransferWindows,
    finding_records,
    is_host_finding,
    transfer_findings,
)
from kernelstream.agents.logic.tuning import Tuner
from kernelstream.agents.logic.windowing import Windower, WindowSpec
from kernelstream.kernels.devices import get_device_spec
from kernelstream.kernels.space import SearchSpace
from kernelstream.kernels.transfers import HostPattern
from kernelstream.schemas import Finding, ReconfigOutcome, WindowAggregate, decode, encode
from tests.unit.agents.test_logic_transfers import A100, MIB, run


def windows(pattern: HostPattern) -> list[tuple[WindowAggregate, list[Finding]]]:
    """Each launch window of one second of the pattern with the host findings it closes."""
    spec = WindowSpec(size_s=0.25)
    windower, host = Windower(spec), TransferWindows(spec.size_s)
    for cols in run(pattern):
        host.add(cols)
        windower.add_columns(cols, 0.0)
    out = []
    for agg in windower.flush_all():
        s = host.close(agg)
        found = [] if s is None else transfer_findings(s, get_device_spec(A100), agg.config)
        out.append((agg, finding_records(agg, found, finding_id(agg))))
    assert len(host) == 0  # every summary closed with its window
    return out


def test_which_streams_hold_an_open_summary_is_known_without_a_scan() -> None:
    """``holds`` (asked each time the compiled engine could take over a stream's
    findings) follows the summaries added, closed and pushed out by the bound."""
    spec = WindowSpec(size_s=0.25)
    windower = Windower(spec)
    host = TransferWindows(spec.size_s)
    batches = list(run(HostPattern(64 * MIB, 16 * MIB, pinned=False)))
    stream = batches[0].meta.stream_key
    assert not host.holds(stream)
    for cols in batches:
        host.add(cols)
        windower.add_columns(cols, 0.0)
    assert host.holds(stream) and not host.holds("another stream")
    aggs = windower.flush_all()
    for agg in aggs[:-1]:
        host.close(agg)
    assert host.holds(stream) == (len(host) > 0)
    for agg in aggs:
        host.close(agg)
    assert len(host) == 0 and not host.holds(stream)
    bounded = TransferWindows(spec.size_s, max_open=1)
    for cols in batches:
        bounded.add(cols)
    assert len(bounded) == 1 and bounded.holds(stream)


def test_every_window_of_a_pageable_one_stream_step_has_its_findings() -> None:
    result = windows(HostPattern(64 * MIB, 16 * MIB, pinned=False))
    assert len(result) >= 4
    for agg, found in result:
        assert {f.classification for f in found} == {
            "transfer_bound",
            "pageable_copies",
            "no_overlap",
        }, agg.window_start
        for f in found:
            assert is_host_finding(f) and f.evidence["advice"]
            assert decode(encode(f), Finding) == f  # valid ks.finding/2 on the wire
            assert f.id.startswith(finding_id(agg))


def test_a_healthy_step_has_windows_and_no_host_finding() -> None:
    result = windows(HostPattern(MIB, MIB, pinned=True, streams=2))
    assert result and all(found == [] for _, found in result)


SPACE = SearchSpace(
    "staged",
    {"tile": (8, 16), "pinned": (0, 1), "streams": (1, 2, 4)},
    {"tile": 8, "pinned": 0, "streams": 1},
)


def knob_finding(classification: str, param: str, value: int) -> Finding:
    (agg, found), *_ = windows(HostPattern(64 * MIB, 16 * MIB, pinned=False))
    config = {"tile": 8, "pinned": 0, "streams": 1}
    agg = agg.model_copy(update={"config": config, "config_id": SPACE.config_id(config)})
    (f,) = [f for f in found if f.classification == classification]
    ev = dict(f.evidence, knob_param=param, knob_value=value)
    return f.model_copy(update={"config": config, "config_id": agg.config_id, "evidence": ev})


def test_tuner_recommends_the_change_a_host_finding_carries() -> None:
    tuner = Tuner(ttl_s=30.0)
    f = knob_finding("pageable_copies", "pinned", 1)
    rec = tuner.recommend_knob(f, SPACE, now=10.0)
    assert rec is not None
    assert rec.config == {"tile": 8, "pinned": 1, "streams": 1}
    assert rec.expected_gain == f.evidence["expected_gain"]
    assert rec.reason.startswith("pageable_copies: ")
    # one change at a time per kernel instance: the next finding waits for the outcome
    assert tuner.recommend_knob(knob_finding("no_overlap", "streams", 2), SPACE, now=11.0) is None


def test_a_rolled_back_host_change_is_not_recommended_again() -> None:
    tuner = Tuner(ttl_s=30.0)
    f = knob_finding("pageable_copies", "pinned", 1)
    rec = tuner.recommend_knob(f, SPACE, now=10.0)
    assert rec is not None
    tuner.observe_outcome(
        ReconfigOutcome(
            id="o1",
            recommendation_id=rec.id,
            node=rec.node,
            device_index=rec.device_index,
            device_model=rec.device_model,
            kernel=rec.kernel,
            workload=rec.workload,
            problem_size=rec.problem_size,
            status="rolled_back",
            reason="slower",
            before_config=f.config,
            before_config_id=f.config_id,
            after_config=rec.config,
            after_config_id=rec.config_id,
            at=20.0,
        )
    )
    assert tuner.recommend_knob(f, SPACE, now=21.0) is None


def test_a_change_outside_the_declared_space_is_advice_only() -> None:
    f = knob_finding("no_overlap", "streams", 8)  # streams 8 is not declared
    assert Tuner().recommend_knob(f, SPACE, now=1.0) is None


def test_the_forecaster_skips_host_findings_without_refusing_them() -> None:
    from kernelstream.agents.logic.forecast import Forecaster

    (_, found), *_ = windows(HostPattern(64 * MIB, 16 * MIB, pinned=False))
    assert found
    forecaster = Forecaster()
    for f in found:  # the window's own finding was not seen: still neither used nor refused
        assert forecaster.observe(f) == ([], None)


def _search_finding(config: dict[str, Any]) -> Finding:
    """The window's own finding of the same series (what a search step answers)."""
    f = knob_finding("pageable_copies", "pinned", 1)
    ev = {k: v for k, v in f.evidence.items() if k not in ("host_side", "knob_param")}
    return f.model_copy(
        update={
            "id": f.id.rsplit("/", 1)[0],
            "classification": "memory_bottleneck",
            "evidence": ev,
            "config": config,
            "config_id": SPACE.config_id(config),
        }
    )


def test_a_host_change_that_waited_for_a_search_step_goes_first_onto_the_kept_config() -> None:
    tuner = Tuner(ttl_s=30.0)
    step = tuner.recommend_knob(knob_finding("no_overlap", "streams", 2), SPACE, now=10.0)
    assert step is not None  # something is on trial
    pin = knob_finding("pageable_copies", "pinned", 1)
    assert tuner.recommend_knob(pin, SPACE, now=11.0) is None  # waits its turn
    kept = {"tile": 8, "pinned": 0, "streams": 2}
    tuner.observe_outcome(
        ReconfigOutcome(
            id="o1",
            recommendation_id=step.id,
            node=step.node,
            device_index=step.device_index,
            device_model=step.device_model,
            kernel=step.kernel,
            workload=step.workload,
            problem_size=step.problem_size,
            status="kept",
            reason="faster",
            before_config=pin.config,
            before_config_id=pin.config_id,
            after_config=kept,
            after_config_id=SPACE.config_id(kept),
            at=20.0,
        )
    )
    # The next window's own finding would start a search step: the waiting host change
    # goes before it, onto the configuration the node runs now.
    rec = tuner.recommend_for(_search_finding(kept), SPACE, now=21.0)
    assert rec is not None and rec.reason.startswith("pageable_copies: ")
    assert rec.config == {"tile": 8, "pinned": 1, "streams": 2}
    assert rec.from_config_id == SPACE.config_id(kept)


def test_a_search_step_never_changes_the_host_knobs() -> None:
    from kernelstream.agents.logic.search import ModelGuidedSearch
    from kernelstream.kernels.transfers import HOST_KNOBS

    tuner = Tuner(ttl_s=1.0, min_windows=1, strategy=ModelGuidedSearch())
    config = {"tile": 8, "pinned": 0, "streams": 1}
    proposed = []
    for k in range(20):
        f = _search_finding(config).model_copy(update={"window_start": float(k)})
        tuner.observe_finding(f)
        rec = tuner.recommend_for(f, SPACE, now=10.0 * k)
        if rec is not None:
            proposed.append(rec.config)
    assert proposed, "the search proposed nothing"
    assert all(c[k] == config[k] for c in proposed for k in HOST_KNOBS if k in c), proposed


def test_of_one_windows_waiting_host_changes_the_larger_expected_gain_goes_first() -> None:
    tuner = Tuner(ttl_s=30.0)
    pin = knob_finding("pageable_copies", "pinned", 1)
    overlap = knob_finding("no_overlap", "streams", 2)
    assert float(pin.evidence["expected_gain"]) > float(overlap.evidence["expected_gain"])
    assert tuner.recommend_knob(knob_finding("no_overlap", "streams", 4), SPACE, now=1.0)
    for f in (pin, overlap):  # the larger gain first, then the smaller: both wait
        assert tuner.recommend_for(f, SPACE, now=2.0) is None
    rec = tuner.recommend_for(_search_finding(pin.config), SPACE, now=100.0)  # trial expired
    assert rec is not None and rec.reason.startswith("pageable_copies: ")
