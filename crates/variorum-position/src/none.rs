//! No position signal at all (NoPE; Haviv et al. 2022): for models whose attention carries
//! position itself, or to measure what position information is worth. A causal model still
//! learns positions implicitly, from how much of the past each query may see.

use serde::{Deserialize, Serialize};
use variorum_core::Capabilities;

use crate::kind::PositionKind;

/// `model.position` with `kind = "none"`: no settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoPositionConfig {}

impl PositionKind for NoPositionConfig {
    const SUMMARY: &'static str = "no position signal (NoPE)";
    const PAPER: &'static str = "Haviv et al. 2022, Transformer Language Models without Positional Encodings Still Learn Positional Information";
    const CAPS: Capabilities = Capabilities::NEUTRAL;
}
