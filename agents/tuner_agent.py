"""Tuner agent: ks.findings + ks.reconfig -> ks.recommendations.

Findings and reconfiguration outcomes are both keyed by fleet group
(device model, workload, problem size), so one worker owns a group's whole
history: every node of the group learns from every other node's measurements.
With a signing key configured (``signing_private_key[_file]``) every
recommendation is signed (Ed25519) so nodes holding the public key can tell it
from a forgery.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.tuning import Tuner
from kernelstream.kernels.resolve import SpaceResolver
from kernelstream.kernels.transfers import host_declared
from kernelstream.schemas import Finding, Recommendation, ReconfigOutcome, encode
from kernelstream.schemas.signing import signer_from_settings

__all__ = ["recommend_all", "register"]

log = logging.getLogger("kernelstream.tuner")

# A burst of findings is handed to the tuner's thread at once: at most this many,
# after waiting at most this long for the burst to arrive (an idle agent wakes at
# this interval, which costs next to nothing).
_BATCH = 256
_BATCH_WITHIN_S = 0.01


def tuner_from_settings(settings: Any) -> Tuner:
    """The tuner as the worker runs it; replay (``app/replay/``) builds the same."""
    from kernelstream.agents.logic.search import ModelGuidedSearch

    return Tuner(
        ttl_s=settings.recommendation_ttl_s,
        max_step=settings.max_step,
        regression_restart=settings.tuner_regression_restart,
        strategy=ModelGuidedSearch(warm_start=settings.tuner_warm_start),
    )


def recommend_all(
    tuner: Tuner, todo: list[tuple[Any, Finding, Any]]
) -> tuple[list[Recommendation], list[tuple[Any, Exception]]]:
    """Each finding of a burst into the tuner, in order; the recommendations it issued,
    and the events of the findings it failed on (a defect), with the failure.

    A finding the tuner fails on is skipped, to be dead-lettered (``internal_error``):
    raised, the failure would stop the agent and lose the burst's other findings, and
    the same finding would come back after a restart.
    """
    out, failed = [], []
    for event, finding, space in todo:
        try:
            tuner.observe_finding(finding)
            rec = tuner.recommend_for(finding, space, time.time())
        except Exception as ex:
            log.exception("the tuner failed on finding %s", finding.id)
            failed.append((event, ex))
            continue
        if rec is not None:
            out.append(rec)
    return out, failed


def register(app: Any, ctx: WorkerContext) -> Tuner:
    tuner = tuner_from_settings(ctx.settings)
    signer = signer_from_settings(ctx.settings)
    if signer is None:
        log.warning(
            "no signing private key configured: recommendations go out unsigned and nodes "
            "refuse them (generate keys with `kernelstream keygen`)"
        )
    spaces = SpaceResolver(ctx.settings.tuning_spaces_dir)
    findings, reconfig = ctx.topics["findings"], ctx.topics["reconfig"]
    # Choosing a config fits a model (tens of ms); it runs on a worker thread so the
    # window agent's event loop never waits for it. The lock keeps the tuner's state
    # single-writer: findings and outcomes update it one at a time. Findings come in
    # bursts (every stream's window closes at the same event time), so the agent takes
    # what has arrived (up to _BATCH, waiting at most _BATCH_WITHIN_S) and hands the
    # whole batch to the thread at once: one thread round trip per burst instead of one
    # per finding, each of which cost a wake-up of the thread and of the event loop
    # (milliseconds apiece on a busy machine; bench/pipeline.py (d) per-hop breakdown).
    lock = asyncio.Lock()

    @app.agent(findings, name="tuner")
    async def tuner_agent(stream: Any) -> None:
        async for events in stream.take_events(_BATCH, within=_BATCH_WITHIN_S):
            todo = []
            for event in events:
                finding = await ctx.decode("tuner", event, Finding)
                if finding is None:
                    continue
                try:
                    size = tuple(finding.problem_size)
                    space = spaces.space_for(finding.workload, size, finding.config)
                    space = host_declared(space, finding.config)
                except (LookupError, ValueError) as exc:  # unknown workload, or a bad size
                    await ctx.dead_letter("tuner", event, str(exc), "unknown_kernel")
                    continue
                todo.append((event, finding, space))
            if not todo:
                continue
            async with lock:
                recs, failed = await asyncio.to_thread(recommend_all, tuner, todo)
            for event, ex in failed:
                await ctx.dead_letter(
                    "tuner", event, f"the tuner failed on this finding: {ex!r}", "internal_error"
                )
            for rec in recs:
                if signer is not None:
                    rec = signer.sign(rec)
                ctx.counters["recommendations.out"] += 1
                await ctx.send("recommendations", rec.node.encode(), encode(rec))

    @app.agent(reconfig, name="outcomes")
    async def outcome_agent(stream: Any) -> None:
        async for event in stream.events():
            outcome = await ctx.decode("outcomes", event, ReconfigOutcome)
            if outcome is None:
                continue
            ctx.counters[f"outcomes.{outcome.status}"] += 1
            async with lock:
                tuner.observe_outcome(outcome)

    return tuner
