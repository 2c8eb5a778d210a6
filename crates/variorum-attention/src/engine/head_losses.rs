//! Auxiliary losses on the heads of `full` attention: disagreement regularisation (Li, Tu, Yang,
//! Lyu, Zhang 2018, "Multi-Head Attention with Disagreement Regularization") and attention
//! guided toward fixed patterns (Deshpande & Narasimhan 2020, "Guiding Attention for
//! Self-Supervised Learning with Transformers"). Each returns a scalar the trainer adds to the
//! loss (`AttentionOutput::aux_losses`).
//!
//! Disagreement, with H heads, their value vectors V^h, weights A^h and outputs O^h at each
//! position (cos the cosine similarity; Li et al. maximise D, so the loss is −λ·D):
//!
//! D_subspace = −1/H² Σ_i Σ_j cos(V^i, V^j),   D_position = −1/H² Σ_i Σ_j |A^i ⊙ A^j|,
//! D_output   = −1/H² Σ_i Σ_j cos(O^i, O^j),
//!
//! averaged over positions (for D_position: |A^i ⊙ A^j| = Σ_k A^i_qk A^j_qk, averaged over the
//! queries q). The i = j terms are constants (1 for the cosines) kept as the paper writes them.
//!
//! Pattern guidance: head h of every layer is pulled toward a fixed pattern P — the previous
//! token, the first token, the token itself, or the next token — by the squared error
//! λ · mean_q Σ_k (A^h_qk − P_qk)² (our reading of the paper's pattern loss: a squared error,
//! which needs no logarithm of weights that sparse normalisers set to exactly 0). A query whose
//! pattern key it cannot see (the next token under a causal mask, the previous one of the first
//! token) is pulled toward nothing: its row is left out.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};
use variorum_position::ScoreLayout;

/// What the heads are made to disagree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Disagreement {
    /// The value vectors: each head's projection of the same token.
    #[serde(rename = "subspace")]
    Subspace,
    /// The attention weights: which positions the heads attend to.
    #[serde(rename = "positions")]
    Positions,
    /// The heads' outputs before the output projection.
    #[serde(rename = "outputs")]
    Outputs,
}

/// `model.attention.diversity`: disagreement regularisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiversityConfig {
    /// "subspace", "positions" or "outputs".
    pub on: Disagreement,
    /// λ, the loss's weight. Default 0.1.
    #[serde(default = "default_weight")]
    pub weight: f64,
}

/// A pattern a guided head is pulled toward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pattern {
    /// Query i attends to key i − 1.
    #[serde(rename = "previous")]
    Previous,
    /// Query i attends to key i.
    #[serde(rename = "current")]
    Current,
    /// Query i attends to key i + 1 (under the masked objective; causal queries cannot see it).
    #[serde(rename = "next")]
    Next,
    /// Every query attends to the first position.
    #[serde(rename = "first")]
    First,
}

impl Pattern {
    /// The key position query position `i` is pulled toward.
    fn target(self, i: usize) -> Option<usize> {
        match self {
            Self::Previous => i.checked_sub(1),
            Self::Current => Some(i),
            Self::Next => Some(i + 1),
            Self::First => Some(0),
        }
    }
}

/// `model.attention.guidance`: heads pulled toward fixed patterns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuidanceConfig {
    /// One pattern per guided head, from head 0 up; heads past the list are free.
    pub patterns: Vec<Pattern>,
    /// λ, the loss's weight. Default 0.1.
    #[serde(default = "default_weight")]
    pub weight: f64,
}

fn default_weight() -> f64 {
    0.1
}

/// The checks both losses share, against `n_heads` query heads.
pub fn validate(
    diversity: Option<&DiversityConfig>,
    guidance: Option<&GuidanceConfig>,
    n_heads: usize,
) -> Result<(), ConfigError> {
    if let Some(d) = diversity {
        check(d.weight.is_finite() && d.weight >= 0.0, || {
            format!("model.attention.diversity.weight = {} must be a finite number ≥ 0", d.weight)
        })?;
    }
    if let Some(g) = guidance {
        check(!g.patterns.is_empty() && g.patterns.len() <= n_heads, || {
            format!(
                "model.attention.guidance.patterns names {} heads: give between 1 and n_heads = {n_heads}",
                g.patterns.len()
            )
        })?;
        check(g.weight.is_finite() && g.weight >= 0.0, || {
            format!("model.attention.guidance.weight = {} must be a finite number ≥ 0", g.weight)
        })?;
    }
    Ok(())
}

/// λ/H² Σ_i Σ_j cos(x^i, x^j) averaged over positions, for per-head vectors `[b, heads, L, d]`
/// (the loss of D_subspace on values, of D_output on outputs).
pub fn cosine_agreement(x: Tensor<4>, weight: f64) -> Tensor<1> {
    let [b, h, l, d] = x.dims();
    let unit = x.clone() / x.powf_scalar(2.0).sum_dim(3).add_scalar(1e-12).sqrt();
    // [b·L, h, d] · [b·L, d, h]: every pair of heads at every position
    let unit = unit.swap_dims(1, 2).reshape([b * l, h, d]);
    let cos = unit.clone().matmul(unit.swap_dims(1, 2));
    variorum_core::ordered_sum(cos).div_scalar((b * l * h * h) as f64).mul_scalar(weight).reshape([1])
}

/// λ/H² Σ_i Σ_j Σ_k A^i_qk A^j_qk averaged over the queries, for weights `[b, H, Lq, Lk]`: the
/// loss of D_position. Σ_i Σ_j A^i ⊙ A^j = (Σ_i A^i)², so no pair is formed.
pub fn position_agreement(weights: Tensor<4>, weight: f64) -> Tensor<1> {
    let [b, h, lq, _] = weights.dims();
    let total = weights.sum_dim(1); // [b, 1, Lq, Lk]
    variorum_core::ordered_sum(total.powf_scalar(2.0))
        .div_scalar((b * lq * h * h) as f64)
        .mul_scalar(weight)
        .reshape([1])
}

/// λ · mean over guided (head, query) pairs of Σ_k (A_qk − P_qk)², for weights `[b, H, Lq, Lk]`
/// laid out as `layout` says (absolute positions of queries and keys).
pub fn pattern_loss(weights: Tensor<4>, layout: &ScoreLayout, guidance: &GuidanceConfig) -> Tensor<1> {
    let [b, _, lq, lk] = weights.dims();
    let device = weights.device();
    let g = guidance.patterns.len();
    let mut target = vec![0.0f32; g * lq * lk];
    let mut counted = vec![0.0f32; g * lq];
    for (hi, pattern) in guidance.patterns.iter().enumerate() {
        for i in 0..lq {
            let q = layout.q_start + i;
            let Some(j) = pattern.target(q) else { continue };
            let visible = j >= layout.k_start && j < layout.k_start + lk && (!layout.causal || j <= q);
            if visible {
                target[(hi * lq + i) * lk + (j - layout.k_start)] = 1.0;
                counted[hi * lq + i] = 1.0;
            }
        }
    }
    let rows: f32 = counted.iter().sum();
    if rows == 0.0 {
        return Tensor::zeros([1], &device);
    }
    let target = Tensor::<1>::from_data(TensorData::new(target, [g * lq * lk]), &device).reshape([1, g, lq, lk]);
    let counted = Tensor::<1>::from_data(TensorData::new(counted, [g * lq]), &device).reshape([1, g, lq, 1]);
    let guided = weights.narrow(1, 0, g);
    let err = variorum_core::ordered_sum((guided - target).powf_scalar(2.0) * counted);
    err.div_scalar(b as f64 * rows as f64).mul_scalar(guidance.weight).reshape([1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(t: Tensor<1>) -> f32 {
        t.into_scalar::<f32>()
    }

    #[test]
    fn identical_heads_agree_fully_and_orthogonal_heads_not_at_all() {
        let dev = Device::flex();
        // two heads, one position, d = 2
        let same = Tensor::<4>::from_floats([[[[1.0f32, 2.0]], [[2.0, 4.0]]]], &dev);
        let orthogonal = Tensor::<4>::from_floats([[[[1.0f32, 0.0]], [[0.0, 3.0]]]], &dev);
        // 1/H² Σ_ij cos: 4 pairs of cos 1 → 1; orthogonal: only the 2 self-pairs → 1/2
        assert!((value(cosine_agreement(same, 1.0)) - 1.0).abs() < 1e-6);
        assert!((value(cosine_agreement(orthogonal, 0.5)) - 0.25).abs() < 1e-6);
    }

    #[test]
    fn position_agreement_is_the_pairwise_overlap_of_the_weights() {
        let dev = Device::flex();
        // two heads over 3 keys, one query: Σ_ij Σ_k A^i_k A^j_k by hand
        let a = [0.7f32, 0.2, 0.1];
        let c = [0.1f32, 0.1, 0.8];
        let w = Tensor::<4>::from_floats([[[a], [c]]], &dev);
        let dot = |x: [f32; 3], y: [f32; 3]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
        let want = (dot(a, a) + 2.0 * dot(a, c) + dot(c, c)) / 4.0;
        assert!((value(position_agreement(w, 1.0)) - want).abs() < 1e-6);
    }

    #[test]
    fn a_head_on_its_pattern_costs_nothing_and_rows_without_a_target_are_left_out() {
        let dev = Device::flex();
        let layout = ScoreLayout::new(0, 0, 3, 3, true);
        // head 0 exactly on "previous" where it can be (rows 1, 2); row 0 has no previous token
        let on = Tensor::<4>::from_floats([[[[1.0f32, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]], &dev);
        let guidance = GuidanceConfig { patterns: vec![Pattern::Previous], weight: 1.0 };
        assert!(value(pattern_loss(on, &layout, &guidance)) < 1e-9);
        // uniform causal rows instead: row 1 (½, ½) against (1, 0): ¼ + ¼; row 2 (⅓ each) against
        // (0, 1, 0): 1/9 + 4/9 + 1/9; the mean of the two counted rows
        let uniform = Tensor::<4>::from_floats(
            [[[[1.0f32, 0.0, 0.0], [0.5, 0.5, 0.0], [1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]]]],
            &dev,
        );
        let want = (0.5 + 6.0 / 9.0) / 2.0;
        assert!((value(pattern_loss(uniform, &layout, &guidance)) - want).abs() < 1e-6);
        // "next" under a causal mask has no target anywhere: no loss at all
        let next = GuidanceConfig { patterns: vec![Pattern::Next], weight: 1.0 };
        assert_eq!(value(pattern_loss(Tensor::ones([1, 1, 3, 3], &dev), &layout, &next)), 0.0);
    }

    #[test]
    fn configs_read_and_bad_ones_are_refused() {
        let g: GuidanceConfig = toml::from_str("patterns = [\"previous\", \"first\"]").unwrap();
        assert_eq!((g.patterns.len(), g.weight), (2, 0.1));
        assert!(validate(None, Some(&g), 1).is_err(), "two patterns for one head");
        let d: DiversityConfig = toml::from_str("on = \"outputs\"\nweight = -1.0").unwrap();
        assert!(validate(Some(&d), None, 4).is_err());
        assert!(toml::from_str::<DiversityConfig>("on = \"heads\"").is_err());
    }
}
