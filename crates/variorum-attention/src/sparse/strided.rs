//! Strided attention of the Sparse Transformer (Child et al. 2019), the `strided` kind, with
//! stride ℓ:
//!
//! A⁽¹⁾_i = {j : i − ℓ < j ≤ i}              (the previous ℓ positions)
//! A⁽²⁾_i = {j : (i − j) mod ℓ = 0, j ≤ i}   (every ℓ-th position back)
//!
//! (bidirectionally without j ≤ i: |i − j| < ℓ, and every ℓ-th position either way). The
//! reference's three ways of using them, `combine`: `union` — every head attends to A⁽¹⁾ ∪ A⁽²⁾ in
//! one softmax; `heads` — the first half of the heads attend to A⁽¹⁾, the others to A⁽²⁾;
//! `alternate` — even layers attend to A⁽¹⁾, odd ones to A⁽²⁾.
//!
//! A⁽¹⁾ runs on the band machinery ([`crate::engine::blocks`]); A⁽²⁾ is attention along the columns of the
//! sequence laid out as rows of ℓ: each residue class (positions r, r + ℓ, r + 2ℓ, …) attends
//! within itself, O(L·L/ℓ) — with ℓ ≈ √L both parts are O(L√L), never L × L. Relative position
//! schemes see the columns through a score layout with stride ℓ. Decoding scores new tokens
//! against the cache under the same pattern (the cache is only trimmed for the A⁽¹⁾-only layers
//! of `alternate`).

use std::sync::Arc;

use burn::prelude::*;
use burn::tensor::Slice;
use serde::{Deserialize, Serialize};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_kernels::block_sparse::{Pieces, Slots, SparseLayout, SparsePiece};
use variorum_position::{PositionConfig, RotaryConfig, ScoreLayout, T5BiasConfig};

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::band::Band;
use crate::engine::blocks::{BandScores, band_context, band_scores, banded};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::sparse_kernel;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::pattern::call::dense_pattern;

/// How the two patterns are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StridedCombine {
    /// One softmax over both patterns, every head.
    #[default]
    Union,
    /// Half the heads on each pattern.
    Heads,
    /// Layers alternate: even ones the previous ℓ positions, odd ones every ℓ-th.
    Alternate,
}

/// What one layer's heads attend to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StridedMode {
    Union,
    Heads,
    Local,
    Columns,
}

attention_config! {
    /// `model.attention` with `kind = "strided"`.
    pub struct StridedConfig {
        /// ℓ. Default 64 (√L at L = 4096).
        pub stride: usize = 64,
        /// `union` (default), `heads` or `alternate`.
        pub combine: StridedCombine = StridedCombine::Union,
        /// The layer this config was specialised for ([`AttentionKind::for_layer`]); `alternate`
        /// reads it.
        #[serde(skip)]
        pub layer: usize = 0,
    }
}

impl StridedConfig {
    /// What this layer's heads attend to: `combine`, with `alternate` resolved by the layer's
    /// parity.
    pub fn mode(&self) -> StridedMode {
        match self.combine {
            StridedCombine::Union => StridedMode::Union,
            StridedCombine::Heads => StridedMode::Heads,
            StridedCombine::Alternate if self.layer % 2 == 0 => StridedMode::Local,
            StridedCombine::Alternate => StridedMode::Columns,
        }
    }

    /// The layer: `init_std` for q/k/v, `out_std` for the output projection; `position` supplies
    /// the layer's relative scheme, if any.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> StridedAttention {
        StridedAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            stride: self.stride,
            mode: self.mode(),
        }
    }
}

impl AttentionKind for StridedConfig {
    type Module = StridedAttention;
    const SUMMARY: &'static str = "Sparse Transformer strided pattern (previous ℓ positions, every ℓ-th position): union, split heads or alternating layers; O(L√L) with ℓ ≈ √L";
    const PAPER: &'static str = "Child et al. 2019, Generating Long Sequences with Sparse Transformers";
    const CAPS: Capabilities = caps::BLOCKED_SCORES;
    head_kind_items!();

    fn for_layer(&self, i: usize) -> Self {
        Self { layer: i, ..self.clone() }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.stride >= 1, || "model.attention.stride must be at least 1".into())?;
        check(self.combine != StridedCombine::Heads || self.n_heads >= 2, || {
            "model.attention.combine = \"heads\" splits the heads between the two patterns: it needs n_heads >= 2"
                .into()
        })
    }

    /// Multiply–adds per token: ℓ local keys and L/ℓ column keys.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, (2 * self.stride + len_k / self.stride.max(1)).min(len_k))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // the three ways of combining the two patterns
        [
            (StridedCombine::Union, PositionConfig::Alibi(Default::default())),
            (
                StridedCombine::Heads,
                PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 16, shared: false }),
            ),
            (StridedCombine::Alternate, PositionConfig::Rope(RotaryConfig::default())),
        ]
        .into_iter()
        .map(|(combine, position)| {
            let cfg = Self { stride: 4, combine, ..Default::default() };
            TestVariant::new(format!("{combine:?} + position {}", position.kind()), cfg).with_position(position)
        })
        .chain([TestVariant::new(
            "sigmoid",
            Self { stride: 4, normaliser: crate::engine::normaliser::Normaliser::Sigmoid, ..Default::default() },
        )])
        .collect()
    }
}

/// A Sparse Transformer strided-pattern layer ([`StridedConfig`]): the previous ℓ positions
/// and every ℓ-th one.
#[derive(Module, Debug)]
pub struct StridedAttention {
    /// The multi-head attention the pattern restricts: projections, position scheme, normaliser.
    pub attention: MultiHeadAttention,
    /// ℓ, the stride.
    pub stride: usize,
    /// What the heads attend to (from `combine` and the layer); not saved.
    #[module(skip)]
    pub mode: StridedMode,
}

impl StridedAttention {
    /// Whether head `head` of `heads` at position `q` sees position `k`.
    pub fn sees(&self, head: usize, heads: usize, q: usize, k: usize, causal: bool) -> bool {
        let (q, k, l) = (q as i64, k as i64, self.stride as i64);
        if causal && k > q {
            return false;
        }
        let local = (q - k).abs() < l;
        let column = (q - k).rem_euclid(l) == 0;
        match self.mode {
            StridedMode::Union => local || column,
            StridedMode::Local => local,
            StridedMode::Columns => column,
            StridedMode::Heads if head < heads / 2 => local,
            StridedMode::Heads => column,
        }
    }

    fn local_band(&self, causal: bool) -> Band {
        let back = self.stride - 1;
        Band { back, ahead: if causal { 0 } else { back }, block: self.stride, query_blocks: false, causal }
    }

    /// [`Self::forward_with`] without `dense`, `[b, len_q, d_model]`; `cache` holds the earlier
    /// positions' keys and values when decoding.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        self.forward_with(input, cache, false)
    }

    /// With `dense`, always scores every key under the pattern's mask (the definition; tests).
    pub fn forward_with(&self, input: AttentionInput, mut cache: Option<&mut KvCache>, dense: bool) -> AttentionOutput {
        let mask = input.mask;
        let causal = mask.causal;
        let plain = mask.padding.is_none() && mask.custom.is_none() && !input.need_weights;
        let p = self.attention.project(input.query, input.key_value, mask, cache.as_deref_mut());
        let aligned = p.layout.q_start == p.layout.k_start && p.layout.len_q == p.layout.len_k;
        // one new token after a cache: only the ℓ + L/ℓ keys it can see are scored
        let decoding = causal
            && p.layout.len_q == 1
            && p.layout.k_start + p.layout.len_k == p.layout.q_start + 1
            && self.mode != StridedMode::Local;
        let out = if aligned && plain && !dense {
            let context = match self.mode {
                StridedMode::Local => banded(&self.attention, &p, &[self.local_band(causal)], &[]),
                _ => sparse_kernel::union_context(&self.attention, &p, || {
                    self.pieces(p.q_dims()[1], p.layout.len_q, causal, p.max_back)
                })
                .unwrap_or_else(|| self.blocked(&p, causal)),
            };
            AttentionOutput { context: self.attention.merge(context), weights: None, aux_losses: Vec::new() }
        } else if decoding && plain && !dense {
            AttentionOutput { context: self.attention.merge(self.decode(&p)), weights: None, aux_losses: Vec::new() }
        } else {
            self.dense(&p, mask, input.need_weights)
        };
        if let Some(c) = cache
            && self.mode == StridedMode::Local
        {
            c.drop_front(c.len().saturating_sub(self.stride));
        }
        out
    }

    /// The context of one new query (the last key is its own position): the window of the last
    /// ℓ keys and the keys every ℓ positions before the window, as two score blocks (contiguous,
    /// and with stride ℓ), in one softmax. `[b, h, 1, d_h]`.
    fn decode(&self, p: &Projected) -> Tensor<4> {
        let mha = &self.attention;
        let [b, h, _, dh] = p.q_dims();
        let [_, hkv, lk, _] = p.k.dims();
        let device = p.device();
        let s = self.stride;
        let q_pos = p.layout.q_start;
        let expand = |x: Tensor<4>| {
            let n = x.dims()[2];
            if h == hkv { x } else { x.unsqueeze_dim::<5>(2).expand([b, hkv, h / hkv, n, dh]).reshape([b, h, n, dh]) }
        };
        // the window: the last min(ℓ, lk) keys, the query's own included
        let wn = s.min(lk);
        let w0 = lk - wn;
        // the columns: every ℓ-th key before the window, same residue as the query
        let first = (q_pos - p.layout.k_start) % s;
        let n = (first..w0).step_by(s).len();
        // a view with stride ℓ along the keys, no copy of the cache (a `select` would copy it whole)
        let every_stride = |x: Tensor<4>| {
            let all = Slice::new(0, None, 1);
            x.slice([all, all, Slice::new(first as isize, Some(w0 as isize), s as isize), all])
        };
        let mut parts = vec![(
            expand(p.k.clone().narrow(2, w0, wn)),
            expand(p.v.clone().narrow(2, w0, wn)),
            ScoreLayout::new(q_pos, p.layout.k_start + w0, 1, wn, true),
        )];
        if n > 0 {
            parts.push((
                expand(every_stride(p.k.clone())),
                expand(every_stride(p.v.clone())),
                ScoreLayout::new(q_pos, p.layout.k_start + first, 1, n, true).with_stride(s),
            ));
        }
        // each head's pattern decides what it sees in each part (column heads see only the query
        // itself in the window)
        let scores: Vec<Tensor<4>> = parts
            .iter()
            .map(|(k, _, layout)| {
                let mut sc = p.q().matmul(k.clone().swap_dims(2, 3));
                if let Some(pos) = &mha.position {
                    sc = pos.scores(sc, p.q(), k.clone(), layout, mha.scale);
                }
                let n = layout.len_k;
                let hidden: Vec<bool> = (0..h)
                    .flat_map(|head| (0..n).map(move |j| (head, j)))
                    .map(|(head, j)| {
                        let k = layout.k_start + j * layout.stride;
                        !self.sees(head, h, q_pos, k, true) || p.max_back.is_some_and(|n| q_pos - k > n)
                    })
                    .collect();
                let m = Tensor::<3, Bool>::from_data(TensorData::new(hidden, [h, 1, n]), &device).unsqueeze_dim::<4>(0);
                sc.mask_fill(m.expand([b, h, 1, n]), MASKED_SCORE)
            })
            .collect();
        let widths: Vec<usize> = parts.iter().map(|(_, _, l)| l.len_k).collect();
        let probs = mha.dropout.forward(mha.normalise(Tensor::cat(scores, 3)));
        let mut context: Tensor<4> = Tensor::zeros([b, h, 1, dh], &device);
        let mut at = 0;
        for ((_, v, layout), n) in parts.into_iter().zip(widths) {
            let pr = probs.clone().narrow(3, at, n);
            context = context + pr.clone().matmul(v);
            if let Some(extra) = mha.position.as_ref().and_then(|pos| pos.context(pr, &layout)) {
                context = context + extra;
            }
            at += n;
        }
        context
    }

    /// Every key scored, the pattern as a mask.
    fn dense(&self, p: &Projected, mask: &AttentionMask, need_weights: bool) -> AttentionOutput {
        let h = p.q_dims()[1];
        dense_pattern(&self.attention, p, mask, need_weights, 1, |_, head, q, k| !self.sees(head, h, q, k, mask.causal))
    }

    /// The pattern for the block-sparse kernel ([`sparse_kernel::union_context`]), `h` heads
    /// over `l` positions: A⁽¹⁾ as a band in position order, A⁽²⁾ as a band inside each residue
    /// class (the classes laid end to end; without A⁽¹⁾ a head's column includes the query itself).
    fn pieces(&self, h: usize, l: usize, causal: bool, max_back: Option<usize>) -> Pieces {
        const BLOCK: usize = 64;
        let s = self.stride;
        let far = max_back.unwrap_or(usize::MAX);
        let per_head = self.mode == StridedMode::Heads;
        let groups = if per_head { h } else { 1 };
        let local = |g: usize| match self.mode {
            StridedMode::Union | StridedMode::Local => true,
            StridedMode::Heads => g < h / 2,
            StridedMode::Columns => false,
        };
        let columns = |g: usize| self.mode != StridedMode::Local && !(per_head && g < h / 2);
        let mut pieces = Vec::new();
        if (0..groups).any(local) {
            let back = s - 1;
            let ahead = if causal { 0 } else { s - 1 };
            let band = SparseLayout::new(
                l,
                l,
                BLOCK,
                groups,
                |g, i| match local(g) {
                    true => vec![(i * BLOCK).saturating_sub(back)..((i + 1) * BLOCK).min(l) + ahead],
                    false => Vec::new(),
                },
                |g, q, out| {
                    if local(g) {
                        out.push(q.saturating_sub(back.min(far))..(q + ahead + 1).min(l));
                    }
                },
            );
            pieces.push(SparsePiece::over(Arc::new(band), Slots::Positions));
        }
        if (0..groups).any(columns) {
            // the residue classes end to end, each a whole number of blocks: slot c·m + i is
            // position i·ℓ + c
            let n = l.div_ceil(s);
            let block = n.clamp(1, BLOCK);
            let per_class = n.div_ceil(block) * block;
            let classes = Slots::Classes { stride: s, per_class };
            let slots = s * per_class;
            // positions of class c: i·ℓ + c < l
            let in_class = |c: usize| (l + s - 1 - c) / s;
            let reach = far / s;
            let column = SparseLayout::new(
                slots,
                slots,
                block,
                groups,
                |g, i| {
                    if !columns(g) {
                        return Vec::new();
                    }
                    let (first, c) = (i * block, i * block / per_class);
                    // causal: no key after the block's last row
                    let end = if causal { first % per_class + block } else { per_class };
                    vec![c * per_class..c * per_class + end.min(in_class(c))]
                },
                |g, slot, out| {
                    let (c, i) = (slot / per_class, slot % per_class);
                    if !columns(g) || classes.position(slot, l).is_none() {
                        return;
                    }
                    let with_self = !local(g);
                    out.push(c * per_class + i.saturating_sub(reach)..slot + usize::from(with_self));
                    if !causal {
                        out.push(slot + 1..c * per_class + in_class(c));
                    }
                },
            );
            pieces.push(SparsePiece::over(Arc::new(column), classes));
        }
        Arc::new(pieces)
    }

    /// The column pattern and (union, heads) the band, in one softmax per row: `[b, h, L, d_h]`.
    fn blocked(&self, p: &Projected, causal: bool) -> Tensor<4> {
        let mha = &self.attention;
        let [b, h, l, dh] = p.q_dims();
        let hkv = p.k.dims()[1];
        let device = p.device();
        let s = self.stride;
        let n = l.div_ceil(s);
        let pad = n * s - l;
        let with_band = self.mode != StridedMode::Columns;
        // heads on the band only (`heads`: the first half), and on the columns only
        let band_only: Vec<bool> = (0..h).map(|i| self.mode == StridedMode::Heads && i < h / 2).collect();
        let columns_only: Vec<bool> = (0..h)
            .map(|i| self.mode == StridedMode::Columns || (self.mode == StridedMode::Heads && i >= h / 2))
            .collect();
        let head_flags =
            |f: &[bool]| Tensor::<1, Bool>::from_data(TensorData::new(f.to_vec(), [h]), &device).reshape([1, h, 1, 1]);

        // columns: [b·ℓ, h, n, d], residue r of batch row bi at index bi·ℓ + r
        let expand = |x: Tensor<4>| {
            if h == hkv { x } else { x.unsqueeze_dim::<5>(2).expand([b, hkv, h / hkv, l, dh]).reshape([b, h, l, dh]) }
        };
        let to_columns = |x: Tensor<4>| {
            let x = if pad == 0 { x } else { Tensor::cat(vec![x.clone(), Tensor::zeros([b, h, pad, dh], &device)], 2) };
            x.reshape([b, h, n, s, dh]).permute([0, 3, 1, 2, 4]).reshape([b * s, h, n, dh])
        };
        let (qc, kc, vc) = (to_columns(p.q()), to_columns(expand(p.k.clone())), to_columns(expand(p.v.clone())));
        let layout = ScoreLayout::new(0, 0, n, n, causal).with_stride(s);
        let mut col = qc.clone().matmul(kc.clone().swap_dims(2, 3)); // [b·ℓ, h, n, n]
        if let Some(pos) = &mha.position {
            col = pos.scores(col, qc, kc, &layout, mha.scale);
        }
        // hidden: the future, padded keys, and (union) the query itself, which the band has
        let union = self.mode == StridedMode::Union;
        let far = p.max_back.unwrap_or(usize::MAX);
        let hidden: Vec<bool> = (0..s)
            .flat_map(|r| (0..n).flat_map(move |t| (0..n).map(move |u| (r, t, u))))
            .map(|(r, t, u)| (causal && u > t) || u * s + r >= l || (union && u == t) || t.saturating_sub(u) * s > far)
            .collect();
        let col_mask = Tensor::<3, Bool>::from_data(TensorData::new(hidden, [s, n, n]), &device)
            .reshape([1, s, 1, n, n])
            .expand([b, s, h, n, n])
            .reshape([b * s, h, n, n]);
        let col = col.mask_fill(col_mask, MASKED_SCORE);
        // rows in position order: [b, h, L, n]
        let col_rows = col.reshape([b, s, h, n, n]).permute([0, 2, 3, 1, 4]).reshape([b, h, n * s, n]).narrow(2, 0, l);
        let col_rows = col_rows.mask_fill(head_flags(&band_only).expand([b, h, l, n]), MASKED_SCORE);

        let (probs, band) = if with_band {
            let band = band_scores(mha, p, &[self.local_band(causal)], &[]);
            let [_, _, nb, bs, span, _] = band.dims;
            let band_rows = band.scores.clone().reshape([b, h, nb * bs, span]).narrow(2, 0, l);
            let band_rows = band_rows.mask_fill(head_flags(&columns_only).expand([b, h, l, span]), MASKED_SCORE);
            (mha.normalise(Tensor::cat(vec![band_rows, col_rows], 3)), Some(band))
        } else {
            (mha.normalise(col_rows), None)
        };
        let probs = mha.dropout.forward(probs);
        let pad_rows = |x: Tensor<4>, rows: usize| {
            let [b, h, l, w] = x.dims();
            if rows == l { x } else { Tensor::cat(vec![x.clone(), Tensor::zeros([b, h, rows - l, w], &device)], 2) }
        };

        let mut out: Tensor<4> = Tensor::zeros([b, h, l, dh], &device);
        let mut at = 0;
        if let Some(BandScores { v, layout: band_layout, dims, .. }) = band {
            let [_, _, nb, bs, span, _] = dims;
            let pb = pad_rows(probs.clone().narrow(3, 0, span), nb * bs).reshape([b * h, nb, bs, span]);
            out = out + band_context(mha, pb, v, &band_layout, dims).narrow(2, 0, l);
            at = span;
        }
        // columns back to their layout: [b·ℓ, h, n, n]
        let pc = pad_rows(probs.narrow(3, at, n), n * s).reshape([b, h, n, s, n]).permute([0, 3, 1, 2, 4]);
        let pc = pc.reshape([b * s, h, n, n]);
        let mut ctx = pc.clone().matmul(vc);
        if let Some(extra) = mha.position.as_ref().and_then(|pos| pos.context(pc, &layout)) {
            ctx = ctx + extra;
        }
        let ctx = ctx.reshape([b, s, h, n, dh]).permute([0, 2, 3, 1, 4]).reshape([b, h, n * s, dh]);
        out + ctx.narrow(2, 0, l)
    }
}

impl AttentionMechanism for StridedAttention {
    // The cache grows with every position (the pattern reaches back to 0).
    kv_cache_hooks!();

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }
}
