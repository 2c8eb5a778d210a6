//! The `model.position` axis: one kind per scheme.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, KindInfo};

use crate::{
    AbsolutePosition, AlibiBias, DebertaConfig, DistanceAware, HeadShape, LearnedPositionConfig, MultiplicativeConfig,
    RelativePosition, RotaryConfig, ShawConfig, SinusoidalPositionConfig, T5BiasConfig, TimestepEncoding, UntiedConfig,
    XlRelativeConfig,
};

/// `model.position`, chosen by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PositionConfig {
    /// Fixed sin/cos of the position added to the embeddings.
    Sinusoidal(SinusoidalPositionConfig),
    /// A learned table added to the embeddings (or before every block).
    Learned(LearnedPositionConfig),
    /// No position signal at all (NoPE): for models whose attention carries position itself,
    /// or to measure what position information is worth.
    None,
    /// Shaw et al. 2018: learned relative key (and value) vectors, offsets clipped to ±k.
    Shaw(ShawConfig),
    /// Transformer-XL: sinusoidal relative encodings with their own key projection and biases u, v.
    TransformerXl(XlRelativeConfig),
    /// T5: a learned scalar per head and log-spaced distance bucket.
    T5(T5BiasConfig),
    /// ALiBi: a fixed linear distance penalty per head.
    Alibi,
    /// RoPE: q and k rotated by their positions.
    Rope(RotaryConfig),
    /// DA-Transformer: rectified scores scaled by a learned function of distance per head.
    Da,
    /// A learned scalar per |i − j| multiplying the scores.
    Multiplicative(MultiplicativeConfig),
    /// TUPE: a separately projected position–position term.
    Untied(UntiedConfig),
    /// DeBERTa: content→position and position→content terms with relative embeddings.
    Deberta(DebertaConfig),
    /// The Universal Transformer's position ⊕ step signal, added before every block.
    UniversalTimestep,
}

impl Default for PositionConfig {
    fn default() -> Self {
        Self::Learned(LearnedPositionConfig::default())
    }
}

impl PositionConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Sinusoidal(_) => "sinusoidal",
            Self::Learned(_) => "learned",
            Self::None => "none",
            Self::Shaw(_) => "shaw",
            Self::TransformerXl(_) => "transformer-xl",
            Self::T5(_) => "t5",
            Self::Alibi => "alibi",
            Self::Rope(_) => "rope",
            Self::Da => "da",
            Self::Multiplicative(_) => "multiplicative",
            Self::Untied(_) => "untied",
            Self::Deberta(_) => "deberta",
            Self::UniversalTimestep => "universal-timestep",
        }
    }

    /// The declared capabilities of the kind, with what this config adds (a learned table
    /// before every block is a per-layer signal).
    pub fn capabilities(&self) -> Capabilities {
        let declared = self.declaration().2;
        Capabilities { per_layer: declared.per_layer || matches!(self, Self::Learned(c) if c.per_layer), ..declared }
    }

    /// The same config with derived defaults written out.
    pub fn expanded(&self, context: usize) -> Self {
        match self {
            Self::Learned(c) => {
                Self::Learned(LearnedPositionConfig { max_len: Some(c.max_len.unwrap_or(context)), ..c.clone() })
            }
            Self::Untied(c) => Self::Untied(UntiedConfig { max_len: Some(c.max_len.unwrap_or(context)) }),
            other => other.clone(),
        }
    }

    /// `context` is the model's context length (`model.seq_len`).
    pub fn validate(&self, heads: HeadShape, context: usize) -> Result<(), ConfigError> {
        let even = |what: &str| {
            variorum_core::error::check(heads.d_model % 2 == 0, || {
                format!("model.position.kind = \"{what}\" needs an even model.d_model, got {}", heads.d_model)
            })
        };
        match self {
            Self::Sinusoidal(c) => c.validate(heads.d_model),
            Self::Learned(c) => c.validate(context),
            Self::Shaw(c) => c.validate(),
            Self::TransformerXl(c) => c.validate(heads.d_model),
            Self::T5(c) => c.validate(),
            Self::Rope(c) => c.validate(heads.head_dim),
            Self::Multiplicative(c) => c.validate(),
            Self::Untied(c) => c.validate(context),
            Self::Deberta(c) => c.validate(),
            Self::UniversalTimestep => even("universal-timestep"),
            Self::None | Self::Alibi | Self::Da => Ok(()),
        }
    }

    /// What is added to the embeddings before the first block, if anything.
    pub fn init_input(&self, d_model: usize, context: usize, device: &Device) -> Option<AbsolutePosition> {
        match self {
            Self::Sinusoidal(c) => Some(AbsolutePosition::Sinusoidal(c.init(d_model, device))),
            Self::Learned(c) if !c.per_layer => Some(AbsolutePosition::Learned(c.init(d_model, context, device))),
            _ => None,
        }
    }

    /// What is added to the input of block `layer` (0-based), if anything.
    pub fn init_layer(
        &self,
        layer: usize,
        d_model: usize,
        context: usize,
        device: &Device,
    ) -> Option<AbsolutePosition> {
        match self {
            Self::Learned(c) if c.per_layer => Some(AbsolutePosition::Learned(c.init(d_model, context, device))),
            Self::UniversalTimestep => Some(AbsolutePosition::Timestep(TimestepEncoding::new(layer + 1, d_model))),
            _ => None,
        }
    }

    /// The scheme's part inside one attention layer, if it has one.
    pub fn init_relative(&self, heads: HeadShape, context: usize, device: &Device) -> Option<RelativePosition> {
        let HeadShape { d_model, n_heads, head_dim } = heads;
        Some(match self {
            Self::Shaw(c) => RelativePosition::Shaw(c.init(head_dim, device)),
            Self::TransformerXl(c) => RelativePosition::TransformerXl(c.init(d_model, n_heads, head_dim, device)),
            Self::T5(c) => RelativePosition::T5(c.init(n_heads, device)),
            Self::Alibi => RelativePosition::Alibi(AlibiBias::new(n_heads)),
            Self::Rope(c) => RelativePosition::Rope(c.init(head_dim)),
            Self::Da => RelativePosition::DistanceAware(DistanceAware::new(n_heads, device)),
            Self::Multiplicative(c) => RelativePosition::Multiplicative(c.init(device)),
            Self::Untied(c) => RelativePosition::Untied(c.init(d_model, n_heads, head_dim, context, device)),
            Self::Deberta(c) => RelativePosition::Deberta(c.init(d_model, n_heads, head_dim, device)),
            Self::Sinusoidal(_) | Self::Learned(_) | Self::None | Self::UniversalTimestep => return None,
        })
    }

    /// Factor on the content scores' 1/√d_h: TUPE divides by √(2d), DeBERTa by √(3d), because
    /// their position terms add that many more terms of the same size.
    pub fn content_scale(&self) -> f64 {
        match self {
            Self::Untied(_) => 0.5f64.sqrt(),
            Self::Deberta(_) => (1.0f64 / 3.0).sqrt(),
            _ => 1.0,
        }
    }

    /// Longest position the scheme can encode, if it is bounded (a learned absolute table).
    pub fn max_len(&self, context: usize) -> Option<usize> {
        match self {
            Self::Learned(c) => Some(c.max_len.unwrap_or(context)),
            Self::Untied(c) => Some(c.max_len.unwrap_or(context)),
            _ => None,
        }
    }

    /// `score_bias`: the scheme acts on the score matrix, so the attention must form one;
    /// `qk_rotation`: it rotates q and k, so the attention must have them.
    pub fn zoo() -> Vec<KindInfo> {
        Self::every_kind()
            .iter()
            .map(|c| {
                let (summary, paper, caps) = c.declaration();
                KindInfo { axis: "model.position", kind: c.kind(), summary, paper, caps }
            })
            .collect()
    }

    /// One config of every kind (its defaults), in zoo order.
    pub fn every_kind() -> Vec<Self> {
        vec![
            Self::Sinusoidal(Default::default()),
            Self::Learned(Default::default()),
            Self::None,
            Self::Shaw(Default::default()),
            Self::TransformerXl(Default::default()),
            Self::T5(Default::default()),
            Self::Alibi,
            Self::Rope(Default::default()),
            Self::Da,
            Self::Multiplicative(Default::default()),
            Self::Untied(Default::default()),
            Self::Deberta(Default::default()),
            Self::UniversalTimestep,
        ]
    }

    /// Summary, paper and capabilities of this config's kind: one exhaustive match, so a new
    /// kind cannot be left without a declaration.
    fn declaration(&self) -> (&'static str, &'static str, Capabilities) {
        let input = Capabilities::NEUTRAL;
        let absolute = Capabilities { absolute: true, ..input };
        let scores = Capabilities { score_bias: true, ..input };
        let distance = Capabilities { distance_only: true, ..scores };
        match self {
            Self::Sinusoidal(_) => (
                "fixed sin/cos of position added to the embeddings; configurable base, optionally learnable frequencies",
                "Vaswani et al. 2017, Attention Is All You Need; Wang et al. 2021 (learnable)",
                absolute,
            ),
            Self::Learned(_) => (
                "a learned vector per absolute position up to max_len, once or before every block (per_layer)",
                "Gehring et al. 2017; Radford et al. 2018 (GPT); Al-Rfou et al. 2018 (per layer)",
                Capabilities { variable_length: false, ..absolute },
            ),
            Self::None => (
                "no position signal (NoPE)",
                "Haviv et al. 2022, Transformer Language Models without Positional Encodings Still Learn Positional Information",
                input,
            ),
            Self::Shaw(_) => (
                "learned relative key/value vectors, offsets clipped to ±k",
                "Shaw et al. 2018, Self-Attention with Relative Position Representations",
                scores,
            ),
            Self::TransformerXl(_) => (
                "sinusoidal relative encodings, position key projection, global biases u, v; relative shift",
                "Dai et al. 2019, Transformer-XL",
                scores,
            ),
            Self::T5(_) => (
                "learned scalar bias per head over log-spaced distance buckets",
                "Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5)",
                distance,
            ),
            Self::Alibi => (
                "fixed linear distance penalty, geometric slopes per head; no parameters",
                "Press et al. 2022, Train Short, Test Long (ALiBi)",
                distance,
            ),
            Self::Rope(_) => (
                "rotary embedding of q and k; rotate-half or interleaved; partial rotary dimension",
                "Su et al. 2021, RoFormer",
                Capabilities { qk_rotation: true, ..input },
            ),
            Self::Da => (
                "ReLU(QKᵀ) scaled by a learned per-head function of distance",
                "Wu et al. 2021, DA-Transformer: Distance-aware Transformer",
                scores,
            ),
            Self::Multiplicative(_) => (
                "a learned scalar per |i−j| multiplying the scores",
                "Prince 2023, Transformers III (position-and-efficiency eq. 12)",
                scores,
            ),
            Self::Untied(_) => (
                "content–content plus a separately projected position–position term (TUPE)",
                "Ke et al. 2021, Rethinking Positional Encoding in Language Pre-training",
                Capabilities { variable_length: false, absolute: true, absolute_scores: true, ..scores },
            ),
            Self::Deberta(_) => (
                "disentangled attention: content→content + content→position + position→content",
                "He et al. 2021, DeBERTa",
                scores,
            ),
            Self::UniversalTimestep => (
                "position ⊕ recurrence-step sinusoids added before every block",
                "Dehghani et al. 2019, Universal Transformers",
                Capabilities { per_layer: true, ..absolute },
            ),
        }
    }
}
