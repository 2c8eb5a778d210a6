//! Multiplicative relative position (reference: position-and-efficiency.md, eq. 12):
//!
//! ã_ij = (x_i Φ_q Φ_kᵀ x_jᵀ) · π_{|i−j|},
//!
//! one learned scalar per absolute offset |i − j|, shared by the heads of a layer, multiplying
//! the content scores. Offsets beyond `max_distance` share the last scalar, so any length can be
//! scored. The scalars start at 1 (the unmodified attention).

use burn::module::Param;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

use crate::RelativePosition;
use crate::ScoreLayout;
use crate::kind::{HeadShape, PositionKind, RelativeScheme, TermsFor};
use crate::layout::entry_index;
use variorum_core::Capabilities;
use variorum_kernels::block_sparse::{DistanceTerms, ScoreActivation};

/// `model.position` with `kind = "multiplicative"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MultiplicativeConfig {
    /// Largest offset with its own scalar. Default 128.
    pub max_distance: usize,
}

impl Default for MultiplicativeConfig {
    fn default() -> Self {
        Self { max_distance: 128 }
    }
}

impl MultiplicativeConfig {
    /// Checks the settings; messages name the config key (`model.position.max_distance`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.max_distance > 0, || "model.position.max_distance must be at least 1".into())?;
        // one scalar per distance: a bound keeps `max_distance + 1` from overflowing
        check(self.max_distance < 1 << 24, || {
            format!("model.position.max_distance = {} must be below 2^24", self.max_distance)
        })
    }

    /// One layer's scalars, all starting at 1.
    pub fn init(&self, device: &Device) -> MultiplicativePosition {
        MultiplicativePosition {
            // lazy, like the other parameters: nothing is allocated before weights are loaded
            scale: burn::nn::Initializer::Ones.init([self.max_distance + 1], device),
            max_distance: self.max_distance,
        }
    }
}

/// A learned scalar per offset |i − j|, multiplying one layer's content scores.
#[derive(Module, Debug)]
pub struct MultiplicativePosition {
    /// π, `[max_distance + 1]`.
    pub scale: Param<Tensor<1>>,
    /// Largest offset with its own scalar; further ones share the last.
    pub max_distance: usize,
}

impl MultiplicativePosition {
    /// π_{|i−j|} as `[1, 1, len_q, len_k]`.
    pub fn factors(&self, layout: &ScoreLayout, device: &Device) -> Tensor<4> {
        let m = self.max_distance as i64;
        let index = layout.index(|d| d.abs().min(m), device);
        let [lq, lk] = index.dims();
        self.scale.val().select(0, index.reshape([lq * lk])).reshape([1, 1, lq, lk])
    }
}

impl PositionKind for MultiplicativeConfig {
    const SUMMARY: &'static str = "a learned scalar per |i−j| multiplying the scores";
    const PAPER: &'static str = "Prince 2023, Transformers III (position-and-efficiency eq. 12)";
    const CAPS: Capabilities = Capabilities { score_bias: true, ..Capabilities::NEUTRAL };

    fn validate(&self, _heads: HeadShape, _context: usize) -> Result<(), ConfigError> {
        MultiplicativeConfig::validate(self)
    }

    fn init_relative(&self, _heads: HeadShape, _context: usize, device: &Device) -> Option<RelativePosition> {
        Some(self.init(device).into())
    }

    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![("to 6", Self { max_distance: 6 })]
    }
}

impl RelativeScheme for MultiplicativePosition {
    fn scores(&self, scores: Tensor<4>, _q: Tensor<4>, _k: Tensor<4>, layout: &ScoreLayout, _scale: f64) -> Tensor<4> {
        let device = scores.device();
        scores * self.factors(layout, &device)
    }

    fn has_distance_terms(&self) -> bool {
        true
    }

    /// π_{|d|} per distance, every head alike.
    fn distance_terms(&self, at: TermsFor, device: &Device) -> Option<DistanceTerms> {
        let TermsFor { n_heads: h, len_k, .. } = at;
        let m = self.max_distance as i64;
        let index = entry_index(len_k, |d| d.abs().min(m), device);
        let width = 2 * len_k - 1;
        let factors = self.scale.val().select(0, index).unsqueeze_dim::<2>(0).expand([h, width]);
        Some(DistanceTerms { multiplier: Some((factors, ScoreActivation::Identity)), ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    /// Every score times π_{min(|i − j|, m)}, by hand: the scalar of the offset's size, the
    /// last one shared beyond m, the same for both signs and every head.
    #[test]
    fn scores_are_multiplied_by_the_scalar_of_their_offset() {
        let device = Device::default();
        let (m, heads, len_q, len_k, q_start) = (3usize, 2usize, 4usize, 10usize, 4usize);
        let mut position = MultiplicativeConfig { max_distance: m }.init(&device);
        let pi = Tensor::<1>::random([m + 1], Distribution::Uniform(0.5, 2.0), &device);
        position.scale = Param::from_tensor(pi.clone());
        let scores = Tensor::<1>::random([heads * len_q * len_k], Distribution::Normal(0.0, 1.0), &device)
            .reshape([1, heads, len_q, len_k]);
        let unused = Tensor::<4>::zeros([1, heads, len_q, 2], &device);
        let layout = ScoreLayout::new(q_start, 0, len_q, len_k, false);
        let got = position.scores(scores.clone(), unused.clone(), unused, &layout, 1.0);
        let [got, scores, pi]: [Vec<f32>; 3] =
            [got.into_data(), scores.into_data(), pi.into_data()].map(|d| d.try_to_vec::<f32>().unwrap());
        for h in 0..heads {
            for i in 0..len_q {
                for j in 0..len_k {
                    let offset = ((q_start + i) as i64 - j as i64).unsigned_abs() as usize;
                    let at = (h * len_q + i) * len_k + j;
                    let want = scores[at] * pi[offset.min(m)];
                    assert!((got[at] - want).abs() < 1e-6, "head {h}, query {i}, key {j}: {} vs {want}", got[at]);
                }
            }
        }
    }
}
