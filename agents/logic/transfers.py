"""Findings about data movement and host stalls, from version 2 launch telemetry.

:func:`summarize` reduces the launch batches of one stream over a span of time
(their host gaps, host waits and copies) to a :class:`TransferSummary`;
:func:`transfer_findings` classifies it. Each :class:`TransferFinding` carries
the numbers that justify it and either a change of the kernel's configuration a
node can apply (``knob``: a declared ``pinned``, ``streams``, ``batch`` or
``sync_every`` parameter, then measured and kept or rolled back like any
configuration) or, when the kernel declares no such parameter, ``advice`` only.

Findings:

* ``transfer_bound``: copies take a large share of the step; achieved vs peak
  link bandwidth per direction.
* ``pageable_copies``: copies from pageable host memory; the expected gain comes
  from the measured pinned rate (or the link's modelled pinned rate when no copy
  was pinned).
* ``no_overlap``: copies and kernels never run at the same time (one stream).
* ``launch_bound``: host gaps longer than the kernels they separate.
* ``host_sync``: the host waited on the device before (nearly) every launch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kernelstream.kernels.devices import DeviceSpec
from kernelstream.kernels.space import ParamValue, SearchSpace
from kernelstream.kernels.transfers import copy_us
from kernelstream.schemas import Finding, WindowAggregate
from kernelstream.schemas.columnar import LaunchColumns
from kernelstream.schemas.records import Classification

__all__ = [
    "TRANSFER_CLASSES",
    "TransferFinding",
    "TransferSummary",
    "TransferThresholds",
    "TransferWindows",
    "finding_records",
    "is_host_finding",
    "merge",
    "summarize",
    "transfer_findings",
]

TRANSFER_CLASSES = ("transfer_bound", "pageable_copies", "no_overlap", "launch_bound", "host_sync")
_F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TransferThresholds:
    """When a summary becomes a finding (shares of the step time unless named)."""

    transfer_share: float = 0.3  # copy time / step time
    pageable_share: float = 0.1  # pageable copy time / step time
    overlap_copy_share: float = 0.1  # copies worth overlapping at all
    max_overlap: float = 0.05  # share of copy time that ran beside a kernel
    gap_to_kernel: float = 1.0  # mean host gap / mean kernel duration
    sync_share: float = 0.9  # launches the host waited before


@dataclass(frozen=True)
class _Leg:
    bytes: float = 0.0
    us: float = 0.0

    def plus(self, b: float, us: float) -> _Leg:
        return _Leg(self.bytes + b, self.us + us)

    @property
    def gbs(self) -> float:
        return self.bytes / (self.us * 1e3) if self.us > 0 else 0.0


@dataclass(frozen=True)
class TransferSummary:
    """What one stream's host side did over a span of time."""

    launches: int
    kernel_us: float
    gap_us: float
    waited: int
    copy_us: float
    overlap_us: float
    # (direction, pinned) -> bytes and time
    legs: Mapping[tuple[str, bool], _Leg] = field(default_factory=dict)
    streams: tuple[int, ...] = ()

    @property
    def step_us(self) -> float:
        """Device timeline plus host gaps: kernels, gaps and copies no kernel hid."""
        return self.kernel_us + self.gap_us + self.copy_us - self.overlap_us

    def share(self, us: float) -> float:
        return us / self.step_us if self.step_us > 0 else 0.0


def summarize(batches: Sequence[LaunchColumns]) -> TransferSummary | None:
    """The host side of a stream's batches; None when none carries host telemetry."""
    parts = [b for b in batches if b.host_gap_us is not None or b.copies is not None]
    if not parts:
        return None
    ok = np.concatenate([b.ok for b in parts])
    dur = np.concatenate([b.duration_us for b in parts])
    end = np.concatenate([b.t_end for b in parts])
    gaps = [b.host_gap_us for b in parts if b.host_gap_us is not None]
    waits = [b.host_waited for b in parts if b.host_waited is not None]
    legs: dict[tuple[str, bool], _Leg] = {}
    c_end: list[float] = []
    c_us: list[float] = []
    streams: set[int] = set()
    for b in parts:
        if b.copies is None:
            continue
        c = b.copies
        for d, n, us, pin in zip(c.direction, c.bytes, c.duration_us, c.pinned, strict=True):
            key = (d, bool(pin))
            legs[key] = legs.get(key, _Leg()).plus(n, us)
        c_end.extend(c.t_end)
        c_us.extend(c.duration_us)
        streams.update(c.stream)
    ce, cu = np.asarray(c_end, dtype=float), np.asarray(c_us, dtype=float)
    return TransferSummary(
        launches=int(ok.sum()),
        kernel_us=float(dur[ok].sum()),
        gap_us=float(np.concatenate(gaps).sum()) if gaps else 0.0,
        waited=int(np.concatenate(waits).sum()) if waits else 0,
        copy_us=float(cu.sum()),
        overlap_us=_overlap_us(end[ok] - dur[ok] / 1e6, end[ok], ce - cu / 1e6, ce),
        legs=legs,
        streams=tuple(sorted(streams)),
    )


def _overlap_us(k_start: _F64, k_end: _F64, c_start: _F64, c_end: _F64) -> float:
    """Time copies ran while a kernel ran (kernels of one stream do not overlap)."""
    if not (len(k_start) and len(c_start)):
        return 0.0
    order = np.argsort(k_start)
    ks, ke = k_start[order], k_end[order]
    done = np.concatenate([[0.0], np.cumsum(ke - ks)])

    def busy_until(t: _F64) -> _F64:
        i = np.searchsorted(ks, t, side="right")  # kernels started by t
        prev = np.maximum(i - 1, 0)
        part = np.where(i > 0, np.minimum(t, ke[prev]) - ks[prev], 0.0)
        return done[prev] * (i > 0) + np.maximum(part, 0.0)

    return float(np.maximum(busy_until(c_end) - busy_until(c_start), 0.0).sum() * 1e6)


@dataclass(frozen=True)
class TransferFinding:
    """One finding with its evidence and what to do about it."""

    classification: Classification
    evidence: dict[str, float | int | str | bool]
    summary: str
    expected_gain: float = 0.0  # step time saved / step time after, when known
    knob: dict[str, ParamValue] | None = None  # a configuration change a node applies
    advice: str = ""


def transfer_findings(
    s: TransferSummary,
    spec: DeviceSpec,
    config: Mapping[str, ParamValue],
    space: SearchSpace | None = None,
    thresholds: TransferThresholds | None = None,
) -> list[TransferFinding]:
    """The findings a summary supports, in the order of :data:`TRANSFER_CLASSES`."""
    th = thresholds or TransferThresholds()
    if s.step_us <= 0:
        return []
    found = [
        _transfer_bound(s, spec, th),
        _pageable(s, spec, config, space, th),
        _no_overlap(s, config, space, th),
        _launch_bound(s, config, space, th),
        _host_sync(s, config, space, th),
    ]
    return [f for f in found if f is not None]


def _link_gbs(spec: DeviceSpec, direction: str) -> float:
    return spec.peak_gbs / 2 if direction == "d2d" else spec.pcie_gbs


def _transfer_bound(
    s: TransferSummary, spec: DeviceSpec, th: TransferThresholds
) -> TransferFinding | None:
    share = s.share(s.copy_us - s.overlap_us)
    if share < th.transfer_share:
        return None
    ev: dict[str, float | int | str | bool] = {"copy_share": round(share, 3)}
    parts = []
    for d in ("h2d", "d2h", "d2d"):
        leg = _merged(s, d)
        if leg.us <= 0:
            continue
        peak = _link_gbs(spec, d)
        ev[f"{d}_gbs"] = round(leg.gbs, 2)
        ev[f"{d}_peak_gbs"] = peak
        ev[f"{d}_bytes"] = int(leg.bytes)
        parts.append(f"{d} {leg.gbs:.1f} of {peak:.1f} GB/s")
    return TransferFinding(
        "transfer_bound",
        ev,
        f"copies take {share:.0%} of the step ({', '.join(parts)})",
        advice="move less data per step (keep inputs on the device, reuse outputs), "
        "overlap copies with compute, or copy from pinned memory",
    )


def _merged(s: TransferSummary, direction: str) -> _Leg:
    leg = _Leg()
    for (d, _), part in s.legs.items():
        if d == direction:
            leg = leg.plus(part.bytes, part.us)
    return leg


def _pageable(
    s: TransferSummary,
    spec: DeviceSpec,
    config: Mapping[str, ParamValue],
    space: SearchSpace | None,
    th: TransferThresholds,
) -> TransferFinding | None:
    slow = [(d, leg) for (d, pinned), leg in s.legs.items() if not pinned and d != "d2d"]
    pageable_us = sum(leg.us for _, leg in slow)
    if s.share(pageable_us) < th.pageable_share:
        return None
    ev: dict[str, float | int | str | bool] = {"pageable_share": round(s.share(pageable_us), 3)}
    saved = 0.0
    for d, leg in slow:
        pinned = s.legs.get((d, True))
        measured = pinned is not None and pinned.us > 0
        rate = pinned.gbs if measured and pinned is not None else _modelled_gbs(spec, d)
        if rate > 0:
            saved += max(0.0, leg.us - leg.bytes / (rate * 1e3))
        ev[f"{d}_pageable_gbs"] = round(leg.gbs, 2)
        ev[f"{d}_pinned_gbs"] = round(rate, 2)
        ev[f"{d}_pinned_source"] = "measured" if measured else "modelled"
    gain = saved / max(s.step_us - saved, 1e-9)
    ev["expected_gain"] = round(gain, 3)
    return TransferFinding(
        "pageable_copies",
        ev,
        f"{s.share(pageable_us):.0%} of the step copies pageable memory; pinned buffers "
        f"would save {s.share(saved):.0%} of it ({1 + gain:.2f}x the steps per second)",
        expected_gain=gain,
        knob=_knob(config, space, "pinned", _to_pinned),
        advice="allocate host buffers pinned (cupyx.empty_pinned, cudaHostAlloc)",
    )


def _modelled_gbs(spec: DeviceSpec, direction: str) -> float:
    """The link's modelled pinned rate; 0 when the model's links are not known."""
    if spec.pcie_gbs <= 0:
        return 0.0
    return float((1 << 30) / (copy_us(spec, 1 << 30, direction, pinned=True) * 1e3))


def _no_overlap(
    s: TransferSummary,
    config: Mapping[str, ParamValue],
    space: SearchSpace | None,
    th: TransferThresholds,
) -> TransferFinding | None:
    if s.share(s.copy_us) < th.overlap_copy_share or s.copy_us <= 0:
        return None
    overlap = s.overlap_us / s.copy_us
    if overlap > th.max_overlap:
        return None
    hideable = min(s.copy_us, s.kernel_us)
    gain = hideable / max(s.step_us - hideable, 1e-9)
    return TransferFinding(
        "no_overlap",
        {
            "copy_share": round(s.share(s.copy_us), 3),
            "overlapped": round(overlap, 3),
            "copy_streams": ",".join(map(str, s.streams)),
            "expected_gain": round(gain, 3),
        },
        f"copies ({s.share(s.copy_us):.0%} of the step) never overlap a kernel: "
        f"two streams with double buffering would hide up to {s.share(hideable):.0%} of "
        f"the step ({1 + gain:.2f}x the steps per second)",
        expected_gain=gain,
        knob=_knob(config, space, "streams", _larger),
        advice="queue copies on a second stream with double buffering",
    )


def _launch_bound(
    s: TransferSummary,
    config: Mapping[str, ParamValue],
    space: SearchSpace | None,
    th: TransferThresholds,
) -> TransferFinding | None:
    if s.launches == 0:
        return None
    gap, kern = s.gap_us / s.launches, s.kernel_us / s.launches
    if gap < th.gap_to_kernel * kern:
        return None
    return TransferFinding(
        "launch_bound",
        {
            "host_gap_mean_us": round(gap, 2),
            "kernel_mean_us": round(kern, 2),
            "gap_share": round(s.share(s.gap_us), 3),
        },
        f"host gaps of {gap:.1f} us exceed the {kern:.1f} us kernels they separate "
        f"({s.share(s.gap_us):.0%} of the step)",
        knob=_knob(config, space, "batch", _larger),
        advice="batch launches or capture them in a CUDA graph",
    )


def _host_sync(
    s: TransferSummary,
    config: Mapping[str, ParamValue],
    space: SearchSpace | None,
    th: TransferThresholds,
) -> TransferFinding | None:
    if s.launches == 0 or s.waited / s.launches < th.sync_share:
        return None
    return TransferFinding(
        "host_sync",
        {
            "waited_share": round(s.waited / s.launches, 3),
            "launches": s.launches,
            "host_gap_mean_us": round(s.gap_us / s.launches, 2),
        },
        f"the host waited on the device before {s.waited / s.launches:.0%} of "
        f"{s.launches} launches (a synchronization after every launch)",
        knob=_knob(config, space, "sync_every", _fewer_syncs),
        advice="synchronize only where the host reads results (events, not synchronize())",
    )


_Values = Sequence[ParamValue] | None


def _to_pinned(current: ParamValue, values: _Values) -> ParamValue | None:
    return 1 if current != 1 and (values is None or 1 in values) else None


def _larger(current: ParamValue, values: _Values) -> ParamValue | None:
    if not isinstance(current, int | float) or isinstance(current, bool):
        return None
    if values is None:
        return int(current * 2) if current >= 1 else 1
    bigger = [v for v in values if isinstance(v, int | float) and v > current]
    return min(bigger) if bigger else None


def _fewer_syncs(current: ParamValue, values: _Values) -> ParamValue | None:
    if current != 0 and (values is None or 0 in values):
        return 0  # never between launches
    return _larger(current, values)


def _knob(
    config: Mapping[str, ParamValue],
    space: SearchSpace | None,
    name: str,
    pick: Callable[[ParamValue, _Values], ParamValue | None],
) -> dict[str, ParamValue] | None:
    """The configuration change for ``name``, when the kernel's configuration has it
    (its declared values bound the change when the space is known)."""
    if name not in config:
        return None
    values = list(space.params[name]) if space is not None and name in space.params else None
    value = pick(config[name], values)
    if value is None or value == config[name]:
        return None
    return {**config, name: value}


def merge(a: TransferSummary, b: TransferSummary) -> TransferSummary:
    """Two summaries of one stream as one (their copies overlap kernels of their own)."""
    legs = dict(a.legs)
    for key, leg in b.legs.items():
        legs[key] = legs.get(key, _Leg()).plus(leg.bytes, leg.us)
    return TransferSummary(
        a.launches + b.launches,
        a.kernel_us + b.kernel_us,
        a.gap_us + b.gap_us,
        a.waited + b.waited,
        a.copy_us + b.copy_us,
        a.overlap_us + b.overlap_us,
        legs,
        tuple(sorted({*a.streams, *b.streams})),
    )


def _slice(cols: LaunchColumns, lo: float, hi: float) -> LaunchColumns:
    """The launches (and copies) of ``cols`` that ended in ``[lo, hi)``."""
    keep = (cols.t_end >= lo) & (cols.t_end < hi)
    copies = cols.copies
    if copies is not None:
        idx = [i for i, t in enumerate(copies.t_end) if lo <= t < hi]
        copies = (
            copies.model_validate({k: [v[i] for i in idx] for k, v in copies.model_dump().items()})
            if idx
            else None
        )
    return LaunchColumns(
        cols.meta,
        cols.t_end[keep],
        cols.duration_us[keep],
        cols.ok[keep],
        None,
        None if cols.host_gap_us is None else cols.host_gap_us[keep],
        None if cols.host_waited is None else cols.host_waited[keep],
        copies,
    )


class TransferWindows:
    """Host-side summaries per (stream, configuration, event-time window).

    Fed the same batches as the launch windows (:meth:`add`); a launch window's
    close (:meth:`close`) turns the matching summary into findings. Holds at most
    ``max_open`` open summaries: the oldest go first (a stream whose windows never
    close, e.g. one that moved to another worker).
    """

    def __init__(self, size_s: float, max_open: int = 50_000) -> None:
        self.size_s = size_s
        self.max_open = max_open
        self._open: dict[tuple[str, str, int], TransferSummary] = {}
        self._of_stream: dict[str, int] = {}  # open summaries per stream

    def add(self, cols: LaunchColumns) -> None:
        """Take a batch's host telemetry (a version 1 batch has none: nothing to do)."""
        if (cols.host_gap_us is None and cols.copies is None) or len(cols) == 0:
            return
        first, last = (int(np.floor(t / self.size_s)) for t in cols.t_range())
        for w in range(first, last + 1):
            part = cols if first == last else _slice(cols, w * self.size_s, (w + 1) * self.size_s)
            s = summarize([part])
            if s is None or s.launches == 0:
                continue
            key = (cols.meta.stream_key, cols.meta.config_id, w)
            if key in self._open:
                self._open[key] = merge(self._open[key], s)
            else:
                self._open[key] = s
                self._of_stream[key[0]] = self._of_stream.get(key[0], 0) + 1
        while len(self._open) > self.max_open:
            self._forget(next(iter(self._open)))

    def close(self, agg: WindowAggregate) -> TransferSummary | None:
        """The summary of the window ``agg`` closes (removed), or None."""
        w = math.floor((agg.window_start + self.size_s / 2) / self.size_s)
        key = (agg.stream_key, agg.config_id, w)
        return self._forget(key) if key in self._open else None

    def holds(self, stream_key: str) -> bool:
        """Whether a summary of ``stream_key`` is open."""
        return stream_key in self._of_stream

    def _forget(self, key: tuple[str, str, int]) -> TransferSummary:
        left = self._of_stream[key[0]] - 1
        if left:
            self._of_stream[key[0]] = left
        else:
            del self._of_stream[key[0]]
        return self._open.pop(key)

    def __len__(self) -> int:
        return len(self._open)


def finding_records(
    agg: WindowAggregate, findings: Sequence[TransferFinding], finding_id: str
) -> list[Finding]:
    """The findings of one window as ``ks.finding/2`` records.

    A configuration change travels in the evidence (``knob_param``, ``knob_value``)
    for the tuner to recommend; ``advice`` says what to do otherwise.
    """
    out = []
    for f in findings:
        ev = dict(f.evidence, host_side=True, advice=f.advice)
        if f.knob is not None:
            (param,) = [k for k, v in f.knob.items() if agg.config.get(k) != v]
            ev.update(knob_param=param, knob_value=f.knob[param])
        out.append(
            Finding.of_window(
                agg,
                id=f"{finding_id}/{f.classification}",
                classification=f.classification,
                evidence=ev,
                summary=f.summary,
            )
        )
    return out


def is_host_finding(finding: Finding) -> bool:
    """Whether a finding came from :func:`finding_records` (the host side of a window)."""
    return finding.evidence.get("host_side") is True
