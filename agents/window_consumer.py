"""The window agent's group consumer, handed over from the worker's start-up.

The worker (``kernelstream.app.worker.start``) creates and subscribes the window
consumer before it imports Faust, so the group join is in flight while the heavy
imports run; the window agent adopts that consumer when the app starts. Assignments
received before the agent attaches wait for it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.abc import ConsumerRebalanceListener

__all__ = ["DeferredListener", "EarlyConsumer"]


class DeferredListener(ConsumerRebalanceListener):
    """Forwards rebalance callbacks to a listener attached later.

    Before one is attached nothing has been processed: a revocation has nothing
    to hand over, and an assignment waits until the window agent attaches.
    """

    def __init__(self) -> None:
        self._target: ConsumerRebalanceListener | None = None
        self._attached = asyncio.Event()

    def attach(self, target: ConsumerRebalanceListener) -> None:
        self._target = target
        self._attached.set()

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if self._target is not None:
            await self._target.on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._attached.wait()
        assert self._target is not None
        await self._target.on_partitions_assigned(assigned)


@dataclass
class EarlyConsumer:
    """A started, subscribed window consumer and the listener to attach the agent to."""

    consumer: AIOKafkaConsumer
    listener: DeferredListener = field(default_factory=DeferredListener)
