//! Routing attention (Roy et al. 2021, Routing Transformer), the `routing` kind. Queries and keys
//! are clustered by online k-means against one set of centroids μ ∈ ℝ^{k × d} per head, and a
//! query attends only to keys of its own cluster,
//!
//! c(x) = argmax_c  x̂·μ_c   (x̂ = x / ‖x‖),      o_i = softmax_{j : c(k_j) = c(q_i)}(q_i·k_j / √d) v_j.
//!
//! Choice: queries and keys are routed by their ℓ2-normalised direction x̂. The paper routes a
//! LayerNorm of them without scale and bias, (x − mean(x)) / std(x): a vector of norm √d in the
//! direction of x − mean(x). Ours skips the centring, so the two route alike where the mean of
//! x's coordinates is small against ‖x‖ and differ otherwise; both compare directions only. The
//! attention itself reads the raw q and k.
//!
//! The centroids are not trained by gradients: every training forward records the normalised
//! queries and keys assigned to each centroid, and after the optimiser step
//! ([`RoutingAttention::update_centroids`], from the trainer's
//! [`AttentionMechanism::after_optimizer_step`]) each centroid moves by an
//! exponential moving average toward their mean, μ_c ← normalise(λ μ_c + (1 − λ) mean_c)
//! (spherical mini-batch k-means; the paper's update sums rather than averages).
//!
//! Shapes stay static as with LSH ([`crate::pattern::sorted_chunks`]): the L keys and L queries become 2L
//! routing items sorted by (cluster, position, key before query); a query sees the same-cluster
//! keys among the 2w items before it causally (its latest same-cluster predecessors: strictly
//! causal, where the paper's top-w per cluster would let later tokens displace earlier ones), or
//! in its chunk of 2w items and the one before bidirectionally. A query whose cluster holds no
//! visible key returns zero. `local_heads` (the paper's best configurations mix local and
//! routing heads) puts every position of the first heads in one cluster: a sliding window of w.
//!
//! On flex without dropout the sorted chunks run on the block-sparse kernel
//! ([`crate::pattern::sorted_kernel::routed`]): one piece whose query and key slots follow the sorted
//! queries and keys, read in place from the fused projection (or, in a prefill after a cache,
//! from the cached heads).
//!
//! Decoding keeps every position's key, query, value and clusters; a new token scores only the
//! keys its routing window holds (O(w) device work per token). No relative position scheme (no score matrix to bias),
//! and no memory (`reads_memory: false`): queries and keys of the same positions are sorted together.

use std::sync::{Arc, Mutex};

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::prelude::*;
use burn::tensor::Distribution;
use variorum_core::{Capabilities, ConfigError, error::check};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::concat_heads;
use crate::engine::qkv::{normal_linear, split_heads};
use crate::kernelised::random_features::{fixed, redraw};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
use crate::pattern::sorted_chunks::{SortedItems, attend_picked, host, sorted_chunk_attention};
use crate::pattern::sorted_kernel::{self, RoutingItems};
use crate::state::AttentionState;

attention_config! {
    /// `model.attention` with `kind = "routing"`.
    pub struct RoutingConfig [n_heads, head_dim, dropout, bias] {
        /// k, centroids per head, shared by queries and keys. Default 4.
        pub clusters: usize = 4,
        /// w: a query looks among the 2w routing items (queries and keys) before it. Default 32.
        pub window: usize = 32,
        /// λ, the centroids' moving-average decay. Default 0.999.
        pub decay: f64 = 0.999,
        /// The first `local_heads` heads attend locally (all positions in one cluster). Default 0.
        pub local_heads: usize = 0,
    }
}

impl RoutingConfig {
    /// The layer: `init_std` for q/k/v, `out_std` for the output; the centroids drawn at random,
    /// unit rows.
    pub fn init(&self, d_model: usize, init_std: f64, out_std: f64, device: &Device) -> RoutingAttention {
        let (h, hd) = (self.n_heads, self.head_shape(d_model).head_dim);
        let centroids = Tensor::random([h * self.clusters, hd], Distribution::Normal(0.0, 1.0), device);
        RoutingAttention {
            qkv: normal_linear(d_model, 3 * h * hd, self.bias, init_std, device),
            out: normal_linear(h * hd, d_model, self.bias, out_std, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            centroids: fixed(unit_rows(centroids)),
            n_heads: h,
            head_dim: hd,
            clusters: self.clusters,
            window: self.window,
            decay: self.decay,
            local_heads: self.local_heads,
            stats: Default::default(),
        }
    }
}

impl AttentionKind for RoutingConfig {
    type Module = RoutingAttention;
    const SUMMARY: &'static str = "Routing Transformer: queries and keys clustered by online k-means (EMA centroids, one set per head), attention within the cluster over sorted chunks; optional local heads";
    const PAPER: &'static str = "Roy et al. 2021, Efficient Content-Based Sparse Attention with Routing Transformers";
    const CAPS: Capabilities = Capabilities { reads_memory: false, hides_padding: false, ..caps::NO_SCORES };

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        // the head checks of `full`, dropout included
        crate::engine::config::MultiHeadAttentionConfig::from(self.head_fields()).validate(d_model)?;
        check(self.window >= 1, || "model.attention.window must be at least 1".into())?;
        check(self.clusters >= 1, || "model.attention.clusters must be at least 1".into())?;
        check((0.0..1.0).contains(&self.decay), || {
            format!("model.attention.decay = {} must be in [0, 1)", self.decay)
        })?;
        check(self.local_heads <= self.n_heads, || {
            format!("model.attention.local_heads = {} exceeds n_heads = {}", self.local_heads, self.n_heads)
        })
    }

    head_settings_hooks!();

    /// Multiply–adds per token: projections, the assignments, and 4w scores and value rows for
    /// each of its two routing items.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let (h, hd) = (self.n_heads as u64, self.head_shape(d_model).head_dim as u64);
        let keys = (4 * self.window).min(2 * len_k) as u64;
        2 * (4 * d_model as u64 * h * hd + h * (2 * self.clusters as u64 * hd + 2 * 2 * keys * hd))
    }

    fn build(&self, init: &LayerInit, device: &Device) -> RoutingAttention {
        self.init(init.d_model, init.init_std, init.out_std, device)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("", Self { clusters: 3, window: 2, ..Default::default() }),
            TestVariant::new("+ local heads", Self { clusters: 2, window: 3, local_heads: 2, ..Default::default() }),
        ]
    }
}

/// Sums of the normalised queries and keys assigned to each centroid, `[h·k, d]`, and their
/// counts `[h·k, 1]`, since the last update.
#[derive(Debug, Clone, Default)]
pub struct ClusterStats(Arc<Mutex<Option<(Tensor<2>, Tensor<2>)>>>);

/// A Routing Transformer layer ([`RoutingConfig`]): attention within k-means clusters.
#[derive(Module, Debug)]
pub struct RoutingAttention {
    /// The fused q/k/v projection, `d_model → 3 · h · d_h`.
    pub qkv: Linear,
    /// The output projection, `h · d_h → d_model`.
    pub out: Linear,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// μ, `[heads · clusters, head_dim]`, unit rows; moved by [`Self::update_centroids`].
    pub centroids: Param<Tensor<2>>,
    /// Heads h.
    pub n_heads: usize,
    /// d_h, the size of each head.
    pub head_dim: usize,
    /// k, centroids per head.
    pub clusters: usize,
    /// w: a query looks among the 2w routing items (queries and keys) before it.
    pub window: usize,
    /// λ, the centroids' moving-average decay.
    pub decay: f64,
    /// The first `local_heads` heads put every position in one cluster: a sliding window of w.
    pub local_heads: usize,
    /// Sums and counts of the normalised queries and keys assigned to each centroid since the
    /// last update (training forwards only); not saved.
    #[module(skip)]
    pub stats: ClusterStats,
}

impl RoutingAttention {
    /// Cluster of each vector, `[b, h, l]` (vectors `[b, h, l, head_dim]`, any norm); local
    /// heads put everything in cluster 0.
    pub fn assign(&self, x: Tensor<4>) -> Tensor<3, Int> {
        let [b, h, l, _] = x.dims();
        let mu = self.centroids.val().reshape([1, h, self.clusters, self.head_dim]).swap_dims(2, 3);
        // no gradient flows through an argmax: detached, the graph keeps none of this
        let cluster = unit_rows4(x.detach()).matmul(mu).argmax(3).squeeze_dim::<3>(3);
        if self.local_heads == 0 {
            return cluster;
        }
        let routed: Vec<i64> = (0..h).map(|i| i64::from(i >= self.local_heads)).collect();
        let routed = Tensor::<1, Int>::from_data(TensorData::new(routed, [h]), &cluster.device());
        cluster * routed.reshape([1, h, 1]).expand([b, h, l])
    }

    /// Adds the normalised `x` of each cluster to the statistics (training forwards only).
    fn record(&self, x: Tensor<4>, cluster: Tensor<3, Int>) {
        let [b, h, l, d] = x.dims();
        let k = self.clusters;
        let ids = Tensor::<1, Int>::arange(0..k as i64, &x.device()).reshape([1, 1, 1, k]).expand([b, h, l, k]);
        let one_hot = cluster.unsqueeze_dim::<4>(3).expand([b, h, l, k]).equal(ids).float();
        let x = unit_rows4(x.detach());
        let sums = one_hot.clone().swap_dims(2, 3).matmul(x).sum_dim(0).reshape([h * k, d]);
        let counts = one_hot.sum_dim(2).sum_dim(0).reshape([h * k, 1]);
        let (sums, counts) = (sums.without_autodiff(), counts.without_autodiff());
        let mut slot = self.stats.0.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(match slot.take() {
            Some((s, c)) => (s + sums, c + counts),
            None => (sums, counts),
        });
    }

    /// μ_c ← normalise(λ μ_c + (1 − λ) mean of the vectors assigned to c since the last update);
    /// centroids nothing was assigned to stay. Clears the statistics.
    pub fn update_centroids(&mut self) {
        let Some((sums, counts)) = self.stats.0.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
        let mu = self.centroids.val();
        let device = mu.device();
        let (sums, counts) = (sums.to_device(&device), counts.to_device(&device));
        let seen = counts.clone().greater_elem(0.0).float();
        let mean = sums / counts.clamp_min(1.0);
        let moved = mu.clone().mul_scalar(self.decay) + mean.mul_scalar(1.0 - self.decay);
        let next = unit_rows(moved) * seen.clone() + mu * seen.neg().add_scalar(1.0);
        self.centroids = redraw(&self.centroids, next);
    }

    /// Self-attention within the clusters (`key_value` must be `None`), `[b, len_q, d_model]`. The
    /// cache keeps every position's key, query, value and clusters; one causal token is O(w).
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        assert!(input.key_value.is_none(), "routing attention is self-attention only");
        let causal = input.mask.causal;
        let [b, lq, _] = input.query.dims();
        let (h, hd) = (self.n_heads, self.head_dim);
        let qkv = self.qkv.forward(input.query);
        let [q, k, v]: [Tensor<4>; 3] = split_heads(qkv.clone(), 3, h, hd).try_into().expect("three parts");
        let context = match cache {
            None => self.route_all(q, k, v, lq, causal, Some(qkv)),
            Some(cache) => {
                // the cache keeps every position's key and query (the routing items), value and
                // the clusters of both
                let (ck, cq) = (host(self.assign(k.clone())), host(self.assign(q.clone())));
                for t in 0..lq {
                    cache.tags.push((0..b * h).flat_map(|bh| [ck[bh * lq + t], cq[bh * lq + t]]).collect());
                }
                let (kq, all_v) = cache.append(Tensor::cat(vec![k, q.clone()], 3), v);
                if lq == 1 && causal && cache.tags.len() == cache.len() {
                    concat_heads(self.decode_one(q, cache))
                } else {
                    let (all_k, all_q) = (kq.clone().narrow(3, 0, hd), kq.narrow(3, hd, hd));
                    self.route_all(all_q, all_k, all_v, lq, causal, None)
                }
            }
        };
        AttentionOutput { context: self.out.forward(context), weights: None, aux_losses: Vec::new() }
    }

    /// Routing over all positions; the outputs of the last `lq`, heads merged, `[b, lq, h · hd]`.
    /// `packed`: the fused projection q, k, v were split from, which the kernel reads in place.
    fn route_all(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        lq: usize,
        causal: bool,
        packed: Option<Tensor<3>>,
    ) -> Tensor<3> {
        let [b, h, l, hd] = q.dims();
        let (cq, ck) = (self.assign(q.clone()), self.assign(k.clone()));
        if q.is_autodiff() {
            self.record(q.clone(), cq.clone());
            self.record(k.clone(), ck.clone());
        }
        if crate::engine::heads::kernel_takes(&self.dropout, &q) {
            let scale = 1.0 / (hd as f64).sqrt();
            let items = match packed {
                Some(qkv) => RoutingItems::Packed { qkv, heads: h, scale },
                None => RoutingItems::Heads([q.clone().mul_scalar(scale), k.clone(), v.clone()]),
            };
            let clusters = (host(cq.clone()), host(ck.clone()));
            if let Some(context) = sorted_kernel::routed(items, (&clusters.0, &clusters.1), 2 * self.window, causal) {
                return context.narrow(1, l - lq, lq);
            }
        }
        // items 0..l: the keys; l..2l: the queries; sorted by (cluster, position, key first)
        let device = q.device();
        let position = Tensor::<1, Int>::arange(0..l as i64, &device).reshape([1, 1, l]).expand([b, h, l]);
        let n = 2 * l as i64;
        let key_sort = ck.clone().mul_scalar(n) + position.clone().mul_scalar(2);
        let query_sort = cq.clone().mul_scalar(n) + position.mul_scalar(2).add_scalar(1);
        let none = |fill: f32| Tensor::<3>::full([b, h, l], fill, &device);
        let zeros = Tensor::<4>::zeros([b, h, l, hd], &device);
        let items = SortedItems {
            q: Tensor::cat(vec![zeros.clone(), q], 2),
            k: Tensor::cat(vec![k, zeros.clone()], 2),
            v: Tensor::cat(vec![v, zeros], 2),
            sort_key: Tensor::cat(vec![key_sort, query_sort], 2),
            query_bucket: Tensor::cat(vec![none(-2.0), cq.float()], 2),
            key_bucket: Tensor::cat(vec![ck.float(), none(-1.0)], 2),
            rounds: Vec::new(),
        };
        let (out, _) = sorted_chunk_attention(items, 2 * self.window, causal, None, &self.dropout);
        concat_heads(out.narrow(2, 2 * l - lq, lq))
    }

    /// The newest position's query (causal) against the keys it sees, from the clusters the cache
    /// remembers: walking back through its cluster's routing items (own key, then each earlier
    /// position's query and key), the keys among the first 2w — O(w) device work per token.
    fn decode_one(&self, q: Tensor<4>, cache: &KvCache) -> Tensor<4> {
        let [b, h, _, _] = q.dims();
        let (tags, l) = (&cache.tags, cache.len());
        let reach = 2 * self.window;
        let picks: Vec<Vec<i64>> = (0..b * h)
            .map(|bh| {
                let cluster = tags[l - 1][2 * bh + 1];
                let (mut items, mut keys) = (0, Vec::new());
                for p in (0..l).rev() {
                    let (key, query) = (tags[p][2 * bh], tags[p][2 * bh + 1]);
                    items += usize::from(p < l - 1 && query == cluster);
                    if key == cluster {
                        items += 1;
                        if items <= reach {
                            keys.push(p as i64);
                        }
                    }
                    if items >= reach {
                        break;
                    }
                }
                keys
            })
            .collect();
        attend_picked(q, cache, &picks, reach, None, false, None).0
    }
}

fn unit_rows(x: Tensor<2>) -> Tensor<2> {
    x.clone() / (x.powf_scalar(2.0).sum_dim(1).sqrt() + 1e-6)
}

fn unit_rows4(x: Tensor<4>) -> Tensor<4> {
    x.clone() / (x.powf_scalar(2.0).sum_dim(3).sqrt() + 1e-6)
}

impl AttentionMechanism for RoutingAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        RoutingAttention::forward(self, input, state.map(AttentionState::kv_mut))
    }

    /// Moves the centroids toward what the training forwards since the last step assigned to them.
    fn after_optimizer_step(&mut self, _step: usize) {
        self.update_centroids();
    }
}
