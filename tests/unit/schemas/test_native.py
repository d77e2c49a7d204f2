"""The compiled window passes (``kernelstream._native``) against their NumPy reference.

Every case compares the two on the same input, bit for bit: a worker with the compiled
passes publishes exactly the windows one without them publishes. Skipped with the reason
where the install has no compiled module (no Rust toolchain when it was built); CI builds it.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from kernelstream.agents.logic.windowing import duration_stats, duration_stats_numpy, percentiles
from kernelstream.schemas import native
from kernelstream.schemas.columnar import _plain_binary
from kernelstream.schemas.records import MAX_DURATION_BITS, MAX_DURATION_US

pytestmark = pytest.mark.skipif(native.core is None, reason=native.describe())


def _bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _same(a: object, b: object) -> bool:
    """Equal, floats by their bits (0.0 and -0.0 differ, NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return _bits(a) == _bits(b)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _chunks(values: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    return [values[a:b] for a, b in zip([0, *cuts], [*cuts, values.size], strict=True)]


def _compare(t: np.ndarray, d: np.ndarray, cuts: list[int], size_s: float = 1.0) -> None:
    core = native.core
    assert core is not None
    if d.size and not (np.signbit(d).any() or np.isnan(d).any() or np.isnan(t).any()):
        # the compiled pass answers (the comparison below is not NumPy against itself)
        assert core.window_stats(_chunks(t, cuts), _chunks(d, cuts), [50.0]) is not None
    native_count, native_stats = duration_stats(_chunks(t, cuts), _chunks(d, cuts), size_s)
    numpy_count, numpy_stats = duration_stats_numpy(
        _chunks(t.copy(), cuts), _chunks(d.copy(), cuts), size_s
    )
    assert native_count == numpy_count
    assert list(native_stats) == list(numpy_stats)
    for key, value in numpy_stats.items():
        assert _same(float(native_stats[key]), float(value)), (key, native_stats[key], value)


# every boundary of the pairwise sums (8, 128, each halving) and sizes of real windows
_SMALL = (1, 2, 3, 7, 8, 9, 15, 16, 17, 127, 128, 129, 255, 256, 257)
_SIZES = (*_SMALL, 1000, 1333, 4095, 4096, 4097, 8192, 16_001, 26_700, 100_003)


@pytest.mark.parametrize("n", _SIZES)
def test_window_stats_equal_numpy_bit_for_bit(n: int) -> None:
    """Pairwise sums change their split at 8 and 128 values and at every halving, the
    percentiles' ranks with the size: every boundary, in completion order, in chunks."""
    rng = np.random.default_rng(n)
    d = rng.lognormal(3.0, 1.2, n)
    t = 1.7e9 + np.cumsum(rng.exponential(2e-5, n))
    cuts = sorted(set(rng.integers(1, n, size=min(5, n - 1)).tolist())) if n > 1 else []
    _compare(t, d, cuts)


def test_window_stats_out_of_completion_order_and_ties() -> None:
    """End times out of order (a late batch) are sorted stably, ties keep arrival order."""
    rng = np.random.default_rng(7)
    t = np.round(1.7e9 + rng.uniform(0.0, 1.0, 5000), 3)  # many equal end times
    d = rng.lognormal(2.0, 2.0, 5000)
    _compare(t, d, [100, 2500, 4999])


@pytest.mark.parametrize(
    "d",
    [
        [0.0] * 50,  # launches timed at 0 us
        [MAX_DURATION_US] * 9 + [0.0],  # the schema's largest duration
        [5e-324, 1.0, 5e-324, 3.0],  # subnormal
        [2.0] * 129,  # all equal: every rank the same value
    ],
)
def test_window_stats_at_the_edges_of_the_schema(d: list[float]) -> None:
    n = len(d)
    _compare(1.7e9 + np.arange(n) * 1e-3, np.array(d), [n // 2] if n > 1 else [])


def test_window_stats_leave_what_they_cannot_promise_to_numpy() -> None:
    """A negative or NaN duration, a NaN end time, a chunk of another dtype: None or an
    error the caller turns into the NumPy path; the result is NumPy's either way."""
    core = native.core
    assert core is not None
    t = 1.7e9 + np.arange(4.0)
    assert core.window_stats([t], [np.array([1.0, -0.0, 2.0, 3.0])], [50.0]) is None
    assert core.window_stats([t], [np.array([1.0, np.nan, 2.0, 3.0])], [50.0]) is None
    assert core.window_stats([np.array([1.0, np.nan, 2.0, 3.0])], [t], [50.0]) is None
    assert core.window_stats([], [], [50.0]) is None
    with pytest.raises(TypeError):
        core.window_stats([t], [np.arange(4, dtype=np.float32)], [50.0])
    with pytest.raises(ValueError):
        core.window_stats([t], [np.arange(8.0)[::2]], [50.0])  # not contiguous
    _compare(t, np.array([1.0, -0.0, 2.0, 3.0]), [2])
    _compare(t, np.array([1.0, np.nan, 2.0, 3.0]), [])
    # misaligned (a view one byte into a buffer) and big-endian columns: NumPy decides
    shifted = np.frombuffer(bytes(33), np.float64, count=4, offset=1)
    assert not shifted.flags.aligned
    with pytest.raises(ValueError):
        core.window_stats([t], [shifted], [50.0])
    assert duration_stats([t], [shifted], 1.0) == duration_stats_numpy([t], [shifted], 1.0)
    swapped = np.array([1.0, 2.0, 3.0, 4.0], dtype=">f8")
    with pytest.raises(TypeError):
        core.window_stats([t], [swapped], [50.0])
    assert duration_stats([t], [swapped], 1.0) == duration_stats_numpy([t], [swapped], 1.0)
    f32 = np.arange(4, dtype=np.float32)
    assert duration_stats([t], [f32], 1.0) == duration_stats_numpy([t], [f32.copy()], 1.0)
    assert duration_stats([], [], 1.0) == duration_stats_numpy([], [], 1.0)


@pytest.mark.parametrize("n", [1, 2, 9, 129, 26_700])
# (beside +inf durations NumPy's reference subtracts an infinite mean from them: a NaN
# deviation, the compiled pass's too, which NumPy warns of)
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
def test_window_stats_find_a_nan_wherever_it_is(n: int) -> None:
    """A NaN duration is found by the durations' sum, a NaN end time by the order of the
    end times (a single one by itself): at the start, the middle and the end of windows
    of every size, beside +inf durations, and in chunks; NumPy's result every time."""
    core = native.core
    assert core is not None
    rng = np.random.default_rng(n)
    base_t = 1.7e9 + np.cumsum(rng.exponential(2e-5, n))
    base_d = rng.lognormal(3.0, 1.0, n)
    for at in sorted({0, n // 2, n - 1}):
        for column in ("t", "d"):
            for beside_inf in (False, True):
                t, d = base_t.copy(), base_d.copy()
                (t if column == "t" else d)[at] = np.nan
                if beside_inf and n > 1:
                    d[(at + 1) % n] = np.inf
                assert core.window_stats([t], [d], [50.0, 95.0]) is None
                cuts = [n // 3] if n > 2 else []
                _compare(t, d, cuts)
    # +inf durations alone are numbers NumPy sums and ranks: the compiled pass answers
    d = base_d.copy()
    d[n // 2] = np.inf
    assert core.window_stats([base_t], [d], [50.0]) is not None
    _compare(base_t, d, [n // 3] if n > 2 else [])


@pytest.mark.parametrize("n", [100, 4097, 26_700])
def test_window_stats_percentiles_of_ranks_far_apart_equal_numpy(n: int) -> None:
    """Many percentiles at once: the ranks fall in one bucket, in neighbouring buckets or
    in several runs of them, each way of gathering their values; the NumPy path's values
    (``percentiles``: NumPy's partitions, and its interpolation between ranks)."""
    core = native.core
    assert core is not None
    rng = np.random.default_rng(n)
    d = rng.lognormal(3.0, 1.5, n)
    t = 1.7e9 + np.cumsum(rng.exponential(2e-5, n))
    qs = [0.0, 1.0, 5.0, 25.0, 50.0, 50.5, 75.0, 95.0, 99.0, 99.9, 100.0]
    got = core.window_stats([t], [d], qs)
    assert got is not None
    want = percentiles(d.copy(), qs)
    assert [_bits(x) for x in got[5]] == [_bits(x) for x in want]


def _plain_cases() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    t = 1.7e9 + np.arange(6) * 1e-3
    d = np.full(6, 10.0)
    ok = np.ones(6, np.uint8)
    over = np.frombuffer(struct.pack("<Q", MAX_DURATION_BITS + 1), np.float64)[0]
    cases = [(t, d, ok), (t[:1], d[:1], ok[:1])]
    for i, bad in [(2, np.nan), (0, np.inf), (5, -np.inf), (3, t[0] - 1.0), (0, np.nan)]:
        tt = t.copy()
        tt[i] = bad
        cases.append((tt, d, ok))
    for value in (-0.0, -1.0, np.nan, over, MAX_DURATION_US, 0.0):
        dd = d.copy()
        dd[4] = value
        cases.append((t, dd, ok))
    for flag in (0, 2, 255):
        oo = ok.copy()
        oo[1] = flag
        cases.append((t, d, oo))
    cases.append((np.array([np.nan]), d[:1], ok[:1]))
    cases.append((t[::-1].copy(), d, ok))  # out of order, finite: the range by min and max
    return cases


@pytest.mark.parametrize("case", range(len(_plain_cases())))
def test_plain_many_equals_the_numpy_checks(case: int) -> None:
    t, d, ok = _plain_cases()[case]
    core = native.core
    assert core is not None
    want = _plain_binary({"t_end": t, "duration_us": d, "ok": ok}, t.size)
    got = core.plain_many([t], [d], [ok], MAX_DURATION_BITS)[0]
    assert _same(got, want), (got, want)


def test_plain_many_takes_a_poll() -> None:
    cases = _plain_cases()
    core = native.core
    assert core is not None
    got = core.plain_many(
        [c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases], MAX_DURATION_BITS
    )
    want = [_plain_binary({"t_end": t, "duration_us": d, "ok": o}, t.size) for t, d, o in cases]
    assert all(_same(g, w) for g, w in zip(got, want, strict=True))
    first = got[0]
    assert first is not None and math.isfinite(first[0][0])


def test_a_poll_decodes_the_same_with_and_without_the_compiled_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """:func:`decode_launch_columns_many` over binary batches that pass, fail each check,
    and a JSON one (its 64-bit flags leave the poll's checks to NumPy): the same columns and
    the same verdicts either way."""
    from kernelstream.schemas import encode
    from kernelstream.schemas.columnar import decode_launch_columns_many
    from tests.unit.schemas.test_binary import _BASE, _binary

    values = [_binary(t, d, ok) for t, d, ok in _plain_cases()]
    values.append(encode(_BASE))

    def decoded() -> list[object]:
        out: list[object] = []
        for c in decode_launch_columns_many(values):
            if isinstance(c, Exception):
                out.append(("error", str(c)))
            else:
                out.append((c.meta, c.t_end.tobytes(), c.duration_us.tobytes(), c.ok.tolist()))
        return out

    compiled = decoded()
    monkeypatch.setattr(native, "core", None)
    assert decoded() == compiled


@pytest.mark.parametrize("seed", range(40))
def test_window_stats_equal_numpy_on_random_windows(seed: int) -> None:
    """Random windows: sizes, chunkings, and durations from narrow to spanning the schema's
    whole range (subnormal to the largest), with many repeated values and outliers, where
    the counting pass's ranges hold very different numbers of values."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 40_000))
    kind = seed % 5
    if kind == 0:
        d = rng.lognormal(float(rng.uniform(-2, 8)), float(rng.uniform(0.01, 3)), n)
    elif kind == 1:  # a few distinct values, repeated
        d = rng.choice(rng.uniform(0, 100, 3), n)
    elif kind == 2:  # mostly one value and a far outlier
        d = np.full(n, 7.25)
        d[rng.integers(0, n)] = MAX_DURATION_US
    elif kind == 3:  # exponents across the whole range
        d = np.exp2(rng.uniform(-1074, np.log2(MAX_DURATION_US), n))
    else:  # integers of microseconds, many ties, zeros
        d = rng.integers(0, 50, n).astype(np.float64)
    d = np.minimum(d, MAX_DURATION_US)
    t = 1.7e9 + np.cumsum(rng.exponential(1e-5, n))
    if seed % 7 == 0:  # out of completion order
        t = t[rng.permutation(n)]
    cuts = sorted(set(rng.integers(1, n, size=int(rng.integers(0, 20))).tolist())) if n > 1 else []
    _compare(t, d, cuts)


@pytest.mark.parametrize("seed", range(12))
def test_window_stats_percentiles_equal_numpy_at_any_ranks(seed: int) -> None:
    """One percentile (its ranks in one range of buckets), two, and many (ranks spread
    over many buckets, empty ones between): each the NumPy path's, bit for bit."""
    core = native.core
    assert core is not None
    rng = np.random.default_rng(2000 + seed)
    n = int(rng.integers(2, 30_000))
    d = (
        rng.lognormal(3.0, 2.0, n)
        if seed % 3
        else np.exp2(rng.uniform(-1074, np.log2(MAX_DURATION_US), n))
    )
    d = np.minimum(d, MAX_DURATION_US)
    t = 1.7e9 + np.cumsum(rng.exponential(1e-5, n))
    for qs in ([50.0], [50.0, 95.0], [0.0, 1.0, 5.0, 25.0, 50.0, 75.0, 95.0, 99.0, 100.0]):
        got = core.window_stats([t], [d], qs)
        assert got is not None
        want = percentiles(d.copy(), qs)
        assert [x.hex() for x in got[5]] == [float(x).hex() for x in want], qs
