//! Attention mechanisms, one file per kind, in folders by family, selected by
//! `model.attention.kind`.
//!
//! Every mechanism follows the attention contract ([`AttentionInput`] → [`AttentionOutput`]):
//! queries come from `query: [batch, len_q, d_model]`, keys and values from `key_value` (the same
//! tensor for self-attention, a longer one with a memory, the encoder output for cross-attention),
//! positions and masks from [`variorum_core::AttentionMask`], incremental state from the
//! mechanism's own [`AttentionState`]. A kind's config implements [`AttentionKind`] (summary,
//! paper, capabilities, checks, init, test variants), its module [`AttentionMechanism`] (forward
//! and hooks); one line in the registry enrols it in [`AttentionConfig`] and [`Attention`]. See
//! `docs/adding-a-mechanism.md`.
//!
//! The crate's layers, each using only those above it:
//!
//! - the contract ([`AttentionInput`], [`AttentionOutput`], [`Positioning`]), the decoding state
//!   ([`AttentionState`], [`KvCache`]) and what a kind declares ([`AttentionKind`],
//!   [`AttentionMechanism`]);
//! - the engine: multi-head attention ([`MultiHeadAttention`]) in steps a kind can take apart
//!   (project, score, mask, normalise, combine), and the paths that compute it (fused kernel,
//!   blocks, composed);
//! - pattern machinery (one forward of a sparse pattern, band attention, sorted chunks);
//! - the kinds, by family: `sparse`, `low_rank`, `kernelised`, `content`, `scores`, `mixers`,
//!   `structured`, `memory`;
//! - the registry, which names every kind.
//!
//! Everything public is exported here, once; the modules are private.
//!
//! A kind from its table, checked against the model width, built and run over a sequence:
//!
//! ```
//! use burn::prelude::*;
//! use variorum_attention::{AttentionConfig, AttentionInput, Positioning};
//! use variorum_core::AttentionMask;
//!
//! let config: AttentionConfig = toml::from_str("kind = \"sliding-window\"\nn_heads = 2\nwindow = 4").unwrap();
//! config.validate(16).unwrap();
//! let device = Device::flex();
//! let layer = config.init(16, 0.02, 0.02, Positioning::NONE, &device);
//! let x = Tensor::<3>::ones([1, 8, 16], &device);
//! let mask = AttentionMask::causal();
//! let out = layer.forward(AttentionInput::self_attention(x, &mask), None);
//! assert_eq!(out.context.dims(), [1, 8, 16]);
//! ```

#![warn(missing_docs)]

#[macro_use]
mod macros;

mod cache;
mod contract;
mod kind;
mod state;

mod engine;
mod pattern;

mod content;
mod kernelised;
mod low_rank;
mod memory;
mod mixers;
mod scores;
mod sparse;
mod structured;

mod registry;

// The contract, the state, what a kind declares, the registry.
pub use cache::KvCache;
pub use contract::{AttentionInput, AttentionOutput, Positioning};
pub use kind::{AttentionKind, AttentionMechanism, HeadSettings, LayerInit, Learned, TestVariant, caps};
pub use registry::external::{ExternalAttention, ExternalConfig, register};
pub use registry::interleaved::InterleavedConfig;
pub use registry::{Attention, AttentionConfig};
pub use state::{AttentionState, CarriedMaps};

// The engine, for kinds built on it here and in other crates.
pub use engine::band::Band;
pub use engine::blocks::banded;
pub use engine::config::MultiHeadAttentionConfig;
pub use engine::head_losses::{Disagreement, DiversityConfig, GuidanceConfig};
pub use engine::heads::{MultiHeadAttention, Projected};
pub use engine::normaliser::{MASKED_SCORE, Normaliser, ScoreNormaliser};
pub use engine::qkv::{QkvProjection, QkvProjectionConfig};
pub use pattern::band_attention::{BandAttention, Wrap};

// Sparse patterns.
pub use sparse::adaptive_span::{AdaptiveSpanAttention, AdaptiveSpanConfig};
pub use sparse::bigbird::{BigBirdAttention, BigBirdConfig, RandomDraw};
pub use sparse::blockwise::{BlockwiseAttention, BlockwiseConfig};
pub use sparse::etc::{EtcAttention, EtcConfig, EtcState};
pub use sparse::fixed::{FixedAttention, FixedConfig};
pub use sparse::local::LocalAttentionConfig;
pub use sparse::local_2d::{Local2dAttention, Local2dConfig};
pub use sparse::longformer::{GlobalProjections, LongformerAttention, LongformerCache, LongformerConfig, folds_run};
pub use sparse::multi_scale::MultiScaleConfig;
pub use sparse::sliding_window::SlidingWindowConfig;
pub use sparse::strided::{StridedAttention, StridedCombine, StridedConfig};

// Low rank and summaries.
pub use low_rank::clustered::{ClusteredAttention, ClusteredConfig};
pub use low_rank::inducing_points::{InducingMode, InducingPointsAttention, InducingPointsConfig};
pub use low_rank::linformer::{LinformerAttention, LinformerConfig, LinformerProjection, LinformerShare};
pub use low_rank::low_rank_band::{LowRankBandAttention, LowRankBandConfig, LowRankBandState};
pub use low_rank::memory_compressed::{CompressedState, MemoryCompressedAttention, MemoryCompressedConfig};
pub use low_rank::nystrom::{
    NystromAttention, NystromConfig, NystromInverse, PinvScale, iterative_pinv, iterative_pinv_from,
};
pub use low_rank::poolingformer::{PoolKind, PoolingState, PoolingformerAttention, PoolingformerConfig};
pub use low_rank::prob_sparse::{ProbSparseAttention, ProbSparseConfig, ProbSparseState, top_count};

// Kernelised attention.
pub use kernelised::average::{AverageAttention, AverageAttentionConfig};
pub use kernelised::kernel::{
    FeatureMap, Features, KernelState, MIN_NORMALISER, bidirectional as kernel_bidirectional,
};
pub use kernelised::linear::{LinearAttention, LinearAttentionConfig};
pub use kernelised::performer::{PerformerAttention, PerformerConfig, PerformerKernel};
pub use kernelised::rfa::{RfaAttention, RfaConfig};

// Content-based sparsity.
pub use content::lsh::{LshAttention, LshConfig, LshLayout};
pub use content::routing::{RoutingAttention, RoutingConfig};
pub use content::sinkhorn::{SinkhornAttention, SinkhornConfig};

// Scores and heads.
pub use scores::capsule_heads::{CapsuleHeadsAttention, CapsuleHeadsConfig, CapsuleRouting};
pub use scores::collaborative::{CollaborativeAttention, CollaborativeConfig};
pub use scores::evolving::{EvolvingAttention, EvolvingConfig, EvolvingForm, EvolvingMaps, EvolvingState};
pub use scores::gaussian_prior::{GaussianPriorAttention, GaussianPriorConfig, LocalnessPrior};
pub use scores::hard_coded_gaussian::{GaussianCache, HardCodedGaussianAttention, HardCodedGaussianConfig};
pub use scores::lazyformer::{LazyAttention, LazyMaps, LazyformerConfig, ReusedMaps};
pub use scores::realformer::{RealFormerAttention, RealFormerConfig, ResidualScores};
pub use scores::synthesizer::{
    DenseSynthesizer, RandomSynthesizer, ScoreTable, SynthesizerAttention, SynthesizerConfig, SynthesizerVariant,
};
pub use scores::talking_heads::{TalkingHeadsAttention, TalkingHeadsConfig};
pub use scores::task_prior::{TaskPriorAttention, TaskPriorConfig};

// Token mixers.
pub use mixers::dynamic_conv::{
    ConvConfig, ConvSettings, Convolution, ConvolutionAttention, ConvolutionState, Dynamic, DynamicConvConfig,
    Lightweight, LightweightConvConfig,
};
pub use mixers::fnet::{FnetConfig, FourierMixing};
pub use mixers::gmlp::{GmlpAttention, GmlpConfig, GmlpState, TinyAttention};
pub use mixers::hopfield::{HopfieldAttention, HopfieldConfig};
pub use mixers::mlp_mixer::{MixerState, MlpMixerAttention, MlpMixerConfig};

// Structured attention.
pub use structured::bpt::{BptAttention, BptConfig};
pub use structured::graph::{GraphAttention, GraphAttentionConfig, GraphScore};
pub use structured::sac::{SacAttention, SacConfig, SacState};

// Memories.
pub use memory::knn_memory::KnnMemory;
pub use memory::memorizing::{MemorizingAttention, MemorizingConfig, MemorizingState};
