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
)
from kernelstream.bench.pipeline_input import FleetSpec, fleet_batches, recent_t0
from kernelstream.schemas.binary import encode_launch_batch
from kernelstream.schemas.codec import encode

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
