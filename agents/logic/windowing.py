"""Event-time tumbling windows with a watermark, allowed lateness and idleness.

One :class:`Windower` owns the windows of many stream keys (``node:device/kernel``).
Within a window it keeps one accumulator per config id, because a node may switch
configuration mid-window and the two halves must not be averaged together.

Semantics, per stream key (the same as processing the launches one by one, in
batch order, even though :meth:`Windower.add` works on whole columns):

* the watermark before a launch is the largest event time seen before it minus
  ``out_of_orderness_s``;
* a window ``[start, end)`` is complete once the watermark is ``>= end +
  allowed_lateness_s``; a launch whose window is complete (or was already emitted,
  e.g. by an idle flush) is *too late* and is handed back for the late topic;
* a launch older than the watermark whose window is still open is accepted and
  counted as ``late_accepted``.

For example (indented, so the API reference shows it as code):

    >>> w = Windower(WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.0))
    >>> w.add(make_example_batch([0.1, 0.5, 1.2]), now=0.0) is None
    True
    >>> [(a.window_start, a.count) for a in w.poll(now=0.0)]
    [(0.0, 2)]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from kernelstream.agents.logic.errors import LogicSettingsError, SnapshotError
from kernelstream.agents.logic.ratios import finite_ratio
from kernelstream.agents.logic.sequencing import SEQ_BOUND
from kernelstream.schemas import native
from kernelstream.schemas.columnar import LaunchColumns
from kernelstream.schemas.records import DeviceSample, LaunchBatch, WindowAggregate

__all__ = [
    "InOrderRun",
    "LaunchRow",
    "WindowSpec",
    "Windower",
    "WindowerMetrics",
    "aggregate_reference",
    "launch_rows",
    "make_example_batch",
    "percentiles",
]

_SNAPSHOT_VERSION = 2
# Version 1 also stored every launch's sequence number; restoring it ignores them.
_READABLE_VERSIONS = (1, 2)

# Per-batch constants copied into every aggregate. Taken from the first batch of a
# (window, config): within one config these describe the same launch geometry.
_META_FIELDS = (
    "node",
    "device_index",
    "device_model",
    "kernel",
    "workload",
    "problem_size",
    "config",
    "bytes_moved",
    "flops",
    "occupancy",
    "resources_source",
    "waves",
    "peak_gbs",
    "peak_gflops",
    "launch_overhead_us",
)

_F64 = npt.NDArray[np.float64]
_I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class WindowSpec:
    """Tumbling event-time windows and how long to wait for stragglers.

    Args:
        size_s: window length in event-time seconds.
        out_of_orderness_s: the watermark trails the largest event time by this much.
        allowed_lateness_s: a window is emitted once the watermark passes its end plus this.
        idle_timeout_s: a key that received nothing for this long (processing time) has
            its open windows flushed, so a stopped kernel still yields its last windows
            (the worker counts only time in which it had read its input up to date:
            :meth:`Windower.flush_idle`).
    """

    size_s: float = 1.0
    out_of_orderness_s: float = 0.2
    allowed_lateness_s: float = 0.5
    idle_timeout_s: float = 3.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.size_s) and self.size_s > 0):
            raise LogicSettingsError(f"WindowSpec.size_s must be > 0, got {self.size_s!r}")
        for name in ("out_of_orderness_s", "allowed_lateness_s", "idle_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise LogicSettingsError(f"WindowSpec.{name} must be >= 0, got {value!r}")

    def window_of(self, t: float) -> int:
        """Index of the window holding event time ``t`` (``t`` on a boundary opens the next)."""
        return math.floor(t / self.size_s)

    def closes_by(self, window: int, watermark: float) -> bool:
        """Whether ``watermark`` completes window ``window``.

        Written as the exact expression :meth:`Windower.add` vectorizes, so the
        per-record reference and the batched path agree bit for bit.
        """
        return (window + 1) * self.size_s + self.allowed_lateness_s <= watermark


@dataclass
class WindowerMetrics:
    """Counters; ``launches_in == counted in windows + late_dropped_to_topic`` always."""

    launches_in: int = 0
    late_dropped_to_topic: int = 0
    late_accepted: int = 0
    windows_emitted: int = 0


@dataclass
class _Acc:
    """Launches of one (key, window, config). Only successful launches keep arrays.

    Chunks are appended in arrival order, which is sequence order: a stream's batches
    are numbered without gaps and callers drop resent ones (:meth:`Windower.seen_through`),
    and a batch's rows go in batch order. So per-launch sequence numbers need not be
    kept: where they break ties (equal end times), arrival order is the same order.
    """

    meta: dict[str, Any]
    t_end: list[_F64] = field(default_factory=list)
    duration_us: list[_F64] = field(default_factory=list)
    failures: int = 0
    late_accepted: int = 0
    seq_min: int = -1
    seq_max: int = -1
    device: _DeviceAcc | None = None  # the device samples that fell in the window

    def add_seq_range(self, lo: int, hi: int) -> None:
        self.seq_min = lo if self.seq_min < 0 else min(self.seq_min, lo)
        self.seq_max = max(self.seq_max, hi)


@dataclass
class _DeviceAcc:
    """Device samples of one window: few per window (one every few seconds per device)."""

    samples: int = 0
    clock_sum: float = 0.0
    clocks: int = 0
    mem_max: float | None = None

    def add(self, sample: DeviceSample) -> None:
        self.samples += 1
        if sample.sm_clock_mhz is not None:
            self.clock_sum += sample.sm_clock_mhz
            self.clocks += 1
        if sample.mem_used_bytes is not None:
            self.mem_max = max(self.mem_max or 0.0, sample.mem_used_bytes)

    def fields(self) -> dict[str, Any]:
        """The window record's version-2 fields."""
        return {
            "device_samples": self.samples,
            "sm_clock_mean_mhz": self.clock_sum / self.clocks if self.clocks else None,
            "mem_used_max_bytes": self.mem_max,
        }


@dataclass
class _KeyState:
    max_t: float = -math.inf
    last_seen: float = -math.inf
    # Every window index below this has been emitted; launches for them are too late.
    closed_below: int | None = None
    # Highest sequence number ingested (counted or handed back as too late): a batch at
    # or below it is a duplicate delivery (see Windower.seen_through).
    seq_hi: int = -1
    open: dict[tuple[int, str], _Acc] = field(default_factory=dict)


class Windower:
    """Tumbling event-time windows over launch batches, keyed by stream key.

    Drive it with :meth:`add` for every batch and :meth:`poll` whenever convenient
    (after each batch, or on a timer); call :meth:`flush_all` at end of input.
    """

    def __init__(self, spec: WindowSpec | None = None) -> None:
        self.spec = spec or WindowSpec()
        self.metrics = WindowerMetrics()
        self._keys: dict[str, _KeyState] = {}
        # Open windows of the streams another holder windows (the compiled engine,
        # :mod:`agents.logic.compiled_windows`), counted by :meth:`open_windows`.
        self.held_elsewhere: Callable[[], int] | None = None

    # -- ingest ---------------------------------------------------------------

    def add(self, batch: LaunchBatch, now: float) -> LaunchBatch | None:
        """Ingest one batch; return its too-late launches for the late topic, or None.

        ``now`` is processing time (for idleness only). Launches of one device complete
        in order, so the too-late ones are a prefix of the batch and ``seq_start + row``
        numbers them exactly. Should they not be contiguous (a reordered batch), they
        are still all returned, but only :meth:`add_runs` keeps their sequence numbers.
        """
        runs = self.add_runs(batch, now)
        if not runs:
            return None
        if len(runs) == 1:
            return runs[0]
        return runs[0].model_copy(
            update={
                "t_end": [t for r in runs for t in r.t_end],
                "duration_us": [d for r in runs for d in r.duration_us],
                "ok": [o for r in runs for o in r.ok],
            }
        )

    def add_runs(self, batch: LaunchBatch, now: float) -> list[LaunchBatch]:
        """Like :meth:`add`, but one late batch per contiguous run of too-late rows."""
        return self.add_columns(LaunchColumns.from_batch(batch), now)

    def add_columns(self, cols: LaunchColumns, now: float) -> list[LaunchBatch]:
        """The worker's hot path: :meth:`add_runs` for a batch decoded straight to arrays.

        Work is per batch and per window, never per launch: a batch in completion
        order (the normal case) needs a handful of array operations, and one that
        falls in a single window needs none on the launches at all.
        """
        late = self._add_launches(cols, now)
        if cols.meta.samples and sum(len(b.t_end) for b in late) < len(cols):
            self._add_samples(cols.meta)
        return late

    def add_in_order(self, run: Sequence[LaunchColumns], now: float) -> list[str] | None:
        """:meth:`add_columns` of each batch of ``run``, in order; the stream keys they
        touched, in order of first appearance. None, having changed nothing, where a
        batch has a launch on a window edge that float rounding blurs (``floor(t / size)``
        says one window, ``(window + 1) * size`` computes its end at or below the launch):
        :meth:`add_columns` then judges it launch by launch (:meth:`InOrderRun.flush`).

        Only for batches an :class:`InOrderRun` took: each continues its stream exactly
        (end times in completion order, none before a launch counted earlier, none in a
        window already emitted; no device samples), so none is late and what is left of
        :meth:`add_columns` is its in-order path without its checks: per batch, the
        windows of its two ends, and each window's slice of its columns (views, no
        launch copied) appended to the window's accumulator. The windows, the state and
        every counter come out exactly as batch by batch
        (``tests/unit/agents/test_in_order_run.py``).
        """
        size = self.spec.size_s
        plan: list[tuple[int, float, list[tuple[int, int, int]] | None]] = []
        for c in run:
            lo, hi = c.t_range()
            first, last = math.floor(lo / size), math.floor(hi / size)
            if not hi < (last + 1) * size:
                return None
            cuts = None
            if first != last:
                cuts = _window_cuts(c.t_end, first, last, size)
                if cuts is None:
                    return None
            plan.append((first, hi, cuts))
        keys = self._keys
        launches = 0
        for c, (first, hi, cuts) in zip(run, plan, strict=True):
            key = c.stream_key
            st = keys.get(key)
            if st is None:
                st = keys[key] = _KeyState()
            meta, t = c.meta, c.t_end
            n = t.size
            launches += n
            st.last_seen = now
            st.seq_hi = max(st.seq_hi, meta.seq_start + n - 1)
            st.max_t = max(st.max_t, hi)
            all_ok = bool(c.known_all_ok)
            if cuts is None:
                self._add_slice(st, meta, first, t, c.duration_us, c.ok, 0, 0, all_ok)
                continue
            d, ok = c.duration_us, c.ok
            for window, a, z in cuts:
                self._add_slice(st, meta, window, t[a:z], d[a:z], ok[a:z], a, 0, all_ok)
        self.metrics.launches_in += launches
        return list(dict.fromkeys(c.stream_key for c in run))

    def _add_samples(self, batch: LaunchBatch) -> None:
        """Each of the batch's device samples into the window of its time, or, where the
        stream has no open window then (a sample taken between two batches), into the
        latest open window of the batch's configuration. Samples of a batch whose
        launches were all too late go with them to the late topic."""
        st = self._keys[batch.stream_key]
        mine = [w for (w, c) in st.open if c == batch.config_id]
        if not mine:
            return
        latest = max(mine)
        for sample in batch.samples:
            acc = st.open.get((self.spec.window_of(sample.t), batch.config_id))
            if acc is None:
                acc = st.open[(latest, batch.config_id)]
            if acc.device is None:
                acc.device = _DeviceAcc()
            acc.device.add(sample)

    def _add_launches(self, cols: LaunchColumns, now: float) -> list[LaunchBatch]:
        batch, t, key = cols.meta, cols.t_end, cols.stream_key
        n = t.size
        st = self._keys.get(key)
        if st is None:
            st = self._keys[key] = _KeyState()
        st.last_seen = now
        st.seq_hi = max(st.seq_hi, batch.seq_start + n - 1)
        self.metrics.launches_in += n
        if n > 1 and not (cols.known_in_order or bool((t[1:] >= t[:-1]).all())):
            return self._add_unordered(st, cols)
        spec = self.spec
        size = spec.size_s
        # In completion order the largest time seen before launch i is max(st.max_t,
        # t[i-1]) and t[i-1] < end of launch i's window, so only st.max_t can make a
        # launch too late, and only the first window can be affected first.
        watermark0 = st.max_t - spec.out_of_orderness_s
        t_first, t_last = float(t[0]), float(t[-1])
        first = math.floor(t_first / size)
        last = math.floor(t_last / size)
        if (
            spec.closes_by(first, watermark0)
            or (st.closed_below is not None and first < st.closed_below)
            or not t_last < (last + 1) * size  # float rounding at an edge
        ):
            return self._add_unordered(st, cols)  # some launches too late: general path
        cuts = None
        if first != last:
            cuts = _window_cuts(t, first, last, size)
            if cuts is None:  # float rounding at an inner edge: general path
                return self._add_unordered(st, cols)
        late_ok = int(np.searchsorted(t, watermark0, side="left")) if watermark0 > t_first else 0
        st.max_t = max(st.max_t, t_last)
        self.metrics.late_accepted += late_ok
        all_ok = bool(cols.known_all_ok)
        if cuts is None:
            self._add_slice(st, batch, first, t, cols.duration_us, cols.ok, 0, late_ok, all_ok)
            return []
        for window, lo, hi in cuts:
            self._add_slice(
                st,
                batch,
                window,
                t[lo:hi],
                cols.duration_us[lo:hi],
                cols.ok[lo:hi],
                lo,
                max(0, min(late_ok, hi) - lo),
                all_ok,
            )
        return []

    def _add_slice(
        self,
        st: _KeyState,
        batch: LaunchBatch,
        window: int,
        t: _F64,
        dur: _F64,
        ok: npt.NDArray[np.bool_],
        row: int,
        late_accepted: int,
        all_ok: bool = False,
    ) -> None:
        """Launches of one window, in batch order: rows ``row`` .. ``row + t.size - 1``
        (``all_ok``: the decoder found that every launch of the batch ran)."""
        key = (window, batch.config_id)
        acc = st.open.get(key)
        if acc is None:
            acc = st.open[key] = _Acc(meta=_meta(batch))
        n_ok = t.size if all_ok else int(np.count_nonzero(ok))
        if n_ok == t.size:
            acc.t_end.append(t)
            acc.duration_us.append(dur)
        else:
            acc.t_end.append(t[ok])
            acc.duration_us.append(dur[ok])
        acc.failures += int(t.size - n_ok)
        acc.late_accepted += late_accepted
        first = batch.seq_start + row
        acc.add_seq_range(first, first + t.size - 1)

    def _add_unordered(self, st: _KeyState, cols: LaunchColumns) -> list[LaunchBatch]:
        """General path: launches out of completion order, or some of them too late."""
        spec = self.spec
        batch, t, dur, ok = cols.meta, cols.t_end, cols.duration_us, cols.ok
        n = t.size
        seq = batch.seq_start + np.arange(n, dtype=np.int64)
        idx = np.floor(t / spec.size_s).astype(np.int64)
        # Largest event time seen *before* each launch: a prefix maximum reproduces
        # per-record watermark semantics without a Python loop.
        seen = np.empty(n, dtype=np.float64)
        seen[0] = st.max_t
        if n > 1:
            np.maximum(np.maximum.accumulate(t[:-1]), st.max_t, out=seen[1:])
        watermark = seen - spec.out_of_orderness_s
        too_late = (idx + 1) * spec.size_s + spec.allowed_lateness_s <= watermark
        if st.closed_below is not None:
            too_late |= idx < st.closed_below
        late_ok = (t < watermark) & ~too_late
        st.max_t = max(st.max_t, float(t.max()))

        keep = ~too_late
        if keep.all():
            self._accumulate(st, batch, idx, t, dur, ok, seq, late_ok)
        elif keep.any():
            self._accumulate(
                st, batch, idx[keep], t[keep], dur[keep], ok[keep], seq[keep], late_ok[keep]
            )
        self.metrics.late_accepted += int(late_ok.sum())
        return self._late_batches(cols, too_late)

    def _accumulate(
        self,
        st: _KeyState,
        batch: LaunchBatch,
        idx: _I64,
        t: _F64,
        dur: _F64,
        ok: npt.NDArray[np.bool_],
        seq: _I64,
        late_ok: npt.NDArray[np.bool_],
    ) -> None:
        # Stable sort keeps batch order inside a window; a batch spans few windows,
        # so the loop below runs per window, not per launch.
        order = np.argsort(idx, kind="stable")
        idx_sorted = idx[order]
        cuts = np.flatnonzero(np.diff(idx_sorted)) + 1
        bounds = zip(
            np.concatenate(([0], cuts)), np.concatenate((cuts, [idx_sorted.size])), strict=True
        )
        for lo, hi in bounds:
            sel = order[lo:hi]
            key = (int(idx_sorted[lo]), batch.config_id)
            acc = st.open.get(key)
            if acc is None:
                acc = st.open[key] = _Acc(meta=_meta(batch))
            sel_ok = ok[sel]
            acc.t_end.append(t[sel][sel_ok])
            acc.duration_us.append(dur[sel][sel_ok])
            acc.failures += int(sel_ok.size - np.count_nonzero(sel_ok))
            acc.late_accepted += int(np.count_nonzero(late_ok[sel]))
            acc.add_seq_range(int(seq[sel].min()), int(seq[sel].max()))

    def _late_batches(
        self, cols: LaunchColumns, too_late: npt.NDArray[np.bool_]
    ) -> list[LaunchBatch]:
        if not too_late.any():
            return []
        n_late = int(np.count_nonzero(too_late))
        self.metrics.late_dropped_to_topic += n_late
        if n_late == too_late.size:
            return [cols.to_batch()]
        pos = np.flatnonzero(too_late)
        runs = np.split(pos, np.flatnonzero(np.diff(pos) != 1) + 1)
        out = []
        for run in runs:
            a, b = int(run[0]), int(run[-1]) + 1
            # Device samples describe the whole batch, which was partly accepted: they
            # stay with no late slice rather than being duplicated.
            out.append(
                cols.meta.model_copy(
                    update={
                        "t_end": cols.t_end[a:b].tolist(),
                        "duration_us": cols.duration_us[a:b].tolist(),
                        "ok": cols.ok[a:b].astype(int).tolist(),
                        "seq_start": cols.meta.seq_start + a,
                        "samples": [],
                    }
                )
            )
        return out

    # -- emit -----------------------------------------------------------------

    def seen_through(self, key: str) -> int:
        """Highest sequence number of ``key`` ingested so far (-1 if none).

        A node numbers each stream's launches without gaps or reuse and sends a
        stream's batches in order, so a batch with ``seq_start <= seen_through(key)``
        was delivered before (a resent copy, a replay after a crash, an offset reset):
        adding it again would count its launches twice. The state is part of
        :meth:`snapshot`, so the check survives a restore.

        >>> w = Windower()
        >>> _ = w.add(make_example_batch([0.1, 0.2], seq_start=5), now=0.0)
        >>> w.seen_through("n1:0/saxpy"), w.seen_through("other")
        (6, -1)
        """
        st = self._keys.get(key)
        return -1 if st is None else st.seq_hi

    def counted_whole(self, cols: LaunchColumns) -> bool:
        """Whether every launch of ``cols`` is already counted (its stream counted through
        its last sequence number): what a run that failed part way had counted.

        >>> w = Windower()
        >>> c = LaunchColumns.from_batch(make_example_batch([0.1, 0.2], seq_start=5))
        >>> w.counted_whole(c), w.add_columns(c, now=0.0) == [], w.counted_whole(c)
        (False, True, True)
        """
        return self.seen_through(cols.stream_key) >= cols.meta.seq_start + len(cols) - 1

    def newest_event_time(self, key: str) -> float:
        """Largest event time of ``key`` ingested so far (-inf if none)."""
        st = self._keys.get(key)
        return -math.inf if st is None else st.max_t

    def stream_tail(self, key: str) -> tuple[int, float, int | None]:
        """:meth:`seen_through`, :meth:`newest_event_time` and the first window of ``key``
        not yet emitted (None: none emitted), in one lookup: what
        :meth:`InOrderRun.take` judges a batch against.

        >>> w = Windower()
        >>> _ = w.add(make_example_batch([0.1, 0.2], seq_start=5), now=0.0)
        >>> w.stream_tail("n1:0/saxpy"), w.stream_tail("other")
        ((6, 0.2, None), (-1, -inf, None))
        """
        st = self._keys.get(key)
        return (-1, -math.inf, None) if st is None else (st.seq_hi, st.max_t, st.closed_below)

    def poll(self, now: float) -> list[WindowAggregate]:
        """Windows completed by the watermark plus idle flushes, each exactly once.

        Sorted by (stream key, window start, config id).
        """
        out: list[WindowAggregate] = []
        for key, st in self._keys.items():
            watermark = st.max_t - self.spec.out_of_orderness_s
            ready = [k for k in st.open if self.spec.closes_by(k[0], watermark)]
            out.extend(self._emit(key, st, ready))
        out.extend(self.flush_idle(now))
        return _sorted(out)

    def poll_key(self, key: str) -> list[WindowAggregate]:
        """Windows of one stream key completed by its watermark (after a batch of that key).

        Only the key that just received launches can have a new watermark, so the
        worker polls that key per batch and leaves idle flushes to a timer.
        """
        st = self._keys.get(key)
        if st is None or not st.open:
            return []
        watermark = st.max_t - self.spec.out_of_orderness_s
        ready = [k for k in st.open if self.spec.closes_by(k[0], watermark)]
        return _sorted(self._emit(key, st, ready)) if ready else []

    def flush_idle(
        self, now: float, read_through: Callable[[str], float] | None = None
    ) -> list[WindowAggregate]:
        """Emit every open window of keys idle (processing time) for ``idle_timeout_s``.

        ``read_through(key)``, where given, is the processing time up to which
        everything sent on the key's input had been read (a consumer that had caught up
        with its partition then): a key is idle only for the time its input was read
        that far. A reader that is behind, or was paused, has not seen what the key's
        node sent meanwhile, and flushing then would cut the key's windows short and
        send the rest of their launches to the late topic.

        >>> w = Windower(WindowSpec(idle_timeout_s=3.0))
        >>> _ = w.add(make_example_batch([0.1, 0.2]), now=10.0)
        >>> len(w.flush_idle(20.0, read_through=lambda key: 11.0))  # read only until 11
        0
        >>> len(w.flush_idle(20.0, read_through=lambda key: 13.5))
        1
        """
        out: list[WindowAggregate] = []
        idle = self.spec.idle_timeout_s
        for key, st in self._keys.items():
            if not st.open:
                continue
            until = now if read_through is None else min(now, read_through(key))
            if until - st.last_seen >= idle:
                out.extend(self._emit(key, st, list(st.open)))
        return _sorted(out)

    def flush_all(self) -> list[WindowAggregate]:
        """Emit every open window (end of input, e.g. the end of a replay range)."""
        out: list[WindowAggregate] = []
        for key, st in self._keys.items():
            out.extend(self._emit(key, st, list(st.open)))
        return _sorted(out)

    def _emit(
        self, key: str, st: _KeyState, ready: Sequence[tuple[int, str]]
    ) -> list[WindowAggregate]:
        out = []
        for window, config_id in ready:
            acc = st.open.pop((window, config_id))
            out.append(_aggregate_acc(acc, window, config_id, self.spec.size_s))
            if st.closed_below is None or window + 1 > st.closed_below:
                st.closed_below = window + 1
        self.metrics.windows_emitted += len(out)
        return out

    def open_windows(self) -> int:
        """Number of (key, window, config) accumulators currently open."""
        elsewhere = self.held_elsewhere() if self.held_elsewhere is not None else 0
        return sum(len(st.open) for st in self._keys.values()) + elsewhere

    # -- state ----------------------------------------------------------------

    def snapshot(self, *, arrays: bool = False) -> dict[str, Any]:
        """JSON-able state; :meth:`restore` of it continues exactly where this left off.

        With ``arrays=True`` the launch columns stay NumPy arrays (for
        :func:`agents.logic.snapshot_codec.pack`, which stores them as raw bytes).
        """
        keys: dict[str, Any] = {}
        for key, st in self._keys.items():
            keys[key] = {
                "max_t": _finite_or_none(st.max_t),
                "last_seen": _finite_or_none(st.last_seen),
                "closed_below": st.closed_below,
                "seq_hi": st.seq_hi,
                "windows": [
                    {
                        "window": window,
                        "config_id": config_id,
                        "meta": acc.meta,
                        **_columns(acc, arrays),
                        "failures": acc.failures,
                        "late_accepted": acc.late_accepted,
                        "seq_min": acc.seq_min,
                        "seq_max": acc.seq_max,
                        **({"device": asdict(acc.device)} if acc.device else {}),
                    }
                    for (window, config_id), acc in st.open.items()
                ],
            }
        return {
            "version": _SNAPSHOT_VERSION,
            "spec": asdict(self.spec),
            "metrics": asdict(self.metrics),
            "keys": keys,
        }

    def export_keys(self, keys: Iterable[str], *, arrays: bool = False) -> dict[str, Any]:
        """Snapshot of some keys only (a partition handed to another worker)."""
        full = self._keys
        try:
            self._keys = {k: full[k] for k in keys if k in full}
            return dict(self.snapshot(arrays=arrays)["keys"])
        finally:
            self._keys = full

    def drop_keys(self, keys: Iterable[str]) -> None:
        """Forget keys without emitting their open windows (their new owner will)."""
        for k in keys:
            self._keys.pop(k, None)

    def import_keys(self, keys: Mapping[str, Any], now: float) -> None:
        """Adopt keys exported by :meth:`export_keys`; they count as seen at ``now``."""
        other = Windower.restore(
            {
                "version": _SNAPSHOT_VERSION,
                "spec": asdict(self.spec),
                "metrics": asdict(WindowerMetrics()),
                "keys": keys,
            }
        )
        for k, st in other._keys.items():
            st.last_seen = now  # a handover is not idleness
            self._keys[k] = st

    @classmethod
    def restore(cls, snapshot: Mapping[str, Any]) -> Windower:
        """Rebuild a windower from :meth:`snapshot` output."""
        if snapshot.get("version") not in _READABLE_VERSIONS:
            raise SnapshotError(
                f"windower snapshot version {snapshot.get('version')!r} is not one of "
                f"{_READABLE_VERSIONS}; discard it and replay the launches topic"
            )
        try:
            self = cls(WindowSpec(**snapshot["spec"]))
            self.metrics = WindowerMetrics(**snapshot["metrics"])
            for key, raw in snapshot["keys"].items():
                st = _KeyState(
                    max_t=_none_or(raw["max_t"], -math.inf),
                    last_seen=_none_or(raw["last_seen"], -math.inf),
                    closed_below=raw["closed_below"],
                    seq_hi=int(raw.get("seq_hi", -1)),
                )
                for w in raw["windows"]:
                    st.open[(int(w["window"]), str(w["config_id"]))] = _Acc(
                        meta=dict(w["meta"]),
                        t_end=[np.asarray(w["t_end"], dtype=np.float64)],
                        duration_us=[np.asarray(w["duration_us"], dtype=np.float64)],
                        failures=int(w["failures"]),
                        late_accepted=int(w["late_accepted"]),
                        seq_min=int(w["seq_min"]),
                        seq_max=int(w["seq_max"]),
                        device=_DeviceAcc(**w["device"]) if w.get("device") else None,
                    )
                self._keys[key] = st
        except (KeyError, TypeError, ValueError) as ex:
            raise SnapshotError(f"malformed windower snapshot: {ex!r}") from ex
        return self


# -- aggregate maths (batched) ------------------------------------------------


class InOrderRun:
    """Consecutive batches that each continue their stream exactly, windowed at once.

    Nearly every batch a worker reads is the next of its stream: sequence numbers right
    after the last ones counted, end times in completion order and at or after every
    launch counted before, in no window already emitted, and no device samples or host
    telemetry. Such a batch is never a duplicate, never implausible
    (:func:`agents.logic.sequencing.judge_sequence` counts it whole) and has nothing
    late. :meth:`take` says whether a batch is one (judged against the windower and the
    batches taken before it); :meth:`flush` windows the taken ones together
    (:meth:`Windower.add_in_order`). A batch it refuses goes the general way, after a
    flush, so that each stream's batches are still counted in order.
    """

    __slots__ = ("_tail", "batches", "windower")

    def __init__(self, windower: Windower) -> None:
        self.windower = windower
        self.batches: list[LaunchColumns] = []
        # stream key -> (last seq, latest end time, first window not emitted) after the
        # batches taken so far
        self._tail: dict[str, tuple[int, float, int | None]] = {}

    def __len__(self) -> int:
        return len(self.batches)

    def take(self, cols: LaunchColumns) -> bool:
        """Take ``cols`` into the run if it continues its stream exactly, else False."""
        n = cols.t_end.size
        meta = cols.meta
        if (
            n == 0
            or meta.samples
            or cols.host_gap_us is not None
            or cols.copies is not None
            or not (cols.known_in_order or n == 1)
        ):
            return False
        key = cols.stream_key
        tail = self._tail.get(key)
        if tail is None:
            tail = self.windower.stream_tail(key)
        seq_hi, max_t, closed_below = tail
        first = meta.seq_start
        last = first + n - 1
        if last >= SEQ_BOUND or (seq_hi >= 0 and first != seq_hi + 1):
            return False
        lo, hi = cols.t_range()
        if not lo >= max_t:
            return False
        if closed_below is not None and self.windower.spec.window_of(lo) < closed_below:
            return False
        self._tail[key] = (last, hi, closed_below)
        self.batches.append(cols)
        return True

    def flush(self, now: float) -> tuple[list[str], list[LaunchBatch]]:
        """Window the batches taken (:meth:`Windower.add_in_order`): the stream keys they
        touched and their too-late launches (none, but where float rounding blurs a
        window's edge and :meth:`Windower.add_columns` takes each batch). The run is
        empty afterwards, whatever happened."""
        batches, self.batches = self.batches, []
        self._tail.clear()
        keys = self.windower.add_in_order(batches, now)
        if keys is not None:
            return keys, []
        late = [x for c in batches for x in self.windower.add_columns(c, now)]
        return list(dict.fromkeys(c.stream_key for c in batches)), late


def _aggregate_acc(acc: _Acc, window: int, config_id: str, size_s: float) -> WindowAggregate:
    count, figures = window_figures(acc.t_end, acc.duration_us, size_s)
    return build_window(
        window_template(acc.meta),
        config_id,
        window,
        size_s,
        (count, acc.failures, acc.late_accepted, acc.seq_min, acc.seq_max),
        figures,
        acc.device.fields() if acc.device else None,
    )


def duration_stats(
    t_chunks: list[Any], d_chunks: list[Any], size_s: float
) -> tuple[int, dict[str, float]]:
    """The launches of a window and their duration statistics (mean, standard deviation,
    p50, p95, minimum, maximum, busy fraction, mean idle gap between launches), from its
    end-time and duration chunks in arrival order.

    The compiled pass (:mod:`schemas.native`, one call, no temporaries) where the install
    has it and it can promise NumPy's exact result; else :func:`duration_stats_numpy`.
    Both give the same numbers, bit for bit.
    """
    count, figures = window_figures(t_chunks, d_chunks, size_s)
    return count, figures.as_stats()


def window_figures(
    t_chunks: list[Any], d_chunks: list[Any], size_s: float
) -> tuple[int, WindowFigures]:
    """:func:`duration_stats` as the figures a window record takes (:func:`build_window`),
    without a dict of them in between on the compiled pass."""
    core = native.core
    if core is not None:
        try:
            got = core.window_stats(t_chunks, d_chunks, [50.0, 95.0])
        except (TypeError, ValueError):  # a chunk not contiguous, aligned, native float64
            got = None
        if got is not None:
            count, total, mean, std, idle, (p50, p95), d_min, d_max = got
            figures = WindowFigures.compiled(total, mean, std, idle, p50, p95, d_min, d_max, size_s)
            return count, figures
    count, stats = duration_stats_numpy(t_chunks, d_chunks, size_s)
    return count, WindowFigures.of(stats)


def busy_fraction(total_us: float, size_s: float) -> float:
    """The share of a window of ``size_s`` seconds its launches' ``total_us`` fill."""
    return total_us * 1e-6 / size_s


def duration_stats_numpy(
    t_chunks: list[Any], d_chunks: list[Any], size_s: float
) -> tuple[int, dict[str, float]]:
    """:func:`duration_stats` in NumPy: the reference the compiled pass is tested against."""
    t = _cat(t_chunks, np.float64)
    d = _cat(d_chunks, np.float64)
    stats: dict[str, float] = dict.fromkeys(_DURATION_STATS, 0.0)
    stats["busy_fraction"] = stats["idle_gap_mean_us"] = 0.0
    if d.size:
        # What d.mean() and d.std() compute, the same operations in the same order
        # (bit-identical), without their Python-level wrappers (np.add.reduce is what
        # ndarray.sum runs): a third of closing a 1,000-launch window (many small streams).
        total = float(_add(d))
        mean = total / d.size
        dev = d - mean
        np.multiply(dev, dev, out=dev)
        stats.update(
            duration_mean_us=mean,
            duration_std_us=math.sqrt(float(_add(dev)) / d.size),
            busy_fraction=busy_fraction(total, size_s),
        )
        if d.size > 1:
            # Gaps follow completion order; arrival (= sequence) order breaks ties
            # between equal end times, so a window in completion order needs no sort.
            if bool(_all(t[1:] >= t[:-1])):
                ts, ds = t, d
            else:
                order = np.argsort(t, kind="stable")
                ts, ds = t[order], d[order]
            # max(0, (t[i] - d[i] * 1e-6) - t[i-1]) in one buffer (a + -b is a - b exactly),
            # the deviations' (done with): each temporary of a large window is a fresh
            # allocation to fault in.
            gaps = np.multiply(ds[1:], -1e-6, out=dev[1:])
            gaps += ts[1:]
            gaps -= ts[:-1]
            np.maximum(gaps, 0.0, out=gaps)
            stats["idle_gap_mean_us"] = float(_add(gaps)) / gaps.size * 1e6
        # Last, as it reorders d when d is this function's own concatenation of the
        # window's chunks (a single chunk is a view of a message or a snapshot's array).
        (p50, p95), d_min, d_max = order_stats(d, (50.0, 95.0), overwrite=len(d_chunks) > 1)
        stats.update(
            duration_p50_us=p50,
            duration_p95_us=p95,
            duration_min_us=d_min,
            duration_max_us=d_max,
        )
    return int(d.size), stats


_DURATION_STATS = (
    "duration_mean_us",
    "duration_p50_us",
    "duration_p95_us",
    "duration_min_us",
    "duration_max_us",
    "duration_std_us",
)


class WindowTemplate(NamedTuple):
    """What every window of one stream's configuration holds whatever its launches: the
    record's fields in their order (:meth:`Record.template`) filled in with the batches'
    fields and the roofline's constants, and the numbers a window's placement divides."""

    state: dict[str, Any]
    bytes_moved: float
    flops: float
    peak_gbs: float
    peak_gflops: float


# The fields a window's build gives (Record.computed counts them as set): all but the
# schema's and the device samples' (given where the window has samples).
_WINDOW_FIELDS_SET = frozenset(WindowAggregate.model_fields) - {
    "schema_",
    "device_samples",
    "sm_clock_mean_mhz",
    "mem_used_max_bytes",
}


def window_template(meta: Mapping[str, Any]) -> WindowTemplate:
    """The :class:`WindowTemplate` of windows of ``meta``'s batches (kept by the
    compiled engine's path per stream and configuration, made anew per window by the
    Python path)."""
    bytes_moved, flops = float(meta["bytes_moved"]), float(meta["flops"])
    state = WindowAggregate.template()
    state.update(
        node=meta["node"],
        device_index=meta["device_index"],
        device_model=meta["device_model"],
        kernel=meta["kernel"],
        workload=meta["workload"],
        problem_size=list(meta["problem_size"]),
        config=dict(meta["config"]),
        arithmetic_intensity=finite_ratio(flops, bytes_moved),
        occupancy=meta["occupancy"],
        resources_source=meta.get("resources_source"),
        waves=meta["waves"],
        peak_gbs=meta["peak_gbs"],
        peak_gflops=meta["peak_gflops"],
        launch_overhead_us=meta["launch_overhead_us"],
    )
    return WindowTemplate(
        state, bytes_moved, flops, float(meta["peak_gbs"]), float(meta["peak_gflops"])
    )


class WindowFigures(NamedTuple):
    """A window's duration statistics, as :func:`build_window` takes them."""

    mean_us: float
    p50_us: float
    p95_us: float
    min_us: float
    max_us: float
    std_us: float
    busy_fraction: float
    idle_gap_mean_us: float

    @classmethod
    def of(cls, stats: Mapping[str, float]) -> WindowFigures:
        """The figures of :func:`duration_stats`'s statistics (:meth:`as_stats`'s)."""
        return cls(*(stats[name] for name in _STATS_OF_FIGURES))

    def as_stats(self) -> dict[str, float]:
        """:func:`duration_stats`'s statistics of these figures."""
        return dict(zip(_STATS_OF_FIGURES, self, strict=True))

    @classmethod
    def compiled(
        cls,
        total: float,
        mean: float,
        std: float,
        idle: float,
        p50: float,
        p95: float,
        d_min: float,
        d_max: float,
        size_s: float,
    ) -> WindowFigures:
        """The figures of the compiled statistics pass (``window_stats``, the engine's
        closed windows) of a window of ``size_s`` seconds."""
        return cls(mean, p50, p95, d_min, d_max, std, busy_fraction(total, size_s), idle)


# duration_stats's names of the figures, in WindowFigures's order
_STATS_OF_FIGURES = (*_DURATION_STATS, "busy_fraction", "idle_gap_mean_us")


def _build(
    meta: Mapping[str, Any],
    config_id: str,
    window: int,
    size_s: float,
    count: int,
    failures: int,
    late_accepted: int,
    stats: Mapping[str, float],
    seq_min: int,
    seq_max: int,
    device: Mapping[str, Any] | None = None,
) -> WindowAggregate:
    """The window record of ``stats`` (:func:`duration_stats`'s) and ``meta``'s batches
    (the per-launch reference's)."""
    return build_window(
        window_template(meta),
        config_id,
        window,
        size_s,
        (count, failures, late_accepted, seq_min, seq_max),
        WindowFigures.of(stats),
        device,
    )


def build_window(
    template: WindowTemplate,
    config_id: str,
    window: int,
    size_s: float,
    counts: tuple[int, int, int, int, int],
    figures: WindowFigures,
    device: Mapping[str, Any] | None = None,
) -> WindowAggregate:
    """The window record: the roofline placement shared by the batched paths, the
    compiled engine's and the reference. ``counts``: launches that ran, that failed,
    accepted late, and the lowest and highest sequence numbers."""
    count, failures, late_accepted, seq_min, seq_max = counts
    mean_us, p50_us, p95_us, min_us, max_us, std_us, busy, idle = figures
    # bytes / (mean_us * 1e-6 s) / 1e9 = GB/s; each quotient finite whatever the input
    # (agents.logic.ratios)
    gbs = finite_ratio(template.bytes_moved, mean_us * 1e3)
    gflops = finite_ratio(template.flops, mean_us * 1e3)
    # Built from validated launches, each value of its field's type and within its
    # bounds (quotients through finite_ratio): not validated again (Record.computed).
    state = template.state.copy()
    state["problem_size"] = list(state["problem_size"])  # the record's own
    state["config"] = dict(state["config"])
    # (one assignment a field: half the time of one update with keywords, 0.8 us a window)
    state["config_id"] = config_id
    state["window_start"] = window * size_s
    state["window_end"] = (window + 1) * size_s
    state["count"] = count
    state["failures"] = failures
    state["late_accepted"] = late_accepted
    state["duration_mean_us"] = mean_us
    state["duration_p50_us"] = p50_us
    state["duration_p95_us"] = p95_us
    state["duration_min_us"] = min_us
    state["duration_max_us"] = max_us
    state["duration_std_us"] = std_us
    state["busy_fraction"] = busy
    state["idle_gap_mean_us"] = idle
    state["achieved_gbs"] = gbs
    state["achieved_gflops"] = gflops
    # Peaks of 0: the GPU model is not known, nor its roofline (DeviceSpec.unknown).
    state["bw_fraction"] = finite_ratio(gbs, template.peak_gbs)
    state["flops_fraction"] = finite_ratio(gflops, template.peak_gflops)
    state["seq_min"] = seq_min
    state["seq_max"] = seq_max
    fields_set = set(_WINDOW_FIELDS_SET)
    if device:
        state.update(device)
        fields_set.update(device)
    return WindowAggregate.computed_from(state, fields_set)


# -- per-record reference ---------------------------------------------------------


class LaunchRow(NamedTuple):
    """One launch of a batch, for the per-record reference."""

    batch: LaunchBatch
    t_end: float
    duration_us: float
    ok: bool
    seq: int


def launch_rows(batches: Iterable[LaunchBatch]) -> list[LaunchRow]:
    """Explode batches into rows, in batch order."""
    return [
        LaunchRow(b, t, d, bool(o), b.seq_start + i)
        for b in batches
        for i, (t, d, o) in enumerate(zip(b.t_end, b.duration_us, b.ok, strict=True))
    ]


def aggregate_reference(
    rows: Iterable[LaunchRow], spec: WindowSpec | None = None
) -> list[WindowAggregate]:
    """Plain-Python, record-by-record twin of :class:`Windower` (no idle flushes).

    Applies the same watermark and lateness rules one launch at a time, drops too-late
    launches, and returns every window at end of input, sorted like :meth:`Windower.poll`.
    It exists to check the vectorized path; it is far too slow for the stream.
    """
    spec = spec or WindowSpec()
    max_t: dict[str, float] = {}
    groups: dict[tuple[str, int, str], list[LaunchRow]] = {}
    late: dict[tuple[str, int, str], int] = {}
    for row in rows:
        key = row.batch.stream_key
        seen = max_t.get(key, -math.inf)
        watermark = seen - spec.out_of_orderness_s
        window = spec.window_of(row.t_end)
        max_t[key] = max(seen, row.t_end)
        if spec.closes_by(window, watermark):
            continue
        gk = (key, window, row.batch.config_id)
        groups.setdefault(gk, []).append(row)
        late[gk] = late.get(gk, 0) + (row.t_end < watermark)
    return [
        _reference_one(groups[gk], gk[1], gk[2], spec.size_s, late[gk]) for gk in sorted(groups)
    ]


def _reference_one(
    rows: list[LaunchRow], window: int, config_id: str, size_s: float, late_accepted: int
) -> WindowAggregate:
    good = [r for r in rows if r.ok]
    n = len(good)
    stats = dict.fromkeys(_STATS_OF_FIGURES, 0.0)
    if n:
        ds = sorted(r.duration_us for r in good)
        total = sum(ds)
        mean = total / n
        stats.update(
            duration_mean_us=mean,
            duration_p50_us=_percentile(ds, 50.0),
            duration_p95_us=_percentile(ds, 95.0),
            duration_min_us=ds[0],
            duration_max_us=ds[-1],
            duration_std_us=math.sqrt(sum((x - mean) ** 2 for x in ds) / n),
            busy_fraction=total * 1e-6 / size_s,
        )
        by_end = sorted(good, key=lambda r: (r.t_end, r.seq))
        gaps = [
            max(0.0, (cur.t_end - cur.duration_us * 1e-6) - prev.t_end)
            for prev, cur in itertools.pairwise(by_end)
        ]
        if gaps:
            stats["idle_gap_mean_us"] = sum(gaps) / len(gaps) * 1e6
    seqs = [r.seq for r in rows]
    return _build(
        _meta(rows[0].batch),
        config_id,
        window,
        size_s,
        n,
        len(rows) - n,
        late_accepted,
        stats,
        min(seqs),
        max(seqs),
    )


# Up to this many values a full sort costs less than the partial sorts and the two
# passes for min and max: NumPy sorts float64 with SIMD (800 values: 1.9 us sorted, 8.6 us
# partitioned at p50 and p95's ranks plus min and max; even at about 8,000 on AVX-512,
# and lower where the sort has narrower vectors: this keeps below both).
_SORT_MAX = 4096


def order_stats(
    values: _F64, qs: Sequence[float], *, overwrite: bool = False
) -> tuple[list[float], float, float]:
    """:func:`percentiles` of ``values`` at ``qs``, their minimum and their maximum.

    ``overwrite``: ``values`` may be reordered in place (no copy).
    """
    n = values.size
    if n > _SORT_MAX:
        return _partitioned(values if overwrite else values.copy(), qs)
    if overwrite:
        values.sort()
        ranked = values
    else:
        ranked = np.sort(values)
    out = []
    for p in ((n - 1) * q / 100.0 for q in qs):
        k = math.floor(p)
        a, b = float(ranked[k]), float(ranked[min(k + 1, n - 1)])
        out.append(a + (b - a) * (p - k))
    return out, float(ranked[0]), float(ranked[-1])


def percentiles(values: _F64, qs: Sequence[float], *, overwrite: bool = False) -> list[float]:
    """:func:`_percentile` of unsorted ``values`` (:func:`order_stats` without the
    minimum and maximum). ``overwrite``: ``values`` may be reordered in place (no copy).
    """
    return order_stats(values, qs, overwrite=overwrite)[0]


def _partitioned(part: _F64, qs: Sequence[float]) -> tuple[list[float], float, float]:
    """:func:`order_stats` by partial sorts of ``part`` (reordered in place, 2+ values).

    This is the largest cost of closing a window of tens of thousands of launches.
    One single-rank ``partition`` per needed rank, each on what lies above the
    previous one: NumPy selects one rank with SIMD but falls back to a much slower
    path for a list of ranks (22,000 durations: 45 us for one rank, 457 us for the
    four that p50 and p95 read; 70 us for the four this way, ``np.percentile`` ~2x
    the list form).

    The minimum and the maximum come from the parts the partitions leave: all below the
    lowest rank needed, all above the highest (at p50 and p95 of 16,000 values, scans of
    7,999 and 800 values instead of two of 16,000).
    """
    n = part.size
    pos = [(n - 1) * q / 100.0 for q in qs]
    ranks = sorted({r for p in pos for r in (math.floor(p), min(math.floor(p) + 1, n - 1))})
    at: dict[int, float] = {}
    lo = 0  # part[lo:] holds exactly the values of ranks >= lo, in some order
    for r in ranks:
        if r == lo > 0:  # the rank just above a partition: the least of what lies above
            at[r] = float(part[lo:].min())
            continue
        part[lo:].partition(r - lo)
        at[r] = float(part[r])
        lo = r + 1
    out = []
    for p in pos:
        k = math.floor(p)
        a, b = at[k], at[min(k + 1, n - 1)]
        out.append(a + (b - a) * (p - k))
    # part[:ranks[0]] holds the values of lower ranks (the first rank was partitioned),
    # part[lo:] those of ranks >= lo
    least = float(part[: ranks[0]].min()) if ranks[0] > 0 else at[0]
    most = float(part[lo:].max()) if lo < n else at[n - 1]
    return out, least, most


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default method)."""
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


# -- helpers ----------------------------------------------------------------------


def _meta(batch: LaunchBatch) -> dict[str, Any]:
    return {f: getattr(batch, f) for f in _META_FIELDS} | {
        "problem_size": list(batch.problem_size),
        "config": dict(batch.config),
    }


def _columns(acc: _Acc, arrays: bool) -> dict[str, Any]:
    # Merging the chunks in place keeps the next snapshot (and the aggregate) cheap.
    acc.t_end = [_cat(acc.t_end, np.float64)]
    acc.duration_us = [_cat(acc.duration_us, np.float64)]
    cols = {"t_end": acc.t_end[0], "duration_us": acc.duration_us[0]}
    return cols if arrays else {k: v.tolist() for k, v in cols.items()}


def _window_cuts(t: _F64, first: int, last: int, size: float) -> list[tuple[int, int, int]] | None:
    """(window, lo, hi) of each window the end times ``t`` (in completion order) fall in,
    exactly as ``floor(t / size)`` splits them; None where a window's end, computed as
    ``(window + 1) * size``, is not above its last time (float rounding at an edge: the
    general path decides).

    A binary search per window edge instead of a window index per launch: the index is
    monotonic in ``t``, so each edge is found near where ``t`` crosses ``k * size``, then
    moved to where the index itself changes.
    """
    n = t.size
    out: list[tuple[int, int, int]] = []
    lo = 0
    for k in range(first + 1, last + 2):
        if k > last:
            hi = n
        else:
            hi = int(np.searchsorted(t, k * size, side="left"))
            while hi > lo and math.floor(float(t[hi - 1]) / size) >= k:
                hi -= 1
            while hi < n and math.floor(float(t[hi]) / size) < k:
                hi += 1
        if hi > lo:
            window = math.floor(float(t[lo]) / size)
            if not float(t[hi - 1]) < (window + 1) * size:
                return None
            out.append((window, lo, hi))
            lo = hi
    return out


_add = np.add.reduce
_all = np.logical_and.reduce


def _cat(chunks: list[Any], dtype: type) -> Any:
    if not chunks:
        return np.empty(0, dtype=dtype)
    if len(chunks) == 1:
        return chunks[0]
    return np.concatenate(chunks)


def _sorted(aggs: list[WindowAggregate]) -> list[WindowAggregate]:
    return sorted(aggs, key=lambda a: (a.stream_key, a.window_start, a.config_id))


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _none_or(x: float | None, default: float) -> float:
    return default if x is None else float(x)


def make_example_batch(
    t_end: Sequence[float],
    duration_us: Sequence[float] | None = None,
    ok: Sequence[int] | None = None,
    *,
    node: str = "n1",
    kernel: str = "saxpy",
    config: Mapping[str, int | float | str | bool] | None = None,
    seq_start: int = 0,
    **fields: Any,
) -> LaunchBatch:
    """A small valid :class:`LaunchBatch` for examples and tests (sim backend, fake A100).

    Numbers describe a memory-bound kernel: 8 MB moved, 2 MFLOP per launch.
    """
    config = dict(config or {"block": 128})
    n = len(t_end)
    base: dict[str, Any] = {
        "node": node,
        "device_index": 0,
        "device_model": "A100-SXM4-80GB",
        "backend": "sim",
        "kernel": kernel,
        "workload": kernel,
        "problem_size": [1 << 20],
        "config": config,
        "config_id": ",".join(f"{k}={v}" for k, v in config.items()),
        "grid": [8192, 1, 1],
        "block": [128, 1, 1],
        "dynamic_smem_bytes": 0,
        "bytes_moved": 8.0e6,
        "flops": 2.0e6,
        "occupancy": 1.0,
        "waves": 6.1,
        "peak_gbs": 2039.0,
        "peak_gflops": 19500.0,
        "seq_start": seq_start,
        "t_end": list(t_end),
        "duration_us": list(duration_us) if duration_us is not None else [10.0] * n,
        "ok": list(ok) if ok is not None else [1] * n,
    }
    base.update(fields)
    return LaunchBatch(**base)
