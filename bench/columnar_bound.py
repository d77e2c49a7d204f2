"""What a window stage costs when a consumer poll is windowed as columns, not per message.

``kernelstream bench worker-path --wire binary --columnar`` times this beside the worker's
own path on the same messages. It is a measured bound for a design, not the worker: the
worker decodes every message into its own objects (:class:`schemas.columnar.LaunchColumns`,
a validated header copy), keeps each stream's windows in Python objects and closes them
one by one; here a poll of binary launch batches is read as the worker reads a poll of
small batches (:func:`schemas.columnar.steady_poll`: one joined buffer, the heads as one
array, the column checks once) but never turned into per-batch objects, the event-time
and sequence checks (each batch continues its stream exactly) are made over the whole
poll, and the windows that the poll's
watermarks close are aggregated together (count, mean, standard deviation, idle gaps by
segment; p50, p95, minimum and maximum by the worker's own :func:`order_stats`).

The worker now takes its steady state out of Python another way: the compiled engine
(:mod:`agents.logic.compiled_windows`) windows the steady messages with their streams'
state held in compiled code; ``--agent`` measures it.

It covers the steady state only: every message a binary batch whose header bytes a batch
decoded before had (the first of each is decoded and checked by the worker's own decoder),
continuing its stream, in completion order, none late. Anything else raises
:class:`NotSteadyError`, where a worker built this way would take its general path. No records
are built and nothing is published: each closed window is one row of numbers, compared
with the worker's :class:`~agents.logic.windowing.Windower` by :func:`check_rows`.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from kernelstream.agents.logic.windowing import Windower, WindowSpec, order_stats
from kernelstream.schemas.codec import MAX_MESSAGE_BYTES
from kernelstream.schemas.columnar import decode_launch_columns, steady_poll
from kernelstream.schemas.errors import SchemaError
from kernelstream.schemas.records import WindowAggregate

__all__ = [
    "ColumnarWindows",
    "NotSteadyError",
    "Row",
    "check_rows",
    "columnar_pass",
]

_NONE_OPEN = 2**62


class NotSteadyError(Exception):
    """A poll holds something the columnar path does not cover (the general path's)."""


class Row(NamedTuple):
    """One closed window: its stream, window index and duration statistics."""

    stream_key: str
    window: int
    launches: int
    mean_us: float
    std_us: float
    p50_us: float
    p95_us: float
    min_us: float
    max_us: float
    idle_gap_mean_us: float


class ColumnarWindows:
    """Windows of binary launch batches, a consumer poll at a time, as columns."""

    def __init__(self, spec: WindowSpec, max_age_s: float = 3600.0, max_future_s: float = 60.0):
        self.spec = spec
        self.max_age_s, self.max_future_s = max_age_s, max_future_s
        self.rows: list[Row] = []
        self._slot_of: dict[tuple[str, str], int] = {}  # (stream, config) -> slot
        self._keys: list[str] = []  # slot -> stream key
        self._next_seq = np.zeros(0, np.int64)  # slot -> next sequence number (-1: none yet)
        self._max_t = np.zeros(0)  # slot -> largest end time
        self._open_min = np.zeros(0, np.int64)  # slot -> first open window
        # slot -> window -> (end-time chunks, duration chunks)
        self._open: dict[int, dict[int, tuple[list[Any], list[Any]]]] = {}

    def _slot(self, hit: tuple[Any, Any, str]) -> int:
        """The slot of a (stream, configuration): its header's entry in the decoder."""
        key = (hit[2], hit[0].config_id)
        slot = self._slot_of.get(key)
        if slot is not None:
            return slot
        slot = self._slot_of[key] = len(self._keys)
        self._keys.append(hit[2])
        if slot >= self._max_t.size:
            grow = max(64, self._max_t.size)
            self._next_seq = np.concatenate([self._next_seq, np.full(grow, -1, np.int64)])
            self._max_t = np.concatenate([self._max_t, np.full(grow, -np.inf)])
            self._open_min = np.concatenate([self._open_min, np.full(grow, _NONE_OPEN)])
        return slot

    def poll(self, values: list[bytes], now: float) -> None:
        """Window one poll's messages (decompressed values, in partition order)."""
        size, lateness = self.spec.size_s, self.spec.allowed_lateness_s
        if not values:
            return
        # read as the worker reads a poll of small batches (schemas.columnar.steady_poll);
        # a header not seen yet is decoded by the worker's decoder first, which decides
        got = steady_poll(values, MAX_MESSAGE_BYTES)  # large batches too, joined all the same
        if got is None:
            for value in values:
                try:
                    decode_launch_columns(value)
                except SchemaError as ex:
                    raise NotSteadyError(f"a batch the worker refuses: {ex}") from ex
            got = steady_poll(values, MAX_MESSAGE_BYTES)
        if got is None:
            raise NotSteadyError(
                "a poll the worker reads message by message (not all small binary batches "
                "with known headers and plainly valid columns)"
            )
        slot_list = [self._slot(hit) for hit in got.hits]
        slots = np.array(slot_list, np.int64)
        t, d, ok, first, lo, hi = (
            got.t,
            got.d,
            got.ok_bytes.view(np.bool_),
            got.first,
            got.lo,
            got.hi,
        )
        n = np.fromiter(map(len, got.t_end), np.int64, len(values))
        seq = np.array(got.seq_start, np.int64)
        ns = n.tolist()
        # event times near the clock (the worker's edge check after decoding)
        if not bool((hi <= now + self.max_future_s).all() and (lo >= now - self.max_age_s).all()):
            raise NotSteadyError("a batch the edge checks send to the general path")
        self._sequence(slots, seq, n)
        w_lo = np.floor(lo / size).astype(np.int64)
        w_hi = np.floor(hi / size).astype(np.int64)
        if not bool((hi < (w_hi + 1) * size).all()):
            raise NotSteadyError("a launch on a window edge that float rounding blurs")
        # a batch reaching into a window its stream's watermark already passed: too late
        watermark = self._max_t[slots] - self.spec.out_of_orderness_s
        if bool(((w_lo + 1) * size + lateness <= watermark).any()):
            raise NotSteadyError("launches in a window already closed")
        self._add(slot_list, first.tolist(), ns, w_lo.tolist(), w_hi.tolist(), t, d, ok)
        np.maximum.at(self._max_t, slots, hi)
        self._close(np.unique(slots), size, lateness)

    def _sequence(
        self, slots: npt.NDArray[np.int64], seq: npt.NDArray[np.int64], n: npt.NDArray[np.int64]
    ) -> None:
        """Each batch continues its stream exactly: the one before it in the poll, or the
        last one counted."""
        order = np.argsort(slots, kind="stable")
        so, qo, no = slots[order], seq[order], n[order]
        same = np.zeros(so.size, bool)
        same[1:] = so[1:] == so[:-1]
        after = np.concatenate(([0], qo[:-1] + no[:-1]))
        known = self._next_seq[so]
        expect = np.where(same, after, known)
        if not bool(((expect == qo) | (~same & (known < 0))).all()):
            raise NotSteadyError("a batch that does not continue its stream exactly")
        last = np.ones(so.size, bool)
        last[:-1] = so[1:] != so[:-1]
        self._next_seq[so[last]] = qo[last] + no[last]

    def _add(
        self,
        slots: list[int],
        first: list[int],
        ns: list[int],
        w_lo: list[int],
        w_hi: list[int],
        t: npt.NDArray[np.float64],
        d: npt.NDArray[np.float64],
        ok: npt.NDArray[np.bool_],
    ) -> None:
        """Each batch's slices (views of the poll's columns) into its windows."""
        size = self.spec.size_s
        every_ok = bool(ok.all())
        opened, open_min = self._open, self._open_min
        for slot, a, k, w0, w1 in zip(slots, first, ns, w_lo, w_hi, strict=True):
            windows = opened.get(slot)
            if windows is None:
                windows = opened[slot] = {}
            if w0 == w1:
                parts: tuple[tuple[int, int, int], ...] = ((w0, a, a + k),)
            else:
                edges = np.arange(w0 + 1, w1 + 1) * size
                cuts = [a, *(np.searchsorted(t[a : a + k], edges) + a).tolist(), a + k]
                parts = tuple(
                    (w0 + j, cuts[j], cuts[j + 1])
                    for j in range(len(cuts) - 1)
                    if cuts[j + 1] > cuts[j]
                )
            for w, x, y in parts:
                acc = windows.get(w)
                if acc is None:
                    acc = windows[w] = ([], [])
                    if w < open_min[slot]:
                        open_min[slot] = w
                if every_ok:
                    acc[0].append(t[x:y])
                    acc[1].append(d[x:y])
                else:
                    ran = ok[x:y]
                    acc[0].append(t[x:y][ran])
                    acc[1].append(d[x:y][ran])

    def _close(self, touched: npt.NDArray[np.int64], size: float, lateness: float) -> None:
        """The windows the touched streams' watermarks passed, aggregated together."""
        watermarks = self._max_t[touched] - self.spec.out_of_orderness_s
        ready = (self._open_min[touched] + 1) * size + lateness <= watermarks
        closing: list[tuple[int, int, tuple[list[Any], list[Any]]]] = []
        for slot, watermark in zip(
            touched[ready].tolist(), watermarks[ready].tolist(), strict=True
        ):
            windows = self._open[slot]
            for w in sorted(windows):
                if (w + 1) * size + lateness <= watermark:
                    closing.append((slot, w, windows.pop(w)))
            self._open_min[slot] = min(windows) if windows else _NONE_OPEN
        if closing:
            self._aggregate(closing)

    def _aggregate(self, closing: list[tuple[int, int, tuple[list[Any], list[Any]]]]) -> None:
        counts = np.fromiter(
            (sum(c.size for c in acc[1]) for _, _, acc in closing), np.int64, len(closing)
        )
        if not bool((counts > 0).all()):
            raise NotSteadyError("a window without a launch that ran")
        t = np.concatenate([c for _, _, acc in closing for c in acc[0]])
        d = np.concatenate([c for _, _, acc in closing for c in acc[1]])
        starts = np.cumsum(counts) - counts
        mean = np.add.reduceat(d, starts) / counts
        dev = d - np.repeat(mean, counts)
        std = np.sqrt(np.add.reduceat(dev * dev, starts) / counts)
        # idle gaps: max(0, start of a launch - end of the one before) within each window
        gaps = d[1:] * -1e-6
        gaps += t[1:]
        gaps -= t[:-1]
        np.maximum(gaps, 0.0, out=gaps)
        gaps[starts[1:] - 1] = 0.0
        gap_mean = np.add.reduceat(np.append(gaps, 0.0), starts) / np.maximum(counts - 1, 1) * 1e6
        keys = self._keys
        for i, (slot, w, _) in enumerate(closing):
            a, c = int(starts[i]), int(counts[i])
            (p50, p95), least, most = order_stats(d[a : a + c], (50.0, 95.0), overwrite=True)
            self.rows.append(
                Row(
                    keys[slot],
                    w,
                    c,
                    float(mean[i]),
                    float(std[i]),
                    p50,
                    p95,
                    least,
                    most,
                    float(gap_mean[i]) if c > 1 else 0.0,
                )
            )


def columnar_pass(
    values: list[bytes], spec: WindowSpec, poll_sizes: list[int]
) -> tuple[float, list[Row]]:
    """Seconds to window ``values`` (decompressed) in polls of ``poll_sizes``, and the rows."""
    engine = ColumnarWindows(spec)
    now = time.time()
    t0 = time.perf_counter()
    at = 0
    for size in poll_sizes:
        engine.poll(values[at : at + size], now)
        at += size
    return time.perf_counter() - t0, engine.rows


def check_rows(rows: list[Row], values: list[bytes], spec: WindowSpec) -> tuple[int, int]:
    """(rows equal to the worker's window, windows the worker closed) on the same
    batches, each batch through the worker's :class:`Windower` and its stream's windows
    closed after it: counts equal, every statistic within 1e-9 relative."""
    windower = Windower(spec)
    reference: dict[tuple[str, int], WindowAggregate] = {}
    now = time.time()
    for value in values:
        cols = decode_launch_columns(value)
        windower.add_columns(cols, now)
        for agg in windower.poll_key(cols.stream_key):
            reference[(agg.stream_key, math.floor(agg.window_start / spec.size_s + 0.5))] = agg
    equal = 0
    for r in rows:
        found = reference.get((r.stream_key, r.window))
        if found is None or found.count != r.launches:
            continue
        agg = found
        pairs = (
            (r.mean_us, agg.duration_mean_us),
            (r.std_us, agg.duration_std_us),
            (r.p50_us, agg.duration_p50_us),
            (r.p95_us, agg.duration_p95_us),
            (r.min_us, agg.duration_min_us),
            (r.max_us, agg.duration_max_us),
            (r.idle_gap_mean_us, agg.idle_gap_mean_us),
        )
        if all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in pairs):
            equal += 1
    return equal, len(reference)
