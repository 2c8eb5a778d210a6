//! RealFormer, the `realformer` kind (He, Ravula, Kanagal, Ainslie 2020, RealFormer: Transformer
//! Likes Residual Attention): residual attention. Each layer's raw scores add the previous
//! layer's, so attention maps form a residual stream of their own beside the hidden states:
//!
//! S_l = Q_l K_lᵀ/√d + B_l + S_{l−1},   S_0 = 0,   head(l) = softmax(S_l + M) V_l,
//!
//! where B_l is the position scheme's bias on the scores (if any) and M the mask.
//!
//! Choices:
//! - B_l is part of S_l and is carried with it, so with an additive relative bias (ALiBi, T5)
//!   layer l's scores hold the sum of l biases (ALiBi's slopes grow by m per layer): the
//!   residual carries the scores as they were, as the paper's residual does.
//! - S_l is carried unmasked, as the paper writes it: a hidden (query, key) pair is hidden in
//!   every layer by the same mask, so what its raw score accumulates never reaches a weight.
//! - The first layer, and a layer run alone (no previous scores), is plain multi-head attention.
//!   A shared (Universal Transformer) block adds the scores of its previous application.
//! - The scores are carried from block application to block application through
//!   [`CarriedMaps`] (the model's block loop passes it on), as the autodiff graph carries them:
//!   gradients flow back through every layer's scores, as in the paper.
//! - Cached decoding: a new token's row of S_l adds the previous layer's row for the same token
//!   over the same cached keys, so decoding equals the full forward with a plain KV cache.
//! - The scores of every layer are needed, so the fused attention kernel (which never forms
//!   them) does not apply: this kind takes the composed path, like talking heads.

use burn::prelude::*;
use variorum_core::{Capabilities, ConfigError};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::engine::heads::MultiHeadAttention;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::state::CarriedMaps;

attention_config! {
    /// `model.attention` with `kind = "realformer"`.
    pub struct RealFormerConfig [n_heads, n_kv_heads, head_dim, dropout, bias, normaliser] {
    }
}

impl RealFormerConfig {
    head_methods!();

    /// The layer for `d_model`: `full`'s heads (residual attention adds no parameters).
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> RealFormerAttention {
        RealFormerAttention { attention: self.heads().init(d_model, init_std, out_std, position, device) }
    }
}

impl AttentionKind for RealFormerConfig {
    type Module = RealFormerAttention;
    const SUMMARY: &'static str = "RealFormer: residual attention, each layer's raw scores add the previous layer's (S_l = QKᵀ/√d + S_{l−1}); KV cache";
    const PAPER: &'static str = "He, Ravula, Kanagal, Ainslie 2020, RealFormer: Transformer Likes Residual Attention";
    const CAPS: Capabilities = Capabilities { cross_layer: true, ..caps::SCORES };

    head_kind_items!();

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)
    }

    /// Full attention's, plus one addition per head and key.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, len_k) + (self.n_heads * len_k) as u64
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        TestVariant::score_path(Self::default())
    }
}

/// RealFormer's residual attention: multi-head attention whose raw scores add those of the
/// layer before.
#[derive(Module, Debug)]
pub struct RealFormerAttention {
    /// Projections, position scheme and output of plain multi-head attention.
    pub attention: MultiHeadAttention,
}

/// S_l, `[b, n_heads, len_q, len_k]`: the raw scores one layer hands the next.
#[derive(Debug, Clone)]
pub struct ResidualScores(pub Tensor<4>);

impl RealFormerAttention {
    /// The layer over `input` (keys after `cache`'s), its raw scores plus those `input.carried`
    /// brings from the previous layer, and the sum handed on there.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let a = &self.attention;
        let p = a.project(input.query, input.key_value, input.mask, cache);
        let mut scores = a.scores(&p);
        if let Some(carried) = input.carried {
            if let Some(ResidualScores(previous)) = carried.take::<ResidualScores>() {
                scores = scores + previous;
            }
            carried.put(ResidualScores(scores.clone()));
        }
        let probs = a.normalise(a.mask_scores(scores, input.mask, input.dense_mask, &p));
        let weights = input.need_weights.then(|| probs.clone());
        let context = a.combine(a.dropout.forward(probs), &p);
        AttentionOutput { context, weights, aux_losses: Vec::new() }
    }

    /// The forward of one layer given the previous layer's raw scores (for tests and analysis):
    /// returns the output and this layer's scores.
    pub fn forward_after(&self, input: AttentionInput, previous: Option<Tensor<4>>) -> (AttentionOutput, Tensor<4>) {
        let mut carried = CarriedMaps::default();
        if let Some(s) = previous {
            carried.put(ResidualScores(s));
        }
        let out = self.forward(input.with_carried(&mut carried), None);
        let scores = carried.take::<ResidualScores>().expect("the forward leaves its scores").0;
        (out, scores)
    }
}

impl AttentionMechanism for RealFormerAttention {
    kv_cache_hooks!();

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use burn::tensor::activation::softmax;
    use variorum_core::AttentionMask;

    fn setup(device: &Device) -> (RealFormerAttention, Tensor<3>) {
        device.seed(11);
        let attn = RealFormerConfig::default().init(16, 0.2, 0.2, Positioning::NONE, device);
        (attn, Tensor::random([2, 6, 16], Distribution::Normal(0.0, 1.0), device))
    }

    #[test]
    fn zero_previous_scores_are_plain_multi_head_attention() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        for mask in [AttentionMask::causal(), AttentionMask::bidirectional()] {
            let plain = attn.attention.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
            let input = || AttentionInput::self_attention(x.clone(), &mask);
            let (first, _) = attn.forward_after(input(), None);
            let (zeros, _) = attn.forward_after(input(), Some(Tensor::zeros([2, 4, 6, 6], &dev)));
            for (name, out) in [("no previous scores", first.context), ("zero previous scores", zeros.context)] {
                let diff = (out - plain.clone()).abs().max().into_scalar::<f32>();
                assert!(diff < 1e-5, "{name} differ from full attention by {diff}");
            }
        }
    }

    #[test]
    fn the_previous_scores_add_to_this_layers_before_the_softmax() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        let mask = AttentionMask::causal();
        let previous = Tensor::<4>::random([2, 4, 6, 6], Distribution::Normal(0.0, 2.0), &dev);
        let (out, scores) =
            attn.forward_after(AttentionInput::self_attention(x.clone(), &mask).with_weights(), Some(previous.clone()));
        // closed form from the plain layer's own pieces
        let a = &attn.attention;
        let p = a.project(x, None, &mask, None);
        let own = a.scores(&p);
        let expected = softmax(a.mask_scores(own.clone() + previous.clone(), &mask, None, &p), 3);
        let diff = (out.weights.unwrap() - expected).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-6, "weights differ from softmax(S + S_prev) by {diff}");
        let carried = (scores - own - previous).abs().max().into_scalar::<f32>();
        assert!(carried < 1e-6, "the carried scores are not S + S_prev (off by {carried})");
    }

    #[test]
    fn carried_scores_leak_nothing_from_later_tokens() {
        let dev = Device::flex();
        let (attn, x) = setup(&dev);
        let mask = AttentionMask::causal();
        let run = |x: Tensor<3>| {
            let (first, s1) = attn.forward_after(AttentionInput::self_attention(x.clone(), &mask), None);
            let (second, _) = attn.forward_after(AttentionInput::self_attention(first.context, &mask), Some(s1));
            second.context
        };
        let before = run(x.clone());
        let changed =
            x.slice_assign([0..2, 5..6, 0..16], Tensor::random([2, 1, 16], Distribution::Normal(0.0, 1.0), &dev));
        let after = run(changed);
        let moved = (after.clone().narrow(1, 5, 1) - before.clone().narrow(1, 5, 1)).abs().max().into_scalar::<f32>();
        assert!(moved > 1e-4, "the changed position's output must move (moved {moved})");
        let leak = (after.narrow(1, 0, 5) - before.narrow(1, 0, 5)).abs().max().into_scalar::<f32>();
        assert_eq!(leak, 0.0, "a later token changed an earlier output by {leak}");
    }
}
