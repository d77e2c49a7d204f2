"""Encode and decode records: orjson on the wire, pydantic validation at the edge."""

from __future__ import annotations

import json
import math
import re
from typing import TypeVar, get_args

import orjson
from pydantic import BaseModel, ValidationError

from kernelstream.schemas.binary import is_binary, read_launch_batch
from kernelstream.schemas.errors import SchemaError
from kernelstream.schemas.records import RECORD_TYPES, Record, record_type

__all__ = [
    "MAX_MESSAGE_BYTES",
    "REASON_CODES",
    "check_key",
    "check_unique_keys",
    "decode",
    "decode_any",
    "encode",
    "json_problem",
    "schema_error",
]

R = TypeVar("R", bound=Record)

#: Messages larger than this are refused before parsing (dead-lettered by callers).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024

#: Classes of invalid input, the ``code`` of a :class:`SchemaError` and the
#: ``reason_code`` of a dead letter. The last four are decided by the stages.
REASON_CODES = (
    "oversized",  # larger than the message size limit
    "invalid_json",  # not JSON at all, or not UTF-8 text
    "truncated",  # cut off: JSON ends early, or a batch's columns differ in length
    "non_finite",  # NaN or infinity where a finite number is required
    "not_object",  # JSON, but not an object
    "duplicate_key",  # an object names a key twice
    "unknown_schema",  # no or another ``schema`` (e.g. an unknown version)
    "missing_field",
    "unknown_field",
    "wrong_type",
    "out_of_range",  # e.g. negative or absurd durations, empty batches
    "bad_key",  # a Kafka key that is not UTF-8, or not the record's stream key
    "unknown_kernel",  # a workload the worker does not know
    "bad_timestamp",  # event time far in the future or the past
    "duplicate",  # a batch whose (node, device, kernel, seq) was already counted
    "outbox_full",  # a node dropped its oldest launch batches (the value lists them)
    "implausible_seq",  # a sequence number past the bound or a jump the stream's rate rules out
    "bad_config",  # a configuration outside the workload's declared search space
    "unordered",  # end times of a batch that go back further than a device's streams can
    "internal_error",  # the stage failed on the message (a defect): skipped, not retried
    "series_gap",  # a window the forecast cannot use: no measurement, or after a silence
    "out_of_order",  # no longer produced (repeated windows are skipped); kept for old records
)


def encode(record: Record) -> bytes:
    """Serialize a record to JSON bytes.

    >>> from kernelstream.schemas.records import DeadLetter
    >>> encode(DeadLetter(stage="s", topic="t", value_b64="", reason="r", at=0.0))[:30]
    b'{"schema":"ks.deadletter/1","s'
    """
    # The wire bytes are those of orjson.dumps(model_dump(by_alias=True)), which every
    # stored topic holds (a test holds them equal). A record of plain fields (no nested
    # model, no serializer, no alias but ``schema``) holds in its __dict__ what the dump
    # would give, in field order: orjson writes it in about 1.2 us, where pydantic-core
    # takes 4-5 (a window, a finding: its evidence is a union per value), a tenth of
    # publishing a window of a small stream.
    cls = type(record)
    fields = _PLAIN.get(cls)
    if fields is None:
        fields = _PLAIN[cls] = _plain_field_count(cls)
    state = record.__dict__
    if fields and len(state) == fields:
        try:
            out = orjson.dumps(state)
        except TypeError:  # a value orjson does not write as pydantic does: let it
            pass
        else:
            return _SCHEMA_KEY + out[len(_SCHEMA_ATTR_KEY) :]
    return record.__pydantic_serializer__.to_json(record, by_alias=True)


# A plain record's dump starts with its ``schema_`` field, written under its alias.
_SCHEMA_ATTR_KEY = b'{"schema_"'
_SCHEMA_KEY = b'{"schema"'

# Per record type: its number of fields when encode may write its __dict__, else 0.
_PLAIN: dict[type[Record], int] = {}


def _plain_field_count(cls: type[Record]) -> int:
    """The number of fields of ``cls`` when every one holds a value orjson writes as
    ``model_dump`` gives it (no nested model: pydantic would dump it as a dict), no
    serializer or computed field changes what is written, and the only alias is the
    first field's, ``schema_`` -> ``schema``; else 0."""
    fields = cls.model_fields
    names = list(fields)
    decorators = cls.__pydantic_decorators__
    if (
        not names
        or names[0] != "schema_"
        or fields["schema_"].alias != "schema"
        or cls.model_computed_fields
        or decorators.field_serializers
        or decorators.model_serializers
    ):
        return 0
    for name in names[1:]:
        info = fields[name]
        if info.alias not in (None, name) or info.exclude or _holds_model(info.annotation):
            return 0
    return len(names)


def _holds_model(annotation: object) -> bool:
    """Whether a model class appears anywhere in a field's type."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(arg) for arg in get_args(annotation))


def _loads(data: bytes, max_bytes: int) -> object:
    if len(data) > max_bytes:
        raise SchemaError(
            f"message of {len(data)} bytes exceeds the {max_bytes}-byte limit", "oversized"
        )
    if is_binary(data):  # a launch batch in the binary layout: its JSON form, columns as lists
        return read_launch_batch(data).to_wire()
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"invalid JSON: {exc}", json_problem(data, str(exc))) from exc
    check_unique_keys(data, obj)
    return obj


# The closing quote of an object key: in valid JSON only a key's closing quote is
# followed by ':' (after optional whitespace), so this counts every key, and more only
# where a string holds an escaped quote followed by ':'. One scan for '"' at C speed.
_KEY_END = re.compile(rb'"\s*:')


def _count_keys(obj: object) -> int:
    """Keys of ``obj`` and of the objects one level down (directly or in a list).

    Exact for every record type (none nests deeper); deeper objects are not counted, so
    the count only errs low, which sends the message to the exact check: a repeated key
    always makes the text's count exceed this one.
    """
    if not isinstance(obj, dict):
        return 0
    n = len(obj)
    for v in obj.values():
        if isinstance(v, dict):
            n += len(v)
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            n += sum(len(x) for x in v if isinstance(x, dict))
    return n


def check_unique_keys(data: bytes, obj: object) -> None:
    """Raise :class:`SchemaError` (``duplicate_key``) if an object of ``data`` repeats a key.

    A JSON parser keeps the last of two equal keys, so ``{"kernel": "a", "kernel": "b"}``
    would pass as "b" while other readers may see "a". orjson does not report them: a
    text orjson would write of what it parsed to holds each key once (what kernelstream
    writes is such a text); else the keys in the text are counted (its colons, or one
    regular-expression scan where a string holds a colon; launch columns hold no
    strings) against the keys parsed, and only where they differ is the text parsed
    again key by key to tell which.
    """
    # A text that is exactly what orjson writes of the parsed objects holds each of their
    # keys once: what every record kernelstream writes is (encode). A record other than a
    # launch batch (a window, a finding: ~1.2 KB, with a ':' in its id) is written back
    # first: 1.3 us, where counting its keys and its colons takes 1.9 before that.
    small = len(data) <= _WRITE_BACK_FIRST
    if small and _written_back(data, obj):
        return
    n = _count_keys(obj)
    # Every key in the text is followed by exactly one ':' and a repeated key adds one
    # that the parsed objects do not have, so where the colons in the text are exactly
    # the keys parsed (no string holds a ':') nothing repeats. Counting one byte is
    # about twice as fast as the key scan below, which handles the other messages.
    if data.count(b":") == n:
        return
    # A larger text written back costs less than the key scan (~8 us a finding).
    if not small and _written_back(data, obj):
        return
    if len(_KEY_END.findall(data)) == n:
        return
    try:
        json.loads(data, object_pairs_hook=_unique_pairs)
    except _DuplicateKeyError as exc:
        raise SchemaError(
            f"duplicate key {exc.args[0]!r} in a JSON object", "duplicate_key"
        ) from exc
    except (ValueError, RecursionError):
        pass  # orjson accepted it: differences in what the two parsers accept are not ours


# Texts up to this size are first compared with orjson's writing of what they parse to (a
# launch batch of JSON is larger: 29 bytes a launch, its colons counted first).
_WRITE_BACK_FIRST = 4096


def _written_back(data: bytes, obj: object) -> bool:
    """Whether ``data`` is exactly orjson's writing of ``obj`` (its parse)."""
    try:
        return orjson.dumps(obj) == data
    except orjson.JSONEncodeError:
        return False


class _DuplicateKeyError(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKeyError(k)
        out[k] = v
    return out


def json_problem(data: bytes, message: str) -> str:
    """Classify a JSON parse failure (only on the error path, so cost does not matter)."""
    if "infinity" in message:
        return "non_finite"  # e.g. 1e999
    if "end of data" in message:
        return "truncated"
    try:  # the standard library accepts NaN and Infinity, which JSON does not have
        json.loads(data)
    except (ValueError, RecursionError):
        return "invalid_json"
    return "non_finite"


_TYPE_CODES = {
    "missing": "missing_field",
    "extra_forbidden": "unknown_field",
    "finite_number": "non_finite",
}
_RANGE_WORDS = ("greater_than", "less_than", "too_short", "too_long")


def _error_code(err: dict[str, object]) -> str:
    kind = str(err["type"])
    if kind in _TYPE_CODES:
        return _TYPE_CODES[kind]
    value = err.get("input")
    if isinstance(value, float) and not math.isfinite(value):
        return "non_finite"  # whichever of its field's checks a NaN or infinity tripped first
    if any(w in kind for w in _RANGE_WORDS):
        return "out_of_range"
    if kind == "value_error" and "columns differ" in str(err.get("msg")):
        return "truncated"
    if kind == "value_error" and "(added in /" in str(err.get("msg")):
        return "unknown_field"
    if kind == "value_error" and "impossible" in str(err.get("msg")):
        return "out_of_range"
    if kind == "value_error" and "not in time order" in str(err.get("msg")):
        return "unordered"
    return "wrong_type"


def _validate(cls: type[R], obj: object) -> R:
    if not isinstance(obj, dict):
        raise SchemaError(
            f"expected a JSON object for {cls.SCHEMA}, got {type(obj).__name__}", "not_object"
        )
    found = obj.get("schema")
    if found != cls.SCHEMA and record_type(found) is not cls:
        raise SchemaError(
            f"unknown or unexpected schema {found!r}: this topic carries {cls.SCHEMA!r}",
            "unknown_schema",
        )
    try:
        return cls.model_validate(obj)
    except ValidationError as exc:
        raise schema_error(cls, exc) from exc


def schema_error(cls: type[Record], exc: ValidationError) -> SchemaError:
    """The :class:`SchemaError` (one line, reason code) for the model's refusal ``exc``."""
    errors = exc.errors()
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<record>'}: {err['msg']}" for err in errors[:5]
    )
    code = _error_code(dict(errors[0])) if errors else "wrong_type"
    return SchemaError(f"invalid {cls.SCHEMA}: {problems}", code)


def check_key(key: bytes | None) -> str | None:
    """The Kafka key as text; :class:`SchemaError` (``bad_key``) if it is not UTF-8."""
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaError(f"the message key is not UTF-8 text: {exc}", "bad_key") from exc


def decode(data: bytes, cls: type[R], *, max_bytes: int = MAX_MESSAGE_BYTES) -> R:
    """Parse and validate ``data`` as a ``cls`` record; raise :class:`SchemaError` if not."""
    return _validate(cls, _loads(data, max_bytes))


def decode_any(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Record:
    """Parse a record of any known type, dispatching on its ``schema`` field."""
    obj = _loads(data, max_bytes)
    if not isinstance(obj, dict):
        raise SchemaError(f"expected a JSON object, got {type(obj).__name__}", "not_object")
    cls = record_type(obj.get("schema"))
    if cls is None:
        raise SchemaError(
            f"unknown schema {obj.get('schema')!r}; known: {sorted(RECORD_TYPES)}",
            "unknown_schema",
        )
    return _validate(cls, obj)
