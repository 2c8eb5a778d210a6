//! Where the norms sit in a residual block, the `pre-ln` and `post-ln` kinds of `model.block`:
//!
//! post-LN (Vaswani et al. 2017):      x = LN(x + Attn(x));      x = LN(x + FFN(x))
//! pre-LN  (Xiong et al. 2020; GPT-2): x = x + Attn(LN(x));      x = x + FFN(LN(x)), and a final LN
//! parallel pre-LN (GPT-J, Wang & Komatsuzaki 2021; GPT-NeoX, Black et al. 2022; PaLM):
//!                                     x = x + Attn(LN₁(x)) + FFN(LN₂(x))
//!
//! The parallel form (`parallel = true`) reads one input in both branches, so the two can run
//! at once; GPT-NeoX keeps a norm per branch, as here (a model with one shared norm, GPT-J's, is
//! the case of two norms with equal weights).
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
    /// Attention and feed-forward both read the block's input and join the stream together:
    /// `x + Attn(LN₁(x)) + FFN(LN₂(x))` (GPT-J, GPT-NeoX, PaLM). Default false (one after the
    /// other).
    pub parallel: bool,
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
        Self { norm, norm_eps, parallel: false }
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
        vec![
            ("layer-norm", Self::default()),
            ("rms-norm", Self { norm: NormKind::RmsNorm, ..Self::default() }),
            ("parallel", Self { parallel: true, ..Self::default() }),
        ]
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

    fn parallel(&self) -> bool {
        self.parallel
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockConfig;
    use crate::block::{TransformerBlock, tiny_block};
    use burn::prelude::*;
    use burn::tensor::Distribution;
    use variorum_attention::AttentionInput;
    use variorum_core::AttentionMask;

    #[test]
    fn a_parallel_block_adds_both_branches_of_its_input_to_the_stream() {
        let dev = Device::flex();
        let parallel = tiny_block(BlockConfig::PreLn(PreLnConfig { parallel: true, ..Default::default() }), &dev);
        let x: Tensor<3> = Tensor::random([2, 8, 16], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        let input = AttentionInput {
            query: parallel.attn_norm.forward(x.clone()),
            key_value: None,
            mask: &mask,
            dense_mask: None,
            need_weights: false,
            carried: None,
        };
        let attn = parallel.attn.forward(input, None).context;
        let ffn = parallel.ffn.forward_with(parallel.ffn_norm.forward(x.clone()), None);
        let want = x.clone() + attn + ffn;
        let got = parallel.forward(x.clone(), &mask, None, None, None, false).x;
        let diff = (got.clone() - want).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "x + Attn(LN₁x) + FFN(LN₂x) off by {diff}");
        // the same weights one after the other compute something else
        let sequential = TransformerBlock { parallel: false, ..parallel };
        let seq = sequential.forward(x, &mask, None, None, None, false).x;
        assert!((got - seq).abs().max().into_scalar::<f32>() > 1e-3);
    }
}
