//! Residual wiring of a Transformer block, the `model.block` axis.
//!
//! post-LN (Vaswani et al. 2017):  x = LN(x + Attn(x));      x = LN(x + FFN(x))
//! pre-LN  (Xiong et al. 2020; GPT-2): x = x + Attn(LN(x));  x = x + FFN(LN(x))
//!
//! Dropout (`model.dropout`) is applied to each residual branch before the sum.

use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_attention::{Attention, AttentionConfig, AttentionInput, AttentionState, Positioning};
use variorum_core::{AttentionMask, AuxLosses, Capabilities, ConfigError, KindInfo, error::check};

use crate::{FeedForward, FeedForwardConfig, Norm, NormKind};

/// Settings shared by the residual kinds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResidualConfig {
    /// `layer-norm` (default) or `rms-norm`.
    pub norm: NormKind,
    /// ε of the norms. Default 1e-5.
    pub norm_eps: f64,
}

impl Default for ResidualConfig {
    fn default() -> Self {
        Self { norm: NormKind::LayerNorm, norm_eps: 1e-5 }
    }
}

/// `model.block`: `kind = "pre-ln" | "post-ln"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum BlockConfig {
    PreLn(ResidualConfig),
    PostLn(ResidualConfig),
}

impl Default for BlockConfig {
    fn default() -> Self {
        Self::PreLn(ResidualConfig::default())
    }
}

/// Everything a block is built from.
pub struct BlockParts<'a> {
    pub d_model: usize,
    pub attention: &'a AttentionConfig,
    /// The model's position scheme (its relative part lives in the attention).
    pub position: Positioning<'a>,
    pub feed_forward: &'a FeedForwardConfig,
    pub dropout: f64,
    pub init_std: f64,
    /// std of the residual output projections (GPT-2: init_std / √(2·n_layers)).
    pub out_std: f64,
}

impl BlockConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::PreLn(_) => "pre-ln",
            Self::PostLn(_) => "post-ln",
        }
    }

    pub fn residual(&self) -> &ResidualConfig {
        match self {
            Self::PreLn(r) | Self::PostLn(r) => r,
        }
    }

    pub fn pre_norm(&self) -> bool {
        matches!(self, Self::PreLn(_))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let eps = self.residual().norm_eps;
        check(eps > 0.0 && eps < 1.0, || format!("model.block.norm_eps = {eps} must be in (0, 1)"))
    }

    pub fn init(&self, parts: &BlockParts, device: &Device) -> TransformerBlock {
        let r = self.residual();
        TransformerBlock {
            attn_norm: r.norm.init(parts.d_model, r.norm_eps, device),
            attn: parts.attention.init(parts.d_model, parts.init_std, parts.out_std, parts.position, device),
            ffn_norm: r.norm.init(parts.d_model, r.norm_eps, device),
            ffn: parts.feed_forward.init(parts.d_model, parts.dropout, parts.init_std, parts.out_std, device),
            dropout: DropoutConfig::new(parts.dropout).init(),
            pre_norm: self.pre_norm(),
        }
    }

    pub fn zoo() -> Vec<KindInfo> {
        let caps = Capabilities::NEUTRAL;
        vec![
            KindInfo {
                axis: "model.block",
                kind: "post-ln",
                summary: "norm after each residual sum (original Transformer)",
                paper: "Vaswani et al. 2017, Attention Is All You Need",
                caps,
            },
            KindInfo {
                axis: "model.block",
                kind: "pre-ln",
                summary: "norm at the start of each residual branch, final norm after the stack",
                paper: "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture; Radford et al. 2019 (GPT-2)",
                caps,
            },
        ]
    }
}

#[derive(Module, Debug)]
pub struct TransformerBlock {
    pub attn_norm: Norm,
    pub attn: Attention,
    pub ffn_norm: Norm,
    pub ffn: FeedForward,
    pub dropout: Dropout,
    pub pre_norm: bool,
}

/// Output of one block.
pub struct BlockOutput {
    pub x: Tensor<3>,
    pub aux_losses: AuxLosses,
    pub weights: Option<Tensor<4>>,
}

impl TransformerBlock {
    pub fn forward(
        &self,
        x: Tensor<3>,
        mask: &AttentionMask,
        dense_mask: Option<Tensor<4, Bool>>,
        state: Option<&mut AttentionState>,
        need_weights: bool,
    ) -> BlockOutput {
        let attend = |h: Tensor<3>| {
            let mut input = AttentionInput::self_attention(h, mask).with_dense_mask(dense_mask);
            input.need_weights = need_weights;
            self.attn.forward(input, state)
        };
        if self.pre_norm {
            let a = attend(self.attn_norm.forward(x.clone()));
            let x = x + self.dropout.forward(a.context);
            let x = x.clone() + self.dropout.forward(self.ffn.forward(self.ffn_norm.forward(x)));
            BlockOutput { x, aux_losses: a.aux_losses, weights: a.weights }
        } else {
            let a = attend(x.clone());
            let x = self.attn_norm.forward(x + self.dropout.forward(a.context));
            let x = self.ffn_norm.forward(x.clone() + self.dropout.forward(self.ffn.forward(x)));
            BlockOutput { x, aux_losses: a.aux_losses, weights: a.weights }
        }
    }
}
