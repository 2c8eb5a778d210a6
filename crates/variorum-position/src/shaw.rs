//! Relative position representations (Shaw et al. 2018):
//!
//! e_ij = x_i W^Q (x_j W^K + a^K_ij)ᵀ / √d,   z_i = Σ_j α_ij (x_j W^V + a^V_ij),
//! a_ij = w_{clip(j − i, −k, k)},
//!
//! learned vectors in the key (and optionally value) space for each clipped offset, shared
//! across heads, one set per layer as in the paper. The key term is q_i·a^K for the 2k+1 offsets
//! ([len_q, 2k+1] per head, then gathered per pair); the value term sums the probabilities by
//! offset and multiplies by the 2k+1 value vectors — neither materialises an L×L×d tensor.

use burn::module::Param;
use burn::nn::Initializer;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

use crate::RelativePosition;
use crate::ScoreLayout;
use crate::kind::{HeadShape, PositionKind, RelativeScheme, TermsFor};
use crate::layout::{entry_buckets, gather_buckets, scatter_buckets};
use variorum_core::Capabilities;
use variorum_kernels::block_sparse::{DistanceTable, DistanceTerms};

/// `model.position` with `kind = "shaw"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShawConfig {
    /// Offsets are clipped to ±`max_distance` (the paper's k). Default 16.
    pub max_distance: usize,
    /// Also add relative vectors to the values (a^V). Default true.
    pub values: bool,
}

impl Default for ShawConfig {
    fn default() -> Self {
        Self { max_distance: 16, values: true }
    }
}

impl ShawConfig {
    /// Checks the settings; messages name the config key (`model.position.max_distance`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.max_distance > 0, || "model.position.max_distance must be at least 1 (the paper uses 16)".into())
    }

    /// One layer's vectors, normal with std 0.02.
    pub fn init(&self, head_dim: usize, device: &Device) -> ShawRelative {
        let rows = 2 * self.max_distance + 1;
        let init = Initializer::Normal { mean: 0.0, std: 0.02 };
        ShawRelative {
            keys: init.init([rows, head_dim], device),
            values: self.values.then(|| init.init([rows, head_dim], device)),
            max_distance: self.max_distance,
        }
    }
}

/// Shaw et al.'s relative key (and value) vectors of one layer, shared by its heads.
#[derive(Module, Debug)]
pub struct ShawRelative {
    /// a^K, `[2k + 1, head_dim]`, row `k + (j − i)`.
    pub keys: Param<Tensor<2>>,
    /// a^V, `[2k + 1, head_dim]`.
    pub values: Option<Param<Tensor<2>>>,
    /// k: offsets are clipped to ±k.
    pub max_distance: usize,
}

impl ShawRelative {
    /// The table row of query − key distance `d`: k + clip(j − i, −k, k).
    fn bucket(&self, d: i64) -> i64 {
        let k = self.max_distance as i64;
        (-d).clamp(-k, k) + k
    }

    fn index(&self, layout: &ScoreLayout, device: &Device) -> Tensor<2, Int> {
        layout.index(|d| self.bucket(d), device)
    }

    /// q_i·a^K_ij for already scaled queries `q: [b, h, len_q, head_dim]`: `[b, h, len_q, len_k]`.
    pub fn score_term(&self, q: Tensor<4>, layout: &ScoreLayout) -> Tensor<4> {
        let index = self.index(layout, &q.device());
        let per_offset = q.matmul(self.keys.val().transpose().unsqueeze_dim::<3>(0).unsqueeze_dim(0));
        gather_buckets(per_offset, index)
    }

    /// Σ_j α_ij a^V_ij for probabilities `[b, h, len_q, len_k]`: `[b, h, len_q, head_dim]`.
    pub fn context_term(&self, probs: Tensor<4>, layout: &ScoreLayout) -> Option<Tensor<4>> {
        let values = self.values.as_ref()?.val();
        let index = self.index(layout, &probs.device());
        let by_offset = scatter_buckets(probs, index, 2 * self.max_distance + 1);
        Some(by_offset.matmul(values.unsqueeze_dim::<3>(0).unsqueeze_dim(0)))
    }
}

impl PositionKind for ShawConfig {
    const SUMMARY: &'static str = "learned relative key/value vectors, offsets clipped to ±k";
    const PAPER: &'static str = "Shaw et al. 2018, Self-Attention with Relative Position Representations";
    const CAPS: Capabilities = Capabilities { score_bias: true, ..Capabilities::NEUTRAL };

    fn validate(&self, _heads: HeadShape, _context: usize) -> Result<(), ConfigError> {
        ShawConfig::validate(self)
    }

    fn init_relative(&self, heads: HeadShape, _context: usize, device: &Device) -> Option<RelativePosition> {
        Some(self.init(heads.head_dim, device).into())
    }

    /// Clipped at 4, so that a context of 16 reaches past the clipping distance.
    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![
            ("keys and values", Self { max_distance: 4, values: true }),
            ("keys only", Self { max_distance: 4, values: false }),
        ]
    }
}

impl RelativeScheme for ShawRelative {
    fn scores(
        &self,
        scores: Tensor<4>,
        q_scaled: Tensor<4>,
        _k: Tensor<4>,
        layout: &ScoreLayout,
        _scale: f64,
    ) -> Tensor<4> {
        scores + self.score_term(q_scaled, layout)
    }

    fn context(&self, probs: Tensor<4>, layout: &ScoreLayout) -> Option<Tensor<4>> {
        self.context_term(probs, layout)
    }

    fn has_distance_terms(&self) -> bool {
        true
    }

    /// q_i·a^K and Σ_j α_ij a^V, both by the clipped offset, the tables shared by the heads.
    fn distance_terms(&self, at: TermsFor, _: &Device) -> Option<DistanceTerms> {
        let TermsFor { n_heads: h, len_k, .. } = at;
        let bucket = entry_buckets(len_k, |d| self.bucket(d));
        let table = |t: Tensor<2>| {
            let [n, dh] = t.dims();
            DistanceTable { rows: t.unsqueeze_dim::<3>(0).expand([h, n, dh]), bucket: bucket.clone() }
        };
        Some(DistanceTerms {
            queries: Some(table(self.keys.val())),
            values: self.values.as_ref().map(|v| table(v.val())),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    /// Shaw et al.'s terms pair by pair, by hand: the score adds q_i · a^K_{clip(j − i)}, the
    /// context adds Σ_j α_ij a^V_{clip(j − i)}, offsets clipped to ±k (queries after the first
    /// keys, as with a cache, so that both clips are reached).
    #[test]
    fn key_and_value_terms_are_the_clipped_offsets_vectors() {
        let device = Device::default();
        let (k, dh, heads, len_q, len_k, q_start) = (2usize, 3usize, 2usize, 4usize, 9usize, 3usize);
        let mut shaw = ShawConfig { max_distance: k, values: true }.init(dh, &device);
        let normal = |n: usize| Tensor::<1>::random([n], Distribution::Normal(0.0, 1.0), &device);
        shaw.keys = Param::from_tensor(normal((2 * k + 1) * dh).reshape([2 * k + 1, dh]));
        shaw.values = Some(Param::from_tensor(normal((2 * k + 1) * dh).reshape([2 * k + 1, dh])));
        let q = normal(heads * len_q * dh).reshape([1, heads, len_q, dh]);
        let probs = normal(heads * len_q * len_k).reshape([1, heads, len_q, len_k]);
        let layout = ScoreLayout::new(q_start, 0, len_q, len_k, false);
        let scores = values(shaw.score_term(q.clone(), &layout));
        let context = values(shaw.context_term(probs.clone(), &layout).unwrap());

        let (a_k, a_v) = (values(shaw.keys.val()), values(shaw.values.as_ref().unwrap().val()));
        let (q, probs) = (values(q), values(probs));
        // the row of the offset j − i, clipped to ±k
        let row = |i: usize, j: usize| (j as i64 - (q_start + i) as i64).clamp(-(k as i64), k as i64) as usize + k;
        let mut clipped = [false, false];
        for h in 0..heads {
            for i in 0..len_q {
                let qi = &q[(h * len_q + i) * dh..][..dh];
                for j in 0..len_k {
                    let r = row(i, j);
                    clipped = [clipped[0] || r == 0, clipped[1] || r == 2 * k];
                    let want: f32 = qi.iter().zip(&a_k[r * dh..][..dh]).map(|(x, y)| x * y).sum();
                    let got = scores[(h * len_q + i) * len_k + j];
                    assert!((got - want).abs() < 1e-5, "score, head {h}, query {i}, key {j}: {got} vs {want}");
                }
                for c in 0..dh {
                    let want: f32 =
                        (0..len_k).map(|j| probs[(h * len_q + i) * len_k + j] * a_v[row(i, j) * dh + c]).sum();
                    let got = context[(h * len_q + i) * dh + c];
                    assert!((got - want).abs() < 1e-4, "context, head {h}, query {i}, dim {c}: {got} vs {want}");
                }
            }
        }
        assert_eq!(clipped, [true, true], "both clips reached");
    }
}
