"""What the worker's agents share: settings, topics, counters, the edge decoder."""

from __future__ import annotations

import base64
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypeVar

from schemas import DeadLetter, Record, SchemaError, decode, encode

__all__ = ["WorkerContext", "dead_letter_record"]

R = TypeVar("R", bound=Record)


def dead_letter_record(
    stage: str,
    topic: str,
    value: bytes | None,
    reason: str,
    *,
    key: bytes | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> DeadLetter:
    """The dead letter for input ``stage`` could not accept: original bytes and the reason."""
    return DeadLetter(
        stage=stage,
        topic=topic,
        partition=partition,
        offset=offset,
        key_b64=base64.b64encode(key).decode() if key is not None else None,
        value_b64=base64.b64encode(value or b"").decode(),
        reason=reason[:2000],
        at=time.time(),
    )


@dataclass
class WorkerContext:
    """Built once per worker process by :func:`agents.worker.register_agents`."""

    settings: Any  # app.settings.Settings (not imported: agents must not depend on app)
    topics: dict[str, Any]  # role -> faust topic
    counters: Counter[str] = field(default_factory=Counter)

    async def dead_letter(self, stage: str, event: Any, reason: str) -> None:
        """Publish the event's original bytes with the reason to the dead-letter topic."""
        self.counters[f"deadletter.{stage}"] += 1
        msg = event.message
        record = dead_letter_record(
            stage,
            msg.topic,
            event.value,
            reason,
            key=event.key,
            partition=msg.partition,
            offset=msg.offset,
        )
        await self.topics["deadletter"].send(key=event.key, value=encode(record))

    async def decode(self, stage: str, event: Any, cls: type[R]) -> R | None:
        """Validate an event at the edge; dead-letter it and return None when invalid."""
        try:
            return decode(event.value, cls)
        except SchemaError as exc:
            await self.dead_letter(stage, event, str(exc))
            return None
