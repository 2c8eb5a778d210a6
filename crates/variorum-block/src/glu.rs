//! Gated linear unit FFNs, `kind = "glu" | "geglu" | "geglu-tanh" | "swiglu"`:
//!
//! FFN(x) = (σ(x W) ⊗ x V) W₂,   σ = sigmoid (GLU; Dauphin et al. 2017), GELU (GEGLU) or Swish
//! (SwiGLU; both Shazeer 2020). `geglu-tanh` is GEGLU with GELU's tanh approximation, as T5 v1.1
//! computes it (Mesh TensorFlow's `gelu`, transformers' `gated-gelu` → `gelu_new`).
//!
//! The gate, φ(x W) ⊗ x V, is one fused op on flex ([`variorum_kernels::gated`]) for glu, geglu
//! and swiglu; geglu-tanh slices and multiplies.
//!
//! Following Shazeer, the layers have no biases in the paper; here `bias` (default true) applies
//! as for every kind, and d_ff is the width of the gate (and of the value).

use burn::prelude::*;
use burn::tensor::activation::{sigmoid, silu};
use variorum_core::{Capabilities, Declared};
use variorum_kernels::gated::{Gate, gated};
use variorum_kernels::gelu::gelu;

use crate::dense_ffn::gelu_tanh;
use crate::feed_forward::FeedForwardActivation;

const GATED_SUMMARY: &str = "gated linear unit FFN, fused gate/value projection";
const POSITION_WISE: Capabilities = Capabilities::NEUTRAL;

/// `model.feed_forward.kind = "glu"`.
#[derive(Debug, Clone, Copy)]
pub struct GluFfn;

/// `model.feed_forward.kind = "geglu"`.
#[derive(Debug, Clone, Copy)]
pub struct GegluFfn;

/// `model.feed_forward.kind = "geglu-tanh"`.
#[derive(Debug, Clone, Copy)]
pub struct GegluTanhFfn;

/// `model.feed_forward.kind = "swiglu"`.
#[derive(Debug, Clone, Copy)]
pub struct SwigluFfn;

impl Declared for GluFfn {
    const SUMMARY: &'static str = GATED_SUMMARY;
    const PAPER: &'static str = "Dauphin et al. 2017, Language Modeling with Gated Convolutional Networks";
    const CAPS: Capabilities = POSITION_WISE;
}

impl Declared for GegluFfn {
    const SUMMARY: &'static str = GATED_SUMMARY;
    const PAPER: &'static str = "Shazeer 2020, GLU Variants Improve Transformer";
    const CAPS: Capabilities = POSITION_WISE;
}

impl Declared for GegluTanhFfn {
    const SUMMARY: &'static str = "gated linear unit FFN, GELU's tanh approximation on the gate";
    const PAPER: &'static str = "Shazeer 2020, GLU Variants Improve Transformer; Raffel et al. 2020 (T5 v1.1)";
    const CAPS: Capabilities = POSITION_WISE;
}

impl Declared for SwigluFfn {
    const SUMMARY: &'static str = GATED_SUMMARY;
    const PAPER: &'static str = "Shazeer 2020, GLU Variants Improve Transformer";
    const CAPS: Capabilities = POSITION_WISE;
}

impl FeedForwardActivation for GluFfn {
    fn gated(&self) -> bool {
        true
    }

    fn activate(&self, gate: Tensor<3>) -> Tensor<3> {
        sigmoid(gate)
    }

    fn gate(&self, h: Tensor<3>) -> Tensor<3> {
        gated(h, Gate::Sigmoid)
    }
}

impl FeedForwardActivation for GegluFfn {
    fn gated(&self) -> bool {
        true
    }

    fn activate(&self, gate: Tensor<3>) -> Tensor<3> {
        gelu(gate)
    }

    fn gate(&self, h: Tensor<3>) -> Tensor<3> {
        gated(h, Gate::Gelu)
    }
}

impl FeedForwardActivation for GegluTanhFfn {
    fn gated(&self) -> bool {
        true
    }

    fn activate(&self, gate: Tensor<3>) -> Tensor<3> {
        gelu_tanh(gate)
    }
}

impl FeedForwardActivation for SwigluFfn {
    fn gated(&self) -> bool {
        true
    }

    fn activate(&self, gate: Tensor<3>) -> Tensor<3> {
        silu(gate)
    }

    fn gate(&self, h: Tensor<3>) -> Tensor<3> {
        gated(h, Gate::Silu)
    }
}

#[cfg(test)]
mod tests {
    use crate::feed_forward::{FeedForwardConfig, FeedForwardKind};
    use burn::prelude::*;
    use burn::tensor::Distribution;

    /// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
    fn erf(x: f64) -> f64 {
        let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
        let poly =
            t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
        (1.0 - poly * (-x * x).exp()).copysign(x)
    }

    /// Each gated kind is (φ(x W + b) ⊗ (x V + c)) W₂ + b₂ with its own φ, W the first half of
    /// the fused up-projection: computed here by hand from the weights.
    #[test]
    fn every_gated_kind_is_its_formula() {
        let dev = Device::flex();
        let sigmoid = |g: f64| 1.0 / (1.0 + (-g).exp());
        let kinds: [(FeedForwardKind, &dyn Fn(f64) -> f64); 4] = [
            (FeedForwardKind::Glu, &sigmoid),
            (FeedForwardKind::Geglu, &|g: f64| 0.5 * g * (1.0 + erf(g / std::f64::consts::SQRT_2))),
            (FeedForwardKind::GegluTanh, &|g: f64| {
                0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g.powi(3))).tanh())
            }),
            (FeedForwardKind::Swiglu, &|g: f64| g * sigmoid(g)),
        ];
        let (d, f) = (4, 3);
        for (kind, phi) in kinds {
            let ffn = FeedForwardConfig { kind, d_ff: Some(f), ..Default::default() }.init(d, 0.0, 0.7, 0.7, &dev);
            let x: Tensor<3> = Tensor::random([1, 2, d], Distribution::Normal(0.0, 1.0), &dev);
            let got = ffn.forward(x.clone()).into_data().try_to_vec::<f32>().unwrap();
            let v = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
            let v1 = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();
            let (up, up_b) = (v(ffn.up.weight.val()), v1(ffn.up.bias.as_ref().unwrap().val()));
            let (down, down_b) = (v(ffn.down.weight.val()), v1(ffn.down.bias.as_ref().unwrap().val()));
            let xs = x.into_data().try_to_vec::<f32>().unwrap();
            for t in 0..2 {
                let row = &xs[t * d..(t + 1) * d];
                let proj =
                    |j: usize| up_b[j] as f64 + (0..d).map(|i| row[i] as f64 * up[i * 2 * f + j] as f64).sum::<f64>();
                let hidden: Vec<f64> = (0..f).map(|j| phi(proj(j)) * proj(f + j)).collect();
                for o in 0..d {
                    let want = down_b[o] as f64 + (0..f).map(|j| hidden[j] * down[j * d + o] as f64).sum::<f64>();
                    let g = got[t * d + o] as f64;
                    assert!((g - want).abs() < 1e-5, "{}: position {t}, output {o}: {g} vs {want}", kind.name());
                }
            }
        }
    }
}
