"""Predictive alerts: trends fitted to window history, forecast to cross a threshold.

A :class:`Forecaster` is fed findings (one per closed window, carrying the window's
mean duration) in the order the findings topic carries them. It keeps two kinds of
series per kernel configuration:

* ``stream``: one kernel on one device (``node:device/kernel`` and config id);
* ``fleet_group``: that configuration on every device of its fleet group
  (``device_model/workload/size``), all nodes' windows on one time axis;

and two per device (``node:device``), from the device samples each window carries in
its finding's evidence (whatever kernel it is of): ``sm_clock_mean_mhz`` forecast to
sag below ``clock_sag_fraction`` of the model's boost clock, and ``mem_used_max_bytes``
forecast to fill past ``memory_fill_fraction`` of its memory
(:func:`kernels.devices.clocks_memory`; a model not listed there has no threshold and
raises no device alert). A falling clock is fitted as a rising negated clock, so the
same fit, confidence, confirmation and withdrawal rules serve both.

Every ``eval_every_s`` of a series' event time it fits a straight line to the last
``history_s`` of points by ordinary least squares (:func:`scipy.stats.linregress`)
and asks how likely the line is to reach the threshold (``threshold_factor`` times
the series' baseline, by default the detector's ``regression`` factor) within
``horizon_s``: the probability, under the Student t distribution of the fitted
slope, that the slope is at least the one needed to get there in time. The slope's
standard error is widened for correlated residuals (an AR(1) effective sample size),
and a fit that one step between two levels explains better than the line counts as
no trend, so a seasonal swing or a step change is not taken for a drift. An alert is
raised when that confidence reaches ``raise_confidence`` on ``confirm`` successive
evaluations, withdrawn when the slope turns non-positive or the confidence falls
below ``withdraw_confidence``, and closed as ``crossed`` when the fitted level
reaches the threshold (the detector's own ``regression`` finding takes over there).

The baseline of a stream series is the detector's (``evidence["baseline_us"]``), so
an alert forecasts the very regression the detector will report; a fleet group's is
the median of its first ``baseline_points`` points.

Input the forecast cannot use is refused with a reason (the agent dead-letters it):
a window without a successful launch (no measurement: a hole in the series), one at
or before the series' last point (out of order or repeated), and one after a gap of
more than ``max_gap_s`` (the history before it is discarded and any alert on it
withdrawn: a line must not be fitted across a hole).

Pure logic: no Faust or Kafka import; time is the findings' event time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from kernelstream.agents.logic.detection import DEVICE_EVIDENCE
from kernelstream.agents.logic.errors import LogicSettingsError
from kernelstream.agents.logic.transfers import is_host_finding
from kernelstream.kernels.devices import clocks_memory
from kernelstream.schemas import Alert, Finding
from kernelstream.schemas.keys import group_key
from kernelstream.schemas.records import AlertScope, AlertState

__all__ = ["AlertProblem", "ForecastSettings", "Forecaster"]

METRIC = "duration_mean_us"


@dataclass(frozen=True)
class ForecastSettings:
    """How trends are fitted and when they raise or withdraw an alert.

    Args:
        threshold_factor: the threshold is this times the series' baseline (the
            detector's ``regression_factor`` by default).
        history_s: the fit uses the points of the last ``history_s`` seconds.
        min_span_s: no forecast before the history spans this long.
        min_points: no forecast from fewer points.
        baseline_points: a fleet group's baseline is the median of its first points.
        horizon_s: how far ahead a crossing is forecast.
        eval_every_s: a series is re-fitted at most this often (event time).
        raise_confidence: the probability of a crossing within ``horizon_s`` that
            raises an alert, held on ``confirm`` successive fits.
        withdraw_confidence: an alert is withdrawn once the probability falls below this.
        max_gap_s: a longer silence in a series restarts its history.
        bin_s: windows are averaged into bins of this length (a point of the fit is
            a bin), which bounds a series' memory at ``history_s / bin_s`` entries.
        fit_fractions: lines are fitted to these fractions of ``history_s`` (the most
            recent part); the least confident one decides. ``(0.5, 1.0)`` halves the
            false alarms on slow seasonal swings but shortens the lead and misses more
            slow drifts (``kernelstream bench alerts``, docs/guide/alerts.md).
    """

    threshold_factor: float = 1.2
    history_s: float = 3600.0
    min_span_s: float = 1200.0
    min_points: int = 30
    baseline_points: int = 10
    horizon_s: float = 3600.0
    eval_every_s: float = 30.0
    raise_confidence: float = 0.99
    confirm: int = 3
    withdraw_confidence: float = 0.5
    max_gap_s: float = 600.0
    bin_s: float = 10.0
    fit_fractions: tuple[float, ...] = (1.0,)
    clock_sag_fraction: float = 0.8
    memory_fill_fraction: float = 0.95

    def __post_init__(self) -> None:
        if not (0 < self.clock_sag_fraction < 1 and 0 < self.memory_fill_fraction <= 1):
            raise LogicSettingsError(
                "ForecastSettings needs 0 < clock_sag_fraction < 1 and "
                "0 < memory_fill_fraction <= 1"
            )
        if self.threshold_factor <= 1.0:
            raise LogicSettingsError(
                f"ForecastSettings.threshold_factor must be > 1, got {self.threshold_factor}"
            )
        if not 0.0 < self.withdraw_confidence < self.raise_confidence < 1.0:
            raise LogicSettingsError(
                "ForecastSettings needs 0 < withdraw_confidence < raise_confidence < 1"
            )
        if self.min_points < 3 or self.confirm < 1 or self.baseline_points < 1:
            raise LogicSettingsError(
                "ForecastSettings needs min_points >= 3, confirm >= 1, baseline_points >= 1"
            )
        durations = (self.history_s, self.horizon_s, self.eval_every_s, self.max_gap_s, self.bin_s)
        if not all(math.isfinite(d) and d > 0 for d in durations):
            raise LogicSettingsError("ForecastSettings durations must be finite and > 0")
        if not self.fit_fractions or not all(0 < f <= 1 for f in self.fit_fractions):
            raise LogicSettingsError("ForecastSettings.fit_fractions must lie in (0, 1]")


@dataclass(frozen=True)
class AlertProblem:
    """Why a finding could not feed the forecast (the agent dead-letters it)."""

    code: str  # a reason code of schemas.codec.REASON_CODES
    reason: str


#: The marker of a window its stream already passed (skipped; never dead-lettered).
_REPEATED = AlertProblem("repeated", "a window its stream already passed")


@dataclass(frozen=True)
class _Fit:
    level: float  # the line's value at the last point
    slope: float  # per second
    confidence: float  # P(crossing within the horizon)
    lead_s: float | None  # time to the crossing along the line; None when never


@dataclass
class _Series:
    scope: AlertScope
    key: str
    ref: Finding  # the first finding: names the kernel, device and config
    baseline: float | None = None
    # bin index -> [sum of values, count]: the history at ``bin_s`` resolution, so a
    # series holds at most history_s / bin_s entries whatever the window length.
    bins: dict[int, list[float]] = field(default_factory=dict)
    last_t: float = -math.inf
    last_eval_t: float = -math.inf
    streak: int = 0
    alert_id: str | None = None
    alert_lead_s: float | None = None
    streams: set[str] = field(default_factory=set)  # a fleet group's contributors
    metric: str = METRIC
    # A device series' threshold, in the fitted (signed) units; None: relative to the
    # baseline (kernel durations). ``sign`` -1 fits a falling quantity as a rising one.
    threshold: float | None = None
    sign: float = 1.0


class Forecaster:
    """Per-series trend forecasts over findings; emits :class:`Alert` records.

    >>> f = Forecaster()
    >>> f.active_alerts()
    []
    """

    def __init__(self, settings: ForecastSettings | None = None) -> None:
        self.settings = settings or ForecastSettings()
        self._series: dict[str, _Series] = {}
        self._last_expiry = -math.inf
        #: windows skipped because their stream had already passed them (repeats)
        self.repeated = 0

    def observe(self, finding: Finding) -> tuple[list[Alert], AlertProblem | None]:
        """Feed one finding; the alerts it raises, withdraws or closes, and why the
        finding was refused (None when it was used).

        A host-side finding (copies, host gaps) repeats the measurement of its window's
        own finding: it is skipped, neither used nor refused.
        """
        if is_host_finding(finding):
            return [], None
        problem = _measurement_problem(finding)
        if problem is not None:
            return [], problem
        alerts: list[Alert] = []
        problems: list[AlertProblem] = []
        device = f"{finding.node}:{finding.device_index}"
        # The stream series first: a window it refuses (repeated, out of order) must not
        # count in the fleet group either; the group itself takes its nodes' windows in
        # any order relative to each other.
        for scope, key, baseline in _series_of(finding, device):
            name = f"{scope}|{key}|{finding.config_id}"
            series = self._series.get(name)
            if series is None:
                series = self._series[name] = _Series(scope, key, finding)
            out, prob = self._add(series, finding, baseline, device=device)
            alerts += out
            if prob is not None:
                problems.append(prob)
                if prob is _REPEATED:
                    break
        device_alerts, device_problem = self._observe_device(finding)
        alerts += device_alerts
        if device_problem is not None:
            problems.append(device_problem)
        alerts += self._expire(finding.window_end)
        problems = [p for p in problems if p is not _REPEATED]
        return alerts, problems[0] if problems else None

    def _observe_device(self, finding: Finding) -> tuple[list[Alert], AlertProblem | None]:
        """The device series the finding's device samples feed (none without samples)."""
        ev = finding.evidence
        if all(ev.get(m) is None for m in DEVICE_EVIDENCE):  # most findings: no samples
            return [], None
        values = {m: ev.get(m) for m in DEVICE_EVIDENCE}
        boost_mhz, memory_bytes, _ = clocks_memory(finding.device_model)
        key = f"{finding.node}:{finding.device_index}"
        mem = values["mem_used_max_bytes"]
        if memory_bytes and isinstance(mem, int | float) and mem > memory_bytes:
            return [], AlertProblem(
                "out_of_range",
                f"{key} ({finding.device_model}) reports {mem:.0f} bytes of memory used, more "
                f"than its {memory_bytes} bytes (kernels/devices.py)",
            )
        st = self.settings
        thresholds = {
            "sm_clock_mean_mhz": (-st.clock_sag_fraction * boost_mhz, -1.0, boost_mhz > 0),
            "mem_used_max_bytes": (st.memory_fill_fraction * memory_bytes, 1.0, memory_bytes > 0),
        }
        alerts: list[Alert] = []
        problem = None
        for metric, value in values.items():
            threshold, sign, known = thresholds[metric]
            if not isinstance(value, int | float) or not known:
                continue
            name = f"device|{key}|{metric}"
            series = self._series.get(name)
            if series is None:
                series = self._series[name] = _Series(
                    "device", key, finding, metric=metric, threshold=threshold, sign=sign
                )
            out, prob = self._add(series, finding, None, sign * float(value))
            alerts += out
            problem = problem or prob
        return alerts, problem

    def active_alerts(self) -> list[tuple[str, str, float | None]]:
        """``(alert id, series key, lead_s at raising)`` of every alert now raised."""
        return sorted(
            (s.alert_id, s.key, s.alert_lead_s)
            for s in self._series.values()
            if s.alert_id is not None
        )

    def _expire(self, now: float) -> list[Alert]:
        """Withdraw alerts on series silent for ``max_gap_s`` and forget those series
        (a configuration the tuner replaced, a kernel that stopped). Runs at most every
        ``eval_every_s`` of event time: it looks at every series."""
        if now - self._last_expiry < self.settings.eval_every_s:
            return []
        self._last_expiry = now
        out = []
        for name, s in list(self._series.items()):
            if now - s.last_t > self.settings.max_gap_s:
                if s.alert_id is not None:
                    out.append(self._alert(s, "withdrawn", None, s.last_t, "the series stopped"))
                del self._series[name]
        return out

    # -- one series ------------------------------------------------------------------

    def _add(
        self,
        s: _Series,
        finding: Finding,
        baseline: float | None,
        value: float | None = None,
        device: str | None = None,
    ) -> tuple[list[Alert], AlertProblem | None]:
        """Add ``finding``'s value (its mean duration, or ``value``) to series ``s``;
        ``device``: its ``node:device_index``, where the caller has it already."""
        t = finding.window_end
        y = finding.duration_mean_us if value is None else value
        if s.scope == "stream" and t <= s.last_t:
            # A window its stream already passed: a worker that restarts from its
            # checkpoint publishes its windows again (at least once; consumers dedupe
            # by the window's identity). Skipped and counted, never used twice, and not
            # a dead letter: after a crash it is the expected case, not bad input.
            self.repeated += 1
            return [], _REPEATED
        out: list[Alert] = []
        if t - s.last_t > self.settings.max_gap_s and s.bins:
            gap = t - s.last_t
            if s.alert_id is not None:
                out.append(self._alert(s, "withdrawn", None, s.last_t, "a gap in the series"))
                s.alert_id, s.alert_lead_s = None, None
            s.bins.clear()
            s.baseline, s.streak, s.last_t = None, 0, t
            return out, AlertProblem(
                "series_gap",
                f"{gap:.0f} s without a window before this one ({s.key}, config "
                f"{finding.config_id}; limit {self.settings.max_gap_s:.0f} s): the trend's "
                "history restarts with the next window",
            )
        acc = s.bins.setdefault(math.floor(t / self.settings.bin_s), [0.0, 0])
        acc[0] += y
        acc[1] += 1
        s.last_t = max(s.last_t, t)
        s.streams.add(device or f"{finding.node}:{finding.device_index}")
        self._set_baseline(s, baseline)
        if s.last_t - s.last_eval_t >= self.settings.eval_every_s:
            s.last_eval_t = s.last_t
            oldest = math.floor((s.last_t - self.settings.history_s) / self.settings.bin_s)
            for b in [b for b in s.bins if b < oldest]:
                del s.bins[b]
            out += self._evaluate(s)
        return out, None

    def _set_baseline(self, s: _Series, baseline: float | None) -> None:
        if baseline is not None and baseline > 0:
            s.baseline = baseline
        elif (
            s.scope != "stream"
            and s.baseline is None
            and len(s.bins) >= self.settings.baseline_points
        ):
            s.baseline = float(np.median([v / n for v, n in s.bins.values()]))

    def _threshold(self, s: _Series) -> float:
        """The series' threshold in its fitted units (negated for a falling quantity)."""
        if s.threshold is not None:
            return s.threshold
        assert s.baseline is not None
        return s.baseline * self.settings.threshold_factor

    def _evaluate(self, s: _Series) -> list[Alert]:
        fit = self._fit(s)
        if fit is None:
            return []
        st = self.settings
        threshold = self._threshold(s)
        if s.alert_id is not None:
            if fit.level >= threshold:
                return [self._close(s, fit, "crossed", "the trend reached the threshold")]
            if fit.slope <= 0 or fit.confidence < st.withdraw_confidence:
                why = "the trend reversed" if fit.slope <= 0 else "the trend flattened"
                return [self._close(s, fit, "withdrawn", why)]
            return []
        below = fit.level < threshold
        s.streak = s.streak + 1 if below and fit.confidence >= st.raise_confidence else 0
        if s.streak < st.confirm:
            return []
        s.streak = 0
        s.alert_id = f"{s.scope}|{s.key}|{self._tag(s)}|{s.last_t:.3f}"
        s.alert_lead_s = fit.lead_s
        return [self._alert(s, "raised", fit, s.last_t, "")]

    def _close(self, s: _Series, fit: _Fit, state: AlertState, why: str) -> Alert:
        alert = self._alert(s, state, fit, s.last_t, why)
        s.alert_id, s.alert_lead_s = None, None
        return alert

    def _fit(self, s: _Series) -> _Fit | None:
        """The least confident of the line fits over the ``fit_fractions`` of the
        history (by default the whole of it); none where a single step explains one
        better than a line, so a step is not taken for a drift."""
        st = self.settings
        if s.baseline is None or len(s.bins) < st.min_points:
            return None
        if s.scope == "fleet_group" and len(s.streams) < 2:
            return None  # one device: its stream series says the same
        x_all, y_all = _points(s, st.bin_s)
        if x_all[-1] - x_all[0] < st.min_span_s:
            return None
        x_all = x_all - x_all[-1]
        threshold = self._threshold(s)
        best: _Fit | None = None
        for length in (st.history_s * f for f in st.fit_fractions):
            keep = x_all >= -length
            if keep.sum() < st.min_points or -x_all[keep][0] < 0.9 * length:
                continue
            fit = _line_fit(x_all[keep], y_all[keep], threshold, st.horizon_s)
            if fit is None:  # a step, or a swing a step explains better: no trend
                return None
            if best is None or fit.confidence < best.confidence:
                best = fit
        return best

    @staticmethod
    def _tag(s: _Series) -> str:
        """What an alert id names besides scope and key: the config, or a device metric."""
        return s.metric if s.scope == "device" else s.ref.config_id

    def _alert(self, s: _Series, state: AlertState, fit: _Fit | None, at: float, why: str) -> Alert:
        ref, sign = s.ref, s.sign
        baseline = sign * s.baseline if s.baseline is not None else 0.0
        threshold = sign * self._threshold(s) if s.baseline is not None or s.threshold else 0.0
        level = sign * (fit.level if fit is not None else _last_mean(s))
        lead = fit.lead_s if fit is not None and state == "raised" else None
        kernel = s.scope != "device"
        return Alert(
            id=s.alert_id or f"{s.scope}|{s.key}|{self._tag(s)}|{at:.3f}",
            state=state,
            scope=s.scope,
            key=s.key,
            metric=s.metric,
            node=ref.node if s.scope != "fleet_group" else None,
            device_index=ref.device_index if s.scope != "fleet_group" else None,
            device_model=ref.device_model,
            kernel=ref.kernel if kernel else None,
            workload=ref.workload if kernel else None,
            problem_size=list(ref.problem_size) if kernel else [],
            config_id=ref.config_id if kernel else None,
            baseline=max(baseline, 0.0),
            threshold=max(threshold, 0.0),
            level=max(level, 0.0),
            slope_per_h=sign * (fit.slope if fit is not None else 0.0) * 3600.0,
            lead_s=lead,
            predicted_at=at + lead if lead is not None else None,
            confidence=fit.confidence if fit is not None else 0.0,
            points=len(s.bins),
            at=at,
            summary=_summary(s, state, fit, lead, threshold, why),
        )


_DEVICE_WORDS = {
    "sm_clock_mean_mhz": ("SM clock", "MHz", "falling", 1.0),
    "mem_used_max_bytes": ("memory used", "GiB", "rising", float(1 << 30)),
}


def _summary(
    s: _Series, state: str, fit: _Fit | None, lead: float | None, threshold: float, why: str
) -> str:
    if s.scope == "device":
        what = f"device {s.key} ({s.ref.device_model}) {_DEVICE_WORDS[s.metric][0]}"
    else:
        what = f"{s.ref.kernel} ({s.scope} {s.key}, config {s.ref.config_id})"
    if state != "raised" or fit is None or lead is None:
        return f"{what}: alert {state}: {why}"
    if s.scope == "device":
        _, unit, trend, scale = _DEVICE_WORDS[s.metric]
        return (
            f"{what}: {s.sign * fit.level / scale:.1f} {unit} {trend} "
            f"{abs(fit.slope) * 3600 / scale:.1f} {unit}/h, forecast to cross "
            f"{threshold / scale:.1f} {unit} in {lead / 60:.0f} min, confidence "
            f"{fit.confidence:.3f}"
        )
    return (
        f"{what}: mean duration {fit.level:.1f} us rising {fit.slope * 3600:.1f} us/h, "
        f"forecast to cross {threshold:.1f} us (the regression threshold) in "
        f"{lead / 60:.0f} min, confidence {fit.confidence:.3f}"
    )


def _points(s: _Series, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The history as (bin centre time, mean value) arrays, oldest first."""
    keys = sorted(s.bins)
    x = (np.asarray(keys, dtype=np.float64) + 0.5) * bin_s
    y = np.asarray([s.bins[k][0] / s.bins[k][1] for k in keys])
    return x, y


def _last_mean(s: _Series) -> float:
    if not s.bins:
        return 0.0
    total, n = s.bins[max(s.bins)]
    return total / n


def _line_fit(x: np.ndarray, y: np.ndarray, threshold: float, horizon_s: float) -> _Fit | None:
    """OLS line through ``(x, y)`` (x: seconds before the last point) and the
    probability that it reaches ``threshold`` within ``horizon_s``; None where one
    step between two flat levels explains the points better than the line."""
    res = stats.linregress(x, y)
    slope, level = float(res.slope), float(res.intercept)
    resid = y - (level + slope * x)
    if _step_sse(y) < 0.75 * float(np.dot(resid, resid)):
        return None
    n_eff = _effective_points(resid)
    # linregress's standard error assumes independent residuals; a seasonal swing
    # leaves them correlated, which would make any bend look certain.
    stderr = float(res.stderr) * math.sqrt((len(x) - 2) / max(n_eff - 2, 1.0))
    needed = (threshold - level) / horizon_s  # the slope that gets there in time
    if stderr > 0 and math.isfinite(stderr):
        conf = float(stats.t.cdf((slope - needed) / stderr, df=max(n_eff - 2, 1.0)))
    else:  # a perfect line: certain either way
        conf = 1.0 if slope >= needed else 0.0
    lead = (threshold - level) / slope if slope > 0 else None
    return _Fit(level, slope, conf, max(lead, 0.0) if lead is not None else None)


def _step_sse(y: np.ndarray) -> float:
    """Residual sum of squares of the best split of ``y`` into two flat levels
    (each at least a tenth of the points), from cumulative sums."""
    n = len(y)
    lo = max(n // 10, 2)
    if n - 2 * lo < 1:
        return math.inf
    c1, c2 = np.cumsum(y), np.cumsum(y * y)
    k = np.arange(lo, n - lo + 1)
    left = c2[k - 1] - c1[k - 1] ** 2 / k
    right = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (n - k)
    return float(np.min(left + right))


def _effective_points(residuals: np.ndarray) -> float:
    """Independent points the residuals are worth under an AR(1) model of their noise.

    ``n (1 - r1) / (1 + r1)`` with ``r1`` their lag-1 autocorrelation (Santer et al.
    2000, "Statistical significance of trends and trend differences in layer-average
    atmospheric temperature time series", J. Geophys. Res. 105(D6)); white noise keeps
    every point, a slow swing around the line keeps few.
    """
    n = len(residuals)
    centred = residuals - residuals.mean()
    denom = float(np.dot(centred, centred))
    if n < 3 or denom <= 0:
        return float(n)
    r1 = float(np.dot(centred[:-1], centred[1:])) / denom
    r1 = min(max(r1, 0.0), 0.99)
    return max(n * (1 - r1) / (1 + r1), 3.0)


def _measurement_problem(finding: Finding) -> AlertProblem | None:
    if finding.count - finding.failures <= 0 or finding.duration_mean_us <= 0:
        return AlertProblem(
            "series_gap",
            f"window {finding.window_start:.3f}-{finding.window_end:.3f} of "
            f"{finding.node}:{finding.device_index}/{finding.kernel} has no successful "
            "launch, so no duration to forecast from",
        )
    if finding.window_end <= finding.window_start:
        return AlertProblem(
            "out_of_range",
            f"window ends ({finding.window_end:.3f}) before it starts ({finding.window_start:.3f})",
        )
    return None


def _series_of(finding: Finding, device: str) -> Iterable[tuple[AlertScope, str, float | None]]:
    """The series ``finding`` feeds: its stream's, then its fleet group's (``device``: its
    ``node:device_index``)."""
    base = finding.evidence.get("baseline_us")
    stream_baseline = float(base) if isinstance(base, int | float) and base > 0 else None
    yield "stream", f"{device}/{finding.kernel}", stream_baseline
    group = group_key(finding.device_model, finding.workload, finding.problem_size)
    yield "fleet_group", group, None
