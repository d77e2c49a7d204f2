"""Which launches of a batch are new, by the stream's sequence numbers and event times.

A node numbers each stream's launches without gaps or reuse and sends a stream's
batches in order, so the windower's high-water mark (:meth:`Windower.seen_through`)
recognises a resent copy or a replay: its numbers are at or below the mark. That
trust is bounded here, so one forged record cannot make a stream's later genuine
launches disappear:

* **Bound.** No genuine stream reaches :data:`SEQ_BOUND` (2**50: a million launches a
  second for 35 years). A batch numbered past it is refused and moves nothing.
* **Rate.** A stream's numbers can only run ahead of its last counted launch as fast
  as a device launches kernels: a gap larger than ``slack + rate x elapsed`` (elapsed
  event time since the stream's newest counted launch, capped at the worker's clock so
  a future timestamp buys nothing) is refused and moves nothing. Genuine gaps (a node
  that dropped batches while its outbox was full) are spread over the time of the
  outage, so they pass.
* **Event time.** A resent copy carries event times the stream already passed. A batch
  numbered at or below the mark whose first launch is *newer* than every launch
  counted so far is not a copy: it is counted (the mark was pushed up by a forgery
  that passed the rate check, or the node lost its numbering), never dropped as a
  duplicate.

Shared by the window agent and the offline replay, so both decide alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kernelstream.agents.logic.windowing import Windower
    from kernelstream.schemas.columnar import LaunchColumns

__all__ = ["SEQ_BOUND", "SeqLimits", "SeqVerdict", "judge_sequence"]

#: Sequence numbers at or past this are refused (2**50, ~1.1e15).
SEQ_BOUND = 1 << 50


@dataclass(frozen=True)
class SeqLimits:
    """How far a stream's sequence numbers may run ahead of its last counted launch."""

    max_rate_per_s: float = 1_000_000.0
    slack_launches: int = 100_000


@dataclass(frozen=True)
class SeqVerdict:
    """``action``: count ``cols``, or refuse the batch as a duplicate or implausible."""

    action: Literal["count", "duplicate", "implausible"]
    cols: LaunchColumns
    reason: str = ""
    skipped: int = 0  # launches at the head of the batch that were counted before


def judge_sequence(
    windower: Windower, cols: LaunchColumns, now: float, limits: SeqLimits
) -> SeqVerdict:
    """What to do with a decoded batch, given what the windower has counted of its stream.

    >>> from kernelstream.agents.logic.windowing import Windower, make_example_batch
    >>> from kernelstream.schemas.columnar import LaunchColumns
    >>> w = Windower()
    >>> first = LaunchColumns.from_batch(make_example_batch([10.0, 10.1], seq_start=0))
    >>> _ = w.add_columns(first, now=10.2)
    >>> forged = LaunchColumns.from_batch(make_example_batch([10.2], seq_start=2**53))
    >>> judge_sequence(w, forged, 10.3, SeqLimits()).action
    'implausible'
    >>> judge_sequence(w, first, 10.3, SeqLimits()).action
    'duplicate'
    """
    meta, n = cols.meta, len(cols)
    first, last = meta.seq_start, meta.seq_start + n - 1
    key = cols.stream_key
    if last >= SEQ_BOUND:
        return SeqVerdict(
            "implausible",
            cols,
            f"launches {key} seq {first}..{last} pass the bound {SEQ_BOUND} no stream reaches",
        )
    seen = windower.seen_through(key)
    if seen < 0:
        return SeqVerdict("count", cols)
    newest = windower.newest_event_time(key)
    t_first = cols.t_range()[0]
    if first > seen + 1:
        elapsed = max(0.0, min(t_first, now) - newest)
        allowed = limits.slack_launches + limits.max_rate_per_s * elapsed
        if first - seen - 1 > allowed:
            return SeqVerdict(
                "implausible",
                cols,
                f"launches {key} seq {first}..{last} jump {first - seen - 1} past the "
                f"last counted seq {seen}, more than the {allowed:.0f} launches the stream "
                f"could have run in {elapsed:.3f} s at {limits.max_rate_per_s:.0f}/s",
            )
        return SeqVerdict("count", cols)
    if first > seen or t_first > newest:
        return SeqVerdict("count", cols)  # next in line, or newer than anything counted
    if last <= seen:
        return SeqVerdict(
            "duplicate",
            cols,
            f"launches {key} seq {first}..{last} were already counted "
            f"(counted through seq {seen}): a resent copy or a replay",
        )
    skipped = seen + 1 - first
    return SeqVerdict("count", cols.drop_first(skipped), skipped=skipped)
