"""The compiled engine's writer of windows and findings (agents.logic.written,
native/src/written.rs) writes the bytes the Python path writes: the window record
``encode`` gives and the finding ``Detector.classify_wire`` gives, for windows of every
verdict, figures from the tiniest to the absurd, and names that JSON must escape; a window
it cannot promise that for is left to the Python path; a series it would write otherwise
stays on the Python path."""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest

from kernelstream.agents.logic.compiled_windows import CompiledWindows
from kernelstream.agents.logic.detection import Detector, DetectorThresholds
from kernelstream.agents.logic.windowing import (
    Windower,
    WindowFigures,
    WindowSpec,
    _meta,
    build_window,
    make_example_batch,
    window_template,
)
from kernelstream.agents.logic.written import UnwritableError, series_writer
from kernelstream.schemas import WindowAggregate, encode, native

pytestmark = pytest.mark.skipif(native.core is None, reason=native.describe())

_SIZE = 1.0
_GROUP = b"A100|saxpy|1048576"
_CONFIG = "block=128"


def _meta_of(rng: random.Random, node: str = "n1", **over: Any) -> dict[str, Any]:
    meta = _meta(make_example_batch([1.0], [5.0], [1], node=node))
    meta.update(
        occupancy=rng.choice([0.1, 0.5, 1.0]),
        waves=rng.choice([0.3, 1.2, 2.25, 3.9, 18.96]),
        launch_overhead_us=rng.choice([0.0, 3.0, 40.0]),
        bytes_moved=rng.choice([0.0, 8e6, 1e12]),
        flops=rng.choice([0.0, 2e6, 1e15]),
        peak_gbs=rng.choice([0.0, 2039.0]) if rng.random() < 0.2 else 2039.0,
        peak_gflops=19500.0,
        resources_source=rng.choice([None, "nvrtc 12.9 sm_80", 'odd "source" \\ é']),
    )
    meta.update(over)
    return meta


def _stats(rng: random.Random, mean_scale: float) -> tuple[Any, ...]:
    count = rng.choice([1, 5, 10, 11, 999, 26_667])
    mean = rng.choice([mean_scale, mean_scale * rng.uniform(0.5, 2.0), 0.25, 1.5e-7, 3.6e9])
    d_min, d_max = mean * rng.uniform(0.1, 1.0), mean * rng.uniform(1.0, 5.0)
    total = mean * count
    idle = rng.choice([0.0, mean * rng.uniform(0.5, 10.0), 1e-9])
    return (count, total, mean, mean * 0.1, idle, mean, d_max * 0.9, d_min, d_max)


def _python_window(
    template: Any, config_id: str, window: int, counts: tuple[int, ...], got: tuple[Any, ...]
) -> WindowAggregate:
    count, total, mean, std, idle, p50, p95, d_min, d_max = got
    figures = WindowFigures.compiled(total, mean, std, idle, p50, p95, d_min, d_max, _SIZE)
    failures, late, seq_min, seq_max = counts
    return build_window(
        template, config_id, window, _SIZE, (count, failures, late, seq_min, seq_max), figures
    )


def _frozen(detector: Detector, template: Any, config_id: str, mean: float) -> None:
    """Judge the series' first windows (of enough launches), which freeze its baseline."""
    for w in range(detector.thresholds.baseline_windows):
        got = (20, 20 * mean, mean, 0.0, 0.0, mean, mean, mean, mean)
        window = 1_700_000_000 + w
        detector.classify(_python_window(template, config_id, window, (0, 0, 0, 19), got))


def _writer(agg: WindowAggregate, template: Any, detector: Detector) -> Any:
    """The writer of ``agg``'s series, from the detector's baseline as it stands."""
    return series_writer(agg, template, detector, _GROUP, _SIZE, detector.baseline_state(agg))


@pytest.mark.parametrize("seed", range(6))
def test_the_writer_writes_what_the_python_path_writes(seed: int) -> None:
    rng = random.Random(seed)
    classes: Counter[str] = Counter()
    nodes = ["n1", 'quote"node', "back\\slash", "tab\tnewline\n", "ünïcødé ✓", "ctl\x01"]
    for i in range(150):
        meta = _meta_of(rng, node=rng.choice(nodes))
        template = window_template(meta)
        config_id = _CONFIG if rng.random() < 0.8 else 'block=128,"x"=\\'
        thresholds = DetectorThresholds(
            efficient_bw_fraction=rng.choice([0.0, 0.6, 0.9]),
            low_busy_fraction=rng.choice([0.5, 1.0, 1e9]),
        )
        detector = Detector(thresholds)
        base = rng.choice([5.0, 500.0, 6673.125])
        _frozen(detector, template, config_id, base)
        for j in range(8):
            got = _stats(rng, base * rng.choice([0.5, 1.0, 1.3, 3.0]))
            window = rng.choice([1_700_000_100 + j, 1_795_920_591, 0, 7])
            counts = (rng.choice([0, 3]), rng.choice([0, 2]), rng.randrange(10**6), 10**6 + j)
            agg = _python_window(template, config_id, window, counts, got)
            writer = _writer(agg, template, detector)
            assert writer is not None
            wrote = writer.write(window, counts, got)
            assert wrote is not None, (i, j, got)
            record, classification, finding = wrote
            assert record == encode(agg)
            assert (classification, finding) == detector.classify_wire(agg)
            classes[classification] += 1
    every = {
        "regression",
        "launch_bound",
        "memory_efficient",
        "under_utilization",
        "memory_bottleneck",
        "balanced",
    }
    if seed == 0:
        assert every | {"roofline_unknown", "compute_bound"} <= set(classes), classes
    else:
        assert len(classes) >= 5, classes


def test_figures_it_cannot_promise_are_left_to_the_python_path() -> None:
    rng = random.Random(7)
    meta = _meta_of(rng, launch_overhead_us=3.0)
    template = window_template(meta)
    detector = Detector()
    _frozen(detector, template, _CONFIG, 50.0)
    ok = (10, 500.0, 50.0, 1.0, 0.0, 50.0, 50.0, 50.0, 50.0)
    agg = _python_window(template, _CONFIG, 5, (0, 0, 0, 9), ok)
    writer = _writer(agg, template, detector)
    assert writer.write(5, (0, 0, 0, 9), ok) is not None
    for got in [
        (0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),  # no launch that ran
        (10, 500.0, 50.0, math.nan, 0.0, 50.0, 50.0, 50.0, 50.0),
        (10, math.inf, 50.0, 1.0, 0.0, 50.0, 50.0, 50.0, 50.0),
        (10, 500.0, 50.0, 1.0, 1e301, 50.0, 50.0, 50.0, 50.0),  # an absurd idle gap
        (10, 500.0, 1e-310, 1.0, 0.0, 50.0, 50.0, 50.0, 50.0),  # quotients past the largest
    ]:
        assert writer.write(5, (0, 0, 0, 9), got) is None, got


@pytest.mark.parametrize("seed", range(4))
def test_the_writer_forms_the_baseline_as_the_detector_does(seed: int) -> None:
    """From a series' first window on: windows of too few launches feed nothing, the
    first ones of enough launches form the baseline, later ones are judged against it;
    the writer's bytes and baseline are the detector's at every window, and the
    baseline it hands back with a window that fed it is the detector's after it."""
    rng = random.Random(100 + seed)
    judged: Counter[str] = Counter()
    formed: Counter[bool] = Counter()
    for i in range(40):
        meta = _meta_of(rng)
        template = window_template(meta)
        thresholds = DetectorThresholds(
            baseline_windows=rng.choice([1, 3, 5]), min_launches=rng.choice([1, 10, 12])
        )
        detector = Detector(thresholds)
        first = _python_window(template, _CONFIG, 1_700_000_000, (0, 0, 0, 0), _stats(rng, 5.0))
        writer = _writer(first, template, detector)
        assert writer.baseline == (0, 0, 0.0)
        for j in range(10):
            got = _stats(rng, rng.choice([5.0, 50.0, 700.0]))
            window = 1_700_000_000 + j
            counts = (rng.choice([0, 3]), 0, j * 100, j * 100 + 99)
            agg = _python_window(template, _CONFIG, window, counts, got)
            wrote = writer.write(window, counts, got)
            assert wrote is not None, (i, j, got)
            assert wrote == (encode(agg), *detector.classify_wire(agg)), (i, j)
            assert writer.baseline == detector.baseline_state(agg), (i, j)
            judged["against a baseline" if b'"baseline_us"' in wrote[2] else "not"] += 1
        formed[writer.baseline[0] == thresholds.baseline_windows] += 1
    assert judged["against a baseline"] >= 50 and judged["not"] >= 50, judged
    assert formed[True] >= 10 and formed[False] >= 1, formed


def test_the_detector_judges_again_from_the_baseline_before_a_window() -> None:
    """What the learning check of a writer reads: the baseline before the last window
    that fed it, a window judged again from there without touching the detector's
    state, and a baseline a writer formed taken over."""
    rng = random.Random(12)
    template = window_template(_meta_of(rng))
    detector = Detector()
    got = (20, 1000.0, 50.0, 0.0, 0.0, 50.0, 50.0, 50.0, 50.0)
    aggs = [_python_window(template, _CONFIG, w, (0, 0, 0, 19), got) for w in range(5)]
    wires = [detector.classify_wire(agg) for agg in aggs]
    assert detector.baseline_state(aggs[4]) == (3, 60, 3000.0)
    assert detector.baseline_state(aggs[2], before=True) == (2, 40, 2000.0)
    assert detector.baseline_state(aggs[4], before=True) == (3, 60, 3000.0)  # fed nothing
    for agg, wire in zip(aggs, wires, strict=True):
        before = detector.baseline_state(agg, before=True)
        if agg is aggs[2] or agg is aggs[4]:
            assert detector.classify_wire_as(agg, before) == wire
    assert detector.baseline_state(aggs[0]) == (3, 60, 3000.0)  # left as it was
    detector.take_baseline(detector.series_names(aggs[0])[2], (1, 7, 8.5))
    assert detector.baseline_state(aggs[0]) == (1, 7, 8.5)
    assert "fed" not in str(detector.snapshot())  # a snapshot holds the baseline alone
    assert Detector.restore(detector.snapshot()).baseline_state(aggs[0]) == (1, 7, 8.5)


def test_no_writer_for_absurd_constants() -> None:
    rng = random.Random(8)
    got = (20, 1000.0, 50.0, 0.0, 0.0, 50.0, 50.0, 50.0, 50.0)
    detector = Detector()
    absurd = window_template(_meta_of(rng, bytes_moved=1e305))
    agg = _python_window(absurd, _CONFIG, 3, (0, 0, 0, 19), got)
    _frozen(detector, absurd, _CONFIG, 50.0)
    with pytest.raises(UnwritableError):
        _writer(agg, absurd, detector)


class _Otherwise(Detector):
    """A detector whose findings differ from what the writer it hands over writes."""

    def classify_wire(self, agg: WindowAggregate) -> tuple[Any, bytes]:
        classification, value = super().classify_wire(agg)
        return classification, value[:-1] + b',"x":1}'


def test_a_series_written_otherwise_stays_on_the_python_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    windower = Windower(WindowSpec(size_s=_SIZE))
    compiled = CompiledWindows.of(windower)
    assert compiled is not None
    compiled.learning = True
    rng = random.Random(9)
    meta = _meta_of(rng)
    compiled._index(meta)  # the engine's meta index 0
    template = compiled._templates[0]
    detector = _Otherwise()
    _frozen(detector, template, _CONFIG, 50.0)
    got = (20, 1000.0, 50.0, 0.0, 0.0, 50.0, 50.0, 50.0, 50.0)
    agg = _python_window(template, _CONFIG, 3, (0, 0, 0, 19), got)
    compiled.engine.adopt(agg.stream_key, -math.inf, -math.inf, None, -1, [])
    compiled._fresh.append((agg, 0, 3, (0, 0, 0, 19), got))
    with caplog.at_level(logging.WARNING):
        assert compiled.learn(detector, lambda _: _GROUP, lambda _: True) == 1
    assert compiled.writing() == 0
    assert "stay on the Python path" in caplog.text
    # the same series, judged as the writer writes: handed over
    compiled._unwritable.clear()
    compiled._fresh.append((agg, 0, 3, (0, 0, 0, 19), got))
    plain = Detector()
    _frozen(plain, template, _CONFIG, 50.0)
    compiled.learn(plain, lambda _: _GROUP, lambda _: True)
    assert compiled.writing() == 1
    # given back (a message the engine does not take): the writer is forgotten
    compiled.release([agg.stream_key])
    assert compiled.writing() == 0


def test_a_stream_keeps_the_writers_of_its_open_configurations_only() -> None:
    """The tuner moves a stream from one configuration to the next: the writers of those
    with no window open go when another is handed one (learnt again if it comes back)."""
    windower = Windower(WindowSpec(size_s=_SIZE))
    compiled = CompiledWindows.of(windower)
    assert compiled is not None
    rng = random.Random(10)
    meta = _meta_of(rng)
    compiled._index(meta)
    template = compiled._templates[0]
    detector = Detector()
    _frozen(detector, template, _CONFIG, 50.0)
    got = (20, 1000.0, 50.0, 0.0, 0.0, 50.0, 50.0, 50.0, 50.0)
    agg = _python_window(template, _CONFIG, 3, (0, 0, 0, 19), got)
    writer = _writer(agg, template, detector)
    engine = compiled.engine
    t = np.array([3.5])
    one_open = [(4, "block=64", 0, t, t, 0, 0, 20, 20)]
    engine.adopt(agg.stream_key, 3.5, 3.5, None, 20, one_open)
    assert engine.write_as(agg.stream_key, 0, "block=64", writer)  # its window is open
    assert engine.write_as(agg.stream_key, 0, _CONFIG, writer)
    assert engine.writing() == 2
    for config in ("block=256", "block=512", "block=1024"):  # none of them open
        assert engine.write_as(agg.stream_key, 0, config, writer)
        assert engine.writing() == 2  # block=64's (open) and the newest's
    assert not engine.write_as("a stream it does not hold", 0, _CONFIG, writer)


@pytest.mark.parametrize(
    "over",
    [
        {"config": {"block": -(1 << 53)}},  # the first figure's marker, as a value
        {"config": {"window_start": -(1 << 53)}},  # ... under the figure's own key
        {"node": 'n"window_start":-9007199254740992,'},
        {"kernel": "-9007199254741010"},
    ],
)
def test_a_record_holding_a_markers_digits_stays_on_the_python_path(
    over: dict[str, Any],
) -> None:
    meta = _meta_of(random.Random(11), **over)
    template = window_template(meta)
    detector = Detector()
    _frozen(detector, template, _CONFIG, 50.0)
    got = (20, 1000.0, 50.0, 0.0, 0.0, 50.0, 50.0, 50.0, 50.0)
    agg = _python_window(template, _CONFIG, 3, (0, 0, 0, 19), got)
    with pytest.raises(UnwritableError, match="marker"):
        _writer(agg, template, detector)
