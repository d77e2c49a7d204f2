//! kernelstream's compiled window stage (`kernelstream._native`).
//!
//! Two passes of the window agent that NumPy makes as many separate calls, each over a
//! fresh temporary array:
//!
//! * [`plain_many`]: the value checks of a poll's binary launch batches (end times finite
//!   and in completion order, durations and `ok` flags in range), batch by batch, with no
//!   concatenation (`schemas.columnar._plain_binary_many`);
//! * [`window_stats`]: the duration statistics of a closing window: count, mean, standard
//!   deviation, idle gaps between launches, percentiles, minimum and maximum
//!   (`agents.logic.windowing.duration_stats_numpy`), p50 and p95 by a counting pass over
//!   the durations' bits ([`select_ranks`]).
//!
//! Both give exactly what the NumPy code gives, bit for bit: sums are NumPy's pairwise
//! summation ([`pairwise`]) over values computed with the same operations in the same
//! order, and a percentile is the same interpolation between the same two ranked values.
//! Where that cannot be promised (a negative or NaN duration, a NaN end time), they
//! return `None`, and where a column is not a contiguous, aligned, native-order array
//! they raise; the caller then takes the NumPy path. The Python code stays the reference;
//! the tests compare the two on the same inputs.

use std::cell::RefCell;

mod engine;
mod written;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;

/// NumPy's pairwise sum of `a`: what `np.add.reduce` returns for a contiguous float64
/// array (NumPy's `pairwise_sum`: below 8 values a plain loop from 0.0; up to 128, eight
/// accumulators, combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), and the
/// rest added in order; above, the two halves, the first a multiple of 8 long).
pub fn pairwise(a: &[f64]) -> f64 {
    pairwise_of(Plain(a))
}

/// Values to sum as NumPy would sum the temporary array holding them: computed where
/// they are summed, eight at a time (the unit NumPy's sum and the vector registers share).
trait Values: Copy {
    fn len(&self) -> usize;
    fn split(self, at: usize) -> (Self, Self);
    fn at(&self, i: usize) -> f64;
    fn eight(&self, i: usize) -> [f64; 8];
}

fn eight(a: &[f64], i: usize) -> &[f64; 8] {
    a[i..i + 8].try_into().expect("eight values")
}

/// The values themselves.
#[derive(Clone, Copy)]
struct Plain<'a>(&'a [f64]);

impl Values for Plain<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn split(self, at: usize) -> (Self, Self) {
        let (a, b) = self.0.split_at(at);
        (Plain(a), Plain(b))
    }
    fn at(&self, i: usize) -> f64 {
        self.0[i]
    }
    fn eight(&self, i: usize) -> [f64; 8] {
        *eight(self.0, i)
    }
}

/// (d - mean) ** 2: NumPy's `dev = d - mean; dev *= dev`.
#[derive(Clone, Copy)]
struct Deviations<'a>(&'a [f64], f64);

impl Values for Deviations<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn split(self, at: usize) -> (Self, Self) {
        let (a, b) = self.0.split_at(at);
        (Deviations(a, self.1), Deviations(b, self.1))
    }
    fn at(&self, i: usize) -> f64 {
        let v = self.0[i] - self.1;
        v * v
    }
    fn eight(&self, i: usize) -> [f64; 8] {
        let d = eight(self.0, i);
        std::array::from_fn(|j| {
            let v = d[j] - self.1;
            v * v
        })
    }
}

fn pairwise_of<V: Values>(v: V) -> f64 {
    let n = v.len();
    if n < 8 {
        let mut res = 0.0;
        for i in 0..n {
            res += v.at(i);
        }
        res
    } else if n <= 128 {
        let mut r = v.eight(0);
        let end = n - n % 8;
        let mut i = 8;
        while i < end {
            let b = v.eight(i);
            for j in 0..8 {
                r[j] += b[j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += v.at(i);
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        let (a, b) = v.split(n2);
        pairwise_of(a) + pairwise_of(b)
    }
}

/// Duration statistics of one window (see [`stats`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub count: usize,
    pub total: f64,
    pub mean: f64,
    pub std: f64,
    pub idle_gap_mean_us: f64,
    pub percentiles: Vec<f64>,
    pub min: f64,
    pub max: f64,
}

#[derive(Default)]
struct Scratch {
    t: Vec<f64>,
    d: Vec<f64>,
    gaps: Vec<f64>,
    order: Vec<usize>,
}

thread_local! {
    // Reused from window to window: a fresh buffer of a large window is memory to fault in
    // (on a virtual machine, more than the statistics cost).
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Largest scratch kept between windows (values per column): a rare huge window does not
/// pin its memory for good.
const SCRATCH_KEEP: usize = 1 << 20;

/// The statistics `_aggregate_acc` computes of a window whose launches' end times and
/// durations are the concatenations of `t_chunks` and `d_chunks` (in arrival order), at
/// percentiles `qs`; `None` if there are no launches, or if a duration is negative or NaN
/// or an end time NaN (NumPy's rules for those are left to NumPy).
pub fn stats(t_chunks: &[&[f64]], d_chunks: &[&[f64]], qs: &[f64]) -> Option<Stats> {
    SCRATCH.with(|cell| {
        let mut s = cell.borrow_mut();
        let out = stats_in(&mut s, t_chunks, d_chunks, qs);
        if s.d.capacity() > SCRATCH_KEEP {
            *s = Scratch::default();
        }
        out
    })
}

fn stats_in(
    s: &mut Scratch,
    t_chunks: &[&[f64]],
    d_chunks: &[&[f64]],
    qs: &[f64],
) -> Option<Stats> {
    let Scratch { t, d, gaps, order } = s;
    // one chunk each (a window held whole): read in place; else joined
    let (t, d): (&[f64], &[f64]) = match (t_chunks, d_chunks) {
        ([tc], [dc]) => (tc, dc),
        _ => {
            t.clear();
            d.clear();
            for c in t_chunks {
                t.extend_from_slice(c);
            }
            for c in d_chunks {
                d.extend_from_slice(c);
            }
            (t, d)
        }
    };
    // Non-negative and not NaN: then the bits order the values as the values do. Each
    // check a reduction without an early exit, so that it runs on vectors.
    let (lo, hi, sign) = bounds(d);
    let n = d.len();
    if n == 0 || t.len() != n || sign >> 63 != 0 {
        return None;
    }
    let (tv, dv) = (t, d);
    let total = pairwise(dv);
    // Without a sign bit a duration is 0, positive, +inf or NaN, and only a NaN makes
    // their sum NaN: one test for all of them (a lane of NaN tests in `bounds` cost more
    // than the bounds themselves).
    if total.is_nan() || (n == 1 && t[0].is_nan()) {
        return None;
    }
    let mean = total / n as f64;
    // NumPy's `dev = d - mean; dev *= dev`, summed
    let std = (pairwise_of(Deviations(dv, mean)) / n as f64).sqrt();
    let mut idle_gap_mean_us = 0.0;
    if n > 1 {
        // into a buffer, then summed: a map over three columns vectorizes as a loop of
        // its own, not inside the sum's blocks of eight. The gaps in arrival order, and in
        // the same pass whether the end times are in order (NaN compares false: an end
        // time NaN makes them not); if they are not, the gaps again in time order.
        gaps.clear();
        let mut in_order = true;
        gaps.extend(
            dv[1..]
                .iter()
                .zip(&tv[1..])
                .zip(&tv[..n - 1])
                .map(|((&d, &t), &b)| {
                    in_order &= t >= b;
                    gap(d, t, b)
                }),
        );
        if !in_order {
            if tv.iter().any(|x| x.is_nan()) {
                return None;
            }
            // np.argsort(t, kind="stable"): ties keep their arrival order
            gaps.clear();
            order.clear();
            order.extend(0..n);
            order.sort_by(|&a, &b| tv[a].partial_cmp(&tv[b]).expect("no NaN end time"));
            gaps.extend(order.windows(2).map(|w| gap(dv[w[1]], tv[w[1]], tv[w[0]])));
        }
        idle_gap_mean_us = pairwise(gaps) / (n - 1) as f64 * 1e6;
    }
    let percentiles = ranked(d, qs, lo, hi);
    Some(Stats {
        count: n,
        total,
        mean,
        std,
        idle_gap_mean_us,
        percentiles,
        min: lo,
        max: hi,
    })
}

/// (smallest, largest (at least 0), every value's bits ORed) of `d`, in eight lanes
/// reduced at the end: a fold of one accumulator (a scalar min and max per value) does
/// not vectorize. Where no value is NaN (the caller returns if one is), min and max are
/// the same whatever the order they are taken in.
fn bounds(d: &[f64]) -> (f64, f64, u64) {
    const L: usize = 8;
    let (mut lo, mut hi, mut bits) = ([f64::INFINITY; L], [0.0f64; L], [0u64; L]);
    let mut lanes = d.chunks_exact(L);
    for c in &mut lanes {
        for k in 0..L {
            let x = c[k];
            lo[k] = if x < lo[k] { x } else { lo[k] };
            hi[k] = if x > hi[k] { x } else { hi[k] };
            bits[k] |= x.to_bits();
        }
    }
    for (k, &x) in lanes.remainder().iter().enumerate() {
        lo[k] = if x < lo[k] { x } else { lo[k] };
        hi[k] = if x > hi[k] { x } else { hi[k] };
        bits[k] |= x.to_bits();
    }
    let lo = lo
        .iter()
        .fold(f64::INFINITY, |a, &x| if x < a { x } else { a });
    let hi = hi.iter().fold(0.0f64, |a, &x| if x > a { x } else { a });
    (lo, hi, bits.iter().fold(0, |a, b| a | b))
}

/// max(0, (t - d * 1e-6) - t_before), as `_aggregate_acc` computes it: `d * -1e-6`, plus
/// `t`, minus `t_before`, then `np.maximum(gap, 0.0)` (which keeps a NaN).
#[inline]
fn gap(d: f64, t: f64, t_before: f64) -> f64 {
    let g = (d * -1e-6 + t) - t_before;
    // NaN compares false and is kept, as np.maximum keeps it; branch-free, so vectorized
    if g < 0.0 {
        0.0
    } else {
        g
    }
}

/// The percentiles `qs` of `values` (non-negative, no NaN, between `lo` and `hi`;
/// reordered): NumPy's default method, linear interpolation between the two closest
/// ranks.
fn ranked(values: &[f64], qs: &[f64], lo: f64, hi: f64) -> Vec<f64> {
    let n = values.len();
    let pos: Vec<f64> = qs.iter().map(|q| (n - 1) as f64 * q / 100.0).collect();
    let mut ranks: Vec<usize> = pos
        .iter()
        .flat_map(|p| {
            let k = p.floor() as usize;
            [k, (k + 1).min(n - 1)]
        })
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    if ranks.is_empty() {
        return Vec::new();
    }
    let at = select_ranks(values, &ranks, lo, hi);
    let value_at = |r: usize| at[ranks.binary_search(&r).expect("a rank selected")];
    pos.iter()
        .map(|&p| {
            let k = p.floor() as usize;
            let (a, b) = (value_at(k), value_at((k + 1).min(n - 1)));
            a + (b - a) * (p - k as f64)
        })
        .collect()
}

/// Buckets of the radix pass (a power of two): its four sets of counts (32 KB) stay in
/// the first-level cache.
const BUCKETS: usize = 2048;

/// The values at `ranks` (ascending) of `values` (non-negative, no NaN, between `lo` and
/// `hi`), by their bits, which order them as their values do: one pass counts the values
/// in `BUCKETS` equal ranges of bits between `lo` and `hi`, a second gathers those of the
/// buckets the ranks fall in, and each rank is selected among those (usually a few
/// hundred values where a selection over all of them would move every value twice).
fn select_ranks(values: &[f64], ranks: &[usize], lo: f64, hi: f64) -> Vec<f64> {
    let (lo, hi) = (lo.to_bits(), hi.to_bits());
    if lo == hi {
        return vec![f64::from_bits(lo); ranks.len()];
    }
    let span = hi - lo;
    let shift = (64 - span.leading_zeros()).saturating_sub(BUCKETS.trailing_zeros());
    // within 0..BUCKETS for every value between lo and hi (the mask says so to the
    // compiler: no bounds check in the passes below)
    let bucket = |x: f64| ((x.to_bits() - lo) >> shift) as usize & (BUCKETS - 1);
    // four interleaved counts: neighbouring values mostly fall in the same bucket, and one
    // array would make each increment wait for the one before it
    let mut four = Box::new([[0u32; BUCKETS]; 4]);
    let [c0, c1, c2, c3] = &mut *four;
    let mut quads = values.chunks_exact(4);
    for q in &mut quads {
        c0[bucket(q[0])] += 1;
        c1[bucket(q[1])] += 1;
        c2[bucket(q[2])] += 1;
        c3[bucket(q[3])] += 1;
    }
    for &x in quads.remainder() {
        c0[bucket(x)] += 1;
    }
    let counts: Vec<u32> = (0..BUCKETS)
        .map(|b| c0[b] + c1[b] + c2[b] + c3[b])
        .collect();
    // for each rank: its bucket and its rank within the bucket
    let mut wanted: Vec<(usize, usize)> = Vec::with_capacity(ranks.len());
    let (mut below, mut b) = (0usize, 0usize);
    for &r in ranks {
        while below + counts[b] as usize <= r {
            below += counts[b] as usize;
            b += 1;
        }
        wanted.push((b, r - below));
    }
    let mut buckets: Vec<usize> = wanted.iter().map(|w| w.0).collect();
    buckets.dedup();
    // The wanted buckets' values, gathered by their bits: each run of neighbouring wanted
    // buckets is one range of bits, so the pass over all the values is a subtraction and
    // a comparison per range (no table to look up), then they go to their buckets.
    let mut runs: Vec<(u64, u64)> = Vec::new(); // (first bits, length)
    for &b in &buckets {
        let (first, len) = ((b as u64) << shift, 1u64 << shift);
        match runs.last_mut() {
            Some(last) if last.0 + last.1 == first => last.1 += len,
            _ => runs.push((first, len)),
        }
    }
    let total: usize = buckets.iter().map(|&b| counts[b] as usize).sum();
    let mut gathered: Vec<f64> = Vec::with_capacity(total);
    match runs[..] {
        [(a, la)] => gather(values, &mut gathered, |x| {
            (x.to_bits().wrapping_sub(lo)).wrapping_sub(a) < la
        }),
        [(a, la), (b, lb)] => gather(values, &mut gathered, |x| {
            let v = x.to_bits().wrapping_sub(lo);
            (v.wrapping_sub(a) < la) | (v.wrapping_sub(b) < lb)
        }),
        _ => {
            let mut wanted_bucket = [false; BUCKETS];
            for &b in &buckets {
                wanted_bucket[b] = true;
            }
            gathered.extend(values.iter().filter(|&&x| wanted_bucket[bucket(x)]));
        }
    }
    let mut kept: Vec<Vec<f64>> = buckets
        .iter()
        .map(|&b| Vec::with_capacity(counts[b] as usize))
        .collect();
    for x in gathered {
        let at = buckets.binary_search(&bucket(x)).expect("a wanted bucket");
        kept[at].push(x);
    }
    wanted
        .iter()
        .map(|&(b, k)| {
            let part = &mut kept[buckets.binary_search(&b).expect("a wanted bucket")];
            *part.select_nth_unstable_by_key(k, |x| x.to_bits()).1
        })
        .collect()
}

/// Appends to `out` the values `inside` takes, in order. The wanted values are few (a
/// bucket or two of thousands), so blocks of 16 are tested first with a test per value
/// and no branch (which runs on vectors), and only a block with one is filtered: three
/// times faster than a filter's branch per value.
fn gather(values: &[f64], out: &mut Vec<f64>, inside: impl Fn(f64) -> bool) {
    let mut blocks = values.chunks_exact(16);
    for block in &mut blocks {
        if block.iter().fold(false, |any, &x| any | inside(x)) {
            out.extend(block.iter().filter(|&&x| inside(x)));
        }
    }
    out.extend(blocks.remainder().iter().filter(|&&x| inside(x)));
}

/// The checks `_plain_binary` makes of one batch's columns: `None` where they do not
/// plainly pass, else ((earliest, latest end time), end times in completion order,
/// every launch ran). Every check is a reduction without an early exit (vectorized).
// `!(a >= b)` on purpose: true for NaN, as NumPy's `~(t[1:] >= t[:-1])` is
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub fn plain(
    t: &[f64],
    d: &[f64],
    ok: &[u8],
    max_duration_bits: u64,
) -> Option<((f64, f64), bool, bool)> {
    let n = t.len();
    if n == 0 || d.len() != n || ok.len() != n {
        return None;
    }
    // each a plain loop that ORs or folds, never stopping early: the compiler vectorizes it
    let mut back = false; // a step back in end times (NaN compares false)
    for (b, a) in t[1..].iter().zip(&t[..n - 1]) {
        back |= !(b >= a);
    }
    let (lo, hi) = if !back {
        (t[0], t[n - 1])
    } else {
        if t.iter().any(|x| x.is_nan()) {
            return None; // NumPy's min and max give NaN: not finite
        }
        t.iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (if x < a { x } else { a }, if x > b { x } else { b })
            })
    };
    if !(lo.is_finite() && hi.is_finite()) {
        return None;
    }
    // bits <= max_duration_bits: for a limit that is a positive finite number, the same as
    // no sign bit, and at most the limit (which a NaN is not)
    let limit = f64::from_bits(max_duration_bits);
    if !(limit.is_finite() && limit > 0.0) {
        return None;
    }
    let mut bad = 0u64;
    for &x in d {
        bad |= (!(x <= limit)) as u64 | (x.to_bits() >> 63);
    }
    if bad != 0 {
        return None;
    }
    let (mut ok_lo, mut ok_hi) = (u8::MAX, 0u8);
    for &x in ok {
        ok_lo = ok_lo.min(x);
        ok_hi = ok_hi.max(x);
    }
    if ok_hi > 1 {
        return None;
    }
    Some(((lo, hi), !back, ok_lo == 1))
}

// -- Python ---------------------------------------------------------------------------

/// A 1-d contiguous array's values, without rust-numpy's borrow tracking (which costs
/// more than checking a small batch). Sound here: the caller holds the GIL and no Python
/// code runs while the slice is read (nothing else is called back).
fn view<'a, T: numpy::Element>(a: &'a Bound<'_, PyArray1<T>>) -> PyResult<&'a [T]> {
    // SAFETY: see above; as_slice checks that the array is contiguous and aligned (a
    // ValueError otherwise), the extraction that its dtype is T in native byte order.
    unsafe { a.as_slice() }.map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

/// (count, total, mean, std, idle_gap_mean_us, percentiles, min, max) of a window, or None
/// (see [`stats`]).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn window_stats(
    t_chunks: Vec<Bound<'_, PyArray1<f64>>>,
    d_chunks: Vec<Bound<'_, PyArray1<f64>>>,
    qs: Vec<f64>,
) -> PyResult<Option<(usize, f64, f64, f64, f64, Vec<f64>, f64, f64)>> {
    let t: Vec<&[f64]> = t_chunks.iter().map(view).collect::<PyResult<_>>()?;
    let d: Vec<&[f64]> = d_chunks.iter().map(view).collect::<PyResult<_>>()?;
    Ok(stats(&t, &d, &qs).map(|s| {
        (
            s.count,
            s.total,
            s.mean,
            s.std,
            s.idle_gap_mean_us,
            s.percentiles,
            s.min,
            s.max,
        )
    }))
}

/// [`plain`] of each batch's (t_end, duration_us, ok) columns.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn plain_many(
    t: Vec<Bound<'_, PyArray1<f64>>>,
    d: Vec<Bound<'_, PyArray1<f64>>>,
    ok: Vec<Bound<'_, PyArray1<u8>>>,
    max_duration_bits: u64,
) -> PyResult<Vec<Option<((f64, f64), bool, bool)>>> {
    if t.len() != d.len() || t.len() != ok.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "one t, d and ok per batch",
        ));
    }
    let mut out = Vec::with_capacity(t.len());
    for ((t, d), ok) in t.iter().zip(&d).zip(&ok) {
        out.push(plain(view(t)?, view(d)?, view(ok)?, max_duration_bits));
    }
    Ok(out)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(window_stats, m)?)?;
    m.add_function(wrap_pyfunction!(plain_many, m)?)?;
    m.add_class::<engine::WindowEngine>()?;
    m.add_class::<written::Rules>()?;
    m.add_class::<written::SeriesWriter>()?;
    Ok(())
}
