//! Nyströmformer (Xiong et al. 2021, "Nyströmformer: A Nyström-Based Algorithm for
//! Approximating Self-Attention"), the `nystrom` kind: softmax attention approximated through m
//! landmarks Q̃, K̃ (segment means of the queries and keys),
//!
//! F̃ = softmax(Q K̃ᵀ/√d),  Ã = softmax(Q̃ K̃ᵀ/√d),  B̃ = softmax(Q̃ Kᵀ/√d),
//! out = F̃ · Ã⁺ · (B̃ V)  (+ DConv(V), optional),
//!
//! evaluated right to left, so time and memory are O(L·m) (plus O(m³) for Ã⁺): no L × L matrix.
//!
//! Choices:
//! - Landmarks: L splits into m contiguous segments with boundaries ⌊i·L/m⌋ (unequal by at most
//!   one when m ∤ L; the paper pads the sequence to a multiple of m instead). When L < m, each
//!   token is its own landmark (m = L). Cross-attention takes m ≤ min(len_q, len_k) segments of
//!   each side.
//! - Ã⁺ by the paper's iteration Z₀ = Ãᵀ/(‖Ã‖₁‖Ã‖_∞), Z_{j+1} = ¼ Z_j(13I − ÃZ_j(15I −
//!   ÃZ_j(7I − ÃZ_j))) with the norms of each head's own matrix. `pinv_scale = "batch"` is the
//!   authors' code (and transformers'): Z₀ = Ãᵀ / max ‖Ã‖₁, the largest column sum over every
//!   head and batch row (‖Ã‖_∞ = 1 for softmax rows), so that six iterations give what theirs
//!   give — and one row's output depends on the others in its batch. `inverse = "regularised"`
//!   (CSALR, Chen et al. 2020) uses (Ã + λI)⁻¹ instead, computed by the same iteration on
//!   Ã + λI.
//! - With a landmark per position (m ≥ L, both sides) the approximation is the attention itself
//!   (F̃ = Ã = B̃ = P, and P P⁺ P = P): it is computed directly, softmax(QKᵀ/√d)V, exactly — as the
//!   authors' code does when m equals its sequence length.
//! - `conv_kernel = c` adds the paper's skip connection: a depthwise 1-D convolution of V along
//!   the length, one kernel of odd width c per head shared by its channels, zero-padded ("same"
//!   length), no bias. Self-attention only (a cross-attention source is not aligned with the
//!   queries). Default none, so the layer is the approximation alone (reference implementations
//!   use widths of 33 to 65).
//! - Padding keys (`mask.padding`) are left out of the landmark means and hidden in B̃ (and from
//!   the conv). A landmark whose key segment is all padding is left out on both sides: hidden in
//!   F̃, its row and column of Ã those of the identity (so Ã stays invertible).
//! - Iterations: the default 6 is the paper's. More is not always better in f32: once the
//!   iteration has converged on Ã's real singular values (≈ 10–20 iterations), further ones start
//!   inverting the rounding noise of a (near-)singular Ã — identical landmarks make one — and
//!   the result blows up.
//! - Dropout acts on F̃, the L × m query–landmark probabilities. No position scheme acts inside.
//!
//! Bidirectional only: every landmark averages a whole segment, so B̃ V and Ã mix later positions
//! into what every query sees (the paper's Nyströmformer is an encoder). `forward` computes the
//! bidirectional form whatever `mask.causal` says; the model refuses the kind in a decoder.

use burn::nn::conv::{Conv1d, Conv1dConfig};
use burn::nn::{Dropout, DropoutConfig, PaddingConfig1d};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::projections;
use crate::engine::projections::{HeadProjections, hide_padding};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

/// How the pseudo-inverse iteration scales its start Z₀ = Ãᵀ / c.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PinvScale {
    /// c = ‖Ã‖₁‖Ã‖_∞ of each head's own matrix (the paper's equation).
    #[default]
    PerMatrix,
    /// c = the largest column sum over every matrix of the batch (the authors' code,
    /// transformers' `NystromformerForMaskedLM`).
    Batch,
}

/// How Nyströmformer inverts the landmark matrix Ã.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NystromInverse {
    /// Moore–Penrose pseudo-inverse Ã⁺ (the paper's).
    #[default]
    Pinv,
    /// (Ã + λI)⁻¹ (CSALR).
    Regularised,
}

attention_config! {
    /// `model.attention` with `kind = "nystrom"`.
    pub struct NystromConfig [n_heads, head_dim, bias, dropout] {
        /// m, landmarks. Default 64 (the paper uses 32–64).
        pub landmarks: usize = 64,
        /// Iterations of the pseudo-inverse. Default 6 (the paper's); see the module doc before
        /// raising it far.
        pub pinv_iterations: usize = 6,
        /// `pinv` (default) or `regularised`.
        pub inverse: NystromInverse = NystromInverse::Pinv,
        /// λ of `regularised`. Default 0.1 (our choice).
        pub lambda: f64 = 0.1,
        /// Width of the depthwise convolution on V (odd); none = no skip connection. Default none.
        pub conv_kernel: Option<usize> = None,
        /// The pseudo-inverse iteration's start: `per-matrix` (default, the paper's equation) or
        /// `batch` (the authors' code).
        pub pinv_scale: PinvScale = PinvScale::PerMatrix,
    }
}

impl NystromConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output projection; the convolution
    /// keeps Burn's default initialisation.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> NystromAttention {
        let h = self.head_shape(d_model);
        let conv = self.conv_kernel.map(|c| {
            Conv1dConfig::new(h.n_heads, h.n_heads, c)
                .with_groups(h.n_heads)
                .with_padding(PaddingConfig1d::Explicit(c / 2, c / 2))
                .with_bias(false)
                .init(device)
        });
        NystromAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            conv,
            dropout: DropoutConfig::new(self.dropout).init(),
            landmarks: self.landmarks,
            pinv_iterations: self.pinv_iterations,
            lambda: if self.inverse == NystromInverse::Regularised { self.lambda } else { 0.0 },
            pinv_scale: self.pinv_scale,
            scale: 1.0 / (h.head_dim as f64).sqrt(),
        }
    }
}

impl AttentionKind for NystromConfig {
    type Module = NystromAttention;
    const SUMMARY: &'static str = "Nyströmformer: m segment-mean landmarks, softmax(QK̃ᵀ)·pinv(softmax(Q̃K̃ᵀ))·softmax(Q̃Kᵀ)V with an iterative pseudo-inverse (or CSALR's (Ã + λI)⁻¹), optional depthwise conv on V; O(L·m); bidirectional only (each landmark averages a whole segment, later positions included)";
    const PAPER: &'static str =
        "Xiong et al. 2021, Nyströmformer: A Nyström-Based Algorithm for Approximating Self-Attention";
    const CAPS: Capabilities = Capabilities { hides_padding: false, ..caps::BIDIRECTIONAL_ONLY };

    fn why_not_causal(&self) -> &'static str {
        "its landmarks are means over segments that reach past the query, coupled by one pseudo-inverse"
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        check(self.landmarks >= 1, || "model.attention.landmarks must be at least 1".into())?;
        check(self.pinv_iterations >= 1, || "model.attention.pinv_iterations must be at least 1".into())?;
        check(self.lambda.is_finite() && self.lambda > 0.0, || {
            format!("model.attention.lambda = {} must be > 0", self.lambda)
        })?;
        check(self.conv_kernel.is_none_or(|c| c % 2 == 1), || {
            format!("model.attention.conv_kernel = {:?} must be odd (a centred kernel)", self.conv_kernel)
        })?;
        crate::kind::check_dropout(self.dropout)
    }

    head_settings_hooks!();

    /// Multiply–adds ×2 per token over `len_k` keys: projections, landmark means, F̃, B̃ and B̃V
    /// (m·d_h each per head), the conv, and Ã with its inverse spread over the tokens.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd, n) = (d_model as u64, (h.n_heads * h.head_dim) as u64, h.n_heads as u64);
        let m = self.landmarks.min(len_k.max(1)) as u64;
        let per_call = 2 * m * m * hd + 4 * self.pinv_iterations as u64 * n * m * m * m;
        let conv = self.conv_kernel.unwrap_or(0) as u64 * hd;
        2 * (4 * d * hd + 2 * hd + 4 * m * hd + conv + per_call / len_k.max(1) as u64)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> NystromAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("", Self { landmarks: 4, conv_kernel: Some(3), ..Default::default() }).masked(),
            TestVariant::new(
                "pinv scale batch",
                Self { landmarks: 4, pinv_scale: PinvScale::Batch, ..Default::default() },
            )
            .masked(),
        ]
    }
}

/// A Nyströmformer layer ([`NystromConfig`]): softmax attention through m landmarks.
#[derive(Module, Debug)]
pub struct NystromAttention {
    /// The q/k/v and output projections.
    pub proj: HeadProjections,
    /// The depthwise convolution on V, `n_heads` channels in `n_heads` groups.
    pub conv: Option<Conv1d>,
    /// Dropout on F̃, the L × m query–landmark weights.
    pub dropout: Dropout,
    /// m, landmarks (capped at the sequence length).
    pub landmarks: usize,
    /// Iterations of the pseudo-inverse (or of the regularised inverse).
    pub pinv_iterations: usize,
    /// λ of the regularised inverse; 0 = the pseudo-inverse.
    pub lambda: f64,
    /// How the inverse's iteration starts.
    #[module(skip)]
    pub pinv_scale: PinvScale,
    /// 1/√d_h, the queries' scale.
    pub scale: f64,
}

/// Ã⁺ by the paper's iteration, for each `[m, m]` matrix of `a: [b, h, m, m]`, started at
/// Z₀ = Ãᵀ/(‖Ã‖₁‖Ã‖_∞) of each matrix.
pub fn iterative_pinv(a: Tensor<4>, iterations: usize) -> Tensor<4> {
    iterative_pinv_from(a, iterations, PinvScale::PerMatrix)
}

/// [`iterative_pinv`] started as `scale` says.
pub fn iterative_pinv_from(a: Tensor<4>, iterations: usize, scale: PinvScale) -> Tensor<4> {
    let m = a.dims()[2];
    let abs = a.clone().abs();
    let norm_1 = abs.clone().sum_dim(2).max_dim(3); // largest column sum, [b, h, 1, 1]
    let c = match scale {
        PinvScale::PerMatrix => norm_1 * abs.sum_dim(3).max_dim(2), // × the largest row sum
        PinvScale::Batch => norm_1.max().reshape([1, 1, 1, 1]),
    };
    let mut z = a.clone().swap_dims(2, 3) / c.clamp_min(1e-30);
    let eye = Tensor::<2>::eye(m, &a.device()).reshape([1, 1, m, m]);
    let minus = |c: f64, t: Tensor<4>| eye.clone().mul_scalar(c) - t;
    for _ in 0..iterations {
        let az = a.clone().matmul(z.clone());
        let t = minus(7.0, az.clone());
        let t = minus(15.0, az.clone().matmul(t));
        let t = minus(13.0, az.matmul(t));
        z = z.matmul(t).mul_scalar(0.25);
    }
    z
}

/// Segment means: P `[b or 1, 1, m, len]` with P·X the m landmarks of X (weights 0 on padding), and
/// the landmarks without a real position, `[b, 1, 1, m]` (only with padding).
fn segment_means(
    len: usize,
    m: usize,
    padding: Option<&Tensor<2, Bool>>,
    device: &Device,
) -> (Tensor<4>, Option<Tensor<4, Bool>>) {
    let mut member = vec![0.0f32; m * len];
    for i in 0..m {
        let (start, end) = (i * len / m, (i + 1) * len / m);
        for j in start..end {
            member[i * len + j] = 1.0 / (end - start) as f32;
        }
    }
    let member = Tensor::<2>::from_data(TensorData::new(member, [m, len]), device);
    match padding {
        None => (member.reshape([1, 1, m, len]), None),
        Some(p) => {
            let b = p.dims()[0];
            let keep = p.clone().bool_not().float().reshape([b, 1, len]);
            let w = member.unsqueeze_dim::<3>(0) * keep; // [b, m, len], proportional to membership
            let total = w.clone().sum_dim(2); // [b, m, 1]
            let empty = total.clone().lower_equal_elem(0.0).reshape([b, 1, 1, m]);
            ((w / total.clamp_min(1e-30)).reshape([b, 1, m, len]), Some(empty))
        }
    }
}

fn hide(scores: Tensor<4>, hidden: Option<Tensor<4, Bool>>) -> Tensor<4> {
    match hidden {
        Some(h) => scores.mask_fill(h, MASKED_SCORE),
        None => scores,
    }
}

impl NystromAttention {
    /// Landmarks used for `len_q` queries and `len_k` keys.
    pub fn landmarks_for(&self, len_q: usize, len_k: usize) -> usize {
        self.landmarks.min(len_q).min(len_k)
    }

    /// F̃ Ã⁺ (B̃ V) for heads `[b, h, len, d_h]`, q already scaled (`HeadProjections::split_scaled`);
    /// `padding: [b, len_k]`; `same_positions` when the queries are the keys' positions
    /// (self-attention: the padding applies to both).
    pub fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        padding: Option<&Tensor<2, Bool>>,
        same_positions: bool,
    ) -> Tensor<4> {
        let (lq, lk) = (q.dims()[2], k.dims()[2]);
        let m = self.landmarks_for(lq, lk);
        let device = q.device();
        if m == lq && m == lk && self.lambda == 0.0 {
            // every position its own landmark: the attention itself
            let pad_keys = padding.map(|p| p.clone().reshape([p.dims()[0], 1, 1, lk]));
            return self.dropout.forward(softmax(hide(q.matmul(k.swap_dims(2, 3)), pad_keys), 3)).matmul(v);
        }
        let (pk, empty) = segment_means(lk, m, padding, &device);
        let pq = if same_positions { pk.clone() } else { segment_means(lq, m, None, &device).0 };
        let (q_land, k_land) = (pq.matmul(q.clone()), pk.matmul(k.clone())); // [b, h, m, d_h]
        let f = softmax(hide(q.matmul(k_land.clone().swap_dims(2, 3)), empty.clone()), 3); // [b, h, lq, m]
        let mut a = softmax(hide(q_land.clone().matmul(k_land.swap_dims(2, 3)), empty.clone()), 3); // [b, h, m, m]
        if let Some(empty) = empty {
            // an empty landmark's row of Ã becomes the identity's (its column is already 0): Ã
            // stays invertible, and with F̃'s column 0 the landmark drops out on both sides
            let [b, _, _, _] = empty.dims();
            let gone = empty.float().reshape([b, 1, m, 1]);
            let eye = Tensor::<2>::eye(m, &device).reshape([1, 1, m, m]);
            a = a * gone.clone().neg().add_scalar(1.0) + eye * gone;
        }
        let pad_keys = padding.map(|p| p.clone().reshape([p.dims()[0], 1, 1, lk]));
        let b_ = softmax(hide(q_land.matmul(k.swap_dims(2, 3)), pad_keys), 3); // [b, h, m, lk]
        let a = if self.lambda > 0.0 {
            a + Tensor::<2>::eye(m, &device).reshape([1, 1, m, m]).mul_scalar(self.lambda)
        } else {
            a
        };
        let z = iterative_pinv_from(a, self.pinv_iterations, self.pinv_scale);
        self.dropout.forward(f).matmul(z.matmul(b_.matmul(v)))
    }

    /// The depthwise convolution of `v: [b, h, len, d_h]` along the length (zero when no conv).
    pub fn conv_residual(&self, v: Tensor<4>) -> Option<Tensor<4>> {
        let conv = self.conv.as_ref()?;
        let [b, h, l, dh] = v.dims();
        let x = v.permute([0, 3, 1, 2]).reshape([b * dh, h, l]);
        Some(conv.forward(x).reshape([b, dh, h, l]).permute([0, 2, 3, 1]))
    }

    /// The bidirectional form (Nyströmformer keeps no decoding state; `state` is ignored).
    pub fn forward(&self, input: AttentionInput, _state: Option<&mut AttentionState>) -> AttentionOutput {
        let cross = input.key_value.is_some();
        let (q, k, v) = self.proj.split_scaled(input.query, input.key_value, self.scale);
        let padding = input.mask.padding.as_ref();
        let mut context = self.attend(q, k, v.clone(), padding, !cross);
        if !cross && let Some(c) = self.conv_residual(hide_padding(v, padding)) {
            context = context + c;
        }
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for NystromAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        NystromAttention::forward(self, input, state)
    }
}
