//! Attention with Linear Biases (ALiBi; Press et al. 2022):
//!
//! softmax(q_i Kᵀ + m_h · [−(i−1), …, −1, 0]),
//!
//! a fixed penalty proportional to the distance, with a head-specific slope m_h. For n heads
//! (a power of two) the slopes are the geometric sequence 2^(−8/n), 2^(−16/n), …, 2^(−8): for 8
//! heads 1/2, 1/4, …, 1/256. For other head counts the paper takes the 2^⌊log₂ n⌋ slopes of the
//! closest smaller power of two, then every other slope of the sequence for twice that power
//! until n slopes are reached. No parameters, and no position added to the input.
//!
//! The paper is causal; in bidirectional attention we use the symmetric penalty −m_h·|i − j|
//! (the choice of most bidirectional ports), which is the same on the causal part.

use burn::prelude::*;

use crate::{Distances, ScoreLayout};
use serde::{Deserialize, Serialize};
use variorum_core::Capabilities;

use crate::RelativePosition;
use crate::kind::{DistanceBias, HeadShape, PositionKind};

/// The paper's slopes for `n_heads` heads.
pub fn alibi_slopes(n_heads: usize) -> Vec<f64> {
    fn power_of_two(n: usize) -> Vec<f64> {
        let start = 2f64.powf(-8.0 / n as f64);
        (1..=n).map(|i| start.powi(i as i32)).collect()
    }
    if n_heads.is_power_of_two() {
        return power_of_two(n_heads);
    }
    let closest = 1usize << (usize::BITS - 1 - n_heads.leading_zeros());
    let mut slopes = power_of_two(closest);
    slopes.extend(power_of_two(2 * closest).into_iter().step_by(2).take(n_heads - closest));
    slopes
}

/// ALiBi's bias, −m_h · |i − j| on head h's scores. No parameters.
#[derive(Module, Debug)]
pub struct AlibiBias {
    /// Heads, each with its slope m_h.
    pub n_heads: usize,
}

impl AlibiBias {
    /// The bias for `n_heads` heads, with the paper's slopes.
    pub fn new(n_heads: usize) -> Self {
        Self { n_heads }
    }

    /// The heads' slopes m_h, `[n_heads]`.
    fn slopes(&self, device: &Device) -> Tensor<1> {
        let slopes: Vec<f32> = alibi_slopes(self.n_heads).into_iter().map(|s| s as f32).collect();
        Tensor::<1>::from_data(TensorData::new(slopes, [self.n_heads]), device)
    }
}

impl DistanceBias for AlibiBias {
    /// The additive bias `[1, n_heads, len_q, len_k]`.
    fn bias(&self, layout: &ScoreLayout, device: &Device) -> Tensor<4> {
        let slopes = self.slopes(device);
        let distance = layout.values(|d| -(d.abs() as f32), device);
        slopes.reshape([1, self.n_heads, 1, 1]) * distance.unsqueeze_dim::<3>(0).unsqueeze_dim(0)
    }

    /// The bias of gathered keys, `[h, n, len_q, len_k]` for distances `[groups, n, len_q, len_k]`.
    fn bias_at(&self, d: &Distances, device: &Device) -> Tensor<4> {
        let slopes = self.slopes(device);
        let [_, n, lq, lk] = d.dims;
        let distance = d.values(|d| -(d.abs() as f32), device);
        (slopes.reshape([self.n_heads, 1, 1, 1]) * distance).expand([self.n_heads, n, lq, lk])
    }
}

/// `model.position` with `kind = "alibi"`: no settings (the slopes follow from the head count).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlibiConfig {}

impl PositionKind for AlibiConfig {
    const SUMMARY: &'static str = "fixed linear distance penalty, geometric slopes per head; no parameters";
    const PAPER: &'static str = "Press et al. 2022, Train Short, Test Long (ALiBi)";
    const CAPS: Capabilities = Capabilities { score_bias: true, distance_only: true, ..Capabilities::NEUTRAL };

    fn init_relative(&self, heads: HeadShape, _context: usize, _device: &Device) -> Option<RelativePosition> {
        Some(AlibiBias::new(heads.n_heads).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes_are_the_papers() {
        let eight: Vec<f64> = (1..=8).map(|i| 1.0 / 2f64.powi(i)).collect();
        assert_eq!(alibi_slopes(8), eight);
        // 12 heads: the 8 slopes above, then 2^(-0.5), 2^(-1.5), 2^(-2.5), 2^(-3.5)
        let mut twelve = eight.clone();
        twelve.extend([-0.5f64, -1.5, -2.5, -3.5].iter().map(|e| 2f64.powf(*e)));
        for (a, b) in alibi_slopes(12).iter().zip(&twelve) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
        assert_eq!(alibi_slopes(12).len(), 12);
        assert_eq!(alibi_slopes(1), vec![1.0 / 256.0]);
    }

    #[test]
    fn bias_is_minus_slope_times_distance() {
        let dev = Device::flex();
        let b = AlibiBias::new(2).bias(&ScoreLayout::new(2, 0, 1, 3, true), &dev);
        let v = b.into_data().try_to_vec::<f32>().unwrap();
        // query at 2, keys at 0, 1, 2; slopes 1/16, 1/256
        let want = [-2.0 / 16.0, -1.0 / 16.0, 0.0, -2.0 / 256.0, -1.0 / 256.0, 0.0];
        for (a, b) in v.iter().zip(want) {
            assert!((a - b).abs() < 1e-7);
        }
    }
}
