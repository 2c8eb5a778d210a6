//! Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), the `linear` kind:
//!
//! V'_i = φ(q_i)ᵀ Σ_{j≤i} φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_{j≤i} φ(k_j),   φ(x) = elu(x) + 1,
//!
//! bidirectional as φ(Q)(φ(K)ᵀV), causal by chunked prefix sums, and decoded as an RNN with the
//! state (S_t, z_t) — O(1) per token in the context length ([`crate::kernel`]).

use burn::prelude::*;
use burn::tensor::activation::elu;
use serde::{Deserialize, Serialize};
use variorum_core::ConfigError;
use variorum_position::HeadShape;

use crate::kernel::{self, Features, HeadProjections, KernelState};
use crate::{AttentionInput, AttentionOutput};

/// `model.attention` with `kind = "linear"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinearAttentionConfig {
    /// Heads. Default 4.
    pub n_heads: usize,
    /// Size of each head. Default `d_model / n_heads`.
    pub head_dim: Option<usize>,
    /// Biases in the projections. Default true.
    pub bias: bool,
    /// Positions per chunk of the causal form (memory ∝ chunk, not length). Default 64.
    pub chunk: usize,
}

impl Default for LinearAttentionConfig {
    fn default() -> Self {
        Self { n_heads: 4, head_dim: None, bias: true, chunk: 64 }
    }
}

impl LinearAttentionConfig {
    pub fn heads(&self, d_model: usize) -> HeadShape {
        kernel::heads(self.n_heads, self.head_dim, d_model)
    }

    pub fn expanded(&self, d_model: usize) -> Self {
        Self { head_dim: Some(self.heads(d_model).head_dim), ..self.clone() }
    }

    pub fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        kernel::validate_heads(self.n_heads, self.head_dim, self.chunk, d_model)
    }

    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> LinearAttention {
        let h = self.heads(d_model);
        LinearAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            chunk: self.chunk,
        }
    }
}

#[derive(Module, Debug)]
pub struct LinearAttention {
    pub proj: HeadProjections,
    pub chunk: usize,
}

impl LinearAttention {
    pub fn forward(&self, input: AttentionInput, state: Option<&mut Option<KernelState>>) -> AttentionOutput {
        let (q, k, v) = self.proj.split(input.query, input.key_value);
        let phi = |x: Tensor<4>| elu(x, 1.0).add_scalar(1.0);
        let k = kernel::hide_padding(phi(k), input.mask.padding.as_ref());
        let f = Features { q: phi(q), k, v, k_shift: None, gate: None, min_normaliser: kernel::MIN_NORMALISER };
        let context = if input.mask.causal { kernel::causal(f, state, self.chunk) } else { kernel::bidirectional(f) };
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }
}
