//! The Universal Transformer's coordinate embedding (Dehghani et al. 2019):
//!
//! P^t_{i,2k} = sin(i / base^(2k/d)) + sin(t / base^(2k/d)),
//! P^t_{i,2k+1} = cos(i / base^(2k/d)) + cos(t / base^(2k/d)),
//!
//! added to the state before recurrence step t = 1, 2, …: the position ⊕ step signal. As a
//! `model.position` of a plain stack it is added before every layer with t = the layer's number
//! (a Universal Transformer with untied weights); the universal block uses it with its own steps.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError};

use crate::AbsolutePosition;
use crate::kind::{AbsoluteSignal, HeadShape, PositionKind};

/// The position ⊕ step signal of one recurrence step. No parameters.
#[derive(Module, Debug)]
pub struct TimestepEncoding {
    /// The recurrence step t (1-based).
    pub step: usize,
    /// Base of the wavelengths (10000).
    pub base: f64,
    /// Width of the signal (even).
    pub d_model: usize,
}

impl TimestepEncoding {
    /// The signal of step `step` (1-based), `d_model` wide, base 10000.
    pub fn new(step: usize, d_model: usize) -> Self {
        Self { step, base: 10_000.0, d_model }
    }

    fn sinusoid(&self, x: f64, k: usize) -> (f64, f64) {
        let a = x * self.base.powf(-(2.0 * k as f64) / self.d_model as f64);
        (a.sin(), a.cos())
    }

    /// P^t for positions `start..start+len`, `[len, d_model]`.
    pub fn encode(&self, start: usize, len: usize, device: &Device) -> Tensor<2> {
        let half = self.d_model / 2;
        let mut v = vec![0f32; len * self.d_model];
        for (row, i) in (start..start + len).enumerate() {
            for k in 0..half {
                let (ps, pc) = self.sinusoid(i as f64, k);
                let (ts, tc) = self.sinusoid(self.step as f64, k);
                v[row * self.d_model + 2 * k] = (ps + ts) as f32;
                v[row * self.d_model + 2 * k + 1] = (pc + tc) as f32;
            }
        }
        Tensor::from_data(TensorData::new(v, [len, self.d_model]), device)
    }
}

/// `model.position` with `kind = "universal-timestep"`: no settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimestepConfig {}

impl PositionKind for TimestepConfig {
    const SUMMARY: &'static str = "position ⊕ recurrence-step sinusoids added before every block";
    const PAPER: &'static str = "Dehghani et al. 2019, Universal Transformers";
    const CAPS: Capabilities = Capabilities { absolute: true, per_layer: true, ..Capabilities::NEUTRAL };

    fn validate(&self, heads: HeadShape, _context: usize) -> Result<(), ConfigError> {
        variorum_core::error::check(heads.d_model % 2 == 0, || {
            format!("model.position.kind = \"universal-timestep\" needs an even model.d_model, got {}", heads.d_model)
        })
    }

    fn init_layer(&self, layer: usize, d_model: usize, _context: usize, _device: &Device) -> Option<AbsolutePosition> {
        Some(TimestepEncoding::new(layer + 1, d_model).into())
    }
}

impl AbsoluteSignal for TimestepEncoding {
    fn encode(&self, start: usize, len: usize, device: &Device) -> Tensor<2> {
        TimestepEncoding::encode(self, start, len, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_position_plus_step_sinusoids() {
        let dev = Device::flex();
        let p = TimestepEncoding::new(3, 8).encode(5, 2, &dev).into_data().try_to_vec::<f32>().unwrap();
        for (row, i) in [5.0f64, 6.0].iter().enumerate() {
            for k in 0..4 {
                let w = 10_000f64.powf(-(2.0 * k as f64) / 8.0);
                assert!((p[row * 8 + 2 * k] as f64 - ((i * w).sin() + (3.0 * w).sin())).abs() < 1e-5);
                assert!((p[row * 8 + 2 * k + 1] as f64 - ((i * w).cos() + (3.0 * w).cos())).abs() < 1e-5);
            }
        }
    }
}
