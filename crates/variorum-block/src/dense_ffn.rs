//! The two-layer position-wise FFN, `kind = "relu"` (Vaswani et al. 2017) and `kind = "gelu"`
//! (Hendrycks & Gimpel 2016; GPT):
//!
//! FFN(x) = φ(x W₁ + b₁) W₂ + b₂,   φ = ReLU or GELU (the exact erf form, a fused kernel on the CPU).

use burn::prelude::*;
use burn::tensor::activation::relu;
use variorum_core::{Capabilities, Declared};
use variorum_kernels::gelu::gelu;

use crate::feed_forward::FeedForwardActivation;

const POSITION_WISE: Capabilities = Capabilities::NEUTRAL;

/// `model.feed_forward.kind = "relu"`.
#[derive(Debug, Clone, Copy)]
pub struct ReluFfn;

/// `model.feed_forward.kind = "gelu"`.
#[derive(Debug, Clone, Copy)]
pub struct GeluFfn;

impl Declared for ReluFfn {
    const SUMMARY: &'static str = "two-layer position-wise FFN";
    const PAPER: &'static str = "Vaswani et al. 2017, Attention Is All You Need";
    const CAPS: Capabilities = POSITION_WISE;
}

impl Declared for GeluFfn {
    const SUMMARY: &'static str = "two-layer position-wise FFN";
    const PAPER: &'static str = "Hendrycks & Gimpel 2016, Gaussian Error Linear Units; Radford et al. 2018 (GPT)";
    const CAPS: Capabilities = POSITION_WISE;
}

impl FeedForwardActivation for ReluFfn {
    fn activate(&self, h: Tensor<3>) -> Tensor<3> {
        relu(h)
    }
}

impl FeedForwardActivation for GeluFfn {
    fn activate(&self, h: Tensor<3>) -> Tensor<3> {
        gelu(h)
    }
}
