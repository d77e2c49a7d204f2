"""Latency at fractions of the worker's capacity, measured in the same run.

``kernelstream bench pipeline --latency-load 0.1,0.5,0.9`` first measures what the
worker consumes at full speed from the live fleet's own messages (the same 64
streams, the same JSON templates, full 2,000-launch batches: the shape the fleet
sends near capacity), then runs each latency phase at those fractions of *that*
rate. A capacity taken in another run, under another load on a shared machine,
says little about how close to saturation a latency phase ran.

The capacity is the worker's whole job: launches per CPU second until its tuner and
alert stages have taken every finding the window stage published (one core's worth
of every stage), not the window stage's rate to its last batch. Reading a backlog,
the window agent holds the event loop and the other stages run after it; live, they
run beside it on the same core, so a load set from the window stage alone was more
than the worker sustains (at "90%" the worker ran behind; findings, tuning and alerts
cost 1.2x to 2x the window stage's CPU: ``bench pipeline-peers``). Both rates are
printed.
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
    # The next second's first batch of every stream: its watermark closes the windows of
    # the input, so their findings are published and taken while the clocks run.
    items += fleet.messages(first + seconds, 0)
    n = int(fleet.rate * seconds) + fleet.launches_per_message * len(fleet.streams)
    await produce_messages(
        str(settings.bootstrap),
        settings.topic_launches,
        items,
        compression_type=settings.producer_compression(),
    )
    runs, base = [], []
    for r in range(rounds):
        log = log_dir / f"cap-{r}.log"
        runs.append(await run_worker(_fresh(settings, f"cap{r}"), log, n, every_stage=True))
        if baseline is not None:
            log = log_dir / f"cap-base-{r}.log"
            base.append(
                await run_worker(_fresh(settings, f"base{r}"), log, n, None, baseline, True)
            )
    out: dict[str, Any] = {
        "median_per_s": _every_stage(runs),
        "window_stage_median_per_s": statistics.median(w["per_s"] for w in runs),
        "rounds_per_s": [w.get("every_stage_per_cpu_s") for w in runs],
        "window_stage_rounds_per_s": [w["per_s"] for w in runs],
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
            "median_per_s": _every_stage(base),
            "rounds_per_s": [w.get("every_stage_per_cpu_s") for w in base],
            "load1_rounds": [w["load_avg"][0] for w in base],
        }
    return out


def _every_stage(runs: list[dict[str, Any]]) -> float:
    """The median of the rounds' every-stage rates per CPU second: the launches one core
    takes through the whole worker (windows, findings, tuner, alerts) each second."""
    if any("every_stage_per_cpu_s" not in w for w in runs):
        raise RuntimeError("a capacity round's tuner stage did not take every finding in time")
    return float(statistics.median(float(w["every_stage_per_cpu_s"]) for w in runs))


def _fresh(settings: Any, tag: str) -> Any:
    """The same topics under a new consumer group and web port (one worker round)."""
    return settings.model_copy(
        update={"app_id": f"{settings.app_id}-{tag}", "web_port": free_port()}
    )
