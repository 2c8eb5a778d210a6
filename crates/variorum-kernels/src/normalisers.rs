//! What turns a row of attention scores s (the keys a query sees) into its weights p: softmax, or
//! one of the alternatives below, pointwise (ReLU, sigmoid) or sparse (sparsemax, entmax-1.5).
//! The sparse ones need a threshold τ per row, found here exactly by sorting the row; the attention
//! kernel (`causal_attention`) saves it in place of softmax's log-sum-exp for the backward pass.
//! The row functions are plain f32 code and [`normalise_scores`] is Burn's ops, both compiled with
//! or without the `flex` feature.

use burn::prelude::*;
use burn::tensor::activation::{relu, sigmoid, softmax};

/// The map from a row of scores s to attention weights p.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowNormaliser {
    /// p_j = exp(s_j) / Σ_i exp(s_i).
    Softmax,
    /// ReLU attention, p_j = scale · max(s_j, 0). Wortsman et al. 2023 divide by the sequence
    /// length: the caller passes scale = 1/L.
    Relu {
        /// The factor on max(s_j, 0).
        scale: f32,
    },
    /// Sigmoid attention (Ramapuram et al. 2024), p_j = σ(s_j + bias) = 1 / (1 + e^{−(s_j + bias)});
    /// the caller chooses the bias, −ln L in the paper.
    Sigmoid {
        /// Added to every score before σ.
        bias: f32,
    },
    /// Sparsemax (Martins & Astudillo 2016), p_j = max(s_j − τ, 0) with τ such that Σ_j p_j = 1
    /// ([`sparsemax_threshold`]).
    Sparsemax,
    /// Entmax-1.5 (Peters, Niculae & Martins 2019), p_j = max(s_j/2 − τ, 0)² with τ such that
    /// Σ_j p_j = 1 ([`entmax15_threshold`], τ in the s/2 scale).
    Entmax15,
}

impl RowNormaliser {
    /// Whether each row needs a threshold τ found by sorting it (sparsemax, entmax-1.5).
    pub fn needs_threshold(self) -> bool {
        matches!(self, RowNormaliser::Sparsemax | RowNormaliser::Entmax15)
    }

    /// Whether adding one constant to a whole row of scores leaves its weights as they are:
    /// softmax (the constant cancels in the ratio) and sparsemax and entmax-1.5 (their
    /// threshold τ moves with it); not ReLU or sigmoid, which read each score alone.
    pub fn ignores_row_shifts(self) -> bool {
        matches!(self, RowNormaliser::Softmax | RowNormaliser::Sparsemax | RowNormaliser::Entmax15)
    }
}

/// `values` into `scratch`, sorted descending (`scratch` keeps its allocation from row to row).
fn sorted_descending(values: impl Iterator<Item = f32>, scratch: &mut Vec<f32>) {
    scratch.clear();
    scratch.extend(values);
    scratch.sort_unstable_by(|a, b| b.total_cmp(a));
}

/// Sparsemax's threshold of a row z, exactly, by sorting a copy descending (into `scratch`):
///
/// k(z) = max{k : 1 + k · z_(k) > Σ_{j≤k} z_(j)},   τ = (Σ_{j≤k(z)} z_(j) − 1) / k(z),
///
/// so that Σ_j max(z_j − τ, 0) = 1. The cumulative sums are accumulated in f64 (masked keys at
/// −1e9 next to scores near 1 lose nothing). An empty row gives 0.
pub fn sparsemax_threshold(row: &[f32], scratch: &mut Vec<f32>) -> f32 {
    if row.is_empty() {
        return 0.0;
    }
    sorted_descending(row.iter().copied(), scratch);
    // k = 1 always qualifies (1 + z_(1) > z_(1))
    let (mut cum, mut support, mut support_sum) = (0.0f64, 1usize, scratch[0] as f64);
    for (i, &z) in scratch.iter().enumerate() {
        let k = i + 1;
        cum += z as f64;
        if 1.0 + k as f64 * z as f64 > cum {
            (support, support_sum) = (k, cum);
        }
    }
    ((support_sum - 1.0) / support as f64) as f32
}

/// Entmax-1.5's threshold of a row of scores s, exactly, by the sort-based algorithm of Peters,
/// Niculae & Martins (2019): with x = s/2 sorted descending (into `scratch`), for k = 1..n
///
/// mean_k = Σ_{j≤k} x_(j) / k,   ss_k = Σ_{j≤k} x_(j)² − k · mean_k²,   δ_k = (1 − ss_k) / k,
/// τ_k = mean_k − √max(δ_k, 0),
///
/// the support size is K = #{k : τ_k ≤ x_(k)} and τ = τ_K: the τ with Σ_j max(x_j − τ, 0)² = 1.
/// τ is in the x = s/2 scale: p_j = max(s_j/2 − τ, 0)². The cumulative sums are f64 (ss_k is a
/// difference of two large sums). An empty row gives 0.
pub fn entmax15_threshold(row: &[f32], scratch: &mut Vec<f32>) -> f32 {
    if row.is_empty() {
        return 0.0;
    }
    sorted_descending(row.iter().map(|&s| 0.5 * s), scratch);
    let (mut sum, mut sum_sq, mut support) = (0.0f64, 0.0f64, 0usize);
    for (i, slot) in scratch.iter_mut().enumerate() {
        let (k, x) = ((i + 1) as f64, *slot as f64);
        sum += x;
        sum_sq += x * x;
        let mean = sum / k;
        let ss = sum_sq - k * mean * mean;
        let tau = mean - ((1.0 - ss) / k).max(0.0).sqrt();
        if tau <= x {
            support += 1;
        }
        // x_(k) is in the sums now: τ_k takes its place, for τ_K below
        *slot = tau as f32;
    }
    // k = 1 always qualifies (τ_1 = x_(1) − 1), so K ≥ 1
    scratch[support.max(1) - 1]
}

/// `row` over axis 3 of `scores` `[b, h, len_q, len_k]` with Burn's ops, differentiable: the
/// composed path of every backend (the kernel has its own), and the kernel's test reference.
pub fn normalise_scores(scores: Tensor<4>, row: RowNormaliser) -> Tensor<4> {
    match row {
        RowNormaliser::Softmax => softmax(scores, 3),
        RowNormaliser::Relu { scale } => relu(scores).mul_scalar(scale),
        RowNormaliser::Sigmoid { bias } => sigmoid(scores.add_scalar(bias)),
        RowNormaliser::Sparsemax => sparse_rows(scores, false),
        RowNormaliser::Entmax15 => sparse_rows(scores, true),
    }
}

/// Sparsemax (`entmax` false) or entmax-1.5 over axis 3.
///
/// The support comes from the sorted, detached row (sparsemax: k(z) = max{k : 1 + k·z₍ₖ₎ > Σ_{j≤k}
/// z₍ⱼ₎}; entmax-1.5 with x = s/2: τ_k = mean_k − √((1 − ss_k)/k) over the k largest, support size
/// = #{k : τ_k ≤ x₍ₖ₎}). τ is then formed again from the support with tracked ops — sparsemax τ =
/// (Σ_S z − 1)/|S|, entmax τ = mean_S x − √((1 − Σ_S (x − mean)²)/|S|) — so autodiff gives the
/// papers' Jacobians: sparsemax ∂p/∂z = diag(s) − s sᵀ/|S| (s the support indicator), entmax
/// ∂p/∂s = diag(√p) − √p √pᵀ / Σ√p.
fn sparse_rows(scores: Tensor<4>, entmax: bool) -> Tensor<4> {
    let [b, h, lq, n] = scores.dims();
    let device = scores.device();
    // translation invariant: the detached row maximum out first keeps hidden keys (−1e9) far
    // below and a row whose keys are all hidden at 0 (uniform weights, as softmax gives)
    let top = scores.clone().detach().max_dim(3);
    let z = scores - top;
    let x = if entmax { z.mul_scalar(0.5) } else { z };

    // no key below max − 1 (in x) is in either support, so the search may clamp there: the f32
    // cumulative sums then never meet thousands of hidden keys' −1e9 (or their squares)
    let sorted = x.clone().detach().clamp_min(-2.0).sort_descending(3);
    let k = Tensor::<1, Int>::arange(1..n as i64 + 1, &device).float().reshape([1, 1, 1, n]);
    let cumsum = sorted.clone().cumsum(3);
    let (in_support, tau_k) = if entmax {
        let mean = cumsum / k.clone();
        let mean_sq = sorted.clone().powf_scalar(2.0).cumsum(3) / k.clone();
        let ss = (mean_sq - mean.clone().powf_scalar(2.0)) * k.clone();
        let delta = (ss.neg().add_scalar(1.0) / k).clamp_min(0.0);
        let tau = mean - delta.sqrt();
        (tau.clone().lower_equal(sorted), tau)
    } else {
        let tau = (cumsum.clone().sub_scalar(1.0)) / k.clone();
        ((k * sorted).add_scalar(1.0).greater(cumsum), tau)
    };
    // k = 1 always qualifies; counting (not searching) assumes the qualifying k form a prefix,
    // which both papers prove
    let size = in_support.int().sum_dim(3).clamp_min(1);
    let tau = tau_k.gather(3, size.sub_scalar(1)).expand([b, h, lq, n]);
    let support = x.clone().detach().greater(tau).float();

    let count = support.clone().sum_dim(3).clamp_min(1.0);
    if entmax {
        let mean = (x.clone() * support.clone()).sum_dim(3) / count.clone();
        let centred = (x.clone() - mean.clone()) * support.clone();
        let ss = centred.powf_scalar(2.0).sum_dim(3);
        let tau = mean - (ss.neg().add_scalar(1.0) / count).clamp_min(1e-12).sqrt();
        (relu(x - tau) * support).powf_scalar(2.0)
    } else {
        let tau = ((x.clone() * support.clone()).sum_dim(3).sub_scalar(1.0)) / count;
        relu(x - tau) * support
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uniform floats in [−1, 1) from a 64-bit LCG (Knuth's MMIX constants).
    struct Lcg(u64);

    impl Lcg {
        fn uniform(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }

        /// A row of `n` scores spread over [−spread, spread).
        fn row(&mut self, n: usize, spread: f32) -> Vec<f32> {
            (0..n).map(|_| spread * self.uniform()).collect()
        }
    }

    fn sparsemax(row: &[f32]) -> Vec<f32> {
        let tau = sparsemax_threshold(row, &mut Vec::new());
        row.iter().map(|&z| (z - tau).max(0.0)).collect()
    }

    fn entmax15(row: &[f32]) -> Vec<f32> {
        let tau = entmax15_threshold(row, &mut Vec::new());
        row.iter().map(|&s| (0.5 * s - tau).max(0.0).powi(2)).collect()
    }

    fn total(p: &[f32]) -> f64 {
        p.iter().map(|&v| v as f64).sum()
    }

    /// The rows the tests share: lengths from 1 to a few hundred, narrow and wide spreads (all keys
    /// in the support, or a handful).
    fn rows() -> Vec<Vec<f32>> {
        let mut rng = Lcg(7);
        let mut rows = Vec::new();
        for n in [1, 2, 3, 7, 40, 300] {
            for spread in [0.05, 1.0, 6.0] {
                rows.push(rng.row(n, spread));
            }
        }
        rows
    }

    #[test]
    fn sparsemax_rows_sum_to_one_with_exact_zeros() {
        let mut zeros = 0;
        for row in rows() {
            let p = sparsemax(&row);
            assert!((total(&p) - 1.0).abs() < 1e-5, "Σp = {} for {} entries", total(&p), row.len());
            assert!(p.iter().all(|&v| v >= 0.0));
            zeros += p.iter().filter(|&&v| v == 0.0).count();
        }
        assert!(zeros > 0, "wide rows must leave keys out of the support");
    }

    #[test]
    fn sparsemax_of_two_is_its_closed_form() {
        for a in [-3.0f32, -0.7, 0.0, 0.2, 0.45, 1.0, 2.5] {
            for b in [-2.0f32, -0.5, 0.0, 0.3, 1.2] {
                let p = sparsemax(&[a, b]);
                let expected = ((a - b + 1.0) / 2.0).clamp(0.0, 1.0);
                assert!((p[0] - expected).abs() < 1e-6, "sparsemax([{a}, {b}])₀ = {}, not {expected}", p[0]);
            }
        }
    }

    /// τ with Σ max(x − τ, 0)² = 1 by bisection: the sum falls from ≥ 1 at max(x) − 1 to 0 at max(x).
    fn entmax15_threshold_by_bisection(row: &[f32]) -> f64 {
        let x: Vec<f64> = row.iter().map(|&s| 0.5 * s as f64).collect();
        let top = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let (mut lo, mut hi) = (top - 1.0, top);
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            let f: f64 = x.iter().map(|&v| (v - mid).max(0.0).powi(2)).sum::<f64>() - 1.0;
            if f > 0.0 { lo = mid } else { hi = mid }
        }
        0.5 * (lo + hi)
    }

    #[test]
    fn entmax15_threshold_matches_bisection() {
        for row in rows() {
            let tau = entmax15_threshold(&row, &mut Vec::new()) as f64;
            let reference = entmax15_threshold_by_bisection(&row);
            assert!((tau - reference).abs() < 1e-5, "τ {tau} vs {reference} for {} entries", row.len());
        }
    }

    #[test]
    fn entmax15_rows_sum_to_one() {
        for row in rows() {
            let p = entmax15(&row);
            assert!((total(&p) - 1.0).abs() < 1e-5, "Σp = {} for {} entries", total(&p), row.len());
        }
    }

    #[test]
    fn masked_keys_get_exact_zeros() {
        let mut rng = Lcg(19);
        let mut scratch = Vec::new();
        for n in [1, 5, 60] {
            let seen = rng.row(n, 3.0);
            // masked keys among and after the visible ones
            let mut row = seen.clone();
            row.insert(0, -1.0e9);
            row.extend([-1.0e9; 7]);
            for (p, tau, tau_seen) in [
                (sparsemax(&row), sparsemax_threshold(&row, &mut scratch), sparsemax_threshold(&seen, &mut scratch)),
                (entmax15(&row), entmax15_threshold(&row, &mut scratch), entmax15_threshold(&seen, &mut scratch)),
            ] {
                assert_eq!(p[0], 0.0);
                assert!(p[n + 1..].iter().all(|&v| v == 0.0), "masked keys of a row of {n}");
                assert!((tau - tau_seen).abs() < 1e-6, "τ {tau} with the masked keys, {tau_seen} without");
                assert!((total(&p) - 1.0).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn only_the_sparse_normalisers_need_a_threshold() {
        assert!(RowNormaliser::Sparsemax.needs_threshold() && RowNormaliser::Entmax15.needs_threshold());
        assert!(!RowNormaliser::Softmax.needs_threshold());
        assert!(!RowNormaliser::Relu { scale: 0.5 }.needs_threshold());
        assert!(!RowNormaliser::Sigmoid { bias: -2.0 }.needs_threshold());
    }
}
