"""Roofline classification of window aggregates, with the evidence behind each verdict.

The order of the checks is the order in which a kernel author would want to hear
about a problem: a regression first (something changed), then launch overhead
(nothing else matters when launches cost more than the work), then the roofline:
near a roof means efficient; below both roofs, an under-used device explains more
than the access pattern does, so under-utilization is reported before a memory
bottleneck.

>>> from kernelstream.agents.logic.windowing import Windower, make_example_batch
>>> w = Windower()
>>> _ = w.add(make_example_batch([0.1, 0.2], duration_us=[6.0, 6.0]), now=0.0)
>>> Detector().classify(w.flush_all()[0]).classification
'memory_efficient'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from kernelstream.agents.logic.errors import LogicSettingsError, SnapshotError
from kernelstream.agents.logic.ratios import finite_ratio
from kernelstream.schemas.keys import remember
from kernelstream.schemas.records import Classification, Finding, WindowAggregate

__all__ = [
    "CAUSES",
    "DEVICE_EVIDENCE",
    "SUMMARIES",
    "Detector",
    "DetectorThresholds",
    "finding_id",
    "occupancy_source",
    "tail_fraction",
]

#: Window fields of the device samples copied into every finding's evidence.
DEVICE_EVIDENCE = ("sm_clock_mean_mhz", "mem_used_max_bytes")

_SNAPSHOT_VERSION = 1
Evidence = dict[str, float | int | str | bool]

#: Each verdict's summary, a ``str.format`` template of the window's figures and the
#: names of its series (``what``). The compiled writer renders the same templates
#: (:mod:`agents.logic.written`).
SUMMARIES: dict[str, str] = {
    "no_launch": "{what} had no successful launch ({failures} failed).",
    "regression": "{what} takes {mean:.1f} us, {ratio:.2f}x its own baseline of {base:.1f} us.",
    "launch_bound": (
        "{what} runs {mean:.1f} us per launch, under {factor:g}x the {overhead:.1f} us "
        "launch overhead."
    ),
    "roofline_unknown": (
        "{what} runs {mean:.1f} us per launch; the roofline is unknown (no datasheet peaks "
        "of {device_model} in kernels/devices.py, or a kernel declared without flops and "
        "bytes), so the window is not placed on it (its duration still guides the tuner)."
    ),
    "memory_efficient": "{what} is memory-bound and reaches {bw:.0%} of peak bandwidth.",
    "compute_bound": "{what} is compute-bound at {flops:.0%} of peak FLOP/s.",
    "under_utilization": (
        "{what} leaves the device under-used ({causes}) at {roof:.0%} of its roof."
    ),
    "memory_bottleneck": (
        "{what} is memory-bound but reaches only {bw:.0%} of peak bandwidth (arithmetic "
        "intensity {intensity:.2f} FLOP/B)."
    ),
    "balanced": (
        "{what} is near neither roof ({bw:.0%} of bandwidth, {flops:.0%} of FLOP/s) with no "
        "sign of under-use."
    ),
}

#: The causes of under-use a summary lists, in this order.
CAUSES: dict[str, str] = {
    "waves": "{waves:.2f} waves: too few blocks for the SMs",
    "tail": "tail effect: last of {waves:.2f} waves is {tail:.0%} full",
    "occupancy": "occupancy {occupancy:.0%} (registers and shared memory: {source})",
    "busy": "busy {busy:.0%} with {idle:.1f} us gaps",
}


@dataclass(frozen=True)
class DetectorThresholds:
    """Where each classification starts. Fractions are of the device's peak.

    Args:
        efficient_bw_fraction: a memory-bound kernel at or above this share of peak
            bandwidth is ``memory_efficient``; below it, a ``memory_bottleneck``.
        compute_bound_flops_fraction: a compute-side kernel at or above this share of
            peak FLOP/s is ``compute_bound``.
        min_waves: fewer waves than this leaves SMs without work.
        tail_fraction: a last partial wave filled below this share idles most SMs
            for its duration ...
        tail_max_waves: ... which matters only when there are few waves in total.
        min_occupancy: theoretical occupancy below this cannot hide memory latency.
        low_busy_fraction: the device is busy less than this share of the window ...
        idle_gap_ratio: ... and the mean gap between launches exceeds this many kernel
            durations: the GPU waits on the host.
        launch_bound_factor: a kernel shorter than this many launch overheads is
            ``launch_bound``.
        regression_factor: a window slower than this times its config's baseline is
            a ``regression``.
        baseline_windows: the baseline of a (stream key, config) is the count-weighted
            mean of its first this-many windows with enough launches; it is frozen
            afterwards so a slow drift cannot hide inside it.
        min_launches: windows with fewer successful launches neither build a baseline
            nor are judged against one.
    """

    efficient_bw_fraction: float = 0.6
    compute_bound_flops_fraction: float = 0.5
    min_waves: float = 1.0
    tail_fraction: float = 0.5
    tail_max_waves: float = 4.0
    min_occupancy: float = 0.25
    low_busy_fraction: float = 0.5
    idle_gap_ratio: float = 1.0
    launch_bound_factor: float = 2.0
    regression_factor: float = 1.2
    baseline_windows: int = 3
    min_launches: int = 10

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (math.isfinite(value) and value >= 0):
                raise LogicSettingsError(f"DetectorThresholds.{name} must be >= 0, got {value!r}")
        if self.regression_factor <= 1.0:
            raise LogicSettingsError(
                f"DetectorThresholds.regression_factor must be > 1, got {self.regression_factor}"
            )
        if self.baseline_windows < 1:
            raise LogicSettingsError("DetectorThresholds.baseline_windows must be >= 1")


def finding_id(agg: WindowAggregate) -> str:
    """Deterministic id: one finding per (stream key, config, window)."""
    return _Series.of(agg).finding_id(agg)


class _Series(NamedTuple):
    """How the windows of one stream's configuration are named: in a finding's summary,
    its id (without the window's start) and its baseline's key."""

    what: str
    id_prefix: str
    baseline_key: str

    @classmethod
    def of(cls, agg: WindowAggregate) -> _Series:
        stream = agg.stream_key
        return cls(
            what=f"{agg.kernel} with {agg.config_id} on {agg.device_key}",
            id_prefix=f"{stream}/{agg.config_id}/",
            baseline_key=f"{stream}|{agg.config_id}",
        )

    def finding_id(self, agg: WindowAggregate) -> str:
        """The id of the finding of ``agg``, a window of this series
        (:func:`finding_id`): stream key, configuration id and window start."""
        return f"{self.id_prefix}{agg.window_start:.6f}"


#: A regression baseline as the compiled writer takes and gives it: the windows, launches
#: and sum of durations (each window's mean times its launches) it was formed from.
BaselineState = tuple[int, int, float]


@dataclass
class _Baseline:
    windows: int = 0
    count: int = 0
    sum_us: float = 0.0
    # the window that fed it last (its start) and the state before it (not in snapshots)
    fed: float | None = None
    before: BaselineState = (0, 0, 0.0)

    @property
    def state(self) -> BaselineState:
        return self.windows, self.count, self.sum_us

    @property
    def mean_us(self) -> float:
        return self.sum_us / self.count if self.count else 0.0


class Detector:
    """Classifies window aggregates; remembers only per-config regression baselines."""

    def __init__(self, thresholds: DetectorThresholds | None = None) -> None:
        self.thresholds = thresholds or DetectorThresholds()
        self._baselines: dict[str, _Baseline] = {}
        # per (node, device, kernel, config): what every window of it is named by
        self._series: dict[tuple[str, int, str, str], _Series] = {}

    def classify(self, agg: WindowAggregate) -> Finding:
        """One finding for ``agg``; also feeds the config's baseline while it is forming."""
        series = self._series_of(agg)
        classification, evidence, summary = self._judge(agg, series)
        return Finding.of_window(
            agg,
            id=series.finding_id(agg),
            classification=classification,
            evidence=evidence,
            summary=summary,
        )

    def classify_wire(self, agg: WindowAggregate) -> tuple[Classification, bytes]:
        """:meth:`classify`'s classification and the finding's record bytes
        (``encode(classify(agg))``), without building the record: what publishing it
        takes (:meth:`Finding.wire_of_window`)."""
        series = self._series_of(agg)
        classification, evidence, summary = self._judge(agg, series)
        return classification, Finding.wire_of_window(
            agg,
            id=series.finding_id(agg),
            classification=classification,
            evidence=evidence,
            summary=summary,
        )

    def finding_id(self, agg: WindowAggregate) -> str:
        """:func:`finding_id` of ``agg``, from its series' names kept here."""
        return self._series_of(agg).finding_id(agg)

    def _series_of(self, agg: WindowAggregate) -> _Series:
        """The names of ``agg``'s stream and configuration (kept: a stream's windows
        are named alike every second)."""
        at = (agg.node, agg.device_index, agg.kernel, agg.config_id)
        series = self._series.get(at)
        if series is None:
            series = remember(self._series, at, _Series.of(agg))
        return series

    def _judge(self, agg: WindowAggregate, series: _Series) -> tuple[Classification, Evidence, str]:
        evidence = _roofline_evidence(agg)
        classification, summary = self._regression(agg, evidence, series) or self._classify(
            agg, evidence, series.what
        )
        # The device's state during the window travels with the finding, which is what
        # the alert agent reads (agents.logic.forecast's device series).
        for name in DEVICE_EVIDENCE:
            value = getattr(agg, name)
            if value is not None:
                evidence[name] = value
        return classification, evidence, summary

    def _regression(
        self, agg: WindowAggregate, evidence: Evidence, series: _Series
    ) -> tuple[Classification, str] | None:
        th = self.thresholds
        if agg.count < th.min_launches:
            return None
        key = series.baseline_key
        base = self._baselines.get(key)
        if base is None:  # (not setdefault: its default would be built every window)
            base = self._baselines[key] = _Baseline()
        if base.windows < th.baseline_windows:
            base.fed, base.before = agg.window_start, base.state
            base.windows += 1
            base.count += agg.count
            base.sum_us += agg.duration_mean_us * agg.count
            return None
        evidence["baseline_us"] = base.mean_us
        evidence["baseline_windows"] = base.windows
        ratio = finite_ratio(agg.duration_mean_us, base.mean_us)
        evidence["regression_ratio"] = ratio
        if ratio > th.regression_factor:
            return "regression", SUMMARIES["regression"].format(
                what=series.what, mean=agg.duration_mean_us, ratio=ratio, base=base.mean_us
            )
        return None

    def _classify(
        self, agg: WindowAggregate, ev: Evidence, what: str
    ) -> tuple[Classification, str]:
        th = self.thresholds
        mean = agg.duration_mean_us
        if agg.count == 0:
            return "balanced", SUMMARIES["no_launch"].format(what=what, failures=agg.failures)
        if mean < th.launch_bound_factor * agg.launch_overhead_us:
            return "launch_bound", SUMMARIES["launch_bound"].format(
                what=what, mean=mean, factor=th.launch_bound_factor, overhead=agg.launch_overhead_us
            )
        if not ev["roofline_known"]:
            return "roofline_unknown", SUMMARIES["roofline_unknown"].format(
                what=what, mean=mean, device_model=agg.device_model
            )
        memory_side = bool(ev["memory_bound"])
        bw, flops = agg.bw_fraction, agg.flops_fraction
        if memory_side and bw >= th.efficient_bw_fraction:
            return "memory_efficient", SUMMARIES["memory_efficient"].format(what=what, bw=bw)
        if not memory_side and flops >= th.compute_bound_flops_fraction:
            return "compute_bound", SUMMARIES["compute_bound"].format(what=what, flops=flops)
        causes = self.fixed_causes(agg)
        if agg.busy_fraction < th.low_busy_fraction and agg.idle_gap_mean_us > (
            th.idle_gap_ratio * mean
        ):
            causes.append(CAUSES["busy"].format(busy=agg.busy_fraction, idle=agg.idle_gap_mean_us))
        ev["underuse_causes"] = ",".join(causes)
        if causes:
            return "under_utilization", SUMMARIES["under_utilization"].format(
                what=what, causes="; ".join(causes), roof=max(bw, flops)
            )
        if memory_side:
            return "memory_bottleneck", SUMMARIES["memory_bottleneck"].format(
                what=what, bw=bw, intensity=agg.arithmetic_intensity
            )
        return "balanced", SUMMARIES["balanced"].format(what=what, bw=bw, flops=flops)

    def fixed_causes(self, agg: WindowAggregate) -> list[str]:
        """The causes of under-use that a window's configuration alone decides (waves,
        the tail wave, occupancy: the same for every window of it), in the order the
        summary gives them; the busy share (:data:`CAUSES` ``busy``) may follow."""
        th = self.thresholds
        causes = []
        tail = tail_fraction(agg)
        if agg.waves < th.min_waves:
            causes.append(CAUSES["waves"].format(waves=agg.waves))
        elif agg.waves < th.tail_max_waves and 0 < tail < th.tail_fraction:
            causes.append(CAUSES["tail"].format(waves=agg.waves, tail=tail))
        if agg.occupancy < th.min_occupancy:
            causes.append(
                CAUSES["occupancy"].format(occupancy=agg.occupancy, source=occupancy_source(agg))
            )
        return causes

    def series_names(self, agg: WindowAggregate) -> tuple[str, str, str]:
        """How the windows of ``agg``'s stream and configuration are named: in a
        finding's summary, its id (without the window's start) and its baseline's key."""
        return tuple(self._series_of(agg))  # type: ignore[return-value]

    def baseline_state(self, agg: WindowAggregate, *, before: bool = False) -> BaselineState:
        """The regression baseline of ``agg``'s stream and configuration, after the last
        window judged (its verdicts on later windows depend on nothing else it keeps);
        ``before``: as it was before ``agg``, where ``agg`` was the last window to feed it
        (so that a window judged can be judged again, :meth:`classify_wire_as`)."""
        base = self._baselines.get(self._series_of(agg).baseline_key)
        if base is None:
            return 0, 0, 0.0
        if before and base.fed == agg.window_start:
            return base.before
        return base.state

    def take_baseline(self, key: str, state: BaselineState) -> None:
        """The baseline of key ``key`` (:meth:`series_names`' third) as a compiled writer
        formed it from the windows it judged: the detector judges the series' later
        windows, where the writer leaves one to it, from there."""
        self._baselines[key] = _Baseline(*state)

    def classify_wire_as(
        self, agg: WindowAggregate, baseline: BaselineState
    ) -> tuple[Classification, bytes]:
        """:meth:`classify_wire` with the baseline of ``agg``'s series at ``baseline``,
        on a detector of the same kind and thresholds: this one's state is left as it is."""
        probe = type(self)(self.thresholds)
        probe._baselines[self._series_of(agg).baseline_key] = _Baseline(*baseline)
        return probe.classify_wire(agg)

    # -- state ----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state (thresholds and baselines)."""
        return {
            "version": _SNAPSHOT_VERSION,
            "thresholds": asdict(self.thresholds),
            "baselines": {
                k: {"windows": b.windows, "count": b.count, "sum_us": b.sum_us}
                for k, b in self._baselines.items()
            },
        }

    @classmethod
    def restore(cls, snapshot: Mapping[str, Any]) -> Detector:
        """Rebuild a detector from :meth:`snapshot` output."""
        if snapshot.get("version") != _SNAPSHOT_VERSION:
            raise SnapshotError(
                f"detector snapshot version {snapshot.get('version')!r} is not "
                f"{_SNAPSHOT_VERSION}; discard it (baselines rebuild from new windows)"
            )
        try:
            self = cls(DetectorThresholds(**snapshot["thresholds"]))
            self._baselines = {k: _Baseline(**b) for k, b in snapshot["baselines"].items()}
        except (KeyError, TypeError) as ex:
            raise SnapshotError(f"malformed detector snapshot: {ex!r}") from ex
        return self


def _roofline_evidence(agg: WindowAggregate) -> Evidence:
    """The evidence every finding of ``agg`` starts with, in its order (the compiled
    writer writes the same fields, native/src/written.rs)."""
    known = agg.roofline_known
    ridge = finite_ratio(agg.peak_gflops, agg.peak_gbs) if known else 0.0
    return {
        "roofline_known": known,
        "count": agg.count,
        "failures": agg.failures,
        "mean_us": agg.duration_mean_us,
        "p95_us": agg.duration_p95_us,
        "bw_fraction": agg.bw_fraction,
        "flops_fraction": agg.flops_fraction,
        "arithmetic_intensity": agg.arithmetic_intensity,
        "ridge_point": ridge,
        "memory_bound": agg.arithmetic_intensity < ridge,
        "occupancy": agg.occupancy,
        "occupancy_source": occupancy_source(agg),
        "waves": agg.waves,
        "tail_fraction": tail_fraction(agg),
        "busy_fraction": agg.busy_fraction,
        "idle_gap_mean_us": agg.idle_gap_mean_us,
        "launch_overhead_us": agg.launch_overhead_us,
    }


def occupancy_source(agg: WindowAggregate) -> str:
    """Where the registers and shared memory behind ``agg``'s occupancy came from."""
    return agg.resources_source or "estimate"


def tail_fraction(agg: WindowAggregate) -> float:
    """How full the last of ``agg``'s waves of blocks is (0: a whole wave)."""
    return agg.waves - math.floor(agg.waves)
