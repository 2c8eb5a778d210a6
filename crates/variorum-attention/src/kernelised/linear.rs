//! Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), the `linear` kind:
//!
//! V'_i = φ(q_i)ᵀ Σ_{j≤i} φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_{j≤i} φ(k_j),   φ(x) = elu(x) + 1,
//!
//! bidirectional as φ(Q)(φ(K)ᵀV), causal by chunked prefix sums, and decoded as an RNN with the
//! state (S_t, z_t) — O(1) per token in the context length ([`crate::kernelised::kernel`]).

use burn::prelude::*;
use burn::tensor::activation::elu;
use variorum_core::{Capabilities, ConfigError};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::projections;
use crate::engine::projections::HeadProjections;
use crate::kernelised::kernel::{self, FeatureMap, Features, KernelState, kernel_flops};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "linear"`.
    pub struct LinearAttentionConfig [n_heads, head_dim, bias] {
        /// Positions per chunk of the causal form (memory ∝ chunk, not length). Default 64.
        pub chunk: usize = 64,
    }
}

impl LinearAttentionConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output projection.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> LinearAttention {
        let h = self.head_shape(d_model);
        LinearAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            chunk: self.chunk,
        }
    }
}

impl AttentionKind for LinearAttentionConfig {
    type Module = LinearAttention;
    const SUMMARY: &'static str = "linear attention, φ = elu + 1: φ(Q)(φ(K)ᵀV); causal by chunked prefix sums; decodes as an RNN (O(1) per token)";
    const PAPER: &'static str = "Katharopoulos et al. 2020, Transformers are RNNs";
    const CAPS: Capabilities = Capabilities { cross: true, ..caps::NO_SCORES };

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, self.chunk, d_model)
    }

    head_settings_hooks!();

    /// The projections plus the chunked kernel sums, with φ of the head size.
    fn flops_per_token(&self, d_model: usize, _len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        kernel_flops(h, h.head_dim, self.chunk)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> LinearAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    /// Small chunks, so the chunked causal form and its carried sums are exercised at the
    /// harness's lengths.
    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![TestVariant::new("", Self { chunk: 3, ..Default::default() })]
    }
}

/// A linear attention layer ([`LinearAttentionConfig`]), φ = elu + 1.
#[derive(Module, Debug)]
pub struct LinearAttention {
    /// The q/k/v and output projections.
    pub proj: HeadProjections,
    /// Positions per chunk of the causal form.
    pub chunk: usize,
}

impl LinearAttention {
    /// φ(Q)(φ(K)ᵀV) normalised, `[b, len_q, d_model]`. Causally the sums continue from `state`
    /// and are left in it: O(1) per decoded token in the context length.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut Option<KernelState>>) -> AttentionOutput {
        let min = kernel::MIN_NORMALISER;
        let fused = kernel::fused_self_attention(
            &self.proj,
            &input,
            FeatureMap::EluPlusOne,
            None,
            None,
            self.chunk,
            min,
            state.is_some(),
        );
        if let Some(out) = fused {
            return out;
        }
        let (q, k, v) = self.proj.split(input.query, input.key_value);
        let phi = |x: Tensor<4>| elu(x, 1.0).add_scalar(1.0);
        let k = projections::hide_padding(phi(k), input.mask.padding.as_ref());
        let f = Features {
            q: phi(q),
            k,
            v,
            k_shift: None,
            gate: None,
            rescale: false,
            min_normaliser: kernel::MIN_NORMALISER,
        };
        let context = if input.mask.causal { kernel::causal(f, state, self.chunk) } else { kernel::bidirectional(f) };
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for LinearAttention {
    /// Decoding state: the carried sums, `Option<KernelState>` in the layer's state.
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        LinearAttention::forward(self, input, state.map(|s| s.get_or_default::<Option<KernelState>>()))
    }
}
