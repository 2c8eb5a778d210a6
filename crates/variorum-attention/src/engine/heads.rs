//! Multi-head scaled dot-product attention, the engine of `full` and of every kind that changes
//! one of its steps:
//!
//! Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V,   head_i = Attention(X W_i^Q, X W_i^K, X W_i^V),
//! MultiHead(X) = [head_1; …; head_h] W^O,
//!
//! in three steps a kind may take apart: project (rotate, append to the cache), score (position
//! scheme, mask, normaliser), combine (values, output projection). Grouped-query attention shares
//! each K/V head among `n_heads / n_kv_heads` query heads: the queries of a group are stacked
//! along the length so one batched GEMM serves the group and K/V are never copied. Which path
//! computes a forward (fused kernel, blocks, composed) is decided in `forward.rs`.

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::head_losses::{DiversityConfig, GuidanceConfig};
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::normaliser::ScoreNormaliser;
use crate::engine::qkv::QkvProjection;
use burn::nn::{Dropout, Linear};
use burn::prelude::*;
use variorum_core::AttentionMask;
use variorum_position::{RelativePosition, ScoreLayout};

/// Multi-head scaled dot-product attention (Vaswani et al. 2017): the `full` kind's module, and
/// the engine of every kind that changes one of its steps.
#[derive(Module, Debug)]
pub struct MultiHeadAttention {
    /// The fused q/k/v projection (W^Q, W^K, W^V), grouped-query where `n_kv_heads < n_heads`.
    pub qkv: QkvProjection,
    /// The layer's relative position scheme; `None` with absolute positions or none.
    pub position: Option<RelativePosition>,
    /// The output projection W^O, `n_heads · d_h → d_model`.
    pub out: Linear,
    /// Dropout on the attention probabilities.
    pub dropout: Dropout,
    /// Scores to weights (softmax unless the config says otherwise).
    pub normaliser: ScoreNormaliser,
    /// Auxiliary losses on the heads (`full` only; none by default).
    #[module(skip)]
    pub losses: HeadLosses,
    /// The factor on q·kᵀ: 1/√d_h times the position scheme's content factor (below 1 for
    /// schemes that add score terms of the same size: TUPE, DeBERTa).
    pub scale: f64,
}

/// The auxiliary losses a `full` layer adds ([`head_losses`](crate::engine::head_losses)).
#[derive(Debug, Clone, Default)]
pub struct HeadLosses {
    pub diversity: Option<DiversityConfig>,
    pub guidance: Option<GuidanceConfig>,
}

/// Queries (scaled), keys and values of one forward, and where their scores sit.
pub struct Projected {
    /// `scale · q`, `[b, n_heads, len_q, head_dim]` ([`Projected::q`]).
    q: Queries,
    /// `[b, n_kv_heads, len_k, head_dim]`, the cache included.
    pub k: Tensor<4>,
    /// `[b, n_kv_heads, len_k, head_dim]`, the cache included.
    pub v: Tensor<4>,
    /// Where the scores sit: the queries' and keys' first positions and lengths, causality.
    pub layout: ScoreLayout,
    /// No key more than this many positions before its query (`AttentionMask::max_back`).
    pub max_back: Option<usize>,
    /// The fused projection's output `[b, L, (h + 2 h_kv) · d_h]` when q (before its scale), k
    /// and v are exactly its views — self-attention without a cache, a rotation or appended
    /// position vectors, where a kernel may take the call (flex, no dropout) — so a kernel can
    /// read them in place and hand back one gradient. Private: a `Projected` whose q, k or v
    /// were changed is built anew ([`Projected::new`]) and has none.
    packed: Option<Tensor<3>>,
}

/// The scaled queries, or the queries and their scale where q is a view of the packed
/// projection: a kernel reading that scales q itself, and the product would be a strided,
/// single-threaded pass over the view (19 ms of a 160 ms sliding-window step at 16k), so it is
/// formed on first use.
enum Queries {
    Scaled(Tensor<4>),
    OnUse { unscaled: Tensor<4>, scale: f64, scaled: std::cell::OnceCell<Tensor<4>> },
}

impl Projected {
    /// Projections formed elsewhere (no packed projection behind them); `q` already scaled.
    pub fn new(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, layout: ScoreLayout, max_back: Option<usize>) -> Self {
        Self { q: Queries::Scaled(q), k, v, layout, max_back, packed: None }
    }

    /// The scaled queries `scale · q`, `[b, n_heads, len_q, head_dim]`.
    pub fn q(&self) -> Tensor<4> {
        match &self.q {
            Queries::Scaled(q) => q.clone(),
            Queries::OnUse { unscaled, scale, scaled } => {
                scaled.get_or_init(|| unscaled.clone().mul_scalar(*scale)).clone()
            }
        }
    }

    /// The queries' shape `[b, n_heads, len_q, head_dim]`, without forming them.
    pub fn q_dims(&self) -> [usize; 4] {
        match &self.q {
            Queries::Scaled(q) | Queries::OnUse { unscaled: q, .. } => q.dims(),
        }
    }

    /// The device the projections live on.
    pub fn device(&self) -> Device {
        self.k.device()
    }

    /// The fused projection q, k and v are views of, where a kernel may read it (see the
    /// field).
    pub fn packed(&self) -> Option<&Tensor<3>> {
        self.packed.as_ref()
    }

    /// The same projections for rows `rows` of the batch (no packed projection).
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Self {
        let pick = |x: &Tensor<4>| x.clone().narrow(0, rows.start, rows.len());
        Self::new(pick(&self.q()), pick(&self.k), pick(&self.v), self.layout, self.max_back)
    }
}

impl MultiHeadAttention {
    /// The three steps of [`forward`](Self::forward), for mechanisms that change what happens
    /// between them (adaptive span). Step 1: project, rotate (RoPE), append to the cache. Keys
    /// sit from `mask.k_start` (plus whatever the cache has dropped from its front).
    pub fn project(
        &self,
        query: Tensor<3>,
        key_value: Option<Tensor<3>>,
        mask: &AttentionMask,
        cache: Option<&mut KvCache>,
    ) -> Projected {
        let [_, lq, _] = query.dims();
        // rotated q and k are no views of the product, and a product term (TUPE) off the packed
        // kernel goes to the separate one: packing would only cost its views' backward
        let changed = self.position.as_ref().is_some_and(|p| p.rotates() || p.has_position_products());
        let (packed, (q, k, v)) = match key_value {
            // the fused kernels read q, k, v in place from one product; other paths take one
            // product per part, whose backward is cheaper than views' (`self_attention`)
            None if cache.is_none() && !changed && kernel_takes(&self.dropout, &query) => {
                let (all, qkv) = self.qkv.self_attention_packed(query);
                (Some(all), qkv)
            }
            // q comes scaled: the scale on the smaller of its weight slice and its product
            // (`QkvProjection::scaled_queries`)
            source => {
                let (k, v) = self.qkv.keys_values(source.unwrap_or_else(|| query.clone()));
                (None, (self.qkv.scaled_queries(query, self.scale), k, v))
            }
        };
        let (cached, dropped) = cache.as_ref().map_or((0, 0), |c| (c.len(), c.start));
        let k_start = mask.k_start + dropped;
        let (q, k) = match &self.position {
            // new keys follow the cached ones
            Some(p) => (p.rotate(q, mask.q_start), p.rotate(k, k_start + cached)),
            None => (q, k),
        };
        let (k, v) = match cache {
            Some(c) => c.append(k, v),
            None => (k, v),
        };
        let layout = ScoreLayout::new(mask.q_start, k_start, lq, k.dims()[2], mask.causal);
        let q = if packed.is_some() {
            // q is a view of the packed projection, which a kernel scales as it reads
            Queries::OnUse { unscaled: q, scale: self.scale, scaled: Default::default() }
        } else {
            Queries::Scaled(q)
        };
        Projected { q, k, v, layout, max_back: mask.max_back, packed }
    }

    /// Step 2: scaled scores `[b, n_heads, len_q, len_k]` with the position scheme applied, not
    /// masked.
    pub fn scores(&self, p: &Projected) -> Tensor<4> {
        let [b, h, lq, dh] = p.q_dims();
        let hkv = p.k.dims()[1];
        let (g, lk) = (h / hkv, p.layout.len_k);
        // queries of a group stacked along the length: [b, hkv, g·lq, dh] @ [b, hkv, dh, lk]
        let q = if g == 1 { p.q() } else { p.q().reshape([b, hkv, g * lq, dh]) };
        let scores = q.matmul(p.k.clone().swap_dims(2, 3)).reshape([b, h, lq, lk]);
        match &self.position {
            Some(pos) => pos.scores(scores, p.q(), p.k.clone(), &p.layout, self.scale),
            None => scores,
        }
    }

    /// Step 2b: `scores` with the mask applied (`dense`, the model's precomputed mask, where it
    /// covers these keys; built from `mask` otherwise), ready for the softmax.
    pub fn mask_scores(
        &self,
        scores: Tensor<4>,
        mask: &AttentionMask,
        dense: Option<Tensor<4, Bool>>,
        p: &Projected,
    ) -> Tensor<4> {
        let (lq, lk) = (p.layout.len_q, p.layout.len_k);
        let hidden = match (dense, p.layout.k_start == mask.k_start) {
            (Some(m), true) => Some(m),
            _ => AttentionMask { k_start: p.layout.k_start, ..mask.clone() }.score_mask(lq, lk, &scores.device()),
        };
        match hidden {
            Some(m) => scores.mask_fill(m, MASKED_SCORE),
            None => scores,
        }
    }

    /// Step 2c: weights from masked scores `[b, n_heads, len_q, len_k]` (heads on axis 1, keys
    /// on axis 3), by the configured normaliser.
    pub fn normalise(&self, scores: Tensor<4>) -> Tensor<4> {
        self.normaliser.forward(scores)
    }

    /// The composed forward with `bias(&projected)` added to the scaled scores before the mask
    /// and the normaliser (a prior on the scores: the Gaussian prior, the task prior). `bias`
    /// broadcasts against `[b, n_heads, len_q, len_k]`.
    pub fn forward_with_score_bias(
        &self,
        input: AttentionInput,
        cache: Option<&mut KvCache>,
        bias: impl FnOnce(&Projected) -> Tensor<4>,
    ) -> AttentionOutput {
        let p = self.project(input.query, input.key_value, input.mask, cache);
        let scores = self.scores(&p) + bias(&p);
        let probs = self.normalise(self.mask_scores(scores, input.mask, input.dense_mask, &p));
        let weights = input.need_weights.then(|| probs.clone());
        let context = self.combine(self.dropout.forward(probs), &p);
        AttentionOutput { context, weights, aux_losses: Vec::new() }
    }

    /// Step 3: the output `[b, len_q, d_model]` from probabilities `[b, n_heads, len_q, len_k]`.
    pub fn combine(&self, probs: Tensor<4>, p: &Projected) -> Tensor<3> {
        variorum_kernels::linear::forward(&self.out, self.combine_heads(probs, p))
    }

    /// Step 3 without the output projection: the heads' contexts side by side,
    /// `[b, len_q, n_heads · d_h]`.
    pub fn combine_heads(&self, probs: Tensor<4>, p: &Projected) -> Tensor<3> {
        let [b, h, lq, lk] = probs.dims();
        let [_, hkv, _, dh] = p.v.dims();
        let g = h / hkv;
        let extra = self.position.as_ref().and_then(|pos| pos.context(probs.clone(), &p.layout));
        let probs = if g == 1 { probs } else { probs.reshape([b, hkv, g * lq, lk]) };
        let context = probs.matmul(p.v.clone()).reshape([b, h, lq, dh]);
        let context = match extra {
            Some(e) => context + e,
            None => context,
        };
        concat_heads(context)
    }

    /// The output projection of per-head contexts `[b, n_heads, len_q, d_h]`.
    pub fn merge(&self, context: Tensor<4>) -> Tensor<3> {
        variorum_kernels::linear::forward(&self.out, concat_heads(context))
    }
}

impl MultiHeadAttention {
    /// softmax(q kᵀ/√d) v with the output projection, queries from `query`, keys and values from
    /// `key_value`, no mask and no position scheme: content-based attention, as the Compressive
    /// Transformer's attention-reconstruction loss compares it over memories.
    pub fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.out.forward(self.content_only_heads(query, key_value))
    }

    /// [`content_only`](Self::content_only) before the output projection: the heads' contexts
    /// side by side, `[b, len_q, n_heads · d_h]`.
    pub fn content_only_heads(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        let [b, lq, _] = query.dims();
        let (h, hkv, dh) = (self.qkv.n_heads, self.qkv.n_kv_heads, self.qkv.head_dim);
        let (k, v) = self.qkv.keys_values(key_value);
        let q = self.qkv.scaled_queries(query, 1.0 / (dh as f64).sqrt());
        let (g, lk) = (h / hkv, k.dims()[2]);
        let q = q.reshape([b, hkv, g * lq, dh]);
        let probs = self.normalise(q.matmul(k.swap_dims(2, 3)).reshape([b, h, lq, lk]));
        concat_heads(probs.reshape([b, hkv, g * lq, lk]).matmul(v).reshape([b, h, lq, dh]))
    }
}

/// Key heads `[b, h_kv, …]` repeated for the query heads of their group: `[b, h, …]` (query
/// head i reads key head i / (h / h_kv), as in full attention).
pub fn per_query_head<const D: usize>(x: Tensor<D>, h: usize) -> Tensor<D> {
    let dims = x.dims();
    let hkv = dims[1];
    if hkv == h {
        return x;
    }
    // any rank: the axes after the heads flattened, each key head's block repeated
    let rest: usize = dims[2..].iter().product();
    let mut out = dims;
    out[1] = h;
    x.reshape([dims[0], hkv, 1, rest]).expand([dims[0], hkv, h / hkv, rest]).reshape(out)
}

/// Per-head contexts `[b, n_heads, len_q, d_h]` side by side, `[b, len_q, n_heads · d_h]`.
pub fn concat_heads(context: Tensor<4>) -> Tensor<3> {
    let [b, h, lq, dh] = context.dims();
    context.swap_dims(1, 2).reshape([b, lq, h * dh])
}
/// Whether `dropout` drops anything on `device`: what [`Dropout::forward`](burn::nn::Dropout)
/// checks — a probability above 0, an autodiff device and the training flag. Elsewhere (evaluation,
/// generation) a kind's kernel path, which has no dropout, computes the same thing.
pub fn drops(dropout: &burn::nn::Dropout, device: &Device) -> bool {
    dropout.prob > 0.0 && device.is_autodiff() && dropout.training.is_enabled()
}

/// Whether a kind's CPU kernel computes what its composed path would for `t`: the kernels are on
/// for its backend and `dropout` drops nothing (the kernels have no dropout).
pub fn kernel_takes<const D: usize>(dropout: &burn::nn::Dropout, t: &Tensor<D>) -> bool {
    variorum_kernels::has_kernel(t) && !drops(dropout, &t.device())
}
