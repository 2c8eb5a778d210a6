//! Where the norms sit in a residual block, the `pre-ln` and `post-ln` kinds of `model.block`:
//!
//! post-LN (Vaswani et al. 2017):      x = LN(x + Attn(x));      x = LN(x + FFN(x))
//! pre-LN  (Xiong et al. 2020; GPT-2): x = x + Attn(LN(x));      x = x + FFN(LN(x)), and a final LN
//!
//! Xiong et al. show that post-LN's gradients at the output layers are large at initialisation
//! (hence its learning-rate warm-up), pre-LN's are well-behaved without one.

use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, Declared};

use crate::NormKind;
use crate::block::{BlockKind, ResidualConfig};

/// `model.block` with `kind = "pre-ln"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PreLnConfig {
    /// `layer-norm` (default) or `rms-norm`.
    pub norm: NormKind,
    /// ε of the norms. Default 1e-5.
    pub norm_eps: f64,
}

/// `model.block` with `kind = "post-ln"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostLnConfig {
    /// `layer-norm` (default) or `rms-norm`.
    pub norm: NormKind,
    /// ε of the norms. Default 1e-5.
    pub norm_eps: f64,
}

impl Default for PreLnConfig {
    fn default() -> Self {
        let ResidualConfig { norm, norm_eps } = ResidualConfig::default();
        Self { norm, norm_eps }
    }
}

impl Default for PostLnConfig {
    fn default() -> Self {
        let ResidualConfig { norm, norm_eps } = ResidualConfig::default();
        Self { norm, norm_eps }
    }
}

impl Declared for PreLnConfig {
    const SUMMARY: &'static str = "norm at the start of each residual branch, final norm after the stack";
    const PAPER: &'static str =
        "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture; Radford et al. 2019 (GPT-2)";
    const CAPS: Capabilities = Capabilities::NEUTRAL;

    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![("layer-norm", Self::default()), ("rms-norm", Self { norm: NormKind::RmsNorm, ..Self::default() })]
    }
}

impl Declared for PostLnConfig {
    const SUMMARY: &'static str = "norm after each residual sum (original Transformer)";
    const PAPER: &'static str = "Vaswani et al. 2017, Attention Is All You Need";
    const CAPS: Capabilities = Capabilities::NEUTRAL;

    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![("layer-norm", Self::default()), ("rms-norm", Self { norm: NormKind::RmsNorm, ..Self::default() })]
    }
}

impl BlockKind for PreLnConfig {
    fn residual(&self) -> ResidualConfig {
        ResidualConfig { norm: self.norm, norm_eps: self.norm_eps }
    }
}

impl BlockKind for PostLnConfig {
    fn residual(&self) -> ResidualConfig {
        ResidualConfig { norm: self.norm, norm_eps: self.norm_eps }
    }

    fn pre_norm(&self) -> bool {
        false
    }
}
