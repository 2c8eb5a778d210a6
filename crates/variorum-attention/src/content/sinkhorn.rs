//! Sparse Sinkhorn attention (Tay et al. 2020), the `sinkhorn` kind. The sequence is cut into N
//! blocks of b; a sorting network scores block pairs, R ∈ ℝ^{N×N}, and Gumbel–Sinkhorn
//! normalisation turns R into a soft permutation
//!
//! S = Sinkhorn_k((R + Gumbel noise while training) / τ)   (k alternating row and column
//! normalisations in log space: a doubly stochastic matrix),
//!
//! whose row i mixes the key and value blocks into block i's *sorted* block, K̃_i = Σ_j S_ij K_j.
//! The queries of block i attend to their own block and their sorted block in one softmax:
//! O(L·b) scores plus O(N²·b·d) for the mixing. `sortcut = n` (bidirectional, SortCut): every
//! query attends to the first n sorted blocks instead — O(L·n·b); the first sorted blocks mix the
//! whole sequence, so a config with it has no causal form.
//!
//! A last block shorter than b is padded with zero keys and values; bidirectionally they enter its
//! mean and the mixtures (causally only earlier, whole blocks are mixed).
//!
//! Sorting network — our choice: the paper's SortNet maps each block's pooled input to N logits,
//! which ties a layer to one length; ours scores pairs of pooled key blocks,
//! R_ij = (W p_i)·p_j / √d with p the block means of the keys (as reference implementations do),
//! so any length works.
//!
//! Causal — our choice: block i's sorted block may only mix blocks before it, and block i's own
//! pooled keys include positions after a query, so row i is scored from the mean of the keys of
//! blocks < i, over columns j < i. Column normalisation would make row i depend on later rows,
//! so causally the balancing is row normalisation only (a softmax over the earlier blocks); the
//! first block has no sorted block. Decoding then equals the full forward: a new token scores its
//! block so far plus its block's sorted block, mixed from the cache once per block and kept.
//!
//! On flex without dropout (and without SortCut) the blocks attend on their own kernel
//! ([`variorum_kernels::sinkhorn`]): it mixes the sorted blocks per head in scratch, in the
//! forward and again in the backward, so neither they nor an `[N, b, 2b]` score or mask tensor
//! is kept; the sorting network and the balancing stay Burn's ops.
//!
//! The Gumbel noise (`gumbel = true`) is drawn afresh on every training forward, so a reversible
//! block's recomputation cannot replay it (the config is then not `replayable`). Queries and keys
//! of the same positions are sorted together: no memory (`reads_memory: false`).

use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::{log_softmax, softmax};
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::concat_heads;
use crate::engine::qkv::{normal_linear, project_head_range};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::pattern::sorted_chunks::log_sum_exp;
use crate::state::AttentionState;
use variorum_kernels::sinkhorn::{SinkhornBlocks, sinkhorn_block_attention};

const MASKED: f32 = -1e9;

attention_config! {
    /// `model.attention` with `kind = "sinkhorn"`.
    pub struct SinkhornConfig [n_heads, head_dim, dropout, bias] {
        /// b, positions per block. Default 64.
        pub block: usize = 64,
        /// k, Sinkhorn iterations (row + column normalisation each). Default 8.
        pub iterations: usize = 8,
        /// τ, the temperature of the sorting. Default 0.75 (the paper's).
        pub temperature: f64 = 0.75,
        /// Gumbel noise on the sorting logits while training. Default true.
        pub gumbel: bool = true,
        /// SortCut: attend to the first n sorted blocks only (bidirectional). Default none.
        pub sortcut: Option<usize> = None,
    }
}

impl SinkhornConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output, std 1/√d_h for the sorting
    /// network's W.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> SinkhornAttention {
        let (h, hd) = (self.n_heads, self.head_shape(d_model).head_dim);
        SinkhornAttention {
            qkv: normal_linear(d_model, 3 * h * hd, self.bias, init_std, device),
            out: normal_linear(h * hd, d_model, self.bias, out_std, device),
            sort: normal_linear(hd, hd, false, 1.0 / (hd as f64).sqrt(), device),
            dropout: DropoutConfig::new(self.dropout).init(),
            n_heads: h,
            head_dim: hd,
            block: self.block,
            iterations: self.iterations,
            temperature: self.temperature,
            gumbel: self.gumbel,
            sortcut: self.sortcut,
        }
    }
}

impl AttentionKind for SinkhornConfig {
    type Module = SinkhornAttention;
    const SUMMARY: &'static str = "Sparse Sinkhorn attention: each block attends to itself and its sorted block, a Gumbel-Sinkhorn soft permutation of key blocks scored by a sorting network; SortCut option; causal: earlier blocks only, row-normalised";
    const PAPER: &'static str = "Tay et al. 2020, Sparse Sinkhorn Attention";
    const CAPS: Capabilities = Capabilities { reads_memory: false, hides_padding: false, ..caps::NO_SCORES };

    /// SortCut has no causal form; Gumbel noise cannot be replayed by a reversible block's
    /// recomputation.
    fn capabilities(&self) -> Capabilities {
        let mut c = Self::CAPS;
        if self.sortcut.is_some() {
            c.causal = false;
        }
        if self.gumbel {
            c.replayable = false;
        }
        c
    }

    fn why_not_causal(&self) -> &'static str {
        "model.attention.sortcut lets every query see the first sorted blocks, which mix the whole sequence: a sortcut is bidirectional; remove it for a causal model"
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        // the head checks of `full`, dropout included
        crate::engine::config::MultiHeadAttentionConfig::from(self.head_fields()).validate(d_model)?;
        check(self.block >= 1, || "model.attention.block must be at least 1".into())?;
        check(self.iterations >= 1, || "model.attention.iterations must be at least 1".into())?;
        check(self.temperature > 0.0, || format!("model.attention.temperature = {} must be > 0", self.temperature))?;
        check(self.sortcut != Some(0), || "model.attention.sortcut must be at least 1 block".into())
    }

    head_settings_hooks!();

    /// Multiply–adds per token: projections, 2b (or n·b) scores and value rows, the mixing.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let (h, hd) = (self.n_heads as u64, self.head_shape(d_model).head_dim as u64);
        let keys = self.sortcut.map_or(2 * self.block, |n| n * self.block).min(len_k) as u64;
        let blocks = len_k.div_ceil(self.block) as u64;
        2 * (4 * d_model as u64 * h * hd + h * (2 * keys * hd + 2 * blocks * hd))
    }

    fn build(&self, init: &LayerInit, device: &Device) -> SinkhornAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![TestVariant::new("", Self { block: 3, ..Default::default() })]
    }
}

/// A sparse Sinkhorn attention layer ([`SinkhornConfig`]): each block attends to itself and
/// its sorted block.
#[derive(Module, Debug)]
pub struct SinkhornAttention {
    /// The fused q/k/v projection, `d_model → 3 · h · d_h`.
    pub qkv: Linear,
    /// The output projection, `h · d_h → d_model`.
    pub out: Linear,
    /// W of the sorting network R_ij = (W p_i)·p_j / √d.
    pub sort: Linear,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Heads h.
    pub n_heads: usize,
    /// d_h, the size of each head.
    pub head_dim: usize,
    /// b, positions per block.
    pub block: usize,
    /// k, Sinkhorn iterations (row and column normalisation each; causal: row softmax only).
    pub iterations: usize,
    /// τ, the temperature dividing the sorting logits.
    pub temperature: f64,
    /// Gumbel noise on the sorting logits in training forwards.
    pub gumbel: bool,
    /// SortCut: every query attends to the first n sorted blocks only (bidirectional).
    pub sortcut: Option<usize>,
}

impl SinkhornAttention {
    /// The soft permutation `[b, h, n, n]` of `n` key blocks `[b, h, n, block, hd]` flattened to
    /// `[b, h, n, block · hd]` (padding as zeros). Causal rows mix earlier blocks only (row 0: none).
    pub fn sort_matrix(&self, blocks: Tensor<4>, causal: bool) -> Tensor<4> {
        let [b, h, n, _] = blocks.dims();
        let means = blocks.reshape([b, h, n, self.block, self.head_dim]).mean_dim(3).reshape([b, h, n, self.head_dim]);
        self.sort_of_means(means, causal)
    }

    /// [`Self::sort_matrix`] from the blocks' mean keys `[b, h, n, hd]`.
    fn sort_of_means(&self, means: Tensor<4>, causal: bool) -> Tensor<4> {
        let [b, h, n, hd] = means.dims();
        let device = means.device();
        // causally, row i reads the mean of the blocks before it
        let pooled = if causal {
            let sums = crate::kernelised::kernel::exclusive_cumsum(means.clone(), 2);
            let counts: Vec<f32> = (0..n).map(|i| i.max(1) as f32).collect();
            sums / Tensor::<1>::from_data(TensorData::new(counts, [n]), &device).reshape([1, 1, n, 1])
        } else {
            means.clone()
        };
        let logits = self.sort.forward(pooled).matmul(means.swap_dims(2, 3)).div_scalar((hd as f64).sqrt());
        let logits = if self.gumbel && logits.is_autodiff() {
            let u = logits.random_like(Distribution::Uniform(1e-6, 1.0 - 1e-6));
            logits - u.log().neg().log()
        } else {
            logits
        };
        let logits = logits.div_scalar(self.temperature);
        if causal {
            let hidden: Vec<bool> = (0..n * n).map(|x| x % n >= x / n).collect();
            let hidden = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [n, n]), &device);
            let hidden = hidden.reshape([1, 1, n, n]).expand([b, h, n, n]);
            let first_row = Tensor::<1>::from_data(
                TensorData::new((0..n).map(|i| f32::from(i > 0)).collect::<Vec<_>>(), [n]),
                &device,
            );
            return softmax(logits.mask_fill(hidden, MASKED), 3) * first_row.reshape([1, 1, n, 1]);
        }
        let mut log_s = logits;
        for _ in 0..self.iterations {
            log_s = log_softmax(log_s, 3);
            log_s = log_softmax(log_s, 2);
        }
        log_s.exp()
    }

    /// Self-attention over own and sorted blocks (no `key_value`), `[b, len_q, d_model]`. One
    /// decoded causal token scores its block so far and the block's sorted block.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        assert!(input.key_value.is_none(), "sinkhorn attention is self-attention only");
        let causal = input.mask.causal;
        let [b, lq, _] = input.query.dims();
        let (h, hd) = (self.n_heads, self.head_dim);
        // q scaled by 1/√d_h on its projection, not by a strided pass over its heads
        let q = project_head_range(&self.qkv, input.query.clone(), (0, h, hd), 1.0 / (hd as f64).sqrt());
        let [k, v]: [Tensor<4>; 2] =
            [1, 2].map(|part| project_head_range(&self.qkv, input.query.clone(), (part * h, h, hd), 1.0));
        let context = match cache {
            None => self.attend_all(q, k, v, lq, causal),
            Some(cache) => {
                let (k, v) = cache.append(k, v);
                if lq == 1 && causal {
                    concat_heads(self.decode_one(q, k, v, &mut cache.block_keys))
                } else {
                    // queries before the new ones are not needed: zeros stand in for them
                    let l = k.dims()[2];
                    let earlier = Tensor::zeros([b, h, l - lq, hd], &q.device());
                    self.attend_all(Tensor::cat(vec![earlier, q], 2), k, v, lq, causal)
                }
            }
        };
        AttentionOutput { context: self.out.forward(context), weights: None, aux_losses: Vec::new() }
    }

    /// All positions (q scaled by 1/√d_h); the outputs of the last `lq`, heads merged, `[b, lq, h · hd]`.
    fn attend_all(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, lq: usize, causal: bool) -> Tensor<3> {
        let [b, h, l, hd] = q.dims();
        let device = q.device();
        let m = self.block;
        let n = l.div_ceil(m);
        let pad = |t: Tensor<4>| {
            if n * m == l { t } else { Tensor::cat(vec![t, Tensor::zeros([b, h, n * m - l, hd], &device)], 2) }
        };
        let (q, k, v) = (pad(q), pad(k), pad(v));
        let flat = |t: Tensor<4>| t.reshape([b, h, n, m * hd]);
        // the block means from the projection's own layout `[b, L, h · hd]` (k is its head view),
        // where a block of positions is a view: no copy of the keys (but for a padded sequence,
        // copied by its padding)
        let means = k.clone().swap_dims(1, 2).reshape([b, n, m, h * hd]).mean_dim(2);
        let s = self.sort_of_means(means.reshape([b, n, h, hd]).swap_dims(1, 2), causal);
        if (self.sortcut.is_none() || causal) && crate::engine::heads::kernel_takes(&self.dropout, &q) {
            let blocks = SinkhornBlocks { block: m, len: l, causal };
            if let Some(out) = sinkhorn_block_attention(q.clone(), k.clone(), v.clone(), s.clone(), blocks) {
                return out.narrow(1, l - lq, lq);
            }
        }
        let sorted = |t: Tensor<4>| s.clone().matmul(flat(t)).reshape([b * h, n, m, hd]);
        let (ks, vs) = (sorted(k.clone()), sorted(v.clone()));
        let blocks = |t: Tensor<4>| t.reshape([b * h, n, m, hd]);
        let (qb, kb, vb) = (blocks(q), blocks(k), blocks(v));

        let out = match self.sortcut {
            Some(cut) if !causal => {
                // every query against the first `cut` sorted blocks
                let cut = cut.min(n);
                let keys = ks.narrow(1, 0, cut).reshape([b * h, 1, cut * m, hd]);
                let values = vs.narrow(1, 0, cut).reshape([b * h, 1, cut * m, hd]);
                let q = qb.reshape([b * h, 1, n * m, hd]);
                let scores = q.matmul(keys.swap_dims(2, 3));
                self.dropout.forward(softmax(scores, 3)).matmul(values)
            }
            _ => {
                let keys = Tensor::cat(vec![ks, kb], 2);
                let values = Tensor::cat(vec![vs, vb], 2);
                let scores = qb.matmul(keys.swap_dims(2, 3));
                let hidden = self.hidden(n, m, l, causal, &device).unsqueeze_dim::<4>(0).expand([b * h, n, m, 2 * m]);
                let probs = softmax(scores.mask_fill(hidden, MASKED), 3);
                self.dropout.forward(probs).matmul(values)
            }
        };
        concat_heads(out.reshape([b, h, n * m, hd]).narrow(2, l - lq, lq))
    }

    /// Which of [sorted block; own block] each query of each block may not see, `[n, m, 2m]`:
    /// padding keys; causally later keys of the own block and the first block's (empty) sorted block.
    fn hidden(&self, n: usize, m: usize, l: usize, causal: bool, device: &Device) -> Tensor<3, Bool> {
        let mut hidden = Vec::with_capacity(n * m * 2 * m);
        for i in 0..n {
            for t in 0..m {
                for j in 0..2 * m {
                    let own = j >= m;
                    let key = i * m + j - if own { m } else { 0 };
                    hidden.push(if own { key >= l || (causal && j - m > t) } else { causal && i == 0 });
                }
            }
        }
        Tensor::from_data(TensorData::new(hidden, [n, m, 2 * m]), device)
    }

    /// The newest position (causal) against its block so far and its block's sorted block, mixed
    /// from the cached keys of the blocks before it once per block (`sorted` keeps it for the
    /// block's later tokens): O(b·d) per token, O(L·d) once per block.
    fn decode_one(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        sorted: &mut Option<(usize, Tensor<4>, Tensor<4>)>,
    ) -> Tensor<4> {
        let [b, h, l, hd] = k.dims();
        let m = self.block;
        let (i, t) = ((l - 1) / m, (l - 1) % m);
        let mut keys = vec![k.clone().narrow(2, i * m, t + 1)];
        let mut values = vec![v.clone().narrow(2, i * m, t + 1)];
        if i > 0 {
            if sorted.as_ref().is_none_or(|(block, _, _)| *block != i) {
                let flat = |x: Tensor<4>| x.narrow(2, 0, i * m).reshape([b, h, i, m * hd]);
                let (kf, vf) = (flat(k), flat(v));
                // row i of a sort over blocks 0..=i: only the blocks before it count
                let own = Tensor::zeros([b, h, 1, m * hd], &q.device());
                let s = self.sort_matrix(Tensor::cat(vec![kf.clone(), own], 2), true).narrow(2, i, 1).narrow(3, 0, i);
                let mix = |x: Tensor<4>| s.clone().matmul(x).reshape([b, h, m, hd]);
                *sorted = Some((i, mix(kf), mix(vf)));
            }
            let (_, ks, vs) = sorted.as_ref().expect("set above");
            keys.insert(0, ks.clone());
            values.insert(0, vs.clone());
        }
        let (keys, values) = (Tensor::cat(keys, 2), Tensor::cat(values, 2));
        let scores = q.matmul(keys.swap_dims(2, 3));
        let z = log_sum_exp(scores.clone());
        (scores - z).exp().matmul(values)
    }
}

impl AttentionMechanism for SinkhornAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        SinkhornAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }
}
