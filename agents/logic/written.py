"""Windows and findings the compiled engine writes itself (``kernelstream._native.SeriesWriter``).

With small batches a window holds a few messages, and what the window agent did per
window in Python (the record built, encoded, classified, the finding written) cost more
than windowing its launches: at 186 launches a message, 24 us a window against the
binary ceiling's 12 us a message (``docs/performance.md``, "Windows and findings written
in compiled code"). Once the :class:`~agents.logic.detection.Detector` has judged a
window of one (stream, configuration), its verdict on every later window depends only on
the window's figures, on constants of the series and on the series' regression baseline,
which forms from its first windows of enough launches. This module hands those to the
engine (:func:`series_writer`), rendered as far as they are text:

* the window record's JSON around its figures (:data:`WINDOW_SLOTS`), from a record the
  Python path built;
* the finding's JSON around its window start;
* the roofline's numbers (the engine writes the evidence's fields that are the series'
  own from them);
* the series' names and numbers the summaries give (escaped where they are text);
* the causes of under-use that the configuration alone decides;
* the regression baseline as the detector holds it (the writer goes on forming it, and
  each window that fed it comes with the baseline after it, which the detector takes:
  :meth:`~agents.logic.detection.Detector.take_baseline`, so a window the writer leaves
  to the Python path, or a series whose writer is dropped, is judged from the same
  baseline);
* the detector's rules, shared by its writers (:func:`_rules_of`, built once): its
  thresholds and each summary's template (:data:`~agents.logic.detection.SUMMARIES`)
  with the window's figures and the series' names as fields.

The engine then gives each window of the series it closes as a :class:`Written`: the
record's and the finding's bytes, those :func:`schemas.codec.encode` and
:meth:`Detector.classify_wire` give. The first writers of a worker, then one in 16, are
handed over only after a writer of the series, from the baseline before the window they
were learnt from, wrote that window to the same bytes as the Python path did
(:meth:`CompiledWindows.learn`); a window a writer cannot promise that for (a figure
that is not finite or absurdly large, a window without a launch that ran) comes back as
before, for the Python path, and the engine drops the writer of its stream and
configuration (the detector may feed the baseline with it). A stream keeps one writer a
configuration: the detector keeps one baseline per stream and configuration.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import orjson

from kernelstream.agents.logic.detection import (
    CAUSES,
    SUMMARIES,
    BaselineState,
    Detector,
    DetectorThresholds,
    occupancy_source,
)
from kernelstream.agents.logic.windowing import _DURATION_STATS, WindowTemplate
from kernelstream.schemas import WindowAggregate, native
from kernelstream.schemas.records import Finding

__all__ = ["WINDOW_SLOTS", "UnwritableError", "Written", "series_writer"]

#: The window record's figures, in its fields' order, as the engine writes them.
WINDOW_SLOTS = (
    "window_start",
    "window_end",
    "count",
    "failures",
    "late_accepted",
    *_DURATION_STATS,  # the duration's mean, p50, p95, min, max and std
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
    "what": 9,
    "device_model": 10,
    "overhead": 11,
    "intensity": 12,
    "base": 13,
}
# the fields that are text (written as they are, escaped), not numbers
_TEXT_FIELDS = frozenset({"causes", "what", "device_model"})
_FIXED, _PERCENT = 1, 2
_SPEC = re.compile(r"\.(\d+)([f%])")

# Above this a constant is left to the Python path (the engine's LARGE: the evidence's
# floats then cannot sum past the largest float).
_LARGE = 1e300

# Each figure's marker in a record written to find where the figures go (a record's
# figures are never negative): the writer cuts the record at each marker after its key.
# A record whose names or values hold a marker's digits anywhere else (a configuration
# value, a name) stays on the Python path.
_MARKERS = {name: -(1 << 53) - i for i, name in enumerate(WINDOW_SLOTS)}
_MARKER_PREFIX = b"-90071992547"  # each marker's digits start so
_WINDOW_HEAD = b'{"schema":' + orjson.dumps(WindowAggregate.SCHEMA) + b","


def _between(fields: Iterable[str], first: str, last: str) -> tuple[str, ...]:
    names = list(fields)
    return tuple(names[names.index(first) + 1 : names.index(last)])


# Whether a finding has its window record's fields between its id and its window start,
# in the same order, as the writer takes them from the record (else no writer).
_SHARED_HOLDS = _between(Finding.model_fields, "id", "window_start") == _between(
    WindowAggregate.model_fields, "schema_", "window_start"
)

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
    # where the window fed its series' regression baseline: the baseline's key in the
    # detector and the baseline after it (windows, launches, sum of durations); else None
    baseline: tuple[str, int, int, float] | None


class UnwritableError(ValueError):
    """A series whose windows the engine cannot write as the Python path does."""


def series_writer(
    agg: WindowAggregate,
    template: WindowTemplate,
    detector: Detector,
    group: bytes,
    size_s: float,
    baseline: BaselineState,
) -> Any:
    """The engine's writer of the windows of ``agg``'s stream and configuration
    (``template``: its window template; ``group``: its findings' message key), whose
    regression baseline is ``baseline`` before the first window it writes (the
    detector's, :meth:`~agents.logic.detection.Detector.baseline_state`). Raises
    :class:`UnwritableError` where the series' constants cannot be written as the Python
    path writes them."""
    core = native.core
    if core is None or not hasattr(core, "SeriesWriter"):
        raise UnwritableError("the compiled module has no writer")
    if not _SHARED_HOLDS:
        raise UnwritableError("a finding no longer shares its window record's fields")
    roofline = (
        template.bytes_moved,
        template.flops,
        template.peak_gbs,
        template.peak_gflops,
        size_s,
        agg.arithmetic_intensity,
        agg.occupancy,
        agg.waves,
        agg.launch_overhead_us,
    )
    for x in (*roofline, baseline[2]):
        if type(x) is not float or not abs(x) <= _LARGE:
            raise UnwritableError("a constant of the series is not a float, finite and not absurd")
    what, id_prefix, baseline_key = detector.series_names(agg)
    window = _marked_window(agg)
    if not window.startswith(_WINDOW_HEAD):
        raise UnwritableError("the window record does not start with its schema")
    shared = window[len(_WINDOW_HEAD) : window.find(b'"window_start":')]
    try:
        return core.SeriesWriter(
            key=agg.stream_key.encode(),
            group=group,
            rules=_rules_of(core, detector.thresholds),
            window=window,
            roofline=roofline,
            finding=_finding_fragments(shared, id_prefix),
            names=(
                _escaped(what),
                _escaped(agg.device_model),
                _escaped(occupancy_source(agg)),
            ),
            static_causes=[_escaped(c) for c in detector.fixed_causes(agg)],
            baseline=baseline,
            baseline_key=baseline_key,
        )
    except ValueError as ex:  # the record's figures not where the writer cuts it
        raise UnwritableError(str(ex)) from ex


def _rules_of(core: Any, th: DetectorThresholds) -> Any:
    """The engine's rules of a detector of thresholds ``th``, built once per thresholds
    object (every writer of the detector shares them; the object kept, so its id is its
    own)."""
    got = _RULES.get(id(th))
    if got is None or got[0] is not th:
        got = _RULES[id(th)] = (th, _rules(core, th))
    return got[1]


_RULES: dict[int, tuple[DetectorThresholds, Any]] = {}


def _rules(core: Any, th: DetectorThresholds) -> Any:
    """The engine's rules of a detector of thresholds ``th``."""
    named = {"factor": th.launch_bound_factor}
    return core.Rules(
        templates=[
            (name, _compiled(text, named))
            for name, text in SUMMARIES.items()
            if name not in ("no_launch", "balanced")
        ],
        balanced=_compiled(SUMMARIES["balanced"], named),
        busy_cause=_compiled(CAUSES["busy"], named),
        thresholds=dataclasses.asdict(th),
        plus_exponent=_PLUS_EXPONENT,
        window_markers=[
            (b'"' + name.encode() + b'":', b"%d" % marker) for name, marker in _MARKERS.items()
        ],
    )


def _escaped(text: str) -> bytes:
    """``text`` as it stands inside a JSON string orjson writes."""
    return orjson.dumps(text)[1:-1]


def _marked_window(agg: WindowAggregate) -> bytes:
    """The window record's JSON (``encode(agg)``) with each figure's marker in its place
    (the writer cuts it there)."""
    state = dict(agg.__dict__)
    if next(iter(state), None) != "schema_" or agg.device_samples is not None:
        raise UnwritableError("not a plain window record")
    if not _MARKERS.keys() <= state.keys():
        raise UnwritableError("a window record without the writer's figures")
    state.update(_MARKERS)
    out = b'{"schema"' + orjson.dumps(state)[len(b'{"schema_"') :]
    if out.count(_MARKER_PREFIX) != len(_MARKERS):  # a value of the record holds one
        raise UnwritableError("a value of the window record reads as a figure's marker")
    return out


def _finding_fragments(shared: bytes, id_prefix: str) -> tuple[bytes, bytes]:
    """The finding's JSON up to its id's window start, then from there up to its
    ``window_start`` figure. Between the id and the window start a finding has the window
    record's fields between its schema and its window start, in the same order
    (:data:`_SHARED_HOLDS`): ``shared`` is their JSON, cut from the window record."""
    head = b'{"schema":' + orjson.dumps(Finding.SCHEMA) + b',"id":"' + _escaped(id_prefix)
    return head, b'",' + shared + b'"window_start":'


@functools.cache
def _parsed(text: str) -> list[tuple[str, str | None, str | None, str | None]]:
    """``str.format``'s reading of a template (kept: a handful of templates)."""
    return list(string.Formatter().parse(text))


def _compiled(text: str, named: Mapping[str, Any]) -> Template:
    """A summary's template as the engine renders it: (literal, escaped; the field after
    it, by code: a figure of the window or a name or number of its series; its format;
    its precision), with the detector's constants (``named``) filled in the literals as
    ``str.format`` fills them."""
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
        if field in _TEXT_FIELDS:
            if spec:
                raise UnwritableError(f"a format for a text field: {text!r}")
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
