//! Average Attention Network (Zhang et al. 2018), the `average` kind: the decoder's
//! self-attention replaced by a cumulative average of the inputs, a feed-forward layer and a
//! gate,
//!
//! g_j = FFN((1/j) Σ_{k≤j} y_k),   [i_j; f_j] = σ(W [y_j; g_j] + b),   h_j = i_j ⊙ y_j + f_j ⊙ g_j,
//!
//! where FFN(x) = ReLU(x W₁ + b₁) W₂ + b₂. The block's residual and norm wrap h as they wrap any
//! attention. Bidirectionally the average runs over all positions. Decoding keeps the running sum
//! and count (the kernel state of [`crate::kernelised::kernel`] with φ ≡ 1), so each token costs O(d),
//! whatever the context.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{relu, sigmoid};
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::projections;
use crate::kernelised::kernel::{self, Features, KernelState};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

/// `model.attention` with `kind = "average"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AverageAttentionConfig {
    /// Hidden width of the average layer's FFN. Default `d_model`.
    pub d_ff: Option<usize>,
    /// Positions per chunk of the causal average. Default 64.
    pub chunk: usize,
}

impl Default for AverageAttentionConfig {
    fn default() -> Self {
        Self { d_ff: None, chunk: 64 }
    }
}

impl AverageAttentionConfig {
    /// Hidden width of the FFN: `d_ff`, or `d_model`.
    pub fn d_ff(&self, d_model: usize) -> usize {
        self.d_ff.unwrap_or(d_model)
    }

    /// The layer: `init_std` for W₁ and the gates, `out_std` for W₂ (the FFN's output).
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> AverageAttention {
        let linear =
            |i, o, std| LinearConfig::new(i, o).with_initializer(Initializer::Normal { mean: 0.0, std }).init(device);
        let d_ff = self.d_ff(d_model);
        AverageAttention {
            ffn_in: linear(d_model, d_ff, init_std),
            ffn_out: linear(d_ff, d_model, out_std),
            gate: linear(2 * d_model, 2 * d_model, init_std),
            chunk: self.chunk,
        }
    }
}

impl AttentionKind for AverageAttentionConfig {
    type Module = AverageAttention;
    const SUMMARY: &'static str = "cumulative average of the inputs, FFN and input/forget gates instead of self-attention; O(d) per decoded token";
    const PAPER: &'static str = "Zhang et al. 2018, Accelerating Neural Transformer via an Average Attention Network";
    // no `cross`: a source would be read through its mean alone (the paper replaces decoder
    // self-attention only)
    const CAPS: Capabilities = caps::NO_SCORES;

    fn expanded(&self, d_model: usize) -> Self {
        Self { d_ff: Some(self.d_ff(d_model)), ..self.clone() }
    }

    fn validate(&self, _d_model: usize) -> Result<(), ConfigError> {
        check(self.d_ff != Some(0), || "model.attention.d_ff must be at least 1".into())?;
        check(self.chunk >= 1, || "model.attention.chunk must be at least 1".into())
    }

    /// Multiply–adds per token: FFN and gate (the average itself is O(d), whatever `len_k`).
    fn flops_per_token(&self, d_model: usize, _len_k: usize) -> u64 {
        let (d, f) = (d_model as u64, self.d_ff(d_model) as u64);
        2 * (2 * d * f + 4 * d * d)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> AverageAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    /// Small chunks, so the chunked causal average and its carried sums are exercised.
    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![TestVariant::new("", Self { chunk: 3, ..Default::default() })]
    }
}

/// An Average Attention Network layer ([`AverageAttentionConfig`]): cumulative average, FFN
/// and gates.
#[derive(Module, Debug)]
pub struct AverageAttention {
    /// W₁, b₁ of the FFN, `d_model → d_ff`.
    pub ffn_in: Linear,
    /// W₂, b₂ of the FFN, `d_ff → d_model`.
    pub ffn_out: Linear,
    /// W, b of the input and forget gates, `[2d, 2d]`.
    pub gate: Linear,
    /// Positions per chunk of the causal average.
    pub chunk: usize,
}

impl AverageAttention {
    /// h = i ⊙ y + f ⊙ g, `[b, len_q, d_model]`. Causally the average continues from the running
    /// sum and count in `state` and leaves them there: O(d) per decoded token.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut Option<KernelState>>) -> AttentionOutput {
        let y = input.query;
        let source = input.key_value.unwrap_or_else(|| y.clone());
        let [b, lq, d] = y.dims();
        let lk = source.dims()[1];
        let device = y.device();
        // the average as kernelised attention with φ ≡ 1: one "head" of width d
        let ones = |l: usize| Tensor::<4>::ones([b, 1, l, 1], &device);
        let k = projections::hide_padding(ones(lk), input.mask.padding.as_ref());
        let f = Features {
            q: ones(lq),
            k,
            v: source.unsqueeze_dim(1),
            k_shift: None,
            gate: None,
            rescale: false,
            min_normaliser: kernel::MIN_NORMALISER,
        };
        let avg = if input.mask.causal { kernel::causal(f, state, self.chunk) } else { kernel::bidirectional(f) };
        let g = self.ffn_out.forward(relu(self.ffn_in.forward(avg.reshape([b, lq, d]))));
        let gates = sigmoid(self.gate.forward(Tensor::cat(vec![y.clone(), g.clone()], 2)));
        let (i, f) = (gates.clone().narrow(2, 0, d), gates.narrow(2, d, d));
        AttentionOutput { context: i * y + f * g, weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for AverageAttention {
    /// Decoding state: the running sum and count, `Option<KernelState>` in the layer's state.
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        AverageAttention::forward(self, input, state.map(|s| s.get_or_default::<Option<KernelState>>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use variorum_core::AttentionMask;

    /// The paper's layer written out position by position: the average of y₁…y_j (of every y
    /// bidirectionally), the FFN ReLU(a W₁ + b₁) W₂ + b₂, the gates σ(W [y; g] + b) split into
    /// input i and forget f, and h = i ⊙ y + f ⊙ g — against the chunked kernel (chunks of 3 over
    /// 8 positions, so the running sums cross chunks).
    #[test]
    fn the_layer_is_the_cumulative_average_its_ffn_and_gates() {
        let device = Device::default();
        let (b, len, d) = (2usize, 8usize, 4usize);
        let layer = AverageAttentionConfig { d_ff: Some(6), chunk: 3 }.init(d, 0.5, 0.5, &device);
        let y = Tensor::<3>::random([b, len, d], Distribution::Normal(0.0, 1.0), &device);
        for causal in [true, false] {
            let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
            let got = layer.forward(AttentionInput::self_attention(y.clone(), &mask), None).context;
            for j in 0..len {
                let seen = if causal { j + 1 } else { len };
                let average = y.clone().narrow(1, 0, seen).mean_dim(1);
                let g = layer.ffn_out.forward(relu(layer.ffn_in.forward(average)));
                let yj = y.clone().narrow(1, j, 1);
                let gates = sigmoid(layer.gate.forward(Tensor::cat(vec![yj.clone(), g.clone()], 2)));
                let want = gates.clone().narrow(2, 0, d) * yj + gates.narrow(2, d, d) * g;
                let diff = (got.clone().narrow(1, j, 1) - want).abs().max().into_scalar::<f32>();
                assert!(diff < 1e-5, "causal {causal}, position {j}: off by {diff}");
            }
        }
    }
}
