//! The attention contract shared by every mechanism (its state: [`crate::state`]).

use burn::prelude::*;
use variorum_core::{AttentionMask, AuxLosses};

use crate::state::CarriedMaps;
use variorum_position::PositionConfig;

/// What every attention mechanism receives.
#[derive(Debug)]
pub struct AttentionInput<'a> {
    /// Hidden states the queries come from, `[batch, len_q, d_model]`.
    pub query: Tensor<3>,
    /// Hidden states keys and values come from, `[batch, len_k, d_model]`; `None` = self-attention.
    pub key_value: Option<Tensor<3>>,
    /// Causality, padding and absolute positions of both sides.
    pub mask: &'a AttentionMask,
    /// Precomputed dense mask of `mask` for `[len_q, len_k]` (built once per forward and shared by
    /// every layer); mechanisms that need it and find `None` build it themselves.
    pub dense_mask: Option<Tensor<4, Bool>>,
    /// Return the attention weights (for inspection).
    pub need_weights: bool,
    /// The previous block application's maps and the slot for this one's
    /// ([`CarriedMaps`]); `None` outside a model's block loop (one layer alone, as the first;
    /// a Lazyformer layer that reuses maps cannot run so).
    pub carried: Option<&'a mut CarriedMaps>,
}

impl<'a> AttentionInput<'a> {
    /// Self-attention: keys and values come from `query`.
    pub fn self_attention(query: Tensor<3>, mask: &'a AttentionMask) -> Self {
        Self { query, key_value: None, mask, dense_mask: None, need_weights: false, carried: None }
    }

    /// Attention from `query` to another sequence, `key_value: [batch, len_k, d_model]` (a
    /// memory, the encoder output).
    pub fn cross_attention(query: Tensor<3>, key_value: Tensor<3>, mask: &'a AttentionMask) -> Self {
        Self { query, key_value: Some(key_value), mask, dense_mask: None, need_weights: false, carried: None }
    }

    /// With `m` as the precomputed dense mask (`None`: a mechanism that needs one builds it).
    pub fn with_dense_mask(mut self, m: Option<Tensor<4, Bool>>) -> Self {
        self.dense_mask = m;
        self
    }

    /// With `c`, the model's slot for maps carried between block applications.
    pub fn with_carried(mut self, c: &'a mut CarriedMaps) -> Self {
        self.carried = Some(c);
        self
    }

    /// Asking for the attention weights in the output.
    pub fn with_weights(mut self) -> Self {
        self.need_weights = true;
        self
    }
}

/// What every attention mechanism returns.
#[derive(Debug)]
pub struct AttentionOutput {
    /// `[batch, len_q, d_model]`
    pub context: Tensor<3>,
    /// `[batch, n_heads, len_q, len_k]` when asked for and when the mechanism forms them.
    pub weights: Option<Tensor<4>>,
    /// Extra losses (already weighted), and policies' per-row log-probabilities named
    /// `variorum_core::REINFORCE_PREFIX`… (`[batch]`, not losses: the model turns them into one).
    pub aux_losses: AuxLosses,
}

/// The position scheme a mechanism is built with, and the model's context length (the size of
/// learned position tables).
#[derive(Debug, Clone, Copy)]
pub struct Positioning<'a> {
    /// The model's position scheme (a relative one is built into the layer).
    pub config: &'a PositionConfig,
    /// The model's context length, in tokens (the size of learned position tables).
    pub context: usize,
}

impl Positioning<'_> {
    /// No relative scheme (absolute positions, or none).
    pub const NONE: Positioning<'static> =
        Positioning { config: &PositionConfig::None(variorum_position::NoPositionConfig {}), context: 0 };
}
