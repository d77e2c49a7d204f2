"""Findings a worker published, taken back by its findings reader without decoding."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kernelstream.agents.logic.detection import Detector, DetectorThresholds
from kernelstream.agents.own_findings import OwnFindings
from kernelstream.schemas import Finding, decode, encode
from tests.unit.agents.test_findings_agent import F0, _msg, _reader, _Stage
from tests.unit.agents.test_logic_detection import _CASES, agg


def _published(detector: Detector, own: OwnFindings, **over: Any) -> bytes:
    """A window's finding as the inline detector publishes and keeps it."""
    a = agg(**over)
    _, parts = detector.classify_parts(a)
    value = Finding.wire_of_window(a, **parts)
    own.put(value, (a, parts))
    return value


@pytest.mark.parametrize("over", _CASES)
def test_a_kept_finding_is_the_one_its_bytes_decode_to(over: dict[str, Any]) -> None:
    detector, own = Detector(DetectorThresholds(baseline_windows=2)), OwnFindings()
    # baselines forming, then a regression judged against them
    for w, mean in enumerate([100.0, 100.0, 100.0, 300.0]):
        window = {"window_start": 10.0 + w, "window_end": 11.0 + w}
        value = _published(detector, own, **({"duration_mean_us": mean} | window | over))
        taken = own.take(bytes(bytearray(value)))  # the bytes as a fetch returns them
        decoded = decode(value, Finding)
        assert taken == decoded and encode(taken) == value
        assert {k: type(v) for k, v in taken.evidence.items()} == {
            k: type(v) for k, v in decoded.evidence.items()
        }
    assert len(own) == 0 and own.taken == 4


def test_each_is_taken_once_unknown_bytes_are_not_and_the_oldest_go_first() -> None:
    detector, own = Detector(), OwnFindings(limit=3)
    values = [_published(detector, own, window_start=10.0 + w) for w in range(4)]
    assert len(own) == 3
    assert own.take(values[0]) is None  # the oldest, dropped at the fourth
    assert own.take(values[1]) is not None and own.take(values[1]) is None
    assert own.take(values[2][:-1] + b" ") is None  # bytes this process did not write
    host = decode(values[2], Finding)
    own.put(b"host", host)  # a record kept as it is (the host side's findings)
    assert own.take(b"host") is host


def test_the_reader_takes_its_own_findings_without_decoding_them() -> None:
    stage = _Stage()
    reader, topics = _reader([stage])

    async def refuse(*args: Any) -> None:
        raise AssertionError("an own finding was decoded again")

    own = reader.ctx.own_findings
    values = [_published(Detector(), own, window_start=10.0 + w) for w in range(2)]
    reader.ctx.decode = refuse  # type: ignore[method-assign,assignment]
    asyncio.run(reader.take({F0: [_msg(0, values[0]), _msg(1, values[1])]}))
    assert [f for _, f in stage.bursts[0]] == [decode(v, Finding) for v in values]
    assert reader.ctx.counters["read.findings"] == 2 and own.taken == 2
    assert topics["deadletter"].sent == []
