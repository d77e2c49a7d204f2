"""A binary header that differs from a validated one only in its node and device index
is decoded from that one's fields (no model validation): the same record and the same
verdict as the model gives it alone."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from kernelstream.agents.logic.windowing import make_example_batch
from kernelstream.schemas import SchemaError, encode
from kernelstream.schemas import columnar as columnar_mod
from kernelstream.schemas.binary import encode_launch_batch, encode_parts
from kernelstream.schemas.columnar import WIRE_COLUMNS, decode_launch_columns_many

_BASE = make_example_batch([1.5, 2.5], duration_us=[3.0, 4.0], ok=[1, 0], seq_start=11)


def _message(node: Any = None, device: Any = None, raw: bytes | None = None) -> bytes:
    """A binary batch of _BASE with another node or device index; ``raw``: the two
    values' JSON text as it stands in the header (``"node":<raw>``)."""
    meta = _BASE.model_dump(by_alias=True, exclude={"t_end", "duration_us", "ok", "seq_start"})
    meta["columns"] = WIRE_COLUMNS
    if node is not None:
        meta["node"] = node
    if device is not None:
        meta["device_index"] = device
    header = orjson.dumps(meta)
    if raw is not None:
        head, _, tail = header.partition(b',"device_index":')
        head = head[: head.index(b'"node":') + len(b'"node":')] + raw
        header = head + b',"device_index":' + tail
    return encode_parts(header, 11, [[1.5, 2.5], [3.0, 4.0], [1, 0]])


def _forget() -> None:
    columnar_mod._BIN_META.clear()
    columnar_mod._TEMPLATES.clear()


def _outcome(value: bytes) -> tuple[str, Any]:
    [got] = decode_launch_columns_many([value])
    if isinstance(got, SchemaError):
        return "error", (got.code, str(got))
    meta = got.meta
    return "ok", (
        meta.model_dump(),
        meta.__pydantic_fields_set__,
        got.stream_key,
        got.t_end.tolist(),
        got.ok.tolist(),
    )


def _alone(value: bytes) -> tuple[str, Any]:
    """The verdict with nothing validated before."""
    _forget()
    return _outcome(value)


def _after_template(value: bytes) -> tuple[str, Any]:
    """The verdict after _BASE's own header was validated (the template)."""
    _forget()
    assert _outcome(_message())[0] == "ok"
    assert columnar_mod._TEMPLATES
    return _outcome(value)


def _count_validations(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """From now on, the model classes the decoder validates with, one per validation."""
    calls: list[Any] = []
    validate = columnar_mod._validate

    def counted(*args: Any) -> Any:
        calls.append(args[0])
        return validate(*args)

    monkeypatch.setattr(columnar_mod, "_validate", counted)
    return calls


@pytest.fixture(autouse=True)
def _clean() -> Any:
    yield
    _forget()


@pytest.mark.parametrize(
    ("node", "device"),
    [
        ("other-node", None),
        (None, 3),
        ("n" * 200, 1024),  # the longest node name, the highest index
        ("ノード-7", 0),  # UTF-8 without escapes
        ("x", 1),
    ],
)
def test_another_node_or_device_decodes_as_the_model_does(
    node: Any, device: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = _message(node, device)
    alone = _alone(value)
    assert alone[0] == "ok"
    assert _after_template(value) == alone
    # from the template: the model is not asked again
    _forget()
    assert _outcome(_message())[0] == "ok"

    def refuse(*args: Any) -> Any:
        raise AssertionError("validated again")

    monkeypatch.setattr(columnar_mod, "_validate", refuse)
    assert _outcome(value) == alone


@pytest.mark.parametrize(
    ("node", "device", "raw"),
    [
        ("n" * 201, None, None),  # longer than the model's limit
        ("", None, None),
        (None, 1025, None),
        (None, 10**12, None),
        (None, None, b'"a\\"b"'),  # an escape: the full decoder reads it
        (None, None, b'"\\u0041"'),
        (None, None, b"7"),  # not a string
        (None, None, b'"\xff\xfe"'),  # not UTF-8
    ],
)
def test_a_node_or_index_the_model_refuses_gets_its_verdict(
    node: Any, device: Any, raw: bytes | None
) -> None:
    value = _message(node, device, raw)
    alone = _alone(value)
    assert _after_template(value) == alone


def test_a_template_hit_is_kept_and_a_changed_field_is_not_a_hit() -> None:
    _forget()
    assert _outcome(_message())[0] == "ok"
    other = _message("node-b", 2)
    assert _outcome(other)[0] == "ok"
    header = other[32 : 32 + int.from_bytes(other[20:24], "little")]
    assert header in columnar_mod._BIN_META
    meta = columnar_mod._BIN_META[header][0]
    assert (meta.node, meta.device_index) == ("node-b", 2)
    # another kernel name is not the template's: validated alone
    before = len(columnar_mod._TEMPLATES)
    fields = _BASE.model_dump(by_alias=True, exclude={"t_end", "duration_us", "ok", "seq_start"})
    fields["columns"] = WIRE_COLUMNS
    fields["kernel"] = "another"
    value = encode_parts(orjson.dumps(fields), 11, [[1.5], [3.0], [1]])
    assert _outcome(value)[0] == "ok"
    assert len(columnar_mod._TEMPLATES) == before + 1


def test_a_poll_of_new_streams_validates_one_header_of_each_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's first poll holds the first batch of every stream (the window agent
    decodes them in one call): the first header of each kind is validated whole, the
    others in the same poll take its fields, and every verdict is the one alone, a
    refused node among them included."""
    values = [_message(f"node-{i}", i % 4) for i in range(40)]
    values.insert(7, _message("n" * 201, None))  # refused: the model's verdict, in place
    fields = _BASE.model_dump(by_alias=True, exclude={"t_end", "duration_us", "ok", "seq_start"})
    fields["columns"] = WIRE_COLUMNS
    fields["kernel"] = "another"
    values.insert(20, encode_parts(orjson.dumps(fields), 11, [[1.5], [3.0], [1]]))
    alone = [_alone(v) for v in values]
    assert [a[0] for a in alone].count("error") == 1

    _forget()
    calls = _count_validations(monkeypatch)
    got = decode_launch_columns_many(values)
    # the first batch's header, the other kernel's, and the refused node's message (its
    # template lookup fails on its node's validator, so the model says why)
    assert len(calls) == 3, calls
    for want, verdict in zip(alone, got, strict=True):
        if isinstance(verdict, SchemaError):
            assert want == ("error", (verdict.code, str(verdict)))
        else:
            assert want[0] == "ok"
            meta = verdict.meta
            assert want[1][:3] == (
                meta.model_dump(),
                meta.__pydantic_fields_set__,
                verdict.stream_key,
            )


@pytest.mark.parametrize("wire", ["json", "binary"])
def test_five_thousand_streams_are_validated_once_each(
    wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker of 5,000 streams (each header its own: node and device are in it) keeps
    every stream's validated fields: the second batch of every stream is decoded without
    the model, on the JSON path as on the binary one. Below the streams' count the caches
    were cleared on the way and every batch was validated again."""
    streams = 5_000

    def batch(i: int, seq: int) -> bytes:
        b = _BASE.model_copy(update={"node": f"wide-{i // 4}", "device_index": i % 4})
        b = b.model_copy(update={"seq_start": seq})
        return encode(b) if wire == "json" else encode_launch_batch(b)

    first = [batch(i, 11) for i in range(streams)]
    second = [batch(i, 13) for i in range(streams)]
    _forget()
    columnar_mod._META_CACHE.clear()
    columnar_mod._JSON_HEAD.clear()
    for at in range(0, streams, 500):
        assert not any(
            isinstance(v, SchemaError) for v in decode_launch_columns_many(first[at : at + 500])
        )
    calls = _count_validations(monkeypatch)
    for at in range(0, streams, 500):
        got = decode_launch_columns_many(second[at : at + 500])
        assert [c.meta.seq_start for c in got if not isinstance(c, SchemaError)] == [13] * 500
    assert calls == []
