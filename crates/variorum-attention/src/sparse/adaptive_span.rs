//! Adaptive attention span (Sukhbaatar et al. 2019), the `adaptive-span` kind:
//!
//! m_z(x) = clamp((R + z − x) / R, 0, 1),   a_tr = m_z(t − r) exp(s_tr) / Σ_q m_z(t − q) exp(s_tq),
//!
//! multi-head attention whose weights fade to zero over a ramp of R positions beyond a learned
//! span z per head (z ∈ [0, S], stored as z/S). The loss gets the paper's
//!
//! λ/M · Σ_{i=1..M} z_i,
//!
//! the mean over the M heads of a layer (`adaptive_span` auxiliary loss), so heads keep long
//! spans only where they pay. As in the paper's code, the stored z/S is clamped to [0, 1] after
//! every optimizer step ([`AttentionMechanism::after_optimizer_step`]): the mask always reaches
//! the query itself (m_z(0) ≥ 1 for z ≥ 0), so no head can be pushed so far below zero that all
//! its weights, and its gradients, vanish. Keys further
//! back than the current largest span plus the ramp are never projected or scored: the work falls
//! as spans shrink (with a memory, `model.memory.length` should be about S).
//!
//! Dynamic variant (`dynamic = true`): z_t = S·σ(vᵀx_t + b) per head and query position; the
//! penalty is λ times the mean over heads and positions of z_t. Keys are then trimmed at S.

use burn::module::Param;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, softmax};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};
use variorum_position::{PositionConfig, RotaryConfig};

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::config::MultiHeadAttentionConfig;
use crate::engine::heads::MultiHeadAttention;
use crate::engine::normaliser::MASKED_SCORE;
use crate::kind::{AttentionKind, AttentionMechanism, Learned, TestVariant, caps};

attention_config! {
    /// `model.attention` with `kind = "adaptive-span"`.
    pub struct AdaptiveSpanConfig [n_heads, n_kv_heads, head_dim, dropout, bias] {
        /// S, the largest span. Default 256.
        pub max_span: usize = 256,
        /// R, the length of the soft ramp. Default 32 (the paper's).
        pub ramp: usize = 32,
        /// Initial span as a fraction of S. Default 0 (the paper's: spans grow where useful).
        pub init_span: f64 = 0.0,
        /// λ of the L1 penalty on spans (per token of span). Default 2e-6 (the paper's).
        pub penalty: f64 = 2e-6,
        /// Predict the span from each position's input instead of learning one per head.
        pub dynamic: bool = false,
    }
}

impl AdaptiveSpanConfig {
    /// The multi-head attention it is built on, softmax-normalised: the soft mask reweights softmax's distribution and
    /// renormalises it (the paper's definition), which has no meaning for the other normalisers.
    pub fn heads(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig { bias: self.bias, ..self.head_fields().into() }
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
    ) -> AdaptiveSpanAttention {
        let n_heads = self.n_heads;
        AdaptiveSpanAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            span: Param::from_tensor(Tensor::full([n_heads], self.init_span, device)),
            predictor: self.dynamic.then(|| {
                LinearConfig::new(d_model, n_heads)
                    .with_initializer(Initializer::Normal { mean: 0.0, std: init_std })
                    .init(device)
            }),
            max_span: self.max_span,
            ramp: self.ramp,
            penalty: self.penalty,
        }
    }
}

impl AttentionKind for AdaptiveSpanConfig {
    type Module = AdaptiveSpanAttention;
    const SUMMARY: &'static str = "multi-head attention with a learned soft span per head (or per token), L1 penalty, keys beyond the span not computed";
    const PAPER: &'static str = "Sukhbaatar et al. 2019, Adaptive Attention Span in Transformers";
    const CAPS: Capabilities = Capabilities { bidirectional: false, aux_losses: true, ..caps::SCORES };
    head_kind_items!();

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.max_span > 0 && self.ramp > 0, || "model.attention.max_span and ramp must be at least 1".into())?;
        check((0.0..=1.0).contains(&self.init_span), || {
            format!("model.attention.init_span = {} is a fraction of max_span, in [0, 1]", self.init_span)
        })?;
        check(self.penalty >= 0.0, || "model.attention.penalty must be >= 0".into())
    }

    /// Full attention's FLOPs over at most S keys back.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, len_k.min(self.max_span))
    }

    /// The span each head learned.
    fn shows_what_it_learned(&self) -> bool {
        true
    }

    /// Spans shorter than the sequence, so trimming and the soft mask both act.
    fn test_variants() -> Vec<TestVariant<Self>> {
        [false, true]
            .map(|dynamic| {
                let span = Self { max_span: 6, ramp: 2, init_span: 0.5, dynamic, ..Default::default() };
                TestVariant::new(format!("dynamic={dynamic}"), span)
                    .with_position(PositionConfig::Rope(RotaryConfig::default()))
            })
            .into()
    }
}

/// An adaptive-span layer ([`AdaptiveSpanConfig`]): multi-head attention whose weights fade
/// out beyond a learned span per head (or per token).
#[derive(Module, Debug)]
pub struct AdaptiveSpanAttention {
    /// The softmax multi-head attention the soft mask reweights.
    pub attention: MultiHeadAttention,
    /// z / S per head (used clamped to [0, 1]).
    pub span: Param<Tensor<1>>,
    /// Dynamic spans: x_t → S·σ(vᵀx_t + b) per head.
    pub predictor: Option<Linear>,
    /// S, the largest span.
    pub max_span: usize,
    /// R, the length of the soft ramp.
    pub ramp: usize,
    /// λ of the L1 penalty on spans.
    pub penalty: f64,
}

impl AdaptiveSpanAttention {
    /// The learned spans z_h in positions (static spans; the dynamic variant's are per token).
    pub fn spans(&self) -> Vec<f32> {
        let z = self.span.val().clamp(0.0, 1.0).mul_scalar(self.max_span as f64);
        z.into_data().try_to_vec::<f32>().unwrap_or_default()
    }

    /// How far back any query can see now: the largest span plus the ramp, at most S.
    fn reach(&self) -> usize {
        if self.predictor.is_some() {
            return self.max_span;
        }
        let widest = self.spans().into_iter().fold(0f32, f32::max);
        (widest.ceil() as usize + self.ramp).min(self.max_span)
    }

    /// Attention under the soft span mask, `[b, len_q, d_model]`, and the `adaptive_span` loss.
    /// Keys beyond the reach are never scored, and dropped from `cache`.
    pub fn forward(&self, input: AttentionInput, mut cache: Option<&mut KvCache>) -> AttentionOutput {
        let device = input.query.device();
        let mask = input.mask;
        let lq = input.query.dims()[1];
        let reach = self.reach();
        // the earliest position any query may attend to; older keys are not computed at all
        let first = mask.q_start.saturating_sub(reach);
        let (key_value, mask) = match input.key_value {
            Some(kv) => {
                let n = kv.dims()[1];
                let drop = first.saturating_sub(mask.k_start).min(n.saturating_sub(lq));
                (Some(kv.narrow(1, drop, n - drop)), AttentionMask { k_start: mask.k_start + drop, ..mask.clone() })
            }
            None => (None, mask.clone()),
        };
        if let Some(c) = cache.as_deref_mut() {
            c.drop_front(first.saturating_sub(mask.k_start + c.start));
        }
        let query = input.query;
        let p = self.attention.project(query.clone(), key_value, &mask, cache);
        let layout = p.layout;
        let (lk, h) = (layout.len_k, p.q_dims()[1]);
        let scores = self.attention.scores(&p);
        let causal = AttentionMask { k_start: layout.k_start, ..mask.clone() }.score_mask(lq, lk, &device);
        let scores = match causal {
            Some(m) => scores.mask_fill(m, MASKED_SCORE),
            None => scores,
        };

        // the soft mask m_z(t − r), `[1 or b, h, lq, lk]`, and the span penalty
        let (s, r) = (self.max_span as f64, self.ramp as f64);
        let distance = layout.values(|d| d as f32, &device).unsqueeze_dim::<3>(0).unsqueeze_dim::<4>(0);
        let (z, penalty) = match &self.predictor {
            Some(pred) => {
                let z = sigmoid(pred.forward(query)).mul_scalar(s).swap_dims(1, 2).unsqueeze_dim::<4>(3); // [b, h, lq, 1]
                let penalty = z.clone().mean().mul_scalar(self.penalty).reshape([1]);
                (z, penalty)
            }
            None => {
                // z as stored (clamped to [0, 1] after each optimizer step, as the paper's code
                // does), so a span at 0 still gets the gradient that can make it grow
                let p = self.span.val();
                let penalty = p.clone().mul_scalar(s).mean().mul_scalar(self.penalty).reshape([1]);
                (p.mul_scalar(s).reshape([1, h, 1, 1]), penalty)
            }
        };
        let soft = ((z - distance).add_scalar(r).div_scalar(r)).clamp(0.0, 1.0);
        let probs = softmax(scores, 3) * soft;
        let probs = probs.clone() / probs.sum_dim(3).add_scalar(1e-8);
        let weights = input.need_weights.then(|| probs.clone());
        let context = self.attention.combine(self.attention.dropout.forward(probs), &p);
        AttentionOutput { context, weights, aux_losses: vec![("adaptive_span".into(), penalty)] }
    }
}

impl AttentionMechanism for AdaptiveSpanAttention {
    kv_cache_hooks!();

    /// The span of every head, in positions (the static ones, unused by a dynamic layer).
    fn learned(&self) -> Option<Learned> {
        let dynamic = match self.predictor.is_some() {
            true => "; dynamic spans are per token, these are the unused static ones",
            false => "",
        };
        let spans: Vec<String> = self.spans().iter().map(|z| format!("{z:.1}")).collect();
        Some(Learned {
            title: format!("learned span per head (positions, at most {}, ramp {}{dynamic})", self.max_span, self.ramp),
            line: spans.join("  "),
        })
    }

    /// The paper's `clamp_param`: z/S back into [0, 1] after the step moved it.
    fn after_optimizer_step(&mut self, _step: usize) {
        self.span = self.span.clone().map(|z| {
            let grad = z.is_require_grad();
            let z = z.clamp(0.0, 1.0).detach();
            if grad { z.require_grad() } else { z }
        });
    }

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.attention.content_only(query, key_value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn random(shape: [usize; 3], dev: &Device) -> Tensor<3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
    }

    fn build(init_span: f64, dev: &Device) -> AdaptiveSpanAttention {
        let cfg = AdaptiveSpanConfig { max_span: 8, ramp: 2, init_span, ..Default::default() };
        cfg.validate(16).unwrap();
        cfg.init(16, 0.3, 0.3, Positioning::NONE, dev)
    }

    #[test]
    fn soft_mask_follows_the_formula() {
        // z = 0.5·8 = 4, R = 2: weights ∝ m(x) exp(s) with m = 1 up to distance 4, 0.5 at 5, 0 from 6
        let dev = Device::flex();
        let attn = build(0.5, &dev);
        let kv = random([1, 9, 16], &dev);
        let mask = AttentionMask::causal().at(8, 0);
        let out = attn.forward(
            AttentionInput::cross_attention(kv.clone().narrow(1, 8, 1), kv.clone(), &mask).with_weights(),
            None,
        );
        let w = out.weights.unwrap();
        // keys further back than z + R = 6 were trimmed away: 7 keys (distances 6..0) remain
        assert_eq!(w.dims()[3], 7);
        let plain = attn.attention.forward(
            AttentionInput::cross_attention(
                kv.clone().narrow(1, 8, 1),
                kv.narrow(1, 2, 7),
                &AttentionMask::causal().at(8, 2),
            )
            .with_weights(),
            None,
        );
        let p = plain.weights.unwrap().into_data().try_to_vec::<f32>().unwrap();
        let got = w.into_data().try_to_vec::<f32>().unwrap();
        for head in 0..4 {
            let row = &p[head * 7..head * 7 + 7];
            let m = [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]; // distances 6, 5, 4, …, 0
            let norm: f32 = row.iter().zip(m).map(|(a, b)| a * b).sum();
            for j in 0..7 {
                let want = row[j] * m[j] / norm;
                assert!(
                    (got[head * 7 + j] - want).abs() < 1e-5,
                    "head {head} key {j}: {} vs {want}",
                    got[head * 7 + j]
                );
            }
        }
    }

    #[test]
    fn at_the_largest_span_it_is_plain_causal_attention() {
        let dev = Device::flex();
        let attn = build(1.0, &dev);
        let x = random([2, 8, 16], &dev);
        let mask = AttentionMask::causal();
        let a = attn.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        let b = attn.attention.forward(AttentionInput::self_attention(x, &mask), None).context;
        assert!((a - b).abs().max().into_scalar::<f32>() < 1e-5);
    }

    #[test]
    fn a_span_at_zero_still_gets_gradient_from_the_output() {
        // spans start at 0 (the paper's default); they must be able to grow
        let dev = Device::flex().autodiff();
        let attn = build(0.0, &dev);
        let x = random([1, 6, 16], &dev);
        let out = attn.forward(AttentionInput::self_attention(x, &AttentionMask::causal()), None);
        let grads = out.context.powf_scalar(2.0).sum().backward();
        let g = attn.span.grad(&grads).unwrap().abs().sum().into_scalar::<f32>();
        assert!(g > 0.0, "no gradient reaches a zero span");
    }

    #[test]
    fn the_penalty_gradient_reaches_the_span() {
        let dev = Device::flex().autodiff();
        let attn = build(0.5, &dev);
        let x = random([1, 4, 16], &dev);
        let out = attn.forward(AttentionInput::self_attention(x, &AttentionMask::causal()), None);
        let (_, penalty) = &out.aux_losses[0];
        let grads = penalty.backward();
        let g = attn.span.grad(&grads).unwrap().into_data().try_to_vec::<f32>().unwrap();
        // the paper's λ/M Σ_i z_i with z = S·p: d/dp = λ·S/M for each of the M = 4 heads, a
        // quarter of a sum over heads
        for v in g {
            assert!((v - 2e-6 * 8.0 / 4.0).abs() < 1e-10, "{v}");
        }
    }

    #[test]
    fn the_penalty_is_the_mean_span_over_heads() {
        let dev = Device::flex();
        let mut attn = build(0.5, &dev);
        attn.span = Param::from_tensor(Tensor::from_floats([0.25, 0.5, 0.75, 1.0], &dev));
        let out =
            attn.forward(AttentionInput::self_attention(random([1, 4, 16], &dev), &AttentionMask::causal()), None);
        let penalty = out.aux_losses[0].1.clone().into_scalar::<f32>();
        // λ · mean(z) = 2e-6 · 8 · 0.625
        assert!((penalty - 2e-6 * 8.0 * 0.625).abs() < 1e-10, "{penalty}");
    }

    /// A step that pushes a span far below zero must not kill the head: after the hook every
    /// query still attends to itself, and the span still gets gradient.
    #[test]
    fn spans_are_clamped_after_each_step_and_no_head_dies() {
        let dev = Device::flex().autodiff();
        let mut attn = build(0.5, &dev);
        attn.span = Param::from_tensor(Tensor::from_floats([-3.0, 0.5, 1.7, 0.2], &dev));
        attn.after_optimizer_step(1);
        assert_eq!(attn.span.val().into_data().try_to_vec::<f32>().unwrap(), vec![0.0, 0.5, 1.0, 0.2]);
        let x = random([1, 6, 16], &dev);
        let mask = AttentionMask::causal();
        let out = attn.forward(AttentionInput { need_weights: true, ..AttentionInput::self_attention(x, &mask) }, None);
        let w = out.weights.unwrap(); // [1, h, 6, 6]
        let own = w.clone().narrow(1, 0, 1).reshape([6, 6]).into_data().try_to_vec::<f32>().unwrap();
        // z = 0 with R = 2: m(0) = 1, m(1) = 0.5, m(d ≥ 2) = 0, so each row is still a
        // distribution over the query itself and the one before it (how much of each depends on
        // the random scores, so only positivity is asserted)
        for i in 0..6 {
            let row = &own[i * 6..i * 6 + 6];
            let sum: f32 = row.iter().sum();
            assert!((sum - 1.0).abs() < 1e-4, "head 0 row {i} sums to {sum}, not 1: the head died");
            assert!(row[i] > 0.0, "head 0 no longer attends to position {i} itself");
            for (j, &v) in row.iter().enumerate().take(i.saturating_sub(1)) {
                assert_eq!(v, 0.0, "head 0, query {i} attends to key {j} beyond its zero span");
            }
        }
        let grads = out.context.powf_scalar(2.0).sum().backward();
        let g = attn.span.grad(&grads).unwrap().into_data().try_to_vec::<f32>().unwrap();
        assert!(g[0] != 0.0, "the clamped span gets no gradient");
    }
}
