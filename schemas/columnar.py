"""Columnar decoding of launch batches: orjson straight into NumPy arrays.

:func:`schemas.decode` validates a :class:`LaunchBatch` with pydantic, element by
element, and leaves the columns as Python lists. The worker's hot path needs the
columns as arrays anyway, so here the per-batch fields are validated by the same
pydantic model (with one-element placeholder columns, so every rule of the model
still applies and a field added to the model is validated here too) and the
columns are converted once and checked with vectorized comparisons. Anything the
fast checks are unsure about is handed to :func:`schemas.decode`, whose verdict
(and error message) is final: both paths accept and reject exactly the same input.

>>> from kernelstream.schemas.records import LaunchBatch
>>> cols = decode_launch_columns(b'{"schema":"ks.launch_batch/1","node":"n","device_index":0,'
...     b'"device_model":"A100","backend":"sim","kernel":"k","workload":"k","problem_size":[1],'
...     b'"config":{},"config_id":"c","grid":[1,1,1],"block":[1,1,1],"dynamic_smem_bytes":0,'
...     b'"bytes_moved":1.0,"flops":1.0,"occupancy":1.0,"waves":1.0,"peak_gbs":1.0,'
...     b'"peak_gflops":1.0,"seq_start":7,"t_end":[1.5,2.5],"duration_us":[3,4],"ok":[1,0]}')
>>> cols.meta.stream_key, cols.t_end.tolist(), cols.duration_us.tolist(), cols.ok.tolist()
('n:0/k', [1.5, 2.5], [3.0, 4.0], [True, False])
"""

from __future__ import annotations

import math
import re
import struct
import threading
import typing
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Annotated, Any, NamedTuple

import numpy as np
import numpy.typing as npt
import orjson
import simdjson
from pydantic import ConfigDict, TypeAdapter, ValidationError

from kernelstream.schemas import native
from kernelstream.schemas.binary import (
    HEAD_RECORD,
    HEAD_SIZE,
    LAYOUT_VERSION,
    MAGIC,
    BinaryBatch,
    is_binary,
    read_head,
    read_launch_batch,
)
from kernelstream.schemas.codec import (
    MAX_MESSAGE_BYTES,
    _validate,
    check_unique_keys,
    decode,
    json_problem,
)
from kernelstream.schemas.errors import SchemaError
from kernelstream.schemas.keys import kept_bytes, remember, stream_key
from kernelstream.schemas.records import (
    _MAX_COPY_BYTES,
    _MAX_COPY_GBS,
    MAX_DURATION_BITS,
    MAX_DURATION_US,
    MAX_LAUNCHES,
    CopyColumns,
    LaunchBatch,
)

__all__ = [
    "WIRE_COLUMNS",
    "LaunchColumns",
    "SteadyPoll",
    "decode_launch_columns",
    "decode_launch_columns_many",
    "steady_poll",
]

_PLACEHOLDER = {"t_end": [0.0], "duration_us": [0.0], "ok": [1]}


@dataclass(frozen=True)
class LaunchColumns:
    """A validated launch batch: per-batch fields in ``meta`` and the columns as arrays.

    ``meta`` is a :class:`LaunchBatch` whose own columns are a one-launch placeholder:
    read the launches from the arrays, never from ``meta.t_end``.
    """

    meta: LaunchBatch
    t_end: npt.NDArray[np.float64]
    duration_us: npt.NDArray[np.float64]
    ok: npt.NDArray[np.bool_]
    # (earliest, latest) end time when the decoder already knows it, else None.
    known_t_range: tuple[float, float] | None = None
    # Version 2 telemetry, None when the producer sent none (version 1).
    host_gap_us: npt.NDArray[np.float64] | None = None
    host_waited: npt.NDArray[np.bool_] | None = None
    copies: CopyColumns | None = None
    # True when the decoder already found the end times in completion order (each at or
    # after the one before), else None: the edge check and the windower then skip the
    # comparison of the whole column that each would make.
    known_in_order: bool | None = None
    # True when the decoder already found that every launch ran (``ok`` all 1), else None.
    known_all_ok: bool | None = None
    # ``meta.stream_key`` when the decoder already has it (one string per stream, not
    # one f-string per batch and reader), else None.
    key: str | None = None

    @property
    def stream_key(self) -> str:
        """The batch's stream key: ``meta.stream_key``."""
        return self.key if self.key is not None else self.meta.stream_key

    def __len__(self) -> int:
        return int(self.t_end.size)

    def t_range(self) -> tuple[float, float]:
        """Earliest and latest end time of the batch."""
        if self.known_t_range is not None:
            return self.known_t_range
        return float(self.t_end.min()), float(self.t_end.max())

    def max_backstep(self) -> float:
        """How far (seconds) the end times go back below an earlier one (0: in order)."""
        t = self.t_end
        if self.known_in_order or t.size < 2 or bool((t[1:] >= t[:-1]).all()):
            return 0.0
        return float((np.maximum.accumulate(t) - t).max())

    @classmethod
    def from_batch(cls, batch: LaunchBatch) -> LaunchColumns:
        """Columns of an already validated batch (tests, replay)."""
        return cls(
            batch.model_copy(update={"host_gap_us": None, "host_waited": None, "copies": None}),
            np.asarray(batch.t_end, dtype=np.float64),
            np.asarray(batch.duration_us, dtype=np.float64),
            np.asarray(batch.ok, dtype=bool),
            None,
            None if batch.host_gap_us is None else np.asarray(batch.host_gap_us, dtype=float),
            None if batch.host_waited is None else np.asarray(batch.host_waited, dtype=bool),
            batch.copies,
        )

    def drop_first(self, k: int) -> LaunchColumns:
        """The batch without its first ``k`` launches (numbered from ``seq_start + k``).

        Copies that ended before the first kept launch are dropped with the launches.
        """
        copies = self.copies
        if copies is not None and k > 0:
            copies = _copies_after(copies, float(self.t_end[k - 1]))
        return LaunchColumns(
            self.meta.model_copy(update={"seq_start": self.meta.seq_start + k}),
            self.t_end[k:],
            self.duration_us[k:],
            self.ok[k:],
            None,
            None if self.host_gap_us is None else self.host_gap_us[k:],
            None if self.host_waited is None else self.host_waited[k:],
            copies,
            known_in_order=self.known_in_order,  # a tail of an ordered column is ordered
            known_all_ok=self.known_all_ok,
            key=self.key,
        )

    def to_batch(self) -> LaunchBatch:
        """The full record again (slow: rebuilds the Python lists)."""
        v2: dict[str, Any] = {"copies": self.copies}
        if self.host_gap_us is not None:
            v2["host_gap_us"] = self.host_gap_us.tolist()
        if self.host_waited is not None:
            v2["host_waited"] = self.host_waited.astype(int).tolist()
        return self.meta.model_copy(
            update={
                "t_end": self.t_end.tolist(),
                "duration_us": self.duration_us.tolist(),
                "ok": self.ok.astype(int).tolist(),
                **v2,
            }
        )


def _copies_after(copies: CopyColumns, t: float) -> CopyColumns | None:
    keep = [i for i, end in enumerate(copies.t_end) if end > t]
    if not keep:
        return None
    cols = copies.model_dump()
    return CopyColumns.model_validate({k: [v[i] for i in keep] for k, v in cols.items()})


def _wire_columns() -> list[tuple[str, str]]:
    """``(name, little-endian dtype)`` of every required array field of :class:`LaunchColumns`
    (the optional version 2 columns travel in the header).

    Read from the fields' annotations as written (``npt.NDArray[np.float64]``), not from
    their resolved types, which change with NumPy's typing: on Python 3.12 with NumPy
    2.5.2 the resolved types no longer matched ``np.ndarray``, the list came out empty and
    every binary batch failed to encode. An empty list now fails at import.
    """
    out = []
    for f in fields(LaunchColumns):
        m = re.fullmatch(r"npt\.NDArray\[np\.(\w+)\]", str(f.type))
        if m:
            dtype = np.dtype(getattr(np, m.group(1)))
            out.append(
                (f.name, (np.dtype(np.uint8) if dtype == np.bool_ else dtype).newbyteorder("<").str)
            )
    if not out:
        raise RuntimeError("LaunchColumns declares no array field: the wire has no columns")
    return out


#: The columns of a launch batch in the binary wire format (:mod:`schemas.binary`), in
#: wire order, derived from :class:`LaunchColumns` so a column added there travels too.
WIRE_COLUMNS: list[tuple[str, str]] = _wire_columns()
if WIRE_COLUMNS != [("t_end", "<f8"), ("duration_us", "<f8"), ("ok", "|u1")]:
    # _known_binary reads the columns at offsets that follow from this list
    raise ImportError(f"binary layout columns {WIRE_COLUMNS}: update _known_binary to them")


def decode_launch_columns(data: bytes) -> LaunchColumns:
    """Parse and validate one ``ks.launch_batch`` message (version 1 or 2), JSON or
    binary (:mod:`schemas.binary`); raise :class:`SchemaError` if bad."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SchemaError(
            f"message of {len(data)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit",
            "oversized",
        )
    if is_binary(data):
        return _binary_columns(read_launch_batch(data))
    parts = _simd_parts(data)
    if parts is not None:
        hit, seq_start, t, d, ok = parts
        plain = _plain_binary({"t_end": t, "duration_us": d, "ok": ok}, t.size)
        if plain is not None:
            return _plain_columns(
                _with_seq_start(hit, seq_start), t, d, ok.astype(bool), plain, hit[2]
            )
    return _orjson_columns(data)


def _orjson_columns(data: bytes) -> LaunchColumns:
    """:func:`decode_launch_columns` of a JSON message through orjson and, where the
    columns are not plainly valid, the model (whose verdict and message are final)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"invalid JSON: {exc}", json_problem(data, str(exc))) from exc
    check_unique_keys(data, obj)
    cols = _fast_columns(obj, data) if _plain_batch(obj) else None
    if cols is None:
        return LaunchColumns.from_batch(decode(data, LaunchBatch))  # slow path, exact verdict
    try:
        v2 = _v2_columns(obj, len(cols[0]), data)
        meta = _validated_meta(obj)
    except Exception:
        decode(data, LaunchBatch)  # raises with the full, precise message
        raise
    t, d, ok, t_range = cols
    if v2 is None:
        return LaunchColumns.from_batch(decode(data, LaunchBatch))
    return LaunchColumns(meta, t, d, ok, t_range, *v2)


# -- JSON columns without Python floats ------------------------------------------------


def _simd_parts(data: bytes) -> _Known | None:
    """The parts of a plain JSON launch batch, as :func:`_known_binary` gives them for a
    binary one, its columns copied straight into arrays with simdjson; None for anything
    else (:func:`_orjson_columns` decides, and names what is wrong). The columns' values
    are left to check (:func:`_plain_binary`, or over a whole poll); ``ok`` comes as
    unsigned 64-bit integers, so that a negative one fails the check for at most 1.

    ``orjson.loads`` makes a Python float of every value of the columns, and packing
    them into arrays costs about as much again; simdjson parses the text and copies each
    column out typed (``Array.as_buffer``). The per-batch fields come before
    ``seq_start`` in what nodes send (:func:`schemas.codec.encode` keeps the model's
    field order): those bytes, validated once by the model and kept
    (:data:`_JSON_HEAD`), give the fields of every later batch of the stream and
    configuration, as the binary layout's header does. On JSON input the worker's window
    stage ran 1.16x (2,000-launch batches) and 1.62x (182-launch) as fast as through
    orjson, beside it in one run (``bench/results/pipeline-peers{,-small}-2026-11-26-
    simdjson-ab.txt``).

    Accepted here is only what the orjson path accepts the same way: every key of the
    batch once, and no others than the fields, ``seq_start``, the three columns and an
    empty ``samples`` and null version-2 extras; end times and durations numbers
    (``as_buffer`` refuses booleans, null and strings; the brackets counted in the text
    rule out nested arrays, which it would flatten), ``ok`` integers. Both parsers round
    every number to the nearest double: the columns are bit-identical.
    """
    pos = data.find(b',"seq_start":')
    if pos < 0 or len(data) > MAX_MESSAGE_BYTES:
        return None
    head = _JSON_HEAD.get(data[:pos])
    if head is None:
        head = _json_head(data[:pos])
        if head is None:
            return None
    hit, names = head
    parser = getattr(_SIMD, "parser", None)
    if parser is None:
        parser = _SIMD.parser = simdjson.Parser()
    try:
        doc: Any = parser.parse(data)
        # The head holds the keys ``names``, each once, and none of the rest's; the rest
        # must be the needed keys and any optional ones, each once. Counted (simdjson
        # counts a repeated key) and looked up, where listing them made a Python string
        # of every key (3 us a batch); a needed key missing raises KeyError.
        extra = [name for name in _REST_OPTIONAL if name in doc]
        if len(doc) != len(names) + len(_REST_NEEDED) + len(extra):
            return None  # a repeated key, or one the fields do not name
        for name in extra:
            value = doc[name]
            if not (value is None or (name == "samples" and _empty_array(value))):
                return None
        seq = doc["seq_start"]
        t = _typed(doc["t_end"], "d", np.float64)
        d = _typed(doc["duration_us"], "d", np.float64)
        ok = _typed(doc["ok"], "i", np.uint64)  # int64 bits: a negative one is huge
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError):
        return None
    n = t.size
    if type(seq) is not int or seq < 0 or not (1 <= n <= MAX_LAUNCHES):
        return None
    if d.size != n or ok.size != n:
        return None
    brackets = 3 + ("samples" in extra)
    if data.count(b"[", pos) != brackets:
        return None
    return hit, seq, t, d, ok


# Per-batch field bytes of a JSON batch (everything before ``,"seq_start":``) already
# validated -> as _BIN_META's entries, and the names of those fields. Cleared as the
# other caches are.
_JSON_HEAD: dict[bytes, tuple[tuple[LaunchBatch, set[str], str], frozenset[str]]] = {}
_SIMD = threading.local()  # a simdjson parser per thread (a parser is not thread-safe)
_REST_NEEDED = frozenset(("seq_start", "t_end", "duration_us", "ok"))
_REST_OPTIONAL = ("samples", "host_gap_us", "host_waited", "copies")
_REST_ALLOWED = _REST_NEEDED | set(_REST_OPTIONAL)


def _json_head(head: bytes) -> tuple[tuple[LaunchBatch, set[str], str], frozenset[str]] | None:
    """The per-batch fields of ``head`` validated by the model (kept for the next batch
    with the same bytes); None when they are not plainly valid (the orjson path says why)."""
    try:
        obj = orjson.loads(head + b"}")
        check_unique_keys(head + b"}", obj)
    except (orjson.JSONDecodeError, SchemaError):
        return None
    if not isinstance(obj, dict) or obj.get("schema") not in _VERSIONS:
        return None
    if not _REST_ALLOWED.isdisjoint(obj):
        return None  # seq_start, the columns, samples or version 2 fields among them
    try:
        meta = _validate(LaunchBatch, obj | _PLACEHOLDER | {"seq_start": 0})
    except SchemaError:
        return None
    entry = ((meta, meta.__pydantic_fields_set__ | {"seq_start"}, meta.stream_key), frozenset(obj))
    return remember(_JSON_HEAD, head, entry)


def _empty_array(value: Any) -> bool:
    return isinstance(value, simdjson.Array) and len(value) == 0


def _typed(array: Any, of_type: str, dtype: Any) -> npt.NDArray[Any]:
    """A simdjson array's numbers as a NumPy array (raises for anything but numbers)."""
    return np.frombuffer(array.as_buffer(of_type=of_type), dtype=dtype)


_V2 = ("host_gap_us", "host_waited", "copies")
_V2Columns = tuple[npt.NDArray[np.float64] | None, npt.NDArray[np.bool_] | None, CopyColumns | None]


def _v2_columns(obj: dict[str, Any], n: int, data: bytes) -> _V2Columns | None:
    """Take the version 2 columns out of ``obj``, checked; None when unsure (slow path).

    Raises as the model does for bad copies, so the caller asks the full decoder why.
    """
    found = {k: obj.pop(k) for k in _V2 if k in obj}
    if not found or all(v is None for v in found.values()):
        return None, None, None
    if obj.get("schema") != LaunchBatch.SCHEMA:
        return None
    gaps, waited = found.get("host_gap_us"), found.get("host_waited")
    gap_arr = waited_arr = None
    # ``true`` is not 1: a message that spells a boolean anywhere takes the model's path
    # for its version 2 columns (one scan of the text for all of them).
    if _BOOL_END.search(data) is not None:
        return None
    if gaps is not None:
        if type(gaps) is not list or len(gaps) != n:
            return None
        try:
            gap_arr = _floats(gaps, n)
        except (struct.error, TypeError, ValueError, OverflowError):
            return None
        if not (gap_arr.min() >= 0.0 and gap_arr.max() <= MAX_DURATION_US):
            return None
    if waited is not None:
        if type(waited) is not list or len(waited) != n or waited.count(1) + waited.count(0) != n:
            return None
        waited_arr = np.asarray(waited, dtype=np.int8) == 1  # 0 and 1 only, checked above
    raw = found.get("copies")
    copies = None if raw is None else _copy_columns(raw)
    return gap_arr, waited_arr, copies


_DIRECTIONS = frozenset(("h2d", "d2h", "d2d"))
_COPY_FIELDS = frozenset(CopyColumns.model_fields)


def _copy_columns(raw: Any) -> CopyColumns:
    """The copies, checked with vectorized comparisons where they plainly pass the
    model's rules, else validated by the model (whose verdict is final).

    A 2,000-launch batch with 4,000 copies (210 KB) decoded in 1,450-1,620 us with the
    model validating the copies and in 990-1,340 us through here, where the JSON parse
    is 500-800 us of it and these checks ~0.1 us a copy (best of 7 x 100 decodes, load
    average 6.5 on 2 cores; a 2,000-launch version 1 batch took 118-129 us before and
    after this path was added).
    Booleans never reach here: the caller sends any message spelling one to the model.
    """
    if _copies_plainly_valid(raw):
        return CopyColumns.model_construct(**raw)
    return CopyColumns.model_validate(raw)


def _copies_plainly_valid(raw: Any) -> bool:
    if type(raw) is not dict or raw.keys() != _COPY_FIELDS:
        return False
    cols = [raw[k] for k in ("t_end", "direction", "bytes", "duration_us", "pinned", "stream")]
    if any(type(c) is not list for c in cols):
        return False
    t, direction, nbytes, dur, pinned, stream = cols
    n = len(t)
    if not (1 <= n <= MAX_LAUNCHES and all(len(c) == n for c in cols)):
        return False
    if not set(direction) <= _DIRECTIONS:
        return False
    try:
        ta, da = _floats(t, n), _floats(dur, n)
        ba = np.frombuffer(_ints_of(n).pack(*nbytes), dtype=np.int64)
        sa = np.frombuffer(_ints_of(n).pack(*stream), dtype=np.int64)
    except (struct.error, TypeError, ValueError, OverflowError):
        return False  # e.g. a float byte count: the model says why
    if not (np.isfinite(ta).all() and da.min() >= 0.0 and da.max() <= MAX_DURATION_US):
        return False
    if ba.min() < 0 or ba.max() > _MAX_COPY_BYTES or sa.min() < 0:
        return False
    if pinned.count(1) + pinned.count(0) != n:
        return False
    moving = ba > 0
    return not (moving & ((da <= 0.0) | (ba / np.maximum(da, 1e-300) / 1e3 > _MAX_COPY_GBS))).any()


@lru_cache(maxsize=64)
def _ints_of(n: int) -> struct.Struct:
    return struct.Struct(f"@{n}q")  # int64: floats and strings raise struct.error


# Per-batch fields already validated, by their exact JSON encoding (seq_start and the
# columns left out): a stream sends the same fields batch after batch until its config
# changes, and validating them was the largest per-batch cost after the parse (13-18 us
# a batch against ~7 for the lookup and copy; bench pipeline with 512 streams of
# 187-launch batches). Bounded: cleared when it holds PER_STREAM_ENTRIES entries (one a
# stream: schemas.keys says why that many).
_META_CACHE: dict[bytes, LaunchBatch] = {}
_NOT_META = ("t_end", "duration_us", "ok", "seq_start")


def _validated_meta(obj: dict[str, Any]) -> LaunchBatch:
    """The batch's model with placeholder columns; raises as ``model_validate`` does.

    A cache hit is exact: ``orjson.dumps`` writes every JSON type its own way (``1``,
    ``1.0`` and ``true`` differ), so equal bytes are equal values of equal types, which
    the model validates alike; ``seq_start`` is checked here as the model checks a
    plain int (anything else takes the full validation). Consumes ``obj``'s columns.
    """
    seq = obj.get("seq_start")
    if type(seq) is not int or seq < 0 or obj.get("samples"):
        return LaunchBatch.model_validate(obj | _PLACEHOLDER)
    for name in _NOT_META:
        del obj[name]
    key = orjson.dumps(obj)
    cached = _META_CACHE.get(key)
    if cached is not None:
        return cached.model_copy(update={"seq_start": seq})
    meta = LaunchBatch.model_validate(obj | _PLACEHOLDER | {"seq_start": seq})
    return remember(_META_CACHE, kept_bytes(key), meta)


def _plain_batch(obj: object) -> bool:
    """A JSON object that names a version of this schema (no field may be left to its
    default)."""
    return isinstance(obj, dict) and obj.get("schema") in _VERSIONS


_VERSIONS = ("ks.launch_batch/1", LaunchBatch.SCHEMA)


# The end of a JSON ``true`` or ``false`` value: no number ends in 'e', and a key's
# 'e' is followed by its quote. Strings holding "e," match too (then the columns are
# scanned for nothing). 13 us on a 2,000-launch batch against 80 for two ``in`` tests.
_BOOL_END = re.compile(rb"e\s*[,\]}]")


def _has_bool(data: bytes, *columns: list[Any]) -> bool:
    """Whether a column holds ``true``/``false`` (struct and ``==`` take them as 1 and 0).

    Only messages that spell a boolean somewhere (a boolean tunable parameter) pay
    for the scan of the columns.
    """
    if _BOOL_END.search(data) is None:
        return False
    return any(type(v) is bool for col in columns for v in col)


def _fast_columns(
    obj: dict[str, Any],
    data: bytes,
) -> (
    tuple[
        npt.NDArray[np.float64],
        npt.NDArray[np.float64],
        npt.NDArray[np.bool_],
        tuple[float, float],
    ]
    | None
):
    """The three columns as arrays (and the end times' range) when they plainly pass the
    model's rules, else None."""
    t, d, ok = obj.get("t_end"), obj.get("duration_us"), obj.get("ok")
    if not (type(t) is list and type(d) is list and type(ok) is list):
        return None
    n = len(t)
    if not (1 <= n <= MAX_LAUNCHES and len(d) == n and len(ok) == n):
        return None
    if _has_bool(data, t, d, ok):
        return None
    try:
        ta = _floats(t, n)
        da = _floats(d, n)
    except (struct.error, TypeError, ValueError, OverflowError):
        return None  # e.g. a string or null in a column: the slow path gives the verdict
    # min and max carry any NaN along, so these bounds also reject NaN and infinities.
    t_range = (float(ta.min()), float(ta.max()))
    if not (math.isfinite(t_range[0]) and math.isfinite(t_range[1])):
        return None
    if not (da.min() >= 0.0 and da.max() <= MAX_DURATION_US):
        return None
    # ``ok`` is Literal[0, 1]: equality with 0 or 1 is what the model checks
    # (True and 1.0 pass, "1" does not); list.count compares in C.
    ones = ok.count(1)
    if ones == n:
        return ta, da, np.ones(n, dtype=bool), t_range
    if ones + ok.count(0) != n:
        return None
    return ta, da, np.fromiter((o == 1 for o in ok), dtype=bool, count=n), t_range


def _floats(values: list[Any], n: int) -> npt.NDArray[np.float64]:
    """A list of numbers as float64, through one ``struct.pack`` of the whole list.

    The list→array conversion is the largest cost of the worker's own per launch:
    measured on 2,000 end times (``kernelstream bench worker-path`` input), 9.8 ns a
    value here, 25.8 with ``np.fromiter``, 30.2 with ``array.array`` and 32.8 with
    ``np.array``. ``struct`` takes ints, floats and bools (as ``float()`` does) and
    raises ``struct.error`` for anything else. Native mode (``@``, what ``frombuffer``
    reads) copies each double; standard mode (``=``) packs it portably, 12.3 against
    8.9 ns a value (same input, same run).
    """
    return np.frombuffer(_struct_of(n).pack(*values), dtype=np.float64)


@lru_cache(maxsize=64)
def _struct_of(n: int) -> struct.Struct:
    return struct.Struct(f"@{n}d")  # doubles only: native alignment adds no padding


# -- the binary layout -----------------------------------------------------------------

# Header bytes already validated (the per-batch fields, ``seq_start`` apart) -> those
# fields, their fields-set with ``seq_start`` (what :func:`_with_seq_start` gives each
# batch) and the stream key. Cleared when it holds PER_STREAM_ENTRIES entries, as the JSON
# cache is. A hit also tells :func:`_known_binary` the columns' layout: the header lists
# them, and only a header whose list is exactly WIRE_COLUMNS was ever kept.
_BIN_META: dict[bytes, tuple[LaunchBatch, set[str], str]] = {}


def _binary_columns(bb: BinaryBatch, plain: _Plain | bool | None = True) -> LaunchColumns:
    """Columns of a binary batch: frombuffer views, checked with vectorized comparisons;
    anything the checks do not pass goes through the model, whose verdict is final.

    ``plain``: what :func:`_plain_binary` says of the columns when the caller already
    knows it (:func:`decode_launch_columns_many`); True to find it out here.
    """
    cols = bb.columns
    # only headers without version 2 fields are kept; a template kept by a batch before
    # this one in the same poll serves here (the poll's first batch of each kind of
    # header is validated whole, the others take its fields)
    hit = _kept(bb.meta_json)
    if hit is None and _v2_in_header(bb.meta_json):
        return _binary_v2(bb)
    if plain is True:
        plain = _plain_binary(cols, bb.n)
    if not isinstance(plain, tuple):
        _validate(LaunchBatch, bb.to_wire())  # raises with the model's message
    if hit is None:
        obj = bb.meta()
        if obj.get("schema") != LaunchBatch.SCHEMA:
            _validate(LaunchBatch, obj)  # raises: unknown schema
        meta = _validate(LaunchBatch, obj | _PLACEHOLDER)
        hit = (meta, meta.__pydantic_fields_set__ | {"seq_start"}, meta.stream_key)
        if not meta.samples:  # samples change every batch: not worth keeping
            _keep_header(bb.meta_json, hit)
    ok = cols.pop("ok").view(np.bool_)
    t_range, in_order, all_ok = plain if isinstance(plain, tuple) else (None, None, None)
    # the columns are exactly t_end, duration_us and ok (read_launch_batch's plan)
    return LaunchColumns(
        _with_seq_start(hit, bb.seq_start),
        cols["t_end"],
        cols["duration_us"],
        ok,
        t_range,
        known_in_order=in_order,
        known_all_ok=all_ok,
        key=hit[2],
    )


def _kept(header: bytes) -> tuple[LaunchBatch, set[str], str] | None:
    """The :data:`_BIN_META` entry of these header bytes: kept, or built from a template
    (:func:`_from_template`); None where the full decoder decides."""
    return _BIN_META.get(header) or _from_template(header)


def _keep_header(header: bytes, hit: tuple[LaunchBatch, set[str], str]) -> None:
    """Keep a validated header (an :data:`_BIN_META` entry), and it as the template of
    the headers that differ from it only in their node and device index."""
    remember(_BIN_META, header, hit)
    identity = _identity(header)
    if identity is not None:
        remember(_TEMPLATES, identity[0], hit)


# The headers a node's encoder writes (:func:`schemas.binary.header_json`) start with the
# schema, the node and the device index; a node's other GPUs, and the other nodes of a
# fleet, running the same kernel with the same configuration, send headers that differ
# only there. A string without escapes or control characters (JSON's own rule for raw
# ones): its bytes are its UTF-8 text; an integer as JSON writes one. Anything else, or
# any other order of the fields, misses and takes the full decoder.
_IDENTITY = re.compile(
    rb'\{"schema":"ks\.launch_batch/[12]","node":"([^"\\\x00-\x1f]+)",'
    rb'"device_index":(0|[1-9][0-9]{0,9}),'
)

# Validated headers by their bytes less the node's and the device index's values (the
# :data:`_BIN_META` entry they were validated into). Cleared as _BIN_META is.
_TEMPLATES: dict[bytes, tuple[LaunchBatch, set[str], str]] = {}


def _identity(header: bytes) -> tuple[bytes, bytes, int] | None:
    """``(the header without its node's and device index's values, the node's bytes,
    the device index)`` of a header in the encoder's field order, else None."""
    m = _IDENTITY.match(header)
    if m is None:
        return None
    (n0, n1), (d0, d1) = m.span(1), m.span(2)
    return header[:n0] + header[n1:d0] + header[d1:], m[1], int(m[2])


def _from_template(header: bytes) -> tuple[LaunchBatch, set[str], str] | None:
    """The :data:`_BIN_META` entry of a header not seen before that differs from a
    validated one only in its node and device index, built from that one's fields (kept
    for the next batch); None when there is none, or the node or the index would not
    pass the model (the full decoder then says why).

    Sound because no rule of :class:`LaunchBatch` reads the node or the device index
    with another field: the same bytes elsewhere passed every other rule, and the two
    values pass their own fields' validators here (``tests/unit/schemas/
    test_header_templates.py`` holds the result equal to the model's).
    """
    identity = _identity(header)
    if identity is None:
        return None
    rest, node_bytes, device = identity
    template = _TEMPLATES.get(rest)
    if template is None:
        return None
    try:
        node = _node_field().validate_python(node_bytes.decode())
        device = _device_field().validate_python(device)
    except (UnicodeDecodeError, ValidationError):
        return None
    meta = template[0]
    out = LaunchBatch.__new__(LaunchBatch)
    state = meta.__dict__.copy()
    state["node"] = node
    state["device_index"] = device
    object.__setattr__(out, "__dict__", state)
    object.__setattr__(out, "__pydantic_fields_set__", meta.__pydantic_fields_set__)
    object.__setattr__(out, "__pydantic_extra__", meta.__pydantic_extra__)
    object.__setattr__(out, "__pydantic_private__", meta.__pydantic_private__)
    hit = (out, template[1], stream_key(node, device, meta.kernel))
    _keep_header(header, hit)
    return hit


@lru_cache(maxsize=1)
def _node_field() -> TypeAdapter[Any]:
    return _field_adapter("node")


@lru_cache(maxsize=1)
def _device_field() -> TypeAdapter[Any]:
    return _field_adapter("device_index")


def _field_adapter(name: str) -> TypeAdapter[Any]:
    """A validator of one of :class:`LaunchBatch`'s fields alone, as the model's (strict)."""
    info = LaunchBatch.model_fields[name]
    field_type: Any = Annotated[info.annotation, *info.metadata]  # its type and constraints
    return TypeAdapter(field_type, config=ConfigDict(strict=True, allow_inf_nan=False))


def _binary_v2(bb: BinaryBatch) -> LaunchColumns:
    """A binary batch whose header carries host gaps, waits or copies (as JSON): the
    checks of the JSON path for them, the model's verdict for anything they do not pass."""
    cols = bb.columns
    plain = _plain_binary(cols, bb.n)
    obj = bb.meta()
    v2: _V2Columns | None = None
    if plain is not None and obj.get("schema") == LaunchBatch.SCHEMA:
        try:
            v2 = _v2_columns(obj, bb.n, bb.meta_json)
            meta = _validate(LaunchBatch, obj | _PLACEHOLDER)
        except (SchemaError, ValueError):
            v2 = None
    if v2 is None or plain is None:
        return LaunchColumns.from_batch(_validate(LaunchBatch, bb.to_wire()))  # exact verdict
    meta = meta.model_copy(update={"seq_start": bb.seq_start})
    ok = cols["ok"].view(np.bool_)
    t_range, in_order, all_ok = plain
    return LaunchColumns(
        meta,
        cols["t_end"],
        cols["duration_us"],
        ok,
        t_range,
        *v2,
        known_in_order=in_order,
        known_all_ok=all_ok,
    )


# (name, name set to null) as header bytes, built once: the test runs on every batch.
_V2_NEEDLES = tuple((f'"{k}"'.encode(), f'"{k}":null'.encode()) for k in _V2)


def _v2_in_header(meta_json: bytes) -> bool:
    """Whether a binary header names a version 2 field with a value other than null."""
    return any(name in meta_json and null not in meta_json for name, null in _V2_NEEDLES)


def _with_seq_start(hit: tuple[LaunchBatch, set[str], str], seq_start: int) -> LaunchBatch:
    """A shallow copy of the validated per-batch fields ``hit[0]`` with another
    ``seq_start``; ``hit[1]`` is their fields-set with ``seq_start`` (an :data:`_BIN_META`
    entry).

    What ``meta.model_copy(update={"seq_start": ...})`` gives (no validation, shared
    nested values), built directly: pydantic's copy machinery cost ~3 us a batch, a
    tenth of the binary decode of a 182-launch batch. The fields-set is shared by the
    copies of one header: the model is frozen, so nothing adds to it.
    """
    meta = hit[0]
    out = LaunchBatch.__new__(LaunchBatch)
    state = meta.__dict__.copy()
    state["seq_start"] = seq_start
    object.__setattr__(out, "__dict__", state)
    object.__setattr__(out, "__pydantic_fields_set__", hit[1])
    object.__setattr__(out, "__pydantic_extra__", meta.__pydantic_extra__)
    object.__setattr__(out, "__pydantic_private__", meta.__pydantic_private__)
    return out


# (earliest and latest end time, end times in completion order, every launch ran)
_Plain = tuple[tuple[float, float], bool, bool]


def _plain_binary(cols: dict[str, npt.NDArray[Any]], n: int) -> _Plain | None:
    """The end times' range, whether they are in completion order and whether every
    launch ran, when the three known columns plainly pass the model's rules; else None.

    A column this module has no check for also returns None (the model decides). Each
    numpy reduction costs ~1-2 us whatever the size, so on small batches their number
    is the cost: end times in order need one comparison and their two ends.
    """
    if not 1 <= n <= MAX_LAUNCHES or set(cols) != {"t_end", "duration_us", "ok"}:
        return None
    t, d, ok = cols["t_end"], cols["duration_us"], cols["ok"]
    # NaN compares false, so an ordered column with finite ends is finite throughout.
    in_order = n < 2 or bool((t[1:] >= t[:-1]).all())
    lo, hi = (float(t[0]), float(t[-1])) if in_order else (float(t.min()), float(t.max()))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if int(d.view("<u8").max()) > MAX_DURATION_BITS or int(ok.max()) > 1:
        return None
    return (lo, hi), in_order, bool(ok.min() == 1)


# -- a consumer poll at once ------------------------------------------------------------

_KNOWN_COLUMNS = {name for name, _ in WIRE_COLUMNS}


def decode_launch_columns_many(values: list[bytes]) -> list[LaunchColumns | SchemaError]:
    """:func:`decode_launch_columns` of every message of a consumer poll, in order.

    Each message gets the same columns or the same :class:`SchemaError` as alone; only
    the value checks of the binary batches (:func:`_plain_binary`: end times in order and
    finite, durations in range, ``ok`` 0 or 1) run once over the poll's concatenated
    columns. On small batches each NumPy call costs about a microsecond whatever its
    length, so a handful of calls per poll replaces a handful per message.
    """
    steady = _steady_binary(values)
    if steady is not None:
        return steady
    out: list[LaunchColumns | SchemaError | None] = [None] * len(values)
    frames: list[tuple[int, BinaryBatch]] = []
    known: list[tuple[int, _Known]] = []
    for i, data in enumerate(values):
        try:
            if len(data) <= MAX_MESSAGE_BYTES and is_binary(data):
                parts = _known_binary(data)
                if parts is not None:
                    known.append((i, parts))
                else:
                    frames.append((i, read_launch_batch(data)))
            else:
                parts = _simd_parts(data)
                if parts is not None:
                    known.append((i, parts))
                else:
                    out[i] = decode_launch_columns(data)
        except SchemaError as exc:
            out[i] = exc
    columns: list[_Cols | None] = [(k[2], k[3], k[4]) for _, k in known]
    columns += [_three_columns(bb.columns) for _, bb in frames]
    plains = _plain_binary_many(columns)
    for (i, (hit, seq_start, t, d, ok)), plain in zip(known, plains[: len(known)], strict=True):
        if not isinstance(plain, tuple):
            plain = _plain_binary({"t_end": t, "duration_us": d, "ok": ok}, t.size)
        binary = ok.dtype == np.uint8  # JSON's come as 64-bit integers (_simd_parts)
        if plain is None:  # not plainly valid: the full decoder and the model decide
            try:
                out[i] = (
                    _binary_columns(read_launch_batch(values[i]), None)
                    if binary
                    else _orjson_columns(values[i])
                )
            except SchemaError as exc:
                out[i] = exc
            continue
        out[i] = _plain_columns(
            _with_seq_start(hit, seq_start),
            t,
            d,
            ok.view(np.bool_) if binary else ok.astype(bool),
            plain,
            hit[2],
        )
    for (i, bb), plain in zip(frames, plains[len(known) :], strict=True):
        try:
            out[i] = _binary_columns(bb, plain)
        except SchemaError as exc:
            out[i] = exc
    return typing.cast("list[LaunchColumns | SchemaError]", out)  # every entry is set


_HEAD_BYTES = np.arange(HEAD_SIZE)
_MAGIC = np.bytes_(MAGIC)
# Messages up to this size on average are read from one joined buffer; larger ones
# message by message, where three views of a message cost less than copying it.
_JOIN_MAX_MEAN_BYTES = 8192


class SteadyPoll(NamedTuple):
    """A poll of binary batches read at once (:func:`steady_poll`)."""

    # per batch: its header's entry (validated per-batch fields, their fields-set with
    # seq_start, stream key), seq_start, and its columns as views of the joined buffer
    hits: list[tuple[LaunchBatch, set[str], str]]
    seq_start: list[int]
    t_end: list[npt.NDArray[np.float64]]
    duration_us: list[npt.NDArray[np.float64]]
    ok: list[npt.NDArray[np.bool_]]
    # the poll's columns joined (t, d, ok as bytes 0 or 1), where each batch starts in
    # them, and each batch's earliest and latest end time
    t: npt.NDArray[np.float64]
    d: npt.NDArray[np.float64]
    ok_bytes: npt.NDArray[np.uint8]
    first: npt.NDArray[np.int64]
    lo: npt.NDArray[np.float64]
    hi: npt.NDArray[np.float64]


def steady_poll(
    values: list[bytes], max_mean_bytes: int = _JOIN_MAX_MEAN_BYTES
) -> SteadyPoll | None:
    """A poll whose every message is a binary batch with header bytes decoded before, of
    the layout's exact length, whose columns plainly pass (end times finite and in
    completion order, durations in range, ``ok`` 0 or 1), and whose messages are small
    (``max_mean_bytes`` on average at most; larger ones cost less as views of each
    message than copied): the steady state of small batches. None for any other poll
    (the general path, message by message, decides).

    The messages are joined into one buffer, their heads read as one array and their
    columns checked at once; each batch's columns are views of that buffer.
    """
    count = len(values)
    if not count:
        return None
    lens = np.fromiter(map(len, values), np.int64, count)
    total = int(lens.sum())
    if (
        total > max_mean_bytes * count
        or int(lens.min()) < HEAD_SIZE
        or int(lens.max()) > MAX_MESSAGE_BYTES
        or bool((lens & 7).any())
    ):
        return None
    buf = b"".join(values)
    raw = np.frombuffer(buf, np.uint8)
    starts = np.cumsum(lens) - lens
    heads = raw[starts[:, None] + _HEAD_BYTES].view(HEAD_RECORD).ravel()
    n = heads["n"].astype(np.int64)
    m = heads["m"].astype(np.int64)
    pos = starts + HEAD_SIZE + m + (-m % 8)
    if not (
        bool((heads["magic"] == _MAGIC).all())
        and bool((heads["version"] == LAYOUT_VERSION).all())
        and int(n.min()) >= 1
        and int(n.max()) <= MAX_LAUNCHES
        and bool((pos - starts + 17 * n + (-n % 8) == lens).all())
    ):
        return None
    get = _BIN_META.get
    hits = [get(v[HEAD_SIZE : HEAD_SIZE + k]) for v, k in zip(values, m.tolist(), strict=True)]
    if None in hits:
        return None
    f8, flags = raw.view("<f8"), raw.view(np.bool_)
    ns, cols = n.tolist(), (pos >> 3).tolist()
    ts = [f8[a : a + k] for a, k in zip(cols, ns, strict=True)]
    ds = [f8[a + k : a + 2 * k] for a, k in zip(cols, ns, strict=True)]
    oks = [flags[8 * a + 16 * k : 8 * a + 17 * k] for a, k in zip(cols, ns, strict=True)]
    t, d = np.concatenate(ts), np.concatenate(ds)
    first = np.cumsum(n) - n
    in_order = t[1:] >= t[:-1]  # NaN compares false
    in_order[first[1:] - 1] = True  # from one batch to the next: no rule
    lo, hi = t[first], t[first + n - 1]
    ok = np.concatenate(oks).view(np.uint8)
    if not (
        bool(in_order.all())
        and bool(np.isfinite(lo).all())
        and bool(np.isfinite(hi).all())
        and int(d.view("<u8").max()) <= MAX_DURATION_BITS
        and int(ok.max()) <= 1
    ):
        return None
    entries = typing.cast("list[tuple[LaunchBatch, set[str], str]]", hits)  # none is None
    return SteadyPoll(entries, heads["seq_start"].tolist(), ts, ds, oks, t, d, ok, first, lo, hi)


def _steady_binary(values: list[bytes]) -> list[LaunchColumns | SchemaError] | None:
    """:func:`decode_launch_columns_many` of a :func:`steady_poll` (None for any other):
    the columns, the per-batch fields and the flags the general path gives. On 182-launch
    batches a message costs about two thirds of the general path's."""
    poll = steady_poll(values) if len(values) > 1 else None  # one message: the general way
    if poll is None:
        return None
    all_ok = (np.minimum.reduceat(poll.ok_bytes, poll.first) == 1).tolist()
    return [
        _plain_columns(_with_seq_start(hit, s), tb, db, okb, ((a, b), True, r), hit[2])
        for hit, s, tb, db, okb, a, b, r in zip(
            poll.hits,
            poll.seq_start,
            poll.t_end,
            poll.duration_us,
            poll.ok,
            poll.lo.tolist(),
            poll.hi.tolist(),
            all_ok,
            strict=True,
        )
    ]


def _plain_columns(
    meta: LaunchBatch,
    t: npt.NDArray[np.float64],
    d: npt.NDArray[np.float64],
    ok: npt.NDArray[np.bool_],
    plain: _Plain,
    key: str,
) -> LaunchColumns:
    """``LaunchColumns(meta, t, d, ok, plain[0], known_in_order=plain[1],
    known_all_ok=plain[2], key=key)``, built
    without the frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field, 1 us
    of the ~7 us a small batch's decoding costs). Every field is set here: a field added
    to LaunchColumns must be added here too (a test compares the two)."""
    out = object.__new__(LaunchColumns)
    out.__dict__.update(
        meta=meta,
        t_end=t,
        duration_us=d,
        ok=ok,
        known_t_range=plain[0],
        host_gap_us=None,
        host_waited=None,
        copies=None,
        known_in_order=plain[1],
        known_all_ok=plain[2],
        key=key,
    )
    return out


# (header entry, seq_start, t_end, duration_us, ok) of a batch whose header bytes (the
# per-batch fields) were decoded before
_Known = tuple[
    tuple[LaunchBatch, set[str], str],
    int,
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[Any],  # uint8 from a binary batch, uint64 from a JSON one
]


def _known_binary(data: bytes) -> _Known | None:
    """The parts of a binary batch whose header bytes a batch decoded before had, in
    one pass and two ``frombuffer`` calls; None for anything else (the full reader
    decides, and names what is wrong).

    A header that passed once declared exactly the layout's columns (the header lists
    them, :func:`schemas.binary.read_launch_batch` refuses any other list), so with the
    same header bytes only the lengths are left to check.
    """
    if len(data) < HEAD_SIZE:
        return None
    _, version, n, seq_start, m = read_head(data)
    header = data[HEAD_SIZE : HEAD_SIZE + m]
    hit = _kept(header)
    if hit is None or version != LAYOUT_VERSION or not 1 <= n <= MAX_LAUNCHES:
        return None
    pos = HEAD_SIZE + m + (-m % 8)
    if pos + 17 * n + (-n % 8) != len(data):  # two f8 columns, one u1, the last padded
        return None
    f8 = np.frombuffer(data, dtype="<f8", count=2 * n, offset=pos)
    ok = np.frombuffer(data, dtype=np.uint8, count=n, offset=pos + 16 * n)
    return hit, seq_start, f8[:n], f8[n:], ok


# (t_end, duration_us, ok) of one batch
_Cols = tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]


def _three_columns(cols: dict[str, npt.NDArray[Any]]) -> _Cols | None:
    if cols.keys() != _KNOWN_COLUMNS:
        return None
    return cols["t_end"], cols["duration_us"], cols["ok"]


def _plain_binary_many(batches: list[_Cols | None]) -> list[_Plain | bool | None]:
    """:func:`_plain_binary` of each batch's (t_end, duration_us, ok) columns (True: not
    computed, the batch does it alone; None given, None returned: not the known columns).
    """
    res: list[_Plain | bool | None] = [True] * len(batches)
    pick: list[int] = []
    sel: list[_Cols] = []
    for i, c in enumerate(batches):
        if c is not None and 1 <= c[0].size <= MAX_LAUNCHES:
            pick.append(i)
            sel.append(c)
    core = native.core
    if core is not None and sel:
        # batch by batch in one call, no concatenation (schemas.native); a column of
        # another type (JSON's 64-bit flags) leaves the poll to NumPy
        try:
            plains = core.plain_many(
                [c[0] for c in sel], [c[1] for c in sel], [c[2] for c in sel], MAX_DURATION_BITS
            )
        except (TypeError, ValueError):
            pass
        else:
            for i, plain in zip(pick, plains, strict=True):
                res[i] = plain
            return res
    if len(pick) < 2:
        return res
    t = np.concatenate([c[0] for c in sel])
    sizes = np.fromiter((c[0].size for c in sel), dtype=np.int64, count=len(sel))
    ends = np.cumsum(sizes)
    starts = ends - sizes
    # Each step back (NaN compares false) by the index of its later value: one into a
    # batch's first value crosses from the batch before, any other is inside a batch.
    back = np.flatnonzero(~(t[1:] >= t[:-1])) + 1
    in_order = np.ones(len(sel), dtype=bool)
    if back.size:
        batch = np.searchsorted(ends, back, side="right")
        in_order[batch[back != starts[batch]]] = False
    lo, hi = t[starts], t[ends - 1]
    for j in np.flatnonzero(~in_order).tolist():
        part = t[starts[j] : ends[j]]
        lo[j], hi[j] = part.min(), part.max()
    d_bits = np.concatenate([c[1] for c in sel]).view("<u8")
    ok = np.concatenate([c[2] for c in sel])
    fine = np.isfinite(lo) & np.isfinite(hi)
    # all durations and flags in range (the common case) in two passes; else by batch
    if int(d_bits.max()) > MAX_DURATION_BITS or int(ok.max()) > 1:
        fine &= np.maximum.reduceat(d_bits, starts) <= MAX_DURATION_BITS
        fine &= np.maximum.reduceat(ok, starts) <= 1
    all_ok = np.minimum.reduceat(ok, starts) == 1
    for i, f, a, b, o, r in zip(
        pick,
        fine.tolist(),
        lo.tolist(),
        hi.tolist(),
        in_order.tolist(),
        all_ok.tolist(),
        strict=True,
    ):
        res[i] = ((a, b), o, r) if f else None
    return res
