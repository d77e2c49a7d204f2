"""What the worker's agents share: settings, topics, pure-logic state, counters."""

from __future__ import annotations

import base64
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from schemas import DeadLetter, encode

__all__ = ["WorkerContext"]


@dataclass
class WorkerContext:
    """Built once per worker process by :func:`agents.worker.register_agents`."""

    settings: Any  # app.settings.Settings (not imported: agents must not depend on app)
    topics: dict[str, Any]  # role -> faust topic
    counters: Counter[str] = field(default_factory=Counter)

    async def dead_letter(
        self,
        stage: str,
        topic: str,
        value: bytes | None,
        reason: str,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        """Publish the original bytes with the reason to the dead-letter topic."""
        self.counters[f"deadletter.{stage}"] += 1
        record = DeadLetter(
            stage=stage,
            topic=topic,
            partition=partition,
            offset=offset,
            key_b64=base64.b64encode(key).decode() if key is not None else None,
            value_b64=base64.b64encode(value or b"").decode(),
            reason=reason[:2000],
            at=time.time(),
        )
        await self.topics["deadletter"].send(key=key, value=encode(record))
