"""A partition's launch batches through the windower, in order: one control flow for the
window agent and for replay.

:func:`window_partition` takes one partition's batches of a poll (live) or of a chunk as
read (replay), already decoded and checked at the edge, and yields what happened to them,
in order, as it goes: a generator, so that the window agent publishes what a batch closed
before the next batch is windowed, exactly as before, and replay tallies the same
outcomes without publishing anything. What the two do with an outcome differs (a dead
letter or a count, a send or a list); which batches are counted, in what order, with
which windows closed and which failures caught, does not.

The steps:

* Consecutive batches that continue their streams exactly go into an
  :class:`~agents.logic.windowing.InOrderRun`, windowed together, their streams' windows
  closed after them (:class:`Counted` with every batch of the run): no sequence verdict,
  windowing checks or close per batch.
* Any other batch (a copy, a gap, launches out of order or late, device samples, host
  telemetry) ends the run and goes the general way: the sequence rules
  (:func:`~agents.logic.sequencing.judge_sequence`; :class:`Refused` for a duplicate or an
  implausible jump), ``on_batch`` (the host side), the windower and its stream's close.
* A failure nothing foresaw never escapes. A batch the general way fails on is
  :class:`Failed` (the worker dead-letters it, ``internal_error``). A run whose windowing
  fails goes batch by batch: what the run had counted before it failed is recognised by
  sequence number (:meth:`~agents.logic.windowing.Windower.counted_whole`) and not counted
  again. A stream whose windows fail to close fails its last batch of the run, the batch
  that closed them. A :class:`Failed` carries its exception; the caller reports it (the
  window agent logs and dead-letters it, replay logs and counts it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from kernelstream.agents.logic.sequencing import SeqLimits, SeqVerdict, judge_sequence
from kernelstream.agents.logic.windowing import InOrderRun, Windower
from kernelstream.schemas import LaunchBatch, WindowAggregate
from kernelstream.schemas.columnar import LaunchColumns

__all__ = [
    "MAX_POLL_RECORDS",
    "Counted",
    "Failed",
    "Outcome",
    "Refused",
    "poll_records",
    "window_partition",
]

log = logging.getLogger(__name__)

# Messages the window agent takes per consumer poll (:func:`poll_records`); here, beside
# the partition's control flow, so that ``kernelstream bench worker-path`` takes the
# polls the agent takes.
#
# aiokafka decompresses a fetch's record batches as they are taken, and one fetch of a
# backlog holds up to ``fetch_max_bytes`` of zstd batches (~5x that as JSON): taking a
# whole fetch at once made the worker's memory follow its lag. Catching up a backlog of
# 15M launches, peak RSS was 411-427 MiB taking whole fetches and 289-330 MiB taking 128
# messages (~250k launches, ~7 MiB of JSON) at a time, with no measurable cost in
# throughput.
MAX_POLL_RECORDS = 128
# A poll holds the event loop while it is processed, and a finding's way to the tuner
# (the findings reader's poll, the tuner's thread, the send) takes several turns of the
# loop, each waiting out a poll. So a poll is also bounded by
# launches: about this many, taken as whole messages, from the launches per message of
# the last poll (large batches: 32 messages of 2,000 launches, ~15 ms of JSON at full
# speed, instead of 128; small ones: the 128 above).
POLL_LAUNCHES = 65_536
MIN_POLL_RECORDS = 8


def poll_records(launches: int, messages: int) -> int:
    """Messages the next poll takes: about :data:`POLL_LAUNCHES` launches at the last
    poll's launches per message, within [:data:`MIN_POLL_RECORDS`, :data:`MAX_POLL_RECORDS`].

    >>> poll_records(128 * 2000, 128), poll_records(128 * 182, 128), poll_records(0, 5)
    (32, 128, 128)
    """
    if launches <= 0 or messages <= 0:
        return MAX_POLL_RECORDS
    return max(MIN_POLL_RECORDS, min(MAX_POLL_RECORDS, POLL_LAUNCHES * messages // launches))


@dataclass(slots=True)
class Counted:
    """Batches counted (a run, or one batch the general way), what of them came too late
    and the windows they closed. ``items`` are the caller's handles of ``batches``
    (messages, events), in order; ``duplicates``: launches of an overlapping batch that
    were counted before (the sequence rules skipped them)."""

    items: list[Any]
    batches: list[LaunchColumns]
    late: list[LaunchBatch] = field(default_factory=list)
    closed: list[WindowAggregate] = field(default_factory=list)
    duplicates: int = 0

    @property
    def launches(self) -> int:
        return sum(c.t_end.size for c in self.batches)


@dataclass(slots=True)
class Refused:
    """A batch the sequence rules refused: a resent copy or an implausible jump."""

    item: Any
    verdict: SeqVerdict

    @property
    def code(self) -> str:
        """The dead-letter reason code."""
        return "duplicate" if self.verdict.action == "duplicate" else "implausible_seq"


@dataclass(slots=True)
class Failed:
    """A batch the worker failed on in a way nothing foresaw (``internal_error``)."""

    item: Any
    error: Exception


Outcome = Counted | Refused | Failed


def window_partition(
    windower: Windower,
    batches: Iterable[tuple[Any, LaunchColumns]],
    seq_limits: SeqLimits,
    *,
    now: Callable[[Any], float],
    on_batch: Callable[[LaunchColumns], None] | None = None,
    stage_s: MutableMapping[str, float] | None = None,
) -> Iterator[Outcome]:
    """Window one partition's ``(item, batch)`` pairs in order; yield each outcome as it
    comes (see the module's docstring).

    ``now(item)``: the processing time of a batch (the clock, live; the message's
    timestamp, in replay). ``on_batch``: called with each batch counted the general way
    before it is windowed (the host side of the detector; a run takes no batch with host
    telemetry). ``stage_s``: seconds spent windowing (``"window"``) and closing
    (``"close"``) are added to it.
    """
    stage: MutableMapping[str, float] = stage_s if stage_s is not None else {}
    stage.setdefault("window", 0.0)
    stage.setdefault("close", 0.0)
    run = InOrderRun(windower)
    taken: list[Any] = []  # the items of the run's batches
    for item, cols in batches:
        if run.take(cols):
            taken.append(item)
            continue
        if taken:
            yield from _flush(windower, run, taken, seq_limits, now, on_batch, stage)
            taken = []
        yield _one(windower, item, cols, seq_limits, now, on_batch, stage)
    if taken:
        yield from _flush(windower, run, taken, seq_limits, now, on_batch, stage)


def _flush(
    windower: Windower,
    run: InOrderRun,
    items: list[Any],
    seq_limits: SeqLimits,
    now: Callable[[Any], float],
    on_batch: Callable[[LaunchColumns], None] | None,
    stage: MutableMapping[str, float],
) -> Iterator[Outcome]:
    """The batches ``run`` took, windowed at once, then their streams' windows closed
    (each stream's after the run: the same windows, in the same order per stream, as
    batch by batch)."""
    batches = run.batches
    t1 = time.perf_counter()
    try:
        touched, late = run.flush(now(items[-1]))
    except Exception:
        log.exception("windowing a run of %d batches failed; one by one", len(batches))
        for item, cols in zip(items, batches, strict=True):
            if windower.counted_whole(cols):
                yield Counted([item], [cols])  # counted by the run before it failed
            else:
                yield _one(windower, item, cols, seq_limits, now, on_batch, stage)
        return
    t2 = time.perf_counter()
    stage["window"] += t2 - t1
    closed: list[WindowAggregate] = []
    failed: list[Failed] = []
    for key in touched:
        try:
            closed += windower.poll_key(key)
        except Exception as ex:
            pairs = zip(reversed(items), reversed(batches), strict=True)
            failed.append(Failed(next(i for i, c in pairs if c.stream_key == key), ex))
    stage["close"] += time.perf_counter() - t2
    yield from failed
    yield Counted(items, batches, late, closed)


def _one(
    windower: Windower,
    item: Any,
    cols: LaunchColumns,
    seq_limits: SeqLimits,
    now: Callable[[Any], float],
    on_batch: Callable[[LaunchColumns], None] | None,
    stage: MutableMapping[str, float],
) -> Outcome:
    """One batch the general way: the sequence rules, the host side, the windower, its
    stream's close."""
    try:
        t = now(item)
        verdict = judge_sequence(windower, cols, t, seq_limits)
        if verdict.action != "count":
            return Refused(item, verdict)
        counted = verdict.cols
        if on_batch is not None:
            on_batch(counted)
        t1 = time.perf_counter()
        late = windower.add_columns(counted, t)
        t2 = time.perf_counter()
        stage["window"] += t2 - t1
        closed = windower.poll_key(counted.stream_key)
        stage["close"] += time.perf_counter() - t2
    except Exception as ex:
        return Failed(item, ex)
    return Counted([item], [counted], late, closed, verdict.skipped)
