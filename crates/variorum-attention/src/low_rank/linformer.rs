//! Linformer (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity"), the
//! `linformer` kind: keys and values are projected along the length by learned E, F ∈ ℝ^{k×n},
//!
//! head_i = softmax(Q_i (E K_i)ᵀ / √d) (F V_i),
//!
//! so the score matrix is L × k and time and memory are O(L·k) (n = `max_len`, k = `k`; E K is
//! k × d, never an L × L matrix).
//!
//! Choices:
//! - Length: E and F have a fixed number of columns n = `max_len`. A sequence of L < n positions
//!   uses the first L columns, E[:, :L] K — exactly what zero-padding K and V to n rows gives.
//!   Longer sequences are refused before anything runs: [`LinformerConfig::validate_len`] checks
//!   `model.seq_len ≤ model.attention.max_len` (and cross-attention sources must be as short); the
//!   forward assumes it.
//! - Padding keys (`mask.padding`) get zero key and value rows, so a padded tail equals the
//!   shorter sequence. Causal, custom and `max_back` masks do not apply (see below).
//! - Sharing (`share`, the paper's §4): `none` — one E and one F per head; `headwise` (default) —
//!   one E and one F for all heads; `key-value` — one projection, E = F, for all heads. The
//!   paper's layerwise sharing (one projection for every layer) is not offered: it needs a
//!   parameter shared between layers, which the model's per-layer modules do not have.
//! - Initialisation: E, F ~ N(0, 1/n), so that a projected key E K of a full-length sequence has
//!   the scale of a single key (our choice; the paper does not state one).
//! - Dropout acts on the L × k attention probabilities. No position scheme acts inside: the
//!   projected keys have no single position.
//!
//! The paper's §4 ("additional efficiency techniques") names two variants, neither of them
//! trained there (its experiments use one k and the learned E everywhere):
//! - **Non-uniform k** (`layer_k`): "one can choose a different projected dimension k for
//!   different heads and layers", smaller in the higher layers. One k per layer is offered
//!   (the model's per-layer lists); a k per head is not.
//! - **General projections** (`projection`): "mean/max pooling, or convolution where the kernel
//!   and stride is set to n/k". With s = n/k (k must divide n):
//!   - `mean-pool` / `max-pool`: projected key j is the mean / maximum of keys js … js + s − 1
//!     (no parameters);
//!   - `conv`: projected key j = Σ_{i<s} k_{js+i} W_i, a convolution over the length with kernel
//!     and stride s whose channels are a head's d_h features, W ∈ ℝ^{s·d_h × d_h} (the paper
//!     leaves the channels open; ours mix a head's features, no bias, W ~ N(0, 1/(s·d_h)) so a
//!     projected key has the scale of one key). `share` applies as to E and F: one W per head
//!     (`none`), one for keys and one for values shared by the heads (`headwise`), or one for both
//!     (`key-value`). Pooling has nothing to share and takes only the default.
//!
//!   A sequence of L < n positions has ⌈L/s⌉ windows, the last one partial: the mean and maximum
//!   are taken over the positions it has, and the convolution reads zeros beyond L (zero padding,
//!   as the learned E). Padding keys (`mask.padding`) are left out of a window's mean and maximum
//!   (zeros for the convolution), and a window holding no real position is masked out of the
//!   softmax, so a padded tail again equals the shorter sequence.
//!
//! Bidirectional only: every projected key E K mixes all positions, later ones included, and E is
//! tied to absolute positions 0..n; hiding the future would need a different E per query (the
//! paper's Linformer is an encoder). `forward` computes the bidirectional form whatever
//! `mask.causal` says; the model refuses the kind in a decoder through its capabilities.

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Initializer};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::projections;
use crate::engine::projections::{HeadProjections, hide_padding, unpadded};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

/// How Linformer projects keys and values along the length (`model.attention.projection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinformerProjection {
    /// Learned E, F ∈ ℝ^{k×n} (the paper's).
    #[default]
    Learned,
    /// The mean over windows of n/k positions.
    MeanPool,
    /// The element-wise maximum over windows of n/k positions.
    MaxPool,
    /// A learned convolution over the length with kernel and stride n/k.
    Conv,
}

impl LinformerProjection {
    /// Pooling: no parameters.
    fn pools(self) -> bool {
        matches!(self, Self::MeanPool | Self::MaxPool)
    }
}

/// Which projections Linformer shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinformerShare {
    /// A separate E and F per head.
    None,
    /// One E and one F shared by all heads (the paper's default).
    #[default]
    Headwise,
    /// One projection, E = F, shared by all heads.
    KeyValue,
}

attention_config! {
    /// `model.attention` with `kind = "linformer"`.
    pub struct LinformerConfig [n_heads, head_dim, bias, dropout] {
        /// n, the fixed maximum length (columns of E and F). Required: the default 0 is refused.
        pub max_len: usize = 0,
        /// k, the projected length (rows of E and F), 1 ≤ k ≤ n. Default 64 (the paper uses 128–256
        /// for n = 512–4096).
        pub k: usize = 64,
        /// `none`, `headwise` (default) or `key-value`.
        pub share: LinformerShare = LinformerShare::Headwise,
        /// `learned` (default: E and F), `mean-pool`, `max-pool` or `conv` (kernel and stride
        /// max_len / k).
        pub projection: LinformerProjection = LinformerProjection::Learned,
        /// k of each layer, bottom first (the paper's non-uniform projected dimension: smaller
        /// above); empty (default) = `k` in every layer.
        pub layer_k: Vec<usize> = Vec::new(),
    }
}

impl LinformerConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output projection, E and F ~ N(0, 1/n)
    /// (a convolution's W ~ N(0, 1/(s·d_h))). Built with `k` (a model's layers take theirs from
    /// `layer_k` through [`for_layer`](AttentionKind::for_layer)).
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> LinformerAttention {
        let h = self.head_shape(d_model);
        let rows = if self.share == LinformerShare::None { h.n_heads } else { 1 };
        let window = self.max_len / self.k.max(1);
        let (shape, std) = match self.projection {
            LinformerProjection::Conv => {
                ([rows, window * h.head_dim, h.head_dim], 1.0 / ((window * h.head_dim) as f64).sqrt())
            }
            _ => ([rows, self.k, self.max_len], 1.0 / (self.max_len as f64).sqrt()),
        };
        let draw = || Initializer::Normal { mean: 0.0, std }.init(shape, device);
        let learned = !self.projection.pools();
        LinformerAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            e: learned.then(draw),
            f: (learned && self.share != LinformerShare::KeyValue).then(draw),
            dropout: DropoutConfig::new(self.dropout).init(),
            max_len: self.max_len,
            scale: 1.0 / (h.head_dim as f64).sqrt(),
            projection: self.projection,
            window,
        }
    }
}

impl AttentionKind for LinformerConfig {
    type Module = LinformerAttention;
    const SUMMARY: &'static str = "Linformer: keys and values projected along the length by learned E, F (k × max_len), softmax(Q(EK)ᵀ/√d)(FV); O(L·k); bidirectional only (E mixes every position, later ones included, into each projected key, and has a fixed length max_len)";
    const PAPER: &'static str = "Wang et al. 2020, Linformer: Self-Attention with Linear Complexity";
    const CAPS: Capabilities = Capabilities { variable_length: false, ..caps::BIDIRECTIONAL_ONLY };

    fn why_not_causal(&self) -> &'static str {
        "E and F mix every position, later ones included, into each projected key and value"
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        check(self.max_len >= 1, || {
            "model.attention.max_len must be set: the fixed maximum length n of Linformer's projections \
             (at least model.seq_len)"
                .into()
        })?;
        for (key, k) in std::iter::once(("k", self.k)).chain(self.layer_k.iter().map(|&k| ("layer_k", k))) {
            check(k >= 1, || format!("model.attention.{key} must be at least 1"))?;
            check(k <= self.max_len, || {
                format!("model.attention.{key} = {k} must be at most model.attention.max_len = {}", self.max_len)
            })?;
            check(self.projection == LinformerProjection::Learned || self.max_len.is_multiple_of(k), || {
                format!(
                    "model.attention.{key} = {k} must divide model.attention.max_len = {}: projection = \"{}\" \
                     pools windows of max_len / k positions",
                    self.max_len,
                    self.projection_name()
                )
            })?;
        }
        check(!self.projection.pools() || self.share == LinformerShare::Headwise, || {
            format!(
                "model.attention.share applies to learned projections: projection = \"{}\" has no parameters to share",
                self.projection_name()
            )
        })?;
        crate::kind::check_dropout(self.dropout)
    }

    /// The config of layer `layer`: its k from `layer_k`.
    fn for_layer(&self, layer: usize) -> Self {
        let k = self.layer_k.get(layer).copied().unwrap_or(self.k);
        Self { k, layer_k: Vec::new(), ..self.clone() }
    }

    fn per_layer(&self) -> usize {
        self.layer_k.len()
    }

    fn per_layer_key(&self) -> &'static str {
        "layer_k"
    }

    /// Refuses sequences (or cross-attention sources) longer than the projections' n.
    fn validate_len(&self, seq_len: usize) -> Result<(), ConfigError> {
        check(seq_len <= self.max_len, || {
            format!(
                "model.seq_len = {seq_len} exceeds model.attention.max_len = {}: Linformer's projections \
                 have a fixed length; raise max_len",
                self.max_len
            )
        })
    }

    /// Built for the measured length (the attention benchmark runs several).
    fn for_length(&self, len: usize) -> Self {
        Self { max_len: len, ..self.clone() }
    }

    head_settings_hooks!();

    /// Multiply–adds ×2 per token: projections, E K and F V (k·d_h per head; a convolution's
    /// d_h² per head, pooling nothing), L × k scores and their values.
    fn flops_per_token(&self, d_model: usize, _len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd, k) = (d_model as u64, (h.n_heads * h.head_dim) as u64, self.k as u64);
        let project = match self.projection {
            LinformerProjection::Learned => 2 * k * hd,
            LinformerProjection::Conv => 2 * hd * h.head_dim as u64,
            _ => 0,
        };
        2 * (4 * d * hd + 2 * k * hd + project)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> LinformerAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("", Self { max_len: 32, k: 4, ..Default::default() }).masked(),
            TestVariant::new("unshared", Self { max_len: 32, k: 4, share: LinformerShare::None, ..Default::default() })
                .masked(),
            TestVariant::new(
                "mean-pool",
                Self { max_len: 32, k: 8, projection: LinformerProjection::MeanPool, ..Default::default() },
            )
            .masked(),
            TestVariant::new(
                "max-pool",
                Self { max_len: 32, k: 8, projection: LinformerProjection::MaxPool, ..Default::default() },
            )
            .masked(),
            TestVariant::new(
                "conv",
                Self { max_len: 32, k: 8, projection: LinformerProjection::Conv, ..Default::default() },
            )
            .masked(),
            TestVariant::new(
                "conv per head",
                Self {
                    max_len: 32,
                    k: 16,
                    projection: LinformerProjection::Conv,
                    share: LinformerShare::None,
                    ..Default::default()
                },
            )
            .masked(),
        ]
    }
}

impl LinformerConfig {
    /// `projection`'s config value.
    fn projection_name(&self) -> &'static str {
        match self.projection {
            LinformerProjection::Learned => "learned",
            LinformerProjection::MeanPool => "mean-pool",
            LinformerProjection::MaxPool => "max-pool",
            LinformerProjection::Conv => "conv",
        }
    }
}

/// A Linformer layer ([`LinformerConfig`]): keys and values projected along the length.
#[derive(Module, Debug)]
pub struct LinformerAttention {
    /// The q/k/v and output projections.
    pub proj: HeadProjections,
    /// E, `[n_heads or 1, k, n]`; a convolution's key weights, `[n_heads or 1, s·d_h, d_h]`;
    /// `None` for pooling.
    pub e: Option<Param<Tensor<3>>>,
    /// F, the same shape as E; `None` when E serves the values too (`key-value`) or for pooling.
    pub f: Option<Param<Tensor<3>>>,
    /// Dropout on the L × k attention weights.
    pub dropout: Dropout,
    /// n, the columns of E and F: the longest key sequence the layer takes.
    pub max_len: usize,
    /// 1/√d_h, the queries' scale.
    pub scale: f64,
    /// How keys and values are projected along the length.
    #[module(skip)]
    pub projection: LinformerProjection,
    /// s = n/k, the window of pooling and convolution.
    pub window: usize,
}

impl LinformerAttention {
    /// n: the longest key sequence this layer takes.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The first `len` columns of a projection, `[1, n_heads or 1, k, len]`.
    fn columns(p: &Param<Tensor<3>>, len: usize) -> Tensor<4> {
        p.val().narrow(2, 0, len).unsqueeze_dim::<4>(0)
    }

    /// The projections of keys and values `[b, h, len, d_h]` (padding keys already zero) to
    /// `[b, h, k', d_h]`, and, under a padding mask, the windows that hold no real key
    /// (`[b, 1, 1, k']`, to be hidden from the softmax).
    #[allow(clippy::type_complexity)]
    fn project(
        &self,
        k: Tensor<4>,
        v: Tensor<4>,
        padding: Option<&Tensor<2, Bool>>,
    ) -> (Tensor<4>, Tensor<4>, Option<Tensor<4, Bool>>) {
        let [b, h, lk, dh] = k.dims();
        let e = self.e.as_ref();
        let f = self.f.as_ref().or(e);
        if self.projection == LinformerProjection::Learned {
            let (e, f) = (e.expect("a learned E"), f.expect("a learned F"));
            return (Self::columns(e, lk).matmul(k), Self::columns(f, lk).matmul(v), None);
        }
        let (s, m) = (self.window, lk.div_ceil(self.window));
        // zeros after the L positions up to m·s, then one row of s·width per window
        let windows = |x: Tensor<4>, width: usize| -> Tensor<4> {
            let [x0, x1, _, _] = x.dims();
            let x = if m * s > lk {
                let device = x.device();
                Tensor::cat(vec![x, Tensor::zeros([x0, x1, m * s - lk, width], &device)], 2)
            } else {
                x
            };
            x.reshape([x0, x1, m, s * width])
        };
        let real = windows(unpadded(padding, b, lk, &k.device()), 1); // [b, 1, m, s]: 1 at real keys
        let counts = real.clone().sum_dim(3); // [b, 1, m, 1]
        let empty = counts.clone().lower_equal_elem(0.0);
        let pool = |x: Tensor<4>| -> Tensor<4> {
            let x = windows(x, dh).reshape([b, h, m, s, dh]);
            if self.projection == LinformerProjection::MeanPool {
                return x.sum_dim(3).reshape([b, h, m, dh]) / counts.clone().clamp_min(1.0);
            }
            // the maximum over real keys only: padding and the zeros after L are left out
            let hidden = real.clone().lower_equal_elem(0.0).reshape([b, 1, m, s, 1]).expand([b, h, m, s, dh]);
            let max = x.mask_fill(hidden, f32::NEG_INFINITY).max_dim(3).reshape([b, h, m, dh]);
            max.mask_fill(empty.clone().expand([b, h, m, dh]), 0.0)
        };
        // a convolution with kernel and stride s: [b, h, m, s·d_h] × [1 or h, s·d_h, d_h]
        let convolve = |x: Tensor<4>, w: &Param<Tensor<3>>| windows(x, dh).matmul(w.val().unsqueeze_dim::<4>(0));
        let (kp, vp) = match (self.projection, e, f) {
            (LinformerProjection::Conv, Some(e), Some(f)) => (convolve(k, e), convolve(v, f)),
            _ => (pool(k), pool(v)),
        };
        (kp, vp, padding.map(|_| empty.swap_dims(2, 3)))
    }

    /// softmax(q (E k)ᵀ/√d)(F v) for heads `[b, h, len, d_h]`, q already scaled by 1/√d
    /// (`HeadProjections::split_scaled`; keys at most `max_len` long, padding keys zero and
    /// marked in `padding`).
    pub fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, padding: Option<&Tensor<2, Bool>>) -> Tensor<4> {
        let lk = k.dims()[2];
        debug_assert!(lk <= self.max_len, "{lk} keys exceed max_len {} (validate_len refuses this)", self.max_len);
        let (ek, fv, empty) = self.project(k, v, padding); // [b, h, k, d_h]
        let scores = q.matmul(ek.swap_dims(2, 3)); // [b, h, len_q, k]
        let scores = match empty {
            Some(empty) => {
                let [b, h, lq, kk] = scores.dims();
                scores.mask_fill(empty.expand([b, h, lq, kk]), MASKED_SCORE)
            }
            None => scores,
        };
        self.dropout.forward(softmax(scores, 3)).matmul(fv)
    }

    /// The bidirectional form (Linformer keeps no decoding state; `state` is ignored).
    pub fn forward(&self, input: AttentionInput, _state: Option<&mut AttentionState>) -> AttentionOutput {
        let (q, k, v) = self.proj.split_scaled(input.query, input.key_value, self.scale);
        let padding = input.mask.padding.as_ref();
        let (k, v) = (hide_padding(k, padding), hide_padding(v, padding));
        let context = self.attend(q, k, v, padding);
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for LinformerAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        LinformerAttention::forward(self, input, state)
    }
}
