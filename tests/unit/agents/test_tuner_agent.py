"""The tuner agent's burst of findings: one the tuner fails on does not take the others."""

from __future__ import annotations

from typing import Any

import pytest

from kernelstream.agents.logic.tuning import Tuner
from kernelstream.agents.tuner_agent import recommend_all
from kernelstream.schemas.records import Finding, Recommendation
from tests.unit.agents.test_logic_tuning import SPACE, START, finding


def test_a_finding_the_tuner_fails_on_is_skipped_and_the_burst_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tuner = Tuner()
    real = Tuner.recommend_for

    def fail_on_b(self: Tuner, f: Finding, space: Any, now: float) -> Recommendation | None:
        if f.node == "b":
            raise ZeroDivisionError("a defect in the tuner")
        return real(self, f, space, now)

    monkeypatch.setattr(Tuner, "recommend_for", fail_on_b)
    todo = [(f"event-{n}", finding(START, 100.0, node=n), SPACE) for n in ("a", "b", "c")]
    recs, failed = recommend_all(tuner, todo)
    assert sorted(r.node for r in recs) == ["a", "c"]
    assert [(event, type(ex)) for event, ex in failed] == [("event-b", ZeroDivisionError)]
