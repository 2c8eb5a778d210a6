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
use crate::engine::projections;
use crate::engine::projections::{HeadProjections, hide_padding};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

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
    }
}

impl LinformerConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output projection, E and F ~ N(0, 1/n).
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> LinformerAttention {
        let h = self.head_shape(d_model);
        let rows = if self.share == LinformerShare::None { h.n_heads } else { 1 };
        let std = 1.0 / (self.max_len as f64).sqrt();
        let draw = || Initializer::Normal { mean: 0.0, std }.init([rows, self.k, self.max_len], device);
        LinformerAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            e: draw(),
            f: (self.share != LinformerShare::KeyValue).then(draw),
            dropout: DropoutConfig::new(self.dropout).init(),
            max_len: self.max_len,
            scale: 1.0 / (h.head_dim as f64).sqrt(),
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
        check(self.k >= 1, || "model.attention.k must be at least 1".into())?;
        check(self.k <= self.max_len, || {
            format!("model.attention.k = {} must be at most model.attention.max_len = {}", self.k, self.max_len)
        })?;
        crate::kind::check_dropout(self.dropout)
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

    /// Multiply–adds ×2 per token: projections, E K and F V (k·d_h per head), L × k scores and
    /// their values.
    fn flops_per_token(&self, d_model: usize, _len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd, k) = (d_model as u64, (h.n_heads * h.head_dim) as u64, self.k as u64);
        2 * (4 * d * hd + 4 * k * hd)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> LinformerAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("", Self { max_len: 32, k: 4, ..Default::default() }).masked(),
            TestVariant::new("unshared", Self { max_len: 32, k: 4, share: LinformerShare::None, ..Default::default() })
                .masked(),
        ]
    }
}

/// A Linformer layer ([`LinformerConfig`]): keys and values projected along the length.
#[derive(Module, Debug)]
pub struct LinformerAttention {
    /// The q/k/v and output projections.
    pub proj: HeadProjections,
    /// E, `[n_heads or 1, k, n]`.
    pub e: Param<Tensor<3>>,
    /// F, the same shape; `None` when E is shared with the values (`key-value`).
    pub f: Option<Param<Tensor<3>>>,
    /// Dropout on the L × k attention weights.
    pub dropout: Dropout,
    /// n, the columns of E and F: the longest key sequence the layer takes.
    pub max_len: usize,
    /// 1/√d_h, the queries' scale.
    pub scale: f64,
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

    /// softmax(q (E k)ᵀ/√d)(F v) for heads `[b, h, len, d_h]`, q already scaled by 1/√d
    /// (`HeadProjections::split_scaled`; keys at most `max_len` long).
    pub fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
        let lk = k.dims()[2];
        debug_assert!(lk <= self.max_len, "{lk} keys exceed max_len {} (validate_len refuses this)", self.max_len);
        let e = Self::columns(&self.e, lk);
        let f = self.f.as_ref().map(|f| Self::columns(f, lk)).unwrap_or_else(|| e.clone());
        let (ek, fv) = (e.matmul(k), f.matmul(v)); // [b, h, k, d_h]
        let scores = q.matmul(ek.swap_dims(2, 3)); // [b, h, len_q, k]
        self.dropout.forward(softmax(scores, 3)).matmul(fv)
    }

    /// The bidirectional form (Linformer keeps no decoding state; `state` is ignored).
    pub fn forward(&self, input: AttentionInput, _state: Option<&mut AttentionState>) -> AttentionOutput {
        let (q, k, v) = self.proj.split_scaled(input.query, input.key_value, self.scale);
        let padding = input.mask.padding.as_ref();
        let (k, v) = (hide_padding(k, padding), hide_padding(v, padding));
        let context = self.attend(q, k, v);
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for LinformerAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        LinformerAttention::forward(self, input, state)
    }
}
