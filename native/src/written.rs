//! A closed window's record and its finding, written as bytes (`SeriesWriter`).
//!
//! Once the Python detector has judged a window of one (stream, configuration), every
//! later window of it is judged by rules whose inputs are the window's figures, constants
//! of the series (the record's fields but its figures, the device's roofline, the
//! detector's thresholds, the summaries' texts) and its regression baseline, which the
//! writer goes on forming from the windows it writes, as the detector would, and hands
//! back with each window that changed it (the detector keeps it in step). `agents/logic/written.py` hands those constants over, already
//! rendered where they are text (JSON fragments, escaped strings, the summaries' templates
//! with the series' own fields filled in), and the engine then writes the window record
//! and the finding of each window it closes without a Python object per window: the bytes
//! `schemas.codec.encode` and `Detector.classify_wire` give, figure for figure (the same
//! operations in the same order), each float as orjson writes it.
//!
//! The Python detector stays the reference. A window the writer cannot promise the same
//! bytes for (a figure that is not finite, or so large that the evidence's sum could
//! overflow, a window without a launch that ran) is left to it (`write` gives None), and
//! the tests hold the two equal on the same windows.

use std::io::Write;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// Fields a summary's template reads from the window (`agents.logic.written.FIELDS`).
const FIELD_NONE: u8 = 0;
const FIELD_MEAN: u8 = 1;
const FIELD_RATIO: u8 = 2;
const FIELD_BW: u8 = 3;
const FIELD_FLOPS: u8 = 4;
const FIELD_ROOF: u8 = 5;
const FIELD_CAUSES: u8 = 6;
const FIELD_BUSY: u8 = 7;
const FIELD_IDLE: u8 = 8;
// the series' own: its names (escaped text) and numbers
const FIELD_WHAT: u8 = 9;
const FIELD_DEVICE_MODEL: u8 = 10;
const FIELD_OVERHEAD: u8 = 11;
const FIELD_INTENSITY: u8 = 12;
const FIELD_BASE: u8 = 13;

/// How a field is formatted: as is (`""`), `.Nf` or `.N%`.
const SPEC_PLAIN: u8 = 0;
const SPEC_FIXED: u8 = 1;
const SPEC_PERCENT: u8 = 2;

/// A template: (literal text, already escaped for a JSON string; the field after it;
/// its format; its precision), in order.
type Template = Vec<(Vec<u8>, u8, u8, usize)>;

/// The classifications the writer gives, in the order of its templates.
const CLASSES: [&str; 7] = [
    "regression",
    "launch_bound",
    "roofline_unknown",
    "memory_efficient",
    "compute_bound",
    "under_utilization",
    "memory_bottleneck",
];
const BALANCED: &str = "balanced";

/// Above this a figure is left to the Python detector: the evidence's floats (about
/// twenty) then cannot sum past the largest float, which the detector's finiteness check
/// would see (`schemas.records._finite_evidence`).
const LARGE: f64 = 1e300;

/// A figure of a window record.
#[derive(Clone, Copy)]
enum Figure {
    Float(f64),
    Int(i64),
}

/// The window's figures the rules and the records read.
struct Figures {
    window_start: f64,
    window_end: f64,
    count: i64,
    failures: i64,
    mean: f64,
    p95: f64,
    bw: f64,
    flops: f64,
    busy: f64,
    idle: f64,
    ratio: f64,
    roof: f64,
    base: f64,
    causes: Vec<Vec<u8>>,
}

/// A regression baseline (`detection._Baseline`): windows, launches and the sum of their
/// durations (each window's mean times its launches) it was formed from.
pub type Baseline = (i64, i64, f64);

/// The detector's thresholds the rules read (`DetectorThresholds`, by its field names).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct Thresholds {
    efficient_bw_fraction: f64,
    compute_bound_flops_fraction: f64,
    low_busy_fraction: f64,
    idle_gap_ratio: f64,
    launch_bound_factor: f64,
    regression_factor: f64,
    min_launches: i64,
    baseline_windows: i64,
}

/// What the writers of one detector share: its thresholds, the summaries' templates and
/// how this orjson writes a float.
#[pyclass(module = "kernelstream._native", frozen)]
pub struct Rules {
    templates: Vec<Template>,
    balanced: Template,
    busy_cause: Template,
    th: Thresholds,
    plus_exponent: bool,
    // each figure's key and marker in a window record written with markers for figures
    window_markers: Vec<(Vec<u8>, Vec<u8>)>,
}

#[pymethods]
impl Rules {
    /// A detector's rules (`agents.logic.written._rules` builds them): the summary
    /// template of each classification but `balanced`, that of `balanced`, the busy
    /// cause's; the thresholds (a mapping of `DetectorThresholds`' fields); whether
    /// a positive exponent is written with its sign; the key and the marker of each
    /// figure of a window record, in order (`SeriesWriter` cuts the record there).
    #[new]
    #[pyo3(signature = (
        *, templates, balanced, busy_cause, thresholds, plus_exponent, window_markers
    ))]
    fn new(
        templates: Vec<(String, Template)>,
        balanced: Template,
        busy_cause: Template,
        thresholds: Thresholds,
        plus_exponent: bool,
        window_markers: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> PyResult<Self> {
        if window_markers.len() != WINDOW_SLOTS {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "a window record has {WINDOW_SLOTS} figures, not {}",
                window_markers.len()
            )));
        }
        let mut ordered = Vec::with_capacity(CLASSES.len());
        for name in CLASSES {
            let Some((_, t)) = templates.iter().find(|(n, _)| n == name) else {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "no summary template for {name}"
                )));
            };
            ordered.push(t.clone());
        }
        for t in ordered.iter().chain([&balanced, &busy_cause]) {
            if let Some(&(_, field, spec, _)) = t.iter().find(|p| p.1 > FIELD_BASE || p.2 > 2) {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "a template field {field} or format {spec} the writer does not know"
                )));
            }
        }
        Ok(Rules {
            templates: ordered,
            balanced,
            busy_cause,
            th: thresholds,
            plus_exponent,
            window_markers,
        })
    }
}

/// The window record and the finding of one (stream, configuration), written from the
/// figures of each of its windows.
#[pyclass(module = "kernelstream._native", frozen)]
pub struct SeriesWriter {
    pub key: Py<PyBytes>,
    pub group: Py<PyBytes>,
    rules: Py<Rules>,
    // the window record: fragments around its figures (WINDOW_SLOTS of written.py)
    window: Vec<Vec<u8>>,
    bytes_moved: f64,
    flops: f64,
    peak_gbs: f64,
    peak_gflops: f64,
    size: f64,
    roofline_known: bool,
    memory_bound: bool,
    // the finding: up to the id's window start, then up to the record's window start
    head: Vec<u8>,
    mid: Vec<u8>,
    // the evidence: its first field, then the series' own fields after the figures
    // (written here, from the roofline's numbers)
    evidence_head: Vec<u8>,
    evidence_mid: Vec<u8>,
    evidence_tail: Vec<u8>,
    static_causes: Vec<Vec<u8>>,
    // the series' names in the summaries (escaped) and numbers
    what: Vec<u8>,
    device_model: Vec<u8>,
    launch_overhead: f64,
    intensity: f64,
    // the regression baseline as of the last window written, and its key in the detector
    baseline: Mutex<Baseline>,
    pub baseline_key: Py<PyString>,
}

#[pymethods]
impl SeriesWriter {
    /// The constants of one series (`agents.logic.written.series_writer` builds them);
    /// `window`: its window record written with each figure's marker (`Rules`) in place
    /// of the figure, where each is found once, after its key, in order (else a
    /// ValueError: the caller leaves the series to Python); `baseline`: the series'
    /// regression baseline before the first window it writes, `baseline_key` its key.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        *, key, group, rules, window, roofline, finding, names, static_causes, baseline,
        baseline_key
    ))]
    fn new(
        key: Py<PyBytes>,
        group: Py<PyBytes>,
        rules: Py<Rules>,
        window: &[u8],
        roofline: (f64, f64, f64, f64, f64, f64, f64, f64, f64),
        finding: (Vec<u8>, Vec<u8>),
        names: (Vec<u8>, Vec<u8>, Vec<u8>),
        static_causes: Vec<Vec<u8>>,
        baseline: Baseline,
        baseline_key: Py<PyString>,
    ) -> PyResult<Self> {
        let window = cut(window, &rules.get().window_markers).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(
                "the window record's figures are not where the writer puts them",
            )
        })?;
        let (
            bytes_moved,
            flops,
            peak_gbs,
            peak_gflops,
            size,
            intensity,
            occupancy,
            waves,
            launch_overhead,
        ) = roofline;
        let (what, device_model, occupancy_source) = names;
        let mut w = SeriesWriter {
            key,
            group,
            rules,
            window,
            bytes_moved,
            flops,
            peak_gbs,
            peak_gflops,
            size,
            roofline_known: false,
            memory_bound: false,
            head: finding.0,
            mid: finding.1,
            evidence_head: Vec::new(),
            evidence_mid: Vec::new(),
            evidence_tail: Vec::new(),
            static_causes,
            what,
            device_model,
            launch_overhead,
            intensity,
            baseline: Mutex::new(baseline),
            baseline_key,
        };
        // `agents.logic.detection.roofline_evidence`: the series' own fields
        w.roofline_known = peak_gbs > 0.0 && peak_gflops > 0.0;
        let ridge = if w.roofline_known {
            finite_ratio(peak_gflops, peak_gbs)
        } else {
            0.0
        };
        w.memory_bound = intensity < ridge;
        let mut head = b"{\"roofline_known\":".to_vec();
        head.extend_from_slice(if w.roofline_known { b"true" } else { b"false" });
        let mut mid = Vec::with_capacity(200);
        for (name, x) in [
            (&b",\"arithmetic_intensity\":"[..], intensity),
            (b",\"ridge_point\":", ridge),
        ] {
            mid.extend_from_slice(name);
            w.float(&mut mid, x);
        }
        mid.extend_from_slice(b",\"memory_bound\":");
        mid.extend_from_slice(if w.memory_bound { b"true" } else { b"false" });
        mid.extend_from_slice(b",\"occupancy\":");
        w.float(&mut mid, occupancy);
        mid.extend_from_slice(b",\"occupancy_source\":\"");
        mid.extend_from_slice(&occupancy_source);
        mid.extend_from_slice(b"\",\"waves\":");
        w.float(&mut mid, waves);
        mid.extend_from_slice(b",\"tail_fraction\":");
        w.float(&mut mid, waves - waves.floor());
        let mut tail = b",\"launch_overhead_us\":".to_vec();
        w.float(&mut tail, launch_overhead);
        (w.evidence_head, w.evidence_mid, w.evidence_tail) = (head, mid, tail);
        Ok(w)
    }

    /// The window record, the classification and the finding of window `window` of the
    /// series, of these counts (launches that failed, accepted late, lowest and highest
    /// sequence number) and statistics (`window_stats`'s: count, total, mean, std, idle
    /// gap, p50, p95, min, max); None where the Python detector decides (the baseline
    /// then as it was).
    #[allow(clippy::type_complexity)]
    fn write<'py>(
        &self,
        py: Python<'py>,
        window: i64,
        counts: (i64, i64, i64, i64),
        stats: (usize, f64, f64, f64, f64, f64, f64, f64, f64),
    ) -> Option<(Bound<'py, PyBytes>, &'static str, Bound<'py, PyBytes>)> {
        let (record, class, finding, _) = self.written(window, counts, stats)?;
        Some((PyBytes::new(py, &record), class, PyBytes::new(py, &finding)))
    }

    /// The regression baseline as of the last window written (windows, launches, sum).
    #[getter]
    fn baseline(&self) -> Baseline {
        *self.baseline.lock().expect("a writer's baseline")
    }
}

/// Figures of a window record, in its fields' order (`WINDOW_SLOTS` of written.py).
const WINDOW_SLOTS: usize = 19;

impl SeriesWriter {
    /// `write`, as bytes, with the baseline after the window where the window changed it.
    #[allow(clippy::type_complexity)]
    pub fn written(
        &self,
        window: i64,
        counts: (i64, i64, i64, i64),
        stats: (usize, f64, f64, f64, f64, f64, f64, f64, f64),
    ) -> Option<(Vec<u8>, &'static str, Vec<u8>, Option<Baseline>)> {
        let (failures, late, seq_min, seq_max) = counts;
        let (count, total, mean, std, idle, p50, p95, d_min, d_max) = stats;
        let count = count as i64;
        if count == 0 {
            return None; // "had no successful launch": the Python detector's
        }
        // build_window's figures, the same operations in the same order
        let gbs = finite_ratio(self.bytes_moved, mean * 1e3);
        let gflops = finite_ratio(self.flops, mean * 1e3);
        let busy = total * 1e-6 / self.size;
        let bw = finite_ratio(gbs, self.peak_gbs);
        let flops_fraction = finite_ratio(gflops, self.peak_gflops);
        let window_start = window as f64 * self.size;
        let window_end = (window + 1) as f64 * self.size;
        use Figure::{Float, Int};
        // the record's figures, in its fields' order (WINDOW_SLOTS of written.py)
        let figures = [
            Float(window_start),
            Float(window_end),
            Int(count),
            Int(failures),
            Int(late),
            Float(mean),
            Float(p50),
            Float(p95),
            Float(d_min),
            Float(d_max),
            Float(std),
            Float(busy),
            Float(idle),
            Float(gbs),
            Float(gflops),
            Float(bw),
            Float(flops_fraction),
            Int(seq_min),
            Int(seq_max),
        ];
        let promised = |fig: &Figure| match *fig {
            Float(x) => x.is_finite() && x.abs() <= LARGE,
            Int(_) => true,
        };
        if !figures.iter().all(promised) {
            return None;
        }
        let mut record = Vec::with_capacity(1200);
        for (fragment, figure) in self.window.iter().zip(figures) {
            record.extend_from_slice(fragment);
            match figure {
                Float(x) => self.float(&mut record, x),
                Int(n) => int(&mut record, n),
            }
        }
        record.extend_from_slice(&self.window[WINDOW_SLOTS]);

        let mut f = Figures {
            window_start,
            window_end,
            count,
            failures,
            mean,
            p95,
            bw,
            flops: flops_fraction,
            busy,
            idle,
            ratio: 0.0,
            base: 0.0,
            roof: if bw >= flops_fraction {
                bw
            } else {
                flops_fraction
            },
            causes: Vec::new(),
        };
        let mut baseline = self.baseline.lock().expect("a writer's baseline");
        let (class, finding, formed) = self.finding(&mut f, *baseline)?;
        if let Some(b) = formed {
            *baseline = b; // only once the window is written: else the detector feeds it
        }
        Some((record, class, finding, formed))
    }

    /// The finding of a window (`Detector._judge`, then `Finding.wire_of_window`), and
    /// the baseline after it where the window fed it.
    #[allow(clippy::type_complexity)]
    fn finding(
        &self,
        f: &mut Figures,
        baseline: Baseline,
    ) -> Option<(&'static str, Vec<u8>, Option<Baseline>)> {
        let r = self.rules.get();
        let mut ev = Vec::with_capacity(700);
        ev.extend_from_slice(&self.evidence_head);
        ev.extend_from_slice(b",\"count\":");
        int(&mut ev, f.count);
        ev.extend_from_slice(b",\"failures\":");
        int(&mut ev, f.failures);
        for (name, x) in [
            (&b",\"mean_us\":"[..], f.mean),
            (b",\"p95_us\":", f.p95),
            (b",\"bw_fraction\":", f.bw),
            (b",\"flops_fraction\":", f.flops),
        ] {
            ev.extend_from_slice(name);
            self.float(&mut ev, x);
        }
        ev.extend_from_slice(&self.evidence_mid);
        ev.extend_from_slice(b",\"busy_fraction\":");
        self.float(&mut ev, f.busy);
        ev.extend_from_slice(b",\"idle_gap_mean_us\":");
        self.float(&mut ev, f.idle);
        ev.extend_from_slice(&self.evidence_tail);

        // Detector._regression: a window of enough launches feeds the baseline while it
        // forms, and is judged against it once it is formed
        let mut class = None;
        let mut formed = None;
        let (base_windows, base_count, base_sum) = baseline;
        if f.count >= r.th.min_launches && base_windows < r.th.baseline_windows {
            formed = Some((
                base_windows + 1,
                base_count + f.count,
                base_sum + f.mean * f.count as f64,
            ));
        } else if f.count >= r.th.min_launches {
            // `_Baseline.mean_us`
            let base_mean = if base_count != 0 {
                base_sum / base_count as f64
            } else {
                0.0
            };
            f.base = base_mean;
            f.ratio = finite_ratio(f.mean, base_mean);
            if f.ratio > LARGE {
                return None;
            }
            ev.extend_from_slice(b",\"baseline_us\":");
            self.float(&mut ev, base_mean);
            ev.extend_from_slice(b",\"baseline_windows\":");
            int(&mut ev, base_windows);
            ev.extend_from_slice(b",\"regression_ratio\":");
            self.float(&mut ev, f.ratio);
            if f.ratio > r.th.regression_factor {
                class = Some(0);
            }
        }
        // Detector._classify
        let class = match class {
            Some(c) => c,
            None if f.mean < r.th.launch_bound_factor * self.launch_overhead => 1,
            None if !self.roofline_known => 2,
            None if self.memory_bound && f.bw >= r.th.efficient_bw_fraction => 3,
            None if !self.memory_bound && f.flops >= r.th.compute_bound_flops_fraction => 4,
            None => {
                f.causes = self.static_causes.clone();
                if f.busy < r.th.low_busy_fraction && f.idle > r.th.idle_gap_ratio * f.mean {
                    let mut cause = Vec::new();
                    self.render(&mut cause, &r.busy_cause, f);
                    f.causes.push(cause);
                }
                ev.extend_from_slice(b",\"underuse_causes\":\"");
                ev.extend_from_slice(&f.causes.join(&b","[..]));
                ev.push(b'"');
                if !f.causes.is_empty() {
                    5
                } else if self.memory_bound {
                    6
                } else {
                    7
                }
            }
        };
        let (name, template) = if class == 7 {
            (BALANCED, &r.balanced)
        } else {
            (CLASSES[class], &r.templates[class])
        };

        let mut out = Vec::with_capacity(1300);
        out.extend_from_slice(&self.head);
        write!(out, "{:.6}", f.window_start).ok()?;
        out.extend_from_slice(&self.mid);
        self.float(&mut out, f.window_start);
        out.extend_from_slice(b",\"window_end\":");
        self.float(&mut out, f.window_end);
        out.extend_from_slice(b",\"classification\":\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\",\"evidence\":");
        out.extend_from_slice(&ev);
        out.extend_from_slice(b"},\"summary\":\"");
        self.render(&mut out, template, f);
        out.extend_from_slice(b"\",\"count\":");
        int(&mut out, f.count);
        out.extend_from_slice(b",\"failures\":");
        int(&mut out, f.failures);
        out.extend_from_slice(b",\"duration_mean_us\":");
        self.float(&mut out, f.mean);
        out.push(b'}');
        Some((name, out, formed))
    }

    /// A summary's template with the window's fields, as `str.format` gives it.
    fn render(&self, out: &mut Vec<u8>, template: &Template, f: &Figures) {
        for (literal, field, spec, precision) in template {
            out.extend_from_slice(literal);
            let x = match *field {
                FIELD_NONE => continue,
                FIELD_WHAT => {
                    out.extend_from_slice(&self.what);
                    continue;
                }
                FIELD_DEVICE_MODEL => {
                    out.extend_from_slice(&self.device_model);
                    continue;
                }
                FIELD_CAUSES => {
                    out.extend_from_slice(&f.causes.join(&b"; "[..]));
                    continue;
                }
                FIELD_MEAN => f.mean,
                FIELD_RATIO => f.ratio,
                FIELD_BW => f.bw,
                FIELD_FLOPS => f.flops,
                FIELD_ROOF => f.roof,
                FIELD_BUSY => f.busy,
                FIELD_IDLE => f.idle,
                FIELD_OVERHEAD => self.launch_overhead,
                FIELD_INTENSITY => self.intensity,
                FIELD_BASE => f.base,
                _ => unreachable!("templates are checked where they are built"),
            };
            let _ = match *spec {
                SPEC_FIXED => write!(out, "{:.*}", *precision, x),
                SPEC_PERCENT => write!(out, "{:.*}%", *precision, x * 100.0),
                _ => {
                    self.float(out, x);
                    Ok(())
                }
            };
        }
    }

    /// `x` as orjson writes a float: the shortest digits that read back as `x`, with
    /// `e+` before a positive exponent where this orjson writes one.
    fn float(&self, out: &mut Vec<u8>, x: f64) {
        let mut buf = ryu::Buffer::new();
        let s = buf.format_finite(x).as_bytes();
        match s.iter().position(|&b| b == b'e') {
            Some(e) if self.rules.get().plus_exponent && s.get(e + 1) != Some(&b'-') => {
                out.extend_from_slice(&s[..=e]);
                out.push(b'+');
                out.extend_from_slice(&s[e + 1..]);
            }
            _ => out.extend_from_slice(s),
        }
    }
}

/// `record` cut around its markers: the fragments before, between and after them, each
/// marker found after its key, in order; None where one is not.
fn cut(record: &[u8], markers: &[(Vec<u8>, Vec<u8>)]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(markers.len() + 1);
    let mut at = 0;
    for (key, marker) in markers {
        let needle = [&key[..], &marker[..]].concat();
        let found = at + find(&record[at..], &needle)?;
        let end = found + needle.len();
        // the marker whole, not the start of a longer number (one found in a name, where
        // a record's own text holds it, shows in the check the caller makes)
        if !matches!(record.get(end), Some(b',' | b'}')) {
            return None;
        }
        out.push(record[at..found + key.len()].to_vec());
        at = end;
    }
    out.push(record[at..].to_vec());
    Some(out)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn int(out: &mut Vec<u8>, n: i64) {
    let _ = write!(out, "{n}");
}

/// `agents.logic.ratios.finite_ratio`.
fn finite_ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 {
        let q = num / den;
        if f64::MAX < q {
            f64::MAX
        } else {
            q
        }
    } else {
        0.0
    }
}

/// `SPEC_PLAIN` is the third format (a plain float, as orjson writes it).
const _: () = assert!(SPEC_PLAIN == 0);
