//! The content terms of [`DistanceTerms`](super::DistanceTerms) on one block of queries against
//! its runs of keys, forward and backward.
//!
//! A term reads a table of per-head vectors by the bucket B(e) of each pair's distance entry
//! e = query position − key position + Lk − 1. The pairs of one run reach a contiguous range of
//! entries, and so (for any bucket map) the buckets between the lowest and the highest of them:
//! each term is one GEMM per run against those table rows, `rows × buckets` (queries) or
//! `buckets × keys` (keys) — the Transformer-XL trick of scoring each distinct distance once,
//! without its shift, so it works for any bucket map and any run — then one read per pair. A row's
//! keys whose buckets step by one slope (all those past a clipped distance share one bucket;
//! unclipped distances, or one table row per distance, step by one) are one stretch, read or
//! written as a slice. The value term is the adjoint: each row's probabilities summed by bucket,
//! one GEMM against the value table.

use super::{Bucketed, ScoreActivation, TermSpec};
use crate::causal_attention::flex::gemm;
use crate::fast_math;

/// The terms one call adds to q·k, over every head: a distance bias, content terms, both, or
/// neither.
#[derive(Clone, Copy, Default)]
pub(super) struct Terms<'a> {
    /// `[h, 2 Lk − 1]`.
    pub bias: Option<&'a [f32]>,
    pub content: Option<Content<'a>>,
}

/// The content terms of one call.
#[derive(Clone, Copy)]
pub(super) struct Content<'a> {
    pub spec: &'a TermSpec,
    /// `[h, rows, d_h]`: every term's rows, one after the other.
    pub tables: &'a [f32],
    pub rows: usize,
    /// `[h, 2 Lk − 1]`, where there is a multiplier.
    pub multiplier: Option<&'a [f32]>,
    /// The factor on the queries as the kernel reads them (the score scale of a packed
    /// projection; 1 for queries that come scaled).
    pub scale: f32,
}

/// One head's share of [`Terms`].
#[derive(Clone, Copy)]
pub(super) struct HeadTerms<'a> {
    pub bias: Option<&'a [f32]>,
    pub content: Option<HeadContent<'a>>,
}

/// One head's share of [`Content`].
#[derive(Clone, Copy)]
pub(super) struct HeadContent<'a> {
    pub spec: &'a TermSpec,
    /// This head's tables, `rows × d_h`.
    pub tables: &'a [f32],
    pub multiplier: Option<&'a [f32]>,
    pub dh: usize,
    pub scale: f32,
}

impl<'a> Terms<'a> {
    /// Head `hi`; `width` entries per head in the distance tables.
    pub fn head(&self, hi: usize, width: usize, dh: usize) -> HeadTerms<'a> {
        HeadTerms {
            bias: self.bias.map(|t| &t[hi * width..(hi + 1) * width]),
            content: self.content.map(|c| HeadContent {
                spec: c.spec,
                tables: &c.tables[hi * c.rows * dh..(hi + 1) * c.rows * dh],
                multiplier: c.multiplier.map(|m| &m[hi * width..(hi + 1) * width]),
                dh,
                scale: c.scale,
            }),
        }
    }
}

/// Where one block sits against the distance entries: row r and the key at position k have entry
/// `first + r · step − k`.
#[derive(Clone, Copy)]
pub(super) struct Entries {
    pub first: usize,
    pub step: usize,
    pub rows: usize,
}

/// A run of a block: its first column, its first key's position, its keys.
pub(super) type Run = (usize, usize, usize);

/// A pointer and its (row, column) strides.
type View = (*const f32, (isize, isize));

impl Entries {
    /// The lowest bucket a run of `n` keys from position `k0` reaches, and how many buckets
    /// from there to the highest.
    fn span(&self, bucket: &[u32], k0: usize, n: usize) -> (usize, usize) {
        let lowest = self.first - (k0 + (n - 1) * self.step);
        let (mut lo, mut hi) = (u32::MAX, 0);
        for m in 0..self.rows + n - 1 {
            let b = bucket[lowest + m * self.step];
            (lo, hi) = (lo.min(b), hi.max(b));
        }
        (lo as usize, (hi - lo) as usize + 1)
    }

    /// `f(row, first column, columns, bucket − lowest, slope)` for each stretch of a row's pairs
    /// in run `(col, k0, n)` whose buckets step by `slope` ∈ {−1, 0, 1} from one key to the next:
    /// all the keys past a clipped distance share one bucket, and unclipped ones (or one table
    /// row per distance) step by one, so a row is a few stretches that the callers read or write
    /// as slices.
    #[inline]
    fn stretches(
        &self,
        term: &Bucketed,
        (col, k0, n): Run,
        lowest: usize,
        mut f: impl FnMut(usize, usize, usize, usize, isize),
    ) {
        for r in 0..self.rows {
            // the entry of the run's first key; each later key's is `step` lower
            let e0 = self.first + r * self.step - k0;
            if self.step != 1 {
                for j in 0..n {
                    f(r, col + j, 1, term.bucket[e0 - j * self.step] as usize - lowest, 0);
                }
                continue;
            }
            let (last, mut e, mut j) = (e0 + 1 - n, e0, 0);
            loop {
                let from = (term.starts[e] as usize).max(last);
                let len = e - from + 1;
                let b = term.bucket[e] as usize;
                // keys go down the entries: the bucket steps by minus the map's slope
                let slope = if len > 1 { b as isize - term.bucket[e - 1] as isize } else { 0 };
                f(r, col + j, len, b - lowest, -slope);
                if from == last {
                    break;
                }
                (j, e) = (j + len, from - 1);
            }
        }
    }

    /// `f(row, column, entry)` for every pair of the runs.
    #[inline]
    pub fn entries(&self, runs: &[Run], mut f: impl FnMut(usize, usize, usize)) {
        for r in 0..self.rows {
            for &(col, k0, n) in runs {
                let e0 = self.first + r * self.step - k0;
                for j in 0..n {
                    f(r, col + j, e0 - j * self.step);
                }
            }
        }
    }
}

/// `x` added to every entry of `dst`.
#[inline]
fn add_to(dst: &mut [f32], x: f32) {
    dst.iter_mut().for_each(|d| *d += x);
}

/// `src` added entry by entry into `dst`.
#[inline]
fn add_into(dst: &mut [f32], src: &[f32]) {
    dst.iter_mut().zip(src).for_each(|(d, &x)| *d += x);
}

/// `dst[t] += row[b + slope · t]`: a stretch's entries read from a row of per-bucket values.
#[inline]
fn add_gathered(dst: &mut [f32], row: &[f32], b: usize, slope: isize) {
    let len = dst.len();
    match slope {
        0 => add_to(dst, row[b]),
        1 => add_into(dst, &row[b..b + len]),
        _ => dst.iter_mut().zip(row[b + 1 - len..=b].iter().rev()).for_each(|(d, &x)| *d += x),
    }
}

/// `row[b + slope · t] += src[t]`: a stretch's entries summed into a row of per-bucket values.
#[inline]
fn scatter_into(row: &mut [f32], b: usize, slope: isize, src: &[f32]) {
    let len = src.len();
    match slope {
        0 => row[b] += if let [one] = src { *one } else { fast_math::sum(src) },
        1 => add_into(&mut row[b..b + len], src),
        _ => row[b + 1 - len..=b].iter_mut().rev().zip(src).for_each(|(d, &x)| *d += x),
    }
}

/// The flat index into a `buckets × keys` matrix (`n` keys a row) of a stretch's entry t: bucket
/// b + slope · t, key j + t.
#[inline]
fn diagonal(b: usize, j: usize, n: usize, slope: isize, t: usize) -> usize {
    ((b * n + j) as isize + t as isize * (slope * n as isize + 1)) as usize
}

/// `m` cleared to `len` zeros.
fn zeroed(m: &mut Vec<f32>, len: usize) -> &mut [f32] {
    m.clear();
    m.resize(len, 0.0);
    m
}

/// `m` as `len` entries to be overwritten (by a GEMM that does not read its destination).
fn scratch(m: &mut Vec<f32>, len: usize) -> &mut [f32] {
    m.resize(len, 0.0);
    &mut m[..len]
}

impl HeadContent<'_> {
    /// The first row of `term`'s bucket `b` in this head's tables.
    fn row(&self, term: &Bucketed, b: usize) -> *const f32 {
        self.tables[(term.first + b) * self.dh..].as_ptr()
    }

    /// The run's keys as a view (`keys`: the key head and its per-position strides).
    fn run_keys((kp, (rs, cs)): View, run: Run, step: usize) -> View {
        (kp.wrapping_offset(run.1 as isize * rs), (rs * step as isize, cs))
    }

    /// Adds q_i·Q[B(e)] and k_j·K[B(e)] to the block's scores `s` (rows × `width`): `queries`
    /// the block's query rows, `keys` the key head.
    #[allow(clippy::too_many_arguments)]
    pub fn add_scores(
        &self,
        e: &Entries,
        runs: &[Run],
        (qp, qrc): View,
        keys: View,
        s: &mut [f32],
        width: usize,
        m: &mut Vec<f32>,
    ) {
        let dh = self.dh;
        if let Some(term) = &self.spec.query {
            for &run in runs {
                let (lo, nb) = e.span(&term.bucket, run.1, run.2);
                let m = scratch(m, e.rows * nb);
                let t = self.row(term, lo);
                // SAFETY: the block's query rows, buckets lo..lo + nb of the table, m rows × nb
                unsafe {
                    gemm((e.rows, nb, dh), m.as_mut_ptr(), nb as isize, false, qp, qrc, t, (1, dh as isize), self.scale)
                };
                e.stretches(term, run, lo, |r, col, len, b, slope| {
                    add_gathered(&mut s[r * width + col..][..len], &m[r * nb..(r + 1) * nb], b, slope)
                });
            }
        }
        if let Some(term) = &self.spec.key {
            for &run in runs {
                let (lo, nb) = e.span(&term.bucket, run.1, run.2);
                let n = run.2;
                let m = scratch(m, nb * n);
                let (kr, (krs, kcs)) = Self::run_keys(keys, run, e.step);
                let t = self.row(term, lo);
                // SAFETY: buckets lo..lo + nb of the table, the run's keys, m buckets × keys
                unsafe {
                    gemm((nb, n, dh), m.as_mut_ptr(), n as isize, false, t, (dh as isize, 1), kr, (kcs, krs), 1.0)
                };
                e.stretches(term, run, lo, |r, col, len, b, slope| {
                    let (row, j) = (&mut s[r * width + col..][..len], col - run.0);
                    if slope == 0 {
                        add_into(row, &m[b * n + j..][..len]);
                    } else {
                        row.iter_mut().enumerate().for_each(|(t, x)| *x += m[diagonal(b, j, n, slope, t)]);
                    }
                });
            }
        }
    }

    /// The multiplier on the block's scores: s ← act(s) · m(e), the scores before it kept in
    /// `raw` where the backward needs them.
    pub fn multiply(&self, e: &Entries, runs: &[Run], s: &mut [f32], width: usize, raw: Option<&mut [f32]>) {
        let (Some(mult), Some(act)) = (self.multiplier, self.spec.activation) else { return };
        if let Some(raw) = raw {
            raw.copy_from_slice(s);
        }
        e.entries(runs, |r, col, at| {
            let x = &mut s[r * width + col];
            *x = act.apply(*x) * mult[at];
        });
    }

    /// The multiplier's backward: `ds` (rows × `width`, the gradient of the multiplied scores)
    /// becomes that of the scores before it; `dmult` gathers m's gradient.
    pub fn multiplier_backward(
        &self,
        e: &Entries,
        runs: &[Run],
        raw: &[f32],
        ds: &mut [f32],
        width: usize,
        dmult: &mut [f32],
    ) {
        let (Some(mult), Some(act)) = (self.multiplier, self.spec.activation) else { return };
        e.entries(runs, |r, col, at| {
            let (x, g) = (raw[r * width + col], &mut ds[r * width + col]);
            dmult[at] += *g * act.apply(x);
            *g *= mult[at] * act.slope(x);
        });
    }

    /// Adds Σ_j p_ij V[B(e)] to the block's output rows (`o`, row stride `o_rs`).
    pub fn add_values(
        &self,
        e: &Entries,
        runs: &[Run],
        p: &[f32],
        width: usize,
        (o, o_rs): (*mut f32, isize),
        m: &mut Vec<f32>,
    ) {
        let Some(term) = &self.spec.value else { return };
        let dh = self.dh;
        for &run in runs {
            let (lo, nb) = e.span(&term.bucket, run.1, run.2);
            let m = zeroed(m, e.rows * nb);
            e.stretches(term, run, lo, |r, col, len, b, slope| {
                scatter_into(&mut m[r * nb..(r + 1) * nb], b, slope, &p[r * width + col..][..len])
            });
            let t = self.row(term, lo);
            // SAFETY: m rows × nb, buckets lo..lo + nb of the table, the block's output rows
            unsafe { gemm((e.rows, dh, nb), o, o_rs, true, m.as_ptr(), (nb as isize, 1), t, (dh as isize, 1), 1.0) };
        }
    }

    /// The value term's backward: dP_ij += dO_i·V[B(e)] into `dp` (rows × `width`), and
    /// V's gradient into `dtables` (this head's, rows × d_h) from the block's `p` and `dout`.
    #[allow(clippy::too_many_arguments)]
    pub fn values_backward(
        &self,
        e: &Entries,
        runs: &[Run],
        p: &[f32],
        dp: &mut [f32],
        width: usize,
        (dout, dout_rs): (*const f32, isize),
        dtables: &mut [f32],
        (m1, m2): (&mut Vec<f32>, &mut Vec<f32>),
    ) {
        let Some(term) = &self.spec.value else { return };
        let dh = self.dh;
        for &run in runs {
            let (lo, nb) = e.span(&term.bucket, run.1, run.2);
            let (t, dt) = (self.row(term, lo), dtables[(term.first + lo) * dh..].as_mut_ptr());
            let dpb = scratch(m1, e.rows * nb);
            // SAFETY: the block's dO rows, buckets lo..lo + nb of the table, dpb rows × nb
            unsafe {
                gemm(
                    (e.rows, nb, dh),
                    dpb.as_mut_ptr(),
                    nb as isize,
                    false,
                    dout,
                    (dout_rs, 1),
                    t,
                    (1, dh as isize),
                    1.0,
                )
            };
            let pb = zeroed(m2, e.rows * nb);
            e.stretches(term, run, lo, |r, col, len, b, slope| {
                add_gathered(&mut dp[r * width + col..][..len], &dpb[r * nb..(r + 1) * nb], b, slope);
                scatter_into(&mut pb[r * nb..(r + 1) * nb], b, slope, &p[r * width + col..][..len]);
            });
            // SAFETY: pb rows × nb, the block's dO rows, nb rows of this head's table gradient
            unsafe {
                gemm((nb, dh, e.rows), dt, dh as isize, true, pb.as_ptr(), (1, nb as isize), dout, (dout_rs, 1), 1.0)
            };
        }
    }

    /// The query and key terms' backward from the scores' gradient `ds` (rows × `width`): into
    /// the block's query rows' gradient (`queries`: the rows and their gradient's row 0 and row
    /// stride), the key head's gradient (`keys`: the head and its gradient's row 0 and per-position
    /// row stride) and this head's table gradient.
    #[allow(clippy::too_many_arguments)]
    pub fn scores_backward(
        &self,
        e: &Entries,
        runs: &[Run],
        ds: &[f32],
        width: usize,
        ((qp, qrc), (dqp, dq_rs)): (View, (*mut f32, isize)),
        (keys, (dkp, dk_rs)): (View, (*mut f32, isize)),
        dtables: &mut [f32],
        m: &mut Vec<f32>,
    ) {
        let dh = self.dh;
        if let Some(term) = &self.spec.query {
            for &run in runs {
                let (lo, nb) = e.span(&term.bucket, run.1, run.2);
                let g = zeroed(m, e.rows * nb);
                e.stretches(term, run, lo, |r, col, len, b, slope| {
                    scatter_into(&mut g[r * nb..(r + 1) * nb], b, slope, &ds[r * width + col..][..len])
                });
                let (t, dt) = (self.row(term, lo), dtables[(term.first + lo) * dh..].as_mut_ptr());
                let (g, dhs, nbs) = (g.as_ptr(), dh as isize, nb as isize);
                // SAFETY: g rows × nb; the table's rows, the block's rows and their gradient
                unsafe {
                    gemm((e.rows, dh, nb), dqp, dq_rs, true, g, (nbs, 1), t, (dhs, 1), self.scale);
                    gemm((nb, dh, e.rows), dt, dhs, true, g, (1, nbs), qp, qrc, self.scale);
                }
            }
        }
        if let Some(term) = &self.spec.key {
            for &run in runs {
                let (lo, nb) = e.span(&term.bucket, run.1, run.2);
                let n = run.2;
                let g = zeroed(m, nb * n);
                e.stretches(term, run, lo, |r, col, len, b, slope| {
                    let (src, j) = (&ds[r * width + col..][..len], col - run.0);
                    if slope == 0 {
                        add_into(&mut g[b * n + j..][..len], src);
                    } else {
                        src.iter().enumerate().for_each(|(t, &x)| g[diagonal(b, j, n, slope, t)] += x);
                    }
                });
                let (kr, krc) = Self::run_keys(keys, run, e.step);
                let dkr = dkp.wrapping_offset(run.1 as isize * dk_rs);
                let (t, dt) = (self.row(term, lo), dtables[(term.first + lo) * dh..].as_mut_ptr());
                let (g, dhs, ns) = (g.as_ptr(), dh as isize, n as isize);
                // SAFETY: g buckets × keys; the table's rows, the run's keys and their gradient rows
                unsafe {
                    gemm((n, dh, nb), dkr, dk_rs * e.step as isize, true, g, (1, ns), t, (dhs, 1), 1.0);
                    gemm((nb, dh, n), dt, dhs, true, g, (ns, 1), kr, krc, 1.0);
                }
            }
        }
    }
}

impl ScoreActivation {
    #[inline]
    fn apply(self, x: f32) -> f32 {
        match self {
            ScoreActivation::Identity => x,
            ScoreActivation::Relu => x.max(0.0),
        }
    }

    /// The derivative (ReLU's is 0 at 0, as Burn's).
    #[inline]
    fn slope(self, x: f32) -> f32 {
        match self {
            ScoreActivation::Identity => 1.0,
            ScoreActivation::Relu => f32::from(x > 0.0),
        }
    }
}
