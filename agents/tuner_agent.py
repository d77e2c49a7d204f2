"""Tuner stage: ks.findings (through :mod:`agents.findings_agent`) + ks.reconfig ->
ks.recommendations.

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

__all__ = ["TunerStage", "recommend_all", "register", "tuner_from_settings"]

log = logging.getLogger("kernelstream.tuner")


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


class TunerStage:
    """The tuner's share of each burst of findings (:mod:`agents.findings_agent`).

    Choosing a config fits a model (tens of ms); it runs on a worker thread so the
    window agent's event loop never waits for it, a whole burst per thread round trip
    (each round trip cost a wake-up of the thread and of the event loop, milliseconds
    apiece on a busy machine; bench/pipeline.py (d) per-hop breakdown). The lock keeps
    the tuner's state single-writer: findings and outcomes update it one at a time.
    """

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.tuner = tuner_from_settings(ctx.settings)
        self.signer = signer_from_settings(ctx.settings)
        if self.signer is None:
            log.warning(
                "no signing private key configured: recommendations go out unsigned and "
                "nodes refuse them (generate keys with `kernelstream keygen`)"
            )
        self.spaces = SpaceResolver(ctx.settings.tuning_spaces_dir)
        self.lock = asyncio.Lock()

    async def on_findings(self, burst: list[tuple[Any, Finding]]) -> None:
        ctx = self.ctx
        todo = []
        for event, finding in burst:
            try:
                size = tuple(finding.problem_size)
                space = self.spaces.space_for(finding.workload, size, finding.config)
                space = host_declared(space, finding.config)
            except (LookupError, ValueError) as exc:  # unknown workload, or a bad size
                await ctx.dead_letter("tuner", event, str(exc), "unknown_kernel")
                continue
            todo.append((event, finding, space))
        if not todo:
            return
        async with self.lock:
            recs, failed = await asyncio.to_thread(recommend_all, self.tuner, todo)
        for event, ex in failed:
            await ctx.dead_letter(
                "tuner", event, f"the tuner failed on this finding: {ex!r}", "internal_error"
            )
        for rec in recs:
            if self.signer is not None:
                rec = self.signer.sign(rec)
            ctx.counters["recommendations.out"] += 1
            await ctx.send("recommendations", rec.node.encode(), encode(rec))


def register(app: Any, ctx: WorkerContext) -> TunerStage:
    """The tuner stage (fed by the findings reader) and the agent of its outcomes.

    The outcomes agent is the Faust app group's one consumer: the partitions it assigns this
    worker on ks.reconfig decide which fleet groups' findings the findings reader takes
    (:mod:`agents.findings_agent`), so that a group's findings and outcomes meet in one tuner.
    """
    stage = TunerStage(ctx)

    @app.agent(ctx.topics["reconfig"], name="outcomes")
    async def outcome_agent(stream: Any) -> None:
        async for event in stream.events():
            outcome = await ctx.decode("outcomes", event, ReconfigOutcome)
            if outcome is None:
                continue
            ctx.counters[f"outcomes.{outcome.status}"] += 1
            async with stage.lock:
                stage.tuner.observe_outcome(outcome)

    return stage
