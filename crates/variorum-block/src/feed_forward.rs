//! Position-wise feed-forward networks, the `model.feed_forward` axis:
//!
//! FFN(x) = φ(x W₁ + b₁) W₂ + b₂                       (relu, gelu; Vaswani et al. 2017, Hendrycks & Gimpel 2016)
//! FFN(x) = (σ(x W) ⊗ x V) W₂   with σ = sigmoid, GELU, Swish  (glu, geglu, swiglu; Dauphin et al. 2017, Shazeer 2020)
//!
//! The gated variants compute x W and x V with one fused GEMM and split the result.

use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{gelu, relu, sigmoid, silu};
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, KindInfo, error::check};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FeedForwardKind {
    Relu,
    #[default]
    Gelu,
    Glu,
    Geglu,
    Swiglu,
}

impl FeedForwardKind {
    pub const ALL: [FeedForwardKind; 5] = [Self::Relu, Self::Gelu, Self::Glu, Self::Geglu, Self::Swiglu];

    pub fn name(self) -> &'static str {
        match self {
            Self::Relu => "relu",
            Self::Gelu => "gelu",
            Self::Glu => "glu",
            Self::Geglu => "geglu",
            Self::Swiglu => "swiglu",
        }
    }

    pub fn gated(self) -> bool {
        matches!(self, Self::Glu | Self::Geglu | Self::Swiglu)
    }

    fn paper(self) -> &'static str {
        match self {
            Self::Relu => "Vaswani et al. 2017, Attention Is All You Need",
            Self::Gelu => "Hendrycks & Gimpel 2016, Gaussian Error Linear Units; Radford et al. 2018 (GPT)",
            Self::Glu => "Dauphin et al. 2017, Language Modeling with Gated Convolutional Networks",
            Self::Geglu | Self::Swiglu => "Shazeer 2020, GLU Variants Improve Transformer",
        }
    }
}

/// `model.feed_forward`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeedForwardConfig {
    /// `relu`, `gelu` (exact erf form; default), `glu`, `geglu`, `swiglu`.
    pub kind: FeedForwardKind,
    /// Hidden width. Default `4 · d_model`.
    pub d_ff: Option<usize>,
    /// Biases in both projections. Default true.
    pub bias: bool,
}

impl Default for FeedForwardConfig {
    fn default() -> Self {
        Self { kind: FeedForwardKind::Gelu, d_ff: None, bias: true }
    }
}

impl FeedForwardConfig {
    pub fn d_ff(&self, d_model: usize) -> usize {
        self.d_ff.unwrap_or(4 * d_model)
    }

    /// The same config with the hidden width written out.
    pub fn expanded(&self, d_model: usize) -> Self {
        Self { d_ff: Some(self.d_ff(d_model)), ..self.clone() }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.d_ff != Some(0), || "model.feed_forward.d_ff must be at least 1".into())
    }

    pub fn init(&self, d_model: usize, dropout: f64, init_std: f64, out_std: f64, device: &Device) -> FeedForward {
        let d_ff = self.d_ff(d_model);
        let up_width = if self.kind.gated() { 2 * d_ff } else { d_ff };
        FeedForward {
            up: LinearConfig::new(d_model, up_width)
                .with_bias(self.bias)
                .with_initializer(Initializer::Normal { mean: 0.0, std: init_std })
                .init(device),
            down: LinearConfig::new(d_ff, d_model)
                .with_bias(self.bias)
                .with_initializer(Initializer::Normal { mean: 0.0, std: out_std })
                .init(device),
            dropout: DropoutConfig::new(dropout).init(),
            kind: self.kind,
        }
    }

    pub fn flops_per_token(&self, d_model: usize) -> u64 {
        let d_ff = self.d_ff(d_model) as u64;
        let up = if self.kind.gated() { 2 * d_ff } else { d_ff };
        2 * (d_model as u64 * up + d_ff * d_model as u64)
    }

    pub fn zoo() -> Vec<KindInfo> {
        FeedForwardKind::ALL
            .iter()
            .map(|k| KindInfo {
                axis: "model.feed_forward",
                kind: k.name(),
                summary: if k.gated() {
                    "gated linear unit FFN, fused gate/value projection"
                } else {
                    "two-layer position-wise FFN"
                },
                paper: k.paper(),
                caps: Capabilities::NEUTRAL,
            })
            .collect()
    }
}

#[derive(Module, Debug)]
pub struct FeedForward {
    pub up: Linear,
    pub down: Linear,
    pub dropout: Dropout,
    #[module(skip)]
    pub kind: FeedForwardKind,
}

impl FeedForward {
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let h = self.up.forward(x);
        let h = match self.kind {
            FeedForwardKind::Relu => relu(h),
            FeedForwardKind::Gelu => gelu(h),
            gated => {
                let w = h.dims()[2];
                let gate = h.clone().narrow(2, 0, w / 2);
                let value = h.narrow(2, w / 2, w / 2);
                let gate = match gated {
                    FeedForwardKind::Glu => sigmoid(gate),
                    FeedForwardKind::Geglu => gelu(gate),
                    _ => silu(gate),
                };
                gate * value
            }
        };
        self.down.forward(self.dropout.forward(h))
    }
}
