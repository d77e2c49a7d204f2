"""The columnar window stage of ``bench worker-path --columnar`` computes the worker's
windows, whatever the polls, and leaves to the general path what it does not cover."""

from __future__ import annotations

import pytest

from kernelstream.agents.logic.windowing import WindowSpec
from kernelstream.bench.columnar_bound import (
    ColumnarWindows,
    NotSteadyError,
    check_rows,
    columnar_pass,
    compiled_pass,
)
from kernelstream.bench.pipeline_input import FleetSpec, fleet_batches, recent_t0
from kernelstream.schemas import native
from kernelstream.schemas.binary import encode_launch_batch
from kernelstream.schemas.codec import encode
from kernelstream.schemas.columnar import decode_launch_columns
from kernelstream.schemas.records import MAX_DURATION_BITS

SPEC = WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.05)


def _values(rate: float = 1000.0) -> list[bytes]:
    fleet = FleetSpec(
        nodes=3, launches_per_s_per_kernel=rate, seconds=3.0, max_launches=2000, t0=recent_t0(3)
    )
    return [encode_launch_batch(b) for b in fleet_batches(fleet)]


@pytest.mark.parametrize("rate", [1000.0, 20_000.0])
def test_every_window_equals_the_workers(rate: float) -> None:
    values = _values(rate)
    _, rows = columnar_pass(values, SPEC, [16] * (len(values) // 16) + [len(values) % 16])
    equal, reference = check_rows(rows, values, SPEC)
    assert reference > 0
    assert equal == reference == len(rows)


def test_the_same_rows_whatever_the_polls() -> None:
    values = _values()
    _, one_by_one = columnar_pass(values, SPEC, [1] * len(values))
    _, all_at_once = columnar_pass(values, SPEC, [len(values)])
    assert one_by_one  # windows closed
    assert sorted(one_by_one) == sorted(all_at_once)  # the order they close in differs


def _poll(values: list[bytes]) -> None:
    import time

    ColumnarWindows(SPEC).poll(values, time.time())


def test_what_it_does_not_cover_is_refused_not_windowed() -> None:
    values = _values()
    with pytest.raises(NotSteadyError, match="continue its stream"):
        _poll(values[:6] + values[4:5])  # a batch delivered twice
    head = values[0][32 : 32 + int.from_bytes(values[0][20:24], "little")]
    stream = [v for v in values if v[32 : 32 + len(head)] == head]  # one stream's batches
    assert len(stream) >= 3
    _poll(stream[:2])  # in order
    with pytest.raises(NotSteadyError, match="continue its stream"):
        _poll([stream[0], stream[2]])  # a batch lost between them
    batch = next(iter(fleet_batches(FleetSpec(nodes=1, seconds=1.0, t0=recent_t0(1)))))
    with pytest.raises(NotSteadyError, match="binary"):
        _poll([encode(batch) + b" " * (-len(encode(batch)) % 8)])  # JSON
    with pytest.raises(NotSteadyError):
        _poll([b"KSLB"])


needs_core = pytest.mark.skipif(native.core is None, reason=native.describe())


@needs_core
@pytest.mark.parametrize("rate", [1000.0, 20_000.0])
def test_the_compiled_stage_closes_the_workers_windows(rate: float) -> None:
    """``compiled_pass`` (the state in ``kernelstream._native.SteadyWindows``): every
    window the worker's, whatever the polls; the order they close in may differ."""
    values = _values(rate)
    _, rows = compiled_pass(values, SPEC, [16] * (len(values) // 16) + [len(values) % 16])
    equal, reference = check_rows(rows, values, SPEC)
    assert reference > 0
    assert equal == reference == len(rows)
    _, one_by_one = compiled_pass(values, SPEC, [1] * len(values))
    assert sorted(one_by_one) == sorted(rows)


@needs_core
def test_the_compiled_stage_refuses_a_poll_whole() -> None:
    """A poll with a batch it does not cover is refused before anything changes: the poll
    after it windows as if it had never come."""
    import time

    core = native.core
    assert core is not None
    values = _values()
    engine = core.SteadyWindows(1.0, 0.0, 0.05, 3600.0, 60.0, MAX_DURATION_BITS)
    with pytest.raises(ValueError, match="0: a header not registered"):
        engine.poll(values[:3], time.time())
    for v in values:
        cols = decode_launch_columns(v)
        engine.register(core.SteadyWindows.header_of(v), cols.meta.stream_key, cols.meta.config_id)
    with pytest.raises(ValueError, match="6: a batch that does not continue its stream"):
        engine.poll(values[:6] + values[4:5], time.time())  # a batch delivered twice
    with pytest.raises(ValueError, match="0: not a binary batch"):
        engine.poll([b"KSLB"], time.time())
    closed = [
        r for i in range(0, len(values), 16) for r in engine.poll(values[i : i + 16], time.time())
    ]
    _, rows = compiled_pass(values, SPEC, [16] * (len(values) // 16) + [len(values) % 16])
    assert sorted(closed) == sorted(tuple(r) for r in rows)
