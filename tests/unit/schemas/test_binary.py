"""The binary launch-batch layout: same records, same verdicts as JSON, clear errors."""

from __future__ import annotations

import struct
from dataclasses import fields
from typing import Any

import numpy as np
import orjson
import pytest

from kernelstream.agents.logic.windowing import make_example_batch
from kernelstream.schemas import LaunchBatch, SchemaError, decode, decode_any, encode
from kernelstream.schemas.binary import (
    encode_arrays,
    encode_launch_batch,
    encode_parts,
    is_binary,
)
from kernelstream.schemas.columnar import (
    WIRE_COLUMNS,
    LaunchColumns,
    decode_launch_columns,
    decode_launch_columns_many,
)
from tests.unit.schemas.verdicts import assert_same, verdict

_BASE = make_example_batch([1.5, 2.5], duration_us=[3.0, 4.0], ok=[1, 0], seq_start=11)


def _header(**changes: Any) -> bytes:
    meta = _BASE.model_dump(by_alias=True, exclude={"t_end", "duration_us", "ok", "seq_start"})
    meta["columns"] = WIRE_COLUMNS
    return orjson.dumps(meta | changes)


def _binary(t: Any, d: Any, ok: Any, header: bytes | None = None, seq: int = 11) -> bytes:
    return encode_parts(header or _header(), seq, [t, d, ok])


def test_columns_come_from_the_columnar_schema() -> None:
    assert WIRE_COLUMNS == [("t_end", "<f8"), ("duration_us", "<f8"), ("ok", "|u1")]
    # every required array field of LaunchColumns travels, whatever NumPy's typing
    # resolves to (an empty list once made every binary batch unencodable)
    arrays = {f.name for f in fields(LaunchColumns) if str(f.type).startswith("npt.NDArray")}
    arrays -= {f.name for f in fields(LaunchColumns) if str(f.type).endswith("| None")}
    assert {name for name, _ in WIRE_COLUMNS} == arrays


@pytest.mark.parametrize("n", [1, 2, 3, 186, 2000, 100_000])
def test_binary_and_json_decode_to_the_same_record(n: int) -> None:
    rng = np.random.default_rng(n)
    batch = _BASE.model_copy(
        update={
            "t_end": (1.8e9 + np.cumsum(rng.random(n))).round(6).tolist(),
            "duration_us": (rng.random(n) * 100).round(3).tolist(),
            "ok": rng.integers(0, 2, n).tolist(),
        }
    )
    raw = encode_launch_batch(batch)
    assert is_binary(raw) and not is_binary(encode(batch))
    got, want = decode_launch_columns(raw), decode_launch_columns(encode(batch))
    assert got.t_end.tolist() == want.t_end.tolist() == batch.t_end
    assert got.duration_us.tolist() == want.duration_us.tolist()
    assert got.ok.tolist() == want.ok.tolist() and got.ok.dtype == np.bool_
    assert got.meta == want.meta and got.t_range() == want.t_range()
    # every reader of records (watch, replay, the slow path) sees the JSON form
    assert decode(raw, LaunchBatch) == decode_any(raw) == batch


# Column values: the binary decoder gives the model's verdict and reason code.
_VALUES: list[tuple[str, Any]] = [
    ("t_end", [1.5, float("nan")]),
    ("t_end", [1.5, float("inf")]),
    ("duration_us", [3.0, -1.0]),
    ("duration_us", [3.0, 3.6e9]),
    ("duration_us", [3.0, 3.7e9]),
    ("duration_us", [3.0, float("nan")]),
    ("duration_us", [3.0, -0.0]),
    ("duration_us", [3.0, float("-inf")]),
    ("duration_us", [3.0, -5e-324]),
    ("duration_us", [float("inf"), 0.0]),
    ("t_end", [2.5, 1.5]),
    ("t_end", [float("nan"), 2.5]),
    ("t_end", [float("-inf"), 2.5]),
    ("ok", [1, 2]),
    ("ok", [0, 255]),
    ("ok", [0, 0]),
]


@pytest.mark.parametrize(("column", "value"), _VALUES, ids=[f"{c}={v!r}" for c, v in _VALUES])
def test_column_values_get_the_models_verdict(column: str, value: Any) -> None:
    cols = {"t_end": [1.5, 2.5], "duration_us": [3.0, 4.0], "ok": [1, 0]} | {column: value}
    raw = _binary(cols["t_end"], cols["duration_us"], cols["ok"])
    try:
        want = LaunchBatch.model_validate(_BASE.to_wire() | cols)
    except ValueError:
        with pytest.raises(SchemaError) as got:
            decode_launch_columns(raw)
        assert got.value.code in {"non_finite", "out_of_range", "wrong_type"}
        assert column in str(got.value)
        return
    assert decode_launch_columns(raw).to_batch() == want


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"schema": "ks.launch_batch/9"}, "unknown_schema"),
        ({"occupancy": 1.5}, "out_of_range"),
        ({"surprise": 1}, "unknown_field"),
        ({"columns": [["t_end", "<f8"], ["duration_us", "<f8"]]}, "unknown_field"),
        ({"columns": [["t_end", ">f8"], ["duration_us", "<f8"], ["ok", "|u1"]]}, "unknown_field"),
        ({"columns": "t_end"}, "missing_field"),
    ],
)
def test_bad_headers_are_refused_twice_alike(changes: dict[str, Any], code: str) -> None:
    raw = _binary([1.5, 2.5], [3.0, 4.0], [1, 0], header=_header(**changes))
    for _ in range(2):  # the second time the header could come from a cache: it must not
        with pytest.raises(SchemaError) as got:
            decode_launch_columns(raw)
        assert got.value.code == code


def test_framing_errors_are_one_line_schema_errors() -> None:
    good = _binary([1.5, 2.5], [3.0, 4.0], [1, 0])
    head = struct.Struct("<4sB3xIQI8x")
    magic, _, n, seq, m = head.unpack_from(good)
    cases = {
        "truncated": [good[:k] for k in range(4, len(good), 3)] + [good + b"\0" * 8],
        "unknown_schema": [head.pack(magic, 2, n, seq, m) + good[head.size :]],
        "invalid_json": [good[:40] + b"\xff" + good[41:]],
    }
    for code, messages in cases.items():
        for raw in messages:
            with pytest.raises(SchemaError) as got:
                decode_launch_columns(raw)
            assert got.value.code == code and "\n" not in str(got.value), raw[:48]
            with pytest.raises(SchemaError):
                decode(raw, LaunchBatch)


def test_launch_count_is_held_to_the_models_limit() -> None:
    n = 100_001
    raw = _binary(np.full(n, 1.5), np.ones(n), np.ones(n, dtype=np.uint8))
    with pytest.raises(SchemaError) as got:
        decode_launch_columns(raw)
    assert got.value.code == "out_of_range"


def test_oversized_binary_message_is_refused_before_reading() -> None:
    raw = _binary([1.5], [3.0], [1]) + b"\0" * (8 * 1024 * 1024)
    with pytest.raises(SchemaError) as got:
        decode_launch_columns(raw)
    assert got.value.code == "oversized"


def test_flipped_bytes_never_escape_as_other_exceptions() -> None:
    good = _binary([1.5, 2.5], [3.0, 4.0], [1, 0])
    rng = np.random.default_rng(1)
    for _ in range(3000):
        raw = bytearray(good)
        for at in rng.integers(0, len(raw), 2):
            raw[at] = int(rng.integers(0, 256))
        try:
            cols = decode_launch_columns(bytes(raw))
        except SchemaError:
            continue
        assert len(cols) >= 1 and np.isfinite(cols.t_end).all()


def test_each_batch_keeps_its_sequence_number_and_samples() -> None:
    seqs = [
        decode_launch_columns(_binary([1.5], [3.0], [1], seq=s)).meta.seq_start for s in range(4)
    ]
    assert seqs == [0, 1, 2, 3]
    sampled = LaunchBatch.model_validate(
        _BASE.to_wire() | {"samples": [{"t": 2.0, "sm_util_pct": 50.0}]}
    )
    assert decode_launch_columns(encode_launch_batch(sampled)).meta.samples == sampled.samples


def test_a_repeated_header_key_is_refused_as_in_json() -> None:
    header = _header().replace(b'"kernel":"saxpy"', b'"kernel":"saxpy","kernel":"other"', 1)
    raw = _binary([1.5, 2.5], [3.0, 4.0], [1, 0], header=header)
    for _ in range(2):
        with pytest.raises(SchemaError) as got:
            decode_launch_columns(raw)
        assert got.value.code == "duplicate_key"


@pytest.mark.parametrize(
    ("t", "in_order", "backstep"),
    [([1.5, 2.5, 2.5, 3.0], True, 0.0), ([1.5, 2.5, 2.0, 3.0], False, 0.5), ([4.0], True, 0.0)],
)
def test_order_found_by_the_decoder_is_the_columns_order(
    t: list[float], in_order: bool, backstep: float
) -> None:
    n = len(t)
    cols = decode_launch_columns(_binary(t, [3.0] * n, [1] * n))
    assert cols.known_in_order is in_order
    assert cols.max_backstep() == backstep
    assert cols.t_range() == (min(t), max(t))
    assert cols.drop_first(1).known_in_order is (in_order if n > 1 else True)


def test_decoded_meta_is_the_models_copy_with_its_seq_start() -> None:
    first = decode_launch_columns(_binary([1.5], [3.0], [1], seq=11)).meta
    second = decode_launch_columns(_binary([2.5], [3.0], [1], seq=12)).meta
    assert second == first.model_copy(update={"seq_start": 12})
    assert second.model_fields_set == first.model_fields_set
    assert second.model_dump() == first.model_dump() | {"seq_start": 12}
    assert first.seq_start == 11  # the cached fields were not changed in place


def _alone(raw: bytes) -> LaunchColumns | SchemaError:
    return verdict(decode_launch_columns, raw)


_same = assert_same


def _poll_of_every_case() -> list[bytes]:
    rng = np.random.default_rng(7)
    ordered = [
        _binary(1.8e9 + np.cumsum(rng.random(n)), rng.random(n) * 50, rng.integers(0, 2, n), seq=n)
        for n in (1, 2, 3, 182, 2000)
    ]
    shuffled = 1.8e9 + rng.permutation(np.cumsum(rng.random(182)))
    plain: dict[str, Any] = {"t_end": [1.5, 2.5], "duration_us": [3.0, 4.0], "ok": [1, 0]}
    values = [
        _binary(cols["t_end"], cols["duration_us"], cols["ok"])
        for cols in (plain | {c: v} for c, v in _VALUES)
    ]
    good = _binary([1.5, 2.5], [3.0, 4.0], [1, 0])
    return [
        *ordered,
        _binary(shuffled, np.ones(182), np.ones(182, dtype=np.uint8)),
        *values,
        _binary([float("nan")], [1.0], [1]),
        _binary([1.5], [float("nan")], [1]),
        good[:40],
        good + b"\0" * 8,
        _binary([1.5, 2.5], [3.0, 4.0], [1, 0], header=_header(occupancy=1.5)),
        _binary([1.5, 2.5], [3.0, 4.0], [1, 0], header=_header(host_gap_us=[1.0, 2.0])),
        _binary(np.full(100_001, 1.5), np.ones(100_001), np.ones(100_001, dtype=np.uint8)),
        good + b"\0" * (8 * 1024 * 1024),
        encode(_BASE),
        b"{not json",
        *ordered,
    ]


def test_a_poll_decodes_each_message_as_it_decodes_alone() -> None:
    raws = _poll_of_every_case()
    got = decode_launch_columns_many(raws)
    assert len(got) == len(raws)
    for raw, one in zip(raws, got, strict=True):
        _same(one, _alone(raw))
    for k in range(len(raws)):  # every message in every position of a poll of two
        pair = [raws[k], raws[-1 - k]]
        for raw, one in zip(pair, decode_launch_columns_many(pair), strict=True):
            _same(one, _alone(raw))


def test_a_poll_of_flipped_bytes_gets_the_verdicts_of_its_messages() -> None:
    good = _binary([1.5, 2.5, 3.5], [3.0, 4.0, 5.0], [1, 0, 1])
    rng = np.random.default_rng(2)
    for _ in range(100):
        poll: list[bytes] = []
        for _ in range(32):
            flipped = bytearray(good)
            for at in rng.integers(0, len(flipped), 2):
                flipped[at] = int(rng.integers(0, 256))
            poll.append(bytes(flipped))
        for raw, one in zip(poll, decode_launch_columns_many(poll), strict=True):
            _same(one, _alone(raw))


def test_a_known_header_does_not_vouch_for_the_rest_of_the_message() -> None:
    """A poll reads a batch whose header bytes it has seen in two steps (lengths, then
    values); anything else about it gets the verdict it gets alone."""
    good = _binary([1.5, 2.5, 3.5], [3.0, 4.0, 5.0], [1, 0, 1])
    n_at, version_at = 8, 4
    longer = bytearray(good)
    longer[n_at] = 4  # claims a fourth launch the columns do not hold
    newer = bytearray(good)
    newer[version_at] = 2
    cases = [
        good + b"\0" * 8,
        good[:-8],
        bytes(longer),
        bytes(newer),
        _binary([1.5, 2.5, 3.5], [3.0, -4.0, 5.0], [1, 0, 1]),
        _binary([1.5, 2.5, 3.5], [3.0, 4.0, 5.0], [1, 2, 1]),
        _binary([1.5, float("inf"), 3.5], [3.0, 4.0, 5.0], [1, 0, 1]),
    ]
    for bad in cases:
        poll = [good, bad, good]
        got = decode_launch_columns_many(poll)
        assert isinstance(got[1], SchemaError), bad[:40]
        for raw, one in zip(poll, got, strict=True):
            _same(one, _alone(raw))


def test_the_poll_builds_every_field_of_the_columns() -> None:
    """The poll's plain batches are built field by field (no ``__init__``): each field of
    LaunchColumns is set, as the constructor sets it."""
    from dataclasses import fields

    raw = _binary([1.5, 2.5], [3.0, 4.0], [1, 0])
    decode_launch_columns_many([raw])  # the header is known from now on
    [got] = decode_launch_columns_many([raw])
    assert isinstance(got, LaunchColumns)
    assert set(vars(got)) == {f.name for f in fields(LaunchColumns)}
    want = _alone(raw)
    assert isinstance(want, LaunchColumns)
    for f in fields(LaunchColumns):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(a, np.ndarray):
            assert a.tobytes() == b.tobytes(), f.name
        else:
            assert a == b, f.name


@pytest.mark.parametrize("n", [1, 7, 8, 9, 182, 2000])
def test_arrays_frame_as_the_parts_do(n: int) -> None:
    rng = np.random.default_rng(n)
    t = np.cumsum(rng.random(n)) + 1.79e9
    d = rng.random(n) * 100
    ok = (rng.random(n) > 0.1).astype(np.uint8)
    for header in (_header(), _header() + b" "):  # header lengths padded differently
        want = encode_parts(header, 11, [t, d, ok])
        assert encode_arrays(header, 11, t, d, ok) == want
        # other column types are converted, as encode_parts does
        assert encode_arrays(header, 11, t.astype(">f8"), d, ok.astype(bool)) == want
        assert encode_arrays(header, 11, t, d.astype(np.float32).astype(np.float64), ok) == (
            encode_parts(header, 11, [t, d.astype(np.float32), ok])
        )


def test_a_steady_poll_of_small_batches_decodes_as_each_message_alone() -> None:
    """The poll of plain binary batches whose headers were seen before (the steady state
    of small batches) is read from one joined buffer: the same columns, fields and
    facts as each message alone, and columns that are read-only views, as alone."""
    from kernelstream.schemas.columnar import _steady_binary

    rng = np.random.default_rng(5)
    headers = [_header(), _header(kernel="other")]
    poll = []
    for i in range(64):
        n = int(rng.integers(1, 400))
        poll.append(
            _binary(
                1.8e9 + np.cumsum(rng.random(n)),
                rng.random(n) * 50,
                (rng.random(n) > 0.02).astype(np.uint8),
                headers[i % 2],
                seq=int(rng.integers(0, 2**40)),
            )
        )
    decode_launch_columns_many(poll[:2])  # the two headers are known from now on
    assert _steady_binary(poll) is not None
    got = decode_launch_columns_many(poll)
    for raw, one in zip(poll, got, strict=True):
        _same(one, _alone(raw))
        assert isinstance(one, LaunchColumns) and not one.t_end.flags.writeable
    assert {one.known_all_ok for one in got if isinstance(one, LaunchColumns)} == {True, False}


@pytest.mark.parametrize(
    "change",
    ["nan", "unordered", "ok 2", "negative", "unknown header", "short", "long", "version"],
)
def test_one_message_off_the_steady_state_sends_the_poll_the_general_way(change: str) -> None:
    from kernelstream.schemas.columnar import _steady_binary

    good = _binary([1.5, 2.5, 3.5], [3.0, 4.0, 5.0], [1, 0, 1])
    decode_launch_columns_many([good, good])
    bad = {
        "nan": _binary([1.5, float("nan"), 3.5], [3.0, 4.0, 5.0], [1, 0, 1]),
        "unordered": _binary([2.5, 1.5, 3.5], [3.0, 4.0, 5.0], [1, 0, 1]),
        "ok 2": _binary([1.5, 2.5, 3.5], [3.0, 4.0, 5.0], [1, 2, 1]),
        "negative": _binary([1.5, 2.5, 3.5], [3.0, -4.0, 5.0], [1, 0, 1]),
        "unknown header": _binary([1.5, 2.5, 3.5], [3.0, 4.0, 5.0], [1, 0, 1], _header(node="x")),
        "short": good[:-8],
        "long": good + b"\0" * 8,
        "version": good[:4] + b"\x02" + good[5:],
    }[change]
    poll = [good, bad, good]
    assert _steady_binary(poll) is None
    for raw, one in zip(poll, decode_launch_columns_many(poll), strict=True):
        _same(one, _alone(raw))


def test_the_head_record_reads_what_the_head_struct_reads() -> None:
    from kernelstream.schemas.binary import HEAD_RECORD, HEAD_SIZE, read_head

    raw = _binary([1.5, 2.5, 3.5], [3.0, 4.0, 5.0], [1, 0, 1], seq=2**40 + 3)
    head = np.frombuffer(raw[:HEAD_SIZE], HEAD_RECORD)[0]
    magic, version, n, seq, m = read_head(raw)
    assert HEAD_RECORD.itemsize == HEAD_SIZE
    assert (head["magic"], head["version"], head["n"], head["seq_start"], head["m"]) == (
        magic,
        version,
        n,
        seq,
        m,
    )
