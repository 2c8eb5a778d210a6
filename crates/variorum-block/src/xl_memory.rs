//! Transformer-XL's segment recurrence (Dai et al. 2019), `model.memory` with `kind = "xl"`:
//! each layer attends over [SG(m^{n−1}_τ) ∘ h^{n−1}_{τ+1}], the stop-gradient memory of the
//! previous segments' inputs to that layer followed by the current ones; after each segment the
//! memory keeps the last `length` of them ([`crate::memory`] holds the FIFO).

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, Declared, error::check};

use crate::memory::{LayerMemory, MemoryKind};

/// `model.memory` with `kind = "xl"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct XlMemoryConfig {
    /// States kept per layer (the paper's m). Default 64.
    pub length: usize,
}

impl Default for XlMemoryConfig {
    fn default() -> Self {
        Self { length: 64 }
    }
}

impl Declared for XlMemoryConfig {
    const SUMMARY: &'static str =
        "segment recurrence: each layer attends over the stop-gradient states of the previous segment";
    const PAPER: &'static str = "Dai et al. 2019, Transformer-XL";
    const CAPS: Capabilities = Capabilities::NEUTRAL;

    /// A memory longer than the harness's sequences, so decoding across segment boundaries
    /// (the test kit runs it on segments of 4) still sees every earlier token.
    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![("length 12", Self { length: 12 })]
    }
}

impl MemoryKind for XlMemoryConfig {
    fn validate(&self, _segment: usize) -> Result<(), ConfigError> {
        check(self.length > 0, || "model.memory.length must be at least 1".into())
    }

    fn init(&self, _d_model: usize, segment: usize, _device: &Device) -> Option<LayerMemory> {
        Some(LayerMemory {
            length: self.length,
            compressed_length: 0,
            segment,
            compressor: None,
            reconstruction_weight: 0.0,
            autoencoding_weight: 0.0,
        })
    }
}
