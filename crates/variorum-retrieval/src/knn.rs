//! The kNN-LM (Khandelwal et al. 2020): next-token probabilities from retrieved neighbours,
//! interpolated with the language model's.
//!
//! p_kNN(y | x) ∝ Σ_{(k_i, v_i) ∈ N} 1[y = v_i] · exp(−d(k_i, f(x)) / T)
//!
//! p(y | x) = λ · p_kNN(y | x) + (1 − λ) · p_LM(y | x)
//!
//! N holds the k nearest keys to the query f(x), d is the squared Euclidean distance (the
//! paper's FAISS L2 search returns squared distances), and T a temperature (the paper uses 1;
//! here it is configurable because d's scale follows the key width and the model).

/// λ, k and T.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KnnConfig {
    /// Neighbours retrieved per position.
    pub k: usize,
    /// Weight of p_kNN in the interpolation (0 = the LM alone).
    pub lambda: f64,
    /// Divides the distances before the softmax.
    pub temperature: f64,
}

impl Default for KnnConfig {
    fn default() -> Self {
        // the paper's in-domain λ (WikiText-103) and T
        Self { k: 64, lambda: 0.25, temperature: 1.0 }
    }
}

/// p_kNN as (token, probability) pairs over the tokens the neighbours hold, from the
/// `neighbours` (id, squared distance; nearest first) and each entry's value `value(id)`.
/// Empty when there are no neighbours.
pub fn knn_distribution(
    neighbours: &[crate::Neighbour],
    temperature: f64,
    value: impl Fn(u64) -> u32,
) -> Vec<(u32, f64)> {
    let Some(nearest) = neighbours.iter().map(|n| n.distance as f64).reduce(f64::min) else { return Vec::new() };
    let t = temperature.max(f64::MIN_POSITIVE);
    let mut out: Vec<(u32, f64)> = Vec::new();
    let mut total = 0.0;
    for n in neighbours {
        // shifted by the nearest distance: the softmax is unchanged and nothing underflows
        let w = (-(n.distance as f64 - nearest) / t).exp();
        total += w;
        let v = value(n.id);
        match out.iter_mut().find(|(tok, _)| *tok == v) {
            Some((_, p)) => *p += w,
            None => out.push((v, w)),
        }
    }
    out.iter_mut().for_each(|(_, p)| *p /= total);
    out
}

/// log p(target) under the interpolation, from the LM's log-probability of it and p_kNN's
/// probability of it. With λ = 0 it is the LM's log-probability exactly (no rounding), and with
/// no neighbours (`knn = None`) the LM's alone.
pub fn mix_logprob(lm_logprob: f64, knn: Option<f64>, lambda: f64) -> f64 {
    match knn {
        Some(p) if lambda > 0.0 => {
            let a = lambda.ln() + p.ln(); // −∞ when p = 0
            let b = (1.0 - lambda).ln() + lm_logprob; // −∞ when λ = 1
            let m = a.max(b);
            if m == f64::NEG_INFINITY { m } else { m + ((a - m).exp() + (b - m).exp()).ln() }
        }
        _ => lm_logprob,
    }
}

/// The mixed distribution over the whole vocabulary as log-probabilities, for sampling:
/// `lm_logprobs` (log-softmax of the logits) and p_kNN's pairs.
pub fn mix_logprobs(lm_logprobs: &[f32], knn: &[(u32, f64)], lambda: f64) -> Vec<f32> {
    if knn.is_empty() || lambda <= 0.0 {
        return lm_logprobs.to_vec();
    }
    let mut p: Vec<f64> = lm_logprobs.iter().map(|&l| (1.0 - lambda) * (l as f64).exp()).collect();
    for &(tok, q) in knn {
        if let Some(x) = p.get_mut(tok as usize) {
            *x += lambda * q;
        }
    }
    p.into_iter().map(|x| x.ln() as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Neighbour;

    fn nb(id: u64, distance: f32) -> Neighbour {
        Neighbour { id, distance }
    }

    #[test]
    fn the_distribution_is_a_softmax_over_negative_distances_summed_by_token() {
        let ns = [nb(0, 1.0), nb(1, 2.0), nb(2, 2.0)];
        let values = [7u32, 3, 7];
        let p = knn_distribution(&ns, 1.0, |id| values[id as usize]);
        let w = [(-1f64).exp(), (-2f64).exp(), (-2f64).exp()];
        let z: f64 = w.iter().sum();
        assert_eq!(p.len(), 2);
        let p7 = p.iter().find(|x| x.0 == 7).unwrap().1;
        let p3 = p.iter().find(|x| x.0 == 3).unwrap().1;
        assert!((p7 - (w[0] + w[2]) / z).abs() < 1e-12 && (p3 - w[1] / z).abs() < 1e-12);
        // a high temperature flattens it towards counting, a low one picks the nearest
        let flat = knn_distribution(&ns, 1e6, |id| values[id as usize]);
        assert!((flat.iter().find(|x| x.0 == 7).unwrap().1 - 2.0 / 3.0).abs() < 1e-5);
        let sharp = knn_distribution(&ns, 1e-3, |id| values[id as usize]);
        assert!(sharp.iter().find(|x| x.0 == 7).unwrap().1 > 0.999);
        assert!(knn_distribution(&[], 1.0, |_| 0).is_empty());
    }

    #[test]
    fn lambda_zero_is_the_lm_exactly_and_the_mixture_is_linear() {
        for lp in [-0.1f64, -2.5, -17.0] {
            assert_eq!(mix_logprob(lp, Some(0.9), 0.0), lp);
            assert_eq!(mix_logprob(lp, None, 0.5), lp);
            let want = (0.3 * 0.9 + 0.7 * lp.exp()).ln();
            assert!((mix_logprob(lp, Some(0.9), 0.3) - want).abs() < 1e-12);
            assert!((mix_logprob(lp, Some(0.0), 0.3) - (0.7f64.ln() + lp)).abs() < 1e-12);
        }
        assert_eq!(mix_logprob(-1.0, Some(0.0), 1.0), f64::NEG_INFINITY);
        let lm = [0.5f32.ln(), 0.25f32.ln(), 0.25f32.ln()];
        let mixed = mix_logprobs(&lm, &[(2, 1.0)], 0.5);
        let p: Vec<f64> = mixed.iter().map(|&x| (x as f64).exp()).collect();
        assert!((p[0] - 0.25).abs() < 1e-6 && (p[1] - 0.125).abs() < 1e-6 && (p[2] - 0.625).abs() < 1e-6);
    }
}
