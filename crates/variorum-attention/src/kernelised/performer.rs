//! Performer attention (Choromanski et al. 2021, FAVOR+), the `performer` kind: softmax attention
//! through positive random features,
//!
//! exp(q·k) = E_w[φ(q)·φ(k)],   φ(x) = exp(Wx − ‖x‖²/2) / √m,   W: m rows ~ N(0, I_d),
//!
//! on q, k scaled by d^{−1/4} (so q·k carries the 1/√d of softmax attention), with orthogonal
//! rows (blocks of d made orthogonal, norms redrawn; `orthogonal = true`) for lower variance. Or
//! the ReLU kernel φ(x) = ReLU(Wx)/√m + 10⁻³ (`kernel = "relu"`). The attention itself is the
//! kernelised core of [`crate::kernelised::kernel`]: causal by chunked prefix sums, decoded as an RNN.
//!
//! Stabilisation: a per-query constant cancels in the ratio, so each φ(q) row is divided by its
//! largest entry; keys get one log-scale per head (the largest exponent so far) carried with the
//! recurrent state and rescaled when a larger one arrives, so decoding token by token computes
//! what the full forward does. In a forward over many tokens that scale is the largest exponent
//! of the whole call (as in the paper's code): keys more than ~80 nats below it underflow in f32.
//!
//! W is a parameter without gradient (saved with the model); training draws it again every
//! `redraw_interval` optimizer steps ([`PerformerAttention::redraw`], from the trainer's
//! [`AttentionMechanism::after_optimizer_step`]).

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::relu;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::engine::projections;
use crate::engine::projections::HeadProjections;
use crate::kernelised::kernel::{self, FeatureMap, Features, KernelState, kernel_flops};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};

/// φ(q)ᵀz is a sum of positive terms here; the clamp only guards 0/0 (a larger one would make
/// the result depend on the keys' log-scale).
pub const MIN_NORMALISER: f64 = 1e-30;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::kernelised::random_features::{fixed, gaussian_rows, redraw};
use crate::state::AttentionState;

/// The kernel Performer's random features estimate (`kernel` in [`PerformerConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PerformerKernel {
    /// Positive random features of exp(q·k) (FAVOR+).
    #[default]
    Softmax,
    /// ReLU random features.
    Relu,
}

attention_config! {
    /// `model.attention` with `kind = "performer"`.
    pub struct PerformerConfig [n_heads, head_dim, bias] {
        /// m, random features. Default ⌈d_h · ln d_h⌉ (the paper's choice).
        pub features: Option<usize> = None,
        /// `softmax` (default) or `relu`.
        pub kernel: PerformerKernel = PerformerKernel::Softmax,
        /// Orthogonal random features. Default true.
        pub orthogonal: bool = true,
        /// Draw W again every this many optimizer steps; 0 = never. Default 1000.
        pub redraw_interval: usize = 1000,
        /// Positions per chunk of the causal form. Default 64.
        pub chunk: usize = 64,
    }
}

impl PerformerConfig {
    /// m, the random features: `features`, or ⌈d_h · ln d_h⌉.
    pub fn features(&self, d_model: usize) -> usize {
        let d = self.head_shape(d_model).head_dim as f64;
        self.features.unwrap_or_else(|| (d * d.ln()).ceil().max(1.0) as usize)
    }

    /// The layer: `init_std` for q/k/v, `out_std` for the output projection; W drawn afresh.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> PerformerAttention {
        let h = self.head_shape(d_model);
        PerformerAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            projection: fixed(gaussian_rows(self.features(d_model), h.head_dim, self.orthogonal, device)),
            kernel: self.kernel,
            orthogonal: self.orthogonal,
            chunk: self.chunk,
            redraw_interval: self.redraw_interval,
        }
    }
}

impl AttentionKind for PerformerConfig {
    type Module = PerformerAttention;
    const SUMMARY: &'static str = "FAVOR+: positive orthogonal random features of the softmax kernel (or ReLU), redrawn during training; linear time, RNN decoding";
    const PAPER: &'static str = "Choromanski et al. 2021, Rethinking Attention with Performers";
    const CAPS: Capabilities = Capabilities { cross: true, ..caps::NO_SCORES };

    fn expanded(&self, d_model: usize) -> Self {
        Self { features: Some(self.features(d_model)), ..self.expanded_heads(d_model) }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, self.chunk, d_model)?;
        check(self.features != Some(0), || "model.attention.features must be at least 1".into())
    }

    head_settings_hooks!();

    fn flops_per_token(&self, d_model: usize, _len_k: usize) -> u64 {
        kernel_flops(self.head_shape(d_model), self.features(d_model), self.chunk)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> PerformerAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // small chunks so that the chunked causal form and its carried sums are exercised at the
        // harness's lengths
        let performer = Self { chunk: 3, features: Some(16), ..Default::default() };
        vec![
            TestVariant::new("", performer.clone()),
            TestVariant::new("relu", Self { kernel: PerformerKernel::Relu, ..performer }),
        ]
    }
}

/// A Performer (FAVOR+) layer ([`PerformerConfig`]).
#[derive(Module, Debug)]
pub struct PerformerAttention {
    /// The q/k/v and output projections.
    pub proj: HeadProjections,
    /// W, `[m, d_h]`, no gradient.
    pub projection: Param<Tensor<2>>,
    /// Softmax (positive) or ReLU random features; not saved.
    #[module(skip)]
    pub kernel: PerformerKernel,
    /// Whether W's rows are drawn orthogonal (in blocks of d_h), here and at each redraw.
    pub orthogonal: bool,
    /// Positions per chunk of the causal form.
    pub chunk: usize,
    /// Optimizer steps between draws of W (0 = never): the config's `redraw_interval`, not saved.
    #[module(skip)]
    pub redraw_interval: usize,
}

impl PerformerAttention {
    /// A fresh W (same shape, same parameter id).
    pub fn redraw(&mut self) {
        let [m, d] = self.projection.val().dims();
        let w = gaussian_rows(m, d, self.orthogonal, &self.projection.val().device());
        self.projection = redraw(&self.projection, w);
    }

    /// Wx on x·d^{−1/4} and ‖x·d^{−1/4}‖²/2, `[b, h, l, m]` and `[b, h, l, 1]`.
    fn project(&self, x: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let d = x.dims()[3] as f64;
        let x = x.mul_scalar(d.powf(-0.25));
        let w = self.projection.val().transpose().unsqueeze_dim::<3>(0).unsqueeze_dim::<4>(0);
        let half_norm = x.clone().powf_scalar(2.0).sum_dim(3).div_scalar(2.0);
        (x.matmul(w), half_norm)
    }

    /// φ(q) (up to a per-query constant) and φ(k) with its per-head log-scale: the
    /// bidirectional form, where every key is seen by every query and one scale, the largest
    /// exponent of the call, serves them all.
    pub fn features(&self, q: Tensor<4>, k: Tensor<4>) -> (Tensor<4>, Tensor<4>, Tensor<2>) {
        let [b, h, _, _] = k.dims();
        match self.kernel {
            PerformerKernel::Relu => {
                (self.relu_features(q), self.relu_features(k), Tensor::zeros([b, h], &self.projection.val().device()))
            }
            PerformerKernel::Softmax => {
                let ek = self.exponents(k);
                let shift = ek.clone().max_dim(3).max_dim(2).reshape([b, h]).detach();
                let phi_k = (ek - shift.clone().reshape([b, h, 1, 1])).exp().div_scalar(self.sqrt_m());
                (self.query_features(q), phi_k, shift)
            }
        }
    }

    /// The causal form: φ(k_j) is scaled by a running maximum M_j of the exponents of keys
    /// 1..j (from `previous` on), never by a later key, and the sums are rescaled by
    /// exp(M_{j−1} − M_j) as M grows ([`Features::rescale`]). A later key far above the earlier
    /// ones can then neither underflow them nor change their rounding: outputs depend on the
    /// keys at or before them only. Returns φ(q), φ(k), the rescale gates and the start scale.
    fn causal_features(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        previous: Option<Tensor<2>>,
    ) -> (Tensor<4>, Tensor<4>, Option<Tensor<3>>, Tensor<2>) {
        let [b, h, l, _] = k.dims();
        if self.kernel == PerformerKernel::Relu {
            let start = previous.unwrap_or_else(|| Tensor::zeros([b, h], &k.device()));
            return (self.relu_features(q), self.relu_features(k), None, start);
        }
        let ek = self.exponents(k);
        let own = ek.clone().max_dim(3).reshape([b, h, l]).detach(); // each key's largest exponent
        let start = previous.unwrap_or_else(|| own.clone().narrow(2, 0, 1).reshape([b, h]));
        let running = Tensor::cat(vec![start.clone().reshape([b, h, 1]), own], 2).cummax(2); // [b, h, l + 1]
        let (before, now) = (running.clone().narrow(2, 0, l), running.narrow(2, 1, l));
        let gate = (before - now.clone()).exp();
        let phi_k = (ek - now.unsqueeze_dim::<4>(3)).exp().div_scalar(self.sqrt_m());
        (self.query_features(q), phi_k, Some(gate), start)
    }

    fn sqrt_m(&self) -> f64 {
        (self.projection.val().dims()[0] as f64).sqrt()
    }

    /// w·x − ‖x‖²/2 per feature, on x·d^{−1/4}: `[b, h, l, m]`.
    fn exponents(&self, x: Tensor<4>) -> Tensor<4> {
        let (wx, half_norm) = self.project(x);
        wx - half_norm
    }

    /// φ(q) up to a per-query constant (its largest exponent, which cancels in the ratio).
    fn query_features(&self, q: Tensor<4>) -> Tensor<4> {
        let eq = self.exponents(q);
        let eq = eq.clone() - eq.max_dim(3).detach();
        eq.exp().div_scalar(self.sqrt_m())
    }

    fn relu_features(&self, x: Tensor<4>) -> Tensor<4> {
        relu(self.project(x).0).div_scalar(self.sqrt_m()).add_scalar(1e-3)
    }

    /// Kernelised attention through the random features, `[b, len_q, d_model]`. Causally the sums
    /// and the keys' running log-scale continue from `state` and are left in it.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut Option<KernelState>>) -> AttentionOutput {
        let w = self.projection.val();
        let scale = (w.dims()[1] as f32).powf(-0.25);
        let map = match self.kernel {
            PerformerKernel::Softmax => FeatureMap::Positive { scale },
            PerformerKernel::Relu => FeatureMap::Relu { scale },
        };
        let (w, decoding) = (Some(w.unsqueeze_dim(0)), state.is_some());
        let fused =
            kernel::fused_self_attention(&self.proj, &input, map, w, None, self.chunk, MIN_NORMALISER, decoding);
        if let Some(out) = fused {
            return out;
        }
        let (q, k, v) = self.proj.split(input.query, input.key_value);
        let f = if input.mask.causal {
            let previous = state.as_deref().and_then(|s| s.as_ref()).map(|s| s.shift.clone());
            let (q, k, gate, start) = self.causal_features(q, k, previous);
            let k = projections::hide_padding(k, input.mask.padding.as_ref());
            let rescale = gate.is_some();
            Features { q, k, v, k_shift: Some(start), gate, rescale, min_normaliser: MIN_NORMALISER }
        } else {
            let (q, k, shift) = self.features(q, k);
            let k = projections::hide_padding(k, input.mask.padding.as_ref());
            Features { q, k, v, k_shift: Some(shift), gate: None, rescale: false, min_normaliser: MIN_NORMALISER }
        };
        let context = if input.mask.causal { kernel::causal(f, state, self.chunk) } else { kernel::bidirectional(f) };
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for PerformerAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        PerformerAttention::forward(self, input, state.map(|s| s.get_or_default::<Option<KernelState>>()))
    }

    /// Draws W again every `redraw_interval` optimizer steps.
    fn after_optimizer_step(&mut self, step: usize) {
        if self.redraw_interval > 0 && step % self.redraw_interval == 0 {
            self.redraw();
        }
    }
}
