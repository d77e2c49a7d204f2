"""The worker's columnar decoder accepts and rejects exactly what the pydantic model does."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from kernelstream.agents.logic.windowing import make_example_batch
from kernelstream.schemas import LaunchBatch, SchemaError, decode
from kernelstream.schemas.columnar import (
    LaunchColumns,
    decode_launch_columns,
    decode_launch_columns_many,
)
from tests.unit.schemas.verdicts import assert_same, verdict

# A valid record as a node sends it (the shared example batch), columns replaced per case.
_BASE: dict[str, Any] = make_example_batch(
    [1.5, 2.5], duration_us=[3.0, 4.0], ok=[1, 0]
).model_dump(by_alias=True)

_COLUMNS: list[tuple[str, Any]] = [
    ("t_end", [1, 2]),  # ints are numbers
    ("t_end", [1.5, "2.5"]),  # a numeric string
    ("t_end", [1.5, None]),
    ("t_end", [1.5, True]),
    ("t_end", [1.5, [2.5]]),
    ("t_end", [[1.5], [2.5]]),  # simdjson's typed copy would flatten these
    ("ok", [1, [0]]),
    ("t_end", [1.5, {"x": 1}]),
    ("t_end", [1.5, 10**400]),
    ("t_end", [1.5]),  # lengths differ
    ("t_end", []),
    ("t_end", "1.5,2.5"),
    ("duration_us", [3.0, -1.0]),
    ("duration_us", [3.0, 3.6e9]),
    ("duration_us", [3.0, 3.7e9]),
    ("duration_us", [3.0, 1e400]),  # orjson reads it as inf
    ("duration_us", [0, 4]),
    ("ok", [1, 2]),
    ("ok", [True, False]),
    ("ok", [1.0, 0.0]),
    ("ok", ["1", 0]),
    ("ok", [1, None]),
    ("ok", [1, 1]),
]


def _raw(column: str, value: Any) -> bytes:
    if column == "duration_us" and value == [3.0, 1e400]:
        return orjson.dumps(_BASE | {"duration_us": [3.0, 0.0]}).replace(b"0.0]", b"1e400]")
    if column == "t_end" and value == [1.5, 10**400]:
        huge = b"1" + b"0" * 400 + b"]"
        return orjson.dumps(_BASE | {"t_end": [1.5, 0.0]}).replace(b"0.0]", huge)
    return orjson.dumps(_BASE | {column: value})


@pytest.mark.parametrize(("column", "value"), _COLUMNS, ids=[f"{c}={v!r:.30}" for c, v in _COLUMNS])
def test_same_verdict_and_values_as_the_model(column: str, value: Any) -> None:
    raw = _raw(column, value)
    try:
        want = decode(raw, LaunchBatch)
    except SchemaError as ex:
        with pytest.raises(SchemaError) as got:
            decode_launch_columns(raw)
        assert got.value.code == ex.code
        return
    cols = decode_launch_columns(raw)
    assert cols.t_end.dtype == np.float64 and cols.duration_us.dtype == np.float64
    assert cols.t_end.tolist() == [float(x) for x in want.t_end]
    assert cols.duration_us.tolist() == [float(x) for x in want.duration_us]
    assert cols.ok.tolist() == [bool(o) for o in want.ok]
    assert cols.meta.seq_start == want.seq_start


def test_batch_sizes_from_one_to_many_decode_exactly() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 100, 2000, 2001):
        t = (1.8e9 + np.cumsum(rng.random(n))).round(6).tolist()
        d = (rng.random(n) * 100).round(3).tolist()
        raw = orjson.dumps(_BASE | {"t_end": t, "duration_us": d, "ok": [1] * n})
        cols = decode_launch_columns(raw)
        assert cols.t_end.tolist() == t and cols.duration_us.tolist() == d
        assert cols.ok.all() and len(cols) == n


# Per-batch fields varied around the base record, each decoded twice (the second time the
# validated fields may come from the decoder's cache): the verdict, the error code and the
# fields must be the model's every time.
_FIELDS: list[tuple[str, Any]] = [
    ("seq_start", 7),
    ("seq_start", 8),
    ("seq_start", -1),
    ("seq_start", 7.0),  # the model accepts a whole float for an int
    ("seq_start", "7"),
    ("seq_start", True),
    ("device_index", 0),
    ("device_index", 0.0),
    ("device_index", True),
    ("device_index", "0"),
    ("occupancy", 1),
    ("occupancy", 1.0),
    ("occupancy", 1.5),
    ("occupancy", True),
    ("problem_size", [64, 64]),
    ("problem_size", [64.0, 64]),
    ("config", {"block_size_x": 64}),
    ("config", {"block_size_x": 64.0}),
    ("kernel", "other"),
    ("kernel", ""),
    ("unknown_field", 1),
    ("samples", [{"t": 1.0}]),
]


def _verdict(raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", decode(raw, LaunchBatch).model_dump(exclude={"t_end", "duration_us", "ok"})
    except SchemaError as ex:
        return "error", ex.code


@pytest.mark.parametrize(("field", "value"), _FIELDS, ids=[f"{f}={v!r:.30}" for f, v in _FIELDS])
def test_cached_per_batch_fields_give_the_models_verdict(field: str, value: Any) -> None:
    raw = orjson.dumps(_BASE | {field: value})
    want = _verdict(raw)
    for _ in range(2):
        try:
            cols = decode_launch_columns(raw)
        except SchemaError as ex:
            assert want == ("error", ex.code)
            continue
        assert want[0] == "ok", f"accepted what the model refuses: {want}"
        got = cols.meta.model_dump(exclude={"t_end", "duration_us", "ok"})
        assert got == want[1] and type(got[field]) is type(want[1][field])


def test_a_streams_batches_keep_their_own_sequence_numbers() -> None:
    metas = [decode_launch_columns(orjson.dumps(_BASE | {"seq_start": s})).meta for s in range(5)]
    assert [m.seq_start for m in metas] == list(range(5))
    assert len({id(m) for m in metas}) == 5


def test_plain_json_batches_take_the_simdjson_path_bit_for_bit() -> None:
    """A node's JSON batch is decoded without Python floats (simdjson), every value of
    the columns bit-identical to the model's, over full-precision and edge doubles."""
    from kernelstream.schemas.columnar import _simd_parts

    rng = np.random.default_rng(1)
    edge = [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1 / 3, 1e-7]
    for n in (1, 7, 182, 2000):
        t = (1.8e9 + np.cumsum(rng.random(n))).tolist()  # 17 significant digits
        d = (rng.random(n) * 3.6e9).tolist()
        d[: min(n, len(edge))] = [min(v, 3.6e9) for v in edge[:n]]
        ok = rng.integers(0, 2, n).tolist()
        raw = orjson.dumps(_BASE | {"t_end": t, "duration_us": d, "ok": ok, "seq_start": n})
        assert _simd_parts(raw) is not None, "a plain batch must take the fast path"
        cols = decode_launch_columns(raw)
        [many] = decode_launch_columns_many([raw])
        assert isinstance(many, LaunchColumns) and many.ok.tolist() == cols.ok.tolist()
        want = decode(raw, LaunchBatch)
        assert cols.t_end.view(np.uint64).tolist() == np.array(want.t_end).view(np.uint64).tolist()
        assert cols.duration_us.tolist() == want.duration_us
        assert cols.ok.tolist() == [bool(o) for o in want.ok]
        assert cols.meta.model_dump(exclude={"t_end", "duration_us", "ok"}) == want.model_dump(
            exclude={"t_end", "duration_us", "ok"}
        )


@pytest.mark.parametrize(
    "raw",
    [
        orjson.dumps(_BASE).replace(b'"kernel":', b'"kernel":"evil","kernel":', 1),
        orjson.dumps(_BASE).replace(b'"ok":', b'"ok":[1,1],"ok":', 1),
        orjson.dumps(_BASE | {"config": {"a": 1}}).replace(b'{"a":1}', b'{"a":1,"a":2}'),
    ],
    ids=["batch field", "column", "nested object"],
)
def test_a_repeated_key_is_refused_as_before(raw: bytes) -> None:
    with pytest.raises(SchemaError) as got:
        decode_launch_columns(raw)
    assert got.value.code == "duplicate_key"


_OPTIONAL = b',"samples":[],"host_gap_us":null,"host_waited":null,"copies":null}'


@pytest.mark.parametrize(
    ("tail", "fast"),
    [
        (_OPTIONAL, True),  # every optional field, empty
        (b"}", True),  # none of them
        (b',"host_waited":null}', True),
        (_OPTIONAL[:-1] + b',"kernel":"evil"}', False),  # a batch field again, after
        (_OPTIONAL[:-1] + b',"copies":null}', False),  # an optional field twice
        (_OPTIONAL[:-1] + b',"extra":1}', False),  # a field the record does not have
        (b',"samples":[{"t":1.5}]}', False),  # device samples: the model's path
    ],
)
def test_the_fields_after_the_columns_are_judged_as_the_orjson_path_does(
    tail: bytes, fast: bool
) -> None:
    """The simdjson path counts the keys after ``seq_start`` and looks up the ones it
    may take; a repeated, unknown or missing one sends the batch to the orjson path."""
    from kernelstream.schemas.columnar import _simd_parts

    raw = orjson.dumps(_BASE)
    assert raw.endswith(_OPTIONAL)
    raw = raw[: -len(_OPTIONAL)] + tail
    assert (_simd_parts(raw) is not None) == fast
    _equal(verdict(decode_launch_columns, raw), _orjson_verdict(raw))


@pytest.mark.parametrize(
    ("column", "replacement"),
    [
        (b'"ok":', b'"okay":'),  # a needed column missing, an unknown key in its place
        (b'"ok":[1,0]', b'"duration_us":[3.0,4.0]'),  # one column twice, one missing
        (b'"seq_start":0,', b'"seq_start":0,"seq_start":1,'),
    ],
)
def test_a_missing_or_repeated_column_leaves_the_simdjson_path(
    column: bytes, replacement: bytes
) -> None:
    from kernelstream.schemas.columnar import _simd_parts

    raw = orjson.dumps(_BASE)
    assert raw.count(column) == 1
    raw = raw.replace(column, replacement)
    assert _simd_parts(raw) is None
    _equal(verdict(decode_launch_columns, raw), _orjson_verdict(raw))


def _orjson_verdict(raw: bytes) -> LaunchColumns | SchemaError:
    """What the decoder gave before simdjson (and gives where that path declines)."""
    from kernelstream.schemas.columnar import _orjson_columns

    return verdict(_orjson_columns, raw)


def _equal(got: LaunchColumns | SchemaError, want: LaunchColumns | SchemaError) -> None:
    assert_same(got, want, known=False)


def test_json_batches_alone_and_in_a_poll_get_the_orjson_paths_verdict() -> None:
    """Every case of the catalogues above, and 400 batches with flipped bytes, decoded
    alone and together in polls: the columns, fields, error codes and messages are those
    of the orjson path."""
    rng = np.random.default_rng(3)
    n = 50
    good = orjson.dumps(
        _BASE
        | {
            "t_end": (1.8e9 + np.cumsum(rng.random(n))).tolist(),
            "duration_us": (rng.random(n) * 100).tolist(),
            "ok": rng.integers(0, 2, n).tolist(),
        }
    )
    cases = [_raw(c, v) for c, v in _COLUMNS] + [orjson.dumps(_BASE | {f: v}) for f, v in _FIELDS]
    cases += [good, good.replace(b'"ok":[', b'"ok":[-1,', 1), good.replace(b"[1,", b"[[1],", 1)]
    flipped = []
    for _ in range(400):
        changed = bytearray(good)
        for at in rng.integers(0, len(changed), 2):
            changed[at] = int(rng.choice(list(b'0123456789.,[]{}":-e ntruefalsl')))
        flipped.append(bytes(changed))
    for poll in (cases, *(flipped[i : i + 40] for i in range(0, 400, 40))):
        for raw, got in zip(poll, decode_launch_columns_many(poll), strict=True):
            want = _orjson_verdict(raw)
            _equal(got, want)
            _equal(verdict(decode_launch_columns, raw), want)
