//! The `model.attention` axis.

use burn::prelude::*;
use serde::{Deserialize, Serialize};
use variorum_core::{Capabilities, ConfigError, KindInfo};

use crate::average::{AverageAttention, AverageAttentionConfig};
use crate::band::BandAttention;
use crate::bigbird::{BigBirdAttention, BigBirdConfig};
use crate::blockwise::{BlockwiseAttention, BlockwiseConfig};
use crate::clustered::{ClusteredAttention, ClusteredConfig};
use crate::contract::AttentionState;
use crate::etc::{EtcAttention, EtcConfig};
use crate::fixed::{FixedAttention, FixedConfig};
use crate::inducing_points::{InducingPointsAttention, InducingPointsConfig};
use crate::linear::{LinearAttention, LinearAttentionConfig};
use crate::linformer::{LinformerAttention, LinformerConfig};
use crate::local::LocalAttentionConfig;
use crate::local_2d::{Local2dAttention, Local2dConfig};
use crate::longformer::{LongformerAttention, LongformerConfig};
use crate::low_rank_band::{LowRankBandAttention, LowRankBandConfig};
use crate::lsh::{LshAttention, LshConfig};
use crate::memory_compressed::{MemoryCompressedAttention, MemoryCompressedConfig};
use crate::multi_scale::MultiScaleConfig;
use crate::nystrom::{NystromAttention, NystromConfig};
use crate::performer::{PerformerAttention, PerformerConfig};
use crate::poolingformer::{PoolingformerAttention, PoolingformerConfig};
use crate::prob_sparse::{ProbSparseAttention, ProbSparseConfig};
use crate::rfa::{RfaAttention, RfaConfig};
use crate::routing::{RoutingAttention, RoutingConfig};
use crate::sinkhorn::{SinkhornAttention, SinkhornConfig};
use crate::sliding_window::SlidingWindowConfig;
use crate::strided::{StridedAttention, StridedConfig};
use crate::{
    AdaptiveSpanAttention, AdaptiveSpanConfig, AttentionInput, AttentionOutput, MultiHeadAttention,
    MultiHeadAttentionConfig, Positioning,
};
use variorum_position::HeadShape;

/// `model.attention`: one variant per mechanism, chosen by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum AttentionConfig {
    /// Multi-head scaled dot-product attention (with grouped-/multi-query K/V heads).
    Full(MultiHeadAttentionConfig),
    /// Linformer: keys and values projected along the length to k rows (bidirectional only).
    Linformer(LinformerConfig),
    /// Nyströmformer: softmax attention through m segment-mean landmarks (bidirectional only).
    Nystrom(NystromConfig),
    /// Multi-head attention with a learned soft span per head (static or per token).
    AdaptiveSpan(AdaptiveSpanConfig),
    /// Band attention: each query sees the last `window` keys, computed by blocks.
    SlidingWindow(SlidingWindowConfig),
    /// Poolingformer: a sliding window, then pooling attention over its output (two levels).
    Poolingformer(PoolingformerConfig),
    /// A low-rank attention (small key size) mixed with a band attention per head.
    LowRankBand(LowRankBandConfig),
    /// Image Transformer 1D local attention: query blocks see their block and a memory before it.
    Local(LocalAttentionConfig),
    /// Image Transformer 2D local attention: query rectangles of a raster image see their memory
    /// rectangle.
    #[serde(rename = "local-2d")]
    Local2d(Local2dConfig),
    /// Band attention with one window width per head (Multi-Scale Transformer).
    MultiScale(MultiScaleConfig),
    /// Sparse Transformer's strided pattern: the previous ℓ positions and every ℓ-th one.
    Strided(StridedConfig),
    /// Longformer: sliding window with dilated heads and global positions or token ids.
    Longformer(LongformerConfig),
    /// BigBird: a blocked window, global tokens and random blocks.
    Bigbird(BigBirdConfig),
    /// Sparse Transformer's fixed pattern: the own block and the last c positions of every block.
    Fixed(FixedConfig),
    /// Blockwise attention: each head's query block attends to one permuted key block.
    Blockwise(BlockwiseConfig),
    /// ETC global–local attention: auxiliary global tokens, one per segment, beside the sequence.
    Etc(EtcConfig),
    /// Keys and values shortened by a strided convolution, plus the own block's raw keys.
    MemoryCompressed(MemoryCompressedConfig),
    /// Clustered attention: queries grouped by k-means, attention once per centroid (bidirectional).
    Clustered(ClusteredConfig),
    /// Informer's ProbSparse attention: the top queries by a sparsity measure attend, the rest get
    /// the mean of the values.
    ProbSparse(ProbSparseConfig),
    /// Linear attention, φ = elu + 1.
    Linear(LinearAttentionConfig),
    /// Inducing points: m learned slots pack the sequence (ISAB / Luna), every query unpacks them.
    InducingPoints(InducingPointsConfig),
    /// FAVOR+ positive (or ReLU) random features.
    Performer(PerformerConfig),
    /// Random Fourier features, optionally gated.
    Rfa(RfaConfig),
    /// Cumulative average + FFN + gate (Average Attention Network).
    Average(AverageAttentionConfig),
    /// Reformer's LSH attention: shared-QK, random-rotation buckets, sorted chunks.
    Lsh(LshConfig),
    /// Routing Transformer: queries and keys clustered by online k-means, attention per cluster.
    Routing(RoutingConfig),
    /// Sparse Sinkhorn attention: blocks attend to themselves and a learned soft sort of blocks.
    Sinkhorn(SinkhornConfig),
}

impl Default for AttentionConfig {
    fn default() -> Self {
        Self::Full(MultiHeadAttentionConfig::default())
    }
}

impl AttentionConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Full(_) => "full",
            Self::Linformer(_) => "linformer",
            Self::Nystrom(_) => "nystrom",
            Self::AdaptiveSpan(_) => "adaptive-span",
            Self::SlidingWindow(_) => "sliding-window",
            Self::Poolingformer(_) => "poolingformer",
            Self::LowRankBand(_) => "low-rank-band",
            Self::Local(_) => "local",
            Self::Local2d(_) => "local-2d",
            Self::MultiScale(_) => "multi-scale",
            Self::Strided(_) => "strided",
            Self::Bigbird(_) => "bigbird",
            Self::Fixed(_) => "fixed",
            Self::Blockwise(_) => "blockwise",
            Self::Etc(_) => "etc",
            Self::Longformer(_) => "longformer",
            Self::MemoryCompressed(_) => "memory-compressed",
            Self::Clustered(_) => "clustered",
            Self::ProbSparse(_) => "prob-sparse",
            Self::Linear(_) => "linear",
            Self::InducingPoints(_) => "inducing-points",
            Self::Performer(_) => "performer",
            Self::Rfa(_) => "rfa",
            Self::Average(_) => "average",
            Self::Lsh(_) => "lsh",
            Self::Routing(_) => "routing",
            Self::Sinkhorn(_) => "sinkhorn",
        }
    }

    /// Whether the kind scores every query against every key (an L × L matrix per head).
    pub fn scores_every_key(&self) -> bool {
        matches!(self, Self::Full(_))
    }

    /// The config of layer `i`: kinds with per-layer settings (`layer_windows`) pick theirs.
    pub fn for_layer(&self, i: usize) -> Self {
        match self {
            Self::SlidingWindow(c) => Self::SlidingWindow(c.for_layer(i)),
            Self::MultiScale(c) => Self::MultiScale(c.for_layer(i)),
            Self::Strided(c) => Self::Strided(c.for_layer(i)),
            Self::Bigbird(c) => Self::Bigbird(c.for_layer(i)),
            Self::Fixed(c) => Self::Fixed(c.for_layer(i)),
            Self::Longformer(c) => Self::Longformer(c.for_layer(i)),
            Self::Lsh(c) => Self::Lsh(c.for_layer(i)),
            Self::ProbSparse(c) => Self::ProbSparse(c.for_layer(i)),
            other => other.clone(),
        }
    }

    /// Whether some keys are gathered from anywhere in the sequence (random blocks, summaries,
    /// permuted blocks), so only position schemes that act through the distance alone apply.
    pub fn gathers_keys(&self) -> bool {
        matches!(self, Self::Bigbird(_) | Self::Fixed(_) | Self::Blockwise(_) | Self::Local2d(_))
    }

    /// Layers with their own setting (0 = the same in every layer).
    pub fn per_layer(&self) -> usize {
        match self {
            Self::SlidingWindow(c) => c.layer_windows.len(),
            Self::MultiScale(c) => c.layer_windows.len(),
            Self::Longformer(c) => c.per_layer(),
            _ => 0,
        }
    }

    /// Training steps between draws of random features (0 = never; kinds without them: 0).
    pub fn redraw_interval(&self) -> usize {
        match self {
            Self::Performer(c) => c.redraw_interval,
            Self::Rfa(c) => c.redraw_interval,
            _ => 0,
        }
    }

    /// Why a kind without a causal form has none, for the refusal of a next-token model.
    pub fn why_not_causal(&self) -> &'static str {
        match self.kind() {
            "linformer" => "E and F mix every position, later ones included, into each projected key and value",
            "nystrom" => {
                "its landmarks are means over segments that reach past the query, coupled by one pseudo-inverse"
            }
            "clustered" => "a cluster's centroid, and so every member's attention, depends on later queries",
            "inducing-points" => "every slot reads the whole sequence before any position reads the slots",
            _ => "its outputs mix in positions after them",
        }
    }

    pub fn capabilities(&self) -> Capabilities {
        Self::zoo().into_iter().find(|k| k.kind == self.kind()).map(|k| k.caps).unwrap_or_default()
    }

    /// Refuses a sequence (or cross-attention source) of `seq_len` positions that the kind cannot
    /// take: Linformer's projections have a fixed length. Every other kind takes any length.
    pub fn validate_len(&self, seq_len: usize) -> Result<(), ConfigError> {
        match self {
            Self::Linformer(c) => c.validate_len(seq_len),
            _ => Ok(()),
        }
    }

    /// The same config with every derived default written out.
    pub fn expanded(&self, d_model: usize) -> Self {
        match self {
            Self::Full(c) => Self::Full(c.expanded(d_model)),
            Self::Linformer(c) => Self::Linformer(c.expanded(d_model)),
            Self::Nystrom(c) => Self::Nystrom(c.expanded(d_model)),
            Self::AdaptiveSpan(c) => Self::AdaptiveSpan(c.expanded(d_model)),
            Self::SlidingWindow(c) => Self::SlidingWindow(c.expanded(d_model)),
            Self::Poolingformer(c) => Self::Poolingformer(c.expanded(d_model)),
            Self::LowRankBand(c) => Self::LowRankBand(c.expanded(d_model)),
            Self::Local(c) => Self::Local(c.expanded(d_model)),
            Self::Local2d(c) => Self::Local2d(c.expanded(d_model)),
            Self::MultiScale(c) => Self::MultiScale(c.expanded(d_model)),
            Self::Strided(c) => Self::Strided(c.expanded(d_model)),
            Self::Bigbird(c) => Self::Bigbird(c.expanded(d_model)),
            Self::Fixed(c) => Self::Fixed(c.expanded(d_model)),
            Self::Blockwise(c) => Self::Blockwise(c.expanded(d_model)),
            Self::Etc(c) => Self::Etc(c.expanded(d_model)),
            Self::Longformer(c) => Self::Longformer(c.expanded(d_model)),
            Self::MemoryCompressed(c) => Self::MemoryCompressed(c.expanded(d_model)),
            Self::Clustered(c) => Self::Clustered(c.expanded(d_model)),
            Self::ProbSparse(c) => Self::ProbSparse(c.expanded(d_model)),
            Self::Linear(c) => Self::Linear(c.expanded(d_model)),
            Self::InducingPoints(c) => Self::InducingPoints(c.expanded(d_model)),
            Self::Performer(c) => Self::Performer(c.expanded(d_model)),
            Self::Rfa(c) => Self::Rfa(c.expanded(d_model)),
            Self::Average(c) => Self::Average(c.expanded(d_model)),
            Self::Lsh(c) => Self::Lsh(c.expanded(d_model)),
            Self::Routing(c) => Self::Routing(c.expanded(d_model)),
            Self::Sinkhorn(c) => Self::Sinkhorn(c.expanded(d_model)),
        }
    }

    pub fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        match self {
            Self::Full(c) => c.validate(d_model),
            Self::Linformer(c) => c.validate(d_model),
            Self::Nystrom(c) => c.validate(d_model),
            Self::AdaptiveSpan(c) => c.validate(d_model),
            Self::SlidingWindow(c) => c.validate(d_model),
            Self::Poolingformer(c) => c.validate(d_model),
            Self::LowRankBand(c) => c.validate(d_model),
            Self::Local(c) => c.validate(d_model),
            Self::Local2d(c) => c.validate(d_model),
            Self::MultiScale(c) => c.validate(d_model),
            Self::Strided(c) => c.validate(d_model),
            Self::Bigbird(c) => c.validate(d_model),
            Self::Fixed(c) => c.validate(d_model),
            Self::Blockwise(c) => c.validate(d_model),
            Self::Etc(c) => c.validate(d_model),
            Self::Longformer(c) => c.validate(d_model),
            Self::MemoryCompressed(c) => c.validate(d_model),
            Self::Clustered(c) => c.validate(d_model),
            Self::ProbSparse(c) => c.validate(d_model),
            Self::Linear(c) => c.validate(d_model),
            Self::InducingPoints(c) => c.validate(d_model),
            Self::Performer(c) => c.validate(d_model),
            Self::Rfa(c) => c.validate(d_model),
            Self::Average(c) => c.validate(d_model),
            Self::Lsh(c) => c.validate(d_model),
            Self::Routing(c) => c.validate(d_model),
            Self::Sinkhorn(c) => c.validate(d_model),
        }
    }

    pub fn init(
        &self,
        d_model: usize,
        init_std: f64,
        out_std: f64,
        position: Positioning,
        device: &Device,
    ) -> Attention {
        match self {
            Self::Full(c) => Attention::Full(c.init(d_model, init_std, out_std, position, device)),
            Self::Linformer(c) => Attention::Linformer(c.init(d_model, init_std, out_std, device)),
            Self::Nystrom(c) => Attention::Nystrom(c.init(d_model, init_std, out_std, device)),
            Self::AdaptiveSpan(c) => Attention::AdaptiveSpan(c.init(d_model, init_std, out_std, position, device)),
            Self::SlidingWindow(c) => Attention::SlidingWindow(c.init(d_model, init_std, out_std, position, device)),
            Self::Poolingformer(c) => Attention::Poolingformer(c.init(d_model, init_std, out_std, device)),
            Self::LowRankBand(c) => Attention::LowRankBand(c.init(d_model, init_std, out_std, device)),
            Self::Local(c) => Attention::Local(c.init(d_model, init_std, out_std, position, device)),
            Self::Local2d(c) => Attention::Local2d(c.init(d_model, init_std, out_std, position, device)),
            Self::MultiScale(c) => Attention::MultiScale(c.init(d_model, init_std, out_std, position, device)),
            Self::Strided(c) => Attention::Strided(c.init(d_model, init_std, out_std, position, device)),
            Self::Bigbird(c) => Attention::Bigbird(c.init(d_model, init_std, out_std, position, device)),
            Self::Fixed(c) => Attention::Fixed(c.init(d_model, init_std, out_std, position, device)),
            Self::Blockwise(c) => Attention::Blockwise(c.init(d_model, init_std, out_std, position, device)),
            Self::Etc(c) => Attention::Etc(c.init(d_model, init_std, out_std, position, device)),
            Self::Longformer(c) => Attention::Longformer(c.init(d_model, init_std, out_std, position, device)),
            Self::MemoryCompressed(c) => Attention::MemoryCompressed(c.init(d_model, init_std, out_std, device)),
            Self::Clustered(c) => Attention::Clustered(c.init(d_model, init_std, out_std, device)),
            Self::ProbSparse(c) => Attention::ProbSparse(c.init(d_model, init_std, out_std, device)),
            Self::Linear(c) => Attention::Linear(c.init(d_model, init_std, out_std, device)),
            Self::InducingPoints(c) => Attention::InducingPoints(c.init(d_model, init_std, out_std, device)),
            Self::Performer(c) => Attention::Performer(c.init(d_model, init_std, out_std, device)),
            Self::Rfa(c) => Attention::Rfa(c.init(d_model, init_std, out_std, device)),
            Self::Average(c) => Attention::Average(c.init(d_model, init_std, out_std, device)),
            Self::Lsh(c) => Attention::Lsh(c.init(d_model, init_std, out_std, device)),
            Self::Routing(c) => Attention::Routing(c.init(d_model, init_std, out_std, device)),
            Self::Sinkhorn(c) => Attention::Sinkhorn(c.init(d_model, init_std, out_std, device)),
        }
    }

    /// Dropout on the attention weights (kinds without weights: 0).
    pub fn dropout(&self) -> f64 {
        match self {
            Self::Full(c) => c.dropout,
            Self::Linformer(c) => c.dropout,
            Self::Nystrom(c) => c.dropout,
            Self::AdaptiveSpan(c) => c.heads().dropout,
            Self::SlidingWindow(c) => c.dropout,
            Self::Poolingformer(c) => c.dropout,
            Self::LowRankBand(c) => c.dropout,
            Self::Local(c) => c.dropout,
            Self::Local2d(c) => c.dropout,
            Self::MultiScale(c) => c.dropout,
            Self::Strided(c) => c.dropout,
            Self::Bigbird(c) => c.dropout,
            Self::Fixed(c) => c.dropout,
            Self::Blockwise(c) => c.dropout,
            Self::Etc(c) => c.dropout,
            Self::Longformer(c) => c.dropout,
            Self::MemoryCompressed(c) => c.dropout,
            Self::Clustered(c) => c.dropout,
            Self::ProbSparse(c) => c.dropout,
            Self::Lsh(c) => c.dropout,
            Self::Routing(c) => c.dropout,
            Self::Sinkhorn(c) => c.dropout,
            Self::Linear(_) | Self::Performer(_) | Self::Rfa(_) | Self::Average(_) => 0.0,
            Self::InducingPoints(c) => c.dropout,
        }
    }

    /// Query heads and head size (what position schemes are built for).
    pub fn heads(&self, d_model: usize) -> HeadShape {
        match self {
            Self::Full(c) => c.heads(d_model),
            Self::Linformer(c) => c.heads(d_model),
            Self::Nystrom(c) => c.heads(d_model),
            Self::AdaptiveSpan(c) => c.heads().heads(d_model),
            Self::SlidingWindow(c) => c.head_shape(d_model),
            Self::Poolingformer(c) => c.heads(d_model),
            Self::LowRankBand(c) => c.heads(d_model),
            Self::Local(c) => c.head_shape(d_model),
            Self::Local2d(c) => c.head_shape(d_model),
            Self::MultiScale(c) => c.head_shape(d_model),
            Self::Strided(c) => c.head_shape(d_model),
            Self::Bigbird(c) => c.head_shape(d_model),
            Self::Fixed(c) => c.head_shape(d_model),
            Self::Blockwise(c) => c.head_shape(d_model),
            Self::Etc(c) => c.head_shape(d_model),
            Self::Longformer(c) => c.head_shape(d_model),
            Self::MemoryCompressed(c) => c.heads(d_model),
            Self::Clustered(c) => c.heads(d_model),
            Self::ProbSparse(c) => c.heads(d_model),
            Self::Linear(c) => c.heads(d_model),
            Self::InducingPoints(c) => c.heads(d_model),
            Self::Performer(c) => c.heads(d_model),
            Self::Rfa(c) => c.heads(d_model),
            Self::Average(c) => c.heads(d_model),
            Self::Lsh(c) => c.heads(d_model),
            Self::Routing(c) => c.heads(d_model),
            Self::Sinkhorn(c) => c.heads(d_model),
        }
    }

    /// FLOPs per token (forward), for `variorum inspect`.
    pub fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        match self {
            Self::Full(c) => c.flops_per_token(d_model, len_k),
            Self::Linformer(c) => c.flops_per_token(d_model, len_k),
            Self::Nystrom(c) => c.flops_per_token(d_model, len_k),
            // at most S keys back
            Self::AdaptiveSpan(c) => c.heads().flops_per_token(d_model, len_k.min(c.max_span)),
            Self::SlidingWindow(c) => c.flops_per_token(d_model, len_k),
            Self::Poolingformer(c) => c.flops_per_token(d_model, len_k),
            Self::LowRankBand(c) => c.flops_per_token(d_model, len_k),
            Self::Local(c) => c.flops_per_token(d_model, len_k),
            Self::Local2d(c) => c.flops_per_token(d_model, len_k),
            Self::MultiScale(c) => c.flops_per_token(d_model, len_k),
            Self::Strided(c) => c.flops_per_token(d_model, len_k),
            Self::Bigbird(c) => c.flops_per_token(d_model, len_k),
            Self::Fixed(c) => c.flops_per_token(d_model, len_k),
            Self::Blockwise(c) => c.flops_per_token(d_model, len_k),
            Self::Etc(c) => c.flops_per_token(d_model, len_k),
            Self::Longformer(c) => c.flops_per_token(d_model, len_k),
            Self::MemoryCompressed(c) => c.flops_per_token(d_model, len_k),
            Self::Clustered(c) => c.flops_per_token(d_model, len_k),
            Self::ProbSparse(c) => c.flops_per_token(d_model, len_k),
            Self::Linear(c) => kernel_flops(c.heads(d_model), c.heads(d_model).head_dim, c.chunk),
            Self::InducingPoints(c) => c.flops_per_token(d_model, len_k),
            Self::Performer(c) => kernel_flops(c.heads(d_model), c.features(d_model), c.chunk),
            Self::Rfa(c) => kernel_flops(c.heads(d_model), 2 * c.features(d_model), c.chunk),
            Self::Average(c) => c.flops_per_token(d_model),
            Self::Lsh(c) => c.flops_per_token(d_model, len_k),
            Self::Routing(c) => c.flops_per_token(d_model, len_k),
            Self::Sinkhorn(c) => c.flops_per_token(d_model, len_k),
        }
    }

    pub fn zoo() -> Vec<KindInfo> {
        vec![
            KindInfo {
                axis: "model.attention",
                kind: "full",
                summary: "multi-head scaled dot-product attention; grouped-/multi-query K/V heads; KV cache",
                paper: "Vaswani et al. 2017, Attention Is All You Need; Shazeer 2019 (MQA); Ainslie et al. 2023 (GQA)",
                caps: Capabilities {
                    causal: true,
                    bidirectional: true,
                    incremental: true,
                    score_bias: true,
                    qk_rotation: true,
                    aux_losses: false,
                    variable_length: true,
                },
            },
            KindInfo {
                axis: "model.attention",
                kind: "linformer",
                summary: "Linformer: keys and values projected along the length by learned E, F (k × max_len), softmax(Q(EK)ᵀ/√d)(FV); O(L·k); bidirectional only (E mixes every position, later ones included, into each projected key, and has a fixed length max_len)",
                paper: "Wang et al. 2020, Linformer: Self-Attention with Linear Complexity",
                caps: Capabilities {
                    causal: false,
                    bidirectional: true,
                    incremental: false,
                    score_bias: false,
                    qk_rotation: false,
                    aux_losses: false,
                    variable_length: false,
                },
            },
            bidirectional_kind(
                "nystrom",
                "Nyströmformer: m segment-mean landmarks, softmax(QK̃ᵀ)·pinv(softmax(Q̃K̃ᵀ))·softmax(Q̃Kᵀ)V with an iterative pseudo-inverse (or CSALR's (Ã + λI)⁻¹), optional depthwise conv on V; O(L·m); bidirectional only (each landmark averages a whole segment, later positions included)",
                "Xiong et al. 2021, Nyströmformer: A Nyström-Based Algorithm for Approximating Self-Attention",
            ),
            KindInfo {
                axis: "model.attention",
                kind: "adaptive-span",
                summary: "multi-head attention with a learned soft span per head (or per token), L1 penalty, keys beyond the span not computed",
                paper: "Sukhbaatar et al. 2019, Adaptive Attention Span in Transformers",
                caps: Capabilities {
                    causal: true,
                    bidirectional: false,
                    incremental: true,
                    score_bias: true,
                    qk_rotation: true,
                    aux_losses: true,
                    variable_length: true,
                },
            },
            sparse_kind(
                "sliding-window",
                "band attention over the last `window` keys (look-ahead when bidirectional), computed block by block; KV cache trimmed to the window",
                "Beltagy et al. 2020, Longformer; Child et al. 2019 (local attention)",
            ),
            kernel_kind(
                "poolingformer",
                "two-level attention: a sliding window of `window` keys, then pooling attention (max/mean over segments of `pool_size`, within `level2_window`) over the first level's output, summed; causal: finished segments only; computed by blocks",
                "Zhang et al. 2021, Poolingformer: Long Document Modeling with Pooling Attention",
            ),
            kernel_kind(
                "low-rank-band",
                "per head, a gated mix of a low-rank attention (query/key size `rank`, all L keys) and a band attention of width `band` (computed by blocks) over shared values",
                "Guo, Qiu, Liu, Xue, Zhang 2019, Low-Rank and Locality Constrained Self-Attention for Sequence Modeling",
            ),
            sparse_kind(
                "local",
                "Image Transformer 1D local attention: non-overlapping query blocks see their block and `memory` positions before it; computed block by block",
                "Parmar et al. 2018, Image Transformer",
            ),
            sparse_kind(
                "local-2d",
                "Image Transformer 2D local attention: the sequence is a raster image of `width` columns; query rectangles see their memory rectangle (rows above, columns either side); computed rectangle by rectangle",
                "Parmar et al. 2018, Image Transformer",
            ),
            sparse_kind(
                "multi-scale",
                "band attention with its own window width per head (`windows`), computed block by block",
                "Guo et al. 2019, Multi-Scale Self-Attention for Text Classification",
            ),
            sparse_kind(
                "longformer",
                "Longformer: sliding window with per-head dilation, global attention for chosen positions or token ids, per-layer windows and dilations; computed block by block",
                "Beltagy et al. 2020, Longformer: The Long-Document Transformer",
            ),
            sparse_kind(
                "bigbird",
                "BigBird: blocked sliding window, global tokens (the first g positions) and r random blocks per query block, fixed per layer by a seed; computed block by block",
                "Zaheer et al. 2020, Big Bird: Transformers for Longer Sequences",
            ),
            sparse_kind(
                "fixed",
                "Sparse Transformer fixed pattern: the own block of ℓ and the last c positions of every block (union, split heads or alternating layers)",
                "Child et al. 2019, Generating Long Sequences with Sparse Transformers",
            ),
            sparse_kind(
                "blockwise",
                "blockwise attention: head h's query block t sees key block (t + s_h) mod n; causal: its own block and the block s_h before",
                "Qiu et al. 2019, Blockwise Self-Attention for Long Document Understanding",
            ),
            sparse_kind(
                "etc",
                "ETC global-local attention: one auxiliary global token per segment beside the sequence; l2l window (relative positions), l2g completed segments, g2l own segment, g2g",
                "Ainslie et al. 2020, ETC: Encoding Long and Structured Inputs in Transformers",
            ),
            KindInfo {
                axis: "model.attention",
                kind: "memory-compressed",
                summary: "keys/values shortened by a strided convolution (kernel = stride = s) plus the own block's raw keys; L × L/s scores",
                paper: "Liu et al. 2018, Generating Wikipedia by Summarizing Long Sequences",
                caps: Capabilities {
                    causal: true,
                    bidirectional: true,
                    incremental: true,
                    score_bias: false,
                    qk_rotation: false,
                    aux_losses: false,
                    variable_length: true,
                },
            },
            bidirectional_kind(
                "clustered",
                "clustered attention: per head, queries grouped into C clusters by k-means (fixed Lloyd iterations), softmax attention once per centroid copied to its members; optional exact top-k rescoring; O(C·L·d); bidirectional only",
                "Vyas, Katharopoulos, Fleuret 2020, Fast Transformers with Clustered Attention",
            ),
            kernel_kind(
                "prob-sparse",
                "Informer ProbSparse attention: sparsity measure max − mean over ⌈c·ln L⌉ seeded sampled keys, the top ⌈c·ln L⌉ queries attend, lazy ones get the mean of V; causal: prefix ranking, cumulative mean (strictly causal)",
                "Zhou et al. 2021, Informer: Beyond Efficient Transformer for Long Sequence Time-Series Forecasting",
            ),
            sparse_kind(
                "strided",
                "Sparse Transformer strided pattern (previous ℓ positions, every ℓ-th position): union, split heads or alternating layers; O(L√L) with ℓ ≈ √L",
                "Child et al. 2019, Generating Long Sequences with Sparse Transformers",
            ),
            kernel_kind(
                "linear",
                "linear attention, φ = elu + 1: φ(Q)(φ(K)ᵀV); causal by chunked prefix sums; decodes as an RNN (O(1) per token)",
                "Katharopoulos et al. 2020, Transformers are RNNs",
            ),
            bidirectional_kind(
                "inducing-points",
                "m learned slots pack the sequence by attention, every query attends over the m packed slots (mode isab: Set Transformer ISAB, MAB on the slots; luna: Luna's pack/unpack); O(L·m·d), bidirectional only",
                "Lee et al. 2019, Set Transformer; Ma et al. 2021, Luna: Linear Unified Nested Attention",
            ),
            kernel_kind(
                "performer",
                "FAVOR+: positive orthogonal random features of the softmax kernel (or ReLU), redrawn during training; linear time, RNN decoding",
                "Choromanski et al. 2021, Rethinking Attention with Performers",
            ),
            kernel_kind(
                "rfa",
                "random Fourier features of the Gaussian kernel on normalised q/k; optional gated (decaying) recurrent sums",
                "Peng et al. 2021, Random Feature Attention",
            ),
            kernel_kind(
                "average",
                "cumulative average of the inputs, FFN and input/forget gates instead of self-attention; O(d) per decoded token",
                "Zhang et al. 2018, Accelerating Neural Transformer via an Average Attention Network",
            ),
            kernel_kind(
                "lsh",
                "Reformer LSH attention: shared-QK, random-rotation hashing into buckets, several rounds, sorted chunks attending to themselves and the chunk before (causal: the m positions before in the sorted order)",
                "Kitaev et al. 2020, Reformer: The Efficient Transformer",
            ),
            kernel_kind(
                "routing",
                "Routing Transformer: queries and keys clustered by online k-means (EMA centroids, one set per head), attention within the cluster over sorted chunks; optional local heads",
                "Roy et al. 2021, Efficient Content-Based Sparse Attention with Routing Transformers",
            ),
            kernel_kind(
                "sinkhorn",
                "Sparse Sinkhorn attention: each block attends to itself and its sorted block, a Gumbel-Sinkhorn soft permutation of key blocks scored by a sorting network; SortCut option; causal: earlier blocks only, row-normalised",
                "Tay et al. 2020, Sparse Sinkhorn Attention",
            ),
        ]
    }
}

/// A sparse score-forming kind: causal and bidirectional, KV-cache decoding, any position scheme.
fn sparse_kind(kind: &'static str, summary: &'static str, paper: &'static str) -> KindInfo {
    let caps = Capabilities {
        causal: true,
        bidirectional: true,
        incremental: true,
        score_bias: true,
        qk_rotation: true,
        aux_losses: false,
        variable_length: true,
    };
    KindInfo { axis: "model.attention", kind, summary, paper, caps }
}

/// A kind with no score matrix for a position scheme to act on (kernelised, content-sorted,
/// pooled, query-prototype):
/// causal and bidirectional, incremental decoding.
fn kernel_kind(kind: &'static str, summary: &'static str, paper: &'static str) -> KindInfo {
    KindInfo {
        axis: "model.attention",
        kind,
        summary,
        paper,
        caps: Capabilities {
            causal: true,
            bidirectional: true,
            incremental: true,
            score_bias: false,
            qk_rotation: false,
            aux_losses: false,
            variable_length: true,
        },
    }
}

/// A kind with no causal form (every output mixes in later positions): bidirectional only, no
/// incremental decoding, no score matrix for a position scheme; trained as a masked LM.
fn bidirectional_kind(kind: &'static str, summary: &'static str, paper: &'static str) -> KindInfo {
    let mut info = kernel_kind(kind, summary, paper);
    info.caps.causal = false;
    info.caps.incremental = false;
    info
}

/// Projections plus the chunked kernel sums, per token.
fn kernel_flops(h: HeadShape, features: usize, chunk: usize) -> u64 {
    let (d, hd) = (h.d_model as u64, (h.n_heads * h.head_dim) as u64);
    let (m, n) = (features as u64, h.n_heads as u64);
    2 * (4 * d * hd) + 2 * n * (2 * m * (h.head_dim as u64 + 1) + chunk as u64 * (m + h.head_dim as u64 + 1))
}

/// An initialised attention mechanism.
#[derive(Module, Debug)]
pub enum Attention {
    Full(MultiHeadAttention),
    Linformer(LinformerAttention),
    Nystrom(NystromAttention),
    AdaptiveSpan(AdaptiveSpanAttention),
    SlidingWindow(BandAttention),
    Poolingformer(PoolingformerAttention),
    LowRankBand(LowRankBandAttention),
    Local(BandAttention),
    Local2d(Local2dAttention),
    MultiScale(BandAttention),
    Strided(StridedAttention),
    Bigbird(BigBirdAttention),
    Fixed(FixedAttention),
    Blockwise(BlockwiseAttention),
    Etc(EtcAttention),
    Longformer(LongformerAttention),
    MemoryCompressed(MemoryCompressedAttention),
    Clustered(ClusteredAttention),
    ProbSparse(ProbSparseAttention),
    Linear(LinearAttention),
    InducingPoints(InducingPointsAttention),
    Performer(PerformerAttention),
    Rfa(RfaAttention),
    Average(AverageAttention),
    Lsh(LshAttention),
    Routing(RoutingAttention),
    Sinkhorn(SinkhornAttention),
}

impl Attention {
    /// Projects `x` (already normed) and appends what a forward would to the state (keys and
    /// values, or the recurrent sums), without the output: CALM's propagation to skipped blocks.
    pub fn extend_cache(&self, x: Tensor<3>, mask: &variorum_core::AttentionMask, state: &mut AttentionState) {
        match self {
            Self::Full(a) => {
                a.project(x, None, mask, Some(state.kv_mut()));
            }
            Self::AdaptiveSpan(a) => {
                a.attention.project(x, None, mask, Some(state.kv_mut()));
            }
            Self::SlidingWindow(a) | Self::Local(a) | Self::MultiScale(a) => {
                a.attention.project(x, None, mask, Some(state.kv_mut()));
                a.trim(state.kv_mut());
            }
            Self::Longformer(a) => a.extend_cache(x, mask, state.kv_mut()),
            // the cache grows with every position (the pattern reaches back to 0)
            Self::Strided(StridedAttention { attention, .. })
            | Self::Bigbird(BigBirdAttention { attention, .. })
            | Self::Fixed(FixedAttention { attention, .. }) => {
                attention.project(x, None, mask, Some(state.kv_mut()));
            }
            // the recurrent kinds: their state update is the forward itself
            _ => {
                self.forward(AttentionInput::self_attention(x, mask), Some(state));
            }
        }
    }

    /// Content-based attention without mask or position scheme (compression losses).
    pub fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        match self {
            Self::Full(a) => a.content_only(query, key_value),
            Self::AdaptiveSpan(a) => a.attention.content_only(query, key_value),
            Self::SlidingWindow(a) | Self::Local(a) | Self::MultiScale(a) => a.attention.content_only(query, key_value),
            Self::Strided(a) => a.attention.content_only(query, key_value),
            Self::Bigbird(a) => a.attention.content_only(query, key_value),
            Self::Local2d(a) => a.attention.content_only(query, key_value),
            Self::Fixed(a) => a.attention.content_only(query, key_value),
            Self::Blockwise(a) => a.attention.content_only(query, key_value),
            Self::Etc(a) => a.attention.content_only(query, key_value),
            Self::Longformer(a) => a.attention.content_only(query, key_value),
            _ => {
                let mask = variorum_core::AttentionMask::bidirectional();
                self.forward(AttentionInput::cross_attention(query, key_value, &mask), None).context
            }
        }
    }

    /// Runs the mechanism; `state` carries its incremental-decoding state when decoding.
    pub fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        match self {
            Self::Full(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::Linformer(a) => a.forward(input, state),
            Self::Nystrom(a) => a.forward(input, state),
            Self::AdaptiveSpan(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::SlidingWindow(a) | Self::Local(a) | Self::MultiScale(a) => {
                a.forward(input, state.map(AttentionState::kv_mut))
            }
            Self::Poolingformer(a) => a.forward(input, state.map(AttentionState::pooling_mut)),
            Self::LowRankBand(a) => a.forward(input, state.map(AttentionState::low_rank_band_mut)),
            Self::Strided(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::Bigbird(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::Local2d(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::Fixed(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::Blockwise(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::Etc(a) => a.forward(input, state.map(AttentionState::etc_mut)),
            Self::Longformer(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::MemoryCompressed(a) => a.forward(input, state.map(AttentionState::compressed_mut)),
            Self::Clustered(a) => a.forward(input, None),
            Self::ProbSparse(a) => a.forward(input, state.map(AttentionState::prob_sparse_mut)),
            Self::Linear(a) => a.forward(input, state.map(AttentionState::kernel_mut)),
            Self::InducingPoints(a) => a.forward(input, state),
            Self::Performer(a) => a.forward(input, state.map(AttentionState::kernel_mut)),
            Self::Rfa(a) => a.forward(input, state.map(AttentionState::kernel_mut)),
            Self::Average(a) => a.forward(input, state.map(AttentionState::kernel_mut)),
            Self::Lsh(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::Routing(a) => a.forward(input, state.map(AttentionState::kv_mut)),
            Self::Sinkhorn(a) => a.forward(input, state.map(AttentionState::kv_mut)),
        }
    }

    /// Whether the mechanism reads the precomputed dense `[len_q, len_k]` mask of
    /// [`AttentionInput::dense_mask`] (sparse and kernelised kinds never form one, and a model
    /// should not build an L × L mask for them).
    pub fn uses_dense_mask(&self) -> bool {
        matches!(self, Self::Full(_))
    }

    /// ETC's segment length (one global token per segment), for the model that adds the global
    /// input; `None` for every other kind.
    pub fn global_segment(&self) -> Option<usize> {
        match self {
            Self::Etc(a) => Some(a.segment),
            _ => None,
        }
    }

    /// Token ids that get global attention wherever they occur (Longformer); a model reports
    /// their positions in [`AttentionMask::global`](variorum_core::AttentionMask::global).
    pub fn global_token_ids(&self) -> &[u32] {
        match self {
            Self::Longformer(a) => &a.global_token_ids,
            _ => &[],
        }
    }

    /// Moves routing attention's centroids toward what the training forwards since the last call
    /// assigned to them; nothing for the other kinds.
    pub fn update_centroids(&mut self) {
        if let Self::Routing(a) = self {
            a.update_centroids();
        }
    }

    /// Draws random features again (Performer, RFA); nothing for the other kinds.
    pub fn redraw(&mut self) {
        match self {
            Self::Performer(a) => a.redraw(),
            Self::Rfa(a) => a.redraw(),
            _ => {}
        }
    }
}
