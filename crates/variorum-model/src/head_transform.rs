//! BERT's prediction-head transform (`model.head_transform`; Devlin et al. 2019, the released
//! code's `cls/predictions/transform`): before the output projection, each position's vector
//! goes through a dense layer, the activation and a norm,
//!
//!   h' = Norm(φ(h W + b)),   logits = h' Eᵀ + c
//!
//! (E the tied embedding, c `model.head_bias`). The norm is the blocks' kind with their ε, and φ
//! the feed-forward kind's (BERT's and RoBERTa's exact GELU with `kind = "gelu"`, FNet's tanh
//! form with `gelu-tanh`: the transform reads `hidden_act`, as the FFN does).

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use variorum_block::{FeedForwardKind, Norm, ResidualConfig};

/// The dense layer, the feed-forward kind's activation and the norm before a masked model's
/// output projection.
#[derive(Module, Debug)]
pub struct HeadTransform {
    /// `[d_model, d_model]` with a bias.
    pub dense: Linear,
    /// The norm after the activation.
    pub norm: Norm,
    /// φ: the feed-forward kind's activation.
    #[module(skip)]
    pub activation: FeedForwardKind,
}

impl HeadTransform {
    /// A transform over `d_model` channels with the blocks' norm `residual` and the activation
    /// of `activation`; weights from N(0, `init_std`²), bias 0, norm at its identity.
    pub fn new(
        d_model: usize,
        residual: &ResidualConfig,
        activation: FeedForwardKind,
        init_std: f64,
        device: &Device,
    ) -> Self {
        Self {
            dense: LinearConfig::new(d_model, d_model)
                .with_initializer(Initializer::Normal { mean: 0.0, std: init_std })
                .init(device),
            norm: residual.norm.init(d_model, residual.norm_eps, device),
            activation,
        }
    }

    /// `[b, len, d_model]` → `[b, len, d_model]`.
    pub fn forward(&self, h: Tensor<3>) -> Tensor<3> {
        self.norm.forward(self.activation.spec().activate(variorum_kernels::linear::forward(&self.dense, h)))
    }
}
