//! Random Feature Attention (Peng et al. 2021), the `rfa` kind: random Fourier features of the
//! Gaussian kernel (Rahimi & Recht 2007),
//!
//! φ(x) = √(1/D) [sin(Wx); cos(Wx)],  W: D rows ~ N(0, σ⁻² I),  E[φ(x)·φ(y)] = exp(−‖x − y‖²/2σ²),
//!
//! on ℓ2-normalised queries and keys, where the Gaussian kernel is exp(q̂·k̂/σ²) up to a constant
//! — softmax attention with temperature σ². As in the paper (§3.1), by default
//! - the frequencies' scale is learned: each row of W is s ∘ ε, ε ~ N(0, I) drawn, s ∈ ℝ^{d_h} a
//!   parameter per head and dimension (the paper's "learned σ"; it is the inverse kernel width, so
//!   s starts at 1/σ with σ the config's `sigma`, the initial width);
//! - every head draws its own ε (`shared_features = false`);
//! - ε is drawn again during training, every `redraw_interval` optimizer steps (default 1; the
//!   saved draw is the one evaluation and generation use).
//!
//! `learn_sigma = false`, `shared_features = true`, `redraw_interval = 0` give the fixed form
//! (one W = ε/σ for all heads, never redrawn) — and load runs trained before these options. The
//! attention is the kernelised core of
//! [`crate::kernelised::kernel`]; with `gate = true` (RFA-Gate) the recurrent sums decay,
//!
//! S_t = g_t S_{t−1} + (1 − g_t) φ(k_t) v_tᵀ,   z_t = g_t z_{t−1} + (1 − g_t) φ(k_t),
//! g_t = σ(w_g·x_t + b_g) per head,
//!
//! a learned recency bias. Sine/cosine features can make the normaliser φ(q)ᵀz small or
//! negative; it is clamped at [`crate::kernelised::kernel::MIN_NORMALISER`] (choice; D ≥ 2 d_h keeps it rare).
//! ε is a parameter without gradient, drawn again every `redraw_interval` optimizer steps
//! ([`RfaAttention::redraw`], from the trainer's [`AttentionMechanism::after_optimizer_step`]).

use burn::module::Param;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::sigmoid;
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::projections;
use crate::engine::projections::HeadProjections;
use crate::kernelised::kernel::{self, FeatureMap, Features, KernelState, kernel_flops};
use crate::kernelised::random_features::{fixed, gaussian_rows, redraw};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "rfa"`.
    pub struct RfaConfig [n_heads, head_dim, bias] {
        /// D, random frequencies (2D features). Default 2 · d_h.
        pub features: Option<usize> = None,
        /// σ, the kernel width: attention ≈ softmax(q̂·k̂/σ²) — the initial width when
        /// `learn_sigma`. Smaller is sharper but needs more frequencies (the estimate of a small
        /// kernel value is noisier). Default 1.
        pub sigma: f64 = 1.0,
        /// Learn the frequencies' scale per head and dimension (w = s ∘ ε). Default true.
        pub learn_sigma: bool = true,
        /// One draw of ε for every head instead of one per head. Default false.
        pub shared_features: bool = false,
        /// RFA-Gate: decaying recurrent sums. Default false.
        pub gate: bool = false,
        /// Initial bias b_g of the gate (σ(b_g) = how much of the past each step keeps). Default 1.
        pub gate_bias: f64 = 1.0,
        /// Draw ε again every this many optimizer steps; 0 = never. Default 1 (every step).
        pub redraw_interval: usize = 1,
        /// Positions per chunk of the causal form. Default 64.
        pub chunk: usize = 64,
    }
}

impl RfaConfig {
    /// D, the random frequencies: `features`, or 2 · d_h.
    pub fn features(&self, d_model: usize) -> usize {
        self.features.unwrap_or(2 * self.head_shape(d_model).head_dim)
    }

    /// The layer: `init_std` for q/k/v and the gate, `out_std` for the output projection; ε drawn
    /// afresh, s at 1/σ.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> RfaAttention {
        let h = self.head_shape(d_model);
        let draws = if self.shared_features { 1 } else { h.n_heads };
        let mut attn = RfaAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            projection: fixed(Tensor::zeros([draws * self.features(d_model), h.head_dim], device)),
            frequency_scale: self
                .learn_sigma
                .then(|| Param::from_tensor(Tensor::full([h.n_heads, h.head_dim], 1.0 / self.sigma, device))),
            gate: self.gate.then(|| {
                let mut g = LinearConfig::new(d_model, h.n_heads)
                    .with_initializer(Initializer::Normal { mean: 0.0, std: init_std })
                    .init(device);
                g.bias = g.bias.map(|b| b.map(|t| t.zeros_like().add_scalar(self.gate_bias)));
                g
            }),
            sigma: self.sigma,
            draws,
            chunk: self.chunk,
            redraw_interval: self.redraw_interval,
        };
        attn.redraw();
        attn
    }
}

impl AttentionKind for RfaConfig {
    type Module = RfaAttention;
    const SUMMARY: &'static str =
        "random Fourier features of the Gaussian kernel on normalised q/k; optional gated (decaying) recurrent sums";
    const PAPER: &'static str = "Peng et al. 2021, Random Feature Attention";
    const CAPS: Capabilities = Capabilities { cross: true, ..caps::NO_SCORES };

    fn expanded(&self, d_model: usize) -> Self {
        Self { features: Some(self.features(d_model)), ..self.expanded_heads(d_model) }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, self.chunk, d_model)?;
        check(self.features != Some(0), || "model.attention.features must be at least 1".into())?;
        check(self.sigma > 0.0 && self.sigma.is_finite(), || {
            format!("model.attention.sigma = {} must be positive", self.sigma)
        })
    }

    head_settings_hooks!();

    /// Sine and cosine of each of the D frequencies: 2D features.
    fn flops_per_token(&self, d_model: usize, _len_k: usize) -> u64 {
        kernel_flops(self.head_shape(d_model), 2 * self.features(d_model), self.chunk)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> RfaAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        // small chunks so that the chunked causal form and its carried sums are exercised at the
        // harness's lengths
        let rfa = Self { chunk: 3, features: Some(32), ..Default::default() };
        let fixed = Self { learn_sigma: false, shared_features: true, redraw_interval: 0, ..rfa.clone() };
        vec![
            TestVariant::new("", rfa.clone()),
            TestVariant::new("gate", Self { gate: true, gate_bias: 0.0, ..rfa }),
            TestVariant::new("fixed", fixed),
        ]
    }
}

/// A Random Feature Attention layer ([`RfaConfig`]), gated or not.
#[derive(Module, Debug)]
pub struct RfaAttention {
    /// The q/k/v and output projections.
    pub proj: HeadProjections,
    /// ε for each head (or one for all), `[draws · D, d_h]`, no gradient: entries N(0, 1) when
    /// the scale is learned, N(0, σ⁻²) (W itself) when not.
    pub projection: Param<Tensor<2>>,
    /// s, the learned scale of the frequencies `[heads, d_h]` (W_h = ε_h ∘ s_h), if learned.
    pub frequency_scale: Option<Param<Tensor<2>>>,
    /// RFA-Gate's w_g, b_g (one gate per head).
    pub gate: Option<Linear>,
    /// σ, the config's kernel width: W = ε/σ when the scale is not learned (s starts at 1/σ when
    /// it is).
    pub sigma: f64,
    /// Draws of ε: one per head, or 1 when shared.
    pub draws: usize,
    /// Positions per chunk of the causal form.
    pub chunk: usize,
    /// Optimizer steps between draws of W (0 = never): the config's `redraw_interval`, not saved.
    #[module(skip)]
    pub redraw_interval: usize,
}

impl RfaAttention {
    /// A fresh ε (same shape, same parameter id).
    pub fn redraw(&mut self) {
        let [n, d] = self.projection.val().dims();
        let eps = gaussian_rows(n, d, false, &self.projection.val().device());
        let w = if self.frequency_scale.is_some() { eps } else { eps.div_scalar(self.sigma) };
        self.projection = redraw(&self.projection, w);
    }

    /// The frequencies of every head as rows, `[heads or 1, D, d_h]`.
    fn frequency_rows(&self) -> Tensor<3> {
        let [n, d] = self.projection.val().dims();
        let eps = self.projection.val().reshape([self.draws, n / self.draws, d]);
        match &self.frequency_scale {
            Some(s) => eps * s.val().unsqueeze_dim::<3>(1),
            None => eps,
        }
    }

    /// The frequencies W of every head, `[1, heads or 1, d_h, D]`.
    fn frequencies(&self) -> Tensor<4> {
        self.frequency_rows().swap_dims(1, 2).unsqueeze_dim::<4>(0)
    }

    /// φ(x̂) for `[b, h, l, d_h]`: `[b, h, l, 2D]`.
    pub fn features(&self, x: Tensor<4>) -> Tensor<4> {
        let n = (self.projection.val().dims()[0] / self.draws) as f64;
        let norm = x.clone().powf_scalar(2.0).sum_dim(3).sqrt().clamp_min(1e-6);
        let wx = (x / norm).matmul(self.frequencies());
        Tensor::cat(vec![wx.clone().sin(), wx.cos()], 3).div_scalar(n.sqrt())
    }

    /// Kernelised attention through the random features, `[b, len_q, d_model]`. Causally the sums
    /// (decaying with RFA-Gate) continue from `state` and are left in it.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut Option<KernelState>>) -> AttentionOutput {
        let source = input.key_value.clone().unwrap_or_else(|| input.query.clone());
        let gate = self.gate.as_ref().map(|g| sigmoid(g.forward(source)).swap_dims(1, 2));
        let (w, min, decoding) = (Some(self.frequency_rows()), kernel::MIN_NORMALISER, state.is_some());
        let fused = kernel::fused_self_attention(
            &self.proj,
            &input,
            FeatureMap::Fourier,
            w,
            gate.clone(),
            self.chunk,
            min,
            decoding,
        );
        if let Some(out) = fused {
            return out;
        }
        let (q, k, v) = self.proj.split(input.query, input.key_value);
        let k = projections::hide_padding(self.features(k), input.mask.padding.as_ref());
        let f = Features {
            q: self.features(q),
            k,
            v,
            k_shift: None,
            gate,
            rescale: false,
            min_normaliser: kernel::MIN_NORMALISER,
        };
        let context = if input.mask.causal { kernel::causal(f, state, self.chunk) } else { kernel::bidirectional(f) };
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for RfaAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        RfaAttention::forward(self, input, state.map(|s| s.get_or_default::<Option<KernelState>>()))
    }

    /// Draws ε again every `redraw_interval` optimizer steps.
    fn after_optimizer_step(&mut self, step: usize) {
        if self.redraw_interval > 0 && step % self.redraw_interval == 0 {
            self.redraw();
        }
    }
}
