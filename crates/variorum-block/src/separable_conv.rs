//! The Universal Transformer's other transition (Dehghani et al. 2019), `kind = "separable-conv"`:
//!
//! FFN(x) = ReLU(DepthwiseConv_k(x) W₁ + b₁) W₂ + b₂,
//!
//! a depthwise-separable convolution over time — a per-channel filter of width k
//! (`kernel_size`) followed by the pointwise projection W₁ — then ReLU and the position-wise W₂.
//! It is causal: position t sees inputs t−k+1…t (zeros before the start). Incremental decoding
//! keeps the last k−1 inputs in the layer state ([`crate::FeedForward::forward_with`]). Choice:
//! one separable convolution and one position-wise layer (tensor2tensor stacks two separable
//! ones).

use burn::nn::conv::Conv1d;
use burn::prelude::*;
use burn::tensor::activation::relu;
use variorum_core::{Capabilities, Declared};

use crate::feed_forward::FeedForwardActivation;

/// `model.feed_forward.kind = "separable-conv"`.
#[derive(Debug, Clone, Copy)]
pub struct SeparableConvFfn;

impl Declared for SeparableConvFfn {
    const SUMMARY: &'static str =
        "causal depthwise-separable convolution over time, ReLU, position-wise layer (incremental window state)";
    const PAPER: &'static str =
        "Dehghani et al. 2019, Universal Transformers; Chollet 2017, Xception (depthwise-separable convolution)";
    /// A convolution over time keeps a window of earlier inputs as state: not position-wise.
    const CAPS: Capabilities = Capabilities { position_wise: false, ..Capabilities::NEUTRAL };
}

impl FeedForwardActivation for SeparableConvFfn {
    fn mixes_time(&self) -> bool {
        true
    }

    fn activate(&self, h: Tensor<3>) -> Tensor<3> {
        relu(h)
    }
}

/// y_t = Σ_{j<k} w_j ⊙ x_{t−j} + b per channel, with x before the start taken from `window` (or
/// zeros); `window` then holds the last k−1 inputs.
pub(crate) fn causal_depthwise(conv: &Conv1d, x: Tensor<3>, window: Option<&mut Option<Tensor<3>>>) -> Tensor<3> {
    let [b, l, d] = x.dims();
    let k = conv.weight.dims()[2];
    let past = k - 1;
    let x = if past == 0 {
        x
    } else {
        let before = window.as_deref().cloned().flatten().unwrap_or_else(|| Tensor::zeros([b, past, d], &x.device()));
        let padded = Tensor::cat(vec![before, x], 1);
        if let Some(w) = window {
            *w = Some(padded.clone().narrow(1, l, past).detach());
        }
        padded
    };
    conv.forward(x.swap_dims(1, 2)).swap_dims(1, 2)
}
