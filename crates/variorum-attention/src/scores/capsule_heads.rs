//! Capsule-routing head aggregation, the `capsule-heads` kind (Li, Yang, Dou, Wang, Lyu, Tu 2019,
//! "Information Aggregation for Multi-Head Attention with Routing-by-Agreement"): multi-head
//! attention whose heads are combined by routing-by-agreement instead of concatenation. The H
//! heads' outputs at a position are the input capsules Ω_h (d_h each); each votes for each of N
//! output capsules through its own transform, and an iterative routing decides how much of each
//! part goes to each whole:
//!
//! V_{h→n} = Ω_h W_{h,n},    O = concat_n(Ω_n^out) W_O.
//!
//! Dynamic routing (Sabour, Frosst, Hinton 2017), T iterations from B = 0:
//!
//! C_{h,n} = softmax_n(B_{h,n}),   Ω_n^out = squash(Σ_h C_{h,n} V_{h→n}),
//! B_{h,n} += V_{h→n} · Ω_n^out   (not after the last),   squash(s) = |s|² / (1 + |s|²) · s / |s|.
//!
//! EM routing (Hinton, Sabour, Frosst 2018), T iterations from R = 1/N, with input activations
//! a_h = σ(w_h · Ω_h + c_h):
//!
//! M-step:  R' = R ∘ a,  S_n = Σ_h R'_{h,n},  μ_n = Σ_h R'_{h,n} V_{h→n} / S_n,
//!          σ_n² = Σ_h R'_{h,n} (V_{h→n} − μ_n)² / S_n,   a_n = σ(λ (β_a − Σ_d (β_u + ln σ_n,d) S_n));
//! E-step:  R_{h,n} = softmax_n(ln a_n + Σ_d ln N(V_{h→n,d}; μ_n,d, σ_n,d))   (not after the last),
//! and Ω_n^out = μ_n.
//!
//! Choices where the papers leave one open: N and the capsule size default to the heads' (H and
//! d_h), so W_O keeps its shape; the votes start at the identity for n = h plus a small random
//! part (std 0.02), so training starts near concatenation; EM's λ is fixed at 0.01 (Hinton et al.
//! anneal it; a fixed value keeps the forward deterministic across steps), its input activations
//! start at σ(0) = ½ for every head, and the output capsule is its pose μ_n (the activation a_n
//! acts through the routing). Routing is per position, so causality and cached decoding are those
//! of `full`, on its fast paths: the heads' contexts come from [`MultiHeadAttention::attend_heads`].

use burn::module::Param;
use burn::nn::{Initializer, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{log_sigmoid, sigmoid, softmax};
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};
use variorum_position::{PositionConfig, RotaryConfig};

use crate::cache::KvCache;
use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::engine::heads::MultiHeadAttention;
use crate::kind::{AttentionKind, AttentionMechanism, TestVariant, caps};

/// How the heads' outputs are routed to the output capsules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum CapsuleRouting {
    /// Sabour et al. 2017: coupling coefficients from agreement (dot products).
    #[default]
    #[serde(rename = "dynamic")]
    Dynamic,
    /// Hinton et al. 2018: a Gaussian mixture fitted by EM, with capsule activations.
    #[serde(rename = "em")]
    Em,
}

/// λ of EM routing's output activations (see the module doc).
const EM_LAMBDA: f64 = 0.01;

attention_config! {
    /// `model.attention` with `kind = "capsule-heads"`.
    pub struct CapsuleHeadsConfig {
        /// "dynamic" (default) or "em".
        pub routing: CapsuleRouting = CapsuleRouting::Dynamic,
        /// T, routing iterations. Default 3.
        pub iterations: usize = 3,
        /// N, output capsules. Default `n_heads`.
        pub capsules: Option<usize> = None,
        /// Size of each output capsule. Default the head size.
        pub capsule_dim: Option<usize> = None,
    }
}

impl CapsuleHeadsConfig {
    /// (N, capsule size) for a model of width `d_model`.
    fn capsule_shape(&self, d_model: usize) -> (usize, usize) {
        let heads = self.heads();
        (self.capsules.unwrap_or(self.n_heads), self.capsule_dim.unwrap_or(heads.head_dim(d_model)))
    }

    /// The layer for `d_model`: `full`'s heads with W_O from the N capsules, the votes at the
    /// identity plus N(0, 0.02²), and for EM activation weights and β's at zero.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> CapsuleHeadsAttention {
        let mut attention = self.heads().init(d_model, init_std, out_std, position, device);
        let (h, dh) = (self.n_heads, self.heads().head_dim(d_model));
        let (n, dc) = self.capsule_shape(d_model);
        attention.out = LinearConfig::new(n * dc, d_model)
            .with_bias(self.bias)
            .with_initializer(Initializer::Normal { mean: 0.0, std: out_std })
            .init(device);
        // W_{h,n}: the identity where head h meets capsule h (as far as the sizes allow), so the
        // layer starts near concatenation, plus a small random part that lets capsules differ
        let identity: Vec<f32> = (0..h)
            .flat_map(|hi| (0..dh).flat_map(move |i| (0..n).flat_map(move |ni| (0..dc).map(move |j| (hi, i, ni, j)))))
            .map(|(hi, i, ni, j)| if hi == ni && i == j { 1.0 } else { 0.0 })
            .collect();
        let identity =
            Tensor::<1>::from_data(TensorData::new(identity, [h * dh * n * dc]), device).reshape([h, dh, n * dc]);
        let noise = Tensor::<3>::random([h, dh, n * dc], burn::tensor::Distribution::Normal(0.0, 0.02), device);
        let em = self.routing == CapsuleRouting::Em;
        let zeros = |shape: [usize; 2]| Param::from_tensor(Tensor::<2>::zeros(shape, device));
        CapsuleHeadsAttention {
            attention,
            votes: Param::from_tensor(identity + noise),
            activation: em.then(|| zeros([h, dh + 1])),
            betas: em.then(|| zeros([2, n])),
            routing: self.routing,
            iterations: self.iterations,
            capsules: n,
            capsule_dim: dc,
        }
    }
}

impl AttentionKind for CapsuleHeadsConfig {
    type Module = CapsuleHeadsAttention;
    const SUMMARY: &'static str = "capsule-routing head aggregation: the heads' outputs routed to output capsules by dynamic or EM routing-by-agreement instead of concatenation; KV cache";
    const PAPER: &'static str = "Li, Yang, Dou, Wang, Lyu, Tu 2019, Information Aggregation for Multi-Head Attention with Routing-by-Agreement; Sabour et al. 2017; Hinton et al. 2018";
    const CAPS: variorum_core::Capabilities = caps::CROSS_SCORES;
    head_kind_items!();

    fn expanded(&self, d_model: usize) -> Self {
        let (n, dc) = self.capsule_shape(d_model);
        Self { capsules: Some(n), capsule_dim: Some(dc), ..self.expanded_heads(d_model) }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.iterations >= 1, || "model.attention.iterations must be at least 1".into())?;
        check(self.capsules != Some(0), || "model.attention.capsules must be at least 1".into())?;
        check(self.capsule_dim != Some(0), || "model.attention.capsule_dim must be at least 1".into())
    }

    /// Full attention's, with the output projection from N capsules, plus the votes (H·d_h by
    /// N·d_c) and T routing iterations over the H × N votes (a few passes each).
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        let heads = self.heads();
        let (h, dh) = (self.n_heads as u64, heads.head_dim(d_model) as u64);
        let (n, dc) = self.capsule_shape(d_model);
        let (n, dc, d) = (n as u64, dc as u64, d_model as u64);
        let passes = if self.routing == CapsuleRouting::Em { 8 } else { 4 };
        heads.flops_per_token(d_model, len_k) - 2 * h * dh * d
            + 2 * n * dc * d
            + 2 * h * dh * n * dc
            + self.iterations as u64 * passes * h * n * dc
    }

    fn scores_every_key(&self) -> bool {
        true
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        let em = Self { routing: CapsuleRouting::Em, ..Self::default() };
        vec![
            TestVariant::new("dynamic", Self::default()),
            TestVariant::new("em", em.clone()),
            TestVariant::new(
                "dynamic, 2 capsules of 12",
                Self { capsules: Some(2), capsule_dim: Some(12), ..Self::default() },
            ),
            TestVariant::new("em, grouped-query + position rope", Self { n_kv_heads: Some(2), ..em })
                .with_position(PositionConfig::Rope(RotaryConfig::default())),
            TestVariant::new("dynamic, bidirectional", Self::default()).masked(),
        ]
    }
}

/// Multi-head attention whose heads are routed by agreement (dynamic or EM) to N output
/// capsules instead of concatenated.
#[derive(Module, Debug)]
pub struct CapsuleHeadsAttention {
    /// Projections, scores and the heads' contexts; its `out` is W_O from the N capsules.
    pub attention: MultiHeadAttention,
    /// W_{h,n}, `[H, d_h, N · d_c]`.
    pub votes: Param<Tensor<3>>,
    /// EM: [w_h | c_h] of the input activations, `[H, d_h + 1]`.
    pub activation: Option<Param<Tensor<2>>>,
    /// EM: [β_u; β_a], `[2, N]`.
    pub betas: Option<Param<Tensor<2>>>,
    /// Dynamic or EM routing.
    #[module(skip)]
    pub routing: CapsuleRouting,
    /// T, routing iterations.
    pub iterations: usize,
    /// N, output capsules.
    pub capsules: usize,
    /// d_c, the size of each output capsule.
    pub capsule_dim: usize,
}

impl CapsuleHeadsAttention {
    /// The heads' contexts as `full` forms them (after `cache`'s keys), routed to the output; the
    /// weights are the heads' attention weights.
    pub fn forward(&self, input: AttentionInput, cache: Option<&mut KvCache>) -> AttentionOutput {
        let (heads, weights) = self.attention.attend_heads(input, cache);
        AttentionOutput { context: self.aggregate(heads), weights, aux_losses: Vec::new() }
    }

    /// The heads' contexts side by side `[b, L, H · d_h]` to the layer's output `[b, L, d_model]`.
    pub fn aggregate(&self, heads: Tensor<3>) -> Tensor<3> {
        let [b, l, _] = heads.dims();
        let [h, dh, _] = self.votes.dims();
        let (n, dc) = (self.capsules, self.capsule_dim);
        // input capsules [H, b·L, d_h]; votes [b·L, H, N, d_c]
        let u = heads.reshape([b * l, h, dh]).swap_dims(0, 1);
        let votes = u.clone().matmul(self.votes.val()).reshape([h, b * l, n, dc]).swap_dims(0, 1);
        let capsules = match (&self.activation, &self.betas) {
            (Some(w), Some(betas)) => {
                // a_h = σ(w_h · Ω_h + c_h), [b·L, H]
                let w = w.val();
                let (weight, bias) = (w.clone().narrow(1, 0, dh), w.narrow(1, dh, 1));
                let logits = (u * weight.unsqueeze_dim::<3>(1)).sum_dim(2) + bias.unsqueeze_dim::<3>(1);
                let activations = sigmoid(logits.reshape([h, b * l]).swap_dims(0, 1));
                em_routing(votes, activations, betas.val(), self.iterations).0
            }
            _ => dynamic_routing(votes, self.iterations).0,
        };
        variorum_kernels::linear::forward(&self.attention.out, capsules.reshape([b, l, n * dc]))
    }
}

/// squash(s) = |s|² / (1 + |s|²) · s / |s| over the last axis (ε inside the root keeps the
/// gradient at s = 0 finite).
pub fn squash(s: Tensor<4>) -> Tensor<4> {
    let sq = s.clone().powf_scalar(2.0).sum_dim(3);
    let factor = sq.clone().add_scalar(1e-8).sqrt() / sq.add_scalar(1.0);
    s * factor
}

/// Dynamic routing of votes `[m, H, N, d_c]` (m positions): the output capsules `[m, N, d_c]`
/// and the last coupling coefficients C `[m, H, N]`.
pub fn dynamic_routing(votes: Tensor<4>, iterations: usize) -> (Tensor<3>, Tensor<3>) {
    let [m, h, n, dc] = votes.dims();
    let mut logits: Tensor<4> = Tensor::zeros([m, h, n, 1], &votes.device());
    let mut step = 0;
    loop {
        let coupling = softmax(logits.clone(), 2);
        let out = squash((coupling.clone() * votes.clone()).sum_dim(1)); // [m, 1, N, d_c]
        step += 1;
        if step == iterations {
            return (out.reshape([m, n, dc]), coupling.reshape([m, h, n]));
        }
        logits = logits + (votes.clone() * out).sum_dim(3);
    }
}

/// EM routing of votes `[m, H, N, d_c]` with input activations `[m, H]` and [β_u; β_a] `[2, N]`:
/// the output capsules (poses μ) `[m, N, d_c]` and the last assignments R `[m, H, N]`.
pub fn em_routing(
    votes: Tensor<4>,
    activations: Tensor<2>,
    betas: Tensor<2>,
    iterations: usize,
) -> (Tensor<3>, Tensor<3>) {
    let [m, h, n, dc] = votes.dims();
    let a_in = activations.reshape([m, h, 1, 1]);
    let beta_u = betas.clone().narrow(0, 0, 1).reshape([1, 1, n, 1]);
    let beta_a = betas.narrow(0, 1, 1).reshape([1, 1, n, 1]);
    let mut r: Tensor<4> = Tensor::full([m, h, n, 1], 1.0 / n as f32, &votes.device());
    let half_ln_2pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
    let mut step = 0;
    loop {
        // M-step
        let weighted = r.clone() * a_in.clone(); // [m, H, N, 1]
        let total = weighted.clone().sum_dim(1).add_scalar(1e-8); // [m, 1, N, 1]
        let share = weighted / total.clone();
        let mu = (share.clone() * votes.clone()).sum_dim(1); // [m, 1, N, d_c]
        step += 1;
        if step == iterations {
            return (mu.reshape([m, n, dc]), r.reshape([m, h, n]));
        }
        let var = (share * (votes.clone() - mu.clone()).powf_scalar(2.0)).sum_dim(1).add_scalar(1e-6);
        let ln_sigma = var.clone().log().mul_scalar(0.5); // [m, 1, N, d_c]
        let cost = ((ln_sigma.clone() + beta_u.clone()) * total).sum_dim(3); // [m, 1, N, 1]
        let ln_a_out = log_sigmoid((beta_a.clone() - cost).mul_scalar(EM_LAMBDA));
        // E-step: ln a_n + Σ_d ln N(V; μ, σ), normalised over the capsules
        let ln_p = ((votes.clone() - mu).powf_scalar(2.0) / var.mul_scalar(2.0)).neg() - ln_sigma;
        let ln_p = ln_p.sum_dim(3).sub_scalar(half_ln_2pi * dc as f64);
        r = softmax(ln_p + ln_a_out, 2);
    }
}

impl AttentionMechanism for CapsuleHeadsAttention {
    kv_cache_hooks!();

    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.aggregate(self.attention.content_only_heads(query, key_value))
    }

    fn uses_dense_mask(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use variorum_core::AttentionMask;

    const D: usize = 16;

    fn layer(routing: CapsuleRouting, iterations: usize, dev: &Device) -> CapsuleHeadsAttention {
        let cfg = CapsuleHeadsConfig { routing, iterations, ..Default::default() };
        cfg.validate(D).unwrap();
        let mut layer = cfg.init(D, 0.3, 0.3, Positioning::NONE, dev);
        // identity votes: capsule n hears head n's output unchanged, and every other head's too
        let [h, dh, _] = layer.votes.dims();
        let eye = Tensor::<2>::eye(dh, dev).unsqueeze_dim::<3>(0).expand([h, dh, dh]);
        layer.votes = Param::from_tensor(Tensor::cat(vec![eye; h], 2));
        layer
    }

    fn max_diff<const N: usize>(a: Tensor<N>, b: Tensor<N>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    /// EM routing (Hinton et al. 2018, Procedure 1) written out in f64 for one group of votes:
    /// the M-step's means, variances, cost (ln σ + β_u)·Σ R a and activation
    /// ln σ(λ(β_a − cost)), and the E-step's Gaussian log-likelihoods plus ln a, normalised over
    /// the capsules; three iterations, so the activation reaches the poses twice.
    #[test]
    fn em_routing_is_procedure_one_by_hand() {
        let dev = Device::flex();
        let (h, n, dc) = (3, 2, 2);
        let votes: Vec<f64> = (0..h * n * dc).map(|i| ((i * 37 % 11) as f64 - 5.0) / 3.0).collect();
        let act = [0.9, 0.3, 0.6];
        let betas = [[2.0, -3.0], [5.0, -5.0]]; // [β_u; β_a]
        let tensor = |v: Vec<f64>, shape: [usize; 4]| {
            Tensor::<4>::from_data(TensorData::new(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape), &dev)
        };
        let (mu, r) = em_routing(
            tensor(votes.clone(), [1, h, n, dc]),
            tensor(act.to_vec(), [1, 1, 1, h]).reshape([1, h]),
            tensor(betas.iter().flatten().copied().collect(), [1, 1, 2, n]).reshape([2, n]),
            3,
        );
        let v = |i: usize, j: usize, d: usize| votes[(i * n + j) * dc + d];
        let mut rr = vec![vec![1.0 / n as f64; n]; h];
        let (mut want_mu, mut want_r) = (vec![0.0; n * dc], rr.clone());
        for step in 1..=3 {
            let mut ln_p = vec![vec![0.0; n]; h];
            for j in 0..n {
                let total: f64 = (0..h).map(|i| rr[i][j] * act[i]).sum::<f64>() + 1e-8;
                let share: Vec<f64> = (0..h).map(|i| rr[i][j] * act[i] / total).collect();
                let mu: Vec<f64> = (0..dc).map(|d| (0..h).map(|i| share[i] * v(i, j, d)).sum()).collect();
                want_mu[j * dc..(j + 1) * dc].copy_from_slice(&mu);
                let var: Vec<f64> = (0..dc)
                    .map(|d| (0..h).map(|i| share[i] * (v(i, j, d) - mu[d]).powi(2)).sum::<f64>() + 1e-6)
                    .collect();
                let cost: f64 = (0..dc).map(|d| (0.5 * var[d].ln() + betas[0][j]) * total).sum();
                let a_out = 1.0 / (1.0 + (-(EM_LAMBDA * (betas[1][j] - cost))).exp());
                for i in 0..h {
                    let ll: f64 = (0..dc)
                        .map(|d| {
                            -(v(i, j, d) - mu[d]).powi(2) / (2.0 * var[d])
                                - 0.5 * var[d].ln()
                                - 0.5 * (2.0 * std::f64::consts::PI).ln()
                        })
                        .sum();
                    ln_p[i][j] = ll + a_out.ln();
                }
            }
            if step == 3 {
                want_r = rr.clone();
                break;
            }
            for i in 0..h {
                let top = ln_p[i].iter().copied().fold(f64::MIN, f64::max);
                let z: f64 = ln_p[i].iter().map(|l| (l - top).exp()).sum();
                rr[i] = ln_p[i].iter().map(|l| (l - top).exp() / z).collect();
            }
        }
        let got_mu = mu.into_data().try_to_vec::<f32>().unwrap();
        let got_r = r.into_data().try_to_vec::<f32>().unwrap();
        for (g, w) in got_mu.iter().zip(&want_mu) {
            assert!((*g as f64 - w).abs() < 1e-4, "poses {got_mu:?} vs {want_mu:?}");
        }
        for (g, w) in got_r.iter().zip(want_r.iter().flatten()) {
            assert!((*g as f64 - w).abs() < 1e-4, "assignments {got_r:?} vs {want_r:?}");
        }
        // the assignments moved away from uniform: the test reads the E-step
        assert!(want_r.iter().flatten().any(|&x| (x - 0.5).abs() > 0.05), "{want_r:?}");
    }

    /// One iteration from uniform logits: every head counts alike, so each output capsule is the
    /// mean of the heads (squashed, for dynamic routing; EM's pose is the activation-weighted
    /// mean, and the activations start equal).
    #[test]
    fn one_iteration_from_uniform_logits_is_the_mean_of_the_heads() {
        let dev = Device::flex();
        dev.seed(5);
        let x = Tensor::<3>::random([2, 5, D], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        for routing in [CapsuleRouting::Dynamic, CapsuleRouting::Em] {
            let layer = layer(routing, 1, &dev);
            let (heads, _) = layer.attention.attend_heads(AttentionInput::self_attention(x.clone(), &mask), None);
            let mean = heads.clone().reshape([2, 5, 4, 4]).mean_dim(2); // [b, L, 1, d_h]
            let mean = if routing == CapsuleRouting::Dynamic {
                squash(mean.reshape([1, 10, 1, 4])).reshape([2, 5, 1, 4])
            } else {
                mean
            };
            let want =
                variorum_kernels::linear::forward(&layer.attention.out, mean.expand([2, 5, 4, 4]).reshape([2, 5, 16]));
            let got = layer.forward(AttentionInput::self_attention(x.clone(), &mask), None).context;
            let d = max_diff(got, want);
            assert!(d < 1e-5, "{routing:?}: off the mean of the heads by {d}");
        }
    }

    /// Votes where three heads agree and one points the other way: routing moves the outlier's
    /// share away from the capsule the others agree on, and that capsule ends nearer the
    /// agreeing votes than their plain mean.
    #[test]
    fn routing_follows_agreement() {
        let dev = Device::flex();
        let agree = [0.8f32, 0.6, 0.2, -0.3];
        let nudge = [[0.05f32, -0.03, 0.02, 0.0], [-0.04, 0.02, 0.0, 0.03], [0.0, 0.0, -0.03, -0.02]];
        // capsule 0: heads 0–2 vote `agree` (nudged apart), head 3 votes −`agree`; capsule 1:
        // the heads vote ±`other` in turn, so every head sits as far from its mean
        let other = [0.3f32, -0.2, 0.4, 0.1];
        let mut votes = Vec::new();
        for h in 0..4 {
            let first: Vec<f32> = if h < 3 {
                agree.iter().zip(nudge[h]).map(|(a, e)| a + e).collect()
            } else {
                agree.iter().map(|a| -a).collect()
            };
            let sign = if h % 2 == 0 { 1.0 } else { -1.0 };
            votes.extend(first);
            votes.extend(other.iter().map(|o| sign * o));
        }
        let votes = Tensor::<1>::from_floats(votes.as_slice(), &dev).reshape([1, 4, 2, 4]);
        let agree_t = Tensor::<1>::from_floats(agree, &dev);
        let first_votes = votes.clone().narrow(2, 0, 1).reshape([4, 4]);
        let plain_mean = first_votes.mean_dim(0).reshape([4]);
        let mean_along = (plain_mean * agree_t.clone()).sum().into_scalar::<f32>();
        for routing in [CapsuleRouting::Dynamic, CapsuleRouting::Em] {
            let (out, share) = match routing {
                CapsuleRouting::Dynamic => dynamic_routing(votes.clone(), 3),
                CapsuleRouting::Em => {
                    em_routing(votes.clone(), Tensor::ones([1, 4], &dev), Tensor::zeros([2, 2], &dev), 3)
                }
            };
            let share = share.reshape([4, 2]).into_data().try_to_vec::<f32>().unwrap();
            for h in 0..3 {
                assert!(share[3 * 2] < share[h * 2] - 0.05, "{routing:?}: the outlier keeps its share ({share:?})");
            }
            let first = out.narrow(1, 0, 1).reshape([4]);
            let along = (first * agree_t.clone()).sum().into_scalar::<f32>();
            if routing == CapsuleRouting::Em {
                // EM's pose is a weighted mean of the votes: nearer `agree` than the plain mean
                assert!(along > mean_along + 0.05, "{routing:?}: {along} vs the mean's {mean_along}");
            } else {
                // squash shrinks lengths: compare directions instead
                assert!(along > 0.0, "{routing:?}: the capsule turned against the majority ({along})");
            }
        }
    }

    #[test]
    fn squash_keeps_the_direction_and_bounds_the_length() {
        let dev = Device::flex();
        let s = Tensor::<4>::from_floats([[[[3.0f32, 4.0], [0.0, 0.0]]]], &dev);
        let v = squash(s).into_data().try_to_vec::<f32>().unwrap();
        // |s| = 5: length 25/26, along (0.6, 0.8); the zero vector stays zero
        assert!((v[0] - 0.6 * 25.0 / 26.0).abs() < 1e-5 && (v[1] - 0.8 * 25.0 / 26.0).abs() < 1e-5, "{v:?}");
        assert_eq!(&v[2..], &[0.0, 0.0]);
    }

    #[test]
    fn gradients_reach_the_votes_and_the_em_parameters() {
        let dev = Device::flex().autodiff();
        let layer = CapsuleHeadsConfig { routing: CapsuleRouting::Em, ..Default::default() }.init(
            D,
            0.3,
            0.3,
            Positioning::NONE,
            &dev,
        );
        let x = Tensor::<3>::random([1, 4, D], Distribution::Normal(0.0, 1.0), &dev);
        let out = layer.forward(AttentionInput::self_attention(x, &AttentionMask::causal()), None);
        let grads = out.context.powf_scalar(2.0).sum().backward();
        for (name, g) in [
            ("votes", layer.votes.grad(&grads).map(|g| g.abs().sum().into_scalar::<f32>())),
            (
                "activations",
                layer.activation.as_ref().unwrap().grad(&grads).map(|g| g.abs().sum().into_scalar::<f32>()),
            ),
            ("betas", layer.betas.as_ref().unwrap().grad(&grads).map(|g| g.abs().sum().into_scalar::<f32>())),
        ] {
            assert!(g.is_some_and(|g| g > 0.0), "no gradient reaches the {name}");
        }
    }
}
