//! The Synthesizer (Tay, Bahri, Metzler, Juan, Zhao, Zheng 2020, "Synthesizer: Rethinking
//! Self-Attention for Transformer Models"), the `synthesizer` kind: attention weights synthesized
//! without query–key dot products. ℓ is the model's context (`model.seq_len`); every score table
//! is indexed by absolute position, a query at p_q over a key at p_k reading entry p_k (and, for
//! the random tables, row p_q). Per head h:
//!
//! - `dense` (default): each token's row of scores comes from a two-layer MLP of that token alone,
//!   S_h(i, p_k) = [W2_h ReLU(W1 x_i + b1) + b2_h][p_k],   W1 ∈ ℝ^{d×d_hidden}, W2_h ∈ ℝ^{d_hidden×ℓ};
//! - `random`: an input-independent matrix, S_h(p_q, p_k) = R_h[p_q, p_k],   R_h ∈ ℝ^{ℓ×ℓ},
//!   learned (`trainable = true`) or fixed at its random draw (`trainable = false`);
//! - `factorized = true`: dense — two MLP heads A_h(i) ∈ ℝ^a, B_h(i) ∈ ℝ^b (a·b ≥ ℓ) and
//!   S_h(i, p_k) = A_h(i)[p_k mod a] · B_h(i)[⌊p_k / a⌋]; random — R_h = R1_h R2_hᵀ with
//!   R1_h, R2_h ∈ ℝ^{ℓ×k};
//! - `mixture`: S_h = α_1 S_dense + α_2 S_random + α_3 Q_h K_hᵀ/√d_h with α = softmax(γ), γ ∈ ℝ³
//!   learned (the dense and random parts follow `factorized` and `trainable`);
//!
//! then, as in full attention, head_h = softmax(S_h + M) V_h with V_h = X W_v,h (M = −∞ on hidden
//! keys: later positions under a causal mask, padding, custom patterns), and the output
//! [head_1; …; head_H] W_O. Dropout acts on the weights, as in `full`.
//!
//! Choices where the paper leaves one open:
//! - W1, b1 are shared by the heads and W2_h, b2_h are per head (the paper writes one F_h per
//!   head; sharing the first layer keeps its cost at d·d_hidden whatever the number of heads).
//!   d_hidden = `hidden`, d_model by default (the paper's d).
//! - Only the `[len_q, len_k]` block a call needs is formed: the dense MLP's second layer is
//!   evaluated for the columns p_k of this call's keys only (never all ℓ), the random tables are
//!   sliced at (q_start, k_start). One `[heads, len_q, len_k]` random block serves the batch.
//! - Causal form: the synthesized scores are masked like full attention's (the paper's decoder
//!   does the same). A dense row depends on its own token only and a random row on nothing, so
//!   masking the later keys is all a decoder needs; cached decoding keeps the values (and, for the
//!   mixture, the keys) in a [`KvCache`] and forms each new token's row directly.
//! - Factorized dense: a = ⌈√ℓ⌉ and b = ⌈ℓ / a⌉ unless `factors = [a, b]` is given. The paper
//!   asks a·b = ℓ; any a·b ≥ ℓ is accepted here (the entries past ℓ are never read). Its tiling
//!   functions are read as: A tiled b times (entry p_k mod a), each entry of B repeated a times
//!   (entry ⌊p_k / a⌋), multiplied elementwise.
//! - Initialisation (the paper states none): W1, W2 ~ N(0, init_std²) with zero b2, so the dense
//!   weights start near uniform like dot-product attention's; R ~ N(0, 1), so a fixed R is a
//!   genuinely random alignment rather than a near-uniform average; factorized R1, R2 ~
//!   N(0, 1/√k), so R1 R2ᵀ has unit-variance entries too. A fixed R is a parameter without
//!   gradient: saved and loaded with the checkpoint, never updated.
//! - Mixture: the paper mixes pairs (random + vanilla, dense + vanilla, random + dense) with
//!   learned weights; here all three, γ = 0 at init (α = 1/3 each; a pair is the limit where one
//!   logit goes to −∞). The dot part has its own W_Q, W_K and the layer's rotation (RoPE), if any.
//! - Positions past the table: the model's context is ℓ, training and generation stay below it
//!   (the generator moves its window before the context is full). Only an evaluation at a longer
//!   context reaches a position ≥ ℓ, which [`SynthesizerConfig::validate_len`] cannot refuse (ℓ
//!   is the model's, not the config's): a run refuses it (`variorum eval --seq-len`, through the
//!   kind's `variable_length: false`). A library user who runs the module past ℓ gets the
//!   table's last row and column (the weights stay causal and defined, and nothing panics),
//!   which no training ever shaped.
//! - Position schemes: the scores are tables of absolute positions, so no relative scheme acts on
//!   the dense or random part (`score_bias: false`: ALiBi, T5, Shaw, … are refused); the
//!   mixture's dot part takes a rotation of q and k (RoPE). No memory (`reads_memory: false`):
//!   the tables have no entries for keys before the segment.

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::{relu, softmax};
use serde::{Deserialize, Serialize};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_position::{PositionConfig, RelativePosition, RotaryConfig};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::projections;
use crate::engine::projections::take;
use crate::engine::qkv::{normal_linear, split_heads};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

/// Where a synthesizer's scores come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SynthesizerVariant {
    /// An MLP of each token alone gives its row of scores over the key positions.
    #[default]
    Dense,
    /// An input-independent ℓ × ℓ score matrix per head.
    Random,
    /// softmax(α_dense S_dense + α_random S_random + α_dot QKᵀ/√d), α learned.
    Mixture,
}

attention_config! {
    /// `model.attention` with `kind = "synthesizer"`.
    pub struct SynthesizerConfig [n_heads, head_dim, dropout, bias, normaliser] {
        /// `dense` (default), `random` or `mixture`.
        pub variant: SynthesizerVariant = SynthesizerVariant::Dense,
        /// Factorized scores: dense from two MLP heads of lengths a and b, random as R1 R2ᵀ.
        /// Default false.
        pub factorized: bool = false,
        /// Random scores are learned (true, default) or stay at their random draw (false, the
        /// paper's fixed random synthesizer).
        pub trainable: bool = true,
        /// Hidden width of the dense synthesizer's MLP. Default `d_model`.
        pub hidden: Option<usize> = None,
        /// [a, b], the lengths of the factorized dense synthesizer's two heads (a·b at least
        /// `model.seq_len`). Default a = ⌈√ℓ⌉, b = ⌈ℓ / a⌉ for the model's context ℓ.
        pub factors: Option<[usize; 2]> = None,
        /// k, the rank of the factorized random synthesizer's R1, R2 ∈ ℝ^{ℓ×k}. Default 8.
        pub k: usize = 8,
    }
}

/// ⌈√n⌉ for n ≥ 1.
fn ceil_sqrt(n: usize) -> usize {
    let mut a = (n as f64).sqrt().ceil() as usize;
    while a * a < n {
        a += 1;
    }
    while a > 1 && (a - 1) * (a - 1) >= n {
        a -= 1;
    }
    a.max(1)
}

impl SynthesizerConfig {
    /// Whether the setting has a dense part (dense, mixture).
    pub fn has_dense(&self) -> bool {
        self.variant != SynthesizerVariant::Random
    }

    /// Whether the setting has a random part (random, mixture).
    pub fn has_random(&self) -> bool {
        self.variant != SynthesizerVariant::Dense
    }

    /// The factorized dense synthesizer's lengths (a, b) for a context of ℓ positions: `factors`,
    /// or a = ⌈√ℓ⌉, b = ⌈ℓ / a⌉.
    pub fn factors_for(&self, context: usize) -> (usize, usize) {
        match self.factors {
            Some([a, b]) => (a, b),
            None => {
                let l = context.max(1);
                let a = ceil_sqrt(l);
                (a, l.div_ceil(a))
            }
        }
    }

    /// `position.context` is ℓ, the length of the score tables (the model's context).
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> SynthesizerAttention {
        let shape = self.head_shape(d_model);
        let (h, dh) = (shape.n_heads, shape.head_dim);
        let width = h * dh;
        let context = position.context.max(1);
        let mixture = self.variant == SynthesizerVariant::Mixture;
        let dense = self.has_dense().then(|| {
            let hidden = self.hidden.unwrap_or(d_model);
            let table = |len: usize| ScoreTable::new(hidden, h, len, init_std, device);
            let (first, second) = if self.factorized {
                let (a, b) = self.factors_for(context);
                (table(a), Some(table(b)))
            } else {
                (table(context), None)
            };
            DenseSynthesizer { hidden: normal_linear(d_model, hidden, self.bias, init_std, device), first, second }
        });
        let random = self.has_random().then(|| {
            let draw = |shape: [usize; 3], std: f64| {
                let t = Tensor::<3>::random(shape, Distribution::Normal(0.0, std), device);
                Param::from_tensor(t).set_require_grad(self.trainable)
            };
            if self.factorized {
                let std = (self.k as f64).powf(-0.25);
                RandomSynthesizer {
                    first: draw([h, context, self.k], std),
                    second: Some(draw([h, context, self.k], std)),
                }
            } else {
                RandomSynthesizer { first: draw([h, context, context], 1.0), second: None }
            }
        });
        SynthesizerAttention {
            dense,
            random,
            query_key: mixture.then(|| normal_linear(d_model, 2 * width, self.bias, init_std, device)),
            position: if mixture { position.config.init_relative(shape, position.context, device) } else { None },
            mix: mixture.then(|| Param::from_tensor(Tensor::<1>::zeros([3], device))),
            value: normal_linear(d_model, width, self.bias, init_std, device),
            out: normal_linear(width, d_model, self.bias, out_std, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            normaliser: self.normaliser.init(h, self.head_temperature, position.context, device),
            n_heads: h,
            head_dim: dh,
            context,
            scale: position.config.content_scale() / (dh as f64).sqrt(),
        }
    }
}

impl AttentionKind for SynthesizerConfig {
    type Module = SynthesizerAttention;
    const SUMMARY: &'static str = "Synthesizer: scores synthesized without query–key products — dense (an MLP of each token gives its row over the ℓ key positions), random (a learned or fixed ℓ × ℓ matrix per head), factorized forms of both, or a learned mixture with dot-product scores; values cached";
    const PAPER: &'static str =
        "Tay, Bahri, Metzler, Juan, Zhao, Zheng 2020, Synthesizer: Rethinking Self-Attention for Transformer Models";
    // a score matrix over absolute positions: no relative bias acts on it (only the mixture's dot
    // part is rotated), no memory (no table entries before the segment), tables of ℓ positions
    const CAPS: Capabilities =
        Capabilities { score_bias: false, reads_memory: false, variable_length: false, ..caps::SCORES };

    /// Only the mixture has queries and keys to rotate.
    fn capabilities(&self) -> Capabilities {
        let mut c = Self::CAPS;
        c.qk_rotation = self.variant == SynthesizerVariant::Mixture;
        c
    }

    fn expanded(&self, d_model: usize) -> Self {
        let hidden = if self.has_dense() { Some(self.hidden.unwrap_or(d_model)) } else { self.hidden };
        Self { hidden, ..self.expanded_heads(d_model) }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        crate::kind::check_dropout(self.dropout)?;
        check(self.hidden != Some(0), || "model.attention.hidden must be at least 1".into())?;
        check(self.has_dense() || self.hidden.is_none(), || {
            "model.attention.hidden is the width of the dense synthesizer's MLP, and variant = \"random\" has none: remove it"
                .into()
        })?;
        if let Some([a, b]) = self.factors {
            check(self.has_dense() && self.factorized, || {
                "model.attention.factors = [a, b] sets the lengths of the factorized dense synthesizer: set factorized = true with variant = \"dense\" or \"mixture\", or remove it"
                    .into()
            })?;
            check(a >= 1 && b >= 1, || format!("model.attention.factors = [{a}, {b}]: both must be at least 1"))?;
        }
        check(self.k >= 1, || "model.attention.k must be at least 1".into())
    }

    /// Refuses a context longer than the factorized dense synthesizer's a·b positions.
    fn validate_len(&self, len: usize) -> Result<(), ConfigError> {
        match self.factors {
            Some([a, b]) if self.factorized && self.has_dense() => check(a.saturating_mul(b) >= len, || {
                format!(
                    "model.attention.factors = [{a}, {b}] cover {} key positions, fewer than a context of {len}: use factors whose product is at least {len}, or leave them out",
                    a.saturating_mul(b)
                )
            }),
            _ => Ok(()),
        }
    }

    head_settings_hooks!();

    /// Multiply–adds per token, 2 FLOPs each: the value and output projections and the weighted
    /// sum over `len_k` values; dense: the MLP (its second layer for the `len_k` key columns only,
    /// or for a + b entries and one product per key when factorized, ℓ taken as `len_k`); random:
    /// nothing per token (a table read), or a row of R1 R2ᵀ (k per key) when factorized; mixture:
    /// both, plus the query and key projections, QKᵀ and the three-way mix.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let shape = self.head_shape(d_model);
        let (d, h, lk) = (d_model as u64, shape.n_heads as u64, len_k as u64);
        let hd = (shape.n_heads * shape.head_dim) as u64;
        let mut flops = 2 * (2 * d * hd) + 2 * hd * lk;
        if self.has_dense() {
            let hidden = self.hidden.unwrap_or(d_model) as u64;
            flops += 2 * d * hidden;
            flops += if self.factorized {
                let (a, b) = self.factors_for(len_k);
                2 * hidden * h * (a + b) as u64 + h * lk
            } else {
                2 * hidden * h * lk
            };
        }
        if self.has_random() && self.factorized {
            flops += 2 * h * self.k as u64 * lk;
        }
        if self.variant == SynthesizerVariant::Mixture {
            flops += 2 * d * 2 * hd + 2 * hd * lk + 2 * 3 * h * lk;
        }
        flops
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn build(&self, init: &LayerInit, device: &Device) -> SynthesizerAttention {
        self.init(init.d_model, init.init_std, init.out_std, init.position, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        let of = |variant| Self { variant, ..Self::default() };
        vec![
            TestVariant::new("", Self::default()),
            TestVariant::new("random, fixed", Self { trainable: false, ..of(SynthesizerVariant::Random) }),
            TestVariant::new(
                "random, factorized k 4",
                Self { factorized: true, k: 4, ..of(SynthesizerVariant::Random) },
            ),
            TestVariant::new(
                "dense, factorized 3 × 6",
                Self { factorized: true, factors: Some([3, 6]), ..Self::default() },
            ),
            TestVariant::new("mixture", of(SynthesizerVariant::Mixture)),
            TestVariant::new(
                "mixture, factorized, fixed random + position rope",
                Self { factorized: true, trainable: false, ..of(SynthesizerVariant::Mixture) },
            )
            .with_position(PositionConfig::Rope(RotaryConfig::default())),
            TestVariant::new("dense, bidirectional", Self::default()).masked(),
            TestVariant::new(
                "random, entmax-1.5",
                Self { normaliser: crate::engine::normaliser::Normaliser::Entmax15, ..of(SynthesizerVariant::Random) },
            ),
        ]
    }
}

/// One output layer of the dense synthesizer's MLP: per head, scores over `len` entries.
#[derive(Module, Debug)]
pub struct ScoreTable {
    /// W2, `[hidden, n_heads, len]`.
    pub weight: Param<Tensor<3>>,
    /// b2, `[n_heads, len]`.
    pub bias: Param<Tensor<2>>,
}

impl ScoreTable {
    fn new(hidden: usize, n_heads: usize, len: usize, std: f64, device: &Device) -> Self {
        Self {
            weight: Initializer::Normal { mean: 0.0, std }.init([hidden, n_heads, len], device),
            bias: Param::from_tensor(Tensor::<2>::zeros([n_heads, len], device)),
        }
    }

    /// The number of entries (ℓ, a or b).
    fn entries(&self) -> usize {
        self.weight.val().dims()[2]
    }

    /// Scores `[b, n_heads, len_q, n]` of hidden activations `[b, len_q, hidden]` for the entries
    /// `start..start + n`: only those columns of W2 are multiplied.
    fn scores(&self, hidden: Tensor<3>, start: usize, n: usize) -> Tensor<4> {
        let [b, lq, width] = hidden.dims();
        let w = take(self.weight.val(), 2, start, n); // [hidden, h, n]
        let h = w.dims()[1];
        let bias = take(self.bias.val(), 1, start, n).reshape([1, 1, h * n]);
        let s = hidden.matmul(w.reshape([1, width, h * n])) + bias;
        s.reshape([b, lq, h, n]).swap_dims(1, 2)
    }
}

/// The dense synthesizer: W2_h ReLU(W1 x + b1) + b2_h.
#[derive(Module, Debug)]
pub struct DenseSynthesizer {
    /// W1, b1, `[d_model, hidden]`, shared by the heads.
    pub hidden: Linear,
    /// W2, b2 over the ℓ key positions; factorized: A's a entries (read at p_k mod a).
    pub first: ScoreTable,
    /// Factorized: B's b entries (read at ⌊p_k / a⌋).
    pub second: Option<ScoreTable>,
}

impl DenseSynthesizer {
    /// Scores `[b, n_heads, len_q, len_k]` of the queries' inputs `x: [b, len_q, d_model]` over
    /// keys at positions `k_start..k_start + len_k`, for tables of `context` positions.
    pub fn scores(&self, x: Tensor<3>, k_start: usize, len_k: usize, context: usize) -> Tensor<4> {
        let hidden = relu(self.hidden.forward(x));
        let Some(second) = &self.second else {
            return self.first.scores(hidden, k_start, len_k);
        };
        let (a, b) = (self.first.entries(), second.entries());
        // positions at or past min(ℓ, a·b) read the last one
        let last = context.min(a * b).max(1) - 1;
        let (rem, quot): (Vec<i64>, Vec<i64>) = (k_start..k_start + len_k)
            .map(|p| {
                let p = p.min(last);
                ((p % a) as i64, (p / a) as i64)
            })
            .unzip();
        let device = hidden.device();
        let index = |v: Vec<i64>| Tensor::<1, Int>::from_data(TensorData::new(v, [len_k]), &device);
        let tiled = self.first.scores(hidden.clone(), 0, a).select(3, index(rem));
        let repeated = second.scores(hidden, 0, b).select(3, index(quot));
        tiled * repeated
    }
}

/// The random synthesizer: R_h, or R1_h R2_hᵀ.
#[derive(Module, Debug)]
pub struct RandomSynthesizer {
    /// R, `[n_heads, ℓ, ℓ]` (query position, key position); factorized: R1, `[n_heads, ℓ, k]`.
    pub first: Param<Tensor<3>>,
    /// Factorized: R2, `[n_heads, ℓ, k]`.
    pub second: Option<Param<Tensor<3>>>,
}

impl RandomSynthesizer {
    /// Scores `[1, n_heads, len_q, len_k]` of queries at `q_start..` over keys at `k_start..`.
    pub fn scores(&self, q_start: usize, len_q: usize, k_start: usize, len_k: usize) -> Tensor<4> {
        let rows = take(self.first.val(), 1, q_start, len_q);
        let s = match &self.second {
            None => take(rows, 2, k_start, len_k),
            Some(r2) => rows.matmul(take(r2.val(), 1, k_start, len_k).swap_dims(1, 2)),
        };
        s.unsqueeze_dim::<4>(0)
    }
}

/// The Synthesizer: attention weights from synthesized score tables (dense, random, or a learned
/// mixture of both with dot products) over learned values.
#[derive(Module, Debug)]
pub struct SynthesizerAttention {
    /// The dense part (dense, mixture).
    pub dense: Option<DenseSynthesizer>,
    /// The random part (random, mixture).
    pub random: Option<RandomSynthesizer>,
    /// Mixture: W_Q and W_K fused, `[d_model, 2 · n_heads · head_dim]` (queries first).
    pub query_key: Option<Linear>,
    /// Mixture: the layer's rotation of queries and keys (RoPE), if any.
    pub position: Option<RelativePosition>,
    /// Mixture: γ, the logits of (α_dense, α_random, α_dot), `[3]`.
    pub mix: Option<Param<Tensor<1>>>,
    /// W_v, `[d_model, n_heads · head_dim]`.
    pub value: Linear,
    /// W_O, `[n_heads · head_dim, d_model]`.
    pub out: Linear,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Scores to weights (softmax unless the config says otherwise).
    pub normaliser: crate::engine::normaliser::ScoreNormaliser,
    /// H, heads.
    pub n_heads: usize,
    /// d_h, the size of each head.
    pub head_dim: usize,
    /// ℓ, the positions the score tables cover (the model's context).
    pub context: usize,
    /// The dot part's 1/√d_h (times the position scheme's content scale).
    pub scale: f64,
}

impl SynthesizerAttention {
    /// Decoding: the values (and the mixture's keys) of every position so far in `cache`; the
    /// dense and random variants keep a one-column placeholder in the cache's key buffer.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let AttentionInput { query, key_value, mask, need_weights, .. } = input;
        let [b, lq, _] = query.dims();
        let (h, dh) = (self.n_heads, self.head_dim);
        let (cached, dropped) = cache.as_ref().map_or((0, 0), |c| (c.len(), c.start));
        let k_start = mask.k_start + dropped;
        let source = key_value.clone().unwrap_or_else(|| query.clone());
        let v = split_heads(self.value.forward(source), 1, h, dh).remove(0);
        let device = v.device();
        // the mixture's queries and keys, rotated at their positions (new keys follow the cache)
        let (q, k_new) = match &self.query_key {
            Some(w) => {
                let mut own = split_heads(w.forward(query.clone()), 2, h, dh);
                let k = match &key_value {
                    Some(src) => split_heads(w.forward(src.clone()), 2, h, dh).remove(1),
                    None => own.remove(1),
                };
                let q = own.remove(0);
                match &self.position {
                    Some(p) => (Some(p.rotate(q, mask.q_start)), Some(p.rotate(k, k_start + cached))),
                    None => (Some(q), Some(k)),
                }
            }
            None => (None, None),
        };
        let (keys, v) = match cache {
            Some(c) => {
                let [vb, _, new, _] = v.dims();
                let placeholder = k_new.is_none();
                let k = k_new.unwrap_or_else(|| Tensor::<4>::zeros([vb, 1, new, 1], &device));
                let (k, v) = c.append(k, v);
                ((!placeholder).then_some(k), v)
            }
            None => (k_new, v),
        };
        let lk = v.dims()[2];
        let dense = self.dense.as_ref().map(|d| d.scores(query, k_start, lk, self.context));
        let random = self.random.as_ref().map(|r| r.scores(mask.q_start, lq, k_start, lk));
        let dot = q.zip(keys).map(|(q, k)| q.mul_scalar(self.scale).matmul(k.swap_dims(2, 3)));
        let scores = match &self.mix {
            Some(logits) => {
                let alpha = softmax(logits.val(), 0);
                let weight = |i: usize| alpha.clone().narrow(0, i, 1).reshape([1, 1, 1, 1]);
                [dense, random, dot]
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, s)| s.map(|s| s * weight(i)))
                    .reduce(|x, y| x + y)
            }
            None => dense.or(random).or(dot),
        }
        .expect("a synthesizer forms at least one part of its scores");
        let scores = match (AttentionMask { k_start, ..mask.clone() }).score_mask(lq, lk, &device) {
            Some(hidden) => {
                let shape = [scores.dims()[0].max(hidden.dims()[0]), h, lq, lk];
                scores.expand(shape).mask_fill(hidden.expand(shape), MASKED_SCORE)
            }
            None => scores,
        };
        let probs = self.normaliser.forward(scores);
        let weights = need_weights.then(|| probs.clone().expand([b, h, lq, lk]));
        let context = if probs.dims()[0] == 1 && b > 1 && self.dropout.prob == 0.0 {
            // one matrix for the whole batch (the random synthesizer): [h, lq, lk] @ [h, lk, b·d_h]
            let v = v.swap_dims(0, 1).swap_dims(1, 2).reshape([h, lk, b * dh]);
            let c = probs.reshape([h, lq, lk]).matmul(v);
            c.reshape([h, lq, b, dh]).swap_dims(1, 2).swap_dims(0, 1)
        } else {
            self.dropout.forward(probs.expand([b, h, lq, lk])).matmul(v)
        };
        let context = context.swap_dims(1, 2).reshape([b, lq, h * dh]);
        AttentionOutput { context: self.out.forward(context), weights, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for SynthesizerAttention {
    /// Decoding state: the layer's [`KvCache`].
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        SynthesizerAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::heads::MultiHeadAttention;
    use crate::engine::qkv::QkvProjection;

    const D: usize = 16;
    /// ℓ of the layers built here.
    const CONTEXT: usize = 8;

    fn of(variant: SynthesizerVariant) -> SynthesizerConfig {
        SynthesizerConfig { variant, ..Default::default() }
    }

    fn layer_with(cfg: SynthesizerConfig, position: &PositionConfig, dev: &Device) -> SynthesizerAttention {
        cfg.validate(D).unwrap();
        cfg.validate_len(CONTEXT).unwrap();
        dev.seed(5);
        cfg.init(D, 0.2, 0.2, Positioning { config: position, context: CONTEXT }, dev)
    }

    fn layer(cfg: SynthesizerConfig, dev: &Device) -> SynthesizerAttention {
        layer_with(cfg, Positioning::NONE.config, dev)
    }

    /// Every setting the tests run, named.
    fn variants() -> Vec<(&'static str, SynthesizerConfig)> {
        use SynthesizerVariant::{Dense, Mixture, Random};
        vec![
            ("dense", of(Dense)),
            ("dense factorized", SynthesizerConfig { factorized: true, ..of(Dense) }),
            ("random", of(Random)),
            ("random fixed", SynthesizerConfig { trainable: false, ..of(Random) }),
            ("random factorized", SynthesizerConfig { factorized: true, k: 3, ..of(Random) }),
            ("mixture", of(Mixture)),
            ("mixture factorized", SynthesizerConfig { factorized: true, ..of(Mixture) }),
        ]
    }

    fn random(shape: [usize; 3], dev: &Device) -> Tensor<3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
    }

    fn run(att: &SynthesizerAttention, x: Tensor<3>, mask: &AttentionMask) -> AttentionOutput {
        att.forward(AttentionInput::self_attention(x, mask).with_weights(), None)
    }

    fn max_diff<const N: usize>(a: Tensor<N>, b: Tensor<N>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    fn host<const N: usize>(t: Tensor<N>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    /// `x` with position `at` of every row replaced by fresh noise.
    fn change(x: Tensor<3>, at: usize, dev: &Device) -> Tensor<3> {
        let [b, _, d] = x.dims();
        x.slice_assign([0..b, at..at + 1, 0..d], random([b, 1, d], dev))
    }

    #[test]
    fn random_weights_ignore_the_input_and_are_the_softmax_of_r() {
        let dev = Device::flex();
        let att = layer(SynthesizerConfig { trainable: false, ..of(SynthesizerVariant::Random) }, &dev);
        let mask = AttentionMask::causal();
        let a = run(&att, random([2, 6, D], &dev), &mask).weights.unwrap();
        let b = run(&att, random([2, 6, D], &dev), &mask).weights.unwrap();
        assert_eq!(max_diff(a.clone(), b), 0.0, "the random synthesizer's weights moved with the input");
        // head h, row i: softmax over keys j ≤ i of R_h[i, j]
        let r = host(att.random.as_ref().unwrap().first.val());
        let got = host(a);
        for h in 0..4 {
            for i in 0..6 {
                let e: Vec<f64> = (0..=i).map(|j| (r[(h * CONTEXT + i) * CONTEXT + j] as f64).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..6 {
                    let want = if j <= i { e[j] / z } else { 0.0 };
                    let g = got[(h * 6 + i) * 6 + j] as f64;
                    assert!((g - want).abs() < 1e-5, "head {h}, row {i}, key {j}: {g} instead of {want}");
                }
            }
        }
    }

    /// The dense synthesizer's MLP written out: S_h(i, j) = Σ_u W2_h[u, j] ReLU(Σ_c x_i[c] W1[c, u]
    /// + b1[u]) + b2_h[j], the weights softmax_j≤i of it (causal), with biases away from zero so
    /// that a missing bias, a missing ReLU or a head's table read for another shows.
    #[test]
    fn dense_weights_are_the_softmax_of_the_two_layer_mlp_by_hand() {
        let dev = Device::flex();
        let mut att = layer(of(SynthesizerVariant::Dense), &dev);
        let dense = att.dense.as_mut().unwrap();
        let b1 = Tensor::<1>::random([D], Distribution::Normal(0.0, 1.0), &dev);
        dense.hidden.bias = Some(Param::from_tensor(b1));
        dense.first.bias = Param::from_tensor(Tensor::random([4, CONTEXT], Distribution::Normal(0.0, 1.0), &dev));
        let (w1, b1) = (host(dense.hidden.weight.val()), host(dense.hidden.bias.as_ref().unwrap().val()));
        let (w2, b2) = (host(dense.first.weight.val()), host(dense.first.bias.val()));
        let (len, heads) = (6, 4);
        let x = random([1, len, D], &dev);
        let xs = host(x.clone());
        let got = host(run(&att, x, &AttentionMask::causal()).weights.unwrap());
        for i in 0..len {
            let hidden: Vec<f64> = (0..D)
                .map(|u| {
                    ((0..D).map(|c| xs[i * D + c] as f64 * w1[c * D + u] as f64).sum::<f64>() + b1[u] as f64).max(0.0)
                })
                .collect();
            for h in 0..heads {
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        let w = |u: usize| w2[(u * heads + h) * CONTEXT + j] as f64;
                        (0..D).map(|u| w(u) * hidden[u]).sum::<f64>() + b2[h * CONTEXT + j] as f64
                    })
                    .collect();
                let top = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - top).exp()).sum();
                for j in 0..len {
                    let want = if j <= i { (s[j] - top).exp() / z } else { 0.0 };
                    let g = got[(h * len + i) * len + j] as f64;
                    assert!((g - want).abs() < 1e-5, "head {h}, row {i}, key {j}: {g} instead of {want}");
                }
            }
        }
    }

    #[test]
    fn dense_rows_depend_on_their_own_token_only() {
        let dev = Device::flex();
        let mask = AttentionMask::bidirectional();
        for (name, cfg) in variants().into_iter().filter(|(_, c)| c.variant == SynthesizerVariant::Dense) {
            let att = layer(cfg, &dev);
            let x = random([1, 6, D], &dev);
            let before = run(&att, x.clone(), &mask);
            let after = run(&att, change(x, 2, &dev), &mask);
            let (wa, wb) = (before.weights.unwrap(), after.weights.unwrap());
            for i in 0..6 {
                let moved = max_diff(wa.clone().narrow(2, i, 1), wb.clone().narrow(2, i, 1));
                if i == 2 {
                    assert!(moved > 1e-4, "{name}: token 2 changed but its own row did not ({moved})");
                } else {
                    assert_eq!(moved, 0.0, "{name}: row {i}'s weights moved with token 2");
                }
            }
            // row 0's output still sees token 2, through its value
            let out = max_diff(before.context.narrow(1, 0, 1), after.context.narrow(1, 0, 1));
            assert!(out > 1e-5, "{name}: row 0's output ignored token 2's value");
        }
    }

    #[test]
    fn no_output_depends_on_a_later_token() {
        let dev = Device::flex();
        let mask = AttentionMask::causal();
        for (name, cfg) in variants() {
            let att = layer(cfg, &dev);
            let x = random([2, 7, D], &dev);
            let a = run(&att, x.clone(), &mask).context;
            let b = run(&att, change(x, 6, &dev), &mask).context;
            let leak = max_diff(a.clone().narrow(1, 0, 6), b.clone().narrow(1, 0, 6));
            assert_eq!(leak, 0.0, "{name}: changing the last token moved an earlier output");
            let own = max_diff(a.narrow(1, 6, 1), b.narrow(1, 6, 1));
            assert!(own > 1e-5, "{name}: the last output ignored its own token (the check is blind)");
        }
    }

    #[test]
    fn factorized_random_scores_are_r1_r2_transposed_at_the_absolute_positions() {
        let dev = Device::flex();
        let k = 3;
        let att = layer(SynthesizerConfig { factorized: true, k, ..of(SynthesizerVariant::Random) }, &dev);
        let r = att.random.as_ref().unwrap();
        let (r1, r2) = (host(r.first.val()), host(r.second.as_ref().unwrap().val()));
        // queries at positions 2..5 over keys at positions 1..6, nothing hidden
        let mask = AttentionMask::bidirectional().at(2, 1);
        let input = AttentionInput::cross_attention(random([1, 3, D], &dev), random([1, 5, D], &dev), &mask);
        let got = host(att.forward(input.with_weights(), None).weights.unwrap());
        for h in 0..4 {
            for i in 0..3 {
                let score = |j: usize| -> f64 {
                    (0..k).map(|m| (r1[(h * CONTEXT + 2 + i) * k + m] * r2[(h * CONTEXT + 1 + j) * k + m]) as f64).sum()
                };
                let e: Vec<f64> = (0..5).map(|j| score(j).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..5 {
                    let g = got[(h * 3 + i) * 5 + j] as f64;
                    assert!((g - e[j] / z).abs() < 1e-5, "head {h}, query {i}, key {j}: {g} instead of {}", e[j] / z);
                }
            }
        }
    }

    #[test]
    fn factorized_dense_scores_tile_a_and_repeat_b() {
        // W2 = 0, so the scores are the biases: s_j = α[j mod a] · β[⌊j / a⌋], the same in every row
        let dev = Device::flex();
        let (a, b, h) = (3, 3, 4);
        let cfg = SynthesizerConfig { factorized: true, factors: Some([a, b]), ..of(SynthesizerVariant::Dense) };
        let mut att = layer(cfg, &dev);
        let alpha: Vec<f32> = (0..h * a).map(|t| 0.3 * t as f32 - 1.0).collect();
        let beta: Vec<f32> = (0..h * b).map(|t| 0.5 - 0.2 * t as f32).collect();
        let dense = att.dense.as_mut().unwrap();
        let hidden = dense.hidden.weight.val().dims()[1];
        let set = |table: &mut ScoreTable, values: &[f32], len: usize| {
            table.weight = Param::from_tensor(Tensor::<3>::zeros([hidden, h, len], &dev));
            table.bias = Param::from_tensor(Tensor::<2>::from_data(TensorData::new(values.to_vec(), [h, len]), &dev));
        };
        set(&mut dense.first, &alpha, a);
        set(dense.second.as_mut().unwrap(), &beta, b);
        let l = CONTEXT;
        let got = host(run(&att, random([1, l, D], &dev), &AttentionMask::bidirectional()).weights.unwrap());
        for head in 0..h {
            let s: Vec<f64> = (0..l).map(|j| (alpha[head * a + j % a] * beta[head * b + j / a]) as f64).collect();
            let e: Vec<f64> = s.iter().map(|x| x.exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..l {
                for j in 0..l {
                    let g = got[(head * l + i) * l + j] as f64;
                    assert!((g - e[j] / z).abs() < 1e-5, "head {head}, row {i}, key {j}: {g} instead of {}", e[j] / z);
                }
            }
        }
    }

    #[test]
    fn mixture_with_only_the_dot_part_is_full_attention() {
        let dev = Device::flex();
        let mut att = layer(of(SynthesizerVariant::Mixture), &dev);
        let x = random([2, 6, D], &dev);
        // multi-head attention from the same W_Q, W_K, W_V, W_O: its fused projection is [Q | K | V]
        let qk = att.query_key.as_ref().unwrap();
        let bias = |l: &Linear| l.bias.as_ref().unwrap().val();
        let full = MultiHeadAttention {
            qkv: QkvProjection {
                qkv: Linear {
                    weight: Param::from_tensor(Tensor::cat(vec![qk.weight.val(), att.value.weight.val()], 1)),
                    bias: Some(Param::from_tensor(Tensor::cat(vec![bias(qk), bias(&att.value)], 0))),
                },
                n_heads: 4,
                n_kv_heads: 4,
                head_dim: 4,
            },
            position: None,
            out: att.out.clone(),
            dropout: DropoutConfig::new(0.0).init(),
            normaliser: crate::engine::normaliser::ScoreNormaliser::softmax(),
            losses: Default::default(),
            scale: 0.5,
        };
        let masks = [AttentionMask::causal(), AttentionMask::bidirectional()];
        let outputs = |att: &SynthesizerAttention, mask: &AttentionMask| {
            let want = full.forward(AttentionInput::self_attention(x.clone(), mask), None).context;
            let got = att.forward(AttentionInput::self_attention(x.clone(), mask), None).context;
            max_diff(got, want)
        };
        for mask in &masks {
            let diff = outputs(&att, mask);
            assert!(diff > 1e-3, "an equal mix must differ from full attention (it differs by {diff})");
        }
        att.mix = Some(Param::from_tensor(Tensor::<1>::from_floats([-1.0e4, -1.0e4, 0.0], &dev)));
        for mask in &masks {
            let diff = outputs(&att, mask);
            assert!(diff < 1e-5, "the dot part alone differs from full attention by {diff}");
        }
    }

    #[test]
    fn decoding_token_by_token_equals_the_full_forward() {
        let dev = Device::flex();
        let rope = PositionConfig::Rope(RotaryConfig::default());
        let none = Positioning::NONE.config;
        let mut settings: Vec<(&str, SynthesizerConfig, &PositionConfig)> =
            variants().into_iter().map(|(name, cfg)| (name, cfg, none)).collect();
        settings.push(("mixture + rope", of(SynthesizerVariant::Mixture), &rope));
        for (name, cfg, position) in settings {
            let att = layer_with(cfg, position, &dev);
            let x = random([2, 7, D], &dev);
            let causal = AttentionMask::causal();
            let full = att.forward(AttentionInput::self_attention(x.clone(), &causal), None).context;
            let mut cache = KvCache::default();
            let prompt = AttentionInput::self_attention(x.clone().narrow(1, 0, 3), &causal);
            let mut parts = vec![att.forward(prompt, Some(&mut cache)).context];
            for i in 3..7 {
                let mask = AttentionMask::causal().at(i, 0);
                let step = AttentionInput::self_attention(x.clone().narrow(1, i, 1), &mask);
                parts.push(att.forward(step, Some(&mut cache)).context);
            }
            let diff = max_diff(full, Tensor::cat(parts, 1));
            assert!(diff < 1e-5, "{name}: cached decoding differs from the full forward by {diff}");
        }
    }

    #[test]
    fn positions_past_the_table_read_its_last_row_and_column() {
        // one query at position ℓ + 1 over keys at ℓ − 2 … ℓ + 1: row ℓ − 1, columns ℓ − 2, ℓ − 1, ℓ − 1, ℓ − 1
        let dev = Device::flex();
        let att = layer(SynthesizerConfig { trainable: false, ..of(SynthesizerVariant::Random) }, &dev);
        let l = CONTEXT;
        let mask = AttentionMask::causal().at(l + 1, l - 2);
        let input = AttentionInput::cross_attention(random([1, 1, D], &dev), random([1, 4, D], &dev), &mask);
        let got = host(att.forward(input.with_weights(), None).weights.unwrap());
        let r = host(att.random.as_ref().unwrap().first.val());
        for h in 0..4 {
            let row = |col: usize| (r[(h * l + l - 1) * l + col] as f64).exp();
            let e = [row(l - 2), row(l - 1), row(l - 1), row(l - 1)];
            let z: f64 = e.iter().sum();
            for j in 0..4 {
                let g = got[h * 4 + j] as f64;
                assert!((g - e[j] / z).abs() < 1e-5, "head {h}, key {j}: {g} instead of {}", e[j] / z);
            }
        }
    }
}
