//! Normalisation layers: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019).

use burn::nn::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NormKind {
    /// (x − mean) / √(var + ε) · γ + β
    #[default]
    LayerNorm,
    /// x / √(mean(x²) + ε) · γ
    RmsNorm,
}

impl NormKind {
    pub fn init(self, d_model: usize, eps: f64, device: &Device) -> Norm {
        match self {
            Self::LayerNorm => Norm::Layer(LayerNormConfig::new(d_model).with_epsilon(eps).init(device)),
            Self::RmsNorm => Norm::Rms(RmsNormConfig::new(d_model).with_epsilon(eps).init(device)),
        }
    }
}

#[derive(Module, Debug)]
pub enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Self::Layer(n) => n.forward(x),
            Self::Rms(n) => n.forward(x),
        }
    }
}
