//! Gated linear unit FFNs, `kind = "glu" | "geglu" | "swiglu"`:
//!
//! FFN(x) = (σ(x W) ⊗ x V) W₂,   σ = sigmoid (GLU; Dauphin et al. 2017), GELU (GEGLU) or Swish
//! (SwiGLU; both Shazeer 2020).
//!
//! The gate, φ(x W) ⊗ x V, is one fused op on flex ([`variorum_kernels::gated`]).
//!
//! Following Shazeer, the layers have no biases in the paper; here `bias` (default true) applies
//! as for every kind, and d_ff is the width of the gate (and of the value).

use burn::prelude::*;
use burn::tensor::activation::{sigmoid, silu};
use variorum_core::{Capabilities, Declared};
use variorum_kernels::gated::{Gate, gated};
use variorum_kernels::gelu::gelu;

use crate::feed_forward::FeedForwardActivation;

const GATED_SUMMARY: &str = "gated linear unit FFN, fused gate/value projection";
const POSITION_WISE: Capabilities = Capabilities::NEUTRAL;

/// `model.feed_forward.kind = "glu"`.
#[derive(Debug, Clone, Copy)]
pub struct GluFfn;

/// `model.feed_forward.kind = "geglu"`.
#[derive(Debug, Clone, Copy)]
pub struct GegluFfn;

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
