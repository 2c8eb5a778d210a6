//! The engine's settings: heads, dropout, biases, normaliser and the heads' auxiliary losses —
//! the table of the `full` kind, and what every kind with head fields builds its engine from.

use crate::contract::Positioning;
use crate::engine::head_losses::{DiversityConfig, GuidanceConfig};
use crate::engine::heads::{HeadLosses, MultiHeadAttention};
use crate::engine::normaliser::Normaliser;
use crate::engine::qkv::QkvProjectionConfig;
use crate::kind::HeadSettings;
use burn::nn::{DropoutConfig, Initializer, LinearConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_position::HeadShape;

/// `model.attention` with `kind = "full"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MultiHeadAttentionConfig {
    /// Query heads. Default 4.
    pub n_heads: usize,
    /// Key/value heads: `n_heads` (default) is multi-head, 1 is multi-query, anything dividing
    /// `n_heads` is grouped-query attention.
    pub n_kv_heads: Option<usize>,
    /// Size of each head. Default `d_model / n_heads`.
    pub head_dim: Option<usize>,
    /// Dropout on the attention probabilities. Default 0.
    pub dropout: f64,
    /// Biases in the q/k/v and output projections. Default true.
    pub bias: bool,
    /// How each row of scores becomes weights: "softmax" (default), "relu", "sigmoid",
    /// "sparsemax" or "entmax-1.5" ([`Normaliser`]).
    pub normaliser: Normaliser,
    /// A learned temperature per head dividing its scores before the normaliser. Default false.
    pub head_temperature: bool,
    /// Divide the scores q·k by √d_h (Vaswani et al. §3.2.1). `false`: T5's unscaled dot
    /// products (Raffel et al. 2020; Mesh TensorFlow folds the factor into the query's
    /// initialisation, which variorum's single `init_std` does not reproduce: a fresh model's
    /// scores are √d_h times larger than the scaled form's). Default true, and then not written
    /// out (so that a written-out table keeps only the keys every kind with head fields takes,
    /// and `--set model.attention.kind=…` can switch to another of them).
    #[serde(skip_serializing_if = "is_true")]
    pub scaled: bool,
    /// Disagreement regularisation of the heads (`{ on = "subspace" | "positions" | "outputs",
    /// weight = 0.1 }`, `engine::head_losses`). Default none.
    pub diversity: Option<DiversityConfig>,
    /// Heads pulled toward fixed patterns (`{ patterns = ["previous", "first", …], weight = 0.1 }`,
    /// `engine::head_losses`). Default none.
    pub guidance: Option<GuidanceConfig>,
}

fn is_true(b: &bool) -> bool {
    *b
}

impl Default for MultiHeadAttentionConfig {
    fn default() -> Self {
        Self {
            n_heads: 4,
            n_kv_heads: None,
            head_dim: None,
            dropout: 0.0,
            bias: true,
            normaliser: Normaliser::Softmax,
            head_temperature: false,
            scaled: true,
            diversity: None,
            guidance: None,
        }
    }
}

/// The engine's settings of a kind's head settings: `full`'s table with those four fields,
/// the rest at its defaults.
impl From<HeadSettings> for MultiHeadAttentionConfig {
    fn from(heads: HeadSettings) -> Self {
        let HeadSettings { n_heads, n_kv_heads, head_dim, dropout } = heads;
        Self { n_heads, n_kv_heads, head_dim, dropout, ..Default::default() }
    }
}

impl MultiHeadAttentionConfig {
    /// Key/value heads: `n_kv_heads`, or `n_heads` where unset.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Size of each head: `head_dim`, or `d_model / n_heads` where unset.
    pub fn head_dim(&self, d_model: usize) -> usize {
        self.head_dim.unwrap_or(d_model / self.n_heads.max(1))
    }

    /// Query heads and head size (the shape every kind with these head fields reports).
    pub fn heads(&self, d_model: usize) -> HeadShape {
        HeadShape { d_model, n_heads: self.n_heads, head_dim: self.head_dim(d_model) }
    }

    /// `init_std` for q/k/v; `out_std` for the output projection (GPT-2 scales residual
    /// projections by 1/√(2·n_layers)); `position` supplies the layer's relative scheme, if any.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> MultiHeadAttention {
        let head_dim = self.head_dim(d_model);
        MultiHeadAttention {
            position: position.config.init_relative(self.heads(d_model), position.context, device),
            qkv: QkvProjectionConfig::new(d_model, self.n_heads, self.kv_heads(), head_dim)
                .with_bias(self.bias)
                .with_init_std(init_std)
                .init(device),
            out: LinearConfig::new(self.n_heads * head_dim, d_model)
                .with_bias(self.bias)
                .with_initializer(Initializer::Normal { mean: 0.0, std: out_std })
                .init(device),
            dropout: DropoutConfig::new(self.dropout).init(),
            normaliser: self.normaliser.init(self.n_heads, self.head_temperature, position.context, device),
            losses: HeadLosses { diversity: self.diversity.clone(), guidance: self.guidance.clone() },
            scale: position.config.content_scale() / if self.scaled { (head_dim as f64).sqrt() } else { 1.0 },
        }
    }
}
