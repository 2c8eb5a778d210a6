//! Poolingformer's two-level attention (Zhang et al. 2021, "Poolingformer: Long Document Modeling
//! with Pooling Attention"), the `poolingformer` kind.
//!
//! Level 1 is sliding-window attention over the input X (window w₁ = `window`):
//!
//! y_i = Σ_{j ∈ N(i, w₁)} softmax_j(q_i·k_j/√d) v_j,   q, k, v = X W_Q, X W_K, X W_V,   Y = [y]W_O.
//!
//! Level 2 is pooling attention that reads level 1's output Y (the levels are stacked: the
//! compressed-memory attention is applied after the sliding window, which is what widens the
//! receptive field — the paper's two-level schema as its abstract and the surveys describe it; the
//! full paper text was not at hand, so the details below marked as choices are ours) with its own
//! projections; its keys and values are pooled over segments of s = `pool_size`
//! positions (kernel = stride = s, `pool` = max or mean, applied to the projected keys and values):
//!
//! k̄_j = Pool(k'_{js … js+s−1}),  v̄_j = Pool(v'_{js … js+s−1}),   q', k', v' = Y W'_Q, Y W'_K, Y W'_V,
//! z_i = Σ_{j ∈ S(i)} softmax_j(q'_i·k̄_j/√d) v̄_j,   Z = [z]W'_O,
//!
//! and the layer returns Y + Z (the block adds the residual X, as the paper's output is the sum
//! of the two levels plus the input). S(i) are the segments inside the larger window w₂ =
//! `level2_window` around i (all segments when `None`).
//!
//! `pool = "dynamic"` is the paper's lightweight dynamic convolution pooling, LDConv(v_1 … v_s) =
//! Σ_i δ_i v_i, a convolution with kernel and stride s whose kernel δ is predicted from the input
//! (Wu et al. 2019's dynamic convolution, normalised by a softmax over its s taps, one kernel per
//! head shared by that head's channels). The text at hand does not say from which position the
//! kernel is predicted; we take, as a causal dynamic convolution does, the segment's last
//! position: δ_j = softmax(W_δ y_{js+s−1} + b_δ) per head (W_δ ∈ ℝ^{d × h·s}, drawn as the
//! projections), the same kernel pooling keys and values. A trailing partial segment of r
//! positions (bidirectional) takes the softmax over its first r taps, from its own last position.
//!
//! Choices (the paper describes the bidirectional encoder only):
//! - Segments are aligned to absolute positions (segment j = positions js … js + s − 1), one pooled
//!   key each; bidirectionally a trailing partial segment is pooled over the positions it has.
//! - Segment j is in S(i) when all of its positions lie in the level-2 window: js ≥ i − w₂ + 1 and
//!   (bidirectional) its last position ≤ i + w₂ − 1.
//! - Causal: a pooled key summarises a whole segment, so query i sees segment j only once it is
//!   complete, (j + 1)·s − 1 ≤ i (the query's own segment counts once i is its last position), plus
//!   the raw keys of its window (i − w₁ < j ≤ i). Level 2 reads y_j, itself causal, so no output
//!   depends on a later position. A query with no visible segment gets a zero level-2 context
//!   (Z is then the output projection's bias).
//! - Bidirectional level 1 is a symmetric window: |i − j| < w₁.
//! - No relative position scheme acts inside (pooled keys have no single position); padding and
//!   custom masks are not applied (as with `memory-compressed`).
//! - Cross-attention (`key_value = Some`): windows over unrelated positions mean nothing, so level 1
//!   attends to every source key and level 2 to the pooled level-2 projections of the source.
//!
//! Cost: level 1 is computed by blocks ([`crate::engine::blocks`]), O(L·(w₁ + B)); level 2 on flex by the
//! block-sparse kernel (each block of queries scoring the pooled segments it may reach, nothing
//! copied per block), elsewhere by query blocks of
//! s positions against the span of pooled keys they may see, O(L·(w₂/s + 2)), or, with no level-2
//! window (or one reaching every segment), one L × L/s score matrix as memory-compressed attention
//! forms — never an L × L matrix. Decoding ([`PoolingState`]) keeps the last w₁ raw
//! level-1 keys, the pooled keys of finished segments still in reach and the raw level-2 keys of
//! the open segment: O(w₁ + L/s + s) per token.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use serde::{Deserialize, Serialize};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_kernels::block_sparse::{SparseLayout, block_sparse_attention};
use variorum_position::ScoreLayout;

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::engine::band::Band;
use crate::engine::blocks::banded;
use crate::engine::config::MultiHeadAttentionConfig;
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::normaliser::MASKED_SCORE;
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

/// How a segment's keys and values become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolKind {
    /// Element-wise maximum over the segment (the paper's best).
    Max,
    /// Element-wise mean over the segment.
    Mean,
    /// Σ_i δ_i v_i with a kernel δ predicted from the segment's last position (lightweight
    /// dynamic convolution).
    Dynamic,
}

attention_config! {
    /// `model.attention` with `kind = "poolingformer"`.
    pub struct PoolingformerConfig [n_heads, head_dim, bias, dropout] {
        /// w₁, level 1's window: keys back, the query's own included (bidirectional: also w₁ − 1
        /// ahead). Default 128 (the paper's).
        pub window: usize = 128,
        /// Pooling of the level-2 keys and values: "max" (default), "mean" or "dynamic" (a
        /// kernel predicted from each segment's last position).
        pub pool: PoolKind = PoolKind::Max,
        /// s, kernel and stride of the pooling. Default 4.
        pub pool_size: usize = 4,
        /// w₂, the larger window the pooled segments come from; `None` (default) = the whole sequence.
        pub level2_window: Option<usize> = None,
    }
}

impl PoolingformerConfig {
    fn mha(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig { bias: self.bias, ..self.head_fields().into() }
    }

    /// The layer, both levels: `init_std` for q/k/v, `out_std` for the output projections.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> PoolingformerAttention {
        let mha = self.mha();
        PoolingformerAttention {
            level1: mha.init(d_model, init_std, out_std, Positioning::NONE, device),
            level2: mha.init(d_model, init_std, out_std, Positioning::NONE, device),
            window: self.window,
            max_pool: self.pool == PoolKind::Max,
            dynamic: (self.pool == PoolKind::Dynamic).then(|| {
                LinearConfig::new(d_model, self.n_heads * self.pool_size)
                    .with_initializer(Initializer::Normal { mean: 0.0, std: init_std })
                    .init(device)
            }),
            pool_size: self.pool_size,
            level2_window: self.level2_window,
        }
    }
}

impl AttentionKind for PoolingformerConfig {
    type Module = PoolingformerAttention;
    const SUMMARY: &'static str = "two-level attention: a sliding window of `window` keys, then pooling attention (max/mean over segments of `pool_size`, within `level2_window`) over the first level's output, summed; causal: finished segments only; computed by blocks";
    const PAPER: &'static str = "Zhang et al. 2021, Poolingformer: Long Document Modeling with Pooling Attention";
    /// No memory beside it: its pooled segments would mix a memory with positions after the
    /// query (`reads_memory: false`, refused by the model's rules).
    // no `cross`: its cross form (`cross()`) does not hide source padding yet
    const CAPS: Capabilities = Capabilities { reads_memory: false, hides_padding: false, ..caps::NO_SCORES };

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.mha().validate(d_model)?;
        check(self.window >= 1, || "model.attention.window must be at least 1".into())?;
        check(self.pool_size >= 1, || "model.attention.pool_size must be at least 1".into())?;
        check(self.level2_window.is_none_or(|w| w >= self.pool_size), || {
            format!(
                "model.attention.level2_window = {:?} must be at least model.attention.pool_size = {} (or unset: the whole sequence)",
                self.level2_window, self.pool_size
            )
        })
    }

    head_settings_hooks!();

    /// Multiply–adds per token over a context of `len_k`: two sets of projections, w₁ raw keys
    /// (plus the block's slack) and the pooled keys in reach.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd) = (d_model as u64, (h.n_heads * h.head_dim) as u64);
        let raw = len_k.min(self.window + self.window.min(128)) as u64;
        let reach = self.level2_window.map_or(len_k, |w| w.min(len_k));
        let pooled = (reach / self.pool_size.max(1) + 2) as u64;
        // a dynamic kernel per segment: d · h · s per s positions
        let kernel = if self.pool == PoolKind::Dynamic { 2 * d * h.n_heads as u64 } else { 0 };
        2 * 2 * (4 * d * hd) + 4 * hd * (raw + pooled) + kernel
    }

    fn build(&self, init: &LayerInit, device: &Device) -> PoolingformerAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("max", Self { window: 3, pool_size: 2, ..Default::default() }),
            TestVariant::new(
                "mean, level-2 window",
                Self { window: 2, pool: PoolKind::Mean, pool_size: 3, level2_window: Some(9), ..Default::default() },
            ),
            TestVariant::new(
                "dynamic, level-2 window",
                Self { window: 2, pool: PoolKind::Dynamic, pool_size: 3, level2_window: Some(9), ..Default::default() },
            ),
        ]
    }
}

/// Decoding state of Poolingformer: level 1's last w₁ keys and values, the pooled level-2 keys
/// and values of finished segments still in reach (`pooled.start` = index of the first kept
/// segment), and the raw level-2 keys and values of the open segment.
#[derive(Debug, Clone, Default)]
pub struct PoolingState {
    /// Level 1's keys and values of the last w₁ positions.
    pub window: KvCache,
    /// Pooled level-2 keys and values of the finished segments still in reach.
    pub pooled: KvCache,
    /// Raw level-2 keys and values of the open segment.
    pub open: Option<(Tensor<4>, Tensor<4>)>,
}

impl PoolingState {
    fn is_fresh(&self) -> bool {
        self.window.is_empty() && self.pooled.is_empty() && self.pooled.start == 0 && self.open.is_none()
    }
}

/// A Poolingformer layer ([`PoolingformerConfig`]): a sliding window, then pooling attention
/// over its output, summed.
#[derive(Module, Debug)]
pub struct PoolingformerAttention {
    /// Level 1: sliding-window attention over the input.
    pub level1: MultiHeadAttention,
    /// Level 2: pooling attention over level 1's output.
    pub level2: MultiHeadAttention,
    /// w₁, level 1's window: keys back, the query's own included (bidirectional: also
    /// w₁ − 1 ahead).
    pub window: usize,
    /// Max pooling (else mean, or dynamic).
    pub max_pool: bool,
    /// W_δ, b_δ: the dynamic pooling's kernels, `d_model → n_heads · s` (`pool = "dynamic"`).
    pub dynamic: Option<Linear>,
    /// s, kernel and stride of the pooling.
    pub pool_size: usize,
    /// w₂, the window the pooled segments come from; `None`: the whole sequence.
    pub level2_window: Option<usize>,
}

/// Whether query `i` sees segment `j` (positions js … js + s − 1, cut at `len`) at level 2.
pub fn sees_segment(i: usize, j: usize, s: usize, len: usize, causal: bool, reach: Option<usize>) -> bool {
    let (first, last) = (j * s, ((j + 1) * s).min(len) - 1);
    let complete = (j + 1) * s <= len;
    let within = reach.is_none_or(|w| first + w > i && (causal || last < i + w));
    if causal { complete && last <= i && within } else { within }
}

/// Pools `[b, h, len, d]` over segments of `s` along the length: `[b, h, ⌈len/s⌉, d]` (or
/// ⌊len/s⌋ with `complete_only`), a trailing partial segment pooled over what it has. Pooled by
/// positions, `[b, len, h · d]`: the projection's own layout (`x` is its head view), where a
/// segment is a view and nothing is copied.
fn pool(x: Tensor<4>, s: usize, max: bool, complete_only: bool) -> Option<Tensor<4>> {
    let x = x.swap_dims(1, 2);
    let [b, l, h, d] = x.dims();
    let full = l / s;
    let reduce = |t: Tensor<4>, dim: usize| if max { t.max_dim(dim) } else { t.mean_dim(dim) };
    let mut parts = Vec::new();
    if full > 0 {
        let segments = x.clone().narrow(1, 0, full * s).reshape([b, full, s, h * d]);
        parts.push(reduce(segments, 2).reshape([b, full, h, d]));
    }
    if !complete_only && full * s < l {
        parts.push(reduce(x.narrow(1, full * s, l - full * s), 1));
    }
    (!parts.is_empty()).then(|| Tensor::cat(parts, 1).swap_dims(1, 2))
}

/// The rows of `source` `[b, len, d]` at the segments' last positions: `(j + 1)·s − 1` for each
/// complete segment, then `len − 1` for a trailing partial one unless `complete_only`.
fn segment_ends(source: &Tensor<3>, s: usize, complete_only: bool) -> Option<Tensor<3>> {
    let l = source.dims()[1];
    let mut ends: Vec<i64> = (1..=l / s).map(|j| (j * s - 1) as i64).collect();
    if !complete_only && !l.is_multiple_of(s) {
        ends.push(l as i64 - 1);
    }
    (!ends.is_empty()).then(|| {
        let n = ends.len();
        source.clone().select(1, Tensor::<1, Int>::from_data(TensorData::new(ends, [n]), &source.device()))
    })
}

impl PoolingformerAttention {
    /// Pools `[b, h, len, d_h]` over segments of s as [`pool`] does; dynamic pooling weighs each
    /// segment by the softmax of the kernel predicted from `ends` (`[b, segments, d_model]`, the
    /// input at each segment's last position, [`segment_ends`]).
    fn pool(&self, x: Tensor<4>, ends: Option<&Tensor<3>>, complete_only: bool) -> Option<Tensor<4>> {
        let s = self.pool_size;
        let (Some(kernel), Some(ends)) = (&self.dynamic, ends) else {
            return pool(x, s, self.max_pool, complete_only);
        };
        let [b, h, l, dh] = x.dims();
        let full = l / s;
        let n = ends.dims()[1];
        if n == 0 {
            return None;
        }
        let logits = kernel.forward(ends.clone()).reshape([b, n, h, s]).swap_dims(1, 2); // [b, h, n, s]
        let mut parts = Vec::new();
        if full > 0 {
            let delta = softmax(logits.clone().narrow(2, 0, full), 3).reshape([b * h * full, 1, s]);
            let segments = x.clone().narrow(2, 0, full * s).reshape([b * h * full, s, dh]);
            parts.push(delta.matmul(segments).reshape([b, h, full, dh]));
        }
        if n > full {
            // the trailing partial segment: its r taps
            let r = l - full * s;
            let delta = softmax(logits.narrow(2, full, 1).narrow(3, 0, r), 3); // [b, h, 1, r]
            parts.push(delta.matmul(x.narrow(2, full * s, r)));
        }
        Some(Tensor::cat(parts, 2))
    }

    /// Keys and values `[b, h, len, d_h]` projected from `source` `[b, len, d_model]`, pooled.
    fn pool_both(
        &self,
        k: Tensor<4>,
        v: Tensor<4>,
        source: &Tensor<3>,
        complete_only: bool,
    ) -> Option<(Tensor<4>, Tensor<4>)> {
        let ends = self.dynamic.as_ref().and_then(|_| segment_ends(source, self.pool_size, complete_only));
        Some((self.pool(k, ends.as_ref(), complete_only)?, self.pool(v, ends.as_ref(), complete_only)?))
    }

    fn band(&self, causal: bool) -> Band {
        let back = self.window - 1;
        Band {
            back,
            ahead: if causal { 0 } else { back },
            block: self.window.clamp(1, 128),
            query_blocks: false,
            causal,
        }
    }

    /// Y + Z, `[b, len_q, d_model]`: by blocks over a fresh sequence, one position at a time in
    /// causal decoding that continues `state`; cross-attention reads the whole source.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut PoolingState>) -> AttentionOutput {
        let mask = input.mask;
        let out = match (input.key_value, state) {
            (Some(source), _) => self.cross(input.query, source),
            (None, Some(st)) if mask.causal => {
                if st.is_fresh() && mask.q_start == 0 {
                    let (out, parts, y) = self.parallel(input.query, mask);
                    self.start_state(st, parts, &y);
                    out
                } else {
                    let l = input.query.dims()[1];
                    let outs: Vec<Tensor<3>> =
                        (0..l).map(|t| self.step(input.query.clone().narrow(1, t, 1), mask.q_start + t, st)).collect();
                    Tensor::cat(outs, 1)
                }
            }
            (None, _) => self.parallel(input.query, mask).0,
        };
        AttentionOutput { context: out, weights: None, aux_losses: Vec::new() }
    }

    /// A fresh sequence: Y + Z, and the keys and values a decoding state starts from (level 1's
    /// k, v; level 2's k', v') with Y, level 2's input.
    fn parallel(&self, x: Tensor<3>, mask: &AttentionMask) -> (Tensor<3>, [Tensor<4>; 4], Tensor<3>) {
        let causal = mask.causal;
        let plain = AttentionMask { causal, ..AttentionMask::causal() };
        let p = self.level1.project(x, None, &plain, None);
        let y = self.level1.merge(banded(&self.level1, &p, &[self.band(causal)], &[]));
        // q' scaled on its projection, not by a pass over its head view
        let q2 = self.level2.qkv.scaled_queries(y.clone(), self.level2.scale);
        let (k2, v2) = self.level2.qkv.keys_values(y.clone());
        let z = self.pooled_attention(q2, k2.clone(), v2.clone(), &y, causal);
        (y.clone() + self.level2.merge(z), [p.k, p.v, k2, v2], y)
    }

    /// Level 2 over a fresh sequence, by query blocks of s: each block scores the span of pooled
    /// keys its queries may see, a constant mask keeping the exact pattern. Per-head context
    /// `[b, h, L, d_h]`; `y` is the input k and v were projected from.
    fn pooled_attention(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, y: &Tensor<3>, causal: bool) -> Tensor<4> {
        let [b, h, l, dh] = q.dims();
        let s = self.pool_size;
        let device = q.device();
        let Some((kp, vp)) = self.pool_both(k, v, y, causal) else {
            return Tensor::zeros([b, h, l, dh], &device); // no complete segment yet
        };
        let n = kp.dims()[2];
        let nb = l.div_ceil(s);
        // segments a block may reach on either side
        let reach = self.level2_window.map_or(n, |w| (w.div_ceil(s) + 1).min(n));
        if let Some(z) = self.on_kernel(&q, (&kp, &vp), causal, reach) {
            return z;
        }
        if reach == n {
            // every block may reach every segment: one L × L/s score matrix (as memory-compressed
            // attention forms), not a copy of all segments per block
            return self.all_segments(q, kp, vp, causal);
        }
        let (before, after) = (reach, if causal { 0 } else { reach });
        let span = before + 1 + after;
        let spans = |x: Tensor<4>| {
            let mut parts = vec![Tensor::zeros([b, h, before, dh], &device), x];
            if nb + after > n {
                parts.push(Tensor::zeros([b, h, nb + after - n, dh], &device));
            }
            let x = Tensor::cat(parts, 2).reshape([b * h, before + nb + after, 1, dh]);
            let views: Vec<Tensor<4>> = (0..span).map(|u| x.clone().narrow(1, u, nb)).collect();
            Tensor::cat(views, 2) // [b·h, nb, span, d]: block t's segments t − before … t + after
        };
        let (ks, vs) = (spans(kp), spans(vp));
        let pad = nb * s - l;
        let q = if pad == 0 { q } else { Tensor::cat(vec![q, Tensor::zeros([b, h, pad, dh], &device)], 2) };
        let qb = q.reshape([b * h, nb, s, dh]);
        let mut hidden = Vec::with_capacity(nb * s * span);
        let mut seen = Vec::with_capacity(nb * s);
        for t in 0..nb {
            for r in 0..s {
                let i = t * s + r;
                let mut any = false;
                for u in 0..span {
                    let j = (t + u) as i64 - before as i64;
                    let ok = i < l && j >= 0 && (j as usize) < n && {
                        sees_segment(i, j as usize, s, l, causal, self.level2_window)
                    };
                    any |= ok;
                    hidden.push(!ok);
                }
                seen.push(if any { 1.0f32 } else { 0.0 });
            }
        }
        let hidden = Tensor::<3, Bool>::from_data(TensorData::new(hidden, [nb, s, span]), &device).unsqueeze_dim(0);
        let scores = qb.matmul(ks.swap_dims(2, 3)).mask_fill(hidden, MASKED_SCORE);
        let probs = self.level2.dropout.forward(softmax(scores, 3));
        let seen = Tensor::<1>::from_data(TensorData::new(seen, [nb * s]), &device).reshape([1, 1, nb * s, 1]);
        (probs.matmul(vs).reshape([b, h, nb * s, dh]) * seen).narrow(2, 0, l)
    }

    /// Level 2 by the block-sparse kernel ([`variorum_kernels::block_sparse`]), where it applies
    /// (flex, no dropout on the probabilities): L queries over the n pooled keys and values
    /// `[b, h, n, d_h]` (a layout with fewer keys than queries), each block of queries scoring
    /// the segments within `reach` of its own, each query the segments [`sees_segment`] gives.
    /// Nothing is copied per block, where the composed path stacks every block's span of
    /// segments (`[b·h, L/s, span, d_h]` for keys and values). Per-head context `[b, h, L, d_h]`.
    fn on_kernel(
        &self,
        q: &Tensor<4>,
        (kp, vp): (&Tensor<4>, &Tensor<4>),
        causal: bool,
        reach: usize,
    ) -> Option<Tensor<4>> {
        if !crate::engine::heads::kernel_takes(&self.level2.dropout, q) {
            return None;
        }
        let [b, h, l, dh] = q.dims();
        let n = kp.dims()[2];
        let (s, w2) = (self.pool_size, self.level2_window);
        let (before, after) = (reach, if causal { 0 } else { reach });
        // the segments of the blocks of `block` queries first ..= last
        let segments = |first: usize, last: usize| (first / s).saturating_sub(before)..(last / s + after + 1).min(n);
        let block = 64;
        let runs = |_: usize, i: usize| vec![segments(i * block, ((i + 1) * block).min(l) - 1)];
        let visible = |_: usize, i: usize, out: &mut Vec<std::ops::Range<usize>>| {
            for j in segments(i, i).filter(|&j| sees_segment(i, j, s, l, causal, w2)) {
                match out.last_mut() {
                    Some(r) if r.end == j => r.end += 1,
                    _ => out.push(j..j + 1),
                }
            }
        };
        let layout = std::sync::Arc::new(SparseLayout::new(l, n, block, 1, runs, visible));
        let norm = variorum_kernels::normalisers::RowNormaliser::Softmax;
        let out = block_sparse_attention(q.clone(), kp.clone(), vp.clone(), None, layout, norm)?;
        Some(out.reshape([b, l, h, dh]).swap_dims(1, 2))
    }

    /// Level 2 when every query may reach every pooled segment `kp`, `vp` (`[b, h, n, d_h]`):
    /// `[b, h, L, n]` scores under the visibility rule.
    fn all_segments(&self, q: Tensor<4>, kp: Tensor<4>, vp: Tensor<4>, causal: bool) -> Tensor<4> {
        let [_, _, l, _] = q.dims();
        let (n, s, device) = (kp.dims()[2], self.pool_size, q.device());
        let mut hidden = Vec::with_capacity(l * n);
        let mut seen = Vec::with_capacity(l);
        for i in 0..l {
            let mut any = false;
            for j in 0..n {
                let ok = sees_segment(i, j, s, l, causal, self.level2_window);
                any |= ok;
                hidden.push(!ok);
            }
            seen.push(if any { 1.0f32 } else { 0.0 });
        }
        let hidden = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [l, n]), &device).reshape([1, 1, l, n]);
        let scores = q.matmul(kp.swap_dims(2, 3)).mask_fill(hidden, MASKED_SCORE);
        let probs = self.level2.dropout.forward(softmax(scores, 3));
        let seen = Tensor::<1>::from_data(TensorData::new(seen, [l]), &device).reshape([1, 1, l, 1]);
        probs.matmul(vp) * seen
    }

    /// The state after a fresh causal sequence.
    fn start_state(&self, st: &mut PoolingState, [k1, v1, k2, v2]: [Tensor<4>; 4], y: &Tensor<3>) {
        let l = k1.dims()[2];
        let s = self.pool_size;
        let keep = l.min(self.window);
        st.window.append(k1.narrow(2, l - keep, keep), v1.narrow(2, l - keep, keep));
        st.window.start = l - keep;
        let done = l / s * s;
        // the complete segments (none when the prompt is shorter than one)
        if let Some((kp, vp)) = self.pool_both(k2.clone(), v2.clone(), y, true) {
            st.pooled.append(kp, vp);
        }
        if done < l {
            st.open = Some((k2.narrow(2, done, l - done), v2.narrow(2, done, l - done)));
        }
        self.trim(st, l - 1);
    }

    /// Drops pooled segments no query from position `t` on can see (they left the level-2 window).
    fn trim(&self, st: &mut PoolingState, t: usize) {
        if let Some(w) = self.level2_window {
            // segment j stays visible while js ≥ t − w + 1
            let first = (t + 1).saturating_sub(w).div_ceil(self.pool_size);
            // (w₂ ≥ s: the first segment in reach has always been appended already)
            st.pooled.drop_front(first.saturating_sub(st.pooled.start));
        }
    }

    /// One causal token `x: [b, 1, d]` at position `t`, continuing `st`.
    fn step(&self, x: Tensor<3>, t: usize, st: &mut PoolingState) -> Tensor<3> {
        let s = self.pool_size;
        // level 1: the last w₁ keys
        let (q1, k1, v1) = self.level1.qkv.self_attention(x);
        let (k, v) = st.window.append(k1, v1);
        let len = k.dims()[2];
        let n = len.min(self.window);
        let (k, v) = (k.narrow(2, len - n, n), v.narrow(2, len - n, n));
        let probs = self.level1.dropout.forward(softmax(q1.mul_scalar(self.level1.scale).matmul(k.swap_dims(2, 3)), 3));
        let y = self.level1.merge(probs.matmul(v));
        let drop = st.window.len().saturating_sub(self.window);
        st.window.drop_front(drop);
        // level 2: the open segment grows; once complete it is pooled
        let (q2, k2, v2) = self.level2.qkv.self_attention(y.clone());
        let (ok, ov) = match st.open.take() {
            Some((a, c)) => (Tensor::cat(vec![a, k2], 2), Tensor::cat(vec![c, v2], 2)),
            None => (k2, v2),
        };
        if (t + 1) % s == 0 {
            // the segment ends here: its dynamic kernel comes from this position's y
            let ends = self.dynamic.as_ref().map(|_| y.clone());
            let kp = self.pool(ok, ends.as_ref(), true).expect("a complete segment");
            let vp = self.pool(ov, ends.as_ref(), true).expect("a complete segment");
            st.pooled.append(kp, vp);
        } else {
            st.open = Some((ok, ov));
        }
        self.trim(st, t);
        let [b, h, _, dh] = q2.dims();
        let z = match st.pooled.get() {
            Some((kp, vp)) if kp.dims()[2] > 0 => {
                let scores = q2.mul_scalar(self.level2.scale).matmul(kp.swap_dims(2, 3));
                self.level2.dropout.forward(softmax(scores, 3)).matmul(vp)
            }
            _ => Tensor::zeros([b, h, 1, dh], &y.device()),
        };
        y + self.level2.merge(z)
    }

    /// Cross-attention: level 1 over every source key, level 2 over the pooled level-2
    /// projections of the source.
    fn cross(&self, query: Tensor<3>, source: Tensor<3>) -> Tensor<3> {
        let (k, v) = self.level1.qkv.keys_values(source.clone());
        let q = self.level1.qkv.scaled_queries(query, self.level1.scale);
        let [_, _, lq, _] = q.dims();
        let lk = k.dims()[2];
        let layout = ScoreLayout::new(0, 0, lq, lk, false);
        let p = Projected::new(q, k, v, layout, None);
        let probs = self.level1.dropout.forward(softmax(self.level1.scores(&p), 3));
        let y = self.level1.combine(probs, &p);
        let (q2, k2, v2) = self.level2.qkv.cross_attention(y.clone(), source.clone());
        let z = match self.pool_both(k2, v2, &source, false) {
            Some((kp, vp)) => {
                let scores = q2.mul_scalar(self.level2.scale).matmul(kp.swap_dims(2, 3));
                self.level2.dropout.forward(softmax(scores, 3)).matmul(vp)
            }
            None => q2.zeros_like(),
        };
        y + self.level2.merge(z)
    }
}

impl AttentionMechanism for PoolingformerAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        PoolingformerAttention::forward(self, input, state.map(|s| s.get_or_default::<PoolingState>()))
    }
}
