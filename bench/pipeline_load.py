"""Latency at fractions of the worker's capacity, measured in the same run.

``kernelstream bench pipeline --latency-load 0.1,0.5,0.9`` first measures what the
worker consumes at full speed from the live fleet's own messages (the same 64
streams, the same JSON templates, full 2,000-launch batches: the shape the fleet
sends near capacity), then runs each latency phase at those fractions of *that*
rate. A capacity taken in another run, under another load on a shared machine,
says little about how close to saturation a latency phase ran.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kernelstream.app.kafka.embedded import free_port
from kernelstream.bench.pipeline_input import LiveFleet, produce_messages

__all__ = ["live_capacity", "parse_loads"]

# The capacity fleet's rate: 64 streams x 50 batches/s x 2,000 launches (full batches).
_CAPACITY_RATE = 64 * 50 * 2000.0


def parse_loads(text: str | None) -> list[float]:
    """``"0.1,0.5,0.9"`` -> ``[0.1, 0.5, 0.9]``; each fraction in (0, 1.5].

    >>> parse_loads("0.1, 0.9")
    [0.1, 0.9]
    """
    if not text:
        return []
    out = []
    for part in text.split(","):
        try:
            f = float(part)
        except ValueError:
            raise ValueError(f"--latency-load: {part.strip()!r} is not a number") from None
        if not 0.0 < f <= 1.5:
            raise ValueError(f"--latency-load: {f} is not a fraction of capacity in (0, 1.5]")
        out.append(f)
    return out


async def live_capacity(
    settings: Any,
    log_dir: Path,
    run_worker: Callable[..., Awaitable[dict[str, Any]]],
    seconds: int,
    rounds: int,
    baseline: Path | None = None,
) -> dict[str, Any]:
    """Launches/s the worker consumes of ``seconds`` of the live fleet's messages, pre-produced.

    The messages are the :class:`LiveFleet` templates (event times a few seconds in
    the past, sequence numbers continuing per stream), produced before the worker
    starts, so the worker reads a backlog as fast as it can. ``rounds`` workers
    read the same topic in fresh groups; the median is the capacity. ``baseline``:
    a source tree whose worker reads it too, alternating round by round.
    """
    fleet = LiveFleet(_CAPACITY_RATE)
    first = int(time.time()) - seconds - 5
    items = [
        m
        for s in range(first, first + seconds)
        for j in range(len(fleet.slices))
        for m in fleet.messages(s, j)
    ]
    n = int(fleet.rate * seconds)
    await produce_messages(
        str(settings.bootstrap),
        settings.topic_launches,
        items,
        compression_type=settings.producer_compression(),
    )
    runs, base = [], []
    for r in range(rounds):
        runs.append(await run_worker(_fresh(settings, f"cap{r}"), log_dir / f"cap-{r}.log", n))
        if baseline is not None:
            log = log_dir / f"cap-base-{r}.log"
            base.append(await run_worker(_fresh(settings, f"base{r}"), log, n, None, baseline))
    out: dict[str, Any] = {
        "median_per_s": statistics.median(w["per_s"] for w in runs),
        "rounds_per_s": [w["per_s"] for w in runs],
        "load1_rounds": [w["load_avg"][0] for w in runs],
        "launches": n,
        "messages": len(items),
        "launches_per_message": fleet.launches_per_message,
        "streams": len(fleet.streams),
        "consumes": "the live fleet's JSON messages (full batches), pre-produced: a backlog",
    }
    if base:
        out["baseline"] = {
            "source": str(baseline),
            "median_per_s": statistics.median(w["per_s"] for w in base),
            "rounds_per_s": [w["per_s"] for w in base],
            "load1_rounds": [w["load_avg"][0] for w in base],
        }
    return out


def _fresh(settings: Any, tag: str) -> Any:
    """The same topics under a new consumer group and web port (one worker round)."""
    return settings.model_copy(
        update={"app_id": f"{settings.app_id}-{tag}", "web_port": free_port()}
    )
