//! A window stage over a poll's binary launch batches with its state held here: a measured
//! bound for the design that would take the window agent's steady state out of Python
//! (`bench/columnar_bound.py` runs it beside the NumPy columnar stage and the worker).
//!
//! It covers the steady state only, as the NumPy bound does: every message a binary batch
//! whose header bytes were registered (the worker's decoder validated them once), its
//! columns plainly valid, its event times near the clock, continuing its stream exactly,
//! none in a window its stream's watermark has passed. A poll with anything else is refused
//! whole, before any state changes, with the index of the message and the reason; a
//! worker built this way would take its general path for it. Closed windows come back as
//! rows of numbers (no records are built, nothing is published).

// The window rules are written as the worker's Python expressions (`not a < b`), which a
// NaN fails the same way.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use std::borrow::Cow;
use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{plain, stats};

pub(crate) const MAGIC: &[u8; 4] = b"KSLB";
pub(crate) const LAYOUT_VERSION: u8 = 1;
pub(crate) const HEAD_SIZE: usize = 32;

#[derive(Default)]
struct Acc {
    t: Vec<f64>,
    d: Vec<f64>,
}

#[derive(Default)]
struct Stream {
    key: String,
    next_seq: Option<u64>,
    max_t: f64,
    open: BTreeMap<i64, Acc>,
    // launches of its last closed window: a new window's buffers start that large, so
    // they do not grow (and copy) batch by batch
    last_count: usize,
}

/// One batch of a poll, checked, before it changes any state.
struct Planned<'a> {
    slot: usize,
    t: Cow<'a, [f64]>,
    d: Cow<'a, [f64]>,
    ok: &'a [u8],
    all_ok: bool,
    first: i64,
    last: i64,
    seq_end: u64,
    hi: f64,
}

/// A closed window: (stream key, window, launches, mean, std, p50, p95, min, max, idle gap).
type Row = (String, i64, usize, f64, f64, f64, f64, f64, f64, f64);

#[pyclass(module = "kernelstream._native")]
pub struct SteadyWindows {
    size: f64,
    out_of_orderness: f64,
    lateness: f64,
    max_age: f64,
    max_future: f64,
    max_duration: f64,
    slot_of_header: HashMap<Vec<u8>, usize>,
    slot_of_stream: HashMap<(String, String), usize>,
    streams: Vec<Stream>,
}

/// Little-endian float64s: the bytes themselves where they are aligned on a little-endian
/// machine (a message's columns start at a multiple of 8 of a Python bytes object's data,
/// which is 8-aligned), else a copy.
pub(crate) fn f64s(bytes: &[u8]) -> Cow<'_, [f64]> {
    if cfg!(target_endian = "little") {
        // SAFETY: every bit pattern is a valid f64; align_to puts in `mid` only what is
        // aligned, and a prefix or suffix means the bytes were not: then the copy below.
        let (pre, mid, post) = unsafe { bytes.align_to::<f64>() };
        if pre.is_empty() && post.is_empty() {
            return Cow::Borrowed(mid);
        }
    }
    Cow::Owned(
        bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("eight bytes")))
            .collect(),
    )
}

#[pymethods]
impl SteadyWindows {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        size_s: f64,
        out_of_orderness_s: f64,
        allowed_lateness_s: f64,
        max_age_s: f64,
        max_future_s: f64,
        max_duration_bits: u64,
    ) -> Self {
        SteadyWindows {
            size: size_s,
            out_of_orderness: out_of_orderness_s,
            lateness: allowed_lateness_s,
            max_age: max_age_s,
            max_future: max_future_s,
            max_duration: f64::from_bits(max_duration_bits),
            slot_of_header: HashMap::default(),
            slot_of_stream: HashMap::default(),
            streams: Vec::new(),
        }
    }

    /// Header bytes the worker's decoder validated, for the stream and configuration they
    /// name: batches with these bytes are windowed here from now on.
    fn register(&mut self, header: &[u8], stream_key: String, config_id: String) {
        let id = (stream_key.clone(), config_id);
        let slot = *self.slot_of_stream.entry(id).or_insert_with(|| {
            self.streams.push(Stream {
                key: stream_key,
                max_t: f64::NEG_INFINITY,
                ..Stream::default()
            });
            self.streams.len() - 1
        });
        self.slot_of_header.insert(header.to_vec(), slot);
    }

    /// Header bytes of a binary message (None: not a binary batch of this layout).
    #[staticmethod]
    fn header_of<'py>(py: Python<'py>, value: &[u8]) -> Option<Bound<'py, PyBytes>> {
        let m = head(value)?.2;
        value
            .get(HEAD_SIZE..HEAD_SIZE + m)
            .map(|h| PyBytes::new(py, h))
    }

    /// Window one poll's messages (decompressed values, in partition order) at clock `now`:
    /// the windows it closes, or ValueError("<index>: <reason>") for a poll that is not
    /// steady (nothing changed).
    fn poll(&mut self, values: Vec<Bound<'_, PyBytes>>, now: f64) -> PyResult<Vec<Row>> {
        let mut plan = Vec::with_capacity(values.len());
        let mut next: HashMap<usize, (u64, f64)> = HashMap::default(); // slot -> (next seq, max t)
        for (i, value) in values.iter().enumerate() {
            let p = self
                .check(value.as_bytes(), now, &mut next)
                .map_err(|why| PyValueError::new_err(format!("{i}: {why}")))?;
            plan.push(p);
        }
        let mut touched: Vec<usize> = Vec::new();
        for p in plan {
            self.add(p, &mut touched);
        }
        touched.sort_unstable();
        touched.dedup();
        let mut rows = Vec::new();
        for slot in touched {
            self.close(slot, &mut rows)?;
        }
        Ok(rows)
    }
}

/// (n, seq_start, m) of a message's head, if it is this layout's.
pub(crate) fn head(value: &[u8]) -> Option<(usize, u64, usize)> {
    if value.len() < HEAD_SIZE || &value[..4] != MAGIC || value[4] != LAYOUT_VERSION {
        return None;
    }
    let n = u32::from_le_bytes(value[8..12].try_into().ok()?) as usize;
    let seq = u64::from_le_bytes(value[12..20].try_into().ok()?);
    let m = u32::from_le_bytes(value[20..24].try_into().ok()?) as usize;
    Some((n, seq, m))
}

impl SteadyWindows {
    fn check<'a>(
        &self,
        value: &'a [u8],
        now: f64,
        next: &mut HashMap<usize, (u64, f64)>,
    ) -> Result<Planned<'a>, String> {
        let (n, seq, m) = head(value).ok_or("not a binary batch of this layout")?;
        let header = value.get(HEAD_SIZE..HEAD_SIZE + m).ok_or("short message")?;
        let slot = *self
            .slot_of_header
            .get(header)
            .ok_or("a header not registered")?;
        let pos = HEAD_SIZE + m + (8 - m % 8) % 8;
        if n == 0 || pos + 17 * n + (8 - n % 8) % 8 != value.len() {
            return Err("the layout's length does not hold".into());
        }
        let t = f64s(&value[pos..pos + 8 * n]);
        let d = f64s(&value[pos + 8 * n..pos + 16 * n]);
        let ok = &value[pos + 16 * n..pos + 17 * n];
        let ((lo, hi), in_order, all_ok) =
            plain(&t, &d, ok, self.max_duration.to_bits()).ok_or("columns not plainly valid")?;
        if !in_order {
            return Err("end times out of completion order".into());
        }
        if !(hi <= now + self.max_future && lo >= now - self.max_age) {
            return Err("event times the edge checks send to the general path".into());
        }
        let stream = &self.streams[slot];
        let (expect, max_t) = match next.get(&slot) {
            Some(&(s, t)) => (Some(s), t),
            None => (stream.next_seq, stream.max_t),
        };
        if expect.is_some_and(|s| s != seq) {
            return Err("a batch that does not continue its stream exactly".into());
        }
        let first = (lo / self.size).floor() as i64;
        let last = (hi / self.size).floor() as i64;
        if !(hi < (last + 1) as f64 * self.size) {
            return Err("a launch on a window edge that float rounding blurs".into());
        }
        let watermark = max_t - self.out_of_orderness;
        if (first + 1) as f64 * self.size + self.lateness <= watermark {
            return Err("launches in a window already closed".into());
        }
        next.insert(slot, (seq + n as u64, max_t.max(hi)));
        Ok(Planned {
            slot,
            t,
            d,
            ok,
            all_ok,
            first,
            last,
            seq_end: seq + n as u64,
            hi,
        })
    }

    fn add(&mut self, p: Planned<'_>, touched: &mut Vec<usize>) {
        let size = self.size;
        let stream = &mut self.streams[p.slot];
        let n = p.t.len();
        let mut at = 0;
        for w in p.first..=p.last {
            // launches of window w: those before its end (the end times are in order)
            let end = if w == p.last {
                n
            } else {
                let edge = (w + 1) as f64 * size;
                at + p.t[at..].partition_point(|&x| x < edge)
            };
            if end > at {
                let cap = stream.last_count;
                let acc = stream.open.entry(w).or_insert_with(|| Acc {
                    t: Vec::with_capacity(cap),
                    d: Vec::with_capacity(cap),
                });
                if p.all_ok {
                    acc.t.extend_from_slice(&p.t[at..end]);
                    acc.d.extend_from_slice(&p.d[at..end]);
                } else {
                    for k in at..end {
                        if p.ok[k] == 1 {
                            acc.t.push(p.t[k]);
                            acc.d.push(p.d[k]);
                        }
                    }
                }
            }
            at = end;
        }
        stream.next_seq = Some(p.seq_end);
        stream.max_t = stream.max_t.max(p.hi);
        touched.push(p.slot);
    }

    fn close(&mut self, slot: usize, rows: &mut Vec<Row>) -> PyResult<()> {
        let (size, lateness) = (self.size, self.lateness);
        let stream = &mut self.streams[slot];
        let watermark = stream.max_t - self.out_of_orderness;
        while let Some((&w, _)) = stream.open.first_key_value() {
            if !((w + 1) as f64 * size + lateness <= watermark) {
                break;
            }
            let acc = stream.open.remove(&w).expect("the first window");
            stream.last_count = stream.last_count.max(acc.t.len());
            let s = stats(&[&acc.t], &[&acc.d], &[50.0, 95.0])
                .ok_or_else(|| PyValueError::new_err("a window without a launch that ran"))?;
            rows.push((
                stream.key.clone(),
                w,
                s.count,
                s.mean,
                s.std,
                s.percentiles[0],
                s.percentiles[1],
                s.min,
                s.max,
                s.idle_gap_mean_us,
            ));
        }
        Ok(())
    }
}
