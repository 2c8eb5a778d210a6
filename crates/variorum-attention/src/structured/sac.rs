//! SAC (Li et al. 2020, "SAC: Accelerating and Structuring Self-Attention via Sparse Adaptive
//! Connection"), the `sac` kind: an edge predictor chooses, for each query, the keys it attends
//! to, and attention runs over those edges only; the predictor, whose choice is discrete, learns
//! by REINFORCE with the task's loss as the reward.
//!
//! ```text
//! s_ij = (U x_i) · (W x_j) / √r                     the edge predictor's pointer scores
//! E_i  = k keys drawn from softmax_j(s_ij)           (without replacement, over the keys i may
//!                                                     see; the k best in evaluation)
//! head_i = Σ_{j ∈ E_i ∪ {i}} softmax_j(q_i · k_j / √d_h) v_j
//! ∇ = E[(L − b) ∇ log π(E)]                          REINFORCE, L the example's loss
//! ```
//!
//! Choices where the paper leaves room or where our blocks differ:
//! - The paper's predictor is an LSTM that emits the edge list of a layer as pairs of pointers,
//!   αN edges in all. Ours is a pointer per query: a rank-r bilinear score of each query's input
//!   against each key's, from which the query draws its k edges (`edges`). Every query gets the
//!   same budget, and the layer keeps one file and decodes incrementally. The pointer scores are
//!   O(L² · r) per layer, as the paper's pointers over N nodes are; attention is O(L · k · d).
//! - Drawing k edges without replacement is Gumbel-top-k (Kool et al. 2019): the k largest of
//!   s_ij + Gumbel noise, in that order, are a sample of the Plackett–Luce distribution, whose
//!   log-probability is Σ_t [s_{j_t} − log Σ_{j not yet drawn} exp s_j]. In evaluation (no
//!   autodiff) the k largest scores are taken, so cached decoding reproduces the forward.
//! - The reward is the negative loss of the batch row; the baseline is the mean loss of the
//!   batch's other rows (leave-one-out: unbiased, and no state between steps), so a row whose
//!   edges did better than the others makes them more likely. A batch (micro-batch) of one row
//!   has no baseline, so the trainer refuses `batch_size` 1 (`Capabilities::policy`). The layer
//!   returns its rows' log π as an auxiliary term named
//!   [`variorum_core::REINFORCE_PREFIX`]`edge_policy`; the model, which knows each row's loss,
//!   turns it into the surrogate `policy_weight · mean_rows(A_r · log π_r)` (A_r the detached
//!   advantage, log π_r the mean over the row's queries), whose gradient is the REINFORCE
//!   estimate.
//! - The predictor reads the layer's input detached: the policy's gradient, noisy by nature,
//!   trains the predictor's two projections and nothing below them.
//! - The predictor gets no gradient through the attention (the choice is discrete), only the
//!   policy's. A query always reads itself besides its k edges; a query with fewer than k keys
//!   to see reads them all.
//!
//! Positions: no scheme acts on these scores (absolute encodings on the input do). No memory,
//! cross-attention, custom masks, graphs or `max_back`; padding keys are never drawn. Not
//! replayable (fresh Gumbel noise at every training forward). The policy's log-probability needs
//! one softmax over the keys per layer (O(L²) memory while training, as the pointer scores).

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::log_softmax;
use variorum_core::{AttentionMask, Capabilities, ConfigError, REINFORCE_PREFIX, error::check};

use crate::cache::KvCache;
use crate::contract::Positioning;
use crate::contract::{AttentionInput, AttentionOutput};
use crate::engine::heads::MultiHeadAttention;
use crate::engine::heads::Projected;
use crate::engine::normaliser::MASKED_SCORE;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};
use crate::state::AttentionState;
use crate::structured::graph::Slots;

attention_config! {
    /// `model.attention` with `kind = "sac"`.
    pub struct SacConfig {
        /// Keys the edge predictor chooses for each query (besides the query itself). Default 8.
        pub edges: usize = 8,
        /// Rank r of the predictor's pointer projections. Default 16.
        pub predictor_dim: usize = 16,
        /// Weight of the REINFORCE term that trains the predictor. Default 1.
        pub policy_weight: f64 = 1.0,
    }
}

impl SacConfig {
    /// The layer for `d_model`: `full`'s heads and the two pointer projections U and W,
    /// N(0, init_std²) without biases.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> SacAttention {
        let attention = self.heads().init(d_model, init_std, out_std, position, device);
        let pointer = || {
            LinearConfig::new(d_model, self.predictor_dim)
                .with_bias(false)
                .with_initializer(Initializer::Normal { mean: 0.0, std: init_std })
                .init(device)
        };
        SacAttention {
            attention,
            pointer_query: pointer(),
            pointer_key: pointer(),
            edges: self.edges,
            policy_weight: self.policy_weight,
        }
    }
}

impl AttentionKind for SacConfig {
    type Module = SacAttention;
    const SUMMARY: &'static str = "SAC: an edge predictor (rank-r pointer scores) draws k keys per query, attention runs over those edges and the query itself; the predictor learns by REINFORCE with the row's loss as reward";
    const PAPER: &'static str =
        "Li et al. 2020, SAC: Accelerating and Structuring Self-Attention via Sparse Adaptive Connection";
    // fresh Gumbel noise at every training forward; its keys are drawn from its own segment
    const CAPS: Capabilities =
        Capabilities { reads_memory: false, replayable: false, aux_losses: true, policy: true, ..caps::NO_SCORES };
    head_kind_items!();

    /// A predictor that learns is a policy (its rows need one another as the baseline).
    fn capabilities(&self) -> Capabilities {
        Capabilities { policy: self.policy_weight > 0.0, ..Self::CAPS }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.edges >= 1, || "model.attention.edges must be at least 1 (keys per query)".into())?;
        check(self.predictor_dim >= 1 && self.predictor_dim <= d_model, || {
            format!(
                "model.attention.predictor_dim = {} must be in 1..={d_model} (the pointer scores' rank cannot exceed d_model)",
                self.predictor_dim
            )
        })?;
        check(self.policy_weight.is_finite() && self.policy_weight >= 0.0, || {
            format!("model.attention.policy_weight = {} must be a finite number ≥ 0", self.policy_weight)
        })
    }

    /// Attention over k + 1 keys, the two pointer projections and the pointer scores over every
    /// key.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let r = self.predictor_dim;
        self.heads().flops_per_token(d_model, (self.edges + 1).min(len_k.max(1)))
            + (2 * 2 * d_model * r + 2 * r * len_k) as u64
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        vec![
            TestVariant::new("edges 2", Self { edges: 2, ..Default::default() }),
            TestVariant::new("edges 3, grouped keys", Self { edges: 3, n_kv_heads: Some(2), ..Default::default() }),
            TestVariant::new("edges 2, bidirectional", Self { edges: 2, ..Default::default() }).masked(),
        ]
    }
}

/// Decoding state: the KV cache and the keys' pointer projections (`[b, 1, len, r]`, kept in a
/// [`KvCache`] as both of its halves).
#[derive(Debug, Clone, Default)]
pub struct SacState {
    /// The layer's keys and values.
    pub kv: KvCache,
    pointers: KvCache,
}

/// SAC: attention over the k keys an edge predictor draws for each query, and the query itself;
/// the predictor learns by REINFORCE.
#[derive(Module, Debug)]
pub struct SacAttention {
    /// Projections, dot-product scores and output of plain multi-head attention.
    pub attention: MultiHeadAttention,
    /// U: each query's pointer, `d_model → r`.
    pub pointer_query: Linear,
    /// W: each key's pointer, `d_model → r`.
    pub pointer_key: Linear,
    /// k, the keys drawn for each query besides itself.
    pub edges: usize,
    /// Weight of the REINFORCE term (0: the predictor does not learn).
    pub policy_weight: f64,
}

/// The edges drawn for a call: per query, the chosen keys in drawing order, which of them are
/// not real (fewer keys to see than k), and the predictor's masked scores they were drawn from.
pub struct Edges {
    /// `[b, len_q, k]` key indices.
    pub keys: Tensor<3, Int>,
    /// `[b, len_q, k]`, true for a slot with no key behind it.
    pub empty: Tensor<3, Bool>,
    /// `[b, len_q, len_k]` pointer scores, the keys a query may not draw at [`MASKED_SCORE`].
    pub scores: Tensor<3>,
    /// `[len_q]`: each query's own key index (which it reads besides its edges).
    pub own: Tensor<1, Int>,
}

impl SacAttention {
    /// The layer over `input`'s own sequence (keys after `state`'s); no weights. While training it
    /// returns each row's log π, times `policy_weight`, as the `edge_policy` REINFORCE term.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut SacState>) -> AttentionOutput {
        let mask = input.mask;
        assert!(
            input.key_value.is_none() && mask.custom.is_none() && mask.graph.is_none(),
            "sac draws its edges over its own sequence: no cross-attention, custom mask or graph"
        );
        let x = input.query;
        let (p, pointers) = match state {
            Some(st) => {
                let p = self.attention.project(x.clone(), None, mask, Some(&mut st.kv));
                let w = self.key_pointers(x.clone());
                (p, st.pointers.append(w.clone(), w).0)
            }
            None => {
                let p = self.attention.project(x.clone(), None, mask, None);
                (p, self.key_pointers(x.clone()))
            }
        };
        let [b, h, lq, _] = p.q_dims();
        let lk = p.k.dims()[2];
        let edges = self.draw(x, pointers, mask, &p);
        // each query's own key first, then its edges
        let own = edges.own.clone().reshape([1, lq, 1]).expand([b, lq, 1]);
        let at = Tensor::cat(vec![own, edges.keys.clone()], 2);
        // (as integers: a gathered mask and a fresh one may differ in storage)
        let empty = Tensor::cat(vec![Tensor::<3, Int>::zeros([b, lq, 1], &p.device()), edges.empty.clone().int()], 2)
            .equal_elem(1);
        let slots = Slots::new(at, lk, h);
        let context = slots.attend(&self.attention, slots.dot_scores(&p), empty, &p);
        let mut aux_losses = Vec::new();
        if edges.scores.is_autodiff() && self.policy_weight > 0.0 {
            // per row, the mean over its queries: the term's scale does not grow with the length
            let log_pi = plackett_luce(edges.scores, edges.keys, edges.empty).mean_dim(1).reshape([b]);
            aux_losses.push((format!("{REINFORCE_PREFIX}edge_policy"), log_pi.mul_scalar(self.policy_weight)));
        }
        AttentionOutput { context: self.attention.merge(context), weights: None, aux_losses }
    }

    /// W x: `[b, 1, len, r]` (x detached, as for the queries' pointers).
    fn key_pointers(&self, x: Tensor<3>) -> Tensor<4> {
        self.pointer_key.forward(x.detach()).unsqueeze_dim(1)
    }

    /// The edges of the queries of `x` over the keys whose pointers are `pointers` (`[b, 1,
    /// len_k, r]`): drawn (Gumbel-top-k) while training, the k best otherwise.
    pub fn draw(&self, x: Tensor<3>, pointers: Tensor<4>, mask: &AttentionMask, p: &Projected) -> Edges {
        let [b, lq, _] = x.dims();
        let lk = p.k.dims()[2];
        let device = x.device();
        // the predictor reads the layer's input without a gradient into it: the policy's noisy
        // gradient trains the predictor alone, not the layers below
        let u = self.pointer_query.forward(x.detach());
        let r = u.dims()[2];
        let w = pointers.reshape([b, lk, r]);
        let scores = u.matmul(w.swap_dims(1, 2)).div_scalar((r as f64).sqrt());
        // the keys a query may draw: those it may see, itself left out (it reads itself anyway)
        let layout = &p.layout;
        let seen = AttentionMask { k_start: layout.k_start, ..mask.clone() }.score_mask(lq, lk, &device);
        // key j is query i's own position where k_start + j = q_start + i
        let queries =
            Tensor::<1, Int>::arange(0..lq as i64, &device).add_scalar((layout.q_start - layout.k_start) as i64);
        let keys = Tensor::<1, Int>::arange(0..lk as i64, &device);
        let own =
            queries.clone().reshape([1, lq, 1]).expand([1, lq, lk]).equal(keys.reshape([1, 1, lk]).expand([1, lq, lk]));
        let mut hidden = own.expand([b, lq, lk]);
        if let Some(m) = seen {
            let [mb, _, _, _] = m.dims();
            hidden = hidden.bool_or(m.reshape([mb, lq, lk]).expand([b, lq, lk]));
        }
        let scores = scores.mask_fill(hidden.clone(), MASKED_SCORE);
        let k = self.edges.min(lk);
        let pick = if scores.is_autodiff() {
            let u: Tensor<3> = Tensor::random([b, lq, lk], Distribution::Uniform(1e-9, 1.0), &device);
            scores.clone().detach() + u.log().neg().log().neg()
        } else {
            scores.clone()
        };
        let (_, keys) = pick.topk_with_indices(k, 2);
        let empty = hidden.gather(2, keys.clone());
        Edges { keys, empty, scores, own: queries }
    }
}

/// log π of drawing `keys` (`[b, len_q, k]`, in drawing order) without replacement from
/// softmax(`scores`) (`[b, len_q, len_k]`), `empty` slots left out: per query, `[b, len_q, 1]`.
/// With p_u the drawn keys' probabilities under the full softmax, the t-th draw's probability
/// among the keys left is p_t / (1 − Σ_{u<t} p_u), so one softmax over the keys serves every draw.
pub fn plackett_luce(scores: Tensor<3>, keys: Tensor<3, Int>, empty: Tensor<3, Bool>) -> Tensor<3> {
    let picked = log_softmax(scores, 2).gather(2, keys).mask_fill(empty.clone(), 0.0);
    let p = picked.clone().exp().mask_fill(empty.clone(), 0.0);
    // the mass drawn before each draw: an exclusive running sum
    let before = p.clone().cumsum(2) - p;
    let left = before.neg().add_scalar(1.0).clamp_min(1e-12).log();
    (picked - left).mask_fill(empty, 0.0).sum_dim(2)
}

impl AttentionMechanism for SacAttention {
    /// Decoding state: [`SacState`].
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        SacAttention::forward(self, input, state.map(|s| s.get_or_default::<SacState>()))
    }

    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        let st = state.get_or_default::<SacState>();
        self.attention.project(x.clone(), None, mask, Some(&mut st.kv));
        let w = self.key_pointers(x);
        st.pointers.append(w.clone(), w);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use variorum_core::GraphMask;

    fn device() -> Device {
        Device::default()
    }

    fn layer(edges: usize, n_kv_heads: Option<usize>) -> SacAttention {
        let dev = device();
        dev.seed(3);
        SacConfig { edges, n_kv_heads, ..Default::default() }.init(32, 0.3, 0.3, Positioning::NONE, &dev)
    }

    fn ints(t: Tensor<3, Int>) -> Vec<i64> {
        t.into_data().convert::<i64>().try_into_vec::<i64>().unwrap()
    }

    /// The defining property: in evaluation each query's edges are the k best of the predictor's
    /// scores among the keys it may see (never a later one causally, never itself), and the layer
    /// is attention masked densely to those edges and the query itself.
    #[test]
    fn attention_runs_over_the_predicted_edges_only() {
        let dev = device();
        let x = Tensor::<3>::random([2, 12, 32], Distribution::Normal(0.0, 1.0), &dev);
        for kv in [None, Some(2)] {
            let att = layer(3, kv);
            for causal in [true, false] {
                let mask = if causal { AttentionMask::causal() } else { AttentionMask::bidirectional() };
                let p = att.attention.project(x.clone(), None, &mask, None);
                let edges = att.draw(x.clone(), att.key_pointers(x.clone()), &mask, &p);
                let keys = ints(edges.keys);
                let empty: Vec<bool> = ints(edges.empty.int()).into_iter().map(|e| e == 1).collect();
                let scores = edges.scores.into_data().try_to_vec::<f32>().unwrap();
                let mut rows = Vec::new();
                for r in 0..2 {
                    let mut adj = Vec::new();
                    for i in 0..12 {
                        let visible: Vec<usize> = (0..12).filter(|&j| j != i && (!causal || j < i)).collect();
                        let mut want = visible.clone();
                        let s = |j: usize| scores[(r * 12 + i) * 12 + j];
                        want.sort_by(|&a, &b| s(b).total_cmp(&s(a)));
                        want.truncate(3);
                        let at = (r * 12 + i) * 3;
                        let got: Vec<usize> =
                            (0..3).filter(|&t| !empty[at + t]).map(|t| keys[at + t] as usize).collect();
                        assert_eq!(got, want, "row {r} query {i} causal {causal}");
                        adj.push(got.iter().map(|&j| j as u32).collect::<Vec<u32>>());
                    }
                    rows.push(Arc::new(adj));
                }
                let out = att.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
                let dense = mask.clone().with_custom(GraphMask::new(rows).hidden(12, &dev));
                let want = att.attention.forward(AttentionInput::self_attention(x.clone(), &dense), None).context;
                let d = (out - want).abs().max().into_scalar::<f32>();
                assert!(d < 1e-5, "kv {kv:?} causal {causal}: {d}");
            }
        }
    }

    /// While training, the draws are random but never leave the keys a query may see: no later
    /// key causally, never the query itself, no key twice; and they differ from draw to draw.
    #[test]
    fn training_draws_stay_among_the_visible_keys() {
        let dev = device().autodiff();
        dev.seed(5);
        let att = SacConfig { edges: 3, ..Default::default() }.init(32, 0.3, 0.3, Positioning::NONE, &dev);
        let x = Tensor::<3>::random([2, 10, 32], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        let p = att.attention.project(x.clone(), None, &mask, None);
        let mut draws = Vec::new();
        for _ in 0..20 {
            let edges = att.draw(x.clone(), att.key_pointers(x.clone()), &mask, &p);
            let keys = ints(edges.keys);
            let empty: Vec<bool> = ints(edges.empty.int()).into_iter().map(|e| e == 1).collect();
            for q in 0..20 {
                let i = q % 10;
                let got: Vec<i64> = (0..3).filter(|&t| !empty[q * 3 + t]).map(|t| keys[q * 3 + t]).collect();
                assert_eq!(got.len(), i.min(3), "query {i}: {got:?}");
                assert!(got.iter().all(|&j| (j as usize) < i), "query {i} drew {got:?}");
                let mut distinct = got.clone();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(distinct.len(), got.len(), "query {i} drew a key twice: {got:?}");
            }
            draws.push(keys);
        }
        assert!(draws.iter().any(|d| *d != draws[0]), "every training draw was the same");
    }

    /// Drawing without replacement: log π of an ordered draw is Σ_t log of the drawn key's share
    /// of what was left, written out for one query.
    #[test]
    fn the_policy_is_plackett_luce() {
        let dev = device();
        let s = [0.5f32, -1.0, 2.0, 0.0];
        let scores = Tensor::<3>::from_data(TensorData::new(s.to_vec(), [1, 1, 4]), &dev);
        let keys = Tensor::<3, Int>::from_data(TensorData::new(vec![2i64, 0, 3], [1, 1, 3]), &dev);
        let none = Tensor::<3, Bool>::from_data(TensorData::new(vec![false, false, true], [1, 1, 3]), &dev);
        let got = plackett_luce(scores, keys, none).into_scalar::<f32>();
        let e: Vec<f64> = s.iter().map(|&v| (v as f64).exp()).collect();
        let total: f64 = e.iter().sum();
        // key 2 of all four, then key 0 of the three left; the third slot is empty
        let want = (e[2] / total).ln() + (e[0] / (total - e[2])).ln();
        assert!((got as f64 - want).abs() < 1e-5, "{got} vs {want}");
    }

    /// Cached decoding draws the same edges as the forward, one token at a time.
    #[test]
    fn decoding_equals_the_forward() {
        let dev = device();
        let x = Tensor::<3>::random([1, 10, 32], Distribution::Normal(0.0, 1.0), &dev);
        let att = layer(2, None);
        let whole = att.forward(AttentionInput::self_attention(x.clone(), &AttentionMask::causal()), None).context;
        let mut state = SacState::default();
        let mut parts = Vec::new();
        for (at, n) in [(0, 4), (4, 1), (5, 5)] {
            let m = AttentionMask::causal().at(at, 0);
            let chunk = x.clone().narrow(1, at, n);
            parts.push(att.forward(AttentionInput::self_attention(chunk, &m), Some(&mut state)).context);
        }
        let d = (whole - Tensor::cat(parts, 1)).abs().max().into_scalar::<f32>();
        assert!(d < 1e-5, "{d}");
    }
}
