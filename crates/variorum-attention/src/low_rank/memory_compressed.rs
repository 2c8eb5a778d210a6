//! Memory-compressed attention (Liu et al. 2018, "Generating Wikipedia by Summarizing Long
//! Sequences"), the `memory-compressed` kind: keys and values are shortened by a strided
//! convolution (kernel = stride = s) along the sequence,
//!
//! K̃ = Conv_s(K),  Ṽ = Conv_s(V),  Attention(Q, K̃, Ṽ) = softmax(Q K̃ᵀ/√d) Ṽ,
//!
//! so the score matrix is L × L/s. With `local = true` every query also attends to the raw keys
//! of its own block of s positions, in the same softmax (the paper pairs the compression with
//! local attention).
//!
//! `local_layers = B` gives the paper's own arrangement instead (T-DMCA: "we interleave local
//! attention layers with memory-compressed attention layers"): the 1st, 3rd, … layers attend
//! within blocks of B positions (causal inside the block; the paper's B = 256) and the others to
//! the compressed keys alone, without raw keys. Causally such a layer sees only finished blocks,
//! so a query before the first finished block gets a zero output (its residual passes it on; the
//! local layers around it see its neighbours; choice).
//!
//! Causal use: a compressed key summarises s positions, so query i sees compressed block j only
//! once the whole block lies before it ((j + 1)·s ≤ i), and always its own block's raw keys up to
//! itself — a causal forward is always local (without it the first s − 1 positions would have
//! nothing to attend to; choice). Decoding keeps the compressed keys of finished blocks and the
//! raw keys of the open one ([`CompressedState`]): O(L/s + s) per token. Compressed keys have no
//! single position, so relative position schemes are refused with this kind; nor does it read a
//! memory (its capabilities say `reads_memory: false`): a compressed block would mix the memory
//! with positions after the query.

use burn::nn::conv::{Conv1d, Conv1dConfig};
use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::projections;
use crate::engine::projections::HeadProjections;
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "memory-compressed"`.
    pub struct MemoryCompressedConfig [n_heads, head_dim, bias, dropout] {
        /// s, kernel and stride of the compression. Default 3 (the paper's).
        pub stride: usize = 3,
        /// Also attend to the raw keys of the query's own block (always on for causal attention).
        /// Default true.
        pub local: bool = true,
        /// The paper's arrangement: every other layer (the 1st, 3rd, …) is local attention in
        /// blocks of this many positions, the others memory-compressed without raw keys. Default
        /// none: every layer attends to [compressed keys; own block] in one softmax.
        pub local_layers: Option<usize> = None,
        /// The layer this config was specialised for ([`AttentionKind::for_layer`]).
        #[serde(skip)]
        pub layer: usize = 0,
    }
}

impl MemoryCompressedConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output projection; the convolutions
    /// keep Burn's default initialisation.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> MemoryCompressedAttention {
        let h = self.head_shape(d_model);
        let width = h.n_heads * h.head_dim;
        let conv = || Conv1dConfig::new(width, width, self.stride).with_stride(self.stride).init(device);
        MemoryCompressedAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            compress_k: conv(),
            compress_v: conv(),
            dropout: DropoutConfig::new(self.dropout).init(),
            stride: self.stride,
            local: self.local,
            scale: 1.0 / (h.head_dim as f64).sqrt(),
            role: self.role(),
        }
    }

    /// What this layer attends to.
    pub fn role(&self) -> Role {
        match self.local_layers {
            None => Role::Joint,
            Some(block) if self.layer % 2 == 0 => Role::Local(block),
            Some(_) => Role::Compressed,
        }
    }
}

/// What one memory-compressed layer attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Compressed keys and the own block's raw keys, in one softmax.
    #[default]
    Joint,
    /// Raw keys within blocks of this many positions (the paper's local layers).
    Local(usize),
    /// Compressed keys only.
    Compressed,
}

impl AttentionKind for MemoryCompressedConfig {
    type Module = MemoryCompressedAttention;
    const SUMMARY: &'static str = "keys/values shortened by a strided convolution (kernel = stride = s) plus the own block's raw keys; L × L/s scores";
    const PAPER: &'static str = "Liu et al. 2018, Generating Wikipedia by Summarizing Long Sequences";
    /// No memory beside it: its compressed keys would mix a memory with positions after the query
    /// (`reads_memory: false`, refused by the model's rules).
    const CAPS: Capabilities = Capabilities { reads_memory: false, hides_padding: false, ..caps::NO_SCORES };

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        check(self.stride >= 1, || "model.attention.stride must be at least 1".into())?;
        check(self.local_layers != Some(0), || "model.attention.local_layers must be at least 1".into())?;
        crate::kind::check_dropout(self.dropout)
    }

    head_settings_hooks!();

    /// Multiply–adds per token over a context of `len_k`: projections, compression, L/s + s keys
    /// (interleaved: the mean of a local layer's B keys and a compressed layer's L/s).
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd) = (d_model as u64, (h.n_heads * h.head_dim) as u64);
        let compressed = (len_k / self.stride.max(1)) as u64;
        let keys = match self.local_layers {
            None => compressed + self.stride as u64,
            Some(block) => (compressed + block.min(len_k) as u64) / 2,
        };
        2 * (4 * d * hd + 2 * hd * hd) + 4 * hd * keys
    }

    fn for_layer(&self, layer: usize) -> Self {
        Self { layer, ..self.clone() }
    }

    fn build(&self, init: &LayerInit, device: &Device) -> MemoryCompressedAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    /// Strided-convolution keys plus the own block (stride 3), without `local` (stride 2), and
    /// the paper's interleaved layers (local blocks of 4, then compressed only).
    fn test_variants() -> Vec<TestVariant<Self>> {
        let mut out: Vec<_> = [(3, true), (2, false)]
            .map(|(stride, local)| {
                TestVariant::new(format!("stride {stride}"), Self { stride, local, ..Default::default() })
            })
            .into();
        let interleaved = Self { stride: 2, local_layers: Some(4), ..Default::default() };
        out.push(TestVariant::new("interleaved local 4", interleaved));
        out
    }
}

/// Decoding state: compressed keys and values of the finished blocks, raw ones of the open block
/// (`[b, h, n, d_h]` each).
#[derive(Debug, Clone, Default)]
pub struct CompressedState {
    /// Compressed keys and values of the finished blocks.
    pub memory: Option<(Tensor<4>, Tensor<4>)>,
    /// Raw keys and values of the open block (a local layer's: of its open local block).
    pub open: Option<(Tensor<4>, Tensor<4>)>,
}

/// A memory-compressed attention layer ([`MemoryCompressedConfig`]): keys and values
/// shortened by a strided convolution.
#[derive(Module, Debug)]
pub struct MemoryCompressedAttention {
    /// The q/k/v and output projections.
    pub proj: HeadProjections,
    /// Conv_s of the keys, kernel = stride = s, over the `h · d_h` channels.
    pub compress_k: Conv1d,
    /// Conv_s of the values, kernel = stride = s, over the `h · d_h` channels.
    pub compress_v: Conv1d,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// s, kernel and stride of the compression.
    pub stride: usize,
    /// Also attend to the raw keys of the query's own block (causal forwards always do).
    pub local: bool,
    /// 1/√d_h, the queries' scale.
    pub scale: f64,
    /// What this layer attends to (from `local_layers` and the layer's index); not saved.
    #[module(skip)]
    pub role: Role,
}

fn cat(a: Option<Tensor<4>>, b: Tensor<4>) -> Tensor<4> {
    match a {
        Some(a) => Tensor::cat(vec![a, b], 2),
        None => b,
    }
}

impl MemoryCompressedAttention {
    /// Conv_s along the length of `[b, h, n·s, d_h]`: `[b, h, n, d_h]`.
    fn compress(&self, conv: &Conv1d, x: Tensor<4>) -> Tensor<4> {
        let [b, h, l, dh] = x.dims();
        let channels = x.swap_dims(1, 2).reshape([b, l, h * dh]).swap_dims(1, 2);
        let out = conv.forward(channels); // [b, h·dh, l/s]
        let n = out.dims()[2];
        out.swap_dims(1, 2).reshape([b, n, h, dh]).swap_dims(1, 2)
    }

    /// Attention over the compressed (and own-block) keys, `[b, len_q, d_model]`. Causal
    /// self-attention continues `state` and leaves it updated: O(L/s + s) per decoded token.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut CompressedState>) -> AttentionOutput {
        let causal = input.mask.causal;
        let cross = input.key_value.is_some();
        let (q, k, v) = self.proj.split_scaled(input.query, input.key_value, self.scale);
        let context = match state {
            Some(st) if causal && !cross => {
                let fresh = st.memory.is_none() && st.open.is_none();
                if fresh && input.mask.q_start == 0 {
                    let out = self.parallel(q, k.clone(), v.clone(), true);
                    self.start_state(st, k, v);
                    out
                } else {
                    self.step_by_step(q, k, v, st)
                }
            }
            _ => self.parallel(q, k, v, causal && !cross),
        };
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }

    /// The state after a fresh sequence of keys and values.
    fn start_state(&self, st: &mut CompressedState, k: Tensor<4>, v: Tensor<4>) {
        let l = k.dims()[2];
        if let Role::Local(block) = self.role {
            // only the open local block matters to later queries
            let done = l / block * block;
            if done < l {
                st.open = Some((k.narrow(2, done, l - done), v.narrow(2, done, l - done)));
            }
            return;
        }
        let done = l / self.stride * self.stride;
        if done > 0 {
            let ck = self.compress(&self.compress_k, k.clone().narrow(2, 0, done));
            let cv = self.compress(&self.compress_v, v.clone().narrow(2, 0, done));
            st.memory = Some((ck, cv));
        }
        if done < l {
            st.open = Some((k.narrow(2, done, l - done), v.narrow(2, done, l - done)));
        }
    }

    /// Queries `[b, h, L, d_h]` (scaled) over their own keys: compressed blocks (visible once
    /// finished, when causal) and, locally, the raw keys of the query's block.
    fn parallel(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, causal: bool) -> Tensor<4> {
        let [b, h, l, dh] = q.dims();
        let lk = k.dims()[2];
        let s = self.stride;
        let device = q.device();
        let (local, with_compressed, lb) = match self.role {
            Role::Joint => ((self.local || causal) && lk == l, true, s),
            Role::Local(block) => (true, false, block),
            Role::Compressed => (false, true, s),
        };
        let done = lk / s * s;
        let mut scores = Vec::new();
        let mut compressed = None;
        if with_compressed && done > 0 {
            let ck = self.compress(&self.compress_k, k.clone().narrow(2, 0, done));
            let cv = self.compress(&self.compress_v, v.clone().narrow(2, 0, done));
            let n = done / s;
            let mut sc = q.clone().matmul(ck.swap_dims(2, 3)); // [b, h, l, n]
            if causal {
                // query i sees block j once the block lies before it, (j + 1)·s ≤ i
                let hidden: Vec<bool> = (0..l).flat_map(|i| (0..n).map(move |j| (j + 1) * s > i)).collect();
                let m = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [l, n]), &device);
                sc = sc.mask_fill(m.reshape([1, 1, l, n]), MASKED_SCORE);
            }
            scores.push(sc);
            compressed = Some((cv, n));
        }
        let mut blocks = None;
        if local {
            // own block, by blocks of lb: [b·h, nb, lb, lb]
            let s = lb;
            let nb = l.div_ceil(s);
            let pad = nb * s - l;
            let blocked = |x: Tensor<4>| {
                let x =
                    if pad == 0 { x } else { Tensor::cat(vec![x.clone(), Tensor::zeros([b, h, pad, dh], &device)], 2) };
                x.reshape([b * h, nb, s, dh])
            };
            let (qb, kb, vb) = (blocked(q.clone()), blocked(k), blocked(v));
            let hidden: Vec<bool> = (0..nb)
                .flat_map(|i| (0..s).flat_map(move |r| (0..s).map(move |c| (causal && c > r) || i * s + c >= l)))
                .collect();
            let m = Tensor::<3, Bool>::from_data(TensorData::new(hidden, [nb, s, s]), &device).unsqueeze_dim::<4>(0);
            let sc = qb.matmul(kb.swap_dims(2, 3)).mask_fill(m, MASKED_SCORE);
            scores.push(sc.reshape([b, h, nb * s, s]).narrow(2, 0, l));
            blocks = Some((vb, nb));
        }
        if scores.is_empty() {
            // nothing finished yet (compressed-only), or a bidirectional joint forward shorter than s
            return Tensor::zeros([b, h, l, dh], &device);
        }
        let widths: Vec<usize> = scores.iter().map(|t| t.dims()[3]).collect();
        let probs = self.dropout.forward(softmax(Tensor::cat(scores, 3), 3));
        let mut out: Tensor<4> = Tensor::zeros([b, h, l, dh], &device);
        let mut at = 0;
        if let Some((cv, n)) = compressed {
            out = out + probs.clone().narrow(3, 0, n).matmul(cv);
            at = widths[0];
        }
        if let Some((vb, nb)) = blocks {
            let s = lb;
            let p = probs.narrow(3, at, s);
            let pad = nb * s - l;
            let p = if pad == 0 { p } else { Tensor::cat(vec![p.clone(), Tensor::zeros([b, h, pad, s], &device)], 2) };
            let local_out = p.reshape([b * h, nb, s, s]).matmul(vb).reshape([b, h, nb * s, dh]).narrow(2, 0, l);
            out = out + local_out;
        }
        if self.role == Role::Compressed && causal {
            // queries before the first finished block see nothing: zero, not a mean of masked keys
            let seen: Vec<f32> = (0..l).map(|i| f32::from(i >= s)).collect();
            out = out * Tensor::<1>::from_data(TensorData::new(seen, [l]), &device).reshape([1, 1, l, 1]);
        }
        out
    }

    /// Causal decoding continuing `st`, one new position at a time.
    fn step_by_step(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, st: &mut CompressedState) -> Tensor<4> {
        let l = q.dims()[2];
        let mut outs = Vec::with_capacity(l);
        for t in 0..l {
            let (kt, vt) = (k.clone().narrow(2, t, 1), v.clone().narrow(2, t, 1));
            let (ok, ov) = match st.open.take() {
                Some((a, b)) => (cat(Some(a), kt), cat(Some(b), vt)),
                None => (kt, vt),
            };
            let qt = q.clone().narrow(2, t, 1);
            let attend = |keys: Tensor<4>, values: Tensor<4>| {
                self.dropout.forward(softmax(qt.clone().matmul(keys.swap_dims(2, 3)), 3)).matmul(values)
            };
            if let Role::Local(block) = self.role {
                outs.push(attend(ok.clone(), ov.clone()));
                if ok.dims()[2] < block {
                    st.open = Some((ok, ov));
                }
                continue;
            }
            outs.push(match (&st.memory, self.role) {
                (None, Role::Compressed) => qt.zeros_like(),
                (Some((mk, mv)), Role::Compressed) => attend(mk.clone(), mv.clone()),
                (Some((mk, mv)), _) => attend(cat(Some(mk.clone()), ok.clone()), cat(Some(mv.clone()), ov.clone())),
                (None, _) => attend(ok.clone(), ov.clone()),
            });
            if ok.dims()[2] == self.stride {
                let ck = self.compress(&self.compress_k, ok);
                let cv = self.compress(&self.compress_v, ov);
                st.memory = Some(match st.memory.take() {
                    Some((mk, mv)) => (cat(Some(mk), ck), cat(Some(mv), cv)),
                    None => (ck, cv),
                });
            } else {
                st.open = Some((ok, ov));
            }
        }
        Tensor::cat(outs, 2)
    }
}

impl AttentionMechanism for MemoryCompressedAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        MemoryCompressedAttention::forward(self, input, state.map(|s| s.get_or_default::<CompressedState>()))
    }
}
