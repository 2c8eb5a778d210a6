//! One forward of a sparse pattern and its three paths: blocks for a fresh sequence, gathered
//! runs of keys for one decoded token, the dense definition otherwise (a cache, a memory,
//! weights asked for).

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::normaliser::MASKED_SCORE;
use burn::prelude::*;
use burn::tensor::Slice;
use std::ops::Range;
use variorum_core::AttentionMask;
use variorum_position::ScoreLayout;

/// One forward of a sparse pattern: the projections (the cache appended) and what decides its
/// path — blocks for a fresh sequence, gathered keys for one decoded token, the dense definition
/// otherwise.
pub struct PatternCall<'a> {
    pub p: Projected,
    pub mask: &'a AttentionMask,
    pub need_weights: bool,
    /// No padding or custom mask, no weights asked for, not forced dense.
    pub plain: bool,
}

impl<'a> PatternCall<'a> {
    pub fn new(mha: &MultiHeadAttention, input: AttentionInput<'a>, cache: Option<&mut KvCache>, dense: bool) -> Self {
        let mask = input.mask;
        let plain = mask.padding.is_none() && mask.custom.is_none() && !input.need_weights && !dense;
        let p = mha.project(input.query, input.key_value, mask, cache);
        Self { p, mask, need_weights: input.need_weights, plain }
    }

    pub fn causal(&self) -> bool {
        self.mask.causal
    }

    /// A fresh sequence from position 0 (keys = queries) on the plain path: blocks apply.
    pub fn fresh(&self) -> bool {
        let l = &self.p.layout;
        self.plain && l.q_start == 0 && l.k_start == 0 && l.len_q == l.len_k
    }

    /// One new token after its cache on the plain path.
    pub fn decoding(&self) -> bool {
        self.plain && decoding_one(&self.p)
    }

    /// The output of per-head contexts `[b, h, len, d_h]`.
    pub fn output(mha: &MultiHeadAttention, context: Tensor<4>) -> AttentionOutput {
        AttentionOutput { context: mha.merge(context), weights: None, aux_losses: Vec::new() }
    }

    /// Every key scored under `hidden(row, head, q, k)` ([`dense_pattern`]).
    pub fn dense(
        &self,
        mha: &MultiHeadAttention,
        rows: usize,
        hidden: impl Fn(usize, usize, usize, usize) -> bool,
    ) -> AttentionOutput {
        dense_pattern(mha, &self.p, self.mask, self.need_weights, rows, hidden)
    }

    /// Every key scored, query position `q` counting key `k` `visits(q, k)` times in its softmax
    /// (0 = hidden; a key counted m times weighs as one with ln m added to its score): the
    /// definition of a pattern that scores some keys more than once.
    pub fn dense_counted(&self, mha: &MultiHeadAttention, visits: impl Fn(usize, usize) -> usize) -> AttentionOutput {
        let (lq, lk) = (self.p.layout.len_q, self.p.layout.len_k);
        let (q0, k0) = (self.p.layout.q_start, self.p.layout.k_start);
        let log_count: Vec<f32> = (0..lq)
            .flat_map(|i| (0..lk).map(move |j| (q0 + i, k0 + j)))
            .map(|(q, k)| (visits(q, k).max(1) as f32).ln())
            .collect();
        let extra = Tensor::<2>::from_data(TensorData::new(log_count, [lq, lk]), &self.p.device()).unsqueeze::<4>();
        let hidden = |_: usize, _: usize, q: usize, k: usize| visits(q, k) == 0;
        dense_pattern_with(mha, &self.p, self.mask, self.need_weights, 1, hidden, Some(extra))
    }
}

/// Whether `p` is one new query decoded after its cached keys (causal, the last key its own).
pub fn decoding_one(p: &Projected) -> bool {
    p.layout.causal && p.layout.len_q == 1 && p.layout.k_start + p.layout.len_k == p.layout.q_start + 1
}

/// The context `[b, h, 1, d_h]` of one new query (see [`decoding_one`]) over the keys in `runs`
/// — ranges `start..end` of absolute positions, merged here — and in `stepped` — every `step`-th
/// position of a range (disjoint from the rest) —, all clipped to the cache, under
/// `hidden(head, k)`. Each run is a view of the cache scored with its own layout (stride `step`),
/// so every position scheme applies; the cost is the runs' length, not the context's.
pub fn decode_runs(
    mha: &MultiHeadAttention,
    p: &Projected,
    runs: &[Range<usize>],
    stepped: &[(Range<usize>, usize)],
    hidden: impl Fn(usize, usize) -> bool,
) -> Tensor<4> {
    let [b, h, _, dh] = p.q_dims();
    let hkv = p.k.dims()[1];
    let device = p.device();
    let (q_pos, k0) = (p.layout.q_start, p.layout.k_start);
    let mut runs: Vec<Range<usize>> =
        runs.iter().map(|r| r.start.max(k0)..r.end.min(q_pos + 1)).filter(|r| !r.is_empty()).collect();
    runs.sort_by_key(|r| r.start);
    let mut merged: Vec<(Range<usize>, usize)> = Vec::new();
    for r in runs {
        match merged.last_mut() {
            Some((last, _)) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push((r, 1)),
        }
    }
    for (r, step) in stepped {
        // the first position of the run's residue class inside the cache
        let start = if r.start >= k0 { r.start } else { r.start + (k0 - r.start).div_ceil(*step) * step };
        let end = r.end.min(q_pos + 1);
        if start < end {
            merged.push((start..end, *step));
        }
    }
    let expand = |x: Tensor<4>| {
        let n = x.dims()[2];
        if h == hkv { x } else { x.unsqueeze_dim::<5>(2).expand([b, hkv, h / hkv, n, dh]).reshape([b, h, n, dh]) }
    };
    let view = |x: &Tensor<4>, r: &Range<usize>, step: usize| {
        let all = Slice::new(0, None, 1);
        let along = Slice::new((r.start - k0) as isize, Some((r.end - k0) as isize), step as isize);
        expand(x.clone().slice([all, all, along, all]))
    };
    let parts: Vec<(Tensor<4>, Tensor<4>, ScoreLayout)> = merged
        .iter()
        .map(|(r, step)| {
            let n = r.clone().step_by(*step).len();
            (
                view(&p.k, r, *step),
                view(&p.v, r, *step),
                ScoreLayout::new(q_pos, r.start, 1, n, true).with_stride(*step),
            )
        })
        .collect();
    let scores: Vec<Tensor<4>> = parts
        .iter()
        .map(|(k, _, layout)| {
            let mut sc = p.q().matmul(k.clone().swap_dims(2, 3));
            if let Some(pos) = &mha.position {
                sc = pos.scores(sc, p.q(), k.clone(), layout, mha.scale);
            }
            let n = layout.len_k;
            let off: Vec<bool> = (0..h)
                .flat_map(|head| (0..n).map(move |j| (head, j)))
                .map(|(head, j)| hidden(head, layout.k_start + j * layout.stride))
                .collect();
            let off = Tensor::<3, Bool>::from_data(TensorData::new(off, [h, 1, n]), &device).unsqueeze_dim::<4>(0);
            sc.mask_fill(off.expand([b, h, 1, n]), MASKED_SCORE)
        })
        .collect();
    let probs = mha.dropout.forward(mha.normalise(Tensor::cat(scores, 3)));
    let mut context: Tensor<4> = Tensor::zeros([b, h, 1, dh], &device);
    let mut at = 0;
    for (_, v, layout) in parts {
        let n = layout.len_k;
        let pr = probs.clone().narrow(3, at, n);
        context = context + pr.clone().matmul(v);
        if let Some(extra) = mha.position.as_ref().and_then(|pos| pos.context(pr, &layout)) {
            context = context + extra;
        }
        at += n;
    }
    context
}

/// Every key scored, a pattern as the mask: `hidden(row, head, q, k)` at absolute positions, on
/// top of causality, padding and custom masks. `rows` = 1 when the pattern is the same for every
/// batch row (it is then built once), else the batch size. The definition the blocked paths are
/// tested against, and the path of a KV cache or a memory (keys not aligned with the queries).
pub fn dense_pattern(
    mha: &MultiHeadAttention,
    p: &Projected,
    mask: &AttentionMask,
    need_weights: bool,
    rows: usize,
    hidden: impl Fn(usize, usize, usize, usize) -> bool,
) -> AttentionOutput {
    dense_pattern_with(mha, p, mask, need_weights, rows, hidden, None)
}

/// [`dense_pattern`] with `extra` `[1, 1, len_q, len_k]` added to the scores before the mask.
fn dense_pattern_with(
    mha: &MultiHeadAttention,
    p: &Projected,
    mask: &AttentionMask,
    need_weights: bool,
    rows: usize,
    hidden: impl Fn(usize, usize, usize, usize) -> bool,
    extra: Option<Tensor<4>>,
) -> AttentionOutput {
    let (lq, lk) = (p.layout.len_q, p.layout.len_k);
    let device = p.device();
    let mut scores = mha.scores(p);
    if let Some(extra) = extra {
        scores = scores + extra;
    }
    let [b, h, _, _] = scores.dims();
    let (q0, k0) = (p.layout.q_start, p.layout.k_start);
    let outside: Vec<bool> = (0..rows)
        .flat_map(|row| (0..h).flat_map(move |head| (0..lq).flat_map(move |i| (0..lk).map(move |j| (row, head, i, j)))))
        .map(|(row, head, i, j)| hidden(row, head, q0 + i, k0 + j))
        .collect();
    let outside =
        Tensor::<4, Bool>::from_data(TensorData::new(outside, [rows, h, lq, lk]), &device).expand([b, h, lq, lk]);
    let base = AttentionMask { k_start: k0, ..mask.clone() };
    let hidden = match base.score_mask(lq, lk, &device) {
        Some(m) => m.expand([b, h, lq, lk]).bool_or(outside),
        None => outside,
    };
    let probs = mha.normalise(scores.mask_fill(hidden, MASKED_SCORE));
    let weights = need_weights.then(|| probs.clone());
    let context = mha.combine(mha.dropout.forward(probs), p);
    AttentionOutput { context, weights, aux_losses: Vec::new() }
}
