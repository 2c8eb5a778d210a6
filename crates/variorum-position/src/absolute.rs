//! Absolute position signals: vectors added to the residual stream.

use burn::prelude::*;

use crate::{LearnedPosition, SinusoidalPosition, TimestepEncoding};

/// An initialised absolute scheme (added before the first block, or before one block).
#[derive(Module, Debug)]
pub enum AbsolutePosition {
    Sinusoidal(SinusoidalPosition),
    Learned(LearnedPosition),
    Timestep(TimestepEncoding),
}

impl AbsolutePosition {
    /// Position vectors for positions `start..start + len`, shape `[len, d_model]`.
    pub fn encode(&self, start: usize, len: usize, device: &Device) -> Tensor<2> {
        match self {
            Self::Sinusoidal(p) => p.encode(start, len, device),
            Self::Learned(p) => p.encode(start, len),
            Self::Timestep(p) => p.encode(start, len, device),
        }
    }

    /// `x + P[start..start+len]` for `x: [batch, len, d_model]`.
    pub fn forward(&self, x: Tensor<3>, start: usize) -> Tensor<3> {
        let [_, len, _] = x.dims();
        let p = self.encode(start, len, &x.device());
        x + p.unsqueeze_dim(0)
    }
}
