//! QK-Norm attention (Henry, Dachapally, Pawar, Chen 2020, Query-Key Normalization for
//! Transformers), written as a user would write a kind in their own crate:
//!
//! Attention(Q, K, V) = softmax(g · Q̂ K̂ᵀ + M) V,   q̂ = q / ‖q‖, k̂ = k / ‖k‖ (per head),
//!
//! cosine similarities scaled by one learned gain g instead of dot products scaled by 1/√d, so
//! no score can saturate the softmax by the vectors' norms alone. The paper initialises
//! g₀ = log₂(L² − L) with L the 97.5th percentile of the training sequences' lengths; here L is
//! the model's context (what a language model trained on full windows sees).
//!
//! Everything but the scores is variorum's multi-head attention (`MultiHeadAttention::project`,
//! `scores`, `mask_scores`, `combine`): grouped-query heads, RoPE, the KV cache, masks and
//! `max_back` come with it.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::softmax;
use serde::{Deserialize, Serialize};
use variorum_attention::Projected;
use variorum_attention::caps;
use variorum_attention::{
    AttentionInput, AttentionKind, AttentionMechanism, AttentionOutput, AttentionState, HeadSettings, KvCache,
    LayerInit, MultiHeadAttention, MultiHeadAttentionConfig, TestVariant,
};
use variorum_core::{AttentionMask, Capabilities, ConfigError};
use variorum_position::{PositionConfig, RotaryConfig};

/// `model.attention` with `kind = "qk-norm"` (the name is given at registration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QkNormConfig {
    /// Query heads. Default 4.
    pub n_heads: usize,
    /// Key/value heads (grouped-query when fewer). Default `n_heads`.
    pub n_kv_heads: Option<usize>,
    /// Size of each head. Default `d_model / n_heads`.
    pub head_dim: Option<usize>,
    /// Dropout on the attention weights. Default 0.
    pub dropout: f64,
}

impl Default for QkNormConfig {
    fn default() -> Self {
        Self { n_heads: 4, n_kv_heads: None, head_dim: None, dropout: 0.0 }
    }
}

impl QkNormConfig {
    /// The same heads as variorum's multi-head attention.
    fn heads(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            dropout: self.dropout,
            bias: true,
            ..Default::default()
        }
    }
}

impl AttentionKind for QkNormConfig {
    type Module = QkNormAttention;
    const SUMMARY: &'static str = "cosine-similarity scores times one learned gain g (init log2(L^2 - L)) instead of q.k / sqrt(d); a user's kind from examples/own-attention";
    const PAPER: &'static str = "Henry, Dachapally, Pawar, Chen 2020, Query-Key Normalization for Transformers";
    const CAPS: Capabilities = caps::SCORES;

    /// The head fields as one value: `head_shape`, `dropout` and `expanded` come from it.
    fn head_settings(&self) -> Option<HeadSettings> {
        let Self { n_heads, n_kv_heads, head_dim, dropout } = *self;
        Some(HeadSettings { n_heads, n_kv_heads, head_dim, dropout })
    }

    fn with_head_settings(&self, heads: &HeadSettings) -> Self {
        let HeadSettings { n_heads, n_kv_heads, head_dim, dropout } = *heads;
        Self { n_heads, n_kv_heads, head_dim, dropout }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)
    }

    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, len_k)
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn build(&self, init: &LayerInit, device: &Device) -> QkNormAttention {
        let l = init.position.context.max(2) as f64;
        QkNormAttention {
            attention: self.heads().build(init, device),
            gain: Param::from_tensor(Tensor::from_floats([(l * l - l).log2()], device)),
        }
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("", Self::default()),
            TestVariant::new("grouped-query + position rope", Self { n_kv_heads: Some(2), ..Self::default() })
                .with_position(PositionConfig::Rope(RotaryConfig::default())),
            TestVariant::new("masked", Self::default()).masked(),
        ]
    }
}

#[derive(Module, Debug)]
pub struct QkNormAttention {
    /// Projections, position scheme and output of variorum's multi-head attention.
    pub attention: MultiHeadAttention,
    /// g, `[1]`.
    pub gain: Param<Tensor<1>>,
}

/// Each head vector (last dimension) divided by its norm.
fn unit(x: Tensor<4>) -> Tensor<4> {
    let norm = x.clone().powf_scalar(2.0).sum_dim(3).add_scalar(1e-12).sqrt();
    x / norm
}

impl QkNormAttention {
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let a = &self.attention;
        let p = a.project(input.query, input.key_value, input.mask, cache);
        // the projection's 1/√d scale is undone by the normalisation; g scales instead
        let q = unit(p.q()) * self.gain.val().reshape([1, 1, 1, 1]);
        let p = Projected::new(q, unit(p.k.clone()), p.v, p.layout, p.max_back);
        let scores = a.mask_scores(a.scores(&p), input.mask, input.dense_mask, &p);
        let probs = softmax(scores, 3);
        let weights = input.need_weights.then(|| probs.clone());
        let context = a.combine(a.dropout.forward(probs), &p);
        AttentionOutput { context, weights, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for QkNormAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        QkNormAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        self.attention.project(x, None, mask, Some(state.kv_mut()));
    }

    fn uses_dense_mask(&self) -> bool {
        true
    }
}
