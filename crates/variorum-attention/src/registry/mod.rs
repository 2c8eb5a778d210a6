//! Every attention kind, registered once. One line names a kind (its `kind = "…"` value),
//! the variant it becomes, its config type ([`AttentionKind`]) and its module type
//! ([`AttentionMechanism`]); [`attention_kinds!`] writes from the list the config enum
//! [`AttentionConfig`], the module enum [`Attention`] and their dispatch. Adding a kind is its
//! file plus one line here; a kind defined in another crate is registered at run time instead
//! ([`crate::registry::external::register`]) and becomes [`AttentionConfig::External`].

pub(crate) mod external;
pub(crate) mod interleaved;
mod surgery;

use burn::prelude::*;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use variorum_core::{AttentionMask, Capabilities, ConfigError, KindInfo};
use variorum_position::HeadShape;

use crate::contract::{AttentionInput, AttentionOutput, Positioning};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, Learned, TestVariant};
use crate::registry::external::{ExternalAttention, ExternalConfig};
use crate::registry::interleaved::InterleavedConfig;
use crate::state::AttentionState;

/// Writes the config enum, the module enum and their dispatch from a list of
/// `"kind" => Variant(ConfigType, ModuleType),` lines (doc comments allowed before each).
/// Every method forwards to the kind's [`AttentionKind`] or [`AttentionMechanism`] impl, so no
/// per-kind logic lives here.
macro_rules! attention_kinds {
    ($( $(#[$doc:meta])* $kind:literal => $variant:ident($config:ty, $module:ty), )+) => {
        /// `model.attention`: one variant per registered kind, chosen by `kind`, and
        /// [`External`](Self::External) for a kind registered at run time from another crate
        /// ([`crate::registry::external::register`]).
        #[derive(Debug, Clone, PartialEq)]
        pub enum AttentionConfig {
            $( $(#[$doc])* $variant($config), )+
            /// A kind registered from outside this crate.
            External(ExternalConfig),
            /// Different kinds in different layers (`kind = "interleaved"`).
            Interleaved(InterleavedConfig),
        }

        /// The built-in kinds' tables, as serde reads them (tagged by `kind`, unknown keys
        /// refused).
        #[derive(Deserialize)]
        #[serde(tag = "kind", deny_unknown_fields)]
        enum BuiltinConfig {
            $( #[serde(rename = $kind)] $variant($config), )+
        }

        /// The built-in kinds' tables, as serde writes them.
        #[derive(Serialize)]
        #[serde(tag = "kind")]
        enum BuiltinRef<'a> {
            $( #[serde(rename = $kind)] $variant(&'a $config), )+
        }

        impl Serialize for AttentionConfig {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                match self {
                    $( Self::$variant(c) => BuiltinRef::$variant(c).serialize(serializer), )+
                    Self::External(c) => c.serialize(serializer),
                    Self::Interleaved(c) => c.tagged().serialize(serializer),
                }
            }
        }

        impl<'de> Deserialize<'de> for AttentionConfig {
            /// A registered kind's table goes to its own type; a built-in kind's to the tagged
            /// enum, whose errors name the unknown key or kind and what would work.
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let table = serde_json::Value::deserialize(deserializer)?;
                let registered = crate::registry::external::registered_kinds();
                let kind = table.get("kind").and_then(|k| k.as_str());
                if kind == Some(InterleavedConfig::KIND) {
                    let mut table = table;
                    table.as_object_mut().map(|t| t.remove("kind"));
                    return serde_json::from_value(table).map(Self::Interleaved).map_err(serde::de::Error::custom);
                }
                if let Some(kind) = kind.and_then(|k| registered.iter().copied().find(|r| *r == k)) {
                    return crate::registry::external::parse_registered(kind, table)
                        .map(Self::External)
                        .map_err(serde::de::Error::custom);
                }
                // an unknown kind: serde lists the built-in ones, the registered ones are added
                let unknown = kind.is_some_and(|k| !Self::builtin_kinds().contains(&k)) && !registered.is_empty();
                let builtin = BuiltinConfig::deserialize(table).map_err(|e| match unknown {
                    true => serde::de::Error::custom(format!("{e}, or a registered kind: {}", registered.join(", "))),
                    false => serde::de::Error::custom(e),
                })?;
                Ok(match builtin {
                    $( BuiltinConfig::$variant(c) => Self::$variant(c), )+
                })
            }
        }

        /// An initialised attention mechanism, one variant per registered kind.
        #[derive(Module, Debug)]
        pub enum Attention {
            $( #[doc = concat!(" The `", $kind, "` kind's mechanism.")] $variant($module), )+
            /// A kind registered from outside this crate.
            External(ExternalAttention),
        }

        impl AttentionConfig {
            /// The `kind = "…"` value.
            pub fn kind(&self) -> &'static str {
                match self {
                    $( Self::$variant(_) => $kind, )+
                    Self::External(c) => c.kind,
                    Self::Interleaved(_) => InterleavedConfig::KIND,
                }
            }

            /// The names of the built-in kinds, in registration order.
            pub fn builtin_kinds() -> &'static [&'static str] {
                &[$( $kind, )+]
            }

            /// The zoo rows of every kind: the built-in ones in registration order, then the
            /// ones registered at run time.
            pub fn zoo() -> Vec<KindInfo> {
                let mut rows = vec![$( KindInfo {
                    axis: "model.attention",
                    kind: $kind,
                    summary: <$config as AttentionKind>::SUMMARY,
                    paper: <$config as AttentionKind>::PAPER,
                    caps: <$config as AttentionKind>::CAPS,
                }, )+];
                rows.push(KindInfo {
                    axis: "model.attention",
                    kind: InterleavedConfig::KIND,
                    summary: InterleavedConfig::SUMMARY,
                    paper: InterleavedConfig::PAPER,
                    caps: Capabilities::NEUTRAL,
                });
                rows.extend(crate::registry::external::zoo());
                rows
            }

            /// Every kind's test variants (the kind's name first in each name).
            pub fn test_variants() -> Vec<TestVariant<Self>> {
                let mut out = Vec::new();
                $(
                    out.extend(<$config as AttentionKind>::test_variants().into_iter().map(|v| TestVariant {
                        name: format!("attention {} {}", $kind, v.name).trim_end().to_string(),
                        config: Self::$variant(v.config),
                        masked: v.masked,
                        position: v.position,
                    }));
                )+
                out.extend(InterleavedConfig::test_variants());
                out.extend(crate::registry::external::test_variants());
                out
            }

            /// What this setting supports ([`AttentionKind::capabilities`]).
            pub fn capabilities(&self) -> Capabilities {
                match self {
                    $( Self::$variant(c) => AttentionKind::capabilities(c), )+
                    Self::External(c) => c.config.capabilities(),
                    Self::Interleaved(c) => c.capabilities(),
                }
            }

            /// Why a setting without a causal form has none ([`AttentionKind::why_not_causal`]).
            pub fn why_not_causal(&self) -> &'static str {
                match self {
                    $( Self::$variant(c) => AttentionKind::why_not_causal(c), )+
                    Self::External(c) => c.config.why_not_causal(),
                    Self::Interleaved(c) => c.why_not_causal(),
                }
            }

            /// Why causal outputs may differ in their last bits when later tokens change
            /// ([`AttentionKind::inexact_causality`]).
            pub fn inexact_causality(&self) -> Option<&'static str> {
                match self {
                    $( Self::$variant(c) => AttentionKind::inexact_causality(c), )+
                    Self::External(c) => c.config.inexact_causality(),
                    Self::Interleaved(c) => c.layers.iter().find_map(AttentionConfig::inexact_causality),
                }
            }

            /// The config with every derived default written out ([`AttentionKind::expanded`]).
            pub fn expanded(&self, d_model: usize) -> Self {
                match self {
                    $( Self::$variant(c) => Self::$variant(AttentionKind::expanded(c, d_model)), )+
                    Self::External(c) => Self::External(c.with(c.config.expanded(d_model))),
                    Self::Interleaved(c) => Self::Interleaved(c.map(|l| l.expanded(d_model))),
                }
            }

            /// Checks the settings against the model width ([`AttentionKind::validate`]).
            pub fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
                match self {
                    $( Self::$variant(c) => AttentionKind::validate(c, d_model), )+
                    Self::External(c) => c.config.validate(d_model),
                    Self::Interleaved(c) => c.validate(d_model),
                }
            }

            /// Refuses a sequence of `len` positions the kind cannot take
            /// ([`AttentionKind::validate_len`]).
            pub fn validate_len(&self, len: usize) -> Result<(), ConfigError> {
                match self {
                    $( Self::$variant(c) => AttentionKind::validate_len(c, len), )+
                    Self::External(c) => c.config.validate_len(len),
                    Self::Interleaved(c) => c.validate_len(len),
                }
            }

            /// The config of a model of context `len` ([`AttentionKind::for_length`]).
            pub fn for_length(&self, len: usize) -> Self {
                match self {
                    $( Self::$variant(c) => Self::$variant(AttentionKind::for_length(c, len)), )+
                    Self::External(c) => Self::External(c.with(c.config.for_length(len))),
                    Self::Interleaved(c) => Self::Interleaved(c.map(|l| l.for_length(len))),
                }
            }

            /// Query heads and head size ([`AttentionKind::head_shape`]).
            pub fn heads(&self, d_model: usize) -> HeadShape {
                match self {
                    $( Self::$variant(c) => AttentionKind::head_shape(c, d_model), )+
                    Self::External(c) => c.config.head_shape(d_model),
                    Self::Interleaved(c) => c.layers.first().map_or_else(|| Self::default().heads(d_model), |l| l.heads(d_model)),
                }
            }

            /// Dropout on the attention weights ([`AttentionKind::dropout`]).
            pub fn dropout(&self) -> f64 {
                match self {
                    $( Self::$variant(c) => AttentionKind::dropout(c), )+
                    Self::External(c) => c.config.dropout(),
                    Self::Interleaved(c) => c.dropout(),
                }
            }

            /// Forward FLOPs per token for `len_k` keys ([`AttentionKind::flops_per_token`]).
            pub fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
                match self {
                    $( Self::$variant(c) => AttentionKind::flops_per_token(c, d_model, len_k), )+
                    Self::External(c) => c.config.flops_per_token(d_model, len_k),
                    Self::Interleaved(c) => c.flops_per_token(d_model, len_k),
                }
            }

            /// The config of layer `layer` ([`AttentionKind::for_layer`]).
            pub fn for_layer(&self, layer: usize) -> Self {
                match self {
                    $( Self::$variant(c) => Self::$variant(AttentionKind::for_layer(c, layer)), )+
                    Self::External(c) => Self::External(c.with(c.config.for_layer(layer))),
                    Self::Interleaved(c) => c.entry(layer).for_layer(layer),
                }
            }

            /// Whether every query is scored against every key
            /// ([`AttentionKind::scores_every_key`]).
            pub fn scores_every_key(&self) -> bool {
                match self {
                    $( Self::$variant(c) => AttentionKind::scores_every_key(c), )+
                    Self::External(c) => c.config.scores_every_key(),
                    Self::Interleaved(c) => c.layers.iter().all(AttentionConfig::scores_every_key),
                }
            }

            /// How many example tags the attention is conditioned on, if it is
            /// ([`AttentionKind::tags`]).
            pub fn tags(&self) -> Option<usize> {
                match self {
                    $( Self::$variant(c) => AttentionKind::tags(c), )+
                    Self::External(c) => c.config.tags(),
                    Self::Interleaved(c) => c.layers.iter().find_map(AttentionConfig::tags),
                }
            }

            /// Whether a trained layer shows what it learned ([`AttentionKind::shows_what_it_learned`]).
            pub fn shows_what_it_learned(&self) -> bool {
                match self {
                    $( Self::$variant(c) => AttentionKind::shows_what_it_learned(c), )+
                    Self::External(c) => c.config.shows_what_it_learned(),
                    Self::Interleaved(c) => c.layers.iter().any(AttentionConfig::shows_what_it_learned),
                }
            }

            /// Layers with their own setting, 0 = the same in every layer
            /// ([`AttentionKind::per_layer`]).
            pub fn per_layer(&self) -> usize {
                match self {
                    $( Self::$variant(c) => AttentionKind::per_layer(c), )+
                    Self::External(c) => c.config.per_layer(),
                    Self::Interleaved(_) => 0,
                }
            }

            /// The key of the per-layer list ([`AttentionKind::per_layer_key`]).
            pub fn per_layer_key(&self) -> &'static str {
                match self {
                    $( Self::$variant(c) => AttentionKind::per_layer_key(c), )+
                    Self::External(c) => c.config.per_layer_key(),
                    Self::Interleaved(_) => "",
                }
            }

            /// `init_std` for the input projections, `out_std` for the output projection;
            /// `position` supplies the layer's relative scheme, if any.
            pub fn init(
                &self,
                d_model: usize,
                init_std: f64,
                out_std: f64,
                position: Positioning,
                device: &Device,
            ) -> Attention {
                let init = LayerInit { d_model, init_std, out_std, position };
                match self {
                    $( Self::$variant(c) => Attention::$variant(AttentionKind::build(c, &init, device)), )+
                    Self::External(c) => Attention::External(ExternalAttention(c.config.build(&init, device))),
                    Self::Interleaved(c) => c.entry(0).for_layer(0).init(d_model, init_std, out_std, position, device),
                }
            }
        }

        impl Attention {
            /// Runs the mechanism, with its decoding state when decoding
            /// ([`AttentionMechanism::forward`]).
            pub fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::forward(a, input, state), )+
                    Self::External(a) => AttentionMechanism::forward(a, input, state),
                }
            }

            /// Appends what a forward would to the state, without the output
            /// ([`AttentionMechanism::extend_cache`]).
            pub fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::extend_cache(a, x, mask, state), )+
                    Self::External(a) => AttentionMechanism::extend_cache(a, x, mask, state),
                }
            }

            /// Cross-attention over a source that stays the same from call to call
            /// ([`AttentionMechanism::cross_attention`]).
            pub fn cross_attention(&self, input: AttentionInput, state: &mut AttentionState) -> AttentionOutput {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::cross_attention(a, input, state), )+
                    Self::External(a) => AttentionMechanism::cross_attention(a, input, state),
                }
            }

            /// Content-based attention, no mask or position scheme
            /// ([`AttentionMechanism::content_only`]).
            pub fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::content_only(a, query, key_value), )+
                    Self::External(a) => AttentionMechanism::content_only(a, query, key_value),
                }
            }

            /// Whether the mechanism reads the dense mask
            /// ([`AttentionMechanism::uses_dense_mask`]).
            pub fn uses_dense_mask(&self) -> bool {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::uses_dense_mask(a), )+
                    Self::External(a) => AttentionMechanism::uses_dense_mask(a),
                }
            }

            /// The segment length of a global input beside the sequence, if any
            /// ([`AttentionMechanism::global_segment`]).
            pub fn global_segment(&self) -> Option<usize> {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::global_segment(a), )+
                    Self::External(a) => AttentionMechanism::global_segment(a),
                }
            }

            /// Token ids with global attention wherever they occur
            /// ([`AttentionMechanism::global_token_ids`]).
            pub fn global_token_ids(&self) -> &[u32] {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::global_token_ids(a), )+
                    Self::External(a) => AttentionMechanism::global_token_ids(a),
                }
            }

            /// The trainer's hook after every optimizer step
            /// ([`AttentionMechanism::after_optimizer_step`]).
            pub fn after_optimizer_step(&mut self, step: usize) {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::after_optimizer_step(a, step), )+
                    Self::External(a) => AttentionMechanism::after_optimizer_step(a, step),
                }
            }

            /// Whether the state keeps a memory of earlier segments
            /// ([`AttentionMechanism::remembers`]).
            pub fn remembers(&self) -> bool {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::remembers(a), )+
                    Self::External(a) => AttentionMechanism::remembers(a),
                }
            }

            /// What the trained layer learned ([`AttentionMechanism::learned`]).
            pub fn learned(&self) -> Option<Learned> {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::learned(a), )+
                    Self::External(a) => AttentionMechanism::learned(a),
                }
            }

            /// Forgets what the state remembers of rows that start a new document
            /// ([`AttentionMechanism::reset_rows`]).
            pub fn reset_rows(&self, state: &mut AttentionState, rows: &[bool]) {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::reset_rows(a, state, rows), )+
                    Self::External(a) => AttentionMechanism::reset_rows(a, state, rows),
                }
            }

            /// The hook after a partial load of the weights
            /// ([`AttentionMechanism::after_partial_load`]).
            pub fn after_partial_load(&mut self, fresh: &dyn Fn(&str) -> bool) {
                match self {
                    $( Self::$variant(a) => AttentionMechanism::after_partial_load(a, fresh), )+
                    Self::External(a) => AttentionMechanism::after_partial_load(a, fresh),
                }
            }
        }
    };
}

attention_kinds! {
    /// Multi-head scaled dot-product attention (with grouped-/multi-query K/V heads).
    "full" => Full(crate::engine::config::MultiHeadAttentionConfig, crate::engine::heads::MultiHeadAttention),
    /// Linformer: keys and values projected along the length to k rows (bidirectional only).
    "linformer" => Linformer(crate::low_rank::linformer::LinformerConfig, crate::low_rank::linformer::LinformerAttention),
    /// Nyströmformer: softmax attention through m segment-mean landmarks (bidirectional only).
    "nystrom" => Nystrom(crate::low_rank::nystrom::NystromConfig, crate::low_rank::nystrom::NystromAttention),
    /// Multi-head attention with a learned soft span per head (static or per token).
    "adaptive-span" => AdaptiveSpan(crate::sparse::adaptive_span::AdaptiveSpanConfig, crate::sparse::adaptive_span::AdaptiveSpanAttention),
    /// Band attention: each query sees the last `window` keys, computed by blocks.
    "sliding-window" => SlidingWindow(crate::sparse::sliding_window::SlidingWindowConfig, crate::pattern::band_attention::BandAttention),
    /// Poolingformer: a sliding window, then pooling attention over its output (two levels).
    "poolingformer" => Poolingformer(crate::low_rank::poolingformer::PoolingformerConfig, crate::low_rank::poolingformer::PoolingformerAttention),
    /// A low-rank attention (small key size) mixed with a band attention per head.
    "low-rank-band" => LowRankBand(crate::low_rank::low_rank_band::LowRankBandConfig, crate::low_rank::low_rank_band::LowRankBandAttention),
    /// Image Transformer 1D local attention: query blocks see their block and a memory before it.
    "local" => Local(crate::sparse::local::LocalAttentionConfig, crate::pattern::band_attention::BandAttention),
    /// Image Transformer 2D local attention: query rectangles of a raster image see their memory
    /// rectangle.
    "local-2d" => Local2d(crate::sparse::local_2d::Local2dConfig, crate::sparse::local_2d::Local2dAttention),
    /// Band attention with one window width per head (Multi-Scale Transformer).
    "multi-scale" => MultiScale(crate::sparse::multi_scale::MultiScaleConfig, crate::pattern::band_attention::BandAttention),
    /// Sparse Transformer's strided pattern: the previous ℓ positions and every ℓ-th one.
    "strided" => Strided(crate::sparse::strided::StridedConfig, crate::sparse::strided::StridedAttention),
    /// Longformer: sliding window with dilated heads and global positions or token ids.
    "longformer" => Longformer(crate::sparse::longformer::LongformerConfig, crate::sparse::longformer::LongformerAttention),
    /// BigBird: a blocked window, global tokens and random blocks.
    "bigbird" => Bigbird(crate::sparse::bigbird::BigBirdConfig, crate::sparse::bigbird::BigBirdAttention),
    /// Sparse Transformer's fixed pattern: the own block and the last c positions of every block.
    "fixed" => Fixed(crate::sparse::fixed::FixedConfig, crate::sparse::fixed::FixedAttention),
    /// Blockwise attention: each head's query block attends to one permuted key block.
    "blockwise" => Blockwise(crate::sparse::blockwise::BlockwiseConfig, crate::sparse::blockwise::BlockwiseAttention),
    /// ETC global–local attention: auxiliary global tokens, one per segment, beside the sequence.
    "etc" => Etc(crate::sparse::etc::EtcConfig, crate::sparse::etc::EtcAttention),
    /// Keys and values shortened by a strided convolution, plus the own block's raw keys.
    "memory-compressed" => MemoryCompressed(crate::low_rank::memory_compressed::MemoryCompressedConfig, crate::low_rank::memory_compressed::MemoryCompressedAttention),
    /// Clustered attention: queries grouped by k-means, attention once per centroid (bidirectional).
    "clustered" => Clustered(crate::low_rank::clustered::ClusteredConfig, crate::low_rank::clustered::ClusteredAttention),
    /// Informer's ProbSparse attention: the top queries by a sparsity measure attend, the rest get
    /// the mean of the values.
    "prob-sparse" => ProbSparse(crate::low_rank::prob_sparse::ProbSparseConfig, crate::low_rank::prob_sparse::ProbSparseAttention),
    /// Linear attention, φ = elu + 1.
    "linear" => Linear(crate::kernelised::linear::LinearAttentionConfig, crate::kernelised::linear::LinearAttention),
    /// Inducing points: m learned slots pack the sequence (ISAB / Luna), every query unpacks them.
    "inducing-points" => InducingPoints(crate::low_rank::inducing_points::InducingPointsConfig, crate::low_rank::inducing_points::InducingPointsAttention),
    /// FAVOR+ positive (or ReLU) random features.
    "performer" => Performer(crate::kernelised::performer::PerformerConfig, crate::kernelised::performer::PerformerAttention),
    /// Random Fourier features, optionally gated.
    "rfa" => Rfa(crate::kernelised::rfa::RfaConfig, crate::kernelised::rfa::RfaAttention),
    /// Cumulative average + FFN + gate (Average Attention Network).
    "average" => Average(crate::kernelised::average::AverageAttentionConfig, crate::kernelised::average::AverageAttention),
    /// Reformer's LSH attention: shared-QK, random-rotation buckets, sorted chunks.
    "lsh" => Lsh(crate::content::lsh::LshConfig, crate::content::lsh::LshAttention),
    /// Routing Transformer: queries and keys clustered by online k-means, attention per cluster.
    "routing" => Routing(crate::content::routing::RoutingConfig, crate::content::routing::RoutingAttention),
    /// Sparse Sinkhorn attention: blocks attend to themselves and a learned soft sort of blocks.
    "sinkhorn" => Sinkhorn(crate::content::sinkhorn::SinkhornConfig, crate::content::sinkhorn::SinkhornAttention),
    /// Talking heads: learned mixes across heads before and after the softmax.
    "talking-heads" => TalkingHeads(crate::scores::talking_heads::TalkingHeadsConfig, crate::scores::talking_heads::TalkingHeadsAttention),
    /// Capsule-routing head aggregation: heads combined by dynamic or EM routing-by-agreement.
    "capsule-heads" => CapsuleHeads(crate::scores::capsule_heads::CapsuleHeadsConfig, crate::scores::capsule_heads::CapsuleHeadsAttention),
    /// Hard-coded Gaussian heads on the previous, current and next token: no queries or keys.
    "hard-coded-gaussian" => HardCodedGaussian(crate::scores::hard_coded_gaussian::HardCodedGaussianConfig, crate::scores::hard_coded_gaussian::HardCodedGaussianAttention),
    /// Localness modelling: a Gaussian prior on the scores around a centre and window predicted from each query.
    "gaussian-prior" => GaussianPrior(crate::scores::gaussian_prior::GaussianPriorConfig, crate::scores::gaussian_prior::GaussianPriorAttention),
    /// CAMTL's task prior: a block-diagonal prior on the scores conditioned on the example's tag.
    "task-prior" => TaskPrior(crate::scores::task_prior::TaskPriorConfig, crate::scores::task_prior::TaskPriorAttention),
    /// Memorizing Transformer: local attention plus kNN attention over a per-document memory of earlier segments, gated per head.
    "memorizing" => Memorizing(crate::memory::memorizing::MemorizingConfig, crate::memory::memorizing::MemorizingAttention),
    /// Synthesizer: scores from an MLP of each token (dense), a per-head ℓ × ℓ table (random), their factorized forms, or a learned mix with dot products.
    "synthesizer" => Synthesizer(crate::scores::synthesizer::SynthesizerConfig, crate::scores::synthesizer::SynthesizerAttention),
    /// Collaborative heads: shared query/key projections re-weighted per head by mixing vectors.
    "collaborative" => Collaborative(crate::scores::collaborative::CollaborativeConfig, crate::scores::collaborative::CollaborativeAttention),
    /// RealFormer: residual attention, each layer adds the previous layer's raw scores.
    "realformer" => RealFormer(crate::scores::realformer::RealFormerConfig, crate::scores::realformer::RealFormerAttention),
    /// Lazyformer: probabilities computed once per block of layers, reused by the rest.
    "lazyformer" => Lazyformer(crate::scores::lazyformer::LazyformerConfig, crate::scores::lazyformer::LazyAttention),
    /// Evolving attention: each layer's logits mix a residual convolution of the previous layer's.
    "evolving" => Evolving(crate::scores::evolving::EvolvingConfig, crate::scores::evolving::EvolvingAttention),
    /// gMLP's spatial gating unit: a learned ℓ × ℓ position mixing gates half the channels (aMLP: plus a tiny attention).
    "gmlp" => Gmlp(crate::mixers::gmlp::GmlpConfig, crate::mixers::gmlp::GmlpAttention),
    /// MLP-Mixer's token-mixing MLP along the positions (MADE-masked when causal).
    "mlp-mixer" => MlpMixer(crate::mixers::mlp_mixer::MlpMixerConfig, crate::mixers::mlp_mixer::MlpMixerAttention),
    /// FNet: the real part of a 2D Fourier transform of the sequence (bidirectional).
    "fnet" => Fnet(crate::mixers::fnet::FnetConfig, crate::mixers::fnet::FourierMixing),
    /// Lightweight convolution: softmax-normalised depthwise kernels shared by channel groups.
    "lightweight-conv" => LightweightConv(crate::mixers::dynamic_conv::LightweightConvConfig, crate::mixers::dynamic_conv::ConvolutionAttention),
    /// Dynamic convolution: each position predicts its own lightweight kernels.
    "dynamic-conv" => DynamicConv(crate::mixers::dynamic_conv::DynamicConvConfig, crate::mixers::dynamic_conv::ConvolutionAttention),
    /// Modern Hopfield layer: queries iterated toward a fixed point over the sequence's keys (mixer) or n learned stored patterns (lookup).
    "hopfield" => Hopfield(crate::mixers::hopfield::HopfieldConfig, crate::mixers::hopfield::HopfieldAttention),
    /// BP-Transformer: k binary-partition nodes per side and level, fine to coarse, with relative representations per edge.
    "bpt" => Bpt(crate::structured::bpt::BptConfig, crate::structured::bpt::BptAttention),
    /// Graph-masked attention: each position over its neighbours in the example's graph (data.graph) and itself, dot-product or GAT-additive scores.
    "graph" => Graph(crate::structured::graph::GraphAttentionConfig, crate::structured::graph::GraphAttention),
    /// SAC: an edge predictor draws k keys per query, attention over those edges; the predictor learns by REINFORCE.
    "sac" => Sac(crate::structured::sac::SacConfig, crate::structured::sac::SacAttention),
}

impl Default for AttentionConfig {
    fn default() -> Self {
        Self::Full(crate::engine::config::MultiHeadAttentionConfig::default())
    }
}
