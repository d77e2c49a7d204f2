"""The window agent skips a message it fails on, with a dead letter, instead of dying."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.windowing import Windower
from kernelstream.agents.window_agent import WindowIngest
from kernelstream.app.settings import Settings
from kernelstream.schemas import DeadLetter, decode, encode
from tests.bad_input import good_batch


class Topic:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, key: Any = None, value: bytes = b"", partition: Any = None) -> None:
        self.sent.append(value)


class FailingWindower(Windower):
    def add_columns(self, cols: Any, now: float) -> Any:
        raise ZeroDivisionError("a defect in the window maths")


def test_an_unforeseen_failure_is_dead_lettered_and_the_agent_goes_on() -> None:
    topics = {role: Topic() for role in ("deadletter", "late", "windows")}
    ctx = WorkerContext(Settings(), topics)
    ingest = WindowIngest(None, ctx, FailingWindower())
    batch = good_batch("n1", "matmul", time.time() - 1.0, 20, 0)
    msg = SimpleNamespace(
        topic="ks.launches",
        partition=0,
        offset=3,
        key=batch.stream_key.encode(),
        value=encode(batch),
    )
    asyncio.run(ingest._process(msg, set()))  # does not raise
    [letter] = [decode(v, DeadLetter) for v in topics["deadletter"].sent]
    assert letter.reason_code == "internal_error" and "ZeroDivisionError" in letter.reason
    assert letter.offset == 3 and ctx.counters["deadletter.window.internal_error"] == 1
