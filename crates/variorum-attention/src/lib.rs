//! Attention mechanisms, one file per family, selected by `model.attention.kind`.
//!
//! Every mechanism follows the attention contract ([`AttentionInput`] → [`AttentionOutput`]):
//! queries come from `query: [batch, len_q, d_model]`, keys and values from `key_value` (the same
//! tensor for self-attention, a longer one with a memory, the encoder output for cross-attention),
//! positions and masks from [`variorum_core::AttentionMask`], incremental state from the
//! mechanism's own cache. Each mechanism owns its projections; the plain case shares
//! [`QkvProjection`].
//!
//! A kind is its file: the config implements [`AttentionKind`] (summary, paper, capabilities,
//! checks, init, test variants), the module [`AttentionMechanism`] (forward and hooks); one line
//! in [`registry`] enrols it. See `docs/adding-a-mechanism.md`.

pub mod adaptive_span;
pub mod average;
pub mod band;
pub mod bigbird;
pub mod blockwise;
pub mod bpt;
pub mod cache;
pub mod capsule_heads;
pub mod clustered;
pub mod collaborative;
pub mod contract;
pub mod dynamic_conv;
pub mod etc;
pub mod evolving;
pub mod external;
pub mod fixed;
pub mod fnet;
pub mod full;
pub mod gathered;
pub mod gaussian_prior;
pub mod gmlp;
pub mod graph;
pub mod hard_coded_gaussian;
pub mod head_losses;
pub mod hopfield;
pub mod inducing_points;
pub mod kernel;
pub mod kind;
pub mod knn_memory;
pub mod lazyformer;
pub mod linear;
pub mod linformer;
pub mod local;
pub mod local_2d;
pub mod longformer;
pub mod low_rank_band;
pub mod lsh;
pub mod memorizing;
pub mod memory_compressed;
pub mod mlp_mixer;
pub mod multi_scale;
pub mod normaliser;
pub mod nystrom;
pub mod performer;
pub mod poolingformer;
pub mod prob_sparse;
pub mod qkv;
pub mod random_features;
pub mod realformer;
pub mod registry;
pub mod rfa;
pub mod routing;
pub mod sac;
pub mod sinkhorn;
pub mod sliding_window;
pub mod sorted_chunks;
pub mod sorted_kernel;
pub mod sparse_kernel;
pub mod state;
pub mod strided;
pub mod synthesizer;
pub mod talking_heads;
pub mod task_prior;

pub use adaptive_span::{AdaptiveSpanAttention, AdaptiveSpanConfig};
pub use average::{AverageAttention, AverageAttentionConfig};
pub use band::BandAttention;
pub use bigbird::{BigBirdAttention, BigBirdConfig};
pub use blockwise::{BlockwiseAttention, BlockwiseConfig};
pub use bpt::{BptAttention, BptConfig};
pub use cache::KvCache;
pub use capsule_heads::{CapsuleHeadsAttention, CapsuleHeadsConfig, CapsuleRouting};
pub use clustered::{ClusteredAttention, ClusteredConfig};
pub use collaborative::{CollaborativeAttention, CollaborativeConfig};
pub use contract::{AttentionInput, AttentionOutput};
pub use dynamic_conv::{
    ConvSettings, ConvolutionAttention, ConvolutionState, DynamicConvConfig, LightweightConvConfig,
};
pub use etc::{EtcAttention, EtcConfig, EtcState};
pub use evolving::{EvolvingAttention, EvolvingConfig, EvolvingMaps, EvolvingState};
pub use external::{ExternalAttention, ExternalConfig, register};
pub use fixed::{FixedAttention, FixedConfig};
pub use fnet::{FnetConfig, FourierMixing};
pub use full::{MultiHeadAttention, MultiHeadAttentionConfig, Positioning};
pub use gaussian_prior::{GaussianPriorAttention, GaussianPriorConfig};
pub use gmlp::{GmlpAttention, GmlpConfig, GmlpState, TinyAttention};
pub use graph::{GraphAttention, GraphAttentionConfig, GraphScore};
pub use hard_coded_gaussian::{GaussianCache, HardCodedGaussianAttention, HardCodedGaussianConfig};
pub use hopfield::{HopfieldAttention, HopfieldConfig};
pub use inducing_points::{InducingMode, InducingPointsAttention, InducingPointsConfig};
pub use kernel::KernelState;
pub use kind::{AttentionKind, AttentionMechanism, LayerInit, TestVariant, caps};
pub use knn_memory::KnnMemory;
pub use lazyformer::{LazyAttention, LazyMaps, LazyformerConfig, ReusedMaps};
pub use linear::{LinearAttention, LinearAttentionConfig};
pub use linformer::{LinformerAttention, LinformerConfig, LinformerShare};
pub use local::LocalAttentionConfig;
pub use local_2d::{Local2dAttention, Local2dConfig};
pub use longformer::{LongformerAttention, LongformerConfig};
pub use low_rank_band::{LowRankBandAttention, LowRankBandConfig, LowRankBandState};
pub use lsh::{LshAttention, LshConfig};
pub use memorizing::{MemorizingAttention, MemorizingConfig, MemorizingState};
pub use memory_compressed::{MemoryCompressedAttention, MemoryCompressedConfig};
pub use mlp_mixer::{MixerState, MlpMixerAttention, MlpMixerConfig};
pub use multi_scale::MultiScaleConfig;
pub use normaliser::{Normaliser, ScoreNormaliser};
pub use nystrom::{NystromAttention, NystromConfig, NystromInverse};
pub use performer::{PerformerAttention, PerformerConfig, PerformerKernel};
pub use poolingformer::{PoolKind, PoolingState, PoolingformerAttention, PoolingformerConfig};
pub use prob_sparse::{ProbSparseAttention, ProbSparseConfig, ProbSparseState};
pub use qkv::{QkvProjection, QkvProjectionConfig};
pub use realformer::{RealFormerAttention, RealFormerConfig, ResidualScores};
pub use registry::{Attention, AttentionConfig};
pub use rfa::{RfaAttention, RfaConfig};
pub use routing::{RoutingAttention, RoutingConfig};
pub use sac::{SacAttention, SacConfig, SacState};
pub use sinkhorn::{SinkhornAttention, SinkhornConfig};
pub use sliding_window::SlidingWindowConfig;
pub use state::{AttentionState, CarriedMaps};
pub use strided::{StridedAttention, StridedCombine, StridedConfig};
pub use synthesizer::{
    DenseSynthesizer, RandomSynthesizer, ScoreTable, SynthesizerAttention, SynthesizerConfig, SynthesizerVariant,
};
pub use talking_heads::{TalkingHeadsAttention, TalkingHeadsConfig};
pub use task_prior::{TaskPriorAttention, TaskPriorConfig};
