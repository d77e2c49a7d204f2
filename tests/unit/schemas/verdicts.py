"""What a launch-batch decoder gives for one message, and the check that two agree."""

from __future__ import annotations

from collections.abc import Callable

from kernelstream.schemas import SchemaError
from kernelstream.schemas.columnar import LaunchColumns

Verdict = LaunchColumns | SchemaError


def verdict(decode: Callable[[bytes], LaunchColumns], raw: bytes) -> Verdict:
    """``decode(raw)``, or the :class:`SchemaError` it raised."""
    try:
        return decode(raw)
    except SchemaError as exc:
        return exc


def assert_same(got: Verdict, want: Verdict, *, known: bool = True) -> None:
    """The same error (code and message), or the same columns (bytes and dtypes), fields
    and stream key. ``known``: also the same facts the decoder found out about the columns
    (range, order, all ran); else the same fields by value and the same time range."""
    if isinstance(want, SchemaError):
        assert isinstance(got, SchemaError), got
        assert (got.code, str(got)) == (want.code, str(want))
        return
    assert isinstance(got, LaunchColumns), got
    for name in ("t_end", "duration_us", "ok"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    if not known:
        assert got.meta.model_dump() == want.meta.model_dump()
        assert got.stream_key == want.stream_key and got.t_range() == want.t_range()
        return
    assert got.meta == want.meta
    assert got.stream_key == want.meta.stream_key
    assert got.known_t_range == want.known_t_range
    assert got.known_in_order == want.known_in_order
    assert got.known_all_ok == want.known_all_ok
