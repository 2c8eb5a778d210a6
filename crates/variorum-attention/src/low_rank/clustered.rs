//! Clustered attention (Vyas, Katharopoulos, Fleuret 2020, "Fast Transformers with Clustered
//! Attention"), the `clustered` kind: attention with query prototypes (map of transformers
//! §3.3.1). Per head, the L queries are grouped into C clusters by k-means, attention is computed
//! once per centroid and copied to every member of the cluster:
//!
//! q^c_j = (1/|S_j|) Σ_{i ∈ S_j} q_i,   A^c_j = softmax(q^c_j Kᵀ/√d),   o_i = A^c_{c(i)} V.
//!
//! Cost O(C·L·d) for the attention plus O(iterations·C·L·d) for the clustering; no L × L matrix.
//!
//! Choices:
//! - Clustering: plain Lloyd iterations (`iterations` of them, at least 1) with the Euclidean
//!   distance on the projected queries of each head (the paper first hashes the queries to B-bit
//!   codes and runs k-means in Hamming space, a speed device we do not need). Deterministic
//!   initialisation: the C queries at positions ⌊j·L/C⌋, j = 0..C − 1, evenly spaced along the
//!   sequence, so C = L starts from every query as its own centroid and recovers full attention
//!   exactly. C is capped at L. A cluster left empty keeps its previous centroid. Ties in the
//!   assignment go to the lower cluster index.
//! - Gradients: the assignment is computed on detached queries (an argmin has no gradient), but
//!   the centroid used as the cluster's query is the mean of the non-detached member queries,
//!   recomputed from the final assignment, as in the paper: gradients reach the queries through
//!   their centroids. After ≥ 1 iteration the centroids are exactly their members' means.
//! - Padding keys are hidden from the softmax; with self-attention, padded queries are left out of
//!   the centroid means (they are still assigned, and get a cluster's output).
//! - `top_k` (the paper's "improved clustered attention"): for each cluster the k keys with the
//!   largest A^c_j are rescored exactly for each member query, keeping the cluster's mass on them,
//!   m̂_j = Σ_{l ∈ T_j} A^c_jl:
//!   o_i = m̂_j softmax_{l ∈ T_j}(q_i k_l/√d) V_{T_j} + Σ_{l ∉ T_j} A^c_jl v_l. Extra cost O(L·k·d).
//!   With k = L_K it is full attention for any C.
//! - Bidirectional only: a centroid's attention row would need each member's own causal mask, and
//!   cluster membership (hence the centroid) depends on later queries, so no strictly causal form
//!   exists; the forward ignores `mask.causal` and decoders refuse the kind (capabilities). Cross-
//!   attention works (the queries are clustered, keys come from the source).
//! - No position scheme acts inside (no score matrix per query); absolute encodings apply.

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
    /// `model.attention` with `kind = "clustered"`.
    pub struct ClusteredConfig [n_heads, head_dim, bias, dropout] {
        /// C, query clusters per head (capped at the sequence length). Default 32.
        pub clusters: usize = 32,
        /// Lloyd iterations of the k-means. Default 10 (the paper's).
        pub iterations: usize = 10,
        /// k keys per cluster rescored exactly for each query ("improved clustered"); `None` = plain
        /// clustered attention. Default `None`.
        pub top_k: Option<usize> = None,
    }
}

impl ClusteredConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output projection.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> ClusteredAttention {
        let h = self.head_shape(d_model);
        ClusteredAttention {
            proj: HeadProjections::new(d_model, h.n_heads, h.head_dim, self.bias, init_std, out_std, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            clusters: self.clusters,
            iterations: self.iterations,
            top_k: self.top_k,
            scale: 1.0 / (h.head_dim as f64).sqrt(),
        }
    }
}

impl AttentionKind for ClusteredConfig {
    type Module = ClusteredAttention;
    const SUMMARY: &'static str = "clustered attention: per head, queries grouped into C clusters by k-means (fixed Lloyd iterations), softmax attention once per centroid copied to its members; optional exact top-k rescoring; O(C·L·d); bidirectional only";
    const PAPER: &'static str = "Vyas, Katharopoulos, Fleuret 2020, Fast Transformers with Clustered Attention";
    const CAPS: Capabilities = caps::BIDIRECTIONAL_ONLY;

    fn why_not_causal(&self) -> &'static str {
        "a cluster's centroid, and so every member's attention, depends on later queries"
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        projections::validate_heads(self.n_heads, self.head_dim, 1, d_model)?;
        check(self.clusters >= 1, || "model.attention.clusters must be at least 1".into())?;
        check(self.iterations >= 1, || {
            "model.attention.iterations must be at least 1 (the centroids are their members' means)".into()
        })?;
        check(self.top_k != Some(0), || "model.attention.top_k must be at least 1 (or absent)".into())?;
        crate::kind::check_dropout(self.dropout)
    }

    head_settings_hooks!();

    /// Multiply–adds per token over a context of `len_k` (L_Q = L_K): projections, the distances
    /// to C centroids per iteration, C·L_K centroid scores and value rows spread over L_K queries,
    /// the broadcast back, k exact scores and value rows.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let h = self.head_shape(d_model);
        let (d, hd) = (d_model as u64, (h.n_heads * h.head_dim) as u64);
        let c = self.clusters.min(len_k.max(1)) as u64;
        let k = self.top_k.map_or(0, |k| k.min(len_k)) as u64;
        2 * (4 * d * hd) + 2 * hd * (c * (self.iterations as u64 + 3) + 2 * k)
    }

    fn build(&self, init: &LayerInit, device: &Device) -> ClusteredAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("", Self { clusters: 4, iterations: 3, ..Default::default() }).masked(),
            TestVariant::new("top-k", Self { clusters: 3, top_k: Some(4), ..Default::default() }).masked(),
        ]
    }
}

/// A clustered attention layer ([`ClusteredConfig`]): softmax attention once per query
/// centroid, copied to the cluster's members.
#[derive(Module, Debug)]
pub struct ClusteredAttention {
    /// The q/k/v and output projections.
    pub proj: HeadProjections,
    /// Dropout on the attention weights (the centroids' and the exact top-k ones).
    pub dropout: Dropout,
    /// C, query clusters per head (capped at the sequence length).
    pub clusters: usize,
    /// Lloyd iterations of the k-means.
    pub iterations: usize,
    /// k keys per cluster rescored exactly for each member query; `None`: plain clustered.
    pub top_k: Option<usize>,
    /// 1/√d_h, the scores' scale.
    pub scale: f64,
}

/// A clustering of the queries of every head.
#[derive(Debug, Clone)]
pub struct Clusters {
    /// Cluster of each query, `[b, h, L]`.
    pub assignment: Tensor<3, Int>,
    /// The same as a one-hot float matrix `[b, h, L, C]`.
    pub one_hot: Tensor<4>,
    /// Centroids of the detached queries after the last iteration, `[b, h, C, d_h]`.
    pub centroids: Tensor<4>,
}

impl ClusteredAttention {
    /// Keeps no state: the kind is bidirectional only (see the module doc).
    pub fn forward(&self, input: AttentionInput, _state: Option<&mut AttentionState>) -> AttentionOutput {
        let cross = input.key_value.is_some();
        let padding = input.mask.padding.clone();
        let (q, k, v) = self.proj.split(input.query, input.key_value);
        let lq = q.dims()[2];
        // padded queries leave the centroids alone (self-attention: queries and keys share positions)
        let query_padding = padding.as_ref().filter(|p| !cross && p.dims()[1] == lq);
        let context = self.attend(q, k, v, padding.as_ref(), query_padding);
        AttentionOutput { context: self.proj.merge(context), weights: None, aux_losses: Vec::new() }
    }

    /// k-means of the queries `[b, h, L, d_h]` (detached), `query_padding: [b, L]` (true = left out
    /// of the means), for `iterations` Lloyd iterations.
    pub fn cluster(&self, q: Tensor<4>, query_padding: Option<&Tensor<2, Bool>>, iterations: usize) -> Clusters {
        let [b, h, l, _] = q.dims();
        let device = q.device();
        let q = q.detach();
        let c = self.clusters.min(l).max(1);
        let start: Vec<i64> = (0..c).map(|j| (j * l / c) as i64).collect();
        let mut centroids = q.clone().select(2, Tensor::<1, Int>::from_data(TensorData::new(start, [c]), &device));
        let weights = projections::unpadded(query_padding, b, l, &device);
        let ids = Tensor::<1, Int>::arange(0..c as i64, &device).reshape([1, 1, 1, c]).expand([b, h, l, c]);
        let mut assignment = Tensor::<3, Int>::zeros([b, h, l], &device);
        let mut one_hot = Tensor::<4>::zeros([b, h, l, c], &device);
        for _ in 0..iterations {
            // argmin_j ‖q − μ_j‖² = argmin_j ‖μ_j‖² − 2 q·μ_j
            let norms = centroids.clone().powf_scalar(2.0).sum_dim(3).swap_dims(2, 3); // [b, h, 1, c]
            let dist = norms - q.clone().matmul(centroids.clone().swap_dims(2, 3)).mul_scalar(2.0);
            let nearest = dist.argmin(3); // [b, h, l, 1]
            one_hot = nearest.clone().expand([b, h, l, c]).equal(ids.clone()).float();
            assignment = nearest.reshape([b, h, l]);
            let members = one_hot.clone() * weights.clone();
            let counts = members.clone().sum_dim(2).swap_dims(2, 3); // [b, h, c, 1]
            let means = members.swap_dims(2, 3).matmul(q.clone()) / counts.clone().clamp_min(1.0);
            let empty = counts.equal_elem(0.0).expand(means.dims());
            centroids = means.mask_where(empty, centroids);
        }
        Clusters { assignment, one_hot, centroids }
    }

    /// Clustered attention of heads `q: [b, h, L_Q, d_h]` over `k, v: [b, h, L_K, d_h]`.
    pub fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        padding: Option<&Tensor<2, Bool>>,
        query_padding: Option<&Tensor<2, Bool>>,
    ) -> Tensor<4> {
        let [b, h, lq, dh] = q.dims();
        let lk = k.dims()[2];
        let device = q.device();
        if lq == 0 || lk == 0 {
            return Tensor::zeros([b, h, lq, dh], &device);
        }
        let clusters = self.cluster(q.clone(), query_padding, self.iterations);
        let c = clusters.one_hot.dims()[3];
        // the cluster's query: the mean of its (non-detached) members
        let members = clusters.one_hot.clone() * projections::unpadded(query_padding, b, lq, &device);
        let counts = members.clone().sum_dim(2).swap_dims(2, 3).clamp_min(1.0); // [b, h, c, 1]
        let centroids = members.swap_dims(2, 3).matmul(q.clone()) / counts;
        let mut scores = centroids.matmul(k.clone().swap_dims(2, 3)).mul_scalar(self.scale); // [b, h, c, lk]
        let key_padding = padding.filter(|p| p.dims()[1] == lk);
        if let Some(p) = key_padding {
            scores = scores.mask_fill(p.clone().reshape([b, 1, 1, lk]).expand([b, h, c, lk]), MASKED_SCORE);
        }
        let probs = self.dropout.forward(softmax(scores, 3));
        let per_cluster = probs.clone().matmul(v.clone()); // [b, h, c, dh]
        let Some(top) = self.top_k.map(|t| t.min(lk)) else {
            return clusters.one_hot.matmul(per_cluster);
        };
        // improved clustered attention: the cluster's top keys rescored for each member
        let (mass, keys) = probs.topk_with_indices(top, 3); // [b, h, c, top]
        let gather_rows = |x: Tensor<4>, index: Tensor<4, Int>, rows: usize| {
            let flat = index.reshape([b, h, rows * top]).unsqueeze_dim::<4>(3).expand([b, h, rows * top, dh]);
            x.gather(2, flat).reshape([b, h, rows, top, dh])
        };
        let v_top = gather_rows(v.clone(), keys.clone(), c); // [b, h, c, top, dh]
        let top_part = mass.clone().unsqueeze_dim::<5>(3).matmul(v_top).reshape([b, h, c, dh]);
        let rest = per_cluster - top_part; // Σ_{l ∉ T_j} A^c_jl v_l
        let total = mass.sum_dim(3); // m̂_j, [b, h, c, 1]
        let own = clusters.assignment.unsqueeze_dim::<4>(3).expand([b, h, lq, top]);
        let query_keys = keys.gather(2, own); // [b, h, lq, top]
        let k_q = gather_rows(k, query_keys.clone(), lq);
        let v_q = gather_rows(v, query_keys.clone(), lq);
        let mut exact = (q.unsqueeze_dim::<5>(3) * k_q).sum_dim(4).reshape([b, h, lq, top]).mul_scalar(self.scale);
        if let Some(p) = key_padding {
            let hidden = p.clone().int().reshape([b, 1, lk]).expand([b, h, lk]);
            let hidden = hidden.gather(2, query_keys.reshape([b, h, lq * top])).reshape([b, h, lq, top]).equal_elem(1);
            exact = exact.mask_fill(hidden, MASKED_SCORE);
        }
        let exact = self.dropout.forward(softmax(exact, 3));
        let attended = exact.unsqueeze_dim::<5>(3).matmul(v_q).reshape([b, h, lq, dh]);
        let one_hot = clusters.one_hot;
        one_hot.clone().matmul(total) * attended + one_hot.matmul(rest)
    }
}

impl AttentionMechanism for ClusteredAttention {
    /// Bidirectional only: no decoding state is kept (the layer's state is not passed on).
    fn forward(&self, input: AttentionInput, _state: Option<&mut AttentionState>) -> AttentionOutput {
        ClusteredAttention::forward(self, input, None)
    }
}
