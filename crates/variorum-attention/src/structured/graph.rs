//! Graph-masked attention, the `graph` kind: each position attends over its neighbours in a
//! graph given with the example (`data.graph`) and itself — a graph attention network's layer
//! (Veličković et al. 2018, "Graph Attention Networks") inside a Transformer block:
//!
//! ```text
//! head_i = Σ_{j ∈ N(i) ∪ {i}} softmax_j(e_ij) v_j
//! e_ij = q_i · k_j / √d_h                        (score = "dot", the Transformer's)
//! e_ij = LeakyReLU_0.2(a_qᵀ q_i + a_kᵀ k_j)       (score = "additive", GAT's)
//! ```
//!
//! GAT scores an edge by aᵀ[W h_i ‖ W h_j]; with separate query and key projections that is
//! a_qᵀ q_i + a_kᵀ k_j, a per-head vector for each side (a_q per query head, a_k per key head;
//! initialised N(0, init_std²); the queries carry the 1/√d_h scale, which a_q absorbs). GAT's
//! concatenated heads and nonlinearity are the block's output projection and feed-forward here.
//!
//! With a graph on the mask ([`variorum_core::GraphMask`]) the layer gathers each position's
//! neighbours — O(L · degree) scores, no L × L matrix — and scores only those; causally, a
//! position reads only neighbours not after it. Without one (generation, the generic harness,
//! plain text) the graph is the complete one, as the source text puts it: "self-attention can be
//! viewed as a graph neural network on the complete graph" — "dot" is then full attention, on its
//! fused kernels, and "additive" scores every visible key. A graph covers whole examples from
//! position 0: no memory of earlier segments, no cross-attention; a graph and a KV cache do not
//! meet (the model decodes without edges).
//!
//! With a graph the layer returns no attention weights (they exist per neighbour slot, not as an
//! L × L map).
//!
//! Positions: no scheme acts on these scores (absolute encodings on the input do); in a graph,
//! the order of the tokens is one more fact the edges may or may not carry.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::leaky_relu;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, GraphMask};

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::{Projected, per_query_head};
use crate::engine::normaliser::MASKED_SCORE;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::state::AttentionState;

/// GAT's LeakyReLU slope (Veličković et al. 2018).
pub const NEGATIVE_SLOPE: f64 = 0.2;

/// How an edge is scored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GraphScore {
    /// q_i · k_j / √d_h (the Transformer's dot product).
    #[default]
    Dot,
    /// LeakyReLU(a_qᵀ q_i + a_kᵀ k_j) (GAT's additive score).
    Additive,
}

attention_config! {
    /// `model.attention` with `kind = "graph"`.
    pub struct GraphAttentionConfig {
        /// How a position scores a neighbour: "dot" (default) or "additive" (GAT).
        pub score: GraphScore = GraphScore::Dot,
    }
}

impl GraphAttentionConfig {
    /// The layer for `d_model`: `full`'s heads, and for additive scores a_q and a_k, drawn from
    /// N(0, init_std²).
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> GraphAttention {
        let attention = self.heads().init(d_model, init_std, out_std, position, device);
        let (h, hkv, dh) = (self.n_heads, self.heads().kv_heads(), attention.qkv.head_dim);
        let vector =
            |n: usize| Param::from_tensor(Tensor::random([n, dh], Distribution::Normal(0.0, init_std), device));
        let additive = self.score == GraphScore::Additive;
        GraphAttention {
            attention,
            query_vector: additive.then(|| vector(h)),
            key_vector: additive.then(|| vector(hkv)),
        }
    }
}

impl AttentionKind for GraphAttentionConfig {
    type Module = GraphAttention;
    const SUMMARY: &'static str = "graph-masked attention: each position attends over its neighbours in a graph given with the example (data.graph) and itself, by dot-product or GAT's additive scores; gathered, O(L·degree); the complete graph without one";
    const PAPER: &'static str = "Veličković et al. 2018, Graph Attention Networks";
    // its graph covers whole examples from position 0: no memory of earlier segments
    const CAPS: Capabilities = Capabilities { reads_memory: false, graph: true, ..caps::NO_SCORES };
    head_kind_items!();

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)
    }

    /// The complete graph's cost (what a layer without edges computes); with a graph a layer
    /// scores its degree's keys per position instead, which this figure does not know.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, len_k)
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("dot", Self::default()),
            TestVariant::new(
                "additive, grouped keys",
                Self { score: GraphScore::Additive, n_kv_heads: Some(2), ..Default::default() },
            ),
            TestVariant::new("additive, bidirectional", Self { score: GraphScore::Additive, ..Default::default() })
                .masked(),
        ]
    }
}

/// Graph-masked attention: each position attends over its neighbours in the example's graph and
/// itself (the complete graph without one).
#[derive(Module, Debug)]
pub struct GraphAttention {
    /// Projections, dot-product scores and output of plain multi-head attention.
    pub attention: MultiHeadAttention,
    /// a_q, `[n_heads, d_h]` (additive scores only).
    pub query_vector: Option<Param<Tensor<2>>>,
    /// a_k, `[n_kv_heads, d_h]` (additive scores only).
    pub key_vector: Option<Param<Tensor<2>>>,
}

impl GraphAttention {
    /// The layer over `input`: gathered over `input.mask.graph`'s neighbours (no weights, no
    /// cache) when it has one, over every visible key (after `cache`'s) otherwise.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let mask = input.mask;
        if let Some(graph) = &mask.graph {
            assert!(input.key_value.is_none(), "graph attention reads its own sequence: no cross-attention");
            let p = self.attention.project(input.query, None, mask, cache);
            assert!(
                p.layout.q_start == 0 && p.layout.k_start == 0 && p.layout.len_q == p.layout.len_k,
                "graph attention: a graph covers whole examples from position 0 (no cache or memory)"
            );
            let context = self.attend_graph(&p, graph);
            return AttentionOutput { context: self.attention.merge(context), weights: None, aux_losses: Vec::new() };
        }
        let (Some(aq), Some(ak)) = (&self.query_vector, &self.key_vector) else {
            // the complete graph, dot-product scores: full attention
            return self.attention.forward(input, cache);
        };
        let p = self.attention.project(input.query, input.key_value, mask, cache);
        let [b, h, lq, _] = p.q_dims();
        let [_, hkv, lk, _] = p.k.dims();
        let s = side_scores(&p.q(), aq.val()).reshape([b, h, lq, 1]);
        let t = per_query_head(side_scores(&p.k, ak.val()).reshape([b, hkv, 1, lk]), h);
        let scores = leaky_relu(s + t, NEGATIVE_SLOPE);
        let probs = self.attention.normalise(self.attention.mask_scores(scores, mask, input.dense_mask, &p));
        let weights = input.need_weights.then(|| probs.clone());
        let context = self.attention.combine(self.attention.dropout.forward(probs), &p);
        AttentionOutput { context, weights, aux_losses: Vec::new() }
    }

    /// Per-head contexts `[b, h, L, d_h]` over each position's neighbours in `graph`, gathered.
    fn attend_graph(&self, p: &Projected, graph: &GraphMask) -> Tensor<4> {
        let [b, h, l, _] = p.q_dims();
        let (at, empty) = graph.neighbours(l, p.layout.causal, p.max_back, &p.device());
        let slots = Slots::new(at, l, h);
        let scores = match (&self.query_vector, &self.key_vector) {
            (Some(aq), Some(ak)) => {
                let hkv = p.k.dims()[1];
                let s = side_scores(&p.q(), aq.val()).reshape([b, h, l, 1]);
                let t = side_scores(&p.k, ak.val()).reshape([b, hkv, l, 1]);
                leaky_relu(s + slots.gather(t).reshape([b, h, l, slots.degree]), NEGATIVE_SLOPE)
            }
            _ => slots.dot_scores(p),
        };
        slots.attend(&self.attention, scores, empty, p)
    }
}

/// Each query's slots over the keys of its own batch row (`[b, len_q, degree]` key indices), read
/// by row selects: gathered keys and values, `[b, h, len_q, degree, ·]`, and attention over them.
/// Shared by the kinds that attend over a per-query set of keys (`graph`, `sac`).
pub(crate) struct Slots {
    /// Each slot's row among all the batch's key rows.
    flat: Tensor<1, Int>,
    b: usize,
    len_q: usize,
    pub(crate) degree: usize,
    heads: usize,
}

impl Slots {
    /// Slots `at` (`[b, len_q, degree]`, indices into `len_k` keys) for `heads` query heads.
    pub(crate) fn new(at: Tensor<3, Int>, len_k: usize, heads: usize) -> Self {
        let [b, len_q, degree] = at.dims();
        // each slot's row among all the batch's rows, one index for every head and feature: a
        // row select (whose backward adds rows back) rather than an element gather
        let rows = Tensor::<1, Int>::arange(0..b as i64, &at.device()).mul_scalar(len_k as i64).reshape([b, 1, 1]);
        Self { flat: (at + rows).reshape([b * len_q * degree]), b, len_q, degree, heads }
    }

    /// Rows of `x` `[b, h_kv, len_k, d]` at each slot, `[b, h, len_q, degree, d]`; a key's heads
    /// side by side make each selected row one contiguous run.
    pub(crate) fn gather(&self, x: Tensor<4>) -> Tensor<5> {
        let [b, hkv, lk, d] = x.dims();
        let (lq, m) = (self.len_q, self.degree);
        let picked = x.swap_dims(1, 2).reshape([b * lk, hkv * d]).select(0, self.flat.clone());
        per_query_head(picked.reshape([b, lq * m, hkv, d]).swap_dims(1, 2), self.heads)
            .reshape([b, self.heads, lq, m, d])
    }

    /// q · k over each query's slots (the queries carry the scale): `[b, h, len_q, degree]`, one
    /// 1 × d_h by d_h × degree product per query and head.
    pub(crate) fn dot_scores(&self, p: &Projected) -> Tensor<4> {
        let [b, h, lq, dh] = p.q_dims();
        p.q().reshape([b, h, lq, 1, dh]).matmul(self.gather(p.k.clone()).swap_dims(3, 4)).reshape([
            b,
            h,
            lq,
            self.degree,
        ])
    }

    /// Per-head contexts `[b, h, len_q, d_h]`: `scores` over the slots, `empty` (`[b, len_q,
    /// degree]`) hidden, normalised, dropped out, over the gathered values.
    pub(crate) fn attend(
        &self,
        att: &MultiHeadAttention,
        scores: Tensor<4>,
        empty: Tensor<3, Bool>,
        p: &Projected,
    ) -> Tensor<4> {
        let (b, h, lq, m) = (self.b, self.heads, self.len_q, self.degree);
        let dh = p.v.dims()[3];
        let hidden = empty.reshape([b, 1, lq, m]).expand([b, h, lq, m]);
        let probs = att.dropout.forward(att.normalise(scores.mask_fill(hidden, MASKED_SCORE)));
        probs.reshape([b, h, lq, 1, m]).matmul(self.gather(p.v.clone())).reshape([b, h, lq, dh])
    }
}

/// aᵀ x per head and row: `x` `[b, heads, n, d]`, `a` `[heads, d]` → `[b, heads, n]`.
fn side_scores(x: &Tensor<4>, a: Tensor<2>) -> Tensor<3> {
    let [b, heads, n, d] = x.dims();
    let a = a.reshape([1, heads, d, 1]).expand([b, heads, d, 1]);
    x.clone().matmul(a).reshape([b, heads, n])
}

impl AttentionMechanism for GraphAttention {
    /// Decoding state: a [`KvCache`].
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        GraphAttention::forward(self, input, state.map(|s| s.get_or_default::<KvCache>()))
    }

    fn extend_cache(&self, x: Tensor<3>, mask: &variorum_core::AttentionMask, state: &mut AttentionState) {
        self.attention.project(x, None, mask, Some(state.get_or_default::<KvCache>()));
    }

    // no dense mask from the model: with a graph it gathers the neighbours (no L × L matrix);
    // without one, "dot" is full attention (its fused kernels need none) and "additive" builds
    // its own mask
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use variorum_core::AttentionMask;

    fn device() -> Device {
        Device::default()
    }

    fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    /// A seeded random graph per row (undirected edges, rows of different lengths: the rest is
    /// padding).
    fn random_graph(lens: &[usize], seed: u64) -> GraphMask {
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let rows = lens
            .iter()
            .map(|&n| {
                let mut adj = vec![Vec::new(); n];
                for _ in 0..2 * n {
                    let (i, j) = (next() % n, next() % n);
                    if i != j && !adj[i].contains(&(j as u32)) {
                        adj[i].push(j as u32);
                        adj[j].push(i as u32);
                    }
                }
                adj.iter_mut().for_each(|a| a.sort_unstable());
                Arc::new(adj)
            })
            .collect();
        GraphMask::new(rows)
    }

    fn layer(score: GraphScore, n_kv_heads: Option<usize>) -> GraphAttention {
        let dev = device();
        dev.seed(7);
        let cfg = GraphAttentionConfig { score, n_kv_heads, ..Default::default() };
        cfg.init(32, 0.3, 0.3, Positioning::NONE, &dev)
    }

    /// The issue's defining property: gathered over the neighbours, the layer computes what
    /// attention masked densely by the graph computes.
    #[test]
    fn gathered_graph_equals_dense_masked_attention() {
        let dev = device();
        let x = Tensor::<3>::random([2, 11, 32], Distribution::Normal(0.0, 1.0), &dev);
        let graph = random_graph(&[11, 7], 3);
        for score in [GraphScore::Dot, GraphScore::Additive] {
            for kv in [None, Some(2)] {
                let att = layer(score, kv);
                for causal in [true, false] {
                    let base = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
                    let mask = base.with_graph(Some(graph.clone()));
                    let sparse = att.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                    // the dense path with the graph as a custom mask (the graph taken off the mask)
                    let custom = graph.hidden(11, &dev);
                    let base = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
                    let dense_mask = base.with_custom(custom);
                    let dense = match score {
                        GraphScore::Dot => {
                            att.attention.forward(AttentionInput::self_attention(x.clone(), &dense_mask), None)
                        }
                        GraphScore::Additive => {
                            att.forward(AttentionInput::self_attention(x.clone(), &dense_mask), None)
                        }
                    }
                    .context;
                    let d = max_diff(sparse, dense);
                    assert!(d < 1e-5, "{score:?} kv {kv:?} causal {causal}: {d}");
                }
            }
        }
    }

    /// Full attention reads the graph from the mask too (through its dense score mask).
    #[test]
    fn full_attention_honours_the_graph_mask() {
        let dev = device();
        let x = Tensor::<3>::random([2, 9, 32], Distribution::Normal(0.0, 1.0), &dev);
        let graph = random_graph(&[9, 9], 5);
        let att = layer(GraphScore::Dot, None);
        let mask = AttentionMask::causal().with_graph(Some(graph.clone()));
        let via_graph = att.attention.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        let custom = AttentionMask::causal().with_custom(graph.hidden(9, &dev));
        let via_custom = att.attention.forward(AttentionInput::self_attention(x.clone(), &custom), None).context;
        assert!(max_diff(via_graph.clone(), via_custom) < 1e-6);
        let plain = att.attention.forward(AttentionInput::self_attention(x, &AttentionMask::causal()), None).context;
        assert!(max_diff(via_graph, plain) > 1e-3, "the graph changed nothing (the check is blind)");
    }

    /// GAT's score, written out for one position: LeakyReLU(a_q·q_i + a_k·k_j) over i's
    /// neighbours and itself, softmax, the values' weighted sum, the output projection.
    #[test]
    fn additive_scores_are_gats() {
        let dev = device();
        let x = Tensor::<3>::random([1, 6, 32], Distribution::Normal(0.0, 1.0), &dev);
        let adj = vec![vec![2, 5], vec![], vec![0], vec![], vec![], vec![0]];
        let graph = GraphMask::new(vec![Arc::new(adj)]);
        let att = layer(GraphScore::Additive, None);
        let mask = AttentionMask::bidirectional().with_graph(Some(graph));
        let out = att.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
        let p = att.attention.project(x, None, &AttentionMask::bidirectional(), None);
        let (aq, ak) = (att.query_vector.as_ref().unwrap().val(), att.key_vector.as_ref().unwrap().val());
        let [_, h, _, dh] = p.q_dims();
        let i = 0;
        let reads = [0usize, 2, 5];
        let mut heads = Vec::new();
        for head in 0..h {
            let q = p.q().slice([0..1, head..head + 1, i..i + 1, 0..dh]).reshape([dh]);
            let s = (q * aq.clone().slice([head..head + 1, 0..dh]).reshape([dh])).sum();
            let e: Vec<Tensor<1>> = reads
                .iter()
                .map(|&j| {
                    let k = p.k.clone().slice([0..1, head..head + 1, j..j + 1, 0..dh]).reshape([dh]);
                    leaky_relu(s.clone() + (k * ak.clone().slice([head..head + 1, 0..dh]).reshape([dh])).sum(), 0.2)
                })
                .collect();
            let w = burn::tensor::activation::softmax(Tensor::cat(e, 0), 0);
            let v: Vec<Tensor<2>> = reads
                .iter()
                .map(|&j| p.v.clone().slice([0..1, head..head + 1, j..j + 1, 0..dh]).reshape([1, dh]))
                .collect();
            heads.push(w.reshape([1, reads.len()]).matmul(Tensor::cat(v, 0)));
        }
        let want = att.attention.merge(Tensor::cat(heads, 1).reshape([1, h, 1, dh]));
        let got = out.slice([0..1, i..i + 1, 0..32]);
        let d = max_diff(got, want);
        assert!(d < 1e-5, "{d}");
    }

    /// A position's output moves when a token it reads changes, and only then.
    #[test]
    fn a_position_reads_its_neighbours_only() {
        let dev = device();
        let x = Tensor::<3>::random([1, 10, 32], Distribution::Normal(0.0, 1.0), &dev);
        let graph = random_graph(&[10], 11);
        for score in [GraphScore::Dot, GraphScore::Additive] {
            let att = layer(score, None);
            for causal in [true, false] {
                let base = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
                let mask = base.with_graph(Some(graph.clone()));
                let out = att.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                for j in [0, 4, 9] {
                    let bumped = x.clone().slice_assign([0..1, j..j + 1, 0..32], Tensor::ones([1, 1, 32], &dev) * 3.0);
                    let moved = att.forward(AttentionInput::self_attention(bumped, &mask), None).context;
                    for i in 0..10 {
                        let d = max_diff(out.clone().narrow(1, i, 1), moved.clone().narrow(1, i, 1));
                        let reads = graph.reads(0, i, 10, causal, None).contains(&(j as u32));
                        assert_eq!(d > 1e-6, reads, "{score:?} causal {causal}: position {i}, token {j}: {d}");
                    }
                }
            }
        }
    }
}
