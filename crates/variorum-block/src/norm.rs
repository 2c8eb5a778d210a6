//! Normalisation layers: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019).

use burn::module::{Initializer, Param};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// `model.block.norm`: the normalisation every norm of the blocks uses.
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
    /// A norm over `d_model` channels with ε = `eps`, starting at γ = 1 (and β = 0).
    pub fn init(self, d_model: usize, eps: f64, device: &Device) -> Norm {
        match self {
            Self::LayerNorm => Norm::Layer(LayerNorm::new(d_model, eps, device)),
            Self::RmsNorm => Norm::Rms(RmsNorm::new(d_model, eps, device)),
        }
    }
}

/// A normalisation layer of either kind, over the last dimension.
#[derive(Module, Debug)]
pub enum Norm {
    /// LayerNorm.
    Layer(LayerNorm),
    /// RMSNorm.
    Rms(RmsNorm),
}

/// LayerNorm with γ and β, Burn's `LayerNorm` in parameters and checkpoint names (`gamma`,
/// `beta`), whose forward runs the fused kernel on flex ([`variorum_kernels::layer_norm`]):
/// Burn's keeps its ε private, and the kernel needs it.
#[derive(Module, Debug)]
pub struct LayerNorm {
    /// γ, the per-channel scale `[d_model]`.
    pub gamma: Param<Tensor<1>>,
    /// β, the per-channel shift `[d_model]` (none: no shift, as Burn's allows).
    pub beta: Option<Param<Tensor<1>>>,
    /// ε, added to the variance.
    pub epsilon: f64,
}

impl LayerNorm {
    /// γ = 1, β = 0.
    pub fn new(d_model: usize, epsilon: f64, device: &Device) -> Self {
        Self {
            gamma: Initializer::Ones.init([d_model], device),
            beta: Some(Initializer::Zeros.init([d_model], device)),
            epsilon,
        }
    }

    /// Normalises `x` over its last dimension.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let beta = self.beta.as_ref().map(|b| b.val());
        variorum_kernels::layer_norm::layer_norm(x, self.gamma.val(), beta, self.epsilon)
    }
}

/// RMSNorm with γ, Burn's `RmsNorm` in parameters and checkpoint names (`gamma`), whose forward
/// runs the fused kernel on flex ([`variorum_kernels::layer_norm::rms_norm`]).
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// γ, the per-channel scale `[d_model]`.
    pub gamma: Param<Tensor<1>>,
    /// ε, added to the mean square.
    pub epsilon: f64,
}

impl RmsNorm {
    /// γ = 1.
    pub fn new(d_model: usize, epsilon: f64, device: &Device) -> Self {
        Self { gamma: Initializer::Ones.init([d_model], device), epsilon }
    }

    /// Normalises `x` over its last dimension.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        variorum_kernels::layer_norm::rms_norm(x, self.gamma.val(), self.epsilon)
    }
}

impl Norm {
    /// Normalises `x` over its last dimension with the layer's kind.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Self::Layer(n) => n.forward(x),
            Self::Rms(n) => n.forward(x),
        }
    }
}
