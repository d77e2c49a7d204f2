"""window_partition: the window agent's and replay's one control flow over a partition.

Its outcomes, tallied, must give what batch by batch gives (every window, too-late
launch, verdict, the windower's metrics); failures nothing foresaw stay with the batch
they happened on; and it is lazy, so the window agent publishes what a batch closed
before the next batch is windowed.
"""

from __future__ import annotations

from typing import Any

import pytest

from kernelstream.agents.logic.ingest import Counted, Failed, Refused, window_partition
from kernelstream.agents.logic.sequencing import SeqLimits
from kernelstream.agents.logic.windowing import Windower, make_example_batch
from kernelstream.schemas import encode
from kernelstream.schemas.columnar import LaunchColumns
from tests.unit.agents.test_in_order_run import NOW, SPEC, _decoded, _fleet, _one_by_one, _result


def _through_partition(
    batches: list[LaunchColumns], poll: int, w: Windower | None = None
) -> tuple[dict[str, Any], list[Any]]:
    w = w or Windower(SPEC)
    out: dict[str, Any] = {"windows": [], "late": [], "verdicts": []}
    steps: list[Any] = []
    for at in range(0, len(batches), poll):
        chunk = list(enumerate(batches[at : at + poll], start=at))
        for step in window_partition(w, chunk, SeqLimits(), now=lambda _: NOW):
            steps.append(step)
            if isinstance(step, Counted):
                out["verdicts"] += [("count", step.duplicates)] * len(step.batches)
                out["late"] += [encode(x) for x in step.late]
                out["windows"] += step.closed
            elif isinstance(step, Refused):
                out["verdicts"].append((step.verdict.action, step.verdict.skipped))
    return _result(w, out), steps


@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("poll", [1, 7, 128])
def test_outcomes_give_what_batch_by_batch_gives(wire: str, poll: int) -> None:
    for seed in range(3):
        batches = _fleet(seed, wire)
        got, steps = _through_partition(batches, poll)
        assert got == _one_by_one(batches)
        # each batch is in exactly one outcome, in order
        items = [i for s in steps for i in (s.items if isinstance(s, Counted) else [s.item])]
        assert items == list(range(len(batches)))
        assert any(isinstance(s, Refused) for s in steps)
        assert not any(isinstance(s, Failed) for s in steps)


def test_it_is_lazy_a_batch_is_windowed_only_when_its_outcome_is_asked_for() -> None:
    w = Windower(SPEC)
    a = _decoded(make_example_batch([10.0, 10.5], seq_start=0))
    copy = _decoded(make_example_batch([10.0, 10.5], seq_start=0))
    b = _decoded(make_example_batch([11.2], seq_start=2))
    steps = window_partition(
        w, [("a", a), ("copy", copy), ("b", b)], SeqLimits(), now=lambda _: NOW
    )
    first = next(steps)
    assert isinstance(first, Counted) and first.items == ["a"]
    assert w.seen_through(a.stream_key) == 1  # b not yet counted
    second = next(steps)
    assert isinstance(second, Refused) and second.code == "duplicate"
    third = next(steps)
    assert isinstance(third, Counted) and third.items == ["b"]
    assert [agg.window_start for agg in third.closed] == [10.0]  # b closed a's window
    assert next(steps, None) is None


class _FailsOn(Windower):
    """A windower whose general path fails on one batch's launches, nothing foreseen."""

    def __init__(self, bad_seq: int, *, runs_fail: bool = False) -> None:
        super().__init__(SPEC)
        self.bad_seq = bad_seq
        self.runs_fail = runs_fail

    def add_columns(self, cols: LaunchColumns, now: float) -> list[Any]:
        if cols.meta.seq_start == self.bad_seq:
            raise RuntimeError("boom")
        return super().add_columns(cols, now)

    def add_in_order(self, run: Any, now: float) -> list[str] | None:
        if self.runs_fail:
            # count part of the run, then fail: what was counted must not be counted twice
            super().add_in_order(run[:1], now)
            raise RuntimeError("the run failed")
        return super().add_in_order(run, now)


def test_a_batch_that_fails_is_failed_alone_and_the_rest_counted() -> None:
    seqs = [0, 2, 4]
    batches = [
        _decoded(make_example_batch([10.0 + s / 10, 10.05 + s / 10], seq_start=s)) for s in seqs
    ]
    w = _FailsOn(bad_seq=2, runs_fail=True)
    steps = list(
        window_partition(w, list(zip("abc", batches, strict=True)), SeqLimits(), now=lambda _: NOW)
    )
    failed = [s for s in steps if isinstance(s, Failed)]
    counted = [i for s in steps if isinstance(s, Counted) for i in s.items]
    assert [f.item for f in failed] == ["b"] and str(failed[0].error) == "boom"
    # a: counted by the run before it failed (recognised by sequence number, once);
    # c: the general way, after b failed (its sequence numbers follow a gap: counted)
    assert counted == ["a", "c"]
    assert w.seen_through(batches[0].stream_key) == 5


def test_a_stream_whose_windows_fail_to_close_fails_its_last_batch_of_the_run() -> None:
    class _CloseFails(Windower):
        def poll_key(self, key: str) -> list[Any]:
            raise RuntimeError("close failed")

    w = _CloseFails(SPEC)
    a = _decoded(make_example_batch([10.0], seq_start=0))
    b = _decoded(make_example_batch([11.5], seq_start=1))
    steps = list(window_partition(w, [("a", a), ("b", b)], SeqLimits(), now=lambda _: NOW))
    failed, counted = steps
    assert isinstance(failed, Failed) and isinstance(counted, Counted)
    assert failed.item == "b"  # the batch that closed the windows
    assert counted.items == ["a", "b"]  # both were counted
