//! The `model.position` axis: what is added to the token embeddings.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, KindInfo};

use crate::{LearnedPosition, LearnedPositionConfig, SinusoidalPosition, SinusoidalPositionConfig};

/// `model.position`: `kind = "sinusoidal" | "learned" | "none"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum AbsolutePositionConfig {
    Sinusoidal(SinusoidalPositionConfig),
    Learned(LearnedPositionConfig),
    /// No position signal at all (NoPE): for models whose attention carries position itself,
    /// or to measure what position information is worth.
    None,
}

impl Default for AbsolutePositionConfig {
    fn default() -> Self {
        Self::Learned(LearnedPositionConfig::default())
    }
}

impl AbsolutePositionConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Sinusoidal(_) => "sinusoidal",
            Self::Learned(_) => "learned",
            Self::None => "none",
        }
    }

    /// The same config with derived defaults written out.
    pub fn expanded(&self, context: usize) -> Self {
        match self {
            Self::Learned(c) => Self::Learned(LearnedPositionConfig { max_len: Some(c.max_len.unwrap_or(context)) }),
            other => other.clone(),
        }
    }

    /// `context` is the model's context length (`model.seq_len`).
    pub fn validate(&self, d_model: usize, context: usize) -> Result<(), ConfigError> {
        match self {
            Self::Sinusoidal(c) => c.validate(d_model),
            Self::Learned(c) => c.validate(context),
            Self::None => Ok(()),
        }
    }

    /// `None` when the scheme adds nothing.
    pub fn init(&self, d_model: usize, context: usize, device: &Device) -> Option<AbsolutePosition> {
        match self {
            Self::Sinusoidal(c) => Some(AbsolutePosition::Sinusoidal(c.init(d_model, device))),
            Self::Learned(c) => Some(AbsolutePosition::Learned(c.init(d_model, context, device))),
            Self::None => None,
        }
    }

    /// Longest sequence the scheme can encode, if it is bounded.
    pub fn max_len(&self, context: usize) -> Option<usize> {
        match self {
            Self::Learned(c) => Some(c.max_len.unwrap_or(context)),
            _ => None,
        }
    }

    pub fn zoo() -> Vec<KindInfo> {
        let caps = Capabilities::NEUTRAL;
        vec![
            KindInfo {
                axis: "model.position",
                kind: "sinusoidal",
                summary: "fixed sin/cos of position added to the embeddings; configurable base, optionally learnable frequencies",
                paper: "Vaswani et al. 2017, Attention Is All You Need",
                caps,
            },
            KindInfo {
                axis: "model.position",
                kind: "learned",
                summary: "a learned vector per absolute position, up to max_len",
                paper: "Gehring et al. 2017, Convolutional Sequence to Sequence Learning; Radford et al. 2018 (GPT)",
                caps: Capabilities { variable_length: false, ..caps },
            },
            KindInfo {
                axis: "model.position",
                kind: "none",
                summary: "no absolute position signal (NoPE)",
                paper: "Haviv et al. 2022, Transformer Language Models without Positional Encodings Still Learn Positional Information",
                caps,
            },
        ]
    }
}

/// An initialised absolute scheme.
#[derive(Module, Debug)]
pub enum AbsolutePosition {
    Sinusoidal(SinusoidalPosition),
    Learned(LearnedPosition),
}

impl AbsolutePosition {
    /// Position vectors for positions `start..start + len`, shape `[len, d_model]`.
    pub fn encode(&self, start: usize, len: usize, device: &Device) -> Tensor<2> {
        match self {
            Self::Sinusoidal(p) => p.encode(start, len, device),
            Self::Learned(p) => p.encode(start, len),
        }
    }

    /// `x + P[start..start+len]` for `x: [batch, len, d_model]`.
    pub fn forward(&self, x: Tensor<3>, start: usize) -> Tensor<3> {
        let [_, len, _] = x.dims();
        let p = self.encode(start, len, &x.device());
        x + p.unsqueeze_dim(0)
    }
}
