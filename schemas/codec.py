"""Encode and decode records: orjson on the wire, pydantic validation at the edge."""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import ValidationError

from schemas.errors import SchemaError
from schemas.records import RECORD_TYPES, Record

__all__ = ["MAX_MESSAGE_BYTES", "decode", "decode_any", "encode"]

R = TypeVar("R", bound=Record)

#: Messages larger than this are refused before parsing (dead-lettered by callers).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024


def encode(record: Record) -> bytes:
    """Serialize a record to JSON bytes.

    >>> from schemas.records import DeadLetter
    >>> encode(DeadLetter(stage="s", topic="t", value_b64="", reason="r", at=0.0))[:30]
    b'{"schema":"ks.deadletter/1","s'
    """
    return orjson.dumps(record.model_dump(by_alias=True, mode="python"))


def _loads(data: bytes) -> object:
    if len(data) > MAX_MESSAGE_BYTES:
        raise SchemaError(
            f"message of {len(data)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit"
        )
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"invalid JSON: {exc}") from exc


def _validate(cls: type[R], obj: object) -> R:
    if not isinstance(obj, dict):
        raise SchemaError(f"expected a JSON object for {cls.SCHEMA}, got {type(obj).__name__}")
    found = obj.get("schema")
    if found != cls.SCHEMA:
        raise SchemaError(
            f"unknown or unexpected schema {found!r}: this topic carries {cls.SCHEMA!r}"
        )
    try:
        return cls.model_validate(obj)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<record>'}: {err['msg']}"
            for err in exc.errors()[:5]
        )
        raise SchemaError(f"invalid {cls.SCHEMA}: {problems}") from exc


def decode(data: bytes, cls: type[R]) -> R:
    """Parse and validate ``data`` as a ``cls`` record; raise :class:`SchemaError` if not."""
    return _validate(cls, _loads(data))


def decode_any(data: bytes) -> Record:
    """Parse a record of any known type, dispatching on its ``schema`` field."""
    obj = _loads(data)
    if not isinstance(obj, dict):
        raise SchemaError(f"expected a JSON object, got {type(obj).__name__}")
    cls = RECORD_TYPES.get(str(obj.get("schema")))
    if cls is None:
        raise SchemaError(f"unknown schema {obj.get('schema')!r}; known: {sorted(RECORD_TYPES)}")
    return _validate(cls, obj)
