//! Where the norms sit in a residual block, the `pre-ln` and `post-ln` kinds of `model.block`:
//!
//! post-LN (Vaswani et al. 2017):      x = LN(x + Attn(x));      x = LN(x + FFN(x))
//! pre-LN  (Xiong et al. 2020; GPT-2): x = x + Attn(LN(x));      x = x + FFN(LN(x)), and a final LN
//! parallel pre-LN (GPT-J, Wang & Komatsuzaki 2021; GPT-NeoX, Black et al. 2022; PaLM):
//!                                     x = x + Attn(LN₁(x)) + FFN(LN₂(x))
//!
//! The parallel form (`parallel = true`) reads one input in both branches, so the two can run
//! at once. GPT-NeoX keeps a norm per branch; GPT-J and Phi share one (`shared_norm = true`):
//!                                     x = x + Attn(LN(x)) + FFN(LN(x))
//!
//! Xiong et al. show that post-LN's gradients at the output layers are large at initialisation
//! (hence its learning-rate warm-up), pre-LN's are well-behaved without one.

use serde::{Deserialize, Serialize};
use variorum_core::error::check;
use variorum_core::{Capabilities, ConfigError, Declared};

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
    /// With `parallel`: both branches read one norm's output, `x + Attn(LN(x)) + FFN(LN(x))`
    /// (GPT-J, Phi), and the block has no feed-forward norm. Default false (a norm per branch,
    /// GPT-NeoX).
    pub shared_norm: bool,
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
        Self { norm, norm_eps, parallel: false, shared_norm: false }
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
            ("parallel-shared-norm", Self { parallel: true, shared_norm: true, ..Self::default() }),
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

    fn shared_norm(&self) -> bool {
        self.shared_norm
    }

    fn validate(&self) -> Result<(), ConfigError> {
        crate::block::check_norm_eps(&self.residual())?;
        check(self.parallel || !self.shared_norm, || {
            "model.block.shared_norm = true needs parallel = true: only parallel branches read one input".into()
        })
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

    /// Self-attention of `block` over `x`, causal.
    fn attend(block: &TransformerBlock, x: Tensor<3>, mask: &AttentionMask) -> Tensor<3> {
        let input =
            AttentionInput { query: x, key_value: None, mask, dense_mask: None, need_weights: false, carried: None };
        block.attn.forward(input, None).context
    }

    /// Norms with weights away from 1 and biases away from 0, so that a norm left out or moved
    /// shows.
    fn uneven_norms(block: &mut TransformerBlock, dev: &Device) {
        let norm = || {
            crate::Norm::Layer(crate::norm::LayerNorm {
                gamma: burn::module::Param::from_tensor(Tensor::random([16], Distribution::Uniform(0.5, 2.0), dev)),
                beta: Some(burn::module::Param::from_tensor(Tensor::random(
                    [16],
                    Distribution::Uniform(-1.0, 1.0),
                    dev,
                ))),
                epsilon: 1e-5,
            })
        };
        block.attn_norm = norm();
        block.ffn_norm = Some(norm());
    }

    /// The two placements written out: pre-LN x + Attn(LN₁x), then y + FFN(LN₂y); post-LN
    /// LN₁(x + Attn x), then LN₂(y + FFN y) — with the same weights, two different functions.
    #[test]
    fn pre_and_post_ln_put_the_norms_where_their_equations_do() {
        let dev = Device::flex();
        dev.seed(2);
        let x: Tensor<3> = Tensor::random([2, 8, 16], Distribution::Normal(0.0, 1.0), &dev);
        let mask = AttentionMask::causal();
        let mut pre = tiny_block(BlockConfig::PreLn(PreLnConfig::default()), &dev);
        uneven_norms(&mut pre, &dev);
        let (ln1, ln2) = (pre.attn_norm.clone(), pre.ffn_norm.clone().unwrap());
        let y = x.clone() + attend(&pre, ln1.forward(x.clone()), &mask);
        let want = y.clone() + pre.ffn.forward_with(ln2.forward(y), None);
        let got = pre.forward(x.clone(), &mask, None, None, None, false).x;
        let diff = (got.clone() - want).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "pre-LN off its equations by {diff}");

        let post = TransformerBlock { pre_norm: false, ..pre.clone() };
        let y = ln1.forward(x.clone() + attend(&post, x.clone(), &mask));
        let want = ln2.forward(y.clone() + post.ffn.forward_with(y, None));
        let got_post = post.forward(x.clone(), &mask, None, None, None, false).x;
        let diff = (got_post.clone() - want).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "post-LN off its equations by {diff}");
        assert!((got - got_post).abs().max().into_scalar::<f32>() > 1e-2, "the placements must differ");
        // the post-ln kind builds the post-LN wiring
        assert!(!tiny_block(BlockConfig::PostLn(PostLnConfig::default()), &dev).pre_norm);
    }

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
        let ffn = parallel.ffn.forward_with(parallel.ffn_norm.as_ref().unwrap().forward(x.clone()), None);
        let want = x.clone() + attn + ffn;
        let got = parallel.forward(x.clone(), &mask, None, None, None, false).x;
        let diff = (got.clone() - want).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "x + Attn(LN₁x) + FFN(LN₂x) off by {diff}");
        // the same weights one after the other compute something else
        let sequential = TransformerBlock { parallel: false, ..parallel };
        let seq = sequential.forward(x, &mask, None, None, None, false).x;
        assert!((got - seq).abs().max().into_scalar::<f32>() > 1e-3);
    }

    #[test]
    fn a_shared_norm_feeds_both_parallel_branches_the_same_normed_input() {
        let dev = Device::flex();
        let cfg = PreLnConfig { parallel: true, shared_norm: true, ..Default::default() };
        let shared = tiny_block(BlockConfig::PreLn(cfg), &dev);
        assert!(shared.ffn_norm.is_none(), "a shared norm is the block's only one");
        let x: Tensor<3> = Tensor::random([2, 8, 16], Distribution::Normal(0.0, 1.0), &dev);
        // the norm's weights away from 1 and 0, so that reading x unnormed would show
        let gamma = Tensor::<1>::random([16], Distribution::Uniform(0.5, 2.0), &dev);
        let beta = Tensor::<1>::random([16], Distribution::Uniform(-1.0, 1.0), &dev);
        let mut shared = shared;
        shared.attn_norm = crate::Norm::Layer(crate::norm::LayerNorm {
            gamma: burn::module::Param::from_tensor(gamma),
            beta: Some(burn::module::Param::from_tensor(beta)),
            epsilon: 1e-5,
        });
        let mask = AttentionMask::causal();
        let normed = shared.attn_norm.forward(x.clone());
        let input = AttentionInput {
            query: normed.clone(),
            key_value: None,
            mask: &mask,
            dense_mask: None,
            need_weights: false,
            carried: None,
        };
        let attn = shared.attn.forward(input, None).context;
        let want = x.clone() + attn + shared.ffn.forward_with(normed, None);
        let got = shared.forward(x.clone(), &mask, None, None, None, false).x;
        let diff = (got - want).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "x + Attn(LN x) + FFN(LN x) off by {diff}");
    }

    #[test]
    fn a_shared_norm_without_parallel_branches_is_refused() {
        let cfg = PreLnConfig { shared_norm: true, ..Default::default() };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("model.block.shared_norm") && err.contains("parallel"), "{err}");
    }
}
