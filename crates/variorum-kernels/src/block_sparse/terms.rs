//! The content terms of [`DistanceTerms`](super::DistanceTerms) on one block of queries against
//! its runs of keys, forward and backward.
//!
//! A term reads a table of per-head vectors by the bucket B(e) of each pair's distance entry
//! e = query position − key position + Lk − 1. The pairs of one run reach a contiguous range of
//! entries, and so (for any bucket map) the buckets between the lowest and the highest of them:
//! each term is one GEMM per run against those table rows, `rows × buckets` (queries) or
//! `keys × buckets` (keys), then one gather per pair — the Transformer-XL trick of scoring each
//! distinct distance once, without its shift, so it works for any bucket map and any run.
//! The value term is the adjoint: each row's probabilities summed by bucket, one GEMM against the
//! value table.

use super::{Bucketed, ScoreActivation, TermSpec};
use crate::causal_attention::flex::{Heads, gemm};

/// The terms one call adds to q·k, over every head: a distance bias, content terms, or neither.
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
    /// The query-side vectors r, `[b, h, Lq, d_h]`, where there is a query term.
    pub queries: Option<&'a Heads<'a>>,
    /// `[h, rows, d_h]`: every term's rows, one after the other.
    pub tables: &'a [f32],
    pub rows: usize,
    /// `[h, 2 Lk − 1]`, where there is a multiplier.
    pub multiplier: Option<&'a [f32]>,
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
    /// Row 0 of this head's query-side vectors and their (row, column) strides.
    pub queries: Option<(*const f32, (isize, isize))>,
    /// This head's tables, `rows × d_h`.
    pub tables: &'a [f32],
    pub multiplier: Option<&'a [f32]>,
    pub dh: usize,
}

impl<'a> Terms<'a> {
    /// Head `hi` of batch row `bi`; `width` entries per head in the distance tables.
    pub fn head(&self, (bi, hi): (usize, usize), width: usize, dh: usize) -> HeadTerms<'a> {
        HeadTerms {
            bias: self.bias.map(|t| &t[hi * width..(hi + 1) * width]),
            content: self.content.map(|c| HeadContent {
                spec: c.spec,
                queries: c.queries.map(|r| (r.head(bi, hi), (r.rs(), r.cs()))),
                tables: &c.tables[hi * c.rows * dh..(hi + 1) * c.rows * dh],
                multiplier: c.multiplier.map(|m| &m[hi * width..(hi + 1) * width]),
                dh,
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

    /// `f(row, column, bucket − lowest)` for every pair of run `(col, k0, n)`.
    #[inline]
    fn pairs(&self, bucket: &[u32], (col, k0, n): Run, lowest: usize, mut f: impl FnMut(usize, usize, usize)) {
        for r in 0..self.rows {
            let e0 = self.first + r * self.step - k0;
            for j in 0..n {
                f(r, col + j, bucket[e0 - j * self.step] as usize - lowest);
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

/// `m` cleared to `len` zeros.
fn zeroed(m: &mut Vec<f32>, len: usize) -> &mut [f32] {
    m.clear();
    m.resize(len, 0.0);
    m
}

impl HeadContent<'_> {
    /// The first row of `term`'s bucket `b` in this head's tables.
    fn row(&self, term: &Bucketed, b: usize) -> *const f32 {
        self.tables[(term.first + b) * self.dh..].as_ptr()
    }

    /// Adds r_i·Q[B(e)] and k_j·K[B(e)] to the block's scores `s` (rows × `width`): `rq` the
    /// block's query-side rows (a pointer and (row, column) strides), `keys` the key head.
    #[allow(clippy::too_many_arguments)]
    pub fn add_scores(
        &self,
        e: &Entries,
        runs: &[Run],
        rq: Option<(*const f32, (isize, isize))>,
        (kp, krc): (*const f32, (isize, isize)),
        s: &mut [f32],
        width: usize,
        m: &mut Vec<f32>,
    ) {
        let (dh, step) = (self.dh, e.step as isize);
        if let (Some(term), Some((rp, rrc))) = (&self.spec.query, rq) {
            for &run in runs {
                let (lo, nb) = e.span(&term.bucket, run.1, run.2);
                let m = zeroed(m, e.rows * nb);
                // SAFETY: the block's rows of r, buckets lo..lo + nb of the table, m rows × nb
                unsafe {
                    gemm(
                        (e.rows, nb, dh),
                        m.as_mut_ptr(),
                        nb as isize,
                        false,
                        rp,
                        rrc,
                        self.row(term, lo),
                        (1, dh as isize),
                        1.0,
                    )
                };
                e.pairs(&term.bucket, run, lo, |r, col, b| s[r * width + col] += m[r * nb + b]);
            }
        }
        if let Some(term) = &self.spec.key {
            for &run in runs {
                let (lo, nb) = e.span(&term.bucket, run.1, run.2);
                let m = zeroed(m, run.2 * nb);
                let kr = kp.wrapping_offset(run.1 as isize * krc.0);
                // SAFETY: the run's keys, buckets lo..lo + nb of the table, m keys × nb
                unsafe {
                    gemm(
                        (run.2, nb, dh),
                        m.as_mut_ptr(),
                        nb as isize,
                        false,
                        kr,
                        (krc.0 * step, krc.1),
                        self.row(term, lo),
                        (1, dh as isize),
                        1.0,
                    )
                };
                e.pairs(&term.bucket, run, lo, |r, col, b| s[r * width + col] += m[(col - run.0) * nb + b]);
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
            e.pairs(&term.bucket, run, lo, |r, col, b| m[r * nb + b] += p[r * width + col]);
            // SAFETY: m rows × nb, buckets lo..lo + nb of the table, the block's output rows
            unsafe {
                gemm(
                    (e.rows, dh, nb),
                    o,
                    o_rs,
                    true,
                    m.as_ptr(),
                    (nb as isize, 1),
                    self.row(term, lo),
                    (dh as isize, 1),
                    1.0,
                )
            };
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
            let dpb = zeroed(m1, e.rows * nb);
            // SAFETY: the block's dO rows, buckets lo..lo + nb of the table, dpb rows × nb
            unsafe {
                gemm(
                    (e.rows, nb, dh),
                    dpb.as_mut_ptr(),
                    nb as isize,
                    false,
                    dout,
                    (dout_rs, 1),
                    self.row(term, lo),
                    (1, dh as isize),
                    1.0,
                )
            };
            let pb = zeroed(m2, e.rows * nb);
            e.pairs(&term.bucket, run, lo, |r, col, b| {
                dp[r * width + col] += dpb[r * nb + b];
                pb[r * nb + b] += p[r * width + col];
            });
            let dt = dtables[(term.first + lo) * dh..].as_mut_ptr();
            // SAFETY: pb rows × nb, the block's dO rows, nb rows of this head's table gradient
            unsafe {
                gemm((nb, dh, e.rows), dt, dh as isize, true, pb.as_ptr(), (1, nb as isize), dout, (dout_rs, 1), 1.0)
            };
        }
    }

    /// The query and key terms' backward from the scores' gradient `ds` (rows × `width`): into
    /// the block's query-side rows `drq` (row stride), the key head's gradient `dk` (row 0,
    /// row stride) and this head's table gradient.
    #[allow(clippy::too_many_arguments)]
    pub fn scores_backward(
        &self,
        e: &Entries,
        runs: &[Run],
        ds: &[f32],
        width: usize,
        (rq, drq): (Option<(*const f32, (isize, isize))>, Option<(*mut f32, isize)>),
        (kp, krc): (*const f32, (isize, isize)),
        (dkp, dk_rs): (*mut f32, isize),
        dtables: &mut [f32],
        m: &mut Vec<f32>,
    ) {
        let (dh, step) = (self.dh, e.step as isize);
        if let (Some(term), Some((rp, rrc)), Some((drp, drs))) = (&self.spec.query, rq, drq) {
            for &run in runs {
                let (lo, nb) = e.span(&term.bucket, run.1, run.2);
                let g = zeroed(m, e.rows * nb);
                e.pairs(&term.bucket, run, lo, |r, col, b| g[r * nb + b] += ds[r * width + col]);
                let dt = dtables[(term.first + lo) * dh..].as_mut_ptr();
                // SAFETY: g rows × nb; the table's and the block's rows
                unsafe {
                    gemm(
                        (e.rows, dh, nb),
                        drp,
                        drs,
                        true,
                        g.as_ptr(),
                        (nb as isize, 1),
                        self.row(term, lo),
                        (dh as isize, 1),
                        1.0,
                    );
                    gemm((nb, dh, e.rows), dt, dh as isize, true, g.as_ptr(), (1, nb as isize), rp, rrc, 1.0);
                }
            }
        }
        if let Some(term) = &self.spec.key {
            for &run in runs {
                let (lo, nb) = e.span(&term.bucket, run.1, run.2);
                let g = zeroed(m, run.2 * nb);
                e.pairs(&term.bucket, run, lo, |r, col, b| g[(col - run.0) * nb + b] += ds[r * width + col]);
                let kr = kp.wrapping_offset(run.1 as isize * krc.0);
                let dkr = dkp.wrapping_offset(run.1 as isize * dk_rs);
                let dt = dtables[(term.first + lo) * dh..].as_mut_ptr();
                // SAFETY: g keys × nb; the run's keys and their gradient rows, the table's rows
                unsafe {
                    gemm(
                        (run.2, dh, nb),
                        dkr,
                        dk_rs * step,
                        true,
                        g.as_ptr(),
                        (nb as isize, 1),
                        self.row(term, lo),
                        (dh as isize, 1),
                        1.0,
                    );
                    gemm(
                        (nb, dh, run.2),
                        dt,
                        dh as isize,
                        true,
                        g.as_ptr(),
                        (1, nb as isize),
                        kr,
                        (krc.0 * step, krc.1),
                        1.0,
                    );
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
