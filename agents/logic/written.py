"""Windows and findings the compiled engine writes itself (``kernelstream._native.SeriesWriter``).

With small batches a window holds a few messages, and what the window agent did per
window in Python (the record built, encoded, classified, the finding written) cost more
than windowing its launches: at 186 launches a message, 24 us a window against the
binary ceiling's 12 us a message (``docs/performance.md``). Once the
:class:`~agents.logic.detection.Detector` has judged a few windows of one (stream,
configuration) and frozen its regression baseline, its verdict on every later window
depends only on the window's figures and on constants of the series. This module hands
those constants to the engine (:func:`series_writer`), rendered as far as they are text:

* the window record's JSON around its figures (:data:`WINDOW_SLOTS`), from a record the
  Python path built;
* the finding's JSON around its window start, and the evidence's fields that are the
  series' own;
* each summary's template (:data:`~agents.logic.detection.SUMMARIES`) with the series'
  names and constants filled in, the window's figures left as fields;
* the causes of under-use that the configuration alone decides;
* the thresholds and the frozen baseline.

The engine then gives each window of the series it closes as a :class:`Written`: the
record's and the finding's bytes, those :func:`schemas.codec.encode` and
:meth:`Detector.classify_wire` give. A series is handed over only after the engine wrote
the window it was learnt from to the same bytes as the Python path did (checked here);
a window it cannot promise that for (a figure that is not finite or absurdly large, a
window without a launch that ran) comes back as before, for the Python path.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import orjson

from kernelstream.agents.logic.detection import (
    CAUSES,
    SUMMARIES,
    Detector,
    roofline_evidence,
)
from kernelstream.agents.logic.windowing import WindowTemplate
from kernelstream.schemas import WindowAggregate
from kernelstream.schemas.records import Finding, _finding_fields

__all__ = ["WINDOW_SLOTS", "UnwritableError", "Written", "series_writer"]

#: The window record's figures, in its fields' order, as the engine writes them.
WINDOW_SLOTS = (
    "window_start",
    "window_end",
    "count",
    "failures",
    "late_accepted",
    "duration_mean_us",
    "duration_p50_us",
    "duration_p95_us",
    "duration_min_us",
    "duration_max_us",
    "duration_std_us",
    "busy_fraction",
    "idle_gap_mean_us",
    "achieved_gbs",
    "achieved_gflops",
    "bw_fraction",
    "flops_fraction",
    "seq_min",
    "seq_max",
)

_SLOTS = frozenset(WINDOW_SLOTS)

# The evidence's fields that are the window's figures, in the engine's order: the first
# six after ``roofline_known``, the last two before ``launch_overhead_us``.
_EVIDENCE_FIGURES = (
    ("count", "failures", "mean_us", "p95_us", "bw_fraction", "flops_fraction"),
    ("busy_fraction", "idle_gap_mean_us"),
)

# A summary's fields that are the window's figures, by the engine's codes
# (native/src/written.rs, FIELD_*); any other field is the series' own and is filled in.
_FIELDS = {
    "mean": 1,
    "ratio": 2,
    "bw": 3,
    "flops": 4,
    "roof": 5,
    "causes": 6,
    "busy": 7,
    "idle": 8,
}
_FIXED, _PERCENT = 1, 2
_SPEC = re.compile(r"\.(\d+)([f%])")

# Above this a constant is left to the Python path (the engine's LARGE: the evidence's
# floats then cannot sum past the largest float).
_LARGE = 1e300

# A figure's marker (minus its slot) in a record written to find where the figure goes:
# a record's figures are never negative, and a marker found inside a JSON string would
# stand after an escaped quote, which the key before it excludes.
_MARKER = -(1 << 53)

# Whether this orjson writes a positive exponent with its sign (1e+16; older ones: 1e16).
_PLUS_EXPONENT = orjson.dumps(1e16) == b"1e+16"

Template = list[tuple[bytes, int, int, int]]


class Written(NamedTuple):
    """A window the engine closed and wrote, with its finding: what publishing them
    takes (the message keys of the windows and findings topics, the records' bytes)."""

    key: bytes
    window: bytes
    group: bytes
    classification: str
    finding: bytes
    window_end: float
    launches: int


class UnwritableError(ValueError):
    """A series whose windows the engine cannot write as the Python path does."""


def series_writer(
    agg: WindowAggregate,
    template: WindowTemplate,
    detector: Detector,
    group: bytes,
    size_s: float,
) -> Any:
    """The engine's writer of the windows of ``agg``'s stream and configuration
    (``template``: its window template; ``group``: its findings' message key), or None
    where the detector's baseline of it is not frozen yet. Raises :class:`UnwritableError`
    where the series' constants cannot be written as the Python path writes them."""
    from kernelstream.schemas import native  # (the compiled module, where installed)

    core = native.core
    if core is None or not hasattr(core, "SeriesWriter"):
        raise UnwritableError("the compiled module has no writer")
    baseline = detector.frozen_baseline(agg)
    if baseline is None:
        return None
    th = detector.thresholds
    what, id_prefix, _ = detector.series_names(agg)
    ev = roofline_evidence(agg)
    named = {
        "what": what,
        "factor": th.launch_bound_factor,
        "overhead": agg.launch_overhead_us,
        "device_model": agg.device_model,
        "intensity": agg.arithmetic_intensity,
        "base": baseline[0],
    }
    constants = (
        baseline[0],
        template.bytes_moved,
        template.flops,
        template.peak_gbs,
        template.peak_gflops,
        agg.launch_overhead_us,
    )
    if not all(abs(x) <= _LARGE for x in constants):
        raise UnwritableError("a constant of the series is not finite or absurdly large")
    return core.SeriesWriter(
        key=agg.stream_key.encode(),
        group=group,
        window=_window_fragments(agg),
        roofline=(
            template.bytes_moved,
            template.flops,
            template.peak_gbs,
            template.peak_gflops,
            size_s,
            bool(ev["roofline_known"]),
            bool(ev["memory_bound"]),
        ),
        finding=_finding_fragments(agg, id_prefix),
        evidence=_evidence_fragments(ev),
        templates=[
            (name, _compiled(text, named))
            for name, text in SUMMARIES.items()
            if name not in ("no_launch", "balanced")
        ],
        balanced=_compiled(SUMMARIES["balanced"], named),
        static_causes=[_escaped(c) for c in detector.fixed_causes(agg, ev)],
        busy_cause=_compiled(CAUSES["busy"], {}),
        thresholds=(
            th.efficient_bw_fraction,
            th.compute_bound_flops_fraction,
            th.low_busy_fraction,
            th.idle_gap_ratio,
            th.launch_bound_factor,
            th.regression_factor,
            th.min_launches,
            agg.launch_overhead_us,
        ),
        baseline=baseline,
        plus_exponent=_PLUS_EXPONENT,
    )


def _escaped(text: str) -> bytes:
    """``text`` as it stands inside a JSON string orjson writes."""
    return orjson.dumps(text)[1:-1]


def _members(items: Iterable[tuple[str, Any]]) -> bytes:
    """``"key":value`` of each item, comma-separated, as orjson writes an object's."""
    return orjson.dumps(dict(items))[1:-1]


def _window_fragments(agg: WindowAggregate) -> list[bytes]:
    """The window record's JSON (``encode(agg)``) around its figures: the record written
    with a marker in place of each figure, cut at the markers."""
    state = dict(agg.__dict__)
    if next(iter(state), None) != "schema_" or agg.device_samples is not None:
        raise UnwritableError("not a plain window record")
    order = [name for name in state if name in _SLOTS]
    if tuple(order) != WINDOW_SLOTS:
        raise UnwritableError(f"the window record's figures are not in the writer's order: {order}")
    for i, name in enumerate(WINDOW_SLOTS):
        state[name] = _MARKER - i
    out = b'{"schema"' + orjson.dumps(state)[len(b'{"schema_"') :]
    fragments, at = [], 0
    for i, name in enumerate(WINDOW_SLOTS):
        key = b'"' + name.encode() + b'":'
        found = out.find(key + b"%d" % (_MARKER - i), at)
        if found < 0:
            raise UnwritableError(f"the window record's {name} was not found where it is written")
        fragments.append(out[at : found + len(key)])
        at = found + len(key) + len(b"%d" % (_MARKER - i))
    fragments.append(out[at:])
    return fragments


def _finding_fragments(agg: WindowAggregate, id_prefix: str) -> tuple[bytes, bytes]:
    """The finding's JSON up to its id's window start, then from there up to its
    ``window_start`` figure."""
    fields = _finding_fields(agg, id_prefix, "balanced", {}, "", copy=False)
    names = list(fields)
    if names[:2] != ["schema", "id"] or "window_start" not in names:
        raise UnwritableError(f"the finding's fields are not in the writer's order: {names}")
    head = b'{"schema":' + orjson.dumps(Finding.SCHEMA) + b',"id":"' + _escaped(id_prefix)
    between = names[2 : names.index("window_start")]
    tail = names[names.index("window_start") :]
    expected = ["window_start", "window_end", "classification", "evidence", "summary"]
    if tail != [*expected, "count", "failures", "duration_mean_us"]:
        raise UnwritableError(f"the finding's fields are not in the writer's order: {names}")
    mid = b'",' + _members((n, fields[n]) for n in between) + b',"window_start":'
    return head, mid


def _evidence_fragments(ev: Mapping[str, Any]) -> tuple[bytes, bytes, bytes]:
    """The evidence's first field, then its fields between the window's figures, then
    those after them (:data:`_EVIDENCE_FIGURES`)."""
    names = list(ev)
    first, second = _EVIDENCE_FIGURES
    if names[0] != "roofline_known" or tuple(names[1:7]) != first:
        raise UnwritableError(f"the evidence's fields are not in the writer's order: {names}")
    at = names.index(second[0])
    if tuple(names[at : at + 2]) != second:
        raise UnwritableError(f"the evidence's fields are not in the writer's order: {names}")
    middle, after = names[7:at], names[at + 2 :]
    for name in (*middle, *after):
        value = ev[name]
        if isinstance(value, float) and not abs(value) <= _LARGE:
            raise UnwritableError(f"the evidence's {name} is not finite or absurdly large")
    head = b'{"roofline_known":' + orjson.dumps(ev["roofline_known"])
    return (
        head,
        b"," + _members((n, ev[n]) for n in middle) if middle else b"",
        b"," + _members((n, ev[n]) for n in after) if after else b"",
    )


@functools.cache
def _parsed(text: str) -> list[tuple[str, str | None, str | None, str | None]]:
    """``str.format``'s reading of a template (kept: a handful of templates)."""
    return list(string.Formatter().parse(text))


def _compiled(text: str, named: Mapping[str, Any]) -> Template:
    """A summary's template as the engine renders it: (literal, escaped; the window's
    figure after it, by code; its format; its precision), with the series' own fields
    (``named``) filled in the literals as ``str.format`` fills them."""
    out: Template = []
    literal = ""
    for text_part, field, spec, conversion in _parsed(text):
        literal += text_part
        if field is None:
            continue
        if conversion is not None:
            raise UnwritableError(f"a conversion in a summary's template: {text!r}")
        if field in named:
            literal += format(named[field], spec or "")
            continue
        code = _FIELDS.get(field)
        if code is None:
            raise UnwritableError(f"a summary's field the engine does not know: {field!r}")
        if field == "causes":
            if spec:
                raise UnwritableError(f"a format for the causes: {text!r}")
            out.append((_escaped(literal), code, 0, 0))
        else:
            m = _SPEC.fullmatch(spec or "")
            if m is None:  # a float as str.format writes it unformatted is repr's, not orjson's
                raise UnwritableError(f"a figure's format the engine does not write: {spec!r}")
            kind = _FIXED if m.group(2) == "f" else _PERCENT
            out.append((_escaped(literal), code, kind, int(m.group(1))))
        literal = ""
    out.append((_escaped(literal), 0, 0, 0))
    return out
