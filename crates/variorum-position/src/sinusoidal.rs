//! Sinusoidal absolute position encoding (Vaswani et al. 2017):
//!
//! PE(i, 2k) = sin(i / base^(2k/d)),  PE(i, 2k+1) = cos(i / base^(2k/d)).
//!
//! With `learnable = true` the frequencies ω_k = base^(-2k/d) become parameters initialised to
//! those values (the learnable-sinusoid variant discussed by Wang et al. 2021, "On Position
//! Embeddings in BERT"). The table is computed for the requested positions on every call, so any
//! length can be encoded and there is nothing to save unless the frequencies are learned.

use crate::AbsolutePosition;
use crate::kind::{AbsoluteSignal, HeadShape, PositionKind};
use burn::module::Param;
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::Capabilities;
use variorum_core::{ConfigError, error::check};

/// `model.position` with `kind = "sinusoidal"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SinusoidalPositionConfig {
    /// Base of the geometric progression of wavelengths. Default 10000.
    pub base: f64,
    /// Learn the frequencies instead of fixing them. Default false.
    pub learnable: bool,
}

impl Default for SinusoidalPositionConfig {
    fn default() -> Self {
        Self { base: 10_000.0, learnable: false }
    }
}

impl SinusoidalPositionConfig {
    /// Checks the settings against `d_model` (even); messages name the config key.
    pub fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        check(d_model % 2 == 0, || {
            format!("model.position.kind = \"sinusoidal\" needs an even model.d_model, got {d_model}")
        })?;
        check(self.base > 1.0, || format!("model.position.base = {} must be > 1 (10000 is the paper's)", self.base))
    }

    /// The encoding for `d_model` dimensions, frequencies ω_k = base^(−2k/d).
    pub fn init(&self, d_model: usize, device: &Device) -> SinusoidalPosition {
        let half = d_model / 2;
        let freqs: Vec<f32> = (0..half).map(|k| self.base.powf(-(2.0 * k as f64) / d_model as f64) as f32).collect();
        let freqs = Tensor::<1>::from_data(TensorData::new(freqs, [half]), device);
        let frequencies = Param::from_tensor(freqs).set_require_grad(self.learnable);
        SinusoidalPosition { frequencies }
    }
}

/// The sinusoidal encoding, added to the embeddings.
#[derive(Module, Debug)]
pub struct SinusoidalPosition {
    /// ω_k, `[d_model / 2]`; trainable only when configured so.
    pub frequencies: Param<Tensor<1>>,
}

impl SinusoidalPosition {
    /// PE for positions `start..start + len`, `[len, d_model]`: sin at 2k, cos at 2k + 1.
    pub fn encode(&self, start: usize, len: usize, device: &Device) -> Tensor<2> {
        let freqs = self.frequencies.val();
        let [half] = freqs.dims();
        let pos = Tensor::<1, Int>::arange(start as i64..(start + len) as i64, device).float();
        let angles = pos.reshape([len, 1]) * freqs.reshape([1, half]); // [len, half]
        // interleave: dims 2k = sin, 2k+1 = cos
        Tensor::stack::<3>(vec![angles.clone().sin(), angles.cos()], 2).reshape([len, 2 * half])
    }
}

impl PositionKind for SinusoidalPositionConfig {
    const SUMMARY: &'static str =
        "fixed sin/cos of position added to the embeddings; configurable base, optionally learnable frequencies";
    const PAPER: &'static str = "Vaswani et al. 2017, Attention Is All You Need; Wang et al. 2021 (learnable)";
    const CAPS: Capabilities = Capabilities { absolute: true, ..Capabilities::NEUTRAL };

    fn validate(&self, heads: HeadShape, _context: usize) -> Result<(), ConfigError> {
        SinusoidalPositionConfig::validate(self, heads.d_model)
    }

    fn init_input(&self, d_model: usize, _context: usize, device: &Device) -> Option<AbsolutePosition> {
        Some(self.init(d_model, device).into())
    }

    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![("fixed", Self::default()), ("learnable frequencies", Self { learnable: true, ..Self::default() })]
    }
}

impl AbsoluteSignal for SinusoidalPosition {
    fn encode(&self, start: usize, len: usize, device: &Device) -> Tensor<2> {
        SinusoidalPosition::encode(self, start, len, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_paper_formula() {
        let dev = Device::flex();
        let p = SinusoidalPositionConfig::default().init(8, &dev);
        let t = p.encode(3, 2, &dev).into_data().try_to_vec::<f32>().unwrap();
        for (row, i) in [3.0f64, 4.0].iter().enumerate() {
            for k in 0..4 {
                let w = 10_000f64.powf(-(2.0 * k as f64) / 8.0);
                assert!((t[row * 8 + 2 * k] as f64 - (i * w).sin()).abs() < 1e-5);
                assert!((t[row * 8 + 2 * k + 1] as f64 - (i * w).cos()).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn offset_encoding_is_a_slice_of_the_full_one() {
        let dev = Device::flex();
        let p = SinusoidalPositionConfig::default().init(16, &dev);
        let full = p.encode(0, 10, &dev);
        let part = p.encode(4, 3, &dev);
        let diff = (full.slice([4..7, 0..16]) - part).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-6);
    }
}
