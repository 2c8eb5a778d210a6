//! 1D local attention of the Image Transformer (Parmar et al. 2018), the `local` kind: the
//! sequence is cut into non-overlapping query blocks of `block` positions; every query of a block
//! attends to the keys of its own block (up to itself when causal) and to the `memory` positions
//! before the block — and, bidirectionally, to `look_ahead` positions after it.
//!
//! Unlike a sliding window, all queries of a block share one key range, which is what lets the
//! original compute each block as one small dense attention. Here it runs on the same block
//! machinery as `sliding-window` ([`crate::pattern::band_attention::BandAttention`]): O(L·(memory + block)) scores.
//! 2D local attention over a raster image is the `local-2d` kind ([`crate::sparse::local_2d`]).

use burn::prelude::*;
use variorum_core::{Capabilities, ConfigError, error::check};
use variorum_position::{PositionConfig, T5BiasConfig};

use crate::contract::Positioning;
use crate::kind::{AttentionKind, TestVariant, caps};
use crate::pattern::band_attention::BandAttention;

attention_config! {
    /// `model.attention` with `kind = "local"`.
    pub struct LocalAttentionConfig {
        /// Positions per query block. Default 64.
        pub block: usize = 64,
        /// Positions before the block every query of it sees. Default 64.
        pub memory: usize = 64,
        /// Bidirectional only: positions after the block. Default `memory`.
        pub look_ahead: Option<usize> = None,
    }
}

impl LocalAttentionConfig {
    /// Positions after the block (bidirectional only): `look_ahead`, or `memory`.
    pub fn look_ahead(&self) -> usize {
        self.look_ahead.unwrap_or(self.memory)
    }

    /// The layer, a [`BandAttention`]: `init_std` for q/k/v, `out_std` for the output projection;
    /// `position` supplies the layer's relative scheme, if any.
    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> BandAttention {
        BandAttention {
            attention: self.heads().init(d_model, init_std, out_std, position, device),
            back: self.memory,
            look_ahead: self.look_ahead(),
            block: self.block,
            query_blocks: true,
            head_back: Vec::new(),
            global: Vec::new(),
            dilations: Vec::new(),
        }
    }
}

impl AttentionKind for LocalAttentionConfig {
    type Module = BandAttention;
    const SUMMARY: &'static str = "Image Transformer 1D local attention: non-overlapping query blocks see their block and `memory` positions before it; computed block by block";
    const PAPER: &'static str = "Parmar et al. 2018, Image Transformer";
    const CAPS: Capabilities = caps::BLOCKED_SCORES;
    head_kind_items!();

    fn expanded(&self, d_model: usize) -> Self {
        Self { look_ahead: Some(self.look_ahead()), ..self.expanded_heads(d_model) }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.block >= 1, || "model.attention.block must be at least 1".into())
    }

    /// Multiply–adds per token: at most memory + block keys.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, len_k.min(self.memory + self.block))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        [PositionConfig::default(), PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 16 })]
            .into_iter()
            .map(|position| {
                let cfg = Self { block: 3, memory: 2, ..Default::default() };
                TestVariant::new(format!("+ position {}", position.kind()), cfg).with_position(position)
            })
            .collect()
    }
}
