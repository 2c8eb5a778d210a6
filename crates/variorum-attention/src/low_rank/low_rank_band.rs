//! Low-rank and locality constrained self-attention (Guo, Qiu, Liu, Xue, Zhang 2019, "Low-Rank and
//! Locality Constrained Self-Attention for Sequence Modeling", IEEE/ACM TASLP), the
//! `low-rank-band` kind.
//!
//! The paper reads self-attention as a matrix decomposition: the attention matrix of a head is
//! the sum of a low-rank part, which captures long-range non-local interactions, and a band part,
//! which captures local dependencies. Per head, over shared values V = X W_V:
//!
//! A_lr   = softmax(Q̃ K̃ᵀ / √r + M),             Q̃, K̃ = X W̃_Q, X W̃_K ∈ ℝ^{L×r}  (r = `rank` ≪ d_h),
//! A_band = softmax_{|i−j| < w}(Q Kᵀ / √d_h + M),  Q, K = X W_Q, X W_K ∈ ℝ^{L×d_h} (w = `band`),
//! A = g A_lr + (1 − g) A_band,   head = A V,   output = [head_1; …; head_h] W_O,
//!
//! where M hides future keys when causal. The logits of A_lr have rank at most r: a small key
//! dimension is the low-rank constraint. Choices (the paper's text was not at hand; this is its
//! decomposition as summarised in the survey literature):
//! - the two parts are mixed by a learned gate per head, g = σ(γ_h), γ initialised to 0 (an even
//!   mix), so every row of A stays a distribution;
//! - `rank = 0` disables the low-rank module: the kind is then sliding-window attention of width w;
//! - the band is |i − j| < w bidirectionally and i − w < j ≤ i causally (w keys back, its own
//!   included, like the `sliding-window` kind).
//!
//! Cost, honestly: the low-rank module is full L × L attention with a small key dimension, so its
//! scores cost L·r per query rather than L·d_h (its values are still d_h wide: L·d_h for A_lr V),
//! and causal masking of it is an L × L mask. The band module is computed by blocks
//! ([`crate::engine::blocks`]): O(L·(w + B)), no L × L matrix. Decoding ([`LowRankBandState`]) keeps the
//! low-rank keys and the values of every position and the band keys of the last w.
//!
//! No relative position scheme acts inside; padding and custom masks are not applied.
//! Cross-attention scores every source key in the low-rank part and the band by absolute
//! positions (query i, source key j), densely.

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, softmax};
use variorum_core::{AttentionMask, Capabilities, ConfigError, error::check};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::engine::band::Band;
use crate::engine::blocks::banded;
use crate::engine::config::MultiHeadAttentionConfig;
use crate::engine::heads::MultiHeadAttention;
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::qkv::normal_linear;
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "low-rank-band"`.
    pub struct LowRankBandConfig [n_heads, head_dim, bias, dropout] {
        /// r, the low-rank module's query/key size per head; 0 disables the module. Default 4.
        pub rank: usize = 4,
        /// w, the band module's width: keys back, the query's own included (bidirectional: also
        /// w − 1 ahead). Default 16.
        pub band: usize = 16,
    }
}

impl LowRankBandConfig {
    fn mha(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig { bias: self.bias, ..self.head_fields().into() }
    }

    /// The layer: `init_std` for the input projections (Q̃ and K̃ too), `out_std` for the output;
    /// γ = 0, an even mix.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> LowRankBandAttention {
        let h = self.head_shape(d_model);
        LowRankBandAttention {
            band_attention: self.mha().init(d_model, init_std, out_std, Positioning::NONE, device),
            low_rank: (self.rank > 0)
                .then(|| normal_linear(d_model, 2 * h.n_heads * self.rank, self.bias, init_std, device)),
            gate: Param::from_tensor(Tensor::zeros([h.n_heads], device)),
            rank: self.rank,
            band: self.band,
        }
    }
}

impl AttentionKind for LowRankBandConfig {
    type Module = LowRankBandAttention;
    const SUMMARY: &'static str = "per head, a gated mix of a low-rank attention (query/key size `rank`, all L keys) and a band attention of width `band` (computed by blocks) over shared values";
    const PAPER: &'static str =
        "Guo, Qiu, Liu, Xue, Zhang 2019, Low-Rank and Locality Constrained Self-Attention for Sequence Modeling";
    const CAPS: Capabilities = Capabilities { hides_padding: false, ..caps::NO_SCORES };

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.mha().validate(d_model)?;
        check(self.band >= 1, || "model.attention.band must be at least 1".into())?;
        let dh = self.head_shape(d_model).head_dim;
        check(self.rank <= dh, || {
            format!(
                "model.attention.rank = {} exceeds the head size {dh}: the low-rank module's keys must be smaller than the heads' (0 disables it)",
                self.rank
            )
        })
    }

    head_settings_hooks!();

    /// Multiply–adds per token over a context of `len_k`: projections, L·r low-rank scores and
    /// L·d_h for their values, w band keys (plus the block's slack).
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd, n) = (d_model as u64, (h.n_heads * h.head_dim) as u64, h.n_heads as u64);
        let low = 2 * n * self.rank as u64;
        let band = len_k.min(self.band + self.band.min(128)) as u64;
        2 * (4 * d * hd + d * low) + 2 * len_k as u64 * (n * self.rank as u64 + hd) + 4 * hd * band
    }

    fn build(&self, init: &LayerInit, device: &Device) -> LowRankBandAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![TestVariant::new("", Self { rank: 2, band: 3, ..Default::default() })]
    }
}

/// Decoding state: the low-rank keys and values of every position (`low_rank`), the band keys
/// and values of the last w (`band`).
#[derive(Debug, Clone, Default)]
pub struct LowRankBandState {
    /// The low-rank keys K̃ and the values of every position.
    pub low_rank: KvCache,
    /// The band keys and values of the last w positions.
    pub band: KvCache,
}

/// A low-rank and band layer ([`LowRankBandConfig`]): per head, a gated mix of the two
/// attentions over shared values.
#[derive(Module, Debug)]
pub struct LowRankBandAttention {
    /// The band module's queries and keys, the shared values and the output projection.
    pub band_attention: MultiHeadAttention,
    /// Q̃ and K̃, `[d_model, 2·h·r]` (absent when r = 0).
    pub low_rank: Option<Linear>,
    /// γ per head: the low-rank module's share is σ(γ).
    pub gate: Param<Tensor<1>>,
    /// r, the low-rank module's query/key size per head; 0 disables the module.
    pub rank: usize,
    /// w, the band's width: keys back, the query's own included (bidirectional: also w − 1 ahead).
    pub band: usize,
}

impl LowRankBandAttention {
    fn band_of(&self, causal: bool) -> Band {
        let back = self.band - 1;
        Band { back, ahead: if causal { 0 } else { back }, block: self.band.clamp(1, 128), query_blocks: false, causal }
    }

    /// Q̃ `[b, h, len, r]` (scaled by 1/√r) from `x`, K̃ from `source`.
    fn low_rank_qk(&self, lin: &Linear, x: Tensor<3>, source: Option<Tensor<3>>) -> (Tensor<4>, Tensor<4>) {
        let h = self.gate.dims()[0];
        let r = self.rank;
        let split = |t: Tensor<3>| {
            let [b, l, _] = t.dims();
            lin.forward(t).reshape([b, l, 2, h, r]).swap_dims(1, 3) // [b, h, 2, l, r]
        };
        let qq = split(x.clone());
        let [b, _, _, lq, _] = qq.dims();
        let q = qq.clone().narrow(2, 0, 1).reshape([b, h, lq, r]).mul_scalar(1.0 / (r as f64).sqrt());
        let kk = match source {
            Some(src) => split(src),
            None => qq,
        };
        let lk = kk.dims()[3];
        (q, kk.narrow(2, 1, 1).reshape([b, h, lk, r]))
    }

    /// g·lr + (1 − g)·band per head.
    fn mix(&self, low: Tensor<4>, band: Tensor<4>) -> Tensor<4> {
        let g = sigmoid(self.gate.val()).reshape([1, self.gate.dims()[0], 1, 1]);
        low * g.clone() + band * (g.neg() + 1.0)
    }

    /// The gated mix, `[b, len_q, d_model]`: the band by blocks over a fresh sequence, every key
    /// densely for cross-attention and for causal decoding that continues `state`.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut LowRankBandState>) -> AttentionOutput {
        let mask = input.mask;
        let context = match (input.key_value, state) {
            (Some(source), _) => self.dense(input.query, Some(source), mask, None),
            (None, Some(st)) if mask.causal => {
                let fresh = st.low_rank.is_empty() && st.band.is_empty() && st.band.start == 0;
                if fresh && mask.q_start == 0 {
                    self.parallel(input.query, true, Some(st))
                } else {
                    self.dense(input.query, None, mask, Some(st))
                }
            }
            (None, _) => self.parallel(input.query, mask.causal, None),
        };
        AttentionOutput { context: self.band_attention.merge(context), weights: None, aux_losses: Vec::new() }
    }

    /// A fresh sequence: the band by blocks, the low-rank module over all L keys. Fills `st` when
    /// given.
    fn parallel(&self, x: Tensor<3>, causal: bool, st: Option<&mut LowRankBandState>) -> Tensor<4> {
        let mha = &self.band_attention;
        let plain = AttentionMask { causal, ..AttentionMask::causal() };
        let p = mha.project(x.clone(), None, &plain, None);
        let band = banded(mha, &p, &[self.band_of(causal)], &[]);
        let l = p.v.dims()[2];
        let low = self.low_rank.as_ref().map(|lin| {
            let (q, k) = self.low_rank_qk(lin, x, None);
            let mut scores = q.matmul(k.clone().swap_dims(2, 3)); // [b, h, L, L], key dimension r
            if causal {
                // true above the diagonal: the keys after each query
                let future = Tensor::<2, Bool>::tril_mask([l, l], 0, &scores.device());
                scores = scores.mask_fill(future.reshape([1, 1, l, l]), MASKED_SCORE);
            }
            (mha.dropout.forward(softmax(scores, 3)).matmul(p.v.clone()), k)
        });
        if let Some(st) = st {
            if let Some((_, k)) = &low {
                st.low_rank.append(k.clone(), p.v.clone());
            }
            st.band.append(p.k.clone(), p.v.clone());
            st.band.drop_front(l.saturating_sub(self.band));
        }
        match low {
            Some((low, _)) => self.mix(low, band),
            None => band,
        }
    }

    /// Every key scored under the pattern's mask, at absolute positions: cross-attention, and
    /// decoding that continues `st` (the band cache trimmed to the last w afterwards).
    fn dense(
        &self,
        x: Tensor<3>,
        source: Option<Tensor<3>>,
        mask: &AttentionMask,
        mut st: Option<&mut LowRankBandState>,
    ) -> Tensor<4> {
        let mha = &self.band_attention;
        // a memory arrives as a source under a causal mask (keys from before the queries): the
        // band and the low-rank part stay causal over absolute positions there too
        let causal = mask.causal;
        let device = x.device();
        let p = mha.project(x.clone(), source.clone(), mask, st.as_mut().map(|s| &mut s.band));
        let lq = p.q_dims()[2];
        let q0 = mask.q_start;
        let positions_mask = |k0: usize, lk: usize, hidden: &dyn Fn(usize, usize) -> bool| {
            let m: Vec<bool> =
                (0..lq).flat_map(|i| (0..lk).map(move |j| (i, j))).map(|(i, j)| hidden(q0 + i, k0 + j)).collect();
            Tensor::<2, Bool>::from_data(TensorData::new(m, [lq, lk]), &device).reshape([1, 1, lq, lk])
        };
        let band = self.band_of(causal);
        let (k0, lk) = (p.layout.k_start, p.layout.len_k);
        let scores = p.q().matmul(p.k.clone().swap_dims(2, 3));
        let hidden = positions_mask(k0, lk, &|i, j| !band.sees(i as i64, j as i64));
        let band_ctx = mha.dropout.forward(softmax(scores.mask_fill(hidden, MASKED_SCORE), 3)).matmul(p.v.clone());
        let low = self.low_rank.as_ref().map(|lin| {
            let (q, k) = self.low_rank_qk(lin, x, source);
            let (k, v) = match st.as_mut() {
                Some(s) => {
                    let new = k.dims()[2];
                    s.low_rank.append(k, p.v.clone().narrow(2, lk - new, new))
                }
                None => (k, p.v.clone()),
            };
            let n = k.dims()[2];
            let mut scores = q.matmul(k.swap_dims(2, 3));
            if causal {
                scores = scores.mask_fill(positions_mask(mask.k_start, n, &|i, j| j > i), MASKED_SCORE);
            }
            mha.dropout.forward(softmax(scores, 3)).matmul(v)
        });
        if let Some(s) = st {
            let len = s.band.len();
            s.band.drop_front(len.saturating_sub(self.band));
        }
        match low {
            Some(low) => self.mix(low, band_ctx),
            None => band_ctx,
        }
    }
}

impl AttentionMechanism for LowRankBandAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        LowRankBandAttention::forward(self, input, state.map(|s| s.get_or_default::<LowRankBandState>()))
    }
}
