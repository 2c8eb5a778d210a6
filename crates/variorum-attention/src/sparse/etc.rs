//! ETC's global–local attention (Ainslie et al. 2020), the `etc` kind. Two inputs share the
//! projections W_Q, W_K, W_V: the long input x^l (the sequence) and a global input x^g of
//! auxiliary tokens, one per segment of `segment` positions (the model puts them in front of
//! the long tokens; see `GlobalLocal`). Attention splits into four pieces:
//!
//! - l2l: a long token sees the long tokens within `window` of it (relative position applies
//!   here: any scheme, through the band's score layout);
//! - l2g: a long token sees the global tokens of the segments before its own (causal: a global
//!   token summarises its whole segment, so only completed segments; bidirectionally all);
//! - g2l: the global token of segment s sees the long tokens of segment s (ETC's hard g2l mask);
//! - g2g: global token s sees the global tokens up to s (bidirectionally all);
//!
//! l2l + l2g form one softmax per long query, g2g + g2l one per global query:
//! O(n_l·(w + n_g) + n_g·(n_g + S)) scores. By default the global pieces carry no position term
//! (the hard segment masks mark which segment a global token belongs to).
//!
//! `global_positions = k` adds ETC's relative positions to the global pieces (the paper's §3.2
//! uses Shaw et al.'s clipped labels on every piece; the labels below are those of the released
//! `etcmodel` code). A learned vector a_id ∈ ℝ^{d_h} per label, shared by the heads, adds
//! q_i·a_id/√d_h to the score (keys only, as Shaw et al.'s key term):
//! - g2g: the distance between the two segments, clipped: id = clip(j − i, −k, k) + k;
//! - l2g: whether the global token is the long query's own segment's (2k + 1) or another's
//!   (2k + 2) — causally only earlier segments are visible, so "another" alone;
//! - g2l: the own segment's long tokens (2k + 3; the hard mask shows no other).
//!
//! The l2l piece takes the model's relative scheme as before.
//!
//! Decoding keeps two caches: the long keys (the last max(window, segment) — what the next token
//! and the next global token can see) and every global token's keys. The model runs a segment's
//! global token through the layers once the segment is complete.

use burn::module::Param;
use burn::prelude::*;
use variorum_core::{AttentionMask, Capabilities, ConfigError, GlobalLocal, error::check};
use variorum_position::{PositionConfig, XlRelativeConfig};

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::band::Band;
use crate::engine::blocks::{band_context, dilated_band_scores};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::normaliser::MASKED_SCORE;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "etc"`.
    pub struct EtcConfig {
        /// w, long keys each long query sees back (its own included; as many ahead when
        /// bidirectional). Default 128.
        pub window: usize = 128,
        /// S, long positions per segment, each with one global token. Default 64.
        pub segment: usize = 64,
        /// Positions per block of the l2l band. Default min(window, 128).
        pub block: Option<usize> = None,
        /// k, the clipping distance of ETC's relative positions on the global pieces (g2g
        /// distances in segments; l2g and g2l own or other segment); unset (default) = none.
        pub global_positions: Option<usize> = None,
    }
}

impl EtcConfig {
    /// Positions per block of the l2l band: `block`, or min(window, 128).
    pub fn block(&self) -> usize {
        self.block.unwrap_or(self.window.min(128))
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
    ) -> EtcAttention {
        let head_dim = self.head_shape(d_model).head_dim;
        EtcAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            window: self.window,
            segment: self.segment,
            block: self.block(),
            global_relative: self.global_positions.map(|k| {
                burn::nn::Initializer::Normal { mean: 0.0, std: init_std }.init([2 * k + 4, head_dim], device)
            }),
            clip: self.global_positions.unwrap_or(0),
        }
    }
}

impl crate::AttentionConfig {
    /// The positions per global token of a config whose layers add a global input (ETC's
    /// `segment`); `None` for every other kind.
    pub fn global_segment(&self) -> Option<usize> {
        match self {
            Self::Etc(e) => Some(e.segment),
            _ => None,
        }
    }
}

impl AttentionKind for EtcConfig {
    type Module = EtcAttention;
    const SUMMARY: &'static str = "ETC global-local attention: one auxiliary global token per segment beside the sequence; l2l window (relative positions), l2g completed segments, g2l own segment, g2g";
    const PAPER: &'static str = "Ainslie et al. 2020, ETC: Encoding Long and Structured Inputs in Transformers";
    const CAPS: Capabilities = Capabilities { global_input: true, ..caps::SCORES };
    head_kind_items!();

    fn expanded(&self, d_model: usize) -> Self {
        Self { block: Some(self.block()), ..self.expanded_heads(d_model) }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.window >= 1 && self.segment >= 1 && self.block() >= 1, || {
            "model.attention.window, segment and block must be at least 1".into()
        })
    }

    /// Multiply–adds per long token: its window and the global tokens (one per segment).
    /// (The global pieces' relative labels add 2k + 4 products per query, left out.)
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let keys = self.window + len_k.div_ceil(self.segment.max(1));
        self.heads().flops_per_token(d_model, keys.min(len_k))
    }

    /// A global token per segment of 3 beside the sequence, a window of 2 (relative positions on
    /// the local part).
    fn test_variants() -> Vec<TestVariant<Self>> {
        [PositionConfig::default(), PositionConfig::TransformerXl(XlRelativeConfig::default())]
            .map(|p| {
                let cfg = Self { window: 2, segment: 3, block: Some(2), n_kv_heads: Some(2), ..Default::default() };
                TestVariant::new(format!("position {}", p.kind()), cfg).with_position(p)
            })
            .into_iter()
            .chain([TestVariant::new(
                "global relative positions",
                Self { window: 2, segment: 3, block: Some(2), global_positions: Some(1), ..Default::default() },
            )])
            .chain([TestVariant::new(
                "sparsemax",
                Self {
                    window: 2,
                    segment: 3,
                    block: Some(2),
                    normaliser: crate::engine::normaliser::Normaliser::Sparsemax,
                    ..Default::default()
                },
            )])
            .collect()
    }
}

/// An ETC global–local layer ([`EtcConfig`]): long tokens and one global token per segment.
#[derive(Module, Debug)]
pub struct EtcAttention {
    /// The multi-head attention whose projections the long and the global tokens share.
    pub attention: MultiHeadAttention,
    /// w, long keys each long query sees back (its own included; as many ahead when
    /// bidirectional).
    pub window: usize,
    /// S, long positions per segment, each with one global token.
    pub segment: usize,
    /// Positions per block of the l2l band.
    pub block: usize,
    /// a_id, `[2k + 4, d_h]`: the relative labels' key vectors of the global pieces (g2g
    /// distances, then l2g own, l2g other, g2l own); `None` without `global_positions`.
    pub global_relative: Option<Param<Tensor<2>>>,
    /// k, the clipping distance of the g2g labels.
    pub clip: usize,
}

/// Decoding state: the long tokens' cache and every global token's keys and values.
#[derive(Debug, Clone, Default)]
pub struct EtcState {
    /// The long tokens' keys and values: the last max(window, segment).
    pub long: KvCache,
    /// Every global token's keys and values.
    pub global: KvCache,
}

impl EtcAttention {
    /// The four pieces, `[b, len_q, d_model]`, for the tokens `mask.global_local` places: long
    /// ones (any global ones in front of them), or a completed segment's global token alone.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut EtcState>) -> AttentionOutput {
        let mask = input.mask;
        let mha = &self.attention;
        let output =
            |context: Tensor<4>| AttentionOutput { context: mha.merge(context), weights: None, aux_losses: Vec::new() };
        let (mut long_cache, mut global_cache) = match state {
            Some(s) => (Some(&mut s.long), Some(&mut s.global)),
            None => (None, None),
        };
        let context = match mask.global_local.unwrap_or(GlobalLocal::Prefixed { globals: 0 }) {
            GlobalLocal::Auxiliary { segment } => {
                let (qg, kg, vg) = self.globals(input.query, global_cache.as_deref_mut());
                let long = long_cache.as_deref().and_then(|c| c.get().map(|kv| (kv, c.start)));
                self.global_queries(qg, kg, vg, segment, long, mask.causal)
            }
            GlobalLocal::Prefixed { globals } => {
                let x = input.query;
                let [_, n, _] = x.dims();
                let xl = if globals == 0 { x.clone() } else { x.clone().narrow(1, globals, n - globals) };
                let p = mha.project(xl, None, mask, long_cache.as_deref_mut());
                // the global tokens of this call, after those of earlier calls
                let global = if globals > 0 {
                    Some(self.globals(x.narrow(1, 0, globals), global_cache.as_deref_mut()))
                } else {
                    global_cache.as_deref().and_then(KvCache::get).map(|(k, v)| (k.clone(), k, v))
                };
                let long = self.long_queries(&p, global.as_ref().map(|(_, k, v)| (k.clone(), v.clone())), mask);
                if let Some(c) = long_cache {
                    c.drop_front(c.len().saturating_sub(self.window.max(self.segment)));
                }
                match global {
                    Some((qg, kg, vg)) if globals > 0 => {
                        let first = kg.dims()[2] - globals;
                        let long_keys = ((p.k, p.v), p.layout.k_start);
                        let g = self.global_queries(qg, kg, vg, first, Some(long_keys), mask.causal);
                        Tensor::cat(vec![g, long], 2)
                    }
                    _ => long,
                }
            }
        };
        output(context)
    }

    /// Scaled queries, keys and values of global tokens `[b, h(_kv), n_g, d_h]` (no position:
    /// they are no positions of the sequence), the keys and values after every cached global.
    fn globals(&self, x: Tensor<3>, cache: Option<&mut KvCache>) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let mha = &self.attention;
        let (q, k, v) = mha.qkv.self_attention(x);
        let (k, v) = match cache {
            Some(c) => c.append(k, v),
            None => (k, v),
        };
        (q.mul_scalar(mha.scale), k, v)
    }

    /// q·a_id for every label, `[b, h, n, 2k + 4]`, of scaled queries `q` (`None` without
    /// global positions).
    fn label_scores(&self, q: &Tensor<4>) -> Option<Tensor<4>> {
        let a = self.global_relative.as_ref()?.val();
        Some(q.clone().matmul(a.transpose().unsqueeze::<4>()))
    }

    /// `scores` `[b, h, n, m]` plus q·a_id with the label `ids[i][j]` of each query and key.
    fn add_labels(scores: Tensor<4>, labels: Tensor<4>, ids: Vec<i64>) -> Tensor<4> {
        let [b, h, n, m] = scores.dims();
        let index = Tensor::<2, Int>::from_data(TensorData::new(ids, [n, m]), &scores.device());
        scores + labels.gather(3, index.unsqueeze::<4>().expand([b, h, n, m]))
    }

    /// Keys and values with one copy per query head.
    fn per_head(&self, x: Tensor<4>, heads: usize) -> Tensor<4> {
        let [b, hkv, n, d] = x.dims();
        if hkv == heads {
            x
        } else {
            x.unsqueeze_dim::<5>(2).expand([b, hkv, heads / hkv, n, d]).reshape([b, heads, n, d])
        }
    }

    /// l2l + l2g for the long queries of `p`, `[b, h, len, d_h]`.
    fn long_queries(
        &self,
        p: &crate::engine::heads::Projected,
        global: Option<(Tensor<4>, Tensor<4>)>,
        mask: &AttentionMask,
    ) -> Tensor<4> {
        let mha = &self.attention;
        let [b, h, l, _] = p.q_dims();
        let device = p.device();
        let causal = mask.causal;
        let s = self.segment;
        let q0 = p.layout.q_start;
        // l2g: completed segments before the query's own (causal), all (bidirectional)
        let global = global.map(|(kg, vg)| {
            let (kg, vg) = (self.per_head(kg, h), self.per_head(vg, h));
            let g = kg.dims()[2];
            let hidden: Vec<bool> = (0..l).flat_map(|i| (0..g).map(move |j| causal && (j + 1) * s > q0 + i)).collect();
            let hidden = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [l, g]), &device).unsqueeze::<4>();
            let mut scores = p.q().matmul(kg.swap_dims(2, 3));
            if let Some(labels) = self.label_scores(&p.q()) {
                // own segment's global token, or another's
                let k = self.clip as i64;
                let ids =
                    (0..l).flat_map(|i| (0..g).map(move |j| if j == (q0 + i) / s { 2 * k + 1 } else { 2 * k + 2 }));
                scores = Self::add_labels(scores, labels, ids.collect());
            }
            let scores = scores.mask_fill(hidden.expand([b, h, l, g]), MASKED_SCORE);
            (scores, vg)
        });
        // one softmax over [local scores | l2g], then the local context from its part
        let joint = |local: Tensor<4>| match &global {
            Some((scores, vg)) => {
                let w = local.dims()[3];
                let probs = mha.dropout.forward(mha.normalise(Tensor::cat(vec![local, scores.clone()], 3)));
                let g = scores.dims()[3];
                (probs.clone().narrow(3, 0, w), Some(probs.narrow(3, w, g).matmul(vg.clone())))
            }
            None => (mha.dropout.forward(mha.normalise(local)), None),
        };
        let aligned = p.layout.q_start == p.layout.k_start && p.layout.len_q == p.layout.len_k;
        let ahead = if causal { 0 } else { self.window - 1 };
        let band = Band { back: self.window - 1, ahead, block: self.block, query_blocks: false, causal };
        let (local, from_globals) = if aligned {
            // l2l by blocks, any relative scheme
            let bs = dilated_band_scores(mha, p, &[band], 1, &[]);
            let (probs, from_globals) = joint(bs.to_rows(bs.scores.clone(), l));
            let context = band_context(mha, bs.from_rows(probs), bs.v.clone(), &bs.layout, bs.dims);
            (bs.to_rows(context, l), from_globals)
        } else {
            // decoding: the cached long keys under the window and causality
            let lk = p.layout.len_k;
            let k0 = p.layout.k_start as i64;
            let hidden: Vec<bool> = (0..l as i64)
                .flat_map(|i| (0..lk as i64).map(move |j| q0 as i64 + i - (k0 + j)))
                .map(|d| !band.sees(d, 0))
                .collect();
            let far = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [l, lk]), &device).unsqueeze::<4>();
            let (probs, from_globals) = joint(mha.scores(p).mask_fill(far.expand([b, h, l, lk]), MASKED_SCORE));
            let mut context = probs.clone().matmul(self.per_head(p.v.clone(), h));
            if let Some(extra) = mha.position.as_ref().and_then(|pos| pos.context(probs, &p.layout)) {
                context = context + extra;
            }
            (context, from_globals)
        };
        match from_globals {
            Some(g) => local + g,
            None => local,
        }
    }

    /// g2g + g2l for global queries `qg: [b, h, n, d_h]` of segments `first..first + n`, over the
    /// global keys `kg` (every global up to the last query's) and the long keys and values
    /// `long`, the first of them at position `start`.
    fn global_queries(
        &self,
        qg: Tensor<4>,
        kg: Tensor<4>,
        vg: Tensor<4>,
        first: usize,
        long: Option<((Tensor<4>, Tensor<4>), usize)>,
        causal: bool,
    ) -> Tensor<4> {
        let mha = &self.attention;
        let [b, h, n, dh] = qg.dims();
        let device = qg.device();
        let (kg, vg) = (self.per_head(kg, h), self.per_head(vg, h));
        let g = kg.dims()[2];
        let s = self.segment;
        let hidden: Vec<bool> = (0..n).flat_map(|i| (0..g).map(move |j| causal && j > first + i)).collect();
        let labels = self.label_scores(&qg);
        let mut g2g = qg.clone().matmul(kg.swap_dims(2, 3));
        if let Some(labels) = &labels {
            // the distance between the two segments, clipped
            let k = self.clip as i64;
            let ids = (0..n).flat_map(|i| (0..g).map(move |j| (j as i64 - (first + i) as i64).clamp(-k, k) + k));
            g2g = Self::add_labels(g2g, labels.clone(), ids.collect());
        }
        let g2g = g2g.mask_fill(
            Tensor::<2, Bool>::from_data(TensorData::new(hidden, [n, g]), &device)
                .unsqueeze::<4>()
                .expand([b, h, n, g]),
            MASKED_SCORE,
        );
        let Some(((kl, vl), start)) = long else {
            return mha.dropout.forward(mha.normalise(g2g)).matmul(vg);
        };
        // g2l: global token of segment t sees the long keys of segment t, gathered per segment
        let (kl, vl) = (self.per_head(kl, h), self.per_head(vl, h));
        let len = kl.dims()[2];
        let segments = |x: Tensor<4>| {
            let rows: Vec<Tensor<4>> = (first..first + n)
                .map(|t| {
                    // the segment's keys where the cache still has them, zeros (hidden) elsewhere
                    let (from, to) = ((t * s).max(start), ((t + 1) * s).min(start + len));
                    let zeros = |n: usize| Tensor::<4>::zeros([b, h, n, dh], &device);
                    if to <= from {
                        return zeros(s);
                    }
                    let part = x.clone().narrow(2, from - start, to - from);
                    let (before, after) = (from - t * s, (t + 1) * s - to);
                    let mut pieces = Vec::new();
                    if before > 0 {
                        pieces.push(zeros(before));
                    }
                    pieces.push(part);
                    if after > 0 {
                        pieces.push(zeros(after));
                    }
                    Tensor::cat(pieces, 2)
                })
                .collect();
            Tensor::stack::<5>(rows, 2) // [b, h, n, S, d]
        };
        let (ks, vs) = (segments(kl), segments(vl));
        let mut g2l = qg.unsqueeze_dim::<5>(3).matmul(ks.clone().swap_dims(3, 4)).reshape([b, h, n, s]);
        if let Some(labels) = labels {
            // every key of the own segment: one label
            let own = 2 * self.clip + 3;
            g2l = g2l + labels.narrow(3, own, 1);
        }
        let hidden: Vec<bool> = (first..first + n)
            .flat_map(|t| (0..s).map(move |j| t * s + j))
            .map(|at| at < start || at >= start + len)
            .collect();
        let g2l = g2l.mask_fill(
            Tensor::<2, Bool>::from_data(TensorData::new(hidden, [n, s]), &device)
                .unsqueeze::<4>()
                .expand([b, h, n, s]),
            MASKED_SCORE,
        );
        let probs = mha.dropout.forward(mha.normalise(Tensor::cat(vec![g2g, g2l], 3)));
        let to_segments = probs.clone().narrow(3, g, s).unsqueeze_dim::<5>(3).matmul(vs).reshape([b, h, n, dh]);
        probs.narrow(3, 0, g).matmul(vg) + to_segments
    }
}

impl AttentionMechanism for EtcAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        EtcAttention::forward(self, input, state.map(|s| s.get_or_default::<EtcState>()))
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }

    fn global_segment(&self) -> Option<usize> {
        Some(self.segment)
    }
}
