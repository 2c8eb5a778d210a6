//! The `model.attention` axis.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, KindInfo};

use crate::contract::AttentionState;
use crate::{
    AdaptiveSpanAttention, AdaptiveSpanConfig, AttentionInput, AttentionOutput, MultiHeadAttention,
    MultiHeadAttentionConfig, Positioning,
};
use variorum_position::HeadShape;

/// `model.attention`: one variant per mechanism, chosen by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum AttentionConfig {
    /// Multi-head scaled dot-product attention (with grouped-/multi-query K/V heads).
    Full(MultiHeadAttentionConfig),
    /// Multi-head attention with a learned soft span per head (static or per token).
    AdaptiveSpan(AdaptiveSpanConfig),
}

impl Default for AttentionConfig {
    fn default() -> Self {
        Self::Full(MultiHeadAttentionConfig::default())
    }
}

impl AttentionConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Full(_) => "full",
            Self::AdaptiveSpan(_) => "adaptive-span",
        }
    }

    pub fn capabilities(&self) -> Capabilities {
        Self::zoo().into_iter().find(|k| k.kind == self.kind()).map(|k| k.caps).unwrap_or_default()
    }

    /// The same config with every derived default written out.
    pub fn expanded(&self, d_model: usize) -> Self {
        match self {
            Self::Full(c) => Self::Full(c.expanded(d_model)),
            Self::AdaptiveSpan(c) => Self::AdaptiveSpan(c.expanded(d_model)),
        }
    }

    pub fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        match self {
            Self::Full(c) => c.validate(d_model),
            Self::AdaptiveSpan(c) => c.validate(d_model),
        }
    }

    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> Attention {
        match self {
            Self::Full(c) => Attention::Full(c.init(d_model, init_std, out_std, position, device)),
            Self::AdaptiveSpan(c) => Attention::AdaptiveSpan(c.init(d_model, init_std, out_std, position, device)),
        }
    }

    /// Query heads and head size (what position schemes are built for).
    pub fn heads(&self, d_model: usize) -> HeadShape {
        match self {
            Self::Full(c) => c.heads(d_model),
            Self::AdaptiveSpan(c) => c.heads().heads(d_model),
        }
    }

    /// FLOPs per token (forward), for `variorum inspect`.
    pub fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        match self {
            Self::Full(c) => c.flops_per_token(d_model, len_k),
            // at most S keys back
            Self::AdaptiveSpan(c) => c.heads().flops_per_token(d_model, len_k.min(c.max_span)),
        }
    }

    pub fn zoo() -> Vec<KindInfo> {
        vec![
            KindInfo {
                axis: "model.attention",
                kind: "full",
                summary: "multi-head scaled dot-product attention; grouped-/multi-query K/V heads; KV cache",
                paper: "Vaswani et al. 2017, Attention Is All You Need; Shazeer 2019 (MQA); Ainslie et al. 2023 (GQA)",
                caps: Capabilities {
                    causal: true,
                    bidirectional: true,
                    incremental: true,
                    score_bias: true,
                    qk_rotation: true,
                    aux_losses: false,
                    variable_length: true,
                },
            },
            KindInfo {
                axis: "model.attention",
                kind: "adaptive-span",
                summary: "multi-head attention with a learned soft span per head (or per token), L1 penalty, keys beyond the span not computed",
                paper: "Sukhbaatar et al. 2019, Adaptive Attention Span in Transformers",
                caps: Capabilities {
                    causal: true,
                    bidirectional: false,
                    incremental: true,
                    score_bias: true,
                    qk_rotation: true,
                    aux_losses: true,
                    variable_length: true,
                },
            },
        ]
    }
}

/// An initialised attention mechanism.
#[derive(Module, Debug)]
pub enum Attention {
    Full(MultiHeadAttention),
    AdaptiveSpan(AdaptiveSpanAttention),
}

impl Attention {
    /// Projects `x` (already normed) and appends its keys and values to the cache, as a forward
    /// would, without computing the attention.
    pub fn extend_cache(&self, x: Tensor<3>, mask: &variorum_core::AttentionMask, state: &mut AttentionState) {
        let mha = match self {
            Self::Full(a) => a,
            Self::AdaptiveSpan(a) => &a.attention,
        };
        mha.project(x, None, mask, Some(state.kv_mut()));
    }

    /// Content-based attention without mask or position scheme (compression losses).
    pub fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        match self {
            Self::Full(a) => a.content_only(query, key_value),
            Self::AdaptiveSpan(a) => a.attention.content_only(query, key_value),
        }
    }

    /// Runs the mechanism; `state` carries its incremental-decoding state when decoding.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        match self {
            Self::Full(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::AdaptiveSpan(a) => a.forward(input, state.map(AttentionState::kv_mut)),
        }
    }
}
