//! Reversible residual blocks (Gomez et al. 2017, RevNet; Kitaev et al. 2020, Reformer §3):
//!
//! Y₁ = X₁ + F(X₂)          F(x) = Dropout(Attention(LN(x)))
//! Y₂ = X₂ + G(Y₁)          G(x) = Dropout(FeedForward(LN(x)))
//!
//! and backwards, without any stored activation:
//!
//! X₂ = Y₂ − G(Y₁)          X₁ = Y₁ − F(X₂)
//!
//! A stack starts from (X₁, X₂) = (x, x) and ends with (Y₁ + Y₂)/2 (`merge = "mean"`, the
//! default: the width stays d_model, so the output embedding can stay tied; lucidrains'
//! reformer-pytorch) or with [Y₁ ; Y₂] (`merge = "concat"`, Reformer's own — trax and
//! transformers: the final norm and the head then read 2·d_model features, and the head has
//! its own weights). Training never keeps a block's activations: the decoder
//! runs the stack without a graph, then walks it backwards, rebuilding each block's inputs from
//! its outputs and recomputing that one block under autodiff to get its gradients
//! (`variorum_model::DecoderLm::reversible_grads`).
//!
//! Dropout must draw the same masks when a block is recomputed, so a reversible block drops out
//! its two branch outputs with masks drawn from a seed mixed with the layer and the branch
//! ([`ReplayDropout`]); the attention-weight and FFN-hidden dropouts are not used (the config
//! refuses `model.attention.dropout` with this block, and the FFN's is built at 0).

use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use variorum_attention::AttentionInput;
use variorum_core::{AttentionMask, AuxLosses, Capabilities, Declared};

use crate::block::{BlockKind, ResidualConfig};
use crate::{LayerState, NormKind, TransformerBlock};

/// `model.block` with `kind = "reversible"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReversibleConfig {
    /// `layer-norm` (default) or `rms-norm`.
    pub norm: NormKind,
    /// ε of the norms. Default 1e-5.
    pub norm_eps: f64,
    /// How the stack's two output streams become the head's input ([`StreamMerge`]). Default
    /// `"mean"`.
    #[serde(skip_serializing_if = "StreamMerge::is_mean")]
    pub merge: StreamMerge,
}

impl Default for ReversibleConfig {
    fn default() -> Self {
        let ResidualConfig { norm, norm_eps } = ResidualConfig::default();
        Self { norm, norm_eps, merge: StreamMerge::Mean }
    }
}

/// How a reversible stack's output streams Y₁, Y₂ are joined for the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StreamMerge {
    /// (Y₁ + Y₂)/2, d_model wide.
    #[default]
    Mean,
    /// [Y₁ ; Y₂], 2·d_model wide (Reformer's).
    Concat,
}

impl StreamMerge {
    fn is_mean(&self) -> bool {
        *self == Self::Mean
    }

    /// Width of the joined streams of a model `d_model` wide.
    pub fn width(&self, d_model: usize) -> usize {
        match self {
            Self::Mean => d_model,
            Self::Concat => 2 * d_model,
        }
    }
}

impl Declared for ReversibleConfig {
    const SUMMARY: &'static str = "two streams, Y1 = X1 + Attn(X2), Y2 = X2 + FFN(Y1); training rebuilds each block's inputs from its outputs instead of storing activations";
    const PAPER: &'static str =
        "Gomez et al. 2017, The Reversible Residual Network; Kitaev et al. 2020, Reformer: The Efficient Transformer";
    const CAPS: Capabilities = Capabilities::NEUTRAL;

    fn test_variants() -> Vec<(&'static str, Self)> {
        vec![("", Self::default()), ("streams concatenated", Self { merge: StreamMerge::Concat, ..Default::default() })]
    }
}

impl BlockKind for ReversibleConfig {
    fn residual(&self) -> ResidualConfig {
        ResidualConfig { norm: self.norm, norm_eps: self.norm_eps }
    }

    fn reversible(&self) -> bool {
        true
    }
}

/// The two residual streams of a reversible stack, `[batch, len, d_model]` each.
#[derive(Debug, Clone)]
pub struct Streams {
    /// X₁, the stream the attention branch adds to.
    pub x1: Tensor<3>,
    /// X₂, the stream the feed-forward branch adds to.
    pub x2: Tensor<3>,
}

impl Streams {
    /// The stack's input: both streams are `x`.
    pub fn split(x: Tensor<3>) -> Self {
        Self { x1: x.clone(), x2: x }
    }

    /// The stack's output: (Y₁ + Y₂)/2, or [Y₁ ; Y₂] along the features.
    pub fn merge(self, how: StreamMerge) -> Tensor<3> {
        match how {
            StreamMerge::Mean => (self.x1 + self.x2).div_scalar(2.0),
            StreamMerge::Concat => Tensor::cat(vec![self.x1, self.x2], 2),
        }
    }

    /// Both streams as plain tensors, off the autodiff graph.
    pub fn without_autodiff(self) -> Self {
        Self { x1: self.x1.without_autodiff(), x2: self.x2.without_autodiff() }
    }
}

/// Branch-output dropout whose masks a recomputation draws again: the mask of (layer, branch)
/// comes from a ChaCha8 stream seeded with `seed` mixed with both.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayDropout {
    /// Probability of dropping an entry (`model.dropout`).
    pub prob: f64,
    /// Base seed of every mask.
    pub seed: u64,
}

impl ReplayDropout {
    /// Inverted dropout of `x` with the mask of (`layer`, `branch`); the same on every call.
    pub fn apply(&self, x: Tensor<3>, layer: usize, branch: usize) -> Tensor<3> {
        if self.prob == 0.0 {
            return x;
        }
        let keep = 1.0 - self.prob;
        // drawn on the host from its own generator, not the device's: reseeding a device-wide
        // generator raced with every other draw on that device (parallel tests saw foreign masks)
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed, layer as u64 * 2 + branch as u64));
        let scale = (1.0 / keep) as f32;
        let dims = x.dims();
        let values: Vec<f32> =
            (0..dims.iter().product::<usize>()).map(|_| if rng.random::<f64>() < keep { scale } else { 0.0 }).collect();
        // the mask is a constant: built on the plain device, lifted to the graph's when needed
        let mask = Tensor::<3>::from_data(TensorData::new(values, dims), &x.device().without_autodiff());
        let mask = if x.is_autodiff() { mask.autodiff() } else { mask };
        x * mask
    }
}

/// SplitMix64's finaliser: well-spread seeds for neighbouring (layer, branch) pairs.
fn mix(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a reversible block needs besides its streams: the shared mask, the dropout (None =
/// inference) and which layer it is (for the dropout masks).
#[derive(Clone, Copy)]
pub struct RevContext<'a> {
    /// The attention mask every block of the stack shares.
    pub mask: &'a AttentionMask,
    /// Its dense form, built once per forward (none: mechanisms that need it build it).
    pub dense_mask: Option<&'a Tensor<4, Bool>>,
    /// The branch-output dropout; none at inference.
    pub dropout: Option<ReplayDropout>,
    /// The block's index in the stack, mixed into its dropout masks' seed.
    pub layer: usize,
}

impl RevContext<'_> {
    fn drop(&self, x: Tensor<3>, branch: usize) -> Tensor<3> {
        match &self.dropout {
            Some(d) => d.apply(x, self.layer, branch),
            None => x,
        }
    }
}

impl TransformerBlock {
    /// F(x) = Dropout(Attention(LN(x))), continuing from (and extending) `state`'s KV cache.
    fn rev_attention(&self, x: Tensor<3>, cx: &RevContext, state: Option<&mut LayerState>) -> (Tensor<3>, AuxLosses) {
        let input = AttentionInput {
            query: self.attn_norm.forward(x),
            key_value: None,
            mask: cx.mask,
            dense_mask: cx.dense_mask.cloned(),
            need_weights: false,
            // the rules keep kinds that read the previous layer's maps out of reversible stacks
            carried: None,
        };
        let out = self.attn.forward(input, state.map(|s| &mut s.attention));
        (cx.drop(out.context, 0), out.aux_losses)
    }

    /// G(x) = Dropout(FeedForward(LN(x))).
    fn rev_feed_forward(&self, x: Tensor<3>, cx: &RevContext, state: Option<&mut LayerState>) -> Tensor<3> {
        let window = state.map(|s| &mut s.transition);
        cx.drop(self.ffn.forward_with(self.norm_ffn_input(x), window), 1)
    }

    /// Y₁ = X₁ + F(X₂), Y₂ = X₂ + G(Y₁). With `state`, the attention continues from its cache
    /// (decoding works as in any block).
    pub fn reversible_forward(
        &self,
        s: Streams,
        cx: &RevContext,
        mut state: Option<&mut LayerState>,
    ) -> (Streams, AuxLosses) {
        let (f, aux) = self.rev_attention(s.x2.clone(), cx, state.as_deref_mut());
        let y1 = s.x1 + f;
        let y2 = s.x2 + self.rev_feed_forward(y1.clone(), cx, state);
        (Streams { x1: y1, x2: y2 }, aux)
    }

    /// The inputs of [`reversible_forward`](Self::reversible_forward) from its outputs:
    /// X₂ = Y₂ − G(Y₁), X₁ = Y₁ − F(X₂). Exact up to float rounding.
    pub fn reversible_inverse(&self, y: Streams, cx: &RevContext) -> Streams {
        let x2 = y.x2 - self.rev_feed_forward(y.x1.clone(), cx, None);
        let x1 = y.x1 - self.rev_attention(x2.clone(), cx, None).0;
        Streams { x1, x2 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockConfig;
    use burn::tensor::Distribution;

    fn block(dev: &Device) -> TransformerBlock {
        crate::block::tiny_block(BlockConfig::Reversible(ReversibleConfig::default()), dev)
    }

    fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    #[test]
    fn replayed_dropout_draws_the_same_mask_and_different_masks_per_branch() {
        let dev = Device::flex();
        let x: Tensor<3> = Tensor::ones([2, 8, 16], &dev);
        let d = ReplayDropout { prob: 0.5, seed: 7 };
        let a = d.apply(x.clone(), 3, 0);
        assert_eq!(max_diff(a.clone(), d.apply(x.clone(), 3, 0)), 0.0);
        assert!(max_diff(a.clone(), d.apply(x.clone(), 3, 1)) > 0.0);
        assert!(max_diff(a.clone(), d.apply(x.clone(), 4, 0)) > 0.0);
        // inverted dropout: kept entries scaled by 1/keep, about half kept
        let kept = a.clone().greater_elem(0.0).float().mean().into_scalar::<f32>();
        assert!((kept - 0.5).abs() < 0.1, "{kept}");
        assert!((a.max().into_scalar::<f32>() - 2.0).abs() < 1e-6);
    }

    #[test]
    fn inverse_rebuilds_the_inputs_with_dropout() {
        let dev = Device::flex();
        let blk = block(&dev);
        let s = Streams {
            x1: Tensor::random([2, 8, 16], Distribution::Normal(0.0, 1.0), &dev),
            x2: Tensor::random([2, 8, 16], Distribution::Normal(0.0, 1.0), &dev),
        };
        let mask = AttentionMask::causal();
        let cx =
            RevContext { mask: &mask, dense_mask: None, dropout: Some(ReplayDropout { prob: 0.3, seed: 1 }), layer: 2 };
        let (y, _) = blk.reversible_forward(s.clone(), &cx, None);
        assert!(max_diff(y.x1.clone(), s.x1.clone()) > 1e-2, "the block changed nothing");
        let back = blk.reversible_inverse(y, &cx);
        assert!(max_diff(back.x1, s.x1) < 1e-5);
        assert!(max_diff(back.x2, s.x2) < 1e-5);
    }
}
