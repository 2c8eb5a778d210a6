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
use variorum_position::HeadShape;

use crate::full::MASKED_SCORE;
use crate::kernel::{self, HeadProjections};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::{AttentionInput, AttentionOutput, AttentionState};

crate::attention_config! {
    /// `model.attention` with `kind = "memory-compressed"`.
    pub struct MemoryCompressedConfig [n_heads, head_dim, bias, dropout] {
        /// s, kernel and stride of the compression. Default 3 (the paper's).
        pub stride: usize = 3,
        /// Also attend to the raw keys of the query's own block (always on for causal attention).
        /// Default true.
        pub local: bool = true,
    }
}

impl MemoryCompressedConfig {
    pub fn heads(&self, d_model: usize) -> HeadShape {
        kernel::heads(self.n_heads, self.head_dim, d_model)
    }

    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> MemoryCompressedAttention {
        let h = self.heads(d_model);
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
        }
    }
}

impl AttentionKind for MemoryCompressedConfig {
    type Module = MemoryCompressedAttention;
    const SUMMARY: &'static str = "keys/values shortened by a strided convolution (kernel = stride = s) plus the own block's raw keys; L × L/s scores";
    const PAPER: &'static str = "Liu et al. 2018, Generating Wikipedia by Summarizing Long Sequences";
    /// No memory beside it: its compressed keys would mix a memory with positions after the query
    /// (`reads_memory: false`, refused by the model's rules).
    const CAPS: Capabilities = Capabilities { reads_memory: false, ..caps::NO_SCORES };

    fn expanded(&self, d_model: usize) -> Self {
        Self { head_dim: Some(self.heads(d_model).head_dim), ..self.clone() }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        kernel::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        check(self.stride >= 1, || "model.attention.stride must be at least 1".into())?;
        crate::kind::check_dropout(self.dropout)
    }

    fn head_shape(&self, d_model: usize) -> HeadShape {
        self.heads(d_model)
    }

    fn dropout(&self) -> f64 {
        self.dropout
    }

    /// Multiply–adds per token over a context of `len_k`: projections, compression, L/s + s keys.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.heads(d_model);
        let (d, hd) = (d_model as u64, (h.n_heads * h.head_dim) as u64);
        let keys = (len_k / self.stride.max(1) + self.stride) as u64;
        2 * (4 * d * hd + 2 * hd * hd) + 4 * hd * keys
    }

    fn build(&self, init: &LayerInit, device: &Device) -> MemoryCompressedAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    /// Strided-convolution keys plus the own block (stride 3), and without `local` (stride 2).
    fn test_variants() -> Vec<TestVariant<Self>> {
        [(3, true), (2, false)]
            .map(|(stride, local)| {
                TestVariant::new(format!("stride {stride}"), Self { stride, local, ..Default::default() })
            })
            .into()
    }
}

/// Decoding state: compressed keys and values of the finished blocks, raw ones of the open block
/// (`[b, h, n, d_h]` each).
#[derive(Debug, Clone, Default)]
pub struct CompressedState {
    pub memory: Option<(Tensor<4>, Tensor<4>)>,
    pub open: Option<(Tensor<4>, Tensor<4>)>,
}

#[derive(Module, Debug)]
pub struct MemoryCompressedAttention {
    pub proj: HeadProjections,
    pub compress_k: Conv1d,
    pub compress_v: Conv1d,
    pub dropout: Dropout,
    pub stride: usize,
    pub local: bool,
    pub scale: f64,
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

    pub fn forward(&self, input: AttentionInput, state: Option<&mut CompressedState>) -> AttentionOutput {
        let causal = input.mask.causal;
        let cross = input.key_value.is_some();
        let (q, k, v) = self.proj.split(input.query, input.key_value);
        let q = q.mul_scalar(self.scale);
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
        let local = (self.local || causal) && lk == l;
        let done = lk / s * s;
        let mut scores = Vec::new();
        let mut compressed = None;
        if done > 0 {
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
            // own block, by blocks of s: [b·h, nb, s, s]
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
            // a causal forward is always local: only a bidirectional one shorter than s gets here
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
            let p = probs.narrow(3, at, s);
            let pad = nb * s - l;
            let p = if pad == 0 { p } else { Tensor::cat(vec![p.clone(), Tensor::zeros([b, h, pad, s], &device)], 2) };
            let local_out = p.reshape([b * h, nb, s, s]).matmul(vb).reshape([b, h, nb * s, dh]).narrow(2, 0, l);
            out = out + local_out;
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
            let (keys, values) = match &st.memory {
                Some((mk, mv)) => (cat(Some(mk.clone()), ok.clone()), cat(Some(mv.clone()), ov.clone())),
                None => (ok.clone(), ov.clone()),
            };
            let probs = self.dropout.forward(softmax(q.clone().narrow(2, t, 1).matmul(keys.swap_dims(2, 3)), 3));
            outs.push(probs.matmul(values));
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
