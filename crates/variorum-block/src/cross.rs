//! The cross-attention sublayer of an encoder–decoder's decoder block (Vaswani et al. 2017,
//! §3.1): between the block's self-attention and its feed-forward layer, each position attends
//! over the encoded source,
//!
//! pre-LN:  x = x + CrossAttn(LN(x), source)      post-LN:  x = LN(x + CrossAttn(x, source))
//!
//! with the block's residual placement and dropout. The source is read from the mask
//! ([`AttentionMask::source`]); its padding hides padded source positions. Cross-attention has no
//! position scheme (a decoder position and a source position share no axis) and no causality:
//! every target position may read the whole source. GTrXL's gates join the block's own two
//! branches only; the cross branch joins by a residual sum.

use burn::prelude::*;
use variorum_attention::{Attention, AttentionConfig, AttentionInput, AttentionState, Positioning};
use variorum_core::{AttentionMask, AuxLosses};

use crate::{Norm, ResidualConfig};

/// A decoder block's cross-attention sublayer: its norm and its attention over the source.
#[derive(Module, Debug)]
pub struct CrossAttention {
    /// The branch's norm: on the stream before the queries (pre-norm) or after the sum
    /// (post-norm).
    pub norm: Norm,
    /// The attention: queries from the stream, keys and values from the source; no positions.
    pub attn: Attention,
}

impl CrossAttention {
    /// `attention` must declare `Capabilities::cross` (the model's rules check it).
    pub fn new(
        attention: &AttentionConfig,
        residual: &ResidualConfig,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        device: &Device,
    ) -> Self {
        Self {
            norm: residual.norm.init(d_model, residual.norm_eps, device),
            attn: attention.init(d_model, init_std, out_std, Positioning::NONE, device),
        }
    }

    /// The branch's output for stream `x` (before dropout and the residual join): the queries
    /// from `x` (normalised first when `pre_norm`), keys and values from the mask's source.
    /// Decoding passes `state` (fresh for each source): the attention may keep what it derives
    /// from the source there.
    pub fn branch(
        &self,
        x: Tensor<3>,
        mask: &AttentionMask,
        pre_norm: bool,
        state: Option<&mut AttentionState>,
    ) -> (Tensor<3>, AuxLosses) {
        let source = mask.source.as_ref().expect("a decoder block with cross-attention reads an encoded source");
        let query = if pre_norm { self.norm.forward(x) } else { x };
        let cross_mask = source.mask();
        let input = AttentionInput::cross_attention(query, source.hidden.clone(), &cross_mask);
        let out = match state {
            Some(s) => self.attn.cross_attention(input, s),
            None => self.attn.forward(input, None),
        };
        (out.context, out.aux_losses)
    }
}
