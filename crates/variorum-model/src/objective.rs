//! `model.objective`: what the model learns to predict.
//!
//! - `causal` (default): the next token from the tokens before it (GPT); attention is causal, and
//!   the model generates left to right.
//! - `masked`: the hidden tokens of a window from everything around them (BERT's masked language
//!   model; Devlin et al. 2019): attention is bidirectional, so the attention kinds that have no
//!   causal form (Linformer, Nyströmformer, clustered, inducing points, …) train too. The
//!   embedding gets one extra row, the mask token (id = the text vocabulary size), unless the
//!   tokenizer has a mask token of its own (`mask_token`: BERT's `[MASK]`), and the loss counts
//!   the hidden positions only. A masked model does not generate.
//! - `span-corruption`: T5's denoising objective (Raffel et al. 2020, §3.1.4) for an
//!   encoder–decoder on a single corpus: spans of a window are dropped from the source, each
//!   replaced by a sentinel token, and the decoder writes the dropped spans after their
//!   sentinels (`variorum_data::SpanCorruption`). The decoder is causal.

use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

/// `model.objective`, chosen by `kind`: what the model learns to predict ([module docs](self)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ObjectiveConfig {
    /// Next-token prediction under causal attention.
    #[default]
    Causal,
    /// Masked-language-model prediction under bidirectional attention.
    Masked(MaskedConfig),
    /// T5's span corruption (encoder–decoder models).
    SpanCorruption(SpanCorruptionConfig),
}

/// `model.objective` with `kind = "span-corruption"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpanCorruptionConfig {
    /// Share of a window's tokens dropped from the source. Default 0.15 (T5).
    pub noise_density: f64,
    /// Mean length of a dropped span. Default 3 (T5).
    pub mean_span: f64,
}

impl Default for SpanCorruptionConfig {
    fn default() -> Self {
        Self { noise_density: 0.15, mean_span: 3.0 }
    }
}

impl SpanCorruptionConfig {
    /// Dropped tokens and spans of a window of `len` tokens (T5's rounding): at least one of
    /// each, and at least one token kept.
    pub fn noise(&self, len: usize) -> (usize, usize) {
        let noise = ((len as f64) * self.noise_density).round().clamp(1.0, (len.max(2) - 1) as f64) as usize;
        let spans = ((noise as f64) / self.mean_span).round().clamp(1.0, noise as f64) as usize;
        (noise, spans.min(len - noise))
    }
}

/// `model.objective` with `kind = "masked"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MaskedConfig {
    /// Share of the positions of a window chosen for prediction. Default 0.15 (BERT).
    pub mask_prob: f64,
    /// Of the chosen positions, the share shown as the mask token. Default 0.8 (BERT).
    pub mask_token_prob: f64,
    /// Of the chosen positions, the share shown as a random token (the rest are shown unchanged).
    /// Default 0.1 (BERT).
    pub random_token_prob: f64,
    /// The mask token's id when the vocabulary has one (BERT's `[MASK]`, RoBERTa's `<mask>`).
    /// Default none: an extra embedding row after the vocabulary.
    pub mask_token: Option<usize>,
    /// ETC's contrastive predictive coding beside the masked LM (`[model.objective.cpc]`; an
    /// `etc` attention only): see [`CpcConfig`]. Default none.
    pub cpc: Option<CpcConfig>,
}

impl Default for MaskedConfig {
    fn default() -> Self {
        Self { mask_prob: 0.15, mask_token_prob: 0.8, random_token_prob: 0.1, mask_token: None, cpc: None }
    }
}

/// `model.objective.cpc`: ETC's contrastive predictive coding (Ainslie et al. 2020, §3.3; Oord
/// et al. 2018), the model's `cpc` loss ([`crate::cpc`]). ETC's sentences are our segments, one
/// global token each: `segments` of every training window are hidden whole, and the global
/// token of each must predict, in latent space, the encoding of its segment read alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CpcConfig {
    /// Segments hidden whole per window; every window keeps at least one visible. Default 1.
    pub segments: usize,
    /// Weight of the CPC loss beside the masked LM's. Default 1 (the paper adds the two losses
    /// and states no weight).
    pub weight: f64,
}

impl Default for CpcConfig {
    fn default() -> Self {
        Self { segments: 1, weight: 1.0 }
    }
}

impl ObjectiveConfig {
    /// The `kind = "…"` value.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Causal => "causal",
            Self::Masked(_) => "masked",
            Self::SpanCorruption(_) => "span-corruption",
        }
    }

    /// ETC's CPC settings, under a masked objective that asks for it.
    pub fn cpc(&self) -> Option<&CpcConfig> {
        match self {
            Self::Masked(m) => m.cpc.as_ref(),
            _ => None,
        }
    }

    /// Whether the (decoder's) attention is causal: every objective but `masked`.
    pub fn is_causal(&self) -> bool {
        !matches!(self, Self::Masked(_))
    }

    /// Checks the rates and span length; messages name the config key (`model.objective.*`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Self::SpanCorruption(c) = self {
            check(c.noise_density > 0.0 && c.noise_density < 0.5, || {
                format!("model.objective.noise_density = {} must be in (0, 0.5)", c.noise_density)
            })?;
            return check(c.mean_span >= 1.0, || {
                format!("model.objective.mean_span = {} must be at least 1", c.mean_span)
            });
        }
        let Self::Masked(m) = self else { return Ok(()) };
        check(m.mask_prob > 0.0 && m.mask_prob <= 1.0, || {
            format!("model.objective.mask_prob = {} must be in (0, 1]", m.mask_prob)
        })?;
        for (name, p) in [("mask_token_prob", m.mask_token_prob), ("random_token_prob", m.random_token_prob)] {
            check((0.0..=1.0).contains(&p), || format!("model.objective.{name} = {p} must be in [0, 1]"))?;
        }
        check(m.mask_token_prob + m.random_token_prob <= 1.0, || {
            format!(
                "model.objective.mask_token_prob + random_token_prob = {} must be at most 1",
                m.mask_token_prob + m.random_token_prob
            )
        })?;
        if let Some(c) = &m.cpc {
            check(c.segments >= 1, || "model.objective.cpc.segments must be at least 1".into())?;
            check(c.weight.is_finite() && c.weight > 0.0, || {
                format!("model.objective.cpc.weight = {} must be positive", c.weight)
            })?;
        }
        Ok(())
    }
}
