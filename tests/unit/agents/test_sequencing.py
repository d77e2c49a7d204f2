"""Sequence-number plausibility: one forged record never silences a stream."""

from __future__ import annotations

from kernelstream.agents.logic.sequencing import SEQ_BOUND, SeqLimits, judge_sequence
from kernelstream.agents.logic.windowing import Windower, make_example_batch
from kernelstream.schemas.columnar import LaunchColumns

LIMITS = SeqLimits(max_rate_per_s=1_000_000.0, slack_launches=100_000)


def cols(t0: float, n: int, seq: int) -> LaunchColumns:
    return LaunchColumns.from_batch(
        make_example_batch([t0 + 0.001 * i for i in range(n)], seq_start=seq)
    )


def feed(w: Windower, c: LaunchColumns, now: float) -> str:
    """What the window agent does with one batch; returns the verdict."""
    v = judge_sequence(w, c, now, LIMITS)
    if v.action == "count":
        w.add_columns(v.cols, now)
    return v.action


def test_a_forged_huge_sequence_number_is_refused_and_later_real_batches_count() -> None:
    w = Windower()
    assert feed(w, cols(100.0, 20, 0), 100.1) == "count"
    assert feed(w, cols(100.05, 1, 2**53), 100.1) == "implausible"
    assert w.seen_through("n1:0/saxpy") == 19  # the mark did not move
    counted = sum(
        feed(w, cols(100.1 + 0.02 * i, 20, 20 + 20 * i), 100.2 + 0.02 * i) == "count"
        for i in range(10)
    )
    assert counted == 10 and w.seen_through("n1:0/saxpy") == 219


def test_the_bound_holds_for_a_streams_first_batch() -> None:
    w = Windower()
    assert judge_sequence(w, cols(1.0, 2, SEQ_BOUND - 1), 1.0, LIMITS).action == "implausible"
    assert judge_sequence(w, cols(1.0, 2, SEQ_BOUND - 2), 1.0, LIMITS).action == "count"


def test_a_jump_is_allowed_as_far_as_the_rate_and_elapsed_event_time_allow() -> None:
    w = Windower()
    feed(w, cols(100.0, 10, 0), 100.0)  # newest event time 100.009
    # 2 s of event time later: up to 100,000 + 2,000,000 launches may be missing.
    assert judge_sequence(w, cols(102.009, 1, 10 + 2_100_000), 103.0, LIMITS).action == "count"
    assert judge_sequence(w, cols(102.009, 1, 10 + 2_100_001), 103.0, LIMITS).action == (
        "implausible"
    )
    # An event time in the future buys nothing: elapsed time stops at the worker's clock.
    far = judge_sequence(w, cols(400.0, 1, 10 + 10**8), 100.1, LIMITS)
    assert far.action == "implausible" and "jump" in far.reason


def test_a_batch_under_the_mark_but_newer_than_everything_counted_is_not_a_copy() -> None:
    """A forgery within the rate bound pushed the mark up: the node's next batches,
    numbered below it but later in event time, still count."""
    w = Windower()
    feed(w, cols(100.0, 10, 0), 100.0)
    assert feed(w, cols(100.01, 1, 50_000), 100.02) == "count"  # forged, plausible
    assert feed(w, cols(100.02, 10, 10), 100.03) == "count"  # the genuine next batch
    assert feed(w, cols(100.0, 10, 0), 100.04) == "duplicate"  # a resent copy still is


def test_an_overlapping_resend_counts_only_its_new_launches() -> None:
    w = Windower()
    feed(w, cols(100.0, 10, 0), 100.0)
    v = judge_sequence(w, cols(100.005, 10, 5), 100.1, LIMITS)
    assert v.action == "count" and v.skipped == 5 and v.cols.meta.seq_start == 10


def test_late_launches_go_out_in_messages_the_producer_accepts() -> None:
    """A 100,000-launch batch that arrives too late is 2.5 MB of JSON: it is cut into
    consecutive parts, each below the producer's default max_request_size."""
    from kernelstream.agents.window_agent import late_parts
    from kernelstream.schemas import encode

    n = 100_000
    batch = make_example_batch([1.0 + 1e-6 * i for i in range(n)], seq_start=7)
    parts = late_parts(batch)
    assert [p.seq_start for p in parts] == [7 + 20_000 * i for i in range(5)]
    assert sum(len(p.t_end) for p in parts) == n
    assert [t for p in parts for t in p.t_end] == batch.t_end
    assert max(len(encode(p)) for p in parts) < 1_000_000
