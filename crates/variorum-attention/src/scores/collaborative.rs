//! Collaborative multi-head attention, the `collaborative` kind (Cordonnier, Loukas, Jaggi 2020,
//! Multi-Head Attention: Collaborate Instead of Concatenate): the heads share one query and one
//! key projection of width D̃ and differ by a mixing vector m_h ∈ ℝ^D̃ that re-weights its
//! dimensions:
//!
//! scores_h = X W̃_Q diag(m_h) W̃_Kᵀ Xᵀ / √d_h,   head_h = softmax(scores_h + M) X W_V^h,
//! output = [head_1; …; head_H] W_O,
//!
//! with W̃_Q, W̃_K ∈ ℝ^{d×D̃} and values and output as in full attention. Concatenated heads are the
//! case D̃ = H·d_h with m_h the indicator of head h's block of columns; a smaller D̃ (`shared_dim`)
//! shrinks the query/key projections (the paper's compression: their headline is a 4× smaller
//! query/key width for the same accuracy).
//!
//! Computed as the paper's code does: q̃ = X W̃_Q and k̃ = X W̃_K are one GEMM for the whole layer
//! (fused with the values); the queries of head h are q̃ ⊙ m_h (`[b, 1, L, D̃] · [1, H, 1, D̃]`),
//! and the heads' queries, stacked along the length, meet the shared keys in one batched GEMM:
//! one `[L, L]` score matrix per head, as in full attention.
//!
//! Choices where the paper leaves one open:
//! - Scale 1/√d_h with d_h the per-head (value) size `head_dim`, whatever D̃: the authors' NMT
//!   code divides by √(d_model/H) independently of the key/query width, so a compressed layer
//!   keeps the score scale of the heads it stands for (their BERT re-parameterisation code
//!   divides by √(D̃/H) instead, which is the same only when D̃ = H·d_h, and would rescale a
//!   compressed re-parameterisation's scores). A relative scheme's `content_scale` multiplies it,
//!   as in `full`.
//! - Initialisation: W̃_Q, W̃_K and W_V ~ N(0, init_std²) and W_O ~ N(0, out_std²) like the other
//!   kinds; the mixing vectors Xavier-uniform over the `[H, D̃]` matrix, U(±√(6/(H + D̃))), as in
//!   the authors' NMT code (their from-scratch experiments).
//! - Biases (`bias = true`): the shared projections carry one of width D̃ each, as in the NMT
//!   code; the values and the output theirs, as in full attention.
//! - Positions: only relative schemes that act on the scores through the query–key distance
//!   alone (ALiBi, T5), added to each head's scores with their absolute positions. RoPE is
//!   refused (`qk_rotation: false`): rotating q̃ ⊙ m_h and k̃ in pairs of dimensions commutes with
//!   the mixing only where m_h is constant on every rotated pair, which a learned m_h is not.
//!   Schemes that read per-head queries or keys of width d_h (Transformer-XL, Shaw, DeBERTa, DA,
//!   multiplicative, TUPE) do not fit tensors of width D̃ shared by the heads; the capabilities
//!   declare `gathers_keys: true`, the flag by which the configuration rules admit only
//!   distance-only score schemes — the keys are not gathered, every key is scored at its position.
//! - Decoding: a [`KvCache`] holding the shared keys `[b, 1, L, D̃]` (one key "head" for all
//!   query heads) and the values `[b, H, L, d_h]`; nothing else is carried.
//! - The fused causal kernel needs queries and values of one width, so this kind always takes
//!   the composed path (scores, mask, softmax, weighted values).
//!
//! A trained full-attention layer becomes this form with [`CollaborativeAttention::from_heads`]
//! (the paper's re-parameterisation of pre-trained heads): exactly when D̃ = H·d_h, by a rank-D̃
//! CP decomposition of the stacked per-head products W_Q^h W_K^hᵀ when D̃ is smaller.

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear};
use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_position::{PositionConfig, RelativePosition, ScoreLayout, T5BiasConfig};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::engine::config::MultiHeadAttentionConfig;
use crate::engine::heads::MultiHeadAttention;
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::normaliser::ScoreNormaliser;
use crate::engine::projections;
use crate::engine::qkv::normal_linear;
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "collaborative"`.
    pub struct CollaborativeConfig [n_heads, head_dim, dropout, bias, normaliser] {
        /// D̃, the width of the query and key projections shared by every head. Default
        /// `n_heads · head_dim` (as many dimensions as concatenated heads); smaller compresses
        /// them (the paper's headline: a quarter of the width for the same accuracy).
        pub shared_dim: Option<usize> = None,
    }
}

impl CollaborativeConfig {
    /// D̃, the shared query/key width.
    pub fn shared(&self, d_model: usize) -> usize {
        let h = self.head_shape(d_model);
        self.shared_dim.unwrap_or(h.n_heads * h.head_dim)
    }

    /// The layer for `d_model`: the shared projections and W_V ~ N(0, init_std²),
    /// W_O ~ N(0, out_std²), the mixing vectors Xavier-uniform. Panics on a position scheme
    /// other than a distance-only score bias (ALiBi, T5), which configs refuse.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> CollaborativeAttention {
        let heads = self.head_shape(d_model);
        let (h, dh, s) = (heads.n_heads, heads.head_dim, self.shared(d_model));
        let relative = position.config.init_relative(heads, position.context, device);
        if let Some(p) = &relative {
            assert!(
                fits(p),
                "model.position.kind = \"{}\" does not act on collaborative heads (configs refuse it): use alibi, t5, an absolute kind or none",
                position.config.kind()
            );
        }
        let bound = (6.0 / (h + s) as f64).sqrt();
        CollaborativeAttention {
            qkv: normal_linear(d_model, 2 * s + h * dh, self.bias, init_std, device),
            mixing: Initializer::Uniform { min: -bound, max: bound }.init([h, s], device),
            out: normal_linear(h * dh, d_model, self.bias, out_std, device),
            position: relative,
            dropout: DropoutConfig::new(self.dropout).init(),
            normaliser: self.normaliser.init(h, self.head_temperature, position.context, device),
            n_heads: h,
            head_dim: dh,
            shared_dim: s,
            scale: position.config.content_scale() / (dh as f64).sqrt(),
        }
    }
}

impl CollaborativeConfig {
    /// Full attention's settings as collaborative heads of width `shared_dim`: the same heads,
    /// head size, dropout, bias and normaliser (the table [`CollaborativeAttention::from_heads`]
    /// builds its layer for), and a line for each setting of `full` this form does not carry
    /// (said, not refused).
    pub fn from_full(full: &MultiHeadAttentionConfig, d_model: usize, shared_dim: usize) -> (Self, Vec<String>) {
        let config = Self {
            n_heads: full.n_heads,
            head_dim: Some(full.head_dim(d_model)),
            dropout: full.dropout,
            bias: full.bias,
            normaliser: full.normaliser,
            head_temperature: full.head_temperature,
            shared_dim: Some(shared_dim),
        };
        let mut dropped = Vec::new();
        if full.diversity.is_some() || full.guidance.is_some() {
            dropped.push(
                "model.attention.diversity / guidance (training losses on full heads) are dropped: collaborative heads take none"
                    .to_string(),
            );
        }
        if full.kv_heads() < full.n_heads {
            dropped.push(format!(
                "the {} key/value heads are repeated for the {} query heads: collaborative heads have one value head per query head (more value parameters, a larger KV cache)",
                full.kv_heads(),
                full.n_heads
            ));
        }
        (config, dropped)
    }
}

/// Whether a relative scheme acts on collaborative heads: through the distance alone, on the
/// scores (not by rotating q and k).
fn fits(p: &RelativePosition) -> bool {
    p.works_on_gathered_keys() && !matches!(p, RelativePosition::Rope(_))
}

impl AttentionKind for CollaborativeConfig {
    type Module = CollaborativeAttention;
    const SUMMARY: &'static str = "collaborative heads: one query/key projection of width D̃ shared by every head, re-weighted per head by a learned mixing vector (D̃ < heads·head_dim compresses it); values and output as in full attention; KV cache of the shared keys";
    const PAPER: &'static str =
        "Cordonnier, Loukas, Jaggi 2020, Multi-Head Attention: Collaborate Instead of Concatenate";
    // a score matrix per head, but no per-head q/k of width d_h: distance-only score schemes
    // (ALiBi, T5) and no rotation (see the module doc on `gathers_keys`)
    const CAPS: Capabilities = Capabilities { qk_rotation: false, gathers_keys: true, ..caps::CROSS_SCORES };

    fn expanded(&self, d_model: usize) -> Self {
        Self { shared_dim: Some(self.shared(d_model)), ..self.expanded_heads(d_model) }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        crate::kind::check_dropout(self.dropout)?;
        let h = self.head_shape(d_model);
        let width = h.n_heads * h.head_dim;
        check(self.shared_dim.is_none_or(|s| (1..=width).contains(&s)), || {
            format!(
                "model.attention.shared_dim = {} must be in 1..={width} (n_heads · head_dim = {} · {}: as wide as concatenated heads, or narrower to compress them)",
                self.shared_dim.unwrap_or(0),
                h.n_heads,
                h.head_dim
            )
        })
    }

    head_settings_hooks!();

    /// The projections (q̃, k̃ of width D̃, the values) and the output, the mixing (H·D̃ products),
    /// then per head q̃_h·k̃ over D̃ and the weighted values over d_h, for `len_k` keys.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let heads = self.head_shape(d_model);
        let (d, h, dh) = (d_model as u64, heads.n_heads as u64, heads.head_dim as u64);
        let s = self.shared(d_model) as u64;
        2 * (d * (2 * s + h * dh) + h * dh * d) + h * s + 2 * h * (s + dh) * len_k as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn build(&self, init: &LayerInit, device: &Device) -> CollaborativeAttention {
        self.init(init.d_model, init.init_std, init.out_std, init.position, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("", Self::default()),
            TestVariant::new("shared_dim 8 (4× compressed)", Self { shared_dim: Some(8), ..Self::default() }),
            TestVariant::new(
                "sparsemax + head temperature",
                Self {
                    normaliser: crate::engine::normaliser::Normaliser::Sparsemax,
                    head_temperature: true,
                    ..Self::default()
                },
            ),
            TestVariant::new(
                "2 heads of 12, shared_dim 6, no bias",
                Self { n_heads: 2, head_dim: Some(12), shared_dim: Some(6), bias: false, ..Self::default() },
            )
            .masked(),
            TestVariant::new("shared_dim 16 + position alibi", Self { shared_dim: Some(16), ..Self::default() })
                .with_position(PositionConfig::Alibi(Default::default())),
            TestVariant::new("position t5", Self::default()).with_position(PositionConfig::T5(T5BiasConfig {
                num_buckets: 8,
                max_distance: 10,
                shared: false,
            })),
        ]
    }
}

/// Collaborative heads: one query/key projection of width D̃ shared by every head, re-weighted per
/// head by its mixing vector m_h; values and output as in full attention.
#[derive(Module, Debug)]
pub struct CollaborativeAttention {
    /// `[W̃_Q | W̃_K | W_V]`, `[d_model, 2·D̃ + H·d_h]`: one GEMM for self-attention. W_V's columns
    /// are head by head, as in `full`.
    pub qkv: Linear,
    /// The mixing vectors m_h, one row per head, `[H, D̃]`.
    pub mixing: Param<Tensor<2>>,
    /// W_O, `[H·d_h, d_model]`.
    pub out: Linear,
    /// A distance-only score scheme (ALiBi, T5), if the layer has one.
    pub position: Option<RelativePosition>,
    /// Dropout on the attention probabilities.
    pub dropout: Dropout,
    /// Scores to weights (softmax unless the config says otherwise).
    pub normaliser: ScoreNormaliser,
    /// H, query heads.
    pub n_heads: usize,
    /// d_h, the size of each head's values.
    pub head_dim: usize,
    /// D̃.
    pub shared_dim: usize,
    /// 1/√d_h (times the position scheme's content scale).
    pub scale: f64,
}

impl CollaborativeAttention {
    /// q̃ `[b, len, D̃]`, k̃ `[b, len, D̃]` and the values `[b, len, H·d_h]` of self-attention, from
    /// one GEMM.
    fn self_projections(&self, x: Tensor<3>) -> (Tensor<3>, Tensor<3>, Tensor<3>) {
        let s = self.shared_dim;
        let all = variorum_kernels::linear::forward(&self.qkv, x);
        let width = all.dims()[2];
        (all.clone().narrow(2, 0, s), all.clone().narrow(2, s, s), all.narrow(2, 2 * s, width - 2 * s))
    }

    /// q̃ `[b, len, D̃]` alone (keys and values from elsewhere).
    fn queries(&self, x: Tensor<3>) -> Tensor<3> {
        let s = self.shared_dim;
        let w = self.qkv.weight.val();
        let d = w.dims()[0];
        let q = x.matmul(w.slice([0..d, 0..s]).unsqueeze_dim(0));
        match &self.qkv.bias {
            Some(b) => q + b.val().slice([0..s]).reshape([1, 1, s]),
            None => q,
        }
    }

    /// k̃ `[b, len, D̃]` and the values `[b, len, H·d_h]` of `source`, without the queries.
    fn keys_values(&self, source: Tensor<3>) -> (Tensor<3>, Tensor<3>) {
        let s = self.shared_dim;
        let w = self.qkv.weight.val();
        let [d, width] = w.dims();
        let kv = source.matmul(w.slice([0..d, s..width]).unsqueeze_dim(0));
        let kv = match &self.qkv.bias {
            Some(b) => kv + b.val().slice([s..width]).reshape([1, 1, width - s]),
            None => kv,
        };
        (kv.clone().narrow(2, 0, s), kv.narrow(2, s, width - 2 * s))
    }

    /// The shared keys as one key head `[b, 1, len, D̃]`, the values as heads `[b, H, len, d_h]`.
    fn as_heads(&self, k: Tensor<3>, v: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let [b, l, s] = k.dims();
        let k = k.reshape([b, 1, l, s]);
        let v = v.reshape([b, l, self.n_heads, self.head_dim]).swap_dims(1, 2);
        (k, v)
    }

    /// Scores, position scheme (`with_position`), mask (`hidden`, true = hidden), softmax and the
    /// heads' weighted values through W_O, for queries q̃ `[b, len_q, D̃]`, shared keys
    /// `[b, 1, len_k, D̃]` and values `[b, H, len_k, d_h]`. Returns the output `[b, len_q, d_model]`
    /// and the weights `[b, H, len_q, len_k]` (before dropout).
    fn attend(
        &self,
        q: Tensor<3>,
        k: Tensor<4>,
        v: Tensor<4>,
        layout: &ScoreLayout,
        hidden: Option<Tensor<4, Bool>>,
        with_position: bool,
    ) -> (Tensor<3>, Tensor<4>) {
        let [b, lq, s] = q.dims();
        let lk = k.dims()[2];
        let (h, dh) = (self.n_heads, self.head_dim);
        // every head's queries q̃ ⊙ m_h, scaled: [b, 1, lq, D̃] · [1, H, 1, D̃] → [b, H, lq, D̃]
        let mixing = self.mixing.val().mul_scalar(self.scale).reshape([1, h, 1, s]);
        let q = q.reshape([b, 1, lq, s]) * mixing;
        // one GEMM for all heads: their queries stacked along the length against the shared keys
        let keys_t = k.clone().reshape([b, lk, s]).swap_dims(1, 2);
        let scores = q.clone().reshape([b, h * lq, s]).matmul(keys_t).reshape([b, h, lq, lk]);
        let scores = match (&self.position, with_position) {
            // distance-only schemes: the queries and keys they are handed go unread
            (Some(pos), true) => pos.scores(scores, q, k, layout, self.scale),
            _ => scores,
        };
        let scores = match hidden {
            Some(m) => scores.mask_fill(m, MASKED_SCORE),
            None => scores,
        };
        let probs = self.normaliser.forward(scores);
        let context = self.dropout.forward(probs.clone()).matmul(v);
        let context = context.swap_dims(1, 2).reshape([b, lq, h * dh]);
        (variorum_kernels::linear::forward(&self.out, context), probs)
    }

    /// The layer over `input`, its shared keys and values after `cache`'s (whose front is dropped
    /// past `max_back`); weights `[b, H, len_q, len_k]` when asked for.
    pub fn forward(&self, input: AttentionInput, mut cache: Option<&mut KvCache>) -> AttentionOutput {
        let mask = input.mask;
        let (q, k, v) = match input.key_value {
            None => self.self_projections(input.query),
            Some(source) => {
                let (k, v) = self.keys_values(source);
                (self.queries(input.query), k, v)
            }
        };
        let (k, v) = self.as_heads(k, v);
        // keys sit from mask.k_start, plus whatever the cache has dropped from its front
        let k_start = mask.k_start + cache.as_ref().map_or(0, |c| c.start);
        let (k, v) = match cache.as_deref_mut() {
            Some(c) => c.append(k, v),
            None => (k, v),
        };
        if let (Some(n), Some(c)) = (mask.max_back, cache) {
            // at most n back: the keys before that never matter again
            c.drop_front(c.len().saturating_sub(n));
        }
        let (lq, lk) = (q.dims()[1], k.dims()[2]);
        let layout = ScoreLayout::new(mask.q_start, k_start, lq, lk, mask.causal);
        let hidden = match (input.dense_mask, k_start == mask.k_start) {
            (Some(m), true) => Some(m),
            _ => AttentionMask { k_start, ..mask.clone() }.score_mask(lq, lk, &q.device()),
        };
        let (context, probs) = self.attend(q, k, v, &layout, hidden, true);
        AttentionOutput { context, weights: input.need_weights.then_some(probs), aux_losses: Vec::new() }
    }

    /// Content-based attention of `query` over `key_value`: no mask, no position scheme.
    pub fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        let q = self.queries(query);
        let (k, v) = self.keys_values(key_value);
        let (k, v) = self.as_heads(k, v);
        let layout = ScoreLayout::new(0, 0, q.dims()[1], k.dims()[2], false);
        self.attend(q, k, v, &layout, None, false).0
    }
}

impl AttentionMechanism for CollaborativeAttention {
    /// Decoding state: a [`KvCache`] of the shared keys `[b, 1, L, D̃]` and the values.
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        CollaborativeAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    fn extend_cache(&self, x: Tensor<3>, _mask: &AttentionMask, state: &mut AttentionState) {
        let (k, v) = self.keys_values(x);
        let (k, v) = self.as_heads(k, v);
        state.kv_mut().append(k, v);
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        CollaborativeAttention::content_only(self, query, key_value)
    }

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

// ---------------------------------------------------------------------------------------------
// Re-parameterisation of a trained full-attention layer
// ---------------------------------------------------------------------------------------------

/// Sweeps of the alternating least squares (each updates W̃_Q, W̃_K and the mixing once).
const ALS_SWEEPS: usize = 100;
/// Subspace iterations of the initial guess.
const SUBSPACE_ITERATIONS: usize = 8;
/// Seed of the initial guess's draw (the decomposition is deterministic).
const ALS_SEED: u64 = 0xC011_AB0A;

impl CollaborativeAttention {
    /// The collaborative form of a trained full-attention layer, and the relative error
    /// ‖T − T̂‖_F / ‖T‖_F of its query–key products (0 when exact), where T stacks the heads'
    /// W_Q^h W_K^hᵀ (a d × H × d tensor) and T̂ = (W̃_Q diag(m_h) W̃_Kᵀ)_h. The values, W_O, the
    /// relative position scheme (ALiBi or T5 only), the dropout and the score scale are the
    /// layer's own; grouped-query K/V heads are repeated for the query heads they serve.
    ///
    /// - `shared_dim = n_heads · head_dim`: exact. W̃_Q = [W_Q^1 … W_Q^H], W̃_K = [W_K^1 … W_K^H]
    ///   with their biases concatenated, m_h the indicator of head h's block of columns: the same
    ///   outputs, to rounding.
    /// - smaller: a rank-D̃ CP decomposition T_h ≈ W̃_Q diag(m_h) W̃_Kᵀ, as the paper's authors
    ///   do with tensorly's `parafac`; here alternating least squares (100 sweeps, deterministic)
    ///   from the dominant D̃-dimensional column spaces of the query and key sides, with Bro's
    ///   extrapolation between sweeps, each column finally scaled so that its largest mixing
    ///   coefficient is ±1 and W̃_Q, W̃_K have equal column norms. Biases: the key bias only adds a
    ///   constant to each query's row of scores, which the softmax ignores, so it is dropped
    ///   (zero); the query bias b_Q^h adds the key-side term x_j · W_K^h b_Q^h, which the shared
    ///   query bias b̃ reproduces as x_j · W̃_K (m_h ⊙ b̃): b̃ is its least-squares fit over the
    ///   heads (exact when the heads' biases share the decomposition's structure). The returned
    ///   error is that of the weights; the bias fit is not in it.
    ///
    /// Refused, in one line: a `shared_dim` outside `1..=n_heads · head_dim`, a layer whose
    /// position scheme does not act on collaborative heads (RoPE, Transformer-XL, …: only
    /// distance-only score biases do), and a compressed width for a layer with biases whose
    /// normaliser reads each score alone (ReLU, sigmoid): dropping the key bias is a row shift
    /// only softmax, sparsemax and entmax ignore ([`RowNormaliser::ignores_row_shifts`]).
    ///
    /// [`RowNormaliser::ignores_row_shifts`]: variorum_kernels::normalisers::RowNormaliser::ignores_row_shifts
    pub fn from_heads(
        full: &MultiHeadAttention,
        shared_dim: usize,
        device: &Device,
    ) -> Result<(CollaborativeAttention, f64), String> {
        let qkv = &full.qkv;
        let (h, hkv, dh) = (qkv.n_heads, qkv.n_kv_heads, qkv.head_dim);
        let width = h * dh;
        let kv_width = hkv * dh;
        if !(1..=width).contains(&shared_dim) {
            return Err(format!("shared_dim = {shared_dim} must be in 1..={width} (n_heads · head_dim)"));
        }
        if let Some(p) = &full.position
            && !fits(p)
        {
            return Err(
                "its relative position scheme does not act on collaborative heads: only distance-only score schemes (alibi, t5) or absolute positions do"
                    .to_string(),
            );
        }
        if shared_dim < width && qkv.qkv.bias.is_some() && !full.normaliser.row.ignores_row_shifts() {
            return Err(format!(
                "shared_dim = {shared_dim} compresses the heads, which drops the key bias: a constant on each row of scores, which softmax, sparsemax and entmax ignore but this layer's {:?} normaliser does not; convert at the full width {width} (exact)",
                full.normaliser.row
            ));
        }
        let w = qkv.qkv.weight.val();
        let d = w.dims()[0];
        let dev = w.device();
        // query head i reads key/value head i / group
        let group = h / hkv;
        let kv_of: Vec<i64> = (0..h).map(|i| (i / group) as i64).collect();
        let kv_of = Tensor::<1, Int>::from_data(TensorData::new(kv_of, [h]), &dev);
        // per head, [H, d, d_h]; the fused columns are [q heads | k heads | v heads]
        let wq = w.clone().narrow(1, 0, width).reshape([d, h, dh]).swap_dims(0, 1);
        let wk = w.clone().narrow(1, width, kv_width).reshape([d, hkv, dh]).select(1, kv_of.clone()).swap_dims(0, 1);
        let wv =
            w.narrow(1, width + kv_width, kv_width).reshape([d, hkv, dh]).select(1, kv_of.clone()).reshape([d, width]);
        let bias = qkv.qkv.bias.as_ref().map(|b| b.val());
        let per_query_head = |b: Tensor<1>| b.reshape([hkv, dh]).select(0, kv_of.clone()).reshape([width]);
        let bq = bias.clone().map(|b| b.narrow(0, 0, width));
        let bk = bias.clone().map(|b| per_query_head(b.narrow(0, width, kv_width)));
        let bv = bias.map(|b| per_query_head(b.narrow(0, width + kv_width, kv_width)));

        let (shared_q, shared_k, mixing, shared_bq, shared_bk, error) = if shared_dim == width {
            let concat = |t: Tensor<3>| t.swap_dims(0, 1).reshape([d, width]);
            let blocks: Vec<f32> =
                (0..h).flat_map(|i| (0..width).map(move |c| if c / dh == i { 1.0 } else { 0.0 })).collect();
            let mixing = Tensor::<2>::from_data(TensorData::new(blocks, [h, width]), &dev);
            (concat(wq), concat(wk), mixing, bq, bk, 0.0)
        } else {
            let cp = cp_als(&wq, &wk, shared_dim);
            let shared_bq = bq.map(|bq| content_bias(&wk, &cp, bq));
            let shared_bk = shared_bq.as_ref().map(|_| Tensor::<1>::zeros([shared_dim], &dev));
            (cp.a, cp.b, cp.m, shared_bq, shared_bk, cp.error)
        };
        let bias = match (shared_bq, shared_bk, bv) {
            (Some(q), Some(k), Some(v)) => Some(Param::from_tensor(Tensor::cat(vec![q, k, v], 0))),
            _ => None,
        };
        let copy = |l: &Linear| Linear {
            weight: Param::from_tensor(l.weight.val()),
            bias: l.bias.as_ref().map(|b| Param::from_tensor(b.val())),
        };
        let attention = CollaborativeAttention {
            qkv: Linear { weight: Param::from_tensor(Tensor::cat(vec![shared_q, shared_k, wv], 1)), bias },
            mixing: Param::from_tensor(mixing),
            out: copy(&full.out),
            position: full.position.clone(),
            dropout: full.dropout.clone(),
            normaliser: full.normaliser.clone(),
            n_heads: h,
            head_dim: dh,
            shared_dim,
            scale: full.scale,
        };
        Ok((attention.to_device(device), error))
    }
}

/// A rank-R CP decomposition T_h ≈ A diag(m_h) Bᵀ of the heads' products T_h = W_Q^h W_K^hᵀ.
struct Cp {
    /// W̃_Q, `[d, R]`.
    a: Tensor<2>,
    /// W̃_K, `[d, R]`.
    b: Tensor<2>,
    /// The mixing vectors, `[H, R]`.
    m: Tensor<2>,
    /// ‖T − T̂‖_F / ‖T‖_F.
    error: f64,
}

/// Alternating least squares on the stacked products of `wq`, `wk` (`[H, d, d_h]`), never
/// forming T inside the sweeps: every product with T_h goes through its factors,
/// T_h Y = W_Q^h (W_K^hᵀ Y). The big products are Burn ops on the weights' device; the R × R
/// normal equations are solved on the host in f64.
fn cp_als(wq: &Tensor<3>, wk: &Tensor<3>, rank: usize) -> Cp {
    let [h, _, _] = wq.dims();
    let t = wq.clone().matmul(wk.clone().swap_dims(1, 2)); // [H, d, d], for the error only
    let norm2 = scalar(t.clone().powi_scalar(2).sum()).max(f64::MIN_POSITIVE);
    let mut rng = ChaCha8Rng::seed_from_u64(ALS_SEED);
    // start in the dominant column spaces of the query side (Σ_h T_h T_hᵀ) and the key side
    // (Σ_h T_hᵀ T_h), the mixing fitted to them (an HOSVD-style start)
    let mut a = dominant_subspace(wq, wk, rank, &mut rng);
    let mut b = dominant_subspace(wk, wq, rank, &mut rng);
    let mut m = solve(mixing_rhs(wq, wk, &a, &b), &hadamard(&gram(&a), &gram(&b)), rank);
    for sweep in 1..=ALS_SWEEPS {
        let (a0, b0, m0) = (a.clone(), b.clone(), m.clone());
        let gm = gram(&m);
        // A = Σ_h T_h B diag(m_h) [(MᵀM) ⊙ (BᵀB)]⁻¹, then B likewise, then M
        a = solve(numerator(wq, wk, &b, &m), &hadamard(&gm, &gram(&b)), rank);
        let ga = gram(&a);
        b = solve(numerator(wk, wq, &a, &m), &hadamard(&gm, &ga), rank);
        m = solve(mixing_rhs(wq, wk, &a, &b), &hadamard(&ga, &gram(&b)), rank);
        (a, b, m) = unit_columns(a, b, m);
        if sweep > 2 {
            // Bro's extrapolation: a step of sweep^(1/3) along the sweep's change, kept if it
            // fits better (it gets ALS out of its slow stretches)
            let s = (sweep as f64).cbrt();
            let jump = |new: &Tensor<2>, old: Tensor<2>| old.clone() + (new.clone() - old).mul_scalar(s);
            let (ja, jb, jm) = (jump(&a, a0), jump(&b, b0), jump(&m, m0));
            if misfit(wq, wk, &ja, &jb, &jm, norm2) < misfit(wq, wk, &a, &b, &m, norm2) {
                (a, b, m) = (ja, jb, jm);
            }
        }
    }
    let (a, b, m) = balanced(a, b, m);
    let approx = (a.clone().unsqueeze_dim::<3>(0) * m.clone().reshape([h, 1, rank]))
        .matmul(b.clone().transpose().unsqueeze_dim::<3>(0));
    let error = (scalar((t - approx).powi_scalar(2).sum()) / norm2).sqrt();
    Cp { a, b, m, error }
}

/// W_hᵀ X for every head: `[H, d_h, R]` for `w: [H, d, d_h]`, `x: [d, R]`.
fn project(w: &Tensor<3>, x: &Tensor<2>) -> Tensor<3> {
    w.clone().swap_dims(1, 2).matmul(x.clone().unsqueeze_dim::<3>(0))
}

/// Σ_h W_h (U_hᵀ Y) diag(m_h), `[d, R]`: with (W, U) = (W_Q, W_K) the right-hand side of the
/// W̃_Q update, Σ_h T_h Y diag(m_h); with (W_K, W_Q), of the W̃_K update.
fn numerator(w: &Tensor<3>, u: &Tensor<3>, y: &Tensor<2>, m: &Tensor<2>) -> Tensor<2> {
    let [h, d, _] = w.dims();
    let r = y.dims()[1];
    let uy = project(u, y) * m.clone().reshape([h, 1, r]);
    w.clone().matmul(uy).sum_dim(0).reshape([d, r])
}

/// a_rᵀ T_h b_r for every head and column, `[H, R]`: the right-hand side of the mixing update.
fn mixing_rhs(wq: &Tensor<3>, wk: &Tensor<3>, a: &Tensor<2>, b: &Tensor<2>) -> Tensor<2> {
    let h = wq.dims()[0];
    let r = a.dims()[1];
    (project(wq, a) * project(wk, b)).sum_dim(1).reshape([h, r])
}

/// ‖T − T̂‖² / ‖T‖² from the factors: (‖T‖² − 2⟨T, T̂⟩ + ‖T̂‖²) / ‖T‖², with
/// ‖T̂‖² = Σ (AᵀA ⊙ BᵀB ⊙ MᵀM). Rounded (f32 products), so only good for comparing fits.
fn misfit(wq: &Tensor<3>, wk: &Tensor<3>, a: &Tensor<2>, b: &Tensor<2>, m: &Tensor<2>, norm2: f64) -> f64 {
    let fitted: f64 = hadamard(&hadamard(&gram(a), &gram(b)), &gram(m)).iter().sum();
    let inner: f64 = hadamard(&host(mixing_rhs(wq, wk, a, b)), &host(m.clone())).iter().sum();
    (norm2 - 2.0 * inner + fitted) / norm2
}

/// Columns of A and B scaled to unit norm, their norms moved into the mixing.
fn unit_columns(a: Tensor<2>, b: Tensor<2>, m: Tensor<2>) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
    let norm = |x: &Tensor<2>| x.clone().powi_scalar(2).sum_dim(0).sqrt().clamp_min(1e-30);
    let (na, nb) = (norm(&a), norm(&b));
    (a / na.clone(), b / nb.clone(), m * (na * nb))
}

/// Each column's largest mixing coefficient made ±1 (as in the concatenated form's indicators),
/// the scale split evenly between W̃_Q and W̃_K (unit columns on entry).
fn balanced(a: Tensor<2>, b: Tensor<2>, m: Tensor<2>) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
    let peak = m.clone().abs().max_dim(0).clamp_min(1e-30); // [1, R]
    let root = peak.clone().sqrt();
    (a * root.clone(), b * root, m / peak)
}

/// b̃ = argmin Σ_h ‖W̃_K (m_h ⊙ b̃) − W_K^h b_Q^h‖²: the shared query bias whose key-side score
/// term best matches the heads' ([CollaborativeAttention::from_heads]). Normal equations:
/// [(W̃_KᵀW̃_K) ⊙ (MᵀM)] b̃ = Σ_h m_h ⊙ (W̃_Kᵀ W_K^h b_Q^h).
fn content_bias(wk: &Tensor<3>, cp: &Cp, bq: Tensor<1>) -> Tensor<1> {
    let [h, _, dh] = wk.dims();
    let r = cp.b.dims()[1];
    let kb = project(wk, &cp.b); // W_K^hᵀ W̃_K, [H, d_h, R]
    let rhs = (kb * bq.reshape([h, dh, 1])).sum_dim(1).reshape([h, r]) * cp.m.clone();
    solve(rhs.sum_dim(0), &hadamard(&gram(&cp.b), &gram(&cp.m)), r).reshape([r])
}

/// An orthonormal basis `[d, R]` of the dominant R-dimensional column space of
/// Σ_h T_h T_hᵀ with T_h = W_h U_hᵀ (`w`, `u`: `[H, d, d_h]`), by subspace iteration from a
/// seeded draw: Y = Σ_h W_h (U_hᵀU_h)(W_hᵀ X), then Gram–Schmidt on the host.
fn dominant_subspace(w: &Tensor<3>, u: &Tensor<3>, rank: usize, rng: &mut ChaCha8Rng) -> Tensor<2> {
    let [_, d, _] = w.dims();
    let device = w.device();
    let gram_u = u.clone().swap_dims(1, 2).matmul(u.clone()); // [H, d_h, d_h]
    let draw: Vec<f64> = (0..d * rank).map(|_| rng.random::<f64>() - 0.5).collect();
    let mut x = on_device(&orthonormal_columns(draw, d, rank), [d, rank], &device);
    for _ in 0..SUBSPACE_ITERATIONS {
        let y = w.clone().matmul(gram_u.clone().matmul(project(w, &x))).sum_dim(0).reshape([d, rank]);
        x = on_device(&orthonormal_columns(host(y), d, rank), [d, rank], &device);
    }
    x
}

// Host-side linear algebra in f64: the R × R solves by nalgebra; the Gram–Schmidt below is
// written out because it also replaces a column with nothing left by a basis vector, which a QR
// factorisation does not.

/// A `[rows, cols]` tensor on the host, row-major, in f64.
fn host(t: Tensor<2>) -> Vec<f64> {
    t.into_data().convert::<f64>().try_into_vec::<f64>().expect("a float tensor converts to f64")
}

fn scalar(t: Tensor<1>) -> f64 {
    f64::from(t.into_scalar::<f32>())
}

fn on_device(values: &[f64], shape: [usize; 2], device: &Device) -> Tensor<2> {
    let values: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// XᵀX on the host, `[R, R]` row-major.
fn gram(x: &Tensor<2>) -> Vec<f64> {
    host(x.clone().transpose().matmul(x.clone()))
}

fn hadamard(x: &[f64], y: &[f64]) -> Vec<f64> {
    x.iter().zip(y).map(|(a, b)| a * b).collect()
}

/// X with X G = P for the rows of `p` (`[n, r]`) and the symmetric positive semi-definite
/// `g` (`[r, r]`, a Hadamard product of Gram matrices).
fn solve(p: Tensor<2>, g: &[f64], r: usize) -> Tensor<2> {
    let [n, _] = p.dims();
    let device = p.device();
    on_device(&solve_rows(g, r, &host(p)), [n, r], &device)
}

/// Solves x G = p (G symmetric, so G x = p) for every row p of `rows` (row-major, `r` columns)
/// by nalgebra's Cholesky of G + εI, with a ridge ε = 1e-9 · tr(G)/r that keeps a
/// rank-deficient G (a column of the decomposition gone unused) solvable.
fn solve_rows(g: &[f64], r: usize, rows: &[f64]) -> Vec<f64> {
    let trace: f64 = (0..r).map(|i| g[i * r + i]).sum();
    let ridge = (1e-9 * trace / r as f64).max(f64::MIN_POSITIVE);
    let gram = nalgebra::DMatrix::from_row_slice(r, r, g) + nalgebra::DMatrix::identity(r, r) * ridge;
    let n = rows.len() / r;
    // columns of the right-hand side are the rows p
    let rhs = nalgebra::DMatrix::from_column_slice(r, n, rows);
    let x = match gram.clone().cholesky() {
        Some(c) => c.solve(&rhs),
        // not positive definite even with the ridge (a degenerate Gram): least squares
        None => gram.svd(true, true).solve(&rhs, 1e-12).unwrap_or_else(|_| nalgebra::DMatrix::zeros(r, n)),
    };
    x.as_slice().to_vec()
}

/// The columns of `x` (`[d, r]`, row-major) made orthonormal by modified Gram–Schmidt, each
/// orthogonalised twice; a column with nothing left (more columns than dimensions, or a
/// rank-deficient draw) becomes a unit vector of the standard basis.
#[allow(clippy::needless_range_loop)]
fn orthonormal_columns(x: Vec<f64>, d: usize, r: usize) -> Vec<f64> {
    let dot = |u: &[f64], v: &[f64]| u.iter().zip(v).map(|(a, b)| a * b).sum::<f64>();
    let mut cols: Vec<Vec<f64>> = (0..r).map(|c| (0..d).map(|i| x[i * r + c]).collect()).collect();
    for c in 0..r {
        let (done, rest) = cols.split_at_mut(c);
        let v = &mut rest[0];
        let before = dot(v, v).sqrt();
        for _ in 0..2 {
            for u in done.iter() {
                let along = dot(v, u);
                v.iter_mut().zip(u).for_each(|(a, b)| *a -= along * b);
            }
        }
        let left = dot(v, v).sqrt();
        if left > 1e-10 * before && left > 0.0 {
            v.iter_mut().for_each(|a| *a /= left);
        } else {
            v.iter_mut().enumerate().for_each(|(i, a)| *a = if i == c % d { 1.0 } else { 0.0 });
        }
    }
    let mut out = vec![0.0; d * r];
    for (c, col) in cols.iter().enumerate() {
        for i in 0..d {
            out[i * r + c] = col[i];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::config::MultiHeadAttentionConfig;
    use burn::tensor::Distribution;
    use burn::tensor::activation::softmax;

    const D: usize = 16;

    fn random(shape: [usize; 3], device: &Device) -> Tensor<3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
    }

    fn max_diff<const N: usize>(a: Tensor<N>, b: Tensor<N>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    /// A full-attention layer of `D` with 4 query heads of 4, weights N(0, 0.3²) and random
    /// biases everywhere.
    fn full_layer(n_kv_heads: usize, device: &Device) -> MultiHeadAttention {
        let cfg = MultiHeadAttentionConfig { n_heads: 4, n_kv_heads: Some(n_kv_heads), ..Default::default() };
        let mut full = cfg.init(D, 0.3, 0.3, Positioning::NONE, device);
        let bias =
            |n: usize| Some(Param::from_tensor(Tensor::<1>::random([n], Distribution::Normal(0.0, 0.5), device)));
        full.qkv.qkv.bias = bias(full.qkv.qkv.weight.val().dims()[1]);
        full.out.bias = bias(D);
        full
    }

    fn layer(shared_dim: usize, position: &PositionConfig, device: &Device) -> CollaborativeAttention {
        let cfg = CollaborativeConfig { shared_dim: Some(shared_dim), ..Default::default() };
        cfg.validate(D).unwrap();
        cfg.init(D, 0.3, 0.3, Positioning { config: position, context: 16 }, device)
    }

    fn output(attn: &CollaborativeAttention, x: &Tensor<3>, mask: &AttentionMask) -> Tensor<3> {
        CollaborativeAttention::forward(attn, AttentionInput::self_attention(x.clone(), mask), None).context
    }

    #[test]
    fn exact_reparameterisation_reproduces_full_attention() {
        let dev = Device::flex();
        dev.seed(3);
        // multi-head and grouped-query (two K/V heads, repeated for the query heads)
        for kv_heads in [4, 2] {
            let full = full_layer(kv_heads, &dev);
            let (collab, error) = CollaborativeAttention::from_heads(&full, 16, &dev).unwrap();
            assert_eq!(error, 0.0);
            assert_eq!(collab.qkv.weight.val().dims(), [D, 2 * 16 + 16]);
            let x = random([2, 6, D], &dev);
            for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
                let want = full.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                let diff = max_diff(output(&collab, &x, &mask), want.clone());
                assert!(diff < 1e-5, "{kv_heads} K/V heads, causal {}: off by {diff}", mask.causal);
                // the biases are carried, and they matter here
                let unbiased = CollaborativeAttention {
                    qkv: Linear { weight: collab.qkv.weight.clone(), bias: None },
                    ..collab.clone()
                };
                let moved = max_diff(output(&unbiased, &x, &mask), want);
                assert!(moved > 1e-3, "the biases must change the output (moved {moved})");
            }
        }
    }

    #[test]
    fn compressed_reparameterisation_recovers_heads_of_shared_rank() {
        const R: usize = 4;
        let dev = Device::flex();
        dev.seed(5);
        let mut full = full_layer(4, &dev);
        // heads whose products are A diag(m_h) Bᵀ with a 4 × 4 orthogonal mixing (a Hadamard
        // matrix / 2): CP rank 4 where the concatenated heads have 16 columns
        let a = Tensor::<2>::random([D, R], Distribution::Normal(0.0, 0.4), &dev);
        let b = Tensor::<2>::random([D, R], Distribution::Normal(0.0, 0.4), &dev);
        let m = Tensor::<2>::from_floats(
            [[1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, -1.0], [1.0, 1.0, -1.0, -1.0], [1.0, -1.0, -1.0, 1.0]],
            &dev,
        )
        .mul_scalar(0.5);
        // W_Q^h = A diag(m_h), W_K^h = B (d_h = R), head by head
        let wq = (a.unsqueeze_dim::<3>(0) * m.clone().reshape([4, 1, R])).swap_dims(0, 1).reshape([D, 4 * R]);
        let wk = Tensor::cat(vec![b; 4], 1);
        let wv = full.qkv.qkv.weight.val().narrow(1, 32, 16);
        full.qkv.qkv.weight = Param::from_tensor(Tensor::cat(vec![wq, wk, wv], 1));
        // query biases of the same structure, b_Q^h = m_h ⊙ b̃ (key biases stay random: the
        // softmax ignores them)
        let shared_bias = Tensor::<1>::random([R], Distribution::Normal(0.0, 0.5), &dev);
        let bq = (m * shared_bias.reshape([1, R])).reshape([4 * R]);
        let rest = full.qkv.qkv.bias.as_ref().unwrap().val().narrow(0, 16, 32);
        full.qkv.qkv.bias = Some(Param::from_tensor(Tensor::cat(vec![bq, rest], 0)));

        let (collab, error) = CollaborativeAttention::from_heads(&full, R, &dev).unwrap();
        assert!(error < 1e-3, "relative error {error} of an exactly rank-{R} layer");
        assert_eq!(collab.mixing.val().dims(), [4, R]);
        let x = random([2, 6, D], &dev);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let want = full.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
            let diff = max_diff(output(&collab, &x, &mask), want);
            assert!(diff < 1e-3, "causal {}: off by {diff}", mask.causal);
        }
    }

    /// Dropping the key bias is exact only under a normaliser that ignores row shifts: a
    /// compressed ReLU or sigmoid layer with biases is refused, the full width still converts
    /// exactly, and under softmax the key bias indeed changes nothing.
    #[test]
    fn the_key_bias_is_dropped_only_where_the_normaliser_ignores_it() {
        use variorum_kernels::normalisers::RowNormaliser;
        let dev = Device::flex();
        dev.seed(23);
        let x = random([2, 6, D], &dev);
        let mask = AttentionMask::causal();
        let forward =
            |l: &MultiHeadAttention| l.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        for (row, name) in
            [(RowNormaliser::Relu { scale: 0.25 }, "Relu"), (RowNormaliser::Sigmoid { bias: -1.0 }, "Sigmoid")]
        {
            let mut full = full_layer(4, &dev);
            full.normaliser.row = row;
            let e = CollaborativeAttention::from_heads(&full, 8, &dev).err().expect("refused");
            assert!(e.contains(name) && e.contains("full width 16") && !e.contains('\n'), "{e}");
            let (collab, _) = CollaborativeAttention::from_heads(&full, 16, &dev).unwrap();
            let diff = max_diff(output(&collab, &x, &mask), forward(&full));
            assert!(diff < 1e-5, "{name} at the full width: off by {diff}");
            // the reason: under this normaliser the key bias moves the output
            let mut unbiased_keys = full.clone();
            let b = full.qkv.qkv.bias.as_ref().unwrap().val();
            let zeros = Tensor::<1>::zeros([16], &dev);
            let b = Tensor::cat(vec![b.clone().narrow(0, 0, 16), zeros, b.narrow(0, 32, 16)], 0);
            unbiased_keys.qkv.qkv.bias = Some(Param::from_tensor(b));
            assert!(max_diff(forward(&unbiased_keys), forward(&full)) > 1e-4, "{name}: the key bias matters");
        }
        // softmax: the key bias is a row shift, and removing it changes nothing
        let full = full_layer(4, &dev);
        let mut unbiased_keys = full.clone();
        let b = full.qkv.qkv.bias.as_ref().unwrap().val();
        let b = Tensor::cat(vec![b.clone().narrow(0, 0, 16), Tensor::zeros([16], &dev), b.narrow(0, 32, 16)], 0);
        unbiased_keys.qkv.qkv.bias = Some(Param::from_tensor(b));
        assert!(max_diff(forward(&unbiased_keys), forward(&full)) < 1e-5);
        assert!(CollaborativeAttention::from_heads(&full, 8, &dev).is_ok());
    }

    #[test]
    fn compression_error_falls_as_the_shared_width_grows() {
        let dev = Device::flex();
        dev.seed(9);
        let full = full_layer(4, &dev);
        let errors: Vec<f64> =
            [2, 6, 12, 16].map(|s| CollaborativeAttention::from_heads(&full, s, &dev).unwrap().1).to_vec();
        assert!(errors[0] <= 1.0, "{errors:?}");
        assert!(errors.windows(2).all(|w| w[1] < w[0]), "errors {errors:?} must fall with shared_dim");
        assert_eq!(errors[3], 0.0, "16 = n_heads · head_dim is exact");
        assert!(errors[2] > 1e-3, "a random layer is not of rank 12 ({errors:?})");
    }

    #[test]
    fn all_ones_mixing_is_one_head_repeated() {
        let dev = Device::flex();
        dev.seed(13);
        let none = PositionConfig::None(Default::default());
        let mut attn = layer(8, &none, &dev);
        attn.mixing = Param::from_tensor(Tensor::ones([4, 8], &dev));
        let x = random([2, 5, D], &dev);
        let mask = AttentionMask::causal();
        let weights = |attn: &CollaborativeAttention| {
            let input = AttentionInput::self_attention(x.clone(), &mask).with_weights();
            CollaborativeAttention::forward(attn, input, None).weights.unwrap()
        };
        let w = weights(&attn);
        // one head by hand: softmax(q̃ k̃ᵀ/√d_h + M)
        let all = variorum_kernels::linear::forward(&attn.qkv, x.clone());
        let (q, k) = (all.clone().narrow(2, 0, 8), all.narrow(2, 8, 8));
        let hidden = Tensor::<2, Bool>::tril_mask([5, 5], 0, &dev).unsqueeze::<3>();
        let scores = q.matmul(k.swap_dims(1, 2)).mul_scalar(attn.scale).mask_fill(hidden, MASKED_SCORE);
        let want = softmax(scores, 2);
        for h in 0..4 {
            let diff = max_diff(w.clone().narrow(1, h, 1).reshape([2, 5, 5]), want.clone());
            assert!(diff < 1e-6, "head {h} differs from the shared head by {diff}");
        }
        // mixing vectors that differ make heads that differ
        attn.mixing = Param::from_tensor(Tensor::random([4, 8], Distribution::Normal(0.0, 1.0), &dev));
        let w = weights(&attn);
        let apart = max_diff(w.clone().narrow(1, 0, 1), w.narrow(1, 1, 1));
        assert!(apart > 1e-4, "heads with different mixing vectors attend alike ({apart})");
    }

    #[test]
    fn a_later_token_changes_no_earlier_output() {
        let dev = Device::flex();
        dev.seed(17);
        for position in [PositionConfig::None(Default::default()), PositionConfig::Alibi(Default::default())] {
            let attn = layer(6, &position, &dev);
            let x = random([2, 7, D], &dev);
            let changed = x.clone().slice_assign([0..2, 6..7, 0..D], random([2, 1, D], &dev));
            let mask = AttentionMask::causal();
            let (a, b) = (output(&attn, &x, &mask), output(&attn, &changed, &mask));
            let leak = max_diff(a.clone().narrow(1, 0, 6), b.clone().narrow(1, 0, 6));
            assert_eq!(leak, 0.0, "{}: a later token moved an earlier output", position.kind());
            assert!(max_diff(a.narrow(1, 6, 1), b.narrow(1, 6, 1)) > 1e-4, "the changed token's own output moves");
        }
    }

    #[test]
    fn cached_decoding_equals_the_forward() {
        let dev = Device::flex();
        dev.seed(19);
        let t5 = PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 10, shared: false });
        for position in [PositionConfig::None(Default::default()), PositionConfig::Alibi(Default::default()), t5] {
            let attn = layer(6, &position, &dev);
            let x = random([2, 7, D], &dev);
            let whole = output(&attn, &x, &AttentionMask::causal());
            // a prompt of 3, then one token at a time
            let mut state = AttentionState::default();
            let parts: Vec<Tensor<3>> = [(0, 3), (3, 1), (4, 1), (5, 1), (6, 1)]
                .into_iter()
                .map(|(start, len)| {
                    let mask = AttentionMask::causal().at(start, 0);
                    let input = AttentionInput::self_attention(x.clone().narrow(1, start, len), &mask);
                    AttentionMechanism::forward(&attn, input, Some(&mut state)).context
                })
                .collect();
            let gap = max_diff(Tensor::cat(parts, 1), whole.clone());
            assert!(gap < 1e-5, "{}: decoding differs from the forward by {gap}", position.kind());
            // the prompt's keys and values appended without an output, then decoding
            let mut state = AttentionState::default();
            attn.extend_cache(x.clone().narrow(1, 0, 4), &AttentionMask::causal(), &mut state);
            assert_eq!(state.get::<KvCache>().map(KvCache::len), Some(4));
            let parts: Vec<Tensor<3>> = (4..7)
                .map(|t| {
                    let mask = AttentionMask::causal().at(t, 0);
                    let input = AttentionInput::self_attention(x.clone().narrow(1, t, 1), &mask);
                    AttentionMechanism::forward(&attn, input, Some(&mut state)).context
                })
                .collect();
            let gap = max_diff(Tensor::cat(parts, 1), whole.narrow(1, 4, 3));
            assert!(gap < 1e-5, "{}: decoding after extend_cache differs by {gap}", position.kind());
        }
    }

    #[test]
    fn shared_dim_is_checked_and_written_out() {
        let c = CollaborativeConfig::default();
        assert!(c.validate(D).is_ok());
        assert_eq!(c.expanded(D).shared_dim, Some(16));
        assert_eq!(c.expanded(D).head_dim, Some(4));
        for bad in [0, 17] {
            let c = CollaborativeConfig { shared_dim: Some(bad), ..Default::default() };
            assert!(c.validate(D).is_err(), "shared_dim = {bad} must be refused");
        }
        let parsed: CollaborativeConfig = toml::from_str("n_heads = 4\nshared_dim = 8\n").unwrap();
        assert_eq!(parsed, CollaborativeConfig { shared_dim: Some(8), ..Default::default() });
        assert!(toml::from_str::<CollaborativeConfig>("shared = 8\n").is_err(), "unknown keys are refused");
    }
}
