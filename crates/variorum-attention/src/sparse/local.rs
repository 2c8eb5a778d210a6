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
use crate::pattern::band_attention::{BandAttention, Wrap};

attention_config! {
    /// `model.attention` with `kind = "local"`.
    pub struct LocalAttentionConfig {
        /// Positions per query block. Default 64.
        pub block: usize = 64,
        /// Positions before the block every query of it sees. Default 64.
        pub memory: usize = 64,
        /// Bidirectional only: positions after the block. Default `memory`.
        pub look_ahead: Option<usize> = None,
        /// Bidirectional only: the chunks wrap around — the first block's memory is the end of
        /// the sequence, the last block's look-ahead its start — as transformers' Reformer
        /// computes local attention (`memory` and `look_ahead` then whole blocks). Default false.
        pub wrap: bool = false,
        /// With `wrap`: a sequence longer than `block` is padded (with hidden keys) to a multiple
        /// of this, a multiple of `block` (transformers pads a Reformer's input to the least
        /// common multiple of its layers' chunks). Default `block`.
        pub pad_to: Option<usize> = None,
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
            wrap: self.wrap.then(|| Wrap {
                before: self.memory / self.block,
                after: self.look_ahead() / self.block,
                pad_to: self.pad_to.unwrap_or(self.block),
            }),
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

    /// Wrapped chunks score no distance a bias could act on, and a padded row would move the
    /// wrap; the causal form is the plain one (every wrapped key lies ahead).
    fn capabilities(&self) -> Capabilities {
        match self.wrap {
            true => Capabilities { score_bias: false, hides_padding: false, reads_memory: false, ..Self::CAPS },
            false => Self::CAPS,
        }
    }

    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        self.heads().validate(d_model)?;
        check(self.block >= 1, || "model.attention.block must be at least 1".into())?;
        if self.wrap {
            let whole = |key: &str, n: usize| {
                check(n % self.block == 0, || {
                    format!("model.attention.{key} = {n} must be whole blocks of {} with wrap = true", self.block)
                })
            };
            whole("memory", self.memory)?;
            whole("look_ahead", self.look_ahead())?;
            whole("pad_to", self.pad_to.unwrap_or(self.block))?;
            check(self.pad_to != Some(0), || "model.attention.pad_to must be at least 1".into())?;
        } else {
            check(self.pad_to.is_none(), || "model.attention.pad_to is read only with wrap = true".into())?;
        }
        Ok(())
    }

    /// Multiply–adds per token: at most memory + block keys.
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        self.heads().flops_per_token(d_model, len_k.min(self.memory + self.block))
    }

    fn test_variants() -> Vec<TestVariant<Self>> {
        [
            PositionConfig::default(),
            PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 16, shared: false }),
        ]
        .into_iter()
        .map(|position| {
            let cfg = Self { block: 3, memory: 2, ..Default::default() };
            TestVariant::new(format!("+ position {}", position.kind()), cfg).with_position(position)
        })
        .chain([TestVariant::new(
            "wrapped",
            Self { block: 2, memory: 2, look_ahead: Some(2), wrap: true, pad_to: Some(4), ..Default::default() },
        )
        .masked()])
        .collect()
    }
}
