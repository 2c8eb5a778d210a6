//! How a row of attention scores becomes weights: `model.attention.normaliser`, and a learned
//! temperature per head (`model.attention.head_temperature`), on every kind that forms scores.
//!
//! With s the scores of one query over the keys it may see (hidden keys hold
//! [`MASKED_SCORE`](crate::engine::normaliser::MASKED_SCORE), which every normaliser below maps to 0), L the model's
//! context length, and τ_h = exp(θ_h) the head's temperature where learned (s ← s / τ_h first):
//!
//! - softmax:     p_j = exp(s_j) / Σ_k exp(s_k)                                  (the default)
//! - ReLU:        p_j = max(s_j, 0) / L              (Wortsman et al. 2023, "Replacing softmax
//!   with ReLU in vision transformers": they divide by the sequence length; here the model's
//!   context length, a constant, so a cached decoder computes what the full forward does)
//! - sigmoid:     p_j = σ(s_j − ln L)                (Ramapuram et al. 2024, "Theory, analysis, and
//!   best practices for sigmoid self-attention": the bias b = −ln n, n the context length)
//! - sparsemax:   p = max(s − τ, 0), τ such that Σ_j p_j = 1     (Martins & Astudillo 2016)
//! - entmax-1.5:  p = max(s/2 − τ, 0)², τ such that Σ_j p_j = 1  (Peters, Niculae & Martins 2019)
//!
//! Sparsemax and entmax find τ exactly, by sorting (the closed forms of their papers): the support
//! is found on detached values, then τ is formed again from the support with differentiable ops,
//! which gives the papers' Jacobians (the support is locally constant). The fused CPU kernel takes
//! the same normalisers ([`RowNormaliser`]), so the fast path stays the fast path.

use burn::module::{Module, Param};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_kernels::normalisers::{RowNormaliser, normalise_scores};

/// Value written into hidden score entries. Finite, so a row whose keys are all hidden (a fully
/// padded row) gives a uniform distribution instead of NaN.
pub const MASKED_SCORE: f32 = -1.0e9;

/// `model.attention.normaliser`: how each row of scores becomes attention weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Normaliser {
    /// exp(s) / Σ exp(s).
    #[default]
    #[serde(rename = "softmax")]
    Softmax,
    /// max(s, 0) / L (L the context length).
    #[serde(rename = "relu")]
    Relu,
    /// σ(s − ln L).
    #[serde(rename = "sigmoid")]
    Sigmoid,
    /// Euclidean projection onto the simplex: rows sum to 1 with exact zeros.
    #[serde(rename = "sparsemax")]
    Sparsemax,
    /// α-entmax with α = 1.5: sparse like sparsemax, smoother.
    #[serde(rename = "entmax-1.5")]
    Entmax15,
}

impl Normaliser {
    /// The name in a config.
    pub fn name(self) -> &'static str {
        match self {
            Self::Softmax => "softmax",
            Self::Relu => "relu",
            Self::Sigmoid => "sigmoid",
            Self::Sparsemax => "sparsemax",
            Self::Entmax15 => "entmax-1.5",
        }
    }

    /// The normaliser of `n_heads` heads in a model of context length `context`, with a learned
    /// temperature per head (initially 1) where `head_temperature`.
    pub fn init(self, n_heads: usize, head_temperature: bool, context: usize, device: &Device) -> ScoreNormaliser {
        let l = context.max(1) as f32;
        let row = match self {
            Self::Softmax => RowNormaliser::Softmax,
            Self::Relu => RowNormaliser::Relu { scale: 1.0 / l },
            Self::Sigmoid => RowNormaliser::Sigmoid { bias: -l.ln() },
            Self::Sparsemax => RowNormaliser::Sparsemax,
            Self::Entmax15 => RowNormaliser::Entmax15,
        };
        ScoreNormaliser {
            log_temperature: head_temperature.then(|| Param::from_tensor(Tensor::zeros([n_heads], device))),
            row,
        }
    }
}

/// A built normaliser: the row function and, where learned, θ_h = ln τ_h per head.
#[derive(Module, Debug)]
pub struct ScoreNormaliser {
    /// θ, `[n_heads]`: the scores of head h are divided by exp(θ_h) before the row function.
    pub log_temperature: Option<Param<Tensor<1>>>,
    /// The row function from scores to weights ([`RowNormaliser`]), its constants set from the
    /// context length (ReLU's 1/L, sigmoid's −ln L).
    #[module(skip)]
    pub row: RowNormaliser,
}

impl ScoreNormaliser {
    /// Plain softmax, no temperature (what kinds without the option use).
    pub fn softmax() -> Self {
        Self { log_temperature: None, row: RowNormaliser::Softmax }
    }

    /// Weights from scores `[b, h, len_q, len_k]` (heads on axis 1, keys on axis 3; axis 1 may be
    /// 1 where no temperature is learned).
    pub fn forward(&self, scores: Tensor<4>) -> Tensor<4> {
        let scores = match &self.log_temperature {
            Some(theta) => {
                let h = theta.dims()[0];
                debug_assert_eq!(scores.dims()[1], h, "scores with the heads on axis 1");
                // hidden entries stay exactly MASKED_SCORE: scaled, a row of them would hand θ
                // rounding noise times 1e9 as gradient
                let hidden = scores.clone().lower_equal_elem(MASKED_SCORE / 2.0);
                (scores * theta.val().neg().exp().reshape([1, h, 1, 1])).mask_fill(hidden, MASKED_SCORE)
            }
            None => scores,
        };
        normalise_scores(scores, self.row)
    }

    /// The per-head factor 1/τ_h `[1, h, 1, 1]` the scores are multiplied by, where learned: the
    /// fused kernel gets it folded into the queries (s/τ = (q/τ)·k).
    pub fn query_factor(&self) -> Option<Tensor<4>> {
        self.log_temperature.as_ref().map(|theta| {
            let h = theta.dims()[0];
            theta.val().neg().exp().reshape([1, h, 1, 1])
        })
    }

    /// The learned temperatures τ_h, where there are any.
    pub fn temperatures(&self) -> Option<Vec<f32>> {
        self.log_temperature.as_ref().map(|t| t.val().exp().into_data().try_to_vec::<f32>().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use burn::tensor::activation::softmax;
    use variorum_kernels::normalisers::{entmax15_threshold, normalise_scores as normalise_rows, sparsemax_threshold};

    fn rows(dev: &Device, seed: u64) -> Tensor<4> {
        dev.seed(seed);
        let s: Tensor<4> = Tensor::random([2, 3, 4, 9], Distribution::Normal(0.0, 1.5), dev);
        // the last query hides its last three keys, as a causal mask does
        let hidden = Tensor::<4, Bool>::from_data(
            TensorData::new((0..9).map(|j| j >= 6).collect::<Vec<_>>(), [1, 1, 1, 9]),
            dev,
        );
        let last =
            s.clone().narrow(2, 3, 1).mask_fill(hidden.expand([2, 3, 1, 9]), crate::engine::normaliser::MASKED_SCORE);
        s.slice_assign([0..2, 0..3, 3..4, 0..9], last)
    }

    fn values(t: Tensor<4>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn sparsemax_rows_sum_to_one_with_exact_zeros_and_match_the_sorted_closed_form() {
        let dev = Device::flex();
        let s = rows(&dev, 1);
        let p = values(normalise_rows(s.clone(), RowNormaliser::Sparsemax));
        let s = values(s);
        let mut scratch = Vec::new();
        let mut zeros = 0;
        for (row, prob) in s.chunks(9).zip(p.chunks(9)) {
            let sum: f32 = prob.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "a row sums to {sum}");
            let tau = sparsemax_threshold(row, &mut scratch);
            for (&z, &q) in row.iter().zip(prob) {
                assert!((q - (z - tau).max(0.0)).abs() < 1e-5, "{q} vs max({z} − {tau}, 0)");
                if z <= tau {
                    assert_eq!(q, 0.0, "a key below τ must weigh exactly 0");
                    zeros += 1;
                }
            }
        }
        assert!(zeros > 24, "sparsemax should zero most of these rows ({zeros} zeros)");
    }

    #[test]
    fn sparsemax_of_two_scores_is_the_clipped_difference() {
        let dev = Device::flex();
        for (a, b) in [(0.3f32, 0.1f32), (2.0, 0.5), (-1.0, 1.5), (0.0, 0.0)] {
            let p = values(normalise_rows(Tensor::from_floats([[[[a, b]]]], &dev), RowNormaliser::Sparsemax));
            let want = ((a - b + 1.0) / 2.0).clamp(0.0, 1.0);
            assert!((p[0] - want).abs() < 1e-6 && (p[1] - (1.0 - want)).abs() < 1e-6, "{a}, {b}: {p:?}");
        }
    }

    /// τ of entmax-1.5 by bisection on f(τ) = Σ max(x − τ, 0)² − 1 (decreasing in τ, f(max − 1) ≥ 0,
    /// f(max) = −1): the reference the sorted closed form must match.
    fn bisection_tau(x: &[f32]) -> f32 {
        let top = x.iter().copied().fold(f32::MIN, f32::max) as f64;
        let (mut lo, mut hi) = (top - 1.0, top);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            let f: f64 = x.iter().map(|&v| (v as f64 - mid).max(0.0).powi(2)).sum::<f64>() - 1.0;
            if f > 0.0 { lo = mid } else { hi = mid }
        }
        (0.5 * (lo + hi)) as f32
    }

    #[test]
    fn entmax_matches_its_bisection_reference() {
        let dev = Device::flex();
        let s = rows(&dev, 2);
        let p = values(normalise_rows(s.clone(), RowNormaliser::Entmax15));
        for (row, prob) in values(s).chunks(9).zip(p.chunks(9)) {
            let x: Vec<f32> = row.iter().map(|z| z / 2.0).collect();
            let tau = bisection_tau(&x);
            let sum: f32 = prob.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "a row sums to {sum}");
            for (&xi, &q) in x.iter().zip(prob) {
                let want = (xi - tau).max(0.0).powi(2);
                assert!((q - want).abs() < 1e-5, "{q} vs {want}");
            }
            // and the kernel's sorted threshold agrees (in the x = s/2 scale)
            let kernel = entmax15_threshold(row, &mut Vec::new());
            assert!((kernel - tau).abs() < 1e-5, "kernel τ {kernel} vs bisection {tau}");
        }
    }

    /// The gradients autodiff gives through the re-formed τ are the papers' Jacobians.
    #[test]
    fn sparse_gradients_are_the_papers_jacobians() {
        let dev = Device::flex().autodiff();
        for entmax in [false, true] {
            let s = rows(&dev, 3).require_grad();
            let dp: Tensor<4> = Tensor::random([2, 3, 4, 9], Distribution::Normal(0.0, 1.0), &dev);
            let row = if entmax { RowNormaliser::Entmax15 } else { RowNormaliser::Sparsemax };
            let p = normalise_rows(s.clone(), row);
            let grads = (p.clone() * dp.clone()).sum().backward();
            let got = values(s.grad(&grads).unwrap().inner());
            let (p, dp) = (values(p.inner()), values(dp.inner()));
            for ((g, p), dp) in got.chunks(9).zip(p.chunks(9)).zip(dp.chunks(9)) {
                // w = √p (entmax) or the support indicator (sparsemax): ds = w∘dp − w (w·dp)/Σw
                let w: Vec<f32> = p
                    .iter()
                    .map(|&v| {
                        if entmax {
                            v.sqrt()
                        } else if v > 0.0 {
                            1.0
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let (wd, ws): (f32, f32) = (w.iter().zip(dp).map(|(a, b)| a * b).sum(), w.iter().sum());
                for j in 0..9 {
                    let want = w[j] * dp[j] - w[j] * wd / ws;
                    assert!((g[j] - want).abs() < 1e-4, "entmax {entmax}: {} vs {want}", g[j]);
                }
            }
        }
    }

    #[test]
    fn relu_and_sigmoid_are_their_formulas_and_hidden_keys_weigh_nothing() {
        let dev = Device::flex();
        let s = rows(&dev, 4);
        let n = Normaliser::Relu.init(3, false, 16, &dev);
        let p = values(n.forward(s.clone()));
        let m = Normaliser::Sigmoid.init(3, false, 16, &dev);
        let q = values(m.forward(s.clone()));
        for ((&z, &a), &b) in values(s).iter().zip(&p).zip(&q) {
            assert!((a - z.max(0.0) / 16.0).abs() < 1e-6);
            assert!((b - 1.0 / (1.0 + (-(z - 16f32.ln())).exp())).abs() < 1e-6);
            if z == crate::engine::normaliser::MASKED_SCORE {
                assert_eq!((a, b), (0.0, 0.0));
            }
        }
    }

    #[test]
    fn a_head_temperature_divides_that_heads_scores() {
        let dev = Device::flex();
        let s = rows(&dev, 5);
        let mut n = Normaliser::Softmax.init(3, true, 16, &dev);
        let tau = [1.0f32, 2.0, 0.5];
        n.log_temperature = Some(Param::from_tensor(Tensor::from_floats(tau.map(f32::ln), &dev)));
        let got = n.forward(s.clone());
        let by_hand = softmax(s * Tensor::<1>::from_floats(tau.map(|t| 1.0 / t), &dev).reshape([1, 3, 1, 1]), 3);
        assert!((got - by_hand).abs().max().into_scalar::<f32>() < 1e-6);
        assert_eq!(n.temperatures().unwrap().len(), 3);
    }

    #[test]
    fn a_row_with_every_key_hidden_is_uniform_under_the_sparse_normalisers() {
        let dev = Device::flex();
        let s = Tensor::<4>::full([1, 1, 1, 4], crate::engine::normaliser::MASKED_SCORE, &dev);
        for row in [RowNormaliser::Sparsemax, RowNormaliser::Entmax15] {
            let p = values(normalise_rows(s.clone(), row));
            assert!(p.iter().all(|&v| (v - 0.25).abs() < 1e-6), "{row:?}: {p:?}");
        }
    }

    #[test]
    fn config_names_round_trip() {
        for n in
            [Normaliser::Softmax, Normaliser::Relu, Normaliser::Sigmoid, Normaliser::Sparsemax, Normaliser::Entmax15]
        {
            let text = toml::to_string(&std::collections::BTreeMap::from([("n", n)])).unwrap();
            assert_eq!(text.trim(), format!("n = \"{}\"", n.name()));
            let back: std::collections::BTreeMap<String, Normaliser> = toml::from_str(&text).unwrap();
            assert_eq!(back["n"], n);
        }
    }
}
