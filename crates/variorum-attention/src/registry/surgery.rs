//! Model surgery across kinds: a trained layer of one kind rewritten as another where a map
//! between them exists. The maps live beside their kinds (the collaborative heads' in
//! `scores::collaborative`); this module only opens the registry's enums for them, so that a
//! caller (`variorum collaborate`) names no kind.

use burn::prelude::*;

use crate::registry::{Attention, AttentionConfig};
use crate::scores::collaborative::{CollaborativeAttention, CollaborativeConfig};

impl AttentionConfig {
    /// This setting as collaborative heads of width `shared_dim` (Cordonnier et al. 2020,
    /// [`CollaborativeConfig::from_full`]), with a line for each setting the new form does not
    /// carry. Refused, in one line, for a kind without that map (every kind but `full`).
    pub fn as_collaborative(
        &self,
        d_model: usize,
        shared_dim: usize,
    ) -> Result<(AttentionConfig, Vec<String>), String> {
        match self {
            AttentionConfig::Full(full) => {
                let (config, dropped) = CollaborativeConfig::from_full(full, d_model, shared_dim);
                Ok((AttentionConfig::Collaborative(config), dropped))
            }
            other => Err(format!(
                "model.attention.kind = \"{}\": only `full` multi-head attention can be re-parameterised into collaborative heads",
                other.kind()
            )),
        }
    }
}

impl Attention {
    /// This trained layer as collaborative heads of width `shared_dim`, and the relative error
    /// of its query–key products ([`CollaborativeAttention::from_heads`]: 0 when exact).
    /// Refused, in one line, for a layer of another kind than `full`, a width out of range or a
    /// position scheme the new form cannot carry.
    pub fn as_collaborative(&self, shared_dim: usize, device: &Device) -> Result<(Attention, f64), String> {
        match self {
            Attention::Full(layer) => CollaborativeAttention::from_heads(layer, shared_dim, device)
                .map(|(layer, error)| (Attention::Collaborative(layer), error)),
            _ => {
                Err("only a `full` multi-head attention layer can be re-parameterised into collaborative heads".into())
            }
        }
    }
}
