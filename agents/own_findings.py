"""Findings this worker published, taken back by the findings reader without decoding.

The window agent's detector (:mod:`agents.detector_agent`) writes each window's finding
to ``ks.findings``, and where this worker also owns the finding's fleet group (every
group, with one worker) its findings reader (:mod:`agents.findings_agent`) fetches the
same bytes back and checks and decodes them at the edge: about 15 us a finding, a
quarter of what a window costs the tuner and alert stages. Bytes equal to bytes this
process wrote from a record it computed need no check: the reader looks the message's
value up here and, where found, builds the finding from the parts it was written from
(:meth:`Finding.of_window`, held equal to decoding those bytes by
``tests/unit/agents/test_own_findings.py``). Any other message, or one whose entry was
dropped, is decoded as before.

Bounded: the findings of groups another worker owns are never read back here, so the
oldest entries go once :data:`LIMIT` are kept.
"""

from __future__ import annotations

from typing import Any

from kernelstream.schemas import Finding, WindowAggregate

__all__ = ["LIMIT", "OwnFindings"]

#: Entries kept (about 2 kB each, the window included): a worker's reader takes its own
#: findings back within a poll or two, a few hundred at 500 windows a second.
LIMIT = 8192


class OwnFindings:
    """Published finding bytes -> the finding, or the parts it is built from."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._kept: dict[bytes, Finding | tuple[WindowAggregate, dict[str, Any]]] = {}
        self.taken = 0

    def put(self, value: bytes, made: Finding | tuple[WindowAggregate, dict[str, Any]]) -> None:
        """Keep ``made`` for the finding published as ``value``: the record, or the window
        and :meth:`Finding.of_window`'s keyword arguments it was written from."""
        kept = self._kept
        if len(kept) >= self.limit:
            del kept[next(iter(kept))]  # the oldest (a dict keeps insertion order)
        kept[value] = made

    def take(self, value: bytes) -> Finding | None:
        """The finding published as ``value`` by this process (once), else None."""
        made = self._kept.pop(value, None)
        if made is None:
            return None
        self.taken += 1
        if isinstance(made, Finding):
            return made
        agg, parts = made
        return Finding.of_window(agg, **parts, written=True)

    def __len__(self) -> int:
        return len(self._kept)
