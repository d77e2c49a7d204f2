//! The window agent's steady state, compiled: `WindowEngine` windows the streams it holds
//! (`agents/logic/compiled_windows.py` drives it for the window agent).
//!
//! Nearly every launch message a worker reads is the next binary batch of a stream whose
//! per-batch fields it has seen before: plainly valid columns, event times within the
//! edge's bounds, sequence numbers right after the stream's last ones, end times in
//! completion order and at or after every launch counted before, in no window already
//! emitted. For such a message the Python path makes a dozen objects and calls (a header
//! lookup, views, a validated copy of the per-batch fields, a slice per window appended
//! to its accumulator, a record per closed window); here the message is read, checked,
//! windowed and the windows it closes aggregated without a Python object per message.
//!
//! The state of a stream is held here or by the Python `Windower`, never both: the engine
//! takes a stream over (`adopt`) with the Windower's state of it, and gives it back
//! (`release`) before anything it does not do itself: a message that is not steady, an
//! idle flush, a partition handed to another worker. `export` copies a stream's state for
//! a checkpoint. The state, the windows and every count come out as the Windower's
//! in-order path makes them (`InOrderRun`, `Windower.add_in_order`, `poll_key`); the
//! window statistics are `window_stats`'s, bit for bit NumPy's.
//!
//! `poll` consumes a poll's messages in order up to the first it does not take, and says
//! why it stopped: `unregistered` (a header and message key it was not told about),
//! `not_held` (a stream the Windower holds), or what it found that the Python path decides
//! (`no_value`, `not_bytes`, `oversized`, `not_binary`, `layout`, `columns`, `out_of_order`,
//! `event_time`, `sequence`, `before_counted`, `closed_window`, `window_edge`). The caller
//! takes that message its own way and calls `poll` again from the next.

// The window rules are written as the Python expressions they mirror (`not a < b`), which
// a NaN fails the same way.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use std::borrow::Cow;
use std::collections::BTreeMap;

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::written::SeriesWriter;
use crate::{plain, stats};

// The binary launch-batch layout (`schemas/binary.py`): a 32-byte head, then the header.
const MAGIC: &[u8; 4] = b"KSLB";
const LAYOUT_VERSION: u8 = 1;
const HEAD_SIZE: usize = 32;

/// Sequence numbers at or above this are not trusted (`agents.logic.sequencing.SEQ_BOUND`).
const SEQ_BOUND: u64 = 1 << 50;

/// Registered header bytes kept at most; past it they are all forgotten and registered
/// again as their messages come. A stream's header is its own (its node and device are in
/// it), so this bounds the streams a worker windows here without stopping: a bound below
/// a worker's streams makes every message of every stream a registration (with 5,120
/// streams and a bound of 4,096 the window agent took 35.6 us a message, 6.4 above it).
/// 65,536 headers of ~600 bytes are ~40 MB, beside the streams' own state; the tuner's
/// configuration changes add a header each. (The Python caches: `schemas.keys`.)
const MAX_REGISTERED: usize = 1 << 16;

/// Launches of one window from one batch: read in place from the message, which the
/// window holds (as the Python path holds views of it), or copied (the launches that ran
/// of a batch with failures, a window adopted from the Windower).
enum Chunk {
    Message {
        bytes: Py<PyBytes>,
        t_at: usize,
        d_at: usize,
        len: usize,
    },
    Owned {
        t: Vec<f64>,
        d: Vec<f64>,
    },
}

impl Chunk {
    /// (end times, durations)
    fn columns<'a>(&'a self, py: Python<'_>) -> (Cow<'a, [f64]>, Cow<'a, [f64]>) {
        match self {
            Chunk::Message {
                bytes,
                t_at,
                d_at,
                len,
            } => {
                let b = bytes.as_bytes(py);
                (
                    f64s(&b[*t_at..*t_at + 8 * len]),
                    f64s(&b[*d_at..*d_at + 8 * len]),
                )
            }
            Chunk::Owned { t, d } => (Cow::Borrowed(t), Cow::Borrowed(d)),
        }
    }
}

/// Launches of one (stream, window, configuration): `_Acc` of `agents.logic.windowing`.
struct Acc {
    meta: usize,
    chunks: Vec<Chunk>,
    failures: i64,
    late_accepted: i64,
    seq_min: i64,
    seq_max: i64,
}

impl Acc {
    /// The window's end times and durations, joined.
    fn joined(&self, py: Python<'_>) -> (Vec<f64>, Vec<f64>) {
        let (mut t, mut d) = (Vec::new(), Vec::new());
        for c in &self.chunks {
            let (ct, cd) = c.columns(py);
            t.extend_from_slice(&ct);
            d.extend_from_slice(&cd);
        }
        (t, d)
    }

    fn add_seq_range(&mut self, lo: i64, hi: i64) {
        self.seq_min = if self.seq_min < 0 {
            lo
        } else {
            self.seq_min.min(lo)
        };
        self.seq_max = self.seq_max.max(hi);
    }
}

/// A stream's state: `_KeyState` of `agents.logic.windowing`, while `held`.
struct Stream {
    key: String,
    held: bool,
    max_t: f64,
    last_seen: f64,
    closed_below: Option<i64>,
    seq_hi: i64,
    // (window, configuration index) -> its launches
    open: BTreeMap<(i64, u32), Acc>,
    // received launches in the poll being windowed (its windows are closed after it)
    touched: bool,
    // (meta index, configuration index) -> the writer of its windows and findings, where
    // the caller gave one (`write_as`); forgotten when the stream is given back
    written: HashMap<(usize, u32), Py<SeriesWriter>>,
}

/// One steady message, checked, before it changes any state.
struct Planned<'a, 'py> {
    value: &'a Bound<'py, PyBytes>,
    // where its end times and durations start in it
    t_at: usize,
    d_at: usize,
    slot: usize,
    config: u32,
    meta: usize,
    t: Cow<'a, [f64]>,
    d: Cow<'a, [f64]>,
    ok: &'a [u8],
    all_ok: bool,
    seq: i64,
    hi: f64,
    // (window, first row, end row) of each window the batch falls in
    cuts: Vec<(i64, usize, usize)>,
}

/// Statistics of a closed window: (count, total, mean, std, idle gap, p50, p95, min, max).
type Stats = (usize, f64, f64, f64, f64, f64, f64, f64, f64);

/// A closed window: (stream key, window, config id, meta index, failures, late accepted,
/// seq min, seq max, its statistics, or None and its end times and durations where
/// `window_stats` leaves them to NumPy: a window without a launch that ran).
type Row<'py> = (
    String,
    i64,
    String,
    usize,
    i64,
    i64,
    i64,
    i64,
    Option<Stats>,
    Option<(Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<f64>>)>,
);

/// An open window as the Windower's snapshot has it: (window, config id, meta index,
/// end times, durations, failures, late accepted, seq min, seq max).
type OpenWindow<'py> = (
    i64,
    String,
    usize,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f64>>,
    i64,
    i64,
    i64,
    i64,
);

/// A stream's state: (max t, last seen, closed below, seq hi, open windows).
type State<'py> = (f64, f64, Option<i64>, i64, Vec<OpenWindow<'py>>);

/// What `adopt` takes: an open window with its columns as arrays.
type OpenWindowIn<'py> = (
    i64,
    String,
    usize,
    PyReadonlyArray1<'py, f64>,
    PyReadonlyArray1<'py, f64>,
    i64,
    i64,
    i64,
    i64,
);

type Registered = (Option<Vec<u8>>, (usize, u32, usize));

/// Little-endian float64s: the bytes themselves where they are aligned on a little-endian
/// machine (a message's columns start at a multiple of 8 of a Python bytes object's data,
/// which is 8-aligned), else a copy.
fn f64s(bytes: &[u8]) -> Cow<'_, [f64]> {
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

/// (n, seq_start, m) of a message's head, if it is this layout's.
fn head(value: &[u8]) -> Option<(usize, u64, usize)> {
    if value.len() < HEAD_SIZE || &value[..4] != MAGIC || value[4] != LAYOUT_VERSION {
        return None;
    }
    let n = u32::from_le_bytes(value[8..12].try_into().ok()?) as usize;
    let seq = u64::from_le_bytes(value[12..20].try_into().ok()?);
    let m = u32::from_le_bytes(value[20..24].try_into().ok()?) as usize;
    Some((n, seq, m))
}

#[pyclass(module = "kernelstream._native")]
pub struct WindowEngine {
    size: f64,
    out_of_orderness: f64,
    lateness: f64,
    max_duration_bits: u64,
    // header bytes -> (message key, (stream slot, configuration index, meta index)) of
    // each key it came under (nearly always one)
    registered: HashMap<Vec<u8>, Vec<Registered>>,
    slot_of_stream: HashMap<String, usize>,
    streams: Vec<Stream>,
    configs: Vec<String>,
    config_of: HashMap<String, u32>,
}

#[pymethods]
impl WindowEngine {
    #[new]
    fn new(
        size_s: f64,
        out_of_orderness_s: f64,
        allowed_lateness_s: f64,
        max_duration_bits: u64,
    ) -> Self {
        WindowEngine {
            size: size_s,
            out_of_orderness: out_of_orderness_s,
            lateness: allowed_lateness_s,
            max_duration_bits,
            registered: HashMap::default(),
            slot_of_stream: HashMap::default(),
            streams: Vec::new(),
            configs: Vec::new(),
            config_of: HashMap::default(),
        }
    }

    /// Header bytes of a binary batch (None: not a binary batch of this layout).
    #[staticmethod]
    fn header_of<'py>(py: Python<'py>, value: &[u8]) -> Option<Bound<'py, PyBytes>> {
        let m = head(value)?.2;
        value
            .get(HEAD_SIZE..HEAD_SIZE + m)
            .map(|h| PyBytes::new(py, h))
    }

    /// Messages with these header bytes under this message key are batches of
    /// `stream_key` with configuration `config_id` and per-batch fields `meta` (an index
    /// of the caller's): the caller's decoder passed one.
    fn register(
        &mut self,
        header: &[u8],
        key: Option<&[u8]>,
        stream_key: String,
        config_id: String,
        meta: usize,
    ) {
        if self.registered.len() >= MAX_REGISTERED {
            self.registered.clear();
        }
        let slot = self.slot(stream_key);
        let config = self.config(config_id);
        let under = self.registered.entry(header.to_vec()).or_default();
        under.retain(|(k, _)| k.as_deref() != key);
        under.push((key.map(<[u8]>::to_vec), (slot, config, meta)));
    }

    /// Whether the engine holds `stream_key`'s state.
    fn holds(&self, stream_key: &str) -> bool {
        self.slot_of_stream
            .get(stream_key)
            .is_some_and(|&s| self.streams[s].held)
    }

    /// The stream keys the engine holds.
    fn held(&self) -> Vec<String> {
        self.streams
            .iter()
            .filter(|s| s.held)
            .map(|s| s.key.clone())
            .collect()
    }

    /// (stream key, last seen) of each stream held with an open window: the candidates
    /// of an idle flush.
    fn last_seen(&self) -> Vec<(String, f64)> {
        self.streams
            .iter()
            .filter(|s| s.held && !s.open.is_empty())
            .map(|s| (s.key.clone(), s.last_seen))
            .collect()
    }

    /// Open windows of the streams held.
    fn open_windows(&self) -> usize {
        self.streams
            .iter()
            .filter(|s| s.held)
            .map(|s| s.open.len())
            .sum()
    }

    /// Take over `stream_key` with the Windower's state of it (a new stream: max t and
    /// last seen -inf, closed below None, seq hi -1, no window).
    #[allow(clippy::too_many_arguments)]
    fn adopt(
        &mut self,
        stream_key: String,
        max_t: f64,
        last_seen: f64,
        closed_below: Option<i64>,
        seq_hi: i64,
        windows: Vec<OpenWindowIn<'_>>,
    ) -> PyResult<()> {
        let mut open = BTreeMap::new();
        for (w, config_id, meta, t, d, failures, late_accepted, seq_min, seq_max) in windows {
            let (t, d) = (t.as_array().to_vec(), d.as_array().to_vec());
            if t.len() != d.len() {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "a window's end times and durations differ in length",
                ));
            }
            let config = self.config(config_id);
            open.insert(
                (w, config),
                Acc {
                    meta,
                    chunks: vec![Chunk::Owned { t, d }],
                    failures,
                    late_accepted,
                    seq_min,
                    seq_max,
                },
            );
        }
        let slot = self.slot(stream_key);
        let s = &mut self.streams[slot];
        s.held = true;
        s.max_t = max_t;
        s.last_seen = last_seen;
        s.closed_below = closed_below;
        s.seq_hi = seq_hi;
        s.open = open;
        Ok(())
    }

    /// `stream_key`'s state, as `adopt` takes it, given back (the engine no longer holds
    /// it); None where it does not hold it.
    fn release<'py>(&mut self, py: Python<'py>, stream_key: &str) -> Option<State<'py>> {
        let state = self.export(py, stream_key)?;
        let s = &mut self.streams[self.slot_of_stream[stream_key]];
        s.held = false;
        s.open.clear();
        s.written.clear();
        Some(state)
    }

    /// From now on, write the windows of `stream_key` of per-batch fields `meta` and
    /// configuration `config_id`, and their findings, with `writer` (closed windows come
    /// out as written rows). False (nothing kept) where the engine does not hold the
    /// stream. Until the stream is given back, a window of the series is left to the
    /// Python detector, another header of the same configuration is handed a writer, or
    /// another series of the stream is handed one while this one has no window open.
    fn write_as(
        &mut self,
        stream_key: &str,
        meta: usize,
        config_id: String,
        writer: Py<SeriesWriter>,
    ) -> bool {
        let Some(&slot) = self.slot_of_stream.get(stream_key) else {
            return false;
        };
        if !self.streams[slot].held {
            return false;
        }
        let config = self.config(config_id);
        let s = &mut self.streams[slot];
        // A stream's configurations change (the tuner's moves): the writers of those with
        // no window open go, so a stream keeps a writer or two, not one per configuration
        // it ever ran (one that comes back is learnt again after its next window). One
        // writer a configuration: the detector keeps one baseline per stream and
        // configuration whatever the batches' other header fields, and a writer of
        // another header would go on forming its own copy of it.
        let open = &s.open;
        s.written.retain(|&(m, c), _| {
            c != config && open.iter().any(|(&(_, oc), acc)| oc == c && acc.meta == m)
        });
        s.written.insert((meta, config), writer);
        true
    }

    /// The caller's meta indices still in use: those in `keep` (the caller's own), of an
    /// open window and of a writer. The headers registered under any other are forgotten:
    /// a batch of such a series (a configuration a stream ran before and has no window of
    /// open) is `unregistered` again, and the caller decodes it and registers it anew.
    fn retain_metas(&mut self, keep: Vec<usize>) -> Vec<usize> {
        let mut live: HashSet<usize> = keep.into_iter().collect();
        for s in &self.streams {
            live.extend(s.open.values().map(|a| a.meta));
            live.extend(s.written.keys().map(|&(m, _)| m));
        }
        self.registered.retain(|_, under| {
            under.retain(|(_, (_, _, m))| live.contains(m));
            !under.is_empty()
        });
        live.into_iter().collect()
    }

    /// Whether the engine writes the windows of `stream_key` in configuration
    /// `config_id` (a writer handed for it, whatever its header, and not dropped since).
    fn writes(&self, stream_key: &str, config_id: &str) -> bool {
        let (Some(&slot), Some(&c)) = (
            self.slot_of_stream.get(stream_key),
            self.config_of.get(config_id),
        ) else {
            return false;
        };
        self.streams[slot].written.keys().any(|&(_, wc)| wc == c)
    }

    /// The series of the streams held that the engine writes the windows of.
    fn writing(&self) -> usize {
        self.streams
            .iter()
            .filter(|s| s.held)
            .map(|s| s.written.len())
            .sum()
    }

    /// `stream_key`'s state copied (for a checkpoint); the engine keeps holding it.
    fn export<'py>(&self, py: Python<'py>, stream_key: &str) -> Option<State<'py>> {
        let s = &self.streams[*self.slot_of_stream.get(stream_key)?];
        if !s.held {
            return None;
        }
        let windows = s
            .open
            .iter()
            .map(|(&(w, c), a)| {
                let (t, d) = a.joined(py);
                (
                    w,
                    self.configs[c as usize].clone(),
                    a.meta,
                    PyArray1::from_vec(py, t),
                    PyArray1::from_vec(py, d),
                    a.failures,
                    a.late_accepted,
                    a.seq_min,
                    a.seq_max,
                )
            })
            .collect();
        Some((s.max_t, s.last_seen, s.closed_below, s.seq_hi, windows))
    }

    /// The indices from `start` of the messages `poll` would stop at as "unregistered":
    /// binary batches of this layout whose header bytes and message key were not
    /// registered, the first of each such header and key (other messages, those it would
    /// stop at for another reason first included, are not listed). The caller decodes them together and registers those
    /// that pass before it polls again, rather than one stop at a time.
    fn unregistered(
        &self,
        values: &Bound<'_, PyList>,
        keys: &Bound<'_, PyList>,
        start: usize,
    ) -> PyResult<Vec<usize>> {
        if values.len() != keys.len() || start > values.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "one key per message, and a start within them",
            ));
        }
        let mut out = Vec::new();
        let mut seen: HashSet<(Vec<u8>, Option<Vec<u8>>)> = HashSet::default();
        for i in start..values.len() {
            let (value, key) = (values.get_item(i)?, keys.get_item(i)?);
            let (Ok(value), Ok(key)) = (
                value.cast_into::<PyBytes>(),
                key.extract::<Option<Bound<'_, PyBytes>>>(),
            ) else {
                continue;
            };
            let value = value.as_bytes();
            let key = key.as_ref().map(|k| k.as_bytes());
            let Some(header) =
                head(value).and_then(|(_, _, m)| value.get(HEAD_SIZE..HEAD_SIZE + m))
            else {
                continue;
            };
            if self.registered_as(header, key).is_none()
                && seen.insert((header.to_vec(), key.map(<[u8]>::to_vec)))
            {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// Window a partition's messages (values and keys, in offset order) from `start`,
    /// at clock `now` with the edge's event-time bounds `oldest` and `newest` and its
    /// size limit `max_bytes`, up to the first it does not take. Returns (messages taken,
    /// their launches, the windows of their streams their watermarks closed, why it
    /// stopped: None where it took them all).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn poll<'py>(
        &mut self,
        py: Python<'py>,
        values: &Bound<'py, PyList>,
        keys: &Bound<'py, PyList>,
        start: usize,
        now: f64,
        oldest: f64,
        newest: f64,
        max_bytes: usize,
    ) -> PyResult<(usize, usize, Vec<Bound<'py, PyAny>>, Option<&'static str>)> {
        if values.len() != keys.len() || start > values.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "one key per message, and a start within them",
            ));
        }
        let mut touched: Vec<usize> = Vec::new();
        let mut taken = 0;
        let mut launches = 0;
        let mut stop = None;
        for i in start..values.len() {
            let (value, key) = (values.get_item(i)?, keys.get_item(i)?);
            if value.is_none() {
                stop = Some("no_value"); // a tombstone
                break;
            }
            let (Ok(value), Ok(key)) = (
                value.cast_into::<PyBytes>(),
                key.extract::<Option<Bound<'py, PyBytes>>>(),
            ) else {
                stop = Some("not_bytes");
                break;
            };
            let key = key.as_ref().map(|k| k.as_bytes());
            match self.check(&value, key, oldest, newest, max_bytes) {
                Ok(p) => {
                    launches += p.t.len();
                    let slot = p.slot;
                    self.add(p, now);
                    if !self.streams[slot].touched {
                        self.streams[slot].touched = true;
                        touched.push(slot);
                    }
                    taken += 1;
                }
                Err(why) => {
                    stop = Some(why);
                    break;
                }
            }
        }
        let mut rows = Vec::new();
        for slot in touched {
            self.streams[slot].touched = false;
            self.close(py, slot, &mut rows)?;
        }
        Ok((taken, launches, rows, stop))
    }
}

impl WindowEngine {
    fn slot(&mut self, stream_key: String) -> usize {
        if let Some(&slot) = self.slot_of_stream.get(&stream_key) {
            return slot;
        }
        self.streams.push(Stream {
            key: stream_key.clone(),
            held: false,
            max_t: f64::NEG_INFINITY,
            last_seen: f64::NEG_INFINITY,
            closed_below: None,
            seq_hi: -1,
            open: BTreeMap::new(),
            touched: false,
            written: HashMap::default(),
        });
        self.slot_of_stream
            .insert(stream_key, self.streams.len() - 1);
        self.streams.len() - 1
    }

    fn config(&mut self, config_id: String) -> u32 {
        if let Some(&c) = self.config_of.get(&config_id) {
            return c;
        }
        self.configs.push(config_id.clone());
        let c = (self.configs.len() - 1) as u32;
        self.config_of.insert(config_id, c);
        c
    }

    /// (stream slot, configuration index, meta index) registered for these header bytes
    /// under this message key.
    fn registered_as(&self, header: &[u8], key: Option<&[u8]>) -> Option<(usize, u32, usize)> {
        self.registered
            .get(header)?
            .iter()
            .find(|(k, _)| k.as_deref() == key)
            .map(|&(_, entry)| entry)
    }

    fn floor(&self, t: f64) -> i64 {
        (t / self.size).floor() as i64
    }

    /// The checks of the Python path for a message it would window in order: the edge's
    /// (`WorkerContext.decode_launches_many` for a header and key that passed before),
    /// the run's (`InOrderRun.take`) and `Windower.add_in_order`'s window edges.
    fn check<'a, 'py>(
        &self,
        message: &'a Bound<'py, PyBytes>,
        key: Option<&[u8]>,
        oldest: f64,
        newest: f64,
        max_bytes: usize,
    ) -> Result<Planned<'a, 'py>, &'static str> {
        let value = message.as_bytes();
        if value.len() > max_bytes {
            return Err("oversized");
        }
        let (n, seq, m) = head(value).ok_or("not_binary")?;
        let header = value.get(HEAD_SIZE..HEAD_SIZE + m).ok_or("layout")?;
        let (slot, config, meta) = self.registered_as(header, key).ok_or("unregistered")?;
        let stream = &self.streams[slot];
        if !stream.held {
            return Err("not_held");
        }
        let pos = HEAD_SIZE + m + (8 - m % 8) % 8;
        if n == 0 || pos + 17 * n + (8 - n % 8) % 8 != value.len() {
            return Err("layout");
        }
        let t = f64s(&value[pos..pos + 8 * n]);
        let d = f64s(&value[pos + 8 * n..pos + 16 * n]);
        let ok = &value[pos + 16 * n..pos + 17 * n];
        let ((lo, hi), in_order, all_ok) =
            plain(&t, &d, ok, self.max_duration_bits).ok_or("columns")?;
        if !in_order {
            return Err("out_of_order");
        }
        if !(oldest <= lo && hi <= newest) {
            return Err("event_time");
        }
        let last_seq = seq.checked_add(n as u64 - 1).ok_or("sequence")?;
        if last_seq >= SEQ_BOUND || (stream.seq_hi >= 0 && seq as i64 != stream.seq_hi + 1) {
            return Err("sequence");
        }
        if !(lo >= stream.max_t) {
            return Err("before_counted");
        }
        let (first, last) = (self.floor(lo), self.floor(hi));
        if stream.closed_below.is_some_and(|c| first < c) {
            return Err("closed_window");
        }
        if !(hi < (last + 1) as f64 * self.size) {
            return Err("window_edge");
        }
        let cuts = if first == last {
            vec![(first, 0, n)]
        } else {
            self.cuts(&t, first, last).ok_or("window_edge")?
        };
        Ok(Planned {
            value: message,
            t_at: pos,
            d_at: pos + 8 * n,
            slot,
            config,
            meta,
            t,
            d,
            ok,
            all_ok,
            seq: seq as i64,
            hi,
            cuts,
        })
    }

    /// `_window_cuts` of `agents.logic.windowing`, the same expressions.
    fn cuts(&self, t: &[f64], first: i64, last: i64) -> Option<Vec<(i64, usize, usize)>> {
        let n = t.len();
        let mut out = Vec::new();
        let mut lo = 0;
        for k in first + 1..=last + 1 {
            let hi = if k > last {
                n
            } else {
                let edge = k as f64 * self.size;
                let mut hi = t.partition_point(|&x| x < edge);
                while hi > lo && self.floor(t[hi - 1]) >= k {
                    hi -= 1;
                }
                while hi < n && self.floor(t[hi]) < k {
                    hi += 1;
                }
                hi
            };
            if hi > lo {
                let window = self.floor(t[lo]);
                if !(t[hi - 1] < (window + 1) as f64 * self.size) {
                    return None;
                }
                out.push((window, lo, hi));
                lo = hi;
            }
        }
        Some(out)
    }

    /// `Windower.add_in_order` of one batch.
    fn add(&mut self, p: Planned<'_, '_>, now: f64) {
        let stream = &mut self.streams[p.slot];
        let n = p.t.len() as i64;
        stream.last_seen = now;
        stream.seq_hi = stream.seq_hi.max(p.seq + n - 1);
        stream.max_t = stream.max_t.max(p.hi);
        // read in place where the columns are aligned (always, but for a bytes object
        // some other allocator placed), else copied
        let in_place = matches!((&p.t, &p.d), (Cow::Borrowed(_), Cow::Borrowed(_)));
        for &(w, a, z) in &p.cuts {
            let acc = stream.open.entry((w, p.config)).or_insert_with(|| Acc {
                meta: p.meta,
                chunks: Vec::new(),
                failures: 0,
                late_accepted: 0,
                seq_min: -1,
                seq_max: -1,
            });
            let ran = if p.all_ok && in_place {
                acc.chunks.push(Chunk::Message {
                    bytes: p.value.clone().unbind(),
                    t_at: p.t_at + 8 * a,
                    d_at: p.d_at + 8 * a,
                    len: z - a,
                });
                z - a
            } else {
                let (mut t, mut d) = (Vec::new(), Vec::new());
                for k in a..z {
                    if p.ok[k] == 1 {
                        t.push(p.t[k]);
                        d.push(p.d[k]);
                    }
                }
                let ran = t.len();
                if ran > 0 {
                    acc.chunks.push(Chunk::Owned { t, d });
                }
                ran
            };
            acc.failures += ((z - a) - ran) as i64;
            let first = p.seq + a as i64;
            acc.add_seq_range(first, first + (z - a) as i64 - 1);
        }
    }

    /// `Windower.poll_key`: the stream's windows its watermark completes, sorted by
    /// (window, config id).
    ///
    /// A window of a series the caller gave a writer for (`write_as`) comes out written:
    /// (stream key, window record, group key, classification, finding, window end,
    /// launches, the series' baseline key and baseline where the window fed it, else
    /// None), where the writer gives its bytes; any other as a `Row`.
    fn close<'py>(
        &mut self,
        py: Python<'py>,
        slot: usize,
        rows: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let (size, lateness) = (self.size, self.lateness);
        let stream = &mut self.streams[slot];
        let watermark = stream.max_t - self.out_of_orderness;
        let mut ready: Vec<(i64, u32)> = stream
            .open
            .keys()
            .take_while(|&&(w, _)| (w + 1) as f64 * size + lateness <= watermark)
            .copied()
            .collect();
        let configs = &self.configs;
        ready.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| configs[a.1 as usize].cmp(&configs[b.1 as usize]))
        });
        for (w, c) in ready {
            let acc = stream.open.remove(&(w, c)).expect("a ready window");
            if stream.closed_below.is_none_or(|cb| w + 1 > cb) {
                stream.closed_below = Some(w + 1);
            }
            let cols: Vec<_> = acc.chunks.iter().map(|c| c.columns(py)).collect();
            let t: Vec<&[f64]> = cols.iter().map(|c| &*c.0).collect();
            let d: Vec<&[f64]> = cols.iter().map(|c| &*c.1).collect();
            let got = stats(&t, &d, &[50.0, 95.0]).map(|s| {
                (
                    s.count,
                    s.total,
                    s.mean,
                    s.std,
                    s.idle_gap_mean_us,
                    s.percentiles[0],
                    s.percentiles[1],
                    s.min,
                    s.max,
                )
            });
            if let (Some(stats), Some(writer)) = (got, stream.written.get(&(acc.meta, c))) {
                let writer = writer.get();
                let counts = (acc.failures, acc.late_accepted, acc.seq_min, acc.seq_max);
                if let Some((record, class, finding, formed)) = writer.written(w, counts, stats) {
                    let end = (w + 1) as f64 * size;
                    let formed = formed
                        .map(|(n, count, sum)| (writer.baseline_key.clone_ref(py), n, count, sum));
                    rows.push(
                        (
                            writer.key.clone_ref(py),
                            PyBytes::new(py, &record),
                            writer.group.clone_ref(py),
                            class,
                            PyBytes::new(py, &finding),
                            end,
                            stats.0 as i64 + acc.failures,
                            formed,
                        )
                            .into_pyobject(py)?
                            .into_any(),
                    );
                    continue;
                }
            }
            // A window left to the Python detector may feed the baseline of its stream
            // and configuration there: the configuration's writer goes (whatever header
            // it was learnt for), so that its later windows (in this poll too) are judged
            // from the detector's baseline until a writer is learnt from it again.
            if !stream.written.is_empty() {
                stream.written.retain(|&(_, wc), _| wc != c);
            }
            let cols = if got.is_none() {
                let (t, d) = acc.joined(py);
                Some((PyArray1::from_vec(py, t), PyArray1::from_vec(py, d)))
            } else {
                None
            };
            let row: Row<'py> = (
                stream.key.clone(),
                w,
                configs[c as usize].clone(),
                acc.meta,
                acc.failures,
                acc.late_accepted,
                acc.seq_min,
                acc.seq_max,
                got,
                cols,
            );
            rows.push(row.into_pyobject(py)?.into_any());
        }
        Ok(())
    }
}
