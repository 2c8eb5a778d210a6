//! BERT's prediction-head transform (`model.head_transform`; Devlin et al. 2019, the released
//! code's `cls/predictions/transform`): before the output projection, each position's vector
//! goes through a dense layer, GELU and a norm,
//!
//!   h' = Norm(GELU(h W + b)),   logits = h' Eᵀ + c
//!
//! (E the tied embedding, c `model.head_bias`). The norm is the blocks' kind with their ε.
//! GELU is the exact erf form, as BERT and RoBERTa compute it (`hidden_act = "gelu"`).

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use variorum_block::{Norm, ResidualConfig};

/// The dense layer, GELU and norm before a masked model's output projection.
#[derive(Module, Debug)]
pub struct HeadTransform {
    /// `[d_model, d_model]` with a bias.
    pub dense: Linear,
    /// The norm after the activation.
    pub norm: Norm,
}

impl HeadTransform {
    /// A transform over `d_model` channels with the blocks' norm `residual`; weights from
    /// N(0, `init_std`²), bias 0, norm at its identity.
    pub fn new(d_model: usize, residual: &ResidualConfig, init_std: f64, device: &Device) -> Self {
        Self {
            dense: LinearConfig::new(d_model, d_model)
                .with_initializer(Initializer::Normal { mean: 0.0, std: init_std })
                .init(device),
            norm: residual.norm.init(d_model, residual.norm_eps, device),
        }
    }

    /// `[b, len, d_model]` → `[b, len, d_model]`.
    pub fn forward(&self, h: Tensor<3>) -> Tensor<3> {
        self.norm.forward(variorum_kernels::gelu::gelu(variorum_kernels::linear::forward(&self.dense, h)))
    }
}
