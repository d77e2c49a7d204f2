"""The window stage's steady state in compiled code (``kernelstream._native.WindowEngine``).

Nearly every launch message a worker reads is the next binary batch of a stream whose
per-batch fields it decoded before, continuing its stream exactly (:class:`InOrderRun`'s
batches). The engine (``native/src/engine.rs``) reads, checks and windows such messages,
and aggregates the windows they close, with nothing per message in Python; this module
hands it the streams and turns its closed windows into the same records the
:class:`~agents.logic.windowing.Windower` builds.

A stream's state is held by the engine or by the Windower, never both:

* a message the engine has not been told about (new header bytes or message key) or of a
  stream the Windower holds goes the general way first (the worker's decoder judges it);
  where it is a plain binary batch (no device samples, no host telemetry) its header is
  registered and its stream taken over (:meth:`CompiledWindows.take`), with the state
  the Windower had of it, and the engine tries the message again;
* anything else (a duplicate, a gap, a launch out of order or too late, a batch the edge
  refuses) is given back first (:meth:`CompiledWindows.release`): the Windower's
  general path decides, with the stream's whole state;
* idle flushes and partition handovers release the streams they concern; a checkpoint
  copies the state of the streams held (:meth:`CompiledWindows.export_keys`).

The windows, the state and every count are those of the Windower's in-order path, and
the statistics those of :func:`~agents.logic.windowing.duration_stats`, bit for bit
(``tests/unit/agents/test_compiled_windows.py`` runs the same messages both ways).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any, NamedTuple

import numpy as np
import orjson

from kernelstream.agents.logic.detection import Detector
from kernelstream.agents.logic.windowing import (
    Windower,
    WindowFigures,
    WindowTemplate,
    _Acc,
    _cat,
    _KeyState,
    _meta,
    build_window,
    window_figures,
    window_template,
)
from kernelstream.agents.logic.written import UnwritableError, Written, series_writer
from kernelstream.schemas import WindowAggregate, encode, native
from kernelstream.schemas.columnar import LaunchColumns
from kernelstream.schemas.keys import PER_STREAM_ENTRIES, kept_bytes
from kernelstream.schemas.records import MAX_DURATION_BITS

__all__ = ["HELD_BACK", "TAKE_OVER", "CompiledWindows", "Taken"]

# The figures of the window record a writer is built from at a series' registration (the
# writer writes each window's own in their places).
_PLACEHOLDER = WindowFigures(1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0)

log = logging.getLogger(__name__)

# A written window's row from the engine: (stream key, record, group key, classification,
# finding, window end, launches, the baseline it fed or None) (:class:`Written`); any
# other row has ten fields.
_WRITTEN_ROW = len(Written._fields)
# Series kept on the Python path at most (then forgotten, and tried again).
MAX_UNWRITABLE = 4096
# Writers checked against the Python path before they are handed over (the window they
# were learnt from, judged again): the first this many of a worker, then one in this many;
# of the series handed a writer at registration (write_registered), the first this many
# and one in this many after are left to learn() for that check (a check costs about two
# windows judged in Python; the tests hold the two equal on windows of every kind, and a
# writer's constants come from the same code for every series).
CHECK_FIRST = CHECK_EVERY = 16
# Series' per-batch fields kept before those nothing uses are forgotten
# (:meth:`CompiledWindows.forget_unused`): the bound of the worker's other per-stream
# caches, well above a worker's streams times the configurations each has open.
MAX_METAS = PER_STREAM_ENTRIES


def _checked(n: int) -> bool:
    """Whether the ``n``-th writer (counted from 1) is checked: the first
    :data:`CHECK_FIRST`, then one in :data:`CHECK_EVERY`."""
    return n <= CHECK_FIRST or n % CHECK_EVERY == 0


#: Why the engine stopped at a message the caller may hand it after decoding it.
TAKE_OVER = frozenset({"unregistered", "not_held"})
#: Why the engine stopped at a message the Python path decides (its stream given back).
HELD_BACK = frozenset(
    {
        "no_value",
        "not_bytes",
        "oversized",
        "not_binary",
        "layout",
        "columns",
        "out_of_order",
        "event_time",
        "sequence",
        "before_counted",
        "closed_window",
        "window_edge",
    }
)


class Taken(NamedTuple):
    """What :meth:`CompiledWindows.poll` did with a partition's messages from the first:
    ``taken`` messages windowed (``launches`` launches), the windows they closed, and
    why it stopped before the next (None: it took them all). ``stop``: ``unregistered``
    or ``not_held`` (the caller decodes that message, :meth:`CompiledWindows.take` may
    take its stream over, and the engine tries it again), or what the engine found that
    the Python path decides (:data:`HELD_BACK`)."""

    taken: int
    launches: int
    closed: list[WindowAggregate | Written]
    stop: str | None


class CompiledWindows:
    """The streams the compiled engine windows, beside the Windower that holds the rest."""

    def __init__(self, windower: Windower, core: Any) -> None:
        spec = windower.spec
        self.windower = windower
        self.engine = core.WindowEngine(
            spec.size_s, spec.out_of_orderness_s, spec.allowed_lateness_s, MAX_DURATION_BITS
        )
        # per-batch fields (the window record's) by index, the engine's handle of them;
        # an index is never used again for other fields (forget_unused() forgets some)
        self._metas: dict[int, dict[str, Any]] = {}
        self._meta_index: dict[bytes, int] = {}
        self._templates: dict[int, WindowTemplate] = {}  # the window records' (same index)
        self._next_meta = 0
        # how many per-batch fields are kept before forget_unused() looks for unused ones
        self._metas_bound = MAX_METAS
        self._can_forget = hasattr(self.engine, "retain_metas")  # an older build cannot
        windower.held_elsewhere = self.open_windows
        # windows built from the engine's rows since the last learn(), while someone learns
        self.learning = False  # (set by learn_from(), by a window agent that calls learn())
        self._fresh: list[tuple[WindowAggregate, int, int, tuple[int, int, int, int], Any]] = []
        # (stream, meta index, config id) of series the engine cannot write as Python does
        self._unwritable: set[tuple[str, int, str]] = set()
        self.learnt = 0  # series learn() handed the engine a writer for
        self._told: set[str] = set()  # the reasons logged
        # whether this build of the compiled module writes windows (an older one does not)
        self.can_write = hasattr(core, "SeriesWriter")
        # What learn_from() or learn() was last given (the detector, the findings' key,
        # whether a series may be written): with it a series is handed a writer at the end
        # of the poll that registered its header (write_registered), where this build can
        # say which series it writes.
        self._learner: (
            tuple[Detector, Callable[[WindowAggregate], bytes], Callable[[WindowAggregate], bool]]
            | None
        ) = None
        self._from_start_ok = self.can_write and hasattr(self.engine, "writes")
        self._registered_series = 0  # series that could have been written from the start
        self._to_check: set[tuple[str, int, str]] = set()  # of those, left to learn()
        # series registered since the last write_registered() (a dict: in order, once)
        self.registered: dict[tuple[str, int, str], None] = {}
        self.from_start = 0  # series handed a writer from their first window

    @classmethod
    def of(cls, windower: Windower) -> CompiledWindows | None:
        """The engine beside ``windower``, or None: the install has no compiled module
        (or ``KERNELSTREAM_NATIVE=0``), or ``windower`` is a subclass whose in-order
        path the engine would not mirror."""
        core = native.core
        if core is None or type(windower) is not Windower:
            return None
        return cls(windower, core)

    # -- the steady path ----------------------------------------------------------

    def poll(
        self,
        values: list[bytes | None],
        keys: list[bytes | None],
        start: int,
        now: float,
        oldest: float,
        newest: float,
        max_bytes: int,
        stage_s: MutableMapping[str, float] | None = None,
    ) -> Taken:
        """Window a partition's messages from ``start``, up to the first the engine does
        not take (see :class:`Taken`; ``taken`` counts from ``start``); ``oldest`` and
        ``newest`` are the edge's event-time bounds, ``max_bytes`` its message size limit.
        ``stage_s``: seconds the engine took (reading, checking and windowing the messages
        and the closed windows' statistics, ``"window"``) and building the window records
        (``"close"``) are added to it."""
        t0 = time.perf_counter()
        taken, launches, rows, stop = self.engine.poll(
            values, keys, start, now, oldest, newest, max_bytes
        )
        t1 = time.perf_counter()
        self.windower.metrics.launches_in += launches
        closed = self._records(rows) if rows else []
        if stage_s is not None:
            stage_s["window"] = stage_s.get("window", 0.0) + t1 - t0
            stage_s["close"] = stage_s.get("close", 0.0) + time.perf_counter() - t1
        return Taken(taken, launches, closed, stop)

    def unregistered(self, values: list[Any], keys: list[Any], start: int) -> list[int]:
        """The indices from ``start`` of the binary batches whose header and key the
        engine was not given (where :meth:`poll` would stop, ``unregistered``)."""
        return self.engine.unregistered(values, keys, start)

    def _records(self, rows: list[Any]) -> list[WindowAggregate | Written]:
        """The window records of the engine's closed windows (``_aggregate_acc``'s), or,
        of a series it writes (:meth:`learn`), what it wrote (:class:`Written`)."""
        size = self.windower.spec.size_s
        templates = self._templates
        out: list[WindowAggregate | Written] = []
        for row in rows:
            if len(row) == _WRITTEN_ROW:
                out.append(Written._make(row))
                continue
            stream, window, config_id, meta, failures, late, seq_min, seq_max, got, cols = row
            if got is None:  # no launch that ran: NumPy decides, as window_figures does
                count, figures = window_figures([cols[0]], [cols[1]], size)
            else:
                count, total, mean, std, idle, p50, p95, d_min, d_max = got
                figures = WindowFigures.compiled(
                    total, mean, std, idle, p50, p95, d_min, d_max, size
                )
            counts = (count, failures, late, seq_min, seq_max)
            agg = build_window(templates[meta], config_id, window, size, counts, figures)
            out.append(agg)
            if got is None or not self.learning:
                continue
            if (stream, meta, config_id) not in self._unwritable:
                self._fresh.append((agg, meta, window, (failures, late, seq_min, seq_max), got))
        self.windower.metrics.windows_emitted += len(out)
        return out

    # -- windows and findings written here ------------------------------------------

    def learn_from(
        self,
        detector: Detector,
        group_of: Callable[[WindowAggregate], bytes],
        writable: Callable[[WindowAggregate], bool],
    ) -> None:
        """Write the windows of the series ``detector`` judges, where this build writes
        (``learning``): after each series' first window (:meth:`learn`, which the caller
        calls with the same three after it has published windows), or from its first
        where its header is registered after this (:meth:`_write_from_start`)."""
        self.learning = self.can_write
        self._learner = (detector, group_of, writable)

    def learn(
        self,
        detector: Detector,
        group_of: Callable[[WindowAggregate], bytes],
        writable: Callable[[WindowAggregate], bool],
    ) -> int:
        """Hand the engine a writer (:func:`agents.logic.written.series_writer`) for each
        series of the windows it closed since the last call, which ``detector`` has just
        judged: the engine writes its later windows and their findings itself, and forms
        its regression baseline on from where the detector left it. ``group_of``: a
        window's findings message key; ``writable``: whether the series' findings may be
        written so (its stream has no host-side summary open, which the engine's writer
        does not know). The first writers, then one in :data:`CHECK_EVERY`, are kept only
        where a writer of the series wrote the window they were learnt from as the Python
        path did, from the baseline as it was before that window (else the series stays
        on the Python path; each reason logged once). Returns how many series it left on
        the Python path."""
        self._learner = (detector, group_of, writable)
        fresh, self._fresh = self._fresh, []
        # a series' last window only (two closed in one poll: the baseline is past both)
        last = {(agg.stream_key, meta, agg.config_id): i for i, (agg, meta, *_) in enumerate(fresh)}
        unwritten = 0
        size = self.windower.spec.size_s
        for series, i in last.items():
            agg, meta, window, counts, got = fresh[i]
            if series in self._unwritable or not writable(agg):
                continue
            template, group = self._templates[meta], group_of(agg)
            try:
                baseline = detector.baseline_state(agg)
                self.learnt += 1
                checked = _checked(self.learnt) or series in self._to_check
                self._to_check.discard(series)
                # checked: the writer from the baseline before the window, which writing
                # the window brings to the detector's
                start = detector.baseline_state(agg, before=True) if checked else baseline
                writer = series_writer(agg, template, detector, group, size, start)
                if checked:
                    wrote = writer.write(window, counts, got)
                    if wrote is not None and (
                        wrote != (encode(agg), *detector.classify_wire_as(agg, start))
                        or writer.baseline != baseline
                    ):
                        raise UnwritableError(
                            "the engine wrote the window or its finding otherwise"
                        )
                    if wrote is None and start != baseline:
                        # a window the Python path writes (not judged), which fed it
                        writer = series_writer(agg, template, detector, group, size, baseline)
            except UnwritableError as ex:
                if len(self._unwritable) >= MAX_UNWRITABLE:
                    self._unwritable.clear()
                self._unwritable.add(series)
                unwritten += 1
                why = str(ex)
                if why not in self._told:  # once a reason: it is likely every series'
                    if len(self._told) < MAX_UNWRITABLE:
                        self._told.add(why)
                    log.warning(
                        "the windows of %s with %s stay on the Python path (and those of "
                        "any other series for the same reason, counted in "
                        "window.unwritten_series, not logged): %s",
                        agg.stream_key,
                        agg.config_id,
                        why,
                    )
                continue
            self.engine.write_as(agg.stream_key, meta, agg.config_id, writer)
        return unwritten

    def writing(self) -> int:
        """The series of the streams held whose windows the engine writes."""
        return int(self.engine.writing())

    # -- handing streams over -----------------------------------------------------

    def take(self, cols: LaunchColumns, value: bytes, key: bytes | None) -> bool:
        """After the worker's decoder passed ``cols`` from the message (``value``,
        ``key``): register its header bytes under that key and take its stream over from
        the Windower, where the engine windows such batches. False (nothing changed)
        for a batch with device samples or host telemetry, one not in the binary layout,
        and a stream with a window holding device samples."""
        if cols.meta.samples or cols.host_gap_us is not None or cols.copies is not None:
            return False
        header = self.engine.header_of(value)
        if header is None:
            return False
        stream = cols.stream_key
        if not self.engine.holds(stream):
            st = self.windower._keys.get(stream)
            if st is not None and any(acc.device is not None for acc in st.open.values()):
                return False
            self._adopt(stream, st)
        meta = self._index(_meta(cols.meta))
        self.engine.register(header, key, stream, cols.meta.config_id, meta)
        if self._learner is not None and self.learning:
            if len(self.registered) >= MAX_UNWRITABLE:
                self.registered.clear()
            self.registered[(stream, meta, cols.meta.config_id)] = None
        return True

    def write_registered(self) -> None:
        """Hand the engine a writer for each series whose header :meth:`take` registered
        since the last call, so that it writes the series' first window and finding too
        (else the Python detector judges that window and :meth:`learn` builds the writer
        after it). Call it where every window closed so far has been published: a writer
        starts from the detector's baseline of its series, which the windows of the poll
        feed when they are published."""
        pending, self.registered = self.registered, {}
        for series in pending:
            self._write_from_start(*series)

    def _write_from_start(self, stream: str, meta: int, config_id: str) -> None:
        """A writer for a series registered, from the detector's baseline of it, as
        :meth:`learn` would build one after its first window. The first
        :data:`CHECK_FIRST` of these series and one in :data:`CHECK_EVERY` after are left
        to learn(), which checks its writer on their first window; nor is a series the
        engine writes already (learnt meanwhile, or under another header)."""
        if self._learner is None:
            return
        series = (stream, meta, config_id)
        if (
            not self._from_start_ok
            or series in self._unwritable
            or self.engine.writes(stream, config_id)
        ):
            return
        self._registered_series += 1
        if _checked(self._registered_series):
            if len(self._to_check) >= MAX_UNWRITABLE:
                self._to_check.clear()
            self._to_check.add(series)
            return
        detector, group_of, writable = self._learner
        size = self.windower.spec.size_s
        template = self._templates[meta]
        # A window record of the series: the writer takes its constant fields, and its
        # figures only as the places where each window's go.
        agg = build_window(template, config_id, 0, size, (1, 0, 0, 0, 0), _PLACEHOLDER)
        if not writable(agg):
            return
        try:
            writer = series_writer(
                agg, template, detector, group_of(agg), size, detector.baseline_state(agg)
            )
        except UnwritableError:
            return  # learn() meets the reason again after the series' first window, and says it
        if self.engine.write_as(stream, meta, config_id, writer):
            self.from_start += 1

    def _adopt(self, stream: str, st: _KeyState | None) -> None:
        if st is None:
            self.engine.adopt(stream, -math.inf, -math.inf, None, -1, [])
            return
        windows = [
            (
                window,
                config_id,
                self._index(acc.meta),
                _cat(acc.t_end, np.float64),
                _cat(acc.duration_us, np.float64),
                acc.failures,
                acc.late_accepted,
                acc.seq_min,
                acc.seq_max,
            )
            for (window, config_id), acc in st.open.items()
        ]
        self.engine.adopt(stream, st.max_t, st.last_seen, st.closed_below, st.seq_hi, windows)
        del self.windower._keys[stream]

    def release(self, streams: Iterable[str]) -> None:
        """Give the state of ``streams`` the engine holds back to the Windower."""
        for stream in streams:
            got = self.engine.release(stream)
            if got is not None:
                self.windower._keys[stream] = self._key_state(got)

    def release_all(self) -> None:
        self.release(self.engine.held())

    def release_idle(self, now: float, read_through: Callable[[str], float] | None) -> None:
        """Give back the streams :meth:`Windower.flush_idle` would flush (the same rule):
        it flushes them."""
        idle = self.windower.spec.idle_timeout_s
        self.release(
            key
            for key, last_seen in self.engine.last_seen()
            if (now if read_through is None else min(now, read_through(key))) - last_seen >= idle
        )

    def export_keys(self, keys: Iterable[str]) -> dict[str, Any]:
        """:meth:`Windower.export_keys` (``arrays=True``) of ``keys``, those the engine
        holds copied from it (it goes on holding them)."""
        keys = list(keys)
        held = {}
        for key in keys:
            got = self.engine.export(key)
            if got is not None:
                held[key] = self._key_state(got)
        out = self.windower.export_keys([k for k in keys if k not in held], arrays=True)
        if held:
            copy = Windower(self.windower.spec)
            copy._keys = held
            out.update(copy.export_keys(held, arrays=True))
        return out

    def open_windows(self) -> int:
        return int(self.engine.open_windows())

    def _key_state(self, got: tuple[Any, ...]) -> _KeyState:
        max_t, last_seen, closed_below, seq_hi, windows = got
        st = _KeyState(max_t=max_t, last_seen=last_seen, closed_below=closed_below, seq_hi=seq_hi)
        for window, config_id, meta, t, d, failures, late, seq_min, seq_max in windows:
            st.open[(window, config_id)] = _Acc(
                meta=self._metas[meta],
                t_end=[t],
                duration_us=[d],
                failures=failures,
                late_accepted=late,
                seq_min=seq_min,
                seq_max=seq_max,
            )
        return st

    def _index(self, meta: Mapping[str, Any]) -> int:
        """The index of per-batch fields equal to ``meta`` (kept if new: one per distinct
        stream and configuration a worker has windowed here)."""
        ident = orjson.dumps(meta, option=orjson.OPT_SORT_KEYS)
        at = self._meta_index.get(ident)
        if at is None:
            at = self._meta_index[kept_bytes(ident)] = self._next_meta
            self._next_meta += 1
            self._metas[at] = dict(meta)
            self._templates[at] = window_template(meta)
        return at

    def metas_kept(self) -> int:
        """The series whose per-batch fields the index keeps."""
        return len(self._metas)

    def forget_unused(self) -> int:
        """Forget the per-batch fields of the series nothing uses any more, once
        :data:`MAX_METAS` of them are kept: those with no window open in the engine and
        no writer, and not waiting here (for :meth:`learn` or :meth:`write_registered`).
        The engine forgets their headers with them, so a batch of such a series (a
        configuration its stream comes back to) is decoded and registered again. Call it
        where every window closed so far is published (as :meth:`write_registered`).
        Returns how many were forgotten.

        Each series of a tuning fleet (a stream in a configuration: every move the tuner
        makes starts one) is indexed once here; kept for good, the series of a fleet
        that keeps retuning would grow the worker without end
        (``kernelstream bench worker-path --config-every``). An engine build without
        ``retain_metas`` keeps them all, as it always did."""
        if len(self._metas) < self._metas_bound or not self._can_forget:
            return 0
        keep = {meta for _, meta, _ in self.registered}
        keep.update(meta for _, meta, *_ in self._fresh)
        live = set(self.engine.retain_metas(list(keep)))
        gone = [m for m in self._metas if m not in live]
        for m in gone:
            del self._metas[m], self._templates[m]
        self._meta_index = {k: m for k, m in self._meta_index.items() if m in live}
        # not again before as many more are kept as are in use (a worker of more streams
        # than the bound would otherwise look at every poll)
        self._metas_bound = max(MAX_METAS, 2 * len(self._metas))
        return len(gone)
