//! Axial positions (Kitaev et al. 2020, Reformer; the factorised table of Ho et al. 2019's Axial
//! Transformer): the positions are laid out on a grid n₁ × n₂ × … × n_k, and position t — whose
//! grid index (i₁, …, i_k) counts t in row-major order (the last axis fastest) — gets
//!
//! p_t = E₁(i₁) ⊕ E₂(i₂) ⊕ … ⊕ E_k(i_k),   E_a ∈ R^{n_a × d_a},   Σ d_a = d_model,
//!
//! the rows E_a(i) of k small learned tables concatenated (⊕), added to the token embeddings. Σ n_a·d_a
//! parameters encode Π n_a positions: for Reformer's 64 × 64 grid at d = 256, 32 K instead of
//! 1 M. Like a learned table it cannot encode a position past the grid, and refuses a context
//! longer than it.
//!
//! transformers' Reformer reads the grid the same way (`axial_pos_shape`, `axial_pos_embds_dim`)
//! at inference; in training it insists on sequences of exactly Π n_a positions and drops whole
//! rows of the broadcast tables — variorum trains on the table as it reads it, any length up to
//! the grid, with the model's embedding dropout.

use crate::AbsolutePosition;
use crate::kind::{AbsoluteSignal, HeadShape, PositionKind};
use burn::module::Param;
use burn::nn::Initializer;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::Capabilities;
use variorum_core::{ConfigError, error::check};

/// `model.position` with `kind = "axial"`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AxialPositionConfig {
    /// (n₁, …, n_k), the grid: Π n_a positions. Default: two axes, n₂ = ⌈√seq_len⌉ and
    /// n₁ = ⌈seq_len / n₂⌉.
    pub shape: Option<Vec<usize>>,
    /// (d₁, …, d_k), each table's width, summing to d_model. Default: d_model split evenly (the
    /// last axis takes the remainder).
    pub dims: Option<Vec<usize>>,
}

impl AxialPositionConfig {
    /// The grid, its default written out for a context of `context` positions.
    pub fn grid(&self, context: usize) -> Vec<usize> {
        self.shape.clone().unwrap_or_else(|| {
            let n2 = (1..).find(|n: &usize| n * n >= context).unwrap_or(1);
            vec![context.div_ceil(n2).max(1), n2]
        })
    }

    /// The tables' widths for a model `d_model` wide and `axes` axes.
    pub fn widths(&self, d_model: usize, axes: usize) -> Vec<usize> {
        self.dims.clone().unwrap_or_else(|| {
            let each = d_model / axes.max(1);
            (0..axes).map(|a| if a + 1 == axes { d_model - each * (axes - 1) } else { each }).collect()
        })
    }

    /// One table per axis, normal with std 0.02 (a learned table's start).
    pub fn init(&self, d_model: usize, context: usize, device: &Device) -> AxialPosition {
        let grid = self.grid(context);
        let widths = self.widths(d_model, grid.len());
        let tables = grid
            .iter()
            .zip(&widths)
            .map(|(&n, &d)| Initializer::Normal { mean: 0.0, std: 0.02 }.init([n, d], device))
            .collect();
        AxialPosition { tables }
    }
}

/// Position t as the concatenated rows of per-axis tables at t's grid index.
#[derive(Module, Debug)]
pub struct AxialPosition {
    /// E_a, `[n_a, d_a]` for each axis, the first the slowest.
    pub tables: Vec<Param<Tensor<2>>>,
}

impl AxialPosition {
    /// Positions the grid holds: Π n_a.
    pub fn max_len(&self) -> usize {
        self.tables.iter().map(|t| t.val().dims()[0]).product()
    }

    /// The rows of positions `start..start + len`, `[len, d_model]`. Callers check the length
    /// first (`DecoderLm` does).
    pub fn encode(&self, start: usize, len: usize) -> Tensor<2> {
        let max_len = self.max_len();
        assert!(start + len <= max_len, "the axial grid holds {max_len} positions, asked for {}", start + len);
        let mut stride = max_len;
        let columns = self
            .tables
            .iter()
            .map(|table| {
                let table = table.val();
                let n = table.dims()[0];
                stride /= n;
                let index: Vec<i64> = (start..start + len).map(|t| ((t / stride) % n) as i64).collect();
                let index = Tensor::<1, Int>::from_data(TensorData::new(index, [len]), &table.device());
                table.select(0, index)
            })
            .collect();
        Tensor::cat(columns, 1)
    }
}

impl PositionKind for AxialPositionConfig {
    const SUMMARY: &'static str = "axial positions: the rows of k small learned tables, one per axis of an n1 × … × nk grid of positions, concatenated (Reformer)";
    const PAPER: &'static str = "Kitaev et al. 2020 (Reformer); Ho et al. 2019 (Axial Transformer)";
    const CAPS: Capabilities = Capabilities { absolute: true, variable_length: false, ..Capabilities::NEUTRAL };

    fn expanded(&self, context: usize) -> Self {
        // the widths need d_model, which `init` supplies: only the grid is written out here
        Self { shape: Some(self.grid(context)), dims: self.dims.clone() }
    }

    fn validate(&self, heads: HeadShape, context: usize) -> Result<(), ConfigError> {
        let grid = self.grid(context);
        check(!grid.is_empty() && grid.iter().all(|&n| n >= 1), || {
            format!("model.position.shape = {grid:?} must list at least one axis, each at least 1 long")
        })?;
        let positions: usize = grid.iter().product();
        check(positions >= context, || {
            format!(
                "model.position.shape = {grid:?} holds {positions} positions, fewer than model.seq_len = {context}: \
                 lengthen an axis or leave shape out"
            )
        })?;
        if let Some(dims) = &self.dims {
            check(dims.len() == grid.len(), || {
                format!(
                    "model.position.dims = {dims:?} gives {} widths for {} axes of shape {grid:?}",
                    dims.len(),
                    grid.len()
                )
            })?;
            let sum: usize = dims.iter().sum();
            check(sum == heads.d_model && dims.iter().all(|&d| d >= 1), || {
                format!(
                    "model.position.dims = {dims:?} must be positive and sum to model.d_model = {} (they sum to {sum})",
                    heads.d_model
                )
            })?;
        } else {
            check(heads.d_model >= grid.len(), || {
                format!(
                    "model.d_model = {} is narrower than the {} axes of model.position.shape",
                    heads.d_model,
                    grid.len()
                )
            })?;
        }
        Ok(())
    }

    fn init_input(&self, d_model: usize, context: usize, device: &Device) -> Option<AbsolutePosition> {
        Some(self.init(d_model, context, device).into())
    }

    fn max_len(&self, context: usize) -> Option<usize> {
        Some(self.grid(context).iter().product())
    }

    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![
            ("default grid", Self::default()),
            ("three axes, uneven widths", Self { shape: Some(vec![2, 3, 4]), dims: Some(vec![8, 16, 8]) }),
        ]
    }
}

impl AbsoluteSignal for AxialPosition {
    fn encode(&self, start: usize, len: usize, _device: &Device) -> Tensor<2> {
        AxialPosition::encode(self, start, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(t: Tensor<2>) -> Vec<Vec<f32>> {
        let [n, d] = t.dims();
        let v = t.into_data().try_to_vec::<f32>().unwrap();
        (0..n).map(|i| v[i * d..(i + 1) * d].to_vec()).collect()
    }

    /// Position t reads row (t / (n₂·n₃)) mod n₁ of E₁, (t / n₃) mod n₂ of E₂ and t mod n₃ of E₃,
    /// concatenated in that order — written out by hand for every position of a 2 × 3 × 4 grid,
    /// from any start (a cached decoding step reads its own position's rows).
    #[test]
    fn position_t_concatenates_the_rows_of_its_grid_index() {
        let device = Device::default();
        let cfg = AxialPositionConfig { shape: Some(vec![2, 3, 4]), dims: Some(vec![1, 2, 3]) };
        let axial = cfg.init(6, 24, &device);
        let tables: Vec<Vec<Vec<f32>>> = axial.tables.iter().map(|t| rows(t.val())).collect();
        let want: Vec<Vec<f32>> = (0..24)
            .map(|t| [tables[0][t / 12].as_slice(), &tables[1][(t / 4) % 3], &tables[2][t % 4]].concat())
            .collect();
        for (start, len) in [(0, 24), (5, 7), (23, 1)] {
            assert_eq!(rows(axial.encode(start, len)), want[start..start + len], "positions {start}..{}", start + len);
        }
        // 6 + 2·3 + 3·4 parameters encode 24 positions
        let params: usize = axial.tables.iter().map(|t| t.val().dims().iter().product::<usize>()).sum();
        assert_eq!(params, 2 + 6 + 12);
    }

    #[test]
    fn the_default_grid_is_square_enough_and_holds_the_context() {
        let cfg = AxialPositionConfig::default();
        assert_eq!(cfg.grid(64), vec![8, 8]);
        assert_eq!(cfg.grid(60), vec![8, 8]);
        assert_eq!(cfg.grid(65), vec![8, 9]);
        assert_eq!(cfg.widths(128, 2), vec![64, 64]);
        assert_eq!(cfg.widths(10, 3), vec![3, 3, 4]);
        let heads = HeadShape { d_model: 10, n_heads: 1, head_dim: 10 };
        assert!(cfg.validate(heads, 65).is_ok());
    }

    #[test]
    fn grids_and_widths_that_do_not_fit_are_refused_by_name() {
        let heads = HeadShape { d_model: 8, n_heads: 1, head_dim: 8 };
        let short = AxialPositionConfig { shape: Some(vec![4, 4]), dims: None };
        assert!(short.validate(heads, 17).unwrap_err().to_string().contains("holds 16 positions"));
        let wide = AxialPositionConfig { shape: Some(vec![4, 4]), dims: Some(vec![4, 5]) };
        assert!(wide.validate(heads, 16).unwrap_err().to_string().contains("sum to model.d_model = 8"));
        let three = AxialPositionConfig { shape: Some(vec![4, 4]), dims: Some(vec![2, 2, 4]) };
        assert!(three.validate(heads, 16).unwrap_err().to_string().contains("3 widths for 2 axes"));
    }
}
