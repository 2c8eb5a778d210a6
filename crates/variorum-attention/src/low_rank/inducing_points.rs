//! Inducing-point attention, the `inducing-points` kind: m learned global slots condense the
//! sequence into a compressed memory that every position then attends to, O(L·m·d) instead of
//! O(L²·d) (survey §3.3.2, "attention with compressed key-value memory"). Two published forms,
//! chosen by `mode`:
//!
//! **`isab`** — Set Transformer's induced set attention block (Lee et al. 2019, eqs. 6–9):
//!
//! MAB(X, Y) = LayerNorm(H + rFF(H)),  H = LayerNorm(X + Multihead(X, Y, Y)),
//! ISAB_m(X) = MAB(X, MAB(I, X)),  I ∈ R^{m×d} learned.
//!
//! Here the pack is the whole inner block, P' = MAB(I, X): a multi-head attention of the slots
//! over the sequence (with its own output projection), then the residual + LayerNorm and the
//! residual rFF + LayerNorm *on the slots* (`slot_mab = true`, the default; `false` keeps only
//! P' = Multihead(I, X, X)). The rFF is one Linear + ReLU, rFF(H) = relu(H W_f + b_f), as in the
//! authors' code (the paper only says "any row-wise feed-forward layer"). The outer block
//! MAB(X, P') is split: this layer computes Multihead(X, P', P') only, because the residual
//! block of our model already wraps every attention in norm + residual + FFN — those are the
//! outer MAB's LayerNorm(X + ·) and LayerNorm(H + rFF(H)). The slots never leave this layer, so
//! nothing outside provides the inner MAB's norm and rFF: they belong here.
//!
//! **`luna`** — Luna's pack and unpack (Ma et al. 2021, eqs. 3–4), bidirectional form:
//!
//! Y_P = Pack(P, X) = softmax(P W_q^p (X W_k^p)ᵀ/√d_h) X W_v^p   (no output projection),
//! Y_X = Unpack(X, Y_P) = softmax(X W_q (Y_P W_k)ᵀ/√d_h) Y_P W_v · W_o.
//!
//! The differences from `isab`, following the paper and the authors' fairseq code: the packed
//! context stays the raw heads' concatenation (width n_heads·d_h, no output projection, no norm
//! or rFF on it) and the unpack reads it directly; Luna's LayerNorm(P + Y_P) only feeds the
//! *next* layer's P. That layer-to-layer hand-over of the packed context cannot live in one
//! attention layer (our blocks carry no slot stream), so here P is this layer's learned slots in
//! every layer — what Luna does in its first layer. `tie_kv = true` gives the paper's "tied"
//! model (one projection for keys and values in each attention, k = v); it applies to `isab`
//! too.
//!
//! Both modes: slots initialised N(0, init_std²) (Set Transformer uses Xavier; choice), separate
//! projections for pack and unpack (ISAB's two MABs, Luna's two attentions), one `n_heads` for
//! both (Luna allows a separate pack head count; choice), `dropout` on both attention
//! probabilities, padded keys hidden from the pack (queries at padded positions still read the
//! slots). Cross-attention: the slots pack `key_value` (any length), the queries unpack.
//!
//! Bidirectional only (`Capabilities.causal = false`): every slot reads the whole sequence, so
//! position i's output depends on later positions through P'. Luna's causal variant needs a
//! per-position cumulative pack, P_t = (1/t) Σ_{j≤t} φ(p·k_j) x_j with φ = elu + 1 in place of
//! the softmax over the sequence (its "efficient causal attention"): a different attention
//! (no softmax-normalised pack) with a recurrent decoding state; it is not implemented here, and
//! a causal mask is not honoured by this layer (the model refuses the kind in a decoder).
//!
//! Cost per forward: O(L·m·n_heads·d_h) scores and sums plus the projections; no L × L matrix.

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Initializer, LayerNorm, LayerNormConfig, Linear};
use burn::prelude::*;
use burn::tensor::activation::{relu, softmax};
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::projections;
use crate::engine::qkv::normal_linear;
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

/// Which published inducing-point layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InducingMode {
    /// Set Transformer's ISAB: pack = MAB(I, X) (multi-head attention with output projection,
    /// residual LayerNorms and rFF on the slots), unpack = Multihead(X, P', P').
    Isab,
    /// Luna: pack = raw multi-head attention of the slots (no output projection), unpack over it.
    Luna,
}

attention_config! {
    /// `model.attention` with `kind = "inducing-points"`.
    pub struct InducingPointsConfig [n_heads, head_dim, bias, dropout] {
        /// m, the number of learned slots (inducing points). Default 16.
        pub slots: usize = 16,
        /// `"isab"` (Set Transformer) or `"luna"`. Default `"isab"`.
        pub mode: InducingMode = InducingMode::Isab,
        /// One projection for keys and values in each attention (k = v, Luna's tied model).
        /// Default false.
        pub tie_kv: bool = false,
        /// `isab` only: the inner MAB's residual LayerNorm and residual rFF + LayerNorm on the packed
        /// slots. Default true (ignored by `luna`, which has no norm on its packed context here).
        pub slot_mab: bool = true,
    }
}

impl InducingPointsConfig {
    /// Width of the packed slots the unpack reads: d_model (isab, after the output projection)
    /// or n_heads·d_h (luna, the raw heads).
    fn slot_width(&self, d_model: usize) -> usize {
        let h = self.head_shape(d_model);
        match self.mode {
            InducingMode::Isab => d_model,
            InducingMode::Luna => h.n_heads * h.head_dim,
        }
    }

    /// The layer: `init_std` for the slots, the input projections and the rFF, `out_std` for the
    /// output projections.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> InducingPointsAttention {
        let h = self.head_shape(d_model);
        let width = h.n_heads * h.head_dim;
        let kv = if self.tie_kv { width } else { 2 * width };
        let isab = self.mode == InducingMode::Isab;
        let mab = isab && self.slot_mab;
        let slot_width = self.slot_width(d_model);
        InducingPointsAttention {
            slots: Initializer::Normal { mean: 0.0, std: init_std }.init([self.slots, d_model], device),
            pack_q: normal_linear(d_model, width, self.bias, init_std, device),
            pack_kv: normal_linear(d_model, kv, self.bias, init_std, device),
            pack_out: isab.then(|| normal_linear(width, d_model, self.bias, out_std, device)),
            slot_norm: mab.then(|| LayerNormConfig::new(d_model).init(device)),
            slot_ff: mab.then(|| normal_linear(d_model, d_model, self.bias, init_std, device)),
            slot_ff_norm: mab.then(|| LayerNormConfig::new(d_model).init(device)),
            unpack_q: normal_linear(d_model, width, self.bias, init_std, device),
            unpack_kv: normal_linear(slot_width, kv, self.bias, init_std, device),
            out: normal_linear(width, d_model, self.bias, out_std, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            n_heads: h.n_heads,
            head_dim: h.head_dim,
            tie_kv: self.tie_kv,
            scale: 1.0 / (h.head_dim as f64).sqrt(),
        }
    }
}

impl AttentionKind for InducingPointsConfig {
    type Module = InducingPointsAttention;
    const SUMMARY: &'static str = "m learned slots pack the sequence by attention, every query attends over the m packed slots (mode isab: Set Transformer ISAB, MAB on the slots; luna: Luna's pack/unpack); O(L·m·d), bidirectional only";
    const PAPER: &'static str =
        "Lee et al. 2019, Set Transformer; Ma et al. 2021, Luna: Linear Unified Nested Attention";
    const CAPS: Capabilities = Capabilities { cross: true, ..caps::BIDIRECTIONAL_ONLY };

    fn why_not_causal(&self) -> &'static str {
        "every slot reads the whole sequence before any position reads the slots"
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        check(self.slots >= 1, || "model.attention.slots must be at least 1 (the number of inducing points)".into())?;
        crate::kind::check_dropout(self.dropout)
    }

    head_settings_hooks!();

    /// Multiply–adds per token over a context of `len_k`: the per-token projections, m scores and
    /// weighted sums in each attention, and the slot side (pack queries, pack output, rFF,
    /// unpack keys/values) amortised over the `len_k` tokens.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd, m) = (d_model as u64, (h.n_heads * h.head_dim) as u64, self.slots as u64);
        let kv = if self.tie_kv { hd } else { 2 * hd };
        let sw = self.slot_width(d_model) as u64;
        let per_token = 2 * (d * hd + d * kv + hd * d) + 2 * 2 * 2 * m * hd;
        let mab = if self.mode == InducingMode::Isab { hd * d + if self.slot_mab { d * d } else { 0 } } else { 0 };
        let per_slot = 2 * (d * hd + mab + sw * kv);
        per_token + m * per_slot / len_k.max(1) as u64
    }

    fn build(&self, init: &LayerInit, device: &Device) -> InducingPointsAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("isab", Self { slots: 4, ..Default::default() }).masked(),
            TestVariant::new("luna", Self { slots: 4, mode: InducingMode::Luna, ..Default::default() }).masked(),
        ]
    }
}

/// An inducing-point layer ([`InducingPointsConfig`]): m learned slots pack the sequence,
/// every query unpacks them.
#[derive(Module, Debug)]
pub struct InducingPointsAttention {
    /// I, the learned slots `[m, d_model]`.
    pub slots: Param<Tensor<2>>,
    /// Pack queries from the slots, `d_model → n_heads·d_h`.
    pub pack_q: Linear,
    /// Pack keys and values from the sequence (`[k | v]`, or one tied k = v).
    pub pack_kv: Linear,
    /// The pack's output projection (isab), `n_heads·d_h → d_model`.
    pub pack_out: Option<Linear>,
    /// H = LayerNorm(I + Multihead(I, X, X)) (isab with `slot_mab`).
    pub slot_norm: Option<LayerNorm>,
    /// rFF(H) = relu(H W_f + b_f) (isab with `slot_mab`).
    pub slot_ff: Option<Linear>,
    /// P' = LayerNorm(H + rFF(H)) (isab with `slot_mab`).
    pub slot_ff_norm: Option<LayerNorm>,
    /// Unpack queries from the sequence.
    pub unpack_q: Linear,
    /// Unpack keys and values from the packed slots.
    pub unpack_kv: Linear,
    /// Output projection, `n_heads·d_h → d_model`.
    pub out: Linear,
    /// Dropout on the pack's and the unpack's attention weights.
    pub dropout: Dropout,
    /// Heads of both attentions.
    pub n_heads: usize,
    /// d_h, the size of each head.
    pub head_dim: usize,
    /// One projection for keys and values (k = v) in each attention.
    pub tie_kv: bool,
    /// 1/√d_h, the scores' scale.
    pub scale: f64,
}

impl InducingPointsAttention {
    /// `[b, len, n_heads·d_h]` → `[b, n_heads, len, d_h]`.
    fn split_heads(&self, x: Tensor<3>) -> Tensor<4> {
        let [b, l, _] = x.dims();
        x.reshape([b, l, self.n_heads, self.head_dim]).swap_dims(1, 2)
    }

    /// `[b, n_heads, len, d_h]` → `[b, len, n_heads·d_h]`.
    fn merge_heads(&self, x: Tensor<4>) -> Tensor<3> {
        let [b, h, l, dh] = x.dims();
        x.swap_dims(1, 2).reshape([b, l, h * dh])
    }

    /// Keys and values `[b, n_heads, len, d_h]` from a fused (or tied) projection.
    fn keys_values(&self, proj: &Linear, x: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let width = self.n_heads * self.head_dim;
        let kv = proj.forward(x);
        if self.tie_kv {
            let k = self.split_heads(kv);
            (k.clone(), k)
        } else {
            let k = self.split_heads(kv.clone().narrow(2, 0, width));
            let v = self.split_heads(kv.narrow(2, width, width));
            (k, v)
        }
    }

    /// softmax(q kᵀ/√d_h [hidden keys masked]) v, per head.
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, hidden: Option<&Tensor<2, Bool>>) -> Tensor<4> {
        let mut scores = q.mul_scalar(self.scale).matmul(k.swap_dims(2, 3)); // [b, h, len_q, len_k]
        if let Some(p) = hidden {
            let [b, l] = p.dims();
            scores = scores.mask_fill(p.clone().reshape([b, 1, 1, l]), MASKED_SCORE);
        }
        self.dropout.forward(softmax(scores, 3)).matmul(v)
    }

    /// The packed memory P' of the keys/values source `x: [b, len_k, d_model]`:
    /// `[b, m, d_model]` (isab) or `[b, m, n_heads·d_h]` (luna).
    pub fn pack(&self, x: Tensor<3>, padding: Option<&Tensor<2, Bool>>) -> Tensor<3> {
        let b = x.dims()[0];
        let slots = self.slots.val();
        let [m, d] = slots.dims();
        let slots = slots.unsqueeze_dim::<3>(0).expand([b, m, d]);
        let q = self.split_heads(self.pack_q.forward(slots.clone()));
        let (k, v) = self.keys_values(&self.pack_kv, x);
        let packed = self.merge_heads(self.attend(q, k, v, padding));
        let Some(out) = &self.pack_out else {
            return packed; // luna: the raw heads
        };
        let packed = out.forward(packed);
        match (&self.slot_norm, &self.slot_ff, &self.slot_ff_norm) {
            (Some(norm), Some(ff), Some(ff_norm)) => {
                let h = norm.forward(slots + packed);
                ff_norm.forward(h.clone() + relu(ff.forward(h)))
            }
            _ => packed,
        }
    }

    /// Every query of `query: [b, len_q, d_model]` attends over the packed slots.
    pub fn unpack(&self, query: Tensor<3>, packed: Tensor<3>) -> Tensor<3> {
        let q = self.split_heads(self.unpack_q.forward(query));
        let (k, v) = self.keys_values(&self.unpack_kv, packed);
        self.out.forward(self.merge_heads(self.attend(q, k, v, None)))
    }

    /// The bidirectional pack–unpack; `state` is unused (no incremental decoding: the kind is
    /// bidirectional only) and a causal mask is not honoured (see the module docs).
    pub fn forward(&self, input: AttentionInput, _state: Option<&mut AttentionState>) -> AttentionOutput {
        let source = input.key_value.unwrap_or_else(|| input.query.clone());
        let packed = self.pack(source, input.mask.padding.as_ref());
        AttentionOutput { context: self.unpack(input.query, packed), weights: None, aux_losses: Vec::new() }
    }
}

impl AttentionMechanism for InducingPointsAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        InducingPointsAttention::forward(self, input, state)
    }
}
