//! The Compressive Transformer's memory (Rae et al. 2020), `model.memory` with
//! `kind = "compressive"`: the states that fall out of the FIFO memory are not dropped but
//! compressed by a rate c into a second FIFO, the compressed memory; attention runs over
//! [compressed memory; memory; segment], oldest first. The compression functions are in
//! [`crate::compression`], the FIFOs in [`crate::memory`].

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, Declared, error::check};

use crate::compression::CompressionKind;
use crate::memory::{LayerMemory, MemoryKind};

/// `model.memory` with `kind = "compressive"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompressiveMemoryConfig {
    /// FIFO memory per layer (n_m). Default 32.
    pub length: usize,
    /// Compressed memory per layer (n_cm). Default 32.
    pub compressed_length: usize,
    /// Compression rate c: states per compressed state. Default 2.
    pub rate: usize,
    /// `max-pool`, `mean-pool`, `conv` (default), `dilated-conv` or `most-used`.
    pub compression: CompressionKind,
    /// Weight of the attention-reconstruction loss (0 = off). Default 1.
    pub reconstruction_weight: f64,
    /// Weight of the auto-encoding loss (0 = off). Default 0.
    pub autoencoding_weight: f64,
}

impl Default for CompressiveMemoryConfig {
    fn default() -> Self {
        Self {
            length: 32,
            compressed_length: 32,
            rate: 2,
            compression: CompressionKind::Conv,
            reconstruction_weight: 1.0,
            autoencoding_weight: 0.0,
        }
    }
}

impl Declared for CompressiveMemoryConfig {
    const SUMMARY: &'static str = "FIFO memory whose evicted states are compressed (pooling, convolution, most-used) into a second memory; reconstruction losses";
    const PAPER: &'static str = "Rae et al. 2020, Compressive Transformers for Long-Range Sequence Modelling";
    const CAPS: Capabilities = Capabilities { aux_losses: true, ..Capabilities::NEUTRAL };

    /// Each compression function that learns or reads usage, with both losses on.
    fn test_variants() -> Vec<(&'static str, Self)> {
        [
            ("conv", CompressionKind::Conv),
            ("max-pool", CompressionKind::MaxPool),
            ("dilated-conv", CompressionKind::DilatedConv),
            ("most-used", CompressionKind::MostUsed),
        ]
        .into_iter()
        .map(|(name, compression)| {
            let c = Self {
                length: 4,
                compressed_length: 4,
                rate: 2,
                compression,
                autoencoding_weight: 0.5,
                ..Self::default()
            };
            (name, c)
        })
        .collect()
    }
}

impl MemoryKind for CompressiveMemoryConfig {
    fn validate(&self, segment: usize) -> Result<(), ConfigError> {
        check(self.length > 0 && self.compressed_length > 0, || {
            "model.memory.length and compressed_length must be at least 1".into()
        })?;
        check(self.rate > 0, || "model.memory.rate must be at least 1".into())?;
        check(segment % self.rate == 0 && self.length % self.rate == 0, || {
            format!(
                "model.memory.rate = {} must divide model.seq_len = {segment} and model.memory.length = {}, so that whole groups of states are compressed",
                self.rate, self.length
            )
        })?;
        check(self.reconstruction_weight >= 0.0 && self.autoencoding_weight >= 0.0, || {
            "model.memory.reconstruction_weight and autoencoding_weight must be >= 0".into()
        })
    }

    fn init(&self, d_model: usize, segment: usize, device: &Device) -> Option<LayerMemory> {
        Some(LayerMemory {
            length: self.length,
            compressed_length: self.compressed_length,
            segment,
            compressor: Some(self.compression.init(d_model, self.rate, self.autoencoding_weight > 0.0, device)),
            reconstruction_weight: self.reconstruction_weight,
            autoencoding_weight: self.autoencoding_weight,
        })
    }
}
