//! ProbSparse self-attention (Zhou et al. 2021, "Informer: Beyond Efficient Transformer for Long
//! Sequence Time-Series Forecasting"), the `prob-sparse` kind: query prototypes chosen by an
//! explicit sparsity measurement (map of transformers §3.3.1). A query whose attention is close to
//! uniform is "lazy" and gets the uniform distribution's output, the mean of the values; only the
//! few most peaked ("active") queries get softmax attention. The measure approximates the KL
//! divergence between the query's attention and the uniform distribution,
//!
//! M(q_i, K) = max_{j ∈ S_i} q_i·k_j/√d − (1/|S_i|) Σ_{j ∈ S_i} q_i·k_j/√d,
//!
//! over U = ⌈c·ln L_K⌉ sampled keys S_i (c = `factor`), and the top u = ⌈c·ln L_Q⌉ queries by M are
//! active:
//!
//! o_i = softmax(q_i Kᵀ/√d) V  (i active),   o_i = (1/L_K) Σ_j v_j  (i lazy).
//!
//! Both counts are clamped to [1, n] (n the number of keys, resp. queries): with c large enough
//! that U ≥ L_K every key is sampled and with u = L_Q every query is active — full attention.
//!
//! Choices:
//! - Sampling: S_i is drawn without replacement (Floyd's algorithm) from a ChaCha stream seeded by
//!   (`seed`, layer, slot), as [`crate::content::lsh`] draws its rotations: fixed per layer, reproducible
//!   across calls (Informer draws new samples with replacement at every forward, shared by all
//!   queries' batch rows and heads; ours are shared by batch rows and heads too). Without
//!   replacement, U ≥ L_K means every key exactly once (the exact measure).
//! - Bidirectional: the slot is the query's index i, positions are drawn from [0, L_K); the top-u
//!   (ties: the earlier query) are active; lazy queries get the mean of the (non-padding) values.
//! - Causal (our choice, strictly causal): Informer's masked ProbSparse attention ranks ALL
//!   queries and samples keys from all positions, so later tokens decide which earlier queries are
//!   active — it leaks the future. Here query i at position t (keys 0..=t visible, n = t + 1 of
//!   them) draws its U_t = clamp(⌈c·ln n⌉, 1, n) sampled keys from [0, t] with the stream of slot t:
//!   fixed by the seed and t alone, independent of L. It is active iff M_i is among the top
//!   u_i = clamp(⌈c·ln(i + 1)⌉, 1, i + 1) of M_0..M_i, i.e. #{j < i : M_j ≥ M_i} < u_i (a prefix
//!   ranking; ties go to the earlier query): it depends on the past only. Active queries get
//!   causal softmax attention over keys ≤ t, lazy ones the cumulative mean of v_0..v_t.
//!   With keys in front of the queries and no state (a memory), the ranking runs over the queries
//!   of the call.
//! - Padding keys are hidden from the softmax, left out of the means and out of the measure
//!   (a query whose sampled keys are all padding has M = −10⁹ and ranks last).
//! - Cost: U·d per query for the measure (on the host: only the ranking reads it), [u, L_K]
//!   scores for the gathered active query rows, O(L·d) for the (cumulative) means, plus the host
//!   ranking: a sort (bidirectional) or a Fenwick tree (causal), O(L log L). Bidirectionally
//!   u = ⌈c·ln L⌉ rows, never L × L. Causally the prefix ranking bounds no total: Σ_t u_t/(t + 1)
//!   ≈ c·(ln L)²/2 rows are active when the measures are exchangeable (291 of 16,384 in the
//!   benchmark's layer), but measures that rise along the sequence (U_t grows with t, and the max
//!   over more samples is larger) can activate more, up to every row. On flex the active rows run
//!   on the block-sparse kernel, which keeps nothing per (row, key) pair for the backward.
//! - Decoding ([`ProbSparseState`]): keys and values in a [`KvCache`], every past measure per batch
//!   row and head, the running sum of the values. A new token costs O(U·d + t) (measure, ranking
//!   against the past measures, running mean) when lazy in every head, O(t·d) when active in some
//!   head. The decoding steps take no padding mask (generation has none).
//! - No position scheme acts inside (there is no full score matrix to bias, and the measure is
//!   taken on the projected q/k); absolute encodings apply.

use std::sync::Arc;

use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;
use burn::tensor::activation::softmax;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use variorum_core::{Capabilities, ConfigError, error::check};
use variorum_kernels::block_sparse::{SparseLayout, block_sparse_attention};
use variorum_kernels::normalisers::RowNormaliser;

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::normaliser::MASKED_SCORE;
use crate::engine::projections;
use crate::engine::projections::HeadProjections;
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "prob-sparse"`.
    pub struct ProbSparseConfig [n_heads, head_dim, bias, dropout] {
        /// c: U = ⌈c·ln L_K⌉ sampled keys per query, u = ⌈c·ln L_Q⌉ active queries. Default 5 (the
        /// paper's).
        pub factor: f64 = 5.0,
        /// Seed of the sampled key positions (mixed with the layer index). Default 0.
        pub seed: u64 = 0,
        /// The layer this config was specialised for ([`AttentionKind::for_layer`]).
        #[serde(skip)]
        pub layer: usize = 0,
    }
}

impl ProbSparseConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output projection.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> ProbSparseAttention {
        let h = self.head_shape(d_model);
        ProbSparseAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            factor: self.factor,
            seed: self.seed,
            layer: self.layer,
            scale: 1.0 / (h.head_dim as f64).sqrt(),
        }
    }
}

impl AttentionKind for ProbSparseConfig {
    type Module = ProbSparseAttention;
    const SUMMARY: &'static str = "Informer ProbSparse attention: sparsity measure max − mean over ⌈c·ln L⌉ seeded sampled keys, the top ⌈c·ln L⌉ queries attend, lazy ones get the mean of V; causal: prefix ranking, cumulative mean (strictly causal)";
    const PAPER: &'static str =
        "Zhou et al. 2021, Informer: Beyond Efficient Transformer for Long Sequence Time-Series Forecasting";
    const CAPS: Capabilities = Capabilities { hides_padding: false, ..caps::NO_SCORES };

    fn for_layer(&self, i: usize) -> Self {
        Self { layer: i, ..self.clone() }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        check(self.factor.is_finite() && self.factor > 0.0, || {
            format!("model.attention.factor = {} must be a positive number (U = ⌈c·ln L⌉)", self.factor)
        })?;
        crate::kind::check_dropout(self.dropout)
    }

    head_settings_hooks!();

    /// Multiply–adds per token over a context of `len_k`: projections, U sampled scores, the
    /// active share u/L of a full row (u·L_K scores and value rows spread over L_K queries), the mean.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd) = (d_model as u64, (h.n_heads * h.head_dim) as u64);
        // U sampled scores, u·L_K active scores and value rows over L_K queries, the mean
        let u = top_count(self.factor, len_k) as u64;
        2 * (4 * d * hd) + 2 * hd * (3 * u + 1)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> ProbSparseAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    /// Few active queries at the harness's lengths (u = ⌈ln(t + 1)⌉ by prefix rank), causal and
    /// under the masked objective.
    fn test_variants() -> Vec<TestVariant<Self>> {
        let cfg = Self { factor: 1.0, ..Default::default() };
        vec![TestVariant::new("causal", cfg.clone()), TestVariant::new("masked lm", cfg).masked()]
    }
}

/// clamp(⌈c·ln n⌉, 1, n) (0 for n = 0): the number of sampled keys among n, or of active queries
/// among n.
pub fn top_count(factor: f64, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let c = (factor * (n as f64).ln()).ceil();
    if c.is_finite() && c < n as f64 { (c as usize).max(1) } else { n }
}

/// Decoding state: the cached keys and values, the measures M of every past position per batch
/// row × head (`measures[row][position]`, row = batch · heads + head), and Σ_j w_j v_j
/// `[b, h, 1, d_h]` with Σ_j w_j `[b, 1, 1, 1]` (w_j = 0 for a padding key of the prompt).
#[derive(Debug, Clone, Default)]
pub struct ProbSparseState {
    /// The keys and values of every past position.
    pub cache: KvCache,
    /// M of every past position, `measures[batch · heads + head][position]`.
    pub measures: Vec<Vec<f32>>,
    /// Σ_j w_j v_j `[b, h, 1, d_h]` and Σ_j w_j `[b, 1, 1, 1]`: the lazy queries' running mean.
    pub value_sum: Option<(Tensor<4>, Tensor<4>)>,
}

/// A ProbSparse attention layer ([`ProbSparseConfig`]): the most peaked queries attend, the
/// lazy ones get the mean of the values.
#[derive(Module, Debug)]
pub struct ProbSparseAttention {
    /// The q/k/v and output projections.
    pub proj: HeadProjections,
    /// Dropout on the active queries' attention weights.
    pub dropout: Dropout,
    /// c: U = ⌈c·ln L_K⌉ sampled keys per query, u = ⌈c·ln L_Q⌉ active queries.
    pub factor: f64,
    /// Seed of the sampled key positions, mixed with `layer`.
    pub seed: u64,
    /// The layer's index, mixed into the samples' seed so each layer draws its own.
    pub layer: usize,
    /// 1/√d_h, the scores' scale (in the measure too).
    pub scale: f64,
}

impl ProbSparseAttention {
    /// `count` distinct positions from [0, n), drawn by Floyd's algorithm from the ChaCha stream of
    /// (`seed`, layer, `slot`), in drawing order.
    pub fn sampled_keys(&self, slot: usize, n: usize, count: usize) -> Vec<usize> {
        let stream = self.seed
            ^ (self.layer as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (slot as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
        let mut rng = ChaCha8Rng::seed_from_u64(stream);
        let count = count.min(n);
        let mut picked: Vec<usize> = Vec::with_capacity(count);
        for j in n - count..n {
            let t = rng.random_range(0..=j);
            picked.push(if picked.contains(&t) { j } else { t });
        }
        picked
    }

    /// The sampled keys of the causal query at position `t`: U_t positions from [0, t].
    pub fn causal_keys(&self, t: usize) -> Vec<usize> {
        self.sampled_keys(t, t + 1, top_count(self.factor, t + 1))
    }

    /// The sampled keys of bidirectional query `i` among `len_k` keys.
    pub fn bidirectional_keys(&self, i: usize, len_k: usize) -> Vec<usize> {
        self.sampled_keys(i, len_k, top_count(self.factor, len_k))
    }

    /// Active queries attend, lazy ones get the (cumulative) mean of V, `[b, len_q, d_model]`.
    /// Causal self-attention continues `state` and leaves it updated.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut ProbSparseState>) -> AttentionOutput {
        let mask = input.mask;
        let causal = mask.causal;
        let cross = input.key_value.is_some();
        let (q, k, v) = self.proj.split(input.query, input.key_value);
        let context = match state {
            Some(st) if causal && !cross => {
                if st.cache.is_empty() && mask.q_start == 0 {
                    let (out, active) = self.attend(q, k.clone(), v.clone(), causal, 0, mask.padding.as_ref());
                    self.start_state(st, k, v, active.measures, mask.padding.as_ref());
                    out
                } else {
                    self.step_by_step(q, k, v, st)
                }
            }
            _ => {
                // query i at position q_start + i sees keys k_start + j ≤ q_start + i
                let offset = mask.q_start as i64 - mask.k_start as i64;
                self.attend(q, k, v, causal, offset, mask.padding.as_ref()).0
            }
        };
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }

    /// The state after a fresh causal sequence.
    fn start_state(
        &self,
        st: &mut ProbSparseState,
        k: Tensor<4>,
        v: Tensor<4>,
        measures: Vec<Vec<f32>>,
        padding: Option<&Tensor<2, Bool>>,
    ) {
        let [b, _, l, _] = v.dims();
        let w = projections::unpadded(padding, b, l, &v.device());
        st.value_sum = Some(((v.clone() * w.clone()).sum_dim(2), w.sum_dim(2)));
        st.measures = measures;
        st.cache.append(k, v);
    }

    /// ProbSparse attention of heads `q: [b, h, L_Q, d_h]` over `k, v: [b, h, L_K, d_h]`, causal
    /// with query i at key position i + `offset`. Returns the outputs and the selection.
    pub fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        causal: bool,
        offset: i64,
        padding: Option<&Tensor<2, Bool>>,
    ) -> (Tensor<4>, Selection) {
        let [b, h, lq, dh] = q.dims();
        let lk = k.dims()[2];
        let device = q.device();
        if lq == 0 || lk == 0 || b * h == 0 {
            let empty = Selection { measures: vec![Vec::new(); b * h], active: vec![Vec::new(); b * h] };
            return (Tensor::zeros([b, h, lq, dh], &device), empty);
        }
        // keys visible to query i: the first n_i (all of them when bidirectional)
        let visible: Vec<usize> =
            (0..lq).map(|i| if causal { (i as i64 + offset + 1).clamp(0, lk as i64) as usize } else { lk }).collect();
        let samples: Vec<Vec<usize>> = (0..lq)
            .map(|i| {
                let n = visible[i];
                if causal {
                    // slot: the query's own key position, so the draw depends on it alone
                    self.sampled_keys(n.saturating_sub(1), n, top_count(self.factor, n))
                } else {
                    self.bidirectional_keys(i, lk)
                }
            })
            .collect();
        let rows = self.measures(&q, &k, &samples, padding);
        let active: Vec<Vec<usize>> = rows
            .iter()
            .map(|m| if causal { prefix_active(m, self.factor) } else { top_active(m, top_count(self.factor, lq)) })
            .collect();

        // lazy outputs: the (cumulative) mean of the visible values
        let lazy = if causal {
            let last: Vec<i64> = visible.iter().map(|&n| n.saturating_sub(1) as i64).collect();
            let last = Tensor::<1, Int>::from_data(TensorData::new(last, [lq]), &device);
            // row i takes the sum over the keys before `visible[i]`: the queries are the keys'
            // positions in order (the training path), or a selection of them
            let at_last = |x: Tensor<4>| if lq == lk && offset == 0 { x } else { x.select(2, last.clone()) };
            match padding {
                None => {
                    // 1/n_i, and 0 for a query that sees no key
                    let inverse: Vec<f32> = visible.iter().map(|&n| if n > 0 { 1.0 / n as f32 } else { 0.0 }).collect();
                    let inverse = Tensor::<4>::from_data(TensorData::new(inverse, [1, 1, lq, 1]), &device);
                    at_last(v.clone().cumsum(2)) * inverse
                }
                Some(_) => {
                    let w = projections::unpadded(padding, b, lk, &device); // [b, 1, lk, 1]
                    let any: Vec<f32> = visible.iter().map(|&n| if n > 0 { 1.0 } else { 0.0 }).collect();
                    let any = Tensor::<4>::from_data(TensorData::new(any, [1, 1, lq, 1]), &device);
                    at_last((v.clone() * w.clone()).cumsum(2)) / at_last(w.cumsum(2)).clamp_min(1.0) * any
                }
            }
        } else {
            let w = projections::unpadded(padding, b, lk, &device);
            let mean = (v.clone() * w.clone()).sum_dim(2) / w.sum_dim(2).clamp_min(1.0);
            mean.expand([b, h, lq, dh])
        };

        // active rows, gathered: [b, h, n_sel] (rows with fewer padded by query 0, with no effect)
        let n_sel = active.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut index = Vec::with_capacity(b * h * n_sel);
        let mut keep = Vec::with_capacity(b * h * n_sel);
        let mut limit = Vec::with_capacity(b * h * n_sel);
        for row in &active {
            for s in 0..n_sel {
                let i = row.get(s).copied();
                index.push(i.unwrap_or(0) as i64);
                // a query that sees no key keeps its lazy output (0) on both paths
                keep.push(if i.is_some_and(|i| visible[i] > 0) { 1.0f32 } else { 0.0 });
                limit.push(visible[i.unwrap_or(0)] as i64);
            }
        }
        let index = Tensor::<3, Int>::from_data(TensorData::new(index, [b, h, n_sel]), &device).unsqueeze_dim::<4>(3);
        let keep = Tensor::<4>::from_data(TensorData::new(keep, [b, h, n_sel, 1]), &device);
        let rows_index = index.clone().expand([b, h, n_sel, dh]);
        let q_sel = q.gather(2, rows_index.clone());
        let attended = match self.active_on_kernel(&q_sel, (&k, &v), &active, &visible, padding) {
            Some(attended) => attended,
            None => self.active_composed(q_sel, k, v, limit, causal, padding),
        };
        let delta = (attended - lazy.clone().gather(2, rows_index.clone())) * keep;
        let out = lazy.scatter(2, rows_index, delta, IndexingUpdateOp::Add);
        (out, Selection { measures: rows, active })
    }

    /// Softmax attention of the gathered active queries `q_sel: [b, h, n_sel, d_h]` over their
    /// visible keys (the first `limit[row]` of `k`, `v` when causal), by Burn's ops: the
    /// `[b, h, n_sel, L_K]` scores.
    fn active_composed(
        &self,
        q_sel: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        limit: Vec<i64>,
        causal: bool,
        padding: Option<&Tensor<2, Bool>>,
    ) -> Tensor<4> {
        let [b, h, n_sel, _] = q_sel.dims();
        let lk = k.dims()[2];
        let device = q_sel.device();
        let mut scores = q_sel.matmul(k.swap_dims(2, 3)).mul_scalar(self.scale); // [b, h, n_sel, lk]
        if causal {
            let limit = Tensor::<3, Int>::from_data(TensorData::new(limit, [b, h, n_sel]), &device)
                .unsqueeze_dim::<4>(3)
                .expand([b, h, n_sel, lk]);
            let key = Tensor::<1, Int>::arange(0..lk as i64, &device).reshape([1, 1, 1, lk]).expand([b, h, n_sel, lk]);
            scores = scores.mask_fill(key.greater_equal(limit), MASKED_SCORE);
        }
        if let Some(p) = padding {
            scores = scores.mask_fill(p.clone().reshape([b, 1, 1, lk]).expand([b, h, n_sel, lk]), MASKED_SCORE);
        }
        self.dropout.forward(softmax(scores, 3)).matmul(v)
    }

    /// The active queries' attention on the block-sparse kernel, where it applies (flex, no
    /// dropout, no padding, no more active rows than keys): each batch row × head is one pattern
    /// of the layout, whose row s (the s-th active query i, or none) sees keys 0 … `visible[i]` − 1.
    /// Only the visible key blocks are scored and nothing per pair is kept for the backward,
    /// where the composed path keeps `[b, h, n_sel, L_K]` scores, masks and probabilities
    /// (causally n_sel grows with L: 291 rows per head at L = 16k in the benchmark's layer, 76 MiB
    /// per such tensor; the layer's peak fell from 634 to 189 MiB). `[b, h, n_sel, d_h]`.
    fn active_on_kernel(
        &self,
        q_sel: &Tensor<4>,
        (k, v): (&Tensor<4>, &Tensor<4>),
        active: &[Vec<usize>],
        visible: &[usize],
        padding: Option<&Tensor<2, Bool>>,
    ) -> Option<Tensor<4>> {
        let [b, h, n_sel, dh] = q_sel.dims();
        let lk = k.dims()[2];
        if !crate::engine::heads::kernel_takes(&self.dropout, q_sel) || padding.is_some() || n_sel > lk {
            return None;
        }
        let block = 64;
        let sees = |g: usize, s: usize| active[g].get(s).map_or(0, |&i| visible[i]);
        // a block scores the keys before its widest row's limit
        let runs = |g: usize, t: usize| {
            vec![0..(t * block..((t + 1) * block).min(n_sel)).map(|s| sees(g, s)).max().unwrap_or(0)]
        };
        let first = lk - n_sel; // the layout's query row s stands at position first + s
        let seen = |g: usize, p: usize, out: &mut Vec<std::ops::Range<usize>>| out.push(0..sees(g, p - first));
        let layout = Arc::new(SparseLayout::new(n_sel, lk, block, b * h, runs, seen));
        let heads = |x: &Tensor<4>| x.clone().reshape([1, b * h, x.dims()[2], dh]);
        let q = heads(q_sel).mul_scalar(self.scale);
        let out = block_sparse_attention(q, heads(k), heads(v), None, layout, RowNormaliser::Softmax)?;
        Some(out.reshape([n_sel, b * h, dh]).swap_dims(0, 1).reshape([b, h, n_sel, dh]))
    }

    /// M of every query over its sampled keys, per batch row × head (`[row][query]`). Only the
    /// host ranking reads it, so it is computed on the host, off the autodiff graph, from q and k
    /// read once: gathering each query's U sampled keys as a tensor (`[b, h, L, U, d_h]`) took U
    /// times the keys' memory (≈ 0.8 GiB at L = 16k; 200 MiB in chunks of 4,096 queries).
    fn measures(
        &self,
        q: &Tensor<4>,
        k: &Tensor<4>,
        samples: &[Vec<usize>],
        padding: Option<&Tensor<2, Bool>>,
    ) -> Vec<Vec<f32>> {
        use rayon::prelude::*;
        let [b, h, lq, dh] = q.dims();
        let lk = k.dims()[2];
        let (q, k) = (host(q.clone()), host(k.clone()));
        let hidden: Option<Vec<bool>> =
            padding.map(|p| p.clone().into_data().convert::<bool>().try_to_vec::<bool>().expect("a bool padding mask"));
        let scale = self.scale as f32;
        (0..b * h)
            .into_par_iter()
            .map(|row| {
                let (q, k) = (&q[row * lq * dh..][..lq * dh], &k[row * lk * dh..][..lk * dh]);
                let padded = |j: usize| hidden.as_ref().is_some_and(|p| p[(row / h) * lk + j]);
                let measure_of = |(i, keys): (usize, &Vec<usize>)| {
                    let keys = keys.iter().filter(|&&j| !padded(j)).map(|&j| &k[j * dh..][..dh]);
                    measure(&q[i * dh..][..dh], keys, scale)
                };
                samples.iter().enumerate().map(measure_of).collect()
            })
            .collect()
    }

    /// Causal decoding continuing `st`, one new position at a time.
    fn step_by_step(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, st: &mut ProbSparseState) -> Tensor<4> {
        let [b, h, l, dh] = q.dims();
        let device = q.device();
        if st.measures.len() != b * h {
            st.measures = vec![Vec::new(); b * h];
        }
        let mut outs = Vec::with_capacity(l);
        for s in 0..l {
            let (qt, kt, vt) = (q.clone().narrow(2, s, 1), k.clone().narrow(2, s, 1), v.clone().narrow(2, s, 1));
            let (keys, values) = st.cache.append(kt, vt.clone());
            let n = st.cache.len();
            let (sum, count) = match st.value_sum.take() {
                Some((sum, count)) => (sum + vt, count.add_scalar(1.0)),
                None => (vt, Tensor::ones([b, 1, 1, 1], &device)),
            };
            let lazy = sum.clone() / count.clone().clamp_min(1.0);
            st.value_sum = Some((sum, count));
            // the measure over the sampled keys, gathered from the cache
            let picks = self.causal_keys(n - 1);
            let (kb, _, at) = st.cache.buffers().expect("a token was appended");
            let index: Vec<i64> = picks.iter().map(|&p| (p + at) as i64).collect();
            let m = index.len();
            let index = Tensor::<1, Int>::from_data(TensorData::new(index, [m]), &device);
            let (sampled, qh) = (host(kb.select(2, index)), host(qt.clone()));
            let measures: Vec<f32> = (0..b * h)
                .map(|r| {
                    measure(&qh[r * dh..][..dh], sampled[r * m * dh..][..m * dh].chunks_exact(dh), self.scale as f32)
                })
                .collect();
            let mut active = Vec::with_capacity(b * h);
            for (row, &mt) in st.measures.iter_mut().zip(&measures) {
                let above = row.iter().filter(|x| x.total_cmp(&mt) != std::cmp::Ordering::Less).count();
                active.push(above < top_count(self.factor, row.len() + 1));
                row.push(mt);
            }
            let out = if active.iter().any(|&a| a) {
                let probs = softmax(qt.matmul(keys.swap_dims(2, 3)).mul_scalar(self.scale), 3);
                let attended = self.dropout.forward(probs).matmul(values);
                let flags: Vec<f32> = active.iter().map(|&a| if a { 1.0 } else { 0.0 }).collect();
                let flags = Tensor::<4>::from_data(TensorData::new(flags, [b, h, 1, 1]), &device);
                lazy.clone() + (attended - lazy) * flags
            } else {
                lazy
            };
            outs.push(out);
        }
        Tensor::cat(outs, 2)
    }
}

impl AttentionMechanism for ProbSparseAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        ProbSparseAttention::forward(self, input, state.map(|s| s.get_or_default::<ProbSparseState>()))
    }
}

/// What [`ProbSparseAttention::attend`] chose, per batch row × head (row = batch · heads + head):
/// every query's measure and the active queries in increasing order.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    pub measures: Vec<Vec<f32>>,
    pub active: Vec<Vec<usize>>,
}

/// M = max − mean of `scale`·q·k over `keys` (−10⁹, ranking last, where there are none): the
/// parallel forward and decoding both take it from here, so that a decoded measure ranks
/// against the forward's bit for bit.
fn measure<'a>(q: &[f32], keys: impl Iterator<Item = &'a [f32]>, scale: f32) -> f32 {
    let (mut max, mut sum, mut n) = (f32::NEG_INFINITY, 0.0f32, 0usize);
    for key in keys {
        let s = variorum_kernels::fast_math::dot(q, key) * scale;
        max = max.max(s);
        sum += s;
        n += 1;
    }
    if n == 0 { MASKED_SCORE } else { max - sum / n as f32 }
}

/// A tensor's values on the host, in row-major order.
fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().expect("f32 values")
}

/// The `u` queries of largest measure (ties: the earlier), in increasing order.
pub fn top_active(measures: &[f32], u: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..measures.len()).collect();
    order.sort_by(|&a, &b| measures[b].total_cmp(&measures[a]).then(a.cmp(&b)));
    order.truncate(u);
    order.sort_unstable();
    order
}

/// The causal prefix ranking: query i is active iff #{j < i : M_j ≥ M_i} < clamp(⌈c·ln(i + 1)⌉, 1,
/// i + 1). A Fenwick tree over the ranks of the measures (descending, ties by position): O(L log L).
pub fn prefix_active(measures: &[f32], factor: f64) -> Vec<usize> {
    let n = measures.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| measures[b].total_cmp(&measures[a]).then(a.cmp(&b)));
    let mut rank = vec![0; n];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r;
    }
    // j < i ranks before i exactly when M_j > M_i, or M_j = M_i (j is earlier)
    let mut tree = vec![0usize; n + 1];
    let mut active = Vec::new();
    for i in 0..n {
        let (mut before, mut x) = (0, rank[i]);
        while x > 0 {
            before += tree[x];
            x &= x - 1;
        }
        if before < top_count(factor, i + 1) {
            active.push(i);
        }
        let mut x = rank[i] + 1;
        while x <= n {
            tree[x] += 1;
            x += x & x.wrapping_neg();
        }
    }
    active
}
