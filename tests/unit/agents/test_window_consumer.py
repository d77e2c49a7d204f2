"""The early window consumer's listener: callbacks before and after the agent attaches."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.abc import ConsumerRebalanceListener

from kernelstream.agents.window_consumer import DeferredListener


class _Recorder(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.calls.append(("revoked", revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.calls.append(("assigned", assigned))


def test_assignment_waits_for_the_agent_and_revocation_before_it_is_a_no_op() -> None:
    async def scenario() -> list[tuple[str, Any]]:
        listener = DeferredListener()
        target = _Recorder()
        await listener.on_partitions_revoked({"p0"})  # nothing processed yet: nothing to do
        pending = asyncio.create_task(listener.on_partitions_assigned({"p1"}))
        await asyncio.sleep(0.01)
        assert not pending.done()  # waits for the window agent
        listener.attach(target)
        await asyncio.wait_for(pending, 1)
        await listener.on_partitions_revoked({"p1"})
        return target.calls

    assert asyncio.run(scenario()) == [("assigned", {"p1"}), ("revoked", {"p1"})]
