//! `model.objective`: what the model learns to predict.
//!
//! - `causal` (default): the next token from the tokens before it (GPT); attention is causal, and
//!   the model generates left to right.
//! - `masked`: the hidden tokens of a window from everything around them (BERT's masked language
//!   model; Devlin et al. 2019): attention is bidirectional, so the attention kinds that have no
//!   causal form (Linformer, Nyströmformer, clustered, inducing points, …) train too. The
//!   embedding gets one extra row, the mask token (id = the text vocabulary size), and the loss
//!   counts the hidden positions only. A masked model does not generate.

use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ObjectiveConfig {
    /// Next-token prediction under causal attention.
    #[default]
    Causal,
    /// Masked-language-model prediction under bidirectional attention.
    Masked(MaskedConfig),
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
}

impl Default for MaskedConfig {
    fn default() -> Self {
        Self { mask_prob: 0.15, mask_token_prob: 0.8, random_token_prob: 0.1 }
    }
}

impl ObjectiveConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Causal => "causal",
            Self::Masked(_) => "masked",
        }
    }

    pub fn is_causal(&self) -> bool {
        matches!(self, Self::Causal)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
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
        })
    }
}
