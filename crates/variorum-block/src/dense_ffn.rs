//! The two-layer position-wise FFN, `kind = "relu"` (Vaswani et al. 2017), `kind = "gelu"`
//! (Hendrycks & Gimpel 2016; GPT) and `kind = "gelu-tanh"` (GPT-2):
//!
//! FFN(x) = φ(x W₁ + b₁) W₂ + b₂,   φ = ReLU, GELU (the exact erf form, a fused kernel on the CPU),
//! or GELU's tanh approximation  ½x(1 + tanh(√(2/π)(x + 0.044715x³)))  (Hendrycks & Gimpel's eq. 3,
//! what GPT-2 and BERT's original code compute: `gelu_new` / `gelu_pytorch_tanh` in transformers).

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

/// `model.feed_forward.kind = "gelu-tanh"`.
#[derive(Debug, Clone, Copy)]
pub struct GeluTanhFfn;

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

impl Declared for GeluTanhFfn {
    const SUMMARY: &'static str = "two-layer position-wise FFN, GELU's tanh approximation";
    const PAPER: &'static str =
        "Hendrycks & Gimpel 2016, Gaussian Error Linear Units (eq. 3); Radford et al. 2019 (GPT-2)";
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

impl FeedForwardActivation for GeluTanhFfn {
    fn activate(&self, h: Tensor<3>) -> Tensor<3> {
        gelu_tanh(h)
    }
}

/// √(2/π).
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// ½x(1 + tanh(√(2/π)(x + 0.044715x³))), composed from Burn's ops.
pub(crate) fn gelu_tanh(x: Tensor<3>) -> Tensor<3> {
    let inner = (x.clone() + x.clone().powi_scalar(3) * 0.044715) * SQRT_2_OVER_PI;
    x * (inner.tanh() + 1.0) * 0.5
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tanh form at points where it and the exact erf form differ by 1.5e-5 to 4e-4 (values
    /// from the formula in f64): a φ that were the erf form, or a wrong constant, fails.
    #[test]
    fn gelu_tanh_is_the_tanh_approximation_not_the_erf_form() {
        let device = Device::default();
        let x = [-3.0f32, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0];
        let want = [-0.0036374f32, -0.158808, -0.154286, 0.0, 0.345714, 0.841192, 1.9545977, 2.9963626];
        let input = Tensor::<3>::from_data(TensorData::new(x.to_vec(), [1, 1, x.len()]), &device);
        let got = GeluTanhFfn.activate(input).into_data().try_to_vec::<f32>().unwrap();
        for ((g, w), x) in got.iter().zip(want).zip(x) {
            assert!((g - w).abs() < 2e-6, "gelu_tanh({x}) = {g}, want {w}");
        }
    }
}
