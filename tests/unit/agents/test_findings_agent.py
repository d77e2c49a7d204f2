"""One agent reads ks.findings for the tuner and alert stages: each finding decoded once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

from kernelstream.agents import findings_agent
from kernelstream.agents.context import WorkerContext
from kernelstream.app.settings import Settings
from kernelstream.schemas import DeadLetter, Finding, decode, encode
from tests.unit.agents.test_logic_tuning import START, finding
from tests.unit.agents.test_window_agent_failures import Topic


class _App:
    """Takes the agent function the way Faust's ``app.agent`` decorator does."""

    def __init__(self) -> None:
        self.agents: dict[str, Callable[[Any], Any]] = {}

    def agent(self, topic: Any, name: str) -> Callable[[Any], Any]:
        def take(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            self.agents[name] = fn
            return fn

        return take


class _Stream:
    def __init__(self, bursts: list[list[Any]]) -> None:
        self.bursts = bursts

    async def take_events(self, n: int, within: float) -> AsyncIterator[list[Any]]:
        for burst in self.bursts:
            yield burst


class _Stage:
    def __init__(self) -> None:
        self.bursts: list[list[tuple[Any, Finding]]] = []

    async def on_findings(self, burst: list[tuple[Any, Finding]]) -> None:
        self.bursts.append(burst)


def _event(offset: int, value: bytes) -> SimpleNamespace:
    msg = SimpleNamespace(topic="ks.findings", partition=0, offset=offset, key=b"g", value=value)
    return SimpleNamespace(message=msg, key=msg.key, value=value)


def test_each_finding_is_decoded_once_for_every_stage_and_refused_once() -> None:
    topics = {role: Topic() for role in ("findings", "deadletter")}
    ctx = WorkerContext(Settings(), topics)
    app, tuner, alerts = _App(), _Stage(), _Stage()
    findings_agent.register(app, ctx, [tuner, alerts])
    good = [encode(finding(START, 100.0, node=n)) for n in ("a", "b", "c")]
    bursts = [
        [_event(0, good[0]), _event(1, b'{"schema": "ks.finding/2"'), _event(2, good[1])],
        [_event(3, good[2])],
    ]
    asyncio.run(app.agents["findings"](_Stream(bursts)))
    assert tuner.bursts == alerts.bursts
    assert [[f.node for _, f in b] for b in tuner.bursts] == [["a", "b"], ["c"]]
    # the same objects: one decode serves both stages
    tuned = [f for b in tuner.bursts for _, f in b]
    assert all(x is y for x, y in zip(tuned, [f for b in alerts.bursts for _, f in b], strict=True))
    [letter] = [decode(v, DeadLetter) for v in topics["deadletter"].sent]
    assert (letter.stage, letter.reason_code, letter.offset) == ("findings", "truncated", 1)


def test_a_burst_with_nothing_valid_reaches_no_stage() -> None:
    topics = {role: Topic() for role in ("findings", "deadletter")}
    ctx = WorkerContext(Settings(), topics)
    app, stage = _App(), _Stage()
    findings_agent.register(app, ctx, [stage])
    asyncio.run(app.agents["findings"](_Stream([[_event(0, b"[]")]])))
    assert stage.bursts == [] and len(topics["deadletter"].sent) == 1
