//! The modern Hopfield layer (Ramsauer et al. 2020, "Hopfield Networks is All You Need"), the
//! `hopfield` kind. A state pattern ξ retrieves from stored patterns Y (as columns) by the update
//!
//! ξ_new = Y softmax(β Yᵀ ξ),
//!
//! iterated to a fixed point (one update already retrieves a pattern when the stored ones are well
//! separated). As a layer (the paper's `Hopfield`, eqs. 10–12) the state patterns are the queries
//! R and both sides are projected, per head h:
//!
//! Q = R W_Q,   K = Y W_K,   V = Y W_V,
//! ξ⁰ = Q,   ξ^{t+1} = softmax(β ξ^t Kᵀ + M) K   (t < steps − 1),
//! head = softmax(β ξ^{last} Kᵀ + M) V,   output = [head_1; …; head_H] W_O,
//!
//! where M is −∞ on hidden keys (later positions under a causal mask, padding, custom patterns),
//! applied at every iteration. With `steps = 1` and β = 1/√d_h this is exactly multi-head
//! attention (`full`), and the projections have `full`'s layout: one fused [Q | K | V] matrix
//! ([`QkvProjection`]) and W_O, so weights move between the two kinds.
//!
//! Choices where the paper leaves one open:
//! - V = Y W_V, as attention has it, rather than the paper's V = Y W_K W_V: the product of two
//!   learned matrices is one learned matrix, and this keeps the one-step equivalence with
//!   attention exact, weights included.
//! - The iteration runs in the key space: ξ is a query and is updated to a convex combination of
//!   keys, as eq. (10) updates R W_Q; only the last retrieval reads the values.
//! - β defaults to 1/√d_h (the paper's choice for the layer). Small β gives metastable states near
//!   the keys' mean, large β retrieves single patterns.
//! - `tolerance = ε` stops a query (per head) once an update moved its ξ by less than ε in every
//!   component; it keeps that ξ while the others go on. Stopping per query, not once the whole
//!   batch has settled, keeps a query's result a function of its own keys alone: later tokens and
//!   other rows of the batch cannot change how many updates it gets (causality holds exactly).
//!   Cached decoding forms the same products at other shapes, so a query whose change lands
//!   within rounding of ε may stop one update apart from the full forward: the generic harness
//!   runs no tolerance variant, and the module's decoding test picks ε far from any change. One
//!   scalar is read per update, to end the loop.
//! - Gradients flow through every update (no implicit differentiation at the fixed point).
//! - Dropout acts on the final retrieval's weights only; the updates of ξ are deterministic.
//! - `patterns = n` is the paper's `HopfieldLayer` lookup: n learned stored patterns Y ∈ ℝ^{n×d}
//!   (a parameter, projected by the layer's own W_K and W_V, so the layout stays `full`'s), the
//!   same for every query. Y is initialised N(0, 1), not N(0, init_std²): it stands where the
//!   layer-normed inputs stand in the mixer, so its keys and values start at the scale of the
//!   mixer's (at init_std the biases would dominate and every pattern would start alike). No
//!   token mixing: each row's output depends on that row alone, so the lookup is trivially causal
//!   and decodes without state; a cross-attention source is ignored (the stored patterns are the
//!   keys).
//! - Position schemes: the updates move ξ through the key space, where a rotation (RoPE) or a bias
//!   by distance would have to be reapplied at every step with no paper to say how; none is
//!   supported (`score_bias` and `qk_rotation` false: use an absolute scheme). No memory of
//!   earlier segments (`reads_memory: false`).
//! - Cost: `steps` times attention's score and weighted-sum work; the mixer forms `steps` L × L
//!   matrices per head, the lookup L × n.

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_position::HeadShape;

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::config::MultiHeadAttentionConfig;
use crate::engine::heads::concat_heads;
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::qkv::normal_linear;
use crate::engine::qkv::{QkvProjection, QkvProjectionConfig};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "hopfield"`.
    pub struct HopfieldConfig [n_heads, head_dim, dropout, bias] {
        /// β, the inverse temperature of every retrieval softmax(β ξ Kᵀ); positive and finite.
        /// Default 1/√head_dim (with `steps = 1`, exactly full attention).
        pub beta: Option<f64> = None,
        /// Retrievals per query: `steps − 1` updates of the state pattern ξ in the key space, then
        /// the one over the values. Default 1 (attention).
        pub steps: usize = 1,
        /// ε: a query stops updating once an update moved its ξ by less than ε in every component
        /// (at most `steps − 1` updates). Default none: exactly `steps − 1` updates.
        pub tolerance: Option<f64> = None,
        /// n learned stored patterns every query retrieves from alone (the paper's
        /// `HopfieldLayer`: a lookup, no token mixing). Default none: the stored patterns are the
        /// sequence's rows (or the cross-attention source's), a token mixer.
        pub patterns: Option<usize> = None,
    }
}

impl HopfieldConfig {
    /// β, its default written out: 1/√d_h.
    pub fn beta(&self, d_model: usize) -> f64 {
        self.beta.unwrap_or_else(|| 1.0 / (self.head_shape(d_model).head_dim as f64).sqrt())
    }

    /// `init_std` for W_Q, W_K, W_V; `out_std` for W_O (as `full`).
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> HopfieldAttention {
        let HeadShape { n_heads: h, head_dim: dh, .. } = self.head_shape(d_model);
        let stored = |n: usize| Tensor::<2>::random([n, d_model], Distribution::Normal(0.0, 1.0), device);
        HopfieldAttention {
            qkv: QkvProjectionConfig::new(d_model, h, h, dh).with_bias(self.bias).with_init_std(init_std).init(device),
            out: normal_linear(h * dh, d_model, self.bias, out_std, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            patterns: self.patterns.map(|n| Param::from_tensor(stored(n))),
            beta: self.beta(d_model),
            steps: self.steps,
            tolerance: self.tolerance,
        }
    }
}

impl AttentionKind for HopfieldConfig {
    type Module = HopfieldAttention;
    const SUMMARY: &'static str = "modern Hopfield layer: each query's state pattern iterated ξ ← softmax(β ξ Kᵀ) K toward a fixed point, then softmax(β ξ Kᵀ) V; over the sequence (token mixer, KV cache) or n learned stored patterns (lookup); steps = 1 is attention";
    const PAPER: &'static str = "Ramsauer et al. 2020, Hopfield Networks is All You Need";
    // the updates move queries through the key space: no rotation or score bias acts on them
    const CAPS: Capabilities = Capabilities { reads_memory: false, cross: true, ..caps::NO_SCORES };

    fn expanded(&self, d_model: usize) -> Self {
        Self { beta: Some(self.beta(d_model)), ..self.expanded_heads(d_model) }
    }

    /// The lookup's stored patterns replace a cross-attention source (the mixer retrieves from it).
    fn capabilities(&self) -> Capabilities {
        Capabilities { cross: self.patterns.is_none() && Self::CAPS.cross, ..Self::CAPS }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        // the head checks of `full`, dropout included
        MultiHeadAttentionConfig::from(self.head_fields()).validate(d_model)?;
        if let Some(beta) = self.beta {
            check(beta.is_finite() && beta > 0.0, || {
                format!("model.attention.beta = {beta} must be positive and finite (leave it out for 1/√head_dim)")
            })?;
        }
        check(self.steps >= 1, || {
            format!("model.attention.steps = {} must be at least 1 (1 is attention)", self.steps)
        })?;
        if let Some(eps) = self.tolerance {
            check(eps.is_finite() && eps > 0.0, || {
                format!("model.attention.tolerance = {eps} must be positive and finite (or leave it out)")
            })?;
            check(self.steps >= 2, || {
                format!(
                    "model.attention.tolerance = {eps} stops the updates of ξ early, and steps = {} makes none: set steps to at least 2, or remove it",
                    self.steps
                )
            })?;
        }
        check(self.patterns != Some(0), || {
            "model.attention.patterns = 0 must be at least 1 (or leave it out: the stored patterns are then the sequence)"
                .into()
        })
    }

    head_settings_hooks!();

    /// 2 FLOPs per multiply–add: the projections (W_Q and W_O only for the lookup, whose stored
    /// patterns are projected once per batch row and forward, not per token), then per step the scores and the
    /// weighted sum (of keys for an update, of values for the output) over `len_k` keys, or over
    /// the n stored patterns for the lookup.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let shape = self.head_shape(d_model);
        let (d, hd, steps) = (d_model as u64, (shape.n_heads * shape.head_dim) as u64, self.steps as u64);
        match self.patterns {
            Some(n) => 2 * (2 * d * hd) + steps * 2 * 2 * hd * n as u64,
            None => 2 * (4 * d * hd) + steps * 2 * 2 * hd * len_k as u64,
        }
    }

    fn scores_every_key(&self) -> bool {
        self.patterns.is_none()
    }

    fn build(&self, init: &LayerInit, device: &Device) -> HopfieldAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        let mixer = |steps, tolerance| Self { steps, tolerance, ..Default::default() };
        vec![
            TestVariant::new("mixer, one step (attention)", mixer(1, None)),
            TestVariant::new("mixer, 3 steps", mixer(3, None)),
            TestVariant::new("lookup, 8 patterns, 2 steps", Self { patterns: Some(8), steps: 2, ..Default::default() }),
            TestVariant::new("mixer, 3 steps, bidirectional", mixer(3, None)).masked(),
        ]
    }
}

/// The modern Hopfield layer: each query's ξ updated `steps − 1` times in the key space, then
/// retrieved over the values; from the sequence (a token mixer) or from `patterns` (a lookup).
#[derive(Module, Debug)]
pub struct HopfieldAttention {
    /// W_Q, W_K, W_V fused as in `full`: columns [Q | K | V], `[d_model, 3 · n_heads · d_h]`.
    pub qkv: QkvProjection,
    /// W_O.
    pub out: Linear,
    /// On the final retrieval's weights only.
    pub dropout: Dropout,
    /// Y, `[n, d_model]`: the learned stored patterns of the lookup; `None` for the token mixer.
    pub patterns: Option<Param<Tensor<2>>>,
    /// β.
    pub beta: f64,
    /// Retrievals per query (`steps − 1` updates of ξ, then the output).
    pub steps: usize,
    /// ε of the per-query early stop.
    pub tolerance: Option<f64>,
}

/// Queries ξ⁰, keys and values `[b, h, len, d_h]`, and the hidden (query, key) pairs
/// `[b, h, len_q, len_k]` where any are.
type Retrieval = (Tensor<4>, Tensor<4>, Tensor<4>, Option<Tensor<4, Bool>>);

impl HopfieldAttention {
    /// The lookup: queries from `query`, keys and values from the stored patterns (the same for
    /// every row of the batch); nothing hidden.
    fn from_patterns(&self, query: Tensor<3>, patterns: Tensor<2>) -> Retrieval {
        let b = query.dims()[0];
        let [n, d] = patterns.dims();
        let (q, k, v) = self.qkv.cross_attention(query, patterns.unsqueeze_dim::<3>(0).expand([b, n, d]));
        (q, k, v, None)
    }

    /// The token mixer: queries from `query`, keys and values from `key_value` (the queries' own
    /// rows for self-attention) after the cached ones, and the mask over them.
    fn from_sequence(
        &self,
        query: Tensor<3>,
        key_value: Option<Tensor<3>>,
        mask: &AttentionMask,
        cache: Option<&mut KvCache>,
    ) -> Retrieval {
        let (q, k, v) = match key_value {
            None => self.qkv.self_attention(query),
            Some(source) => self.qkv.cross_attention(query, source),
        };
        let dropped = cache.as_ref().map_or(0, |c| c.start);
        let (k, v) = match cache {
            Some(c) => c.append(k, v),
            None => (k, v),
        };
        let [b, h, lq, _] = q.dims();
        let lk = k.dims()[2];
        let hidden = AttentionMask { k_start: mask.k_start + dropped, ..mask.clone() }
            .score_mask(lq, lk, &q.device())
            .map(|m| m.expand([b, h, lq, lk]));
        (q, k, v, hidden)
    }

    /// softmax(β ξ Kᵀ + M) over the keys, `[b, h, len_q, len_k]`.
    fn weights(&self, xi: Tensor<4>, k: &Tensor<4>, hidden: Option<&Tensor<4, Bool>>) -> Tensor<4> {
        let scores = xi.mul_scalar(self.beta).matmul(k.clone().swap_dims(2, 3));
        let scores = match hidden {
            Some(m) => scores.mask_fill(m.clone(), MASKED_SCORE),
            None => scores,
        };
        softmax(scores, 3)
    }

    /// One update of the state patterns `[b, h, len_q, d_h]`: ξ ← softmax(β ξ Kᵀ + M) K.
    pub(crate) fn update(&self, xi: Tensor<4>, k: &Tensor<4>, hidden: Option<&Tensor<4, Bool>>) -> Tensor<4> {
        self.weights(xi, k, hidden).matmul(k.clone())
    }

    /// The retrieved state patterns from ξ⁰ = `xi`: `steps − 1` updates, fewer for a query (per
    /// head) whose update moved its ξ by less than the tolerance, which keeps it from then on;
    /// and how many rounds of updates ran.
    pub(crate) fn retrieve(
        &self,
        xi: Tensor<4>,
        k: &Tensor<4>,
        hidden: Option<&Tensor<4, Bool>>,
    ) -> (Tensor<4>, usize) {
        let rounds = self.steps.saturating_sub(1);
        let mut xi = xi;
        // [b, h, len_q, 1]: the queries that have stopped
        let mut settled: Option<Tensor<4, Bool>> = None;
        for round in 1..=rounds {
            let next = self.update(xi.clone(), k, hidden);
            let Some(eps) = self.tolerance else {
                xi = next;
                continue;
            };
            let shape = next.dims();
            let small = (next.clone() - xi.clone()).abs().max_dim(3).lower_elem(eps);
            xi = match &settled {
                // a settled query keeps its ξ, however long the others go on
                Some(s) => next.mask_where(s.clone().expand(shape), xi),
                None => next,
            };
            let now = match settled {
                Some(s) => s.bool_or(small),
                None => small,
            };
            if now.clone().all().into_scalar::<bool>() {
                return (xi, round);
            }
            settled = Some(now);
        }
        (xi, rounds)
    }

    /// The retrieval for `input.query`, with its weights `[b, h, len_q, len_k]` when asked for.
    /// The mixer's keys follow `cache`'s; the lookup reads neither `cache` nor a source.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let AttentionInput { query, key_value, mask, need_weights, .. } = input;
        let (q, k, v, hidden) = match &self.patterns {
            Some(y) => self.from_patterns(query, y.val()),
            None => self.from_sequence(query, key_value, mask, cache),
        };
        let (xi, _) = self.retrieve(q, &k, hidden.as_ref());
        let probs = self.weights(xi, &k, hidden.as_ref());
        let weights = need_weights.then(|| probs.clone());
        let heads = concat_heads(self.dropout.forward(probs).matmul(v));
        let context = variorum_kernels::linear::forward(&self.out, heads);
        AttentionOutput { context, weights, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for HopfieldAttention {
    /// Decoding state: the mixer's [`KvCache`]; the lookup keeps none (its keys are the stored
    /// patterns).
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        let cache = if self.patterns.is_some() { None } else { state.map(AttentionState::kv_mut) };
        HopfieldAttention::forward(self, input, cache)
    }

    fn extend_cache(&self, x: Tensor<3>, _mask: &AttentionMask, state: &mut AttentionState) {
        if self.patterns.is_none() {
            let (k, v) = self.qkv.keys_values(x);
            state.kv_mut().append(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::heads::MultiHeadAttention;
    use crate::engine::normaliser::ScoreNormaliser;

    const D: usize = 16;

    fn layer_at(cfg: HopfieldConfig, init_std: f64, dev: &Device) -> HopfieldAttention {
        cfg.validate(D).unwrap();
        dev.seed(3);
        cfg.init(D, init_std, init_std, dev)
    }

    fn layer(cfg: HopfieldConfig, dev: &Device) -> HopfieldAttention {
        layer_at(cfg, 0.3, dev)
    }

    fn mixer(steps: usize, tolerance: Option<f64>) -> HopfieldConfig {
        HopfieldConfig { steps, tolerance, ..Default::default() }
    }

    fn random(shape: [usize; 3], dev: &Device) -> Tensor<3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
    }

    fn max_diff<const N: usize>(a: Tensor<N>, b: Tensor<N>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    fn run(att: &HopfieldAttention, x: Tensor<3>, mask: &AttentionMask) -> Tensor<3> {
        HopfieldAttention::forward(att, AttentionInput::self_attention(x, mask), None).context
    }

    /// `x` with position `at` of every row replaced by fresh noise.
    fn change(x: Tensor<3>, at: usize, dev: &Device) -> Tensor<3> {
        let [b, _, d] = x.dims();
        x.slice_assign([0..b, at..at + 1, 0..d], random([b, 1, d], dev))
    }

    #[test]
    fn one_step_with_the_default_beta_is_full_attention_outputs_and_gradients() {
        let dev = Device::flex().autodiff();
        let att = layer(HopfieldConfig::default(), &dev);
        // full attention with the same fused W_Q, W_K, W_V and the same W_O
        let full = MultiHeadAttention {
            qkv: att.qkv.clone(),
            position: None,
            out: att.out.clone(),
            dropout: DropoutConfig::new(0.0).init(),
            normaliser: ScoreNormaliser::softmax(),
            losses: Default::default(),
            scale: 1.0 / (att.qkv.head_dim as f64).sqrt(),
        };
        assert_eq!(att.beta, full.scale, "the default β is 1/√d_h");
        let x0 = random([2, 7, D], &dev);
        let mask = AttentionMask::causal();
        let with_grad = |f: &dyn Fn(Tensor<3>) -> Tensor<3>| {
            let x = x0.clone().require_grad();
            let out = f(x.clone());
            let grads = out.clone().powf_scalar(2.0).sum().backward();
            (out.inner(), x.grad(&grads).unwrap())
        };
        let (hop, g_hop) = with_grad(&|x| run(&att, x, &mask));
        let (mha, g_mha) = with_grad(&|x| full.forward(AttentionInput::self_attention(x, &mask), None).context);
        let d = max_diff(hop, mha.clone());
        assert!(d < 1e-5, "one Hopfield step differs from full attention by {d}");
        let size = g_mha.clone().abs().max().into_scalar::<f32>().max(1.0);
        let d = max_diff(g_hop, g_mha) / size;
        assert!(d < 1e-5, "input gradients differ by {d} of their largest ({size})");
        // the comparison can fail: another β, or more steps, is another function
        for (what, other) in [
            ("β doubled", HopfieldAttention { beta: 2.0 * att.beta, ..att.clone() }),
            ("3 steps", HopfieldAttention { steps: 3, ..att.clone() }),
        ] {
            let d = max_diff(run(&other, x0.clone(), &mask).inner(), mha.clone());
            assert!(d > 1e-3, "{what} still equals full attention (differs by {d})");
        }
    }

    #[test]
    fn the_iteration_stops_at_a_fixed_point_within_the_tolerance() {
        // small weights keep β·(spread of the keys)² well below 1: a contraction, so every query
        // settles long before the step limit
        let dev = Device::flex();
        let eps = 1e-4;
        let att = layer_at(mixer(100, Some(eps)), 0.1, &dev);
        let mask = AttentionMask::causal();
        let (q, k, _, hidden) = att.from_sequence(random([2, 6, D], &dev), None, &mask, None);
        let moved = max_diff(att.update(q.clone(), &k, hidden.as_ref()), q.clone());
        assert!(moved > 10.0 * eps as f32, "the queries are fixed points already ({moved}): the check is blind");
        let (xi, rounds) = att.retrieve(q, &k, hidden.as_ref());
        assert!(rounds < 99, "no early stop: {rounds} rounds of updates");
        let again = max_diff(att.update(xi.clone(), &k, hidden.as_ref()), xi);
        assert!(again < eps as f32, "one more update moves the retrieved ξ by {again}, more than ε = {eps}");
    }

    #[test]
    fn a_large_beta_retrieves_the_stored_pattern_nearest_the_query() {
        let dev = Device::flex();
        let att = layer(HopfieldConfig { n_heads: 2, beta: Some(2.0), steps: 3, ..Default::default() }, &dev);
        // four well-separated stored keys, 3·e_{2j} in 8 dimensions, one head
        let mut keys = vec![0.0f32; 4 * 8];
        for j in 0..4 {
            keys[j * 8 + 2 * j] = 3.0;
        }
        let k = Tensor::<4>::from_data(TensorData::new(keys, [1, 1, 4, 8]), &dev);
        let target = k.clone().narrow(2, 2, 1);
        let query = target.clone() + Tensor::<4>::random([1, 1, 1, 8], Distribution::Normal(0.0, 0.3), &dev);
        assert!(max_diff(query.clone(), target.clone()) > 0.05, "the query is the pattern already");
        let (xi, _) = att.retrieve(query.clone(), &k, None);
        let err = max_diff(xi, target.clone());
        assert!(err < 1e-3, "retrieved ξ is {err} from the nearest stored pattern");
        // a small β averages the patterns instead (metastable state near their mean)
        let soft = HopfieldAttention { beta: 0.01, ..att.clone() };
        let (mean, _) = soft.retrieve(query, &k, None);
        let far = max_diff(mean, target);
        assert!(far > 1.0, "β = 0.01 retrieved the pattern too ({far}): the check is blind");
    }

    #[test]
    fn no_output_depends_on_a_later_row() {
        let dev = Device::flex();
        let t = 4;
        for (name, cfg) in [("3 steps", mixer(3, None)), ("8 steps, tolerance", mixer(8, Some(1e-3)))] {
            let att = layer(cfg, &dev);
            let x = random([2, 7, D], &dev);
            let changed = change(x.clone(), t, &dev);
            let causal = AttentionMask::causal();
            let (a, b) = (run(&att, x.clone(), &causal), run(&att, changed.clone(), &causal));
            let leak = max_diff(a.clone().narrow(1, 0, t), b.clone().narrow(1, 0, t));
            assert_eq!(leak, 0.0, "{name}: changing row {t} moved an earlier output");
            let own = max_diff(a.narrow(1, t, 1), b.narrow(1, t, 1));
            assert!(own > 1e-5, "{name}: row {t}'s output ignored its own input (the check is blind)");
            // bidirectionally the earlier rows do see it
            let open = AttentionMask::bidirectional();
            let seen = max_diff(run(&att, x, &open).narrow(1, 0, t), run(&att, changed, &open).narrow(1, 0, t));
            assert!(seen > 1e-5, "{name}: bidirectional rows before {t} ignored it");
        }
    }

    #[test]
    fn decoding_with_the_state_equals_the_full_forward() {
        let dev = Device::flex();
        // with a tolerance, rounding may stop a query one update earlier or later in one of the
        // two runs; that update moves ξ by less than ε, and small weights keep its effect far
        // below the bar
        let settings = [
            ("3 steps", mixer(3, None), 0.3),
            ("30 steps, tolerance", mixer(30, Some(1e-5)), 0.1),
            ("lookup, 3 steps", HopfieldConfig { patterns: Some(5), steps: 3, ..Default::default() }, 0.3),
        ];
        for (name, cfg, init_std) in settings {
            let lookup = cfg.patterns.is_some();
            let att = layer_at(cfg, init_std, &dev);
            let x = random([2, 7, D], &dev);
            let causal = AttentionMask::causal();
            let full = run(&att, x.clone(), &causal);
            let mut state = AttentionState::default();
            let prompt = AttentionInput::self_attention(x.clone().narrow(1, 0, 3), &causal);
            let mut parts = vec![AttentionMechanism::forward(&att, prompt, Some(&mut state)).context];
            for i in 3..7 {
                let mask = AttentionMask::causal().at(i, 0);
                let step = AttentionInput::self_attention(x.clone().narrow(1, i, 1), &mask);
                parts.push(AttentionMechanism::forward(&att, step, Some(&mut state)).context);
            }
            let diff = max_diff(full, Tensor::cat(parts, 1));
            assert!(diff < 1e-5, "{name}: cached decoding differs from the full forward by {diff}");
            assert_eq!(state.is_empty(), lookup, "{name}: only the mixer keeps a cache");
        }
    }

    #[test]
    fn a_lookup_row_depends_on_that_row_alone() {
        let dev = Device::flex();
        let att = layer(HopfieldConfig { patterns: Some(6), steps: 3, ..Default::default() }, &dev);
        let x = random([2, 7, D], &dev);
        let changed = change(x.clone(), 3, &dev);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let (a, b) = (run(&att, x.clone(), &mask), run(&att, changed.clone(), &mask));
            for i in 0..7 {
                let moved = max_diff(a.clone().narrow(1, i, 1), b.clone().narrow(1, i, 1));
                if i == 3 {
                    assert!(moved > 1e-5, "row 3 changed but its output did not ({moved})");
                } else {
                    assert_eq!(moved, 0.0, "row {i}'s output moved with row 3 (causal: {})", mask.causal);
                }
            }
        }
        // what it retrieves are the stored patterns: others give other outputs
        // shifted: a test beside this one can reseed the shared generator (layer_at's seed 3)
        // just before either draw, and two draws after the same seed are the same patterns
        let others = Tensor::<2>::random([6, D], Distribution::Normal(0.0, 1.0), &dev) + 0.5;
        let other = HopfieldAttention { patterns: Some(Param::from_tensor(others)), ..att.clone() };
        let mask = AttentionMask::causal();
        let d = max_diff(run(&other, x.clone(), &mask), run(&att, x, &mask));
        assert!(d > 1e-4, "other stored patterns gave the same outputs ({d})");
    }

    #[test]
    fn settings_are_checked_by_key_and_expanded() {
        let bad = [
            (HopfieldConfig { steps: 0, ..Default::default() }, "model.attention.steps = 0"),
            (HopfieldConfig { beta: Some(0.0), ..Default::default() }, "model.attention.beta"),
            (HopfieldConfig { beta: Some(f64::NAN), ..Default::default() }, "model.attention.beta"),
            (HopfieldConfig { beta: Some(f64::INFINITY), ..Default::default() }, "model.attention.beta"),
            (mixer(3, Some(-1.0)), "model.attention.tolerance"),
            (mixer(1, Some(1e-3)), "model.attention.tolerance"),
            (HopfieldConfig { patterns: Some(0), ..Default::default() }, "model.attention.patterns = 0"),
            (HopfieldConfig { n_heads: 3, ..Default::default() }, "model.attention.n_heads"),
        ];
        for (cfg, key) in bad {
            let err = cfg.validate(D).expect_err(key);
            assert!(err.0.contains(key), "{key}: {}", err.0);
        }
        for v in HopfieldConfig::test_variants() {
            v.config.validate(D).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        }
        let e = HopfieldConfig::default().expanded(D);
        assert_eq!((e.head_dim, e.beta), (Some(4), Some(0.5)));
    }
}
