//! T5 relative position bias (Raffel et al. 2020):
//!
//! a_ij = q_i k_jᵀ + b_h(bucket(j − i)),
//!
//! a learned scalar per head and distance bucket. Distances below `num_buckets / 2` (half of that
//! when bidirectional, where the sign takes one bit) get a bucket each; larger ones share
//! log-spaced buckets up to `max_distance`, beyond which everything falls in the last bucket — so
//! any length can be scored. Causal attention uses the one-sided bucketing (T5's decoder),
//! bidirectional attention the two-sided one (T5's encoder).
//!
//! T5 shares one table across the layers of a stack (`shared = true`: every layer reads the
//! first layer's, whose gradient sums every layer's); by default each layer has its own (the
//! per-layer form the rest of our schemes have, at `n_heads × num_buckets` parameters a layer).

use burn::module::Param;
use burn::nn::Initializer;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

use crate::RelativePosition;
use crate::kind::{DistanceBias, HeadShape, PositionKind};
use crate::{Distances, ScoreLayout, layout::per_head_bias};
use variorum_core::Capabilities;

/// `model.position` with `kind = "t5"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct T5BiasConfig {
    /// Buckets per head. Default 32 (T5's).
    pub num_buckets: usize,
    /// Distance at which the log-spaced buckets end. Default 128 (T5's).
    pub max_distance: usize,
    /// One table per stack, the first layer's, read by every layer (T5's). Default false: a
    /// table per layer.
    pub shared: bool,
}

impl Default for T5BiasConfig {
    fn default() -> Self {
        Self { num_buckets: 32, max_distance: 128, shared: false }
    }
}

impl T5BiasConfig {
    /// Checks the settings; messages name the config key (`model.position.*`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(self.num_buckets >= 4, || {
            format!("model.position.num_buckets = {} must be at least 4 (32 is T5's)", self.num_buckets)
        })?;
        check(self.max_distance > self.num_buckets / 2, || {
            format!(
                "model.position.max_distance = {} must exceed num_buckets / 2 = {}",
                self.max_distance,
                self.num_buckets / 2
            )
        })
    }

    /// One layer's table for `n_heads` heads, normal with std 0.02.
    pub fn init(&self, n_heads: usize, device: &Device) -> T5Bias {
        T5Bias {
            table: Initializer::Normal { mean: 0.0, std: 0.02 }.init([n_heads, self.num_buckets], device),
            num_buckets: self.num_buckets,
            max_distance: self.max_distance,
        }
    }
}

/// T5's bucketing of `relative_position = key position − query position`.
pub fn t5_bucket(relative_position: i64, bidirectional: bool, num_buckets: usize, max_distance: usize) -> usize {
    let mut buckets = num_buckets as i64;
    let mut ret = 0;
    let mut n = -relative_position;
    if bidirectional {
        buckets /= 2;
        if n < 0 {
            ret += buckets;
        }
        n = n.abs();
    } else {
        n = n.max(0);
    }
    let max_exact = buckets / 2;
    if n < max_exact {
        return (ret + n) as usize;
    }
    let large = max_exact
        + ((n as f64 / max_exact as f64).ln() / (max_distance as f64 / max_exact as f64).ln()
            * (buckets - max_exact) as f64) as i64;
    (ret + large.min(buckets - 1)) as usize
}

/// T5's bias of one layer: a learned scalar per head and distance bucket.
#[derive(Module, Debug)]
pub struct T5Bias {
    /// `[n_heads, num_buckets]`
    pub table: Param<Tensor<2>>,
    /// Buckets per head (the two signs share them when bidirectional).
    pub num_buckets: usize,
    /// Distance at which the log-spaced buckets end.
    pub max_distance: usize,
}

impl DistanceBias for T5Bias {
    /// The additive bias `[1, n_heads, len_q, len_k]`.
    fn bias(&self, layout: &ScoreLayout, device: &Device) -> Tensor<4> {
        let (nb, md, bidi) = (self.num_buckets, self.max_distance, !layout.causal);
        // distance d = query − key, T5's relative position = key − query = −d
        let index = layout.index(|d| t5_bucket(-d, bidi, nb, md) as i64, device);
        per_head_bias(self.table.val(), index)
    }

    /// The bias of gathered keys, `[h, n, len_q, len_k]` for distances `[groups, n, len_q, len_k]`.
    fn bias_at(&self, d: &Distances, device: &Device) -> Tensor<4> {
        let (nb, md, bidi) = (self.num_buckets, self.max_distance, !d.causal);
        let [g, n, lq, lk] = d.dims;
        let index = d.index(|d| t5_bucket(-d, bidi, nb, md) as i64, device); // [g, n·lq·lk]
        let table = self.table.val();
        let h = table.dims()[0];
        let bias = if g == 1 { table.select(1, index.reshape([n * lq * lk])) } else { table.gather(1, index) };
        bias.reshape([h, n, lq, lk])
    }
}

impl PositionKind for T5BiasConfig {
    const SUMMARY: &'static str = "learned scalar bias per head over log-spaced distance buckets";
    const PAPER: &'static str = "Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5)";
    const CAPS: Capabilities = Capabilities { score_bias: true, distance_only: true, ..Capabilities::NEUTRAL };

    fn validate(&self, _heads: HeadShape, _context: usize) -> Result<(), ConfigError> {
        T5BiasConfig::validate(self)
    }

    fn tied_across_layers(&self) -> bool {
        self.shared
    }

    fn init_relative(&self, heads: HeadShape, _context: usize, device: &Device) -> Option<RelativePosition> {
        Some(self.init(heads.n_heads, device).into())
    }

    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![("8 buckets to 12", Self { num_buckets: 8, max_distance: 12, shared: false })]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_t5_on_a_table_of_distances() {
        // values of T5's _relative_position_bucket (32 buckets, max distance 128), computed by the
        // reference formula in Python; distances on a bucket boundary are left out, where float32
        // (torch) and float64 rounding may disagree
        let rel = [-200i64, -100, -50, -20, -15, -9, -7, -1, 0, 1, 7, 9, 15, 20, 50, 100, 200];
        let bidirectional = [15usize, 15, 13, 10, 9, 8, 7, 1, 0, 17, 23, 24, 25, 26, 29, 31, 31];
        let causal = [31usize, 30, 24, 17, 15, 9, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        for (i, r) in rel.iter().enumerate() {
            assert_eq!(t5_bucket(*r, true, 32, 128), bidirectional[i], "bidirectional, relative position {r}");
            assert_eq!(t5_bucket(*r, false, 32, 128), causal[i], "causal, relative position {r}");
        }
    }
}
