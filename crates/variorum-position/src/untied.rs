//! TUPE, untied positional encoding (Ke et al. 2021):
//!
//! α_ij = (1/√(2d)) (x_i W^Q)(x_j W^K)ᵀ + (1/√(2d)) (p_i U^Q)(p_j U^K)ᵀ,
//!
//! content and absolute position are never added together: positions get their own learned
//! table p and their own projections U^Q, U^K, and the position–position term is the same for every
//! sequence of a batch (computed once per forward). Nothing is added to the input.
//!
//! Choices: each layer has its own table (the paper shares one across layers and projects it per
//! layer); TUPE's optional relative bias and its \[CLS\] untying are left out (the latter has no
//! meaning in a decoder LM). The table bounds the positions: a longer sequence is refused by the
//! model with a clear error, as for `learned`.

use burn::module::Param;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{ConfigError, error::check};

use crate::RelativePosition;
use crate::ScoreLayout;
use crate::kind::{HeadShape, PositionKind, RelativeScheme};
use variorum_core::Capabilities;

/// `model.position` with `kind = "untied"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct UntiedConfig {
    /// Size of the position table. Default: the model's context `model.seq_len`.
    pub max_len: Option<usize>,
}

impl UntiedConfig {
    /// Checks the table covers the context `model.seq_len`; messages name the config key.
    pub fn validate(&self, context: usize) -> Result<(), ConfigError> {
        if let Some(m) = self.max_len {
            check(m >= context, || {
                format!(
                    "model.position.max_len = {m} is shorter than model.seq_len = {context}: raise it or leave it out"
                )
            })?;
        }
        Ok(())
    }

    /// One layer's table (`max_len` or `context` rows) and projections, normal with std 0.02.
    pub fn init(&self, d_model: usize, n_heads: usize, head_dim: usize, context: usize, device: &Device) -> Untied {
        let init = Initializer::Normal { mean: 0.0, std: 0.02 };
        Untied {
            table: init.init([self.max_len.unwrap_or(context), d_model], device),
            position_qk: LinearConfig::new(d_model, 2 * n_heads * head_dim)
                .with_bias(false)
                .with_initializer(init)
                .init(device),
            n_heads,
        }
    }
}

/// TUPE's position–position term of one attention layer.
#[derive(Module, Debug)]
pub struct Untied {
    /// p, `[max_len, d_model]`.
    pub table: Param<Tensor<2>>,
    /// [U^Q | U^K] fused.
    pub position_qk: Linear,
    /// Query heads h.
    pub n_heads: usize,
}

impl Untied {
    /// Rows of the table: the longest sequence it encodes.
    pub fn max_len(&self) -> usize {
        self.table.dims()[0]
    }

    /// Per-head projections `[h, len, d_h]` of the table rows `start..start+len`, for queries
    /// (`which = 0`) or keys (`which = 1`).
    fn project(&self, start: usize, len: usize, which: usize) -> Tensor<3> {
        let p = self.table.val();
        let [max_len, d] = p.dims();
        assert!(start + len <= max_len, "untied position table has {max_len} rows, asked for {}", start + len);
        let both = self.position_qk.forward(p.slice([start..start + len, 0..d]));
        let dh = both.dims()[1] / (2 * self.n_heads);
        let h = self.n_heads;
        both.narrow(1, which * h * dh, h * dh).reshape([len, h, dh]).swap_dims(0, 1)
    }

    /// scale · (p_i U^Q)(p_j U^K)ᵀ, `[1, h, len_q, len_k]`.
    pub fn score_term(&self, layout: &ScoreLayout, scale: f64) -> Tensor<4> {
        let (q, k) = self.products(layout, scale);
        q.matmul(k.swap_dims(1, 2)).unsqueeze_dim(0)
    }

    /// (scale · p_i U^Q, p_j U^K) per head, `[h, len_q, d_h]` and `[h, len_k, d_h]`.
    fn products(&self, layout: &ScoreLayout, scale: f64) -> (Tensor<3>, Tensor<3>) {
        let q = self.project(layout.q_start, layout.len_q, 0).mul_scalar(scale);
        (q, self.project(layout.k_start, layout.len_k, 1))
    }
}

impl PositionKind for UntiedConfig {
    const SUMMARY: &'static str = "content–content plus a separately projected position–position term (TUPE)";
    const PAPER: &'static str = "Ke et al. 2021, Rethinking Positional Encoding in Language Pre-training";
    const CAPS: Capabilities = Capabilities {
        variable_length: false,
        absolute: true,
        absolute_scores: true,
        score_bias: true,
        ..Capabilities::NEUTRAL
    };

    fn expanded(&self, context: usize) -> Self {
        Self { max_len: Some(self.max_len.unwrap_or(context)) }
    }

    fn validate(&self, _heads: HeadShape, context: usize) -> Result<(), ConfigError> {
        UntiedConfig::validate(self, context)
    }

    fn init_relative(&self, heads: HeadShape, context: usize, device: &Device) -> Option<RelativePosition> {
        Some(self.init(heads.d_model, heads.n_heads, heads.head_dim, context, device).into())
    }

    /// TUPE divides the content scores by √(2d): its position term adds one more of the same size.
    fn content_scale(&self) -> f64 {
        0.5f64.sqrt()
    }

    fn max_len(&self, context: usize) -> Option<usize> {
        Some(self.max_len.unwrap_or(context))
    }
}

impl RelativeScheme for Untied {
    fn scores(&self, scores: Tensor<4>, _q: Tensor<4>, _k: Tensor<4>, layout: &ScoreLayout, scale: f64) -> Tensor<4> {
        scores + self.score_term(layout, scale)
    }

    fn position_products(&self, layout: &ScoreLayout, scale: f64) -> Option<(Tensor<3>, Tensor<3>)> {
        Some(self.products(layout, scale))
    }

    fn has_position_products(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    /// TUPE's position–position term pair by pair, by hand: scale · (p_i U^Q)·(p_j U^K) for the
    /// queries' and keys' absolute rows (queries after the keys' start, as with a cache), U^Q
    /// and U^K the two halves of the fused projection, head by head.
    #[test]
    fn the_position_term_is_the_projected_rows_product() {
        let device = Device::default();
        let (d, heads, dh, rows) = (4usize, 2usize, 3usize, 12usize);
        let mut untied = UntiedConfig { max_len: Some(rows) }.init(d, heads, dh, rows, &device);
        let normal = |n: usize| Tensor::<1>::random([n], Distribution::Normal(0.0, 1.0), &device);
        untied.table = Param::from_tensor(normal(rows * d).reshape([rows, d]));
        untied.position_qk.weight = Param::from_tensor(normal(d * 2 * heads * dh).reshape([d, 2 * heads * dh]));
        let (q_start, k_start, len_q, len_k, scale) = (5usize, 2usize, 3usize, 7usize, 0.3);
        let layout = ScoreLayout::new(q_start, k_start, len_q, len_k, false);
        let got = untied.score_term(&layout, scale).into_data().try_to_vec::<f32>().unwrap();
        let p = untied.table.val().into_data().try_to_vec::<f32>().unwrap();
        let w = untied.position_qk.weight.val().into_data().try_to_vec::<f32>().unwrap();
        let width = 2 * heads * dh;
        // feature c of row r through column block `part` (0: U^Q, 1: U^K) of head h
        let proj = |r: usize, part: usize, h: usize, c: usize| -> f32 {
            let col = part * heads * dh + h * dh + c;
            (0..d).map(|x| p[r * d + x] * w[x * width + col]).sum()
        };
        for h in 0..heads {
            for i in 0..len_q {
                for j in 0..len_k {
                    let want: f32 = scale as f32
                        * (0..dh).map(|c| proj(q_start + i, 0, h, c) * proj(k_start + j, 1, h, c)).sum::<f32>();
                    let at = (h * len_q + i) * len_k + j;
                    assert!((got[at] - want).abs() < 1e-4, "head {h}, query {i}, key {j}: {} vs {want}", got[at]);
                }
            }
        }
    }
}
