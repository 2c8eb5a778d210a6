//! DA-Transformer, distance-aware attention (Wu et al. 2021):
//!
//! R^(h) = α_h · R, R_ij = |i − j|,   f(R^(h); β_h) = (1 + exp β_h) / (1 + exp(β_h − R^(h))),
//! attn_h = softmax(ReLU(Q_h K_hᵀ) ∘ f(R^(h)) / √d) V_h,
//!
//! a learnable per-head re-weighting of the (rectified) scores by distance, f(0) = 1. A positive
//! α_h makes the head favour distant keys (f grows towards 1 + exp β), a negative one favours near
//! keys (f falls towards 0). The paper does not fix their initial values; we start half of the heads
//! short-range and half long-range, α_h spread evenly over [−1, 1], and β_h = 0.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::relu;

use crate::ScoreLayout;
use serde::{Deserialize, Serialize};
use variorum_core::Capabilities;

use crate::RelativePosition;
use crate::kind::{HeadShape, PositionKind, RelativeScheme, TermsFor};
use crate::layout::entry_values;
use variorum_kernels::block_sparse::{DistanceTerms, ScoreActivation};

/// DA-Transformer's per-head re-weighting of the rectified scores by distance.
#[derive(Module, Debug)]
pub struct DistanceAware {
    /// α, `[n_heads]`.
    pub alpha: Param<Tensor<1>>,
    /// β, `[n_heads]`.
    pub beta: Param<Tensor<1>>,
}

impl DistanceAware {
    /// `n_heads` heads, α_h spread evenly over [−1, 1] (near-range heads first), β_h = 0.
    pub fn new(n_heads: usize, device: &Device) -> Self {
        let alpha: Vec<f32> = (0..n_heads)
            .map(|h| if n_heads == 1 { -1.0 } else { -1.0 + 2.0 * h as f32 / (n_heads - 1) as f32 })
            .collect();
        Self {
            alpha: Param::from_tensor(Tensor::from_data(TensorData::new(alpha, [n_heads]), device)),
            beta: Param::from_tensor(Tensor::zeros([n_heads], device)),
        }
    }

    /// f(α_h |i − j|; β_h), `[1, h, len_q, len_k]`.
    pub fn weights(&self, layout: &ScoreLayout, device: &Device) -> Tensor<4> {
        let [h] = self.alpha.dims();
        let distance = layout.values(|d| d.abs() as f32, device).unsqueeze_dim::<3>(0).unsqueeze_dim::<4>(0);
        let r = self.alpha.val().reshape([1, h, 1, 1]) * distance;
        let beta = self.beta.val().reshape([1, h, 1, 1]);
        (beta.clone().exp() + 1.0) / ((beta - r).exp() + 1.0)
    }

    /// ReLU(scores) ∘ f, for scaled scores `[b, h, len_q, len_k]`.
    pub fn apply(&self, scores: Tensor<4>, layout: &ScoreLayout) -> Tensor<4> {
        let f = self.weights(layout, &scores.device());
        relu(scores) * f
    }
}

/// `model.position` with `kind = "da"`: no settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistanceAwareConfig {}

impl PositionKind for DistanceAwareConfig {
    const SUMMARY: &'static str = "ReLU(QKᵀ) scaled by a learned per-head function of distance";
    const PAPER: &'static str = "Wu et al. 2021, DA-Transformer: Distance-aware Transformer";
    const CAPS: Capabilities = Capabilities { score_bias: true, ..Capabilities::NEUTRAL };

    fn init_relative(&self, heads: HeadShape, _context: usize, device: &Device) -> Option<RelativePosition> {
        Some(DistanceAware::new(heads.n_heads, device).into())
    }
}

impl RelativeScheme for DistanceAware {
    fn scores(&self, scores: Tensor<4>, _q: Tensor<4>, _k: Tensor<4>, layout: &ScoreLayout, _scale: f64) -> Tensor<4> {
        self.apply(scores, layout)
    }

    fn has_distance_terms(&self) -> bool {
        true
    }

    /// f(α_h |d|; β_h) per head and distance, after a ReLU.
    fn distance_terms(&self, at: TermsFor, device: &Device) -> Option<DistanceTerms> {
        let len_k = at.len_k;
        let [h] = self.alpha.dims();
        let distance = entry_values(len_k, |d| d.abs() as f32, device);
        let r = self.alpha.val().reshape([h, 1]) * distance.unsqueeze_dim(0);
        let beta = self.beta.val().reshape([h, 1]);
        let f = (beta.clone().exp() + 1.0) / ((beta - r).exp() + 1.0);
        Some(DistanceTerms { multiplier: Some((f, ScoreActivation::Relu)), ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_is_one_at_distance_zero_and_monotonic() {
        let dev = Device::flex();
        let da = DistanceAware::new(3, &dev);
        let w = da.weights(&ScoreLayout::new(9, 0, 1, 10, true), &dev).into_data().try_to_vec::<f32>().unwrap();
        // head 0 (α = −1): rises from far to near; head 2 (α = 1): falls from far to near
        let (near, far) = (9, 0);
        assert!((w[near] - 1.0).abs() < 1e-6 && (w[20 + near] - 1.0).abs() < 1e-6);
        assert!(w[far] < w[near] && w[20 + far] > w[20 + near]);
        assert!(w[0..10].windows(2).all(|p| p[0] <= p[1]));
    }
}
