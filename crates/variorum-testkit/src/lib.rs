//! What the generic tests run beyond the kinds' own variants: combinations of several axes that
//! have broken before or that a rule allows only together (a memory under Transformer-XL's
//! positions, reversible blocks under a band, a masked reversible stack, `max_back` on a sparse
//! kind…). Not part of the library: `variorum_model::zoo::variants` is what every kind declares,
//! this crate adds the combinations for the workspace's own tests.

#![warn(missing_docs)]

use variorum_attention::{AdaptiveSpanConfig, AttentionConfig, SlidingWindowConfig, StridedConfig};
use variorum_block::{
    BlockConfig, DepthConfig, FeedForwardConfig, FeedForwardKind, GtrxlConfig, MemoryConfig, PostLnConfig,
    ReversibleConfig, UniversalConfig, XlMemoryConfig,
};
use variorum_model::objective::{MaskedConfig, ObjectiveConfig};
use variorum_model::{ModelConfig, zoo};
use variorum_position::{PositionConfig, RotaryConfig, SinusoidalPositionConfig, XlRelativeConfig};

/// Every kind's own variants ([`zoo::variants`]) and the combinations ([`combinations`]).
pub fn variants() -> Vec<(String, ModelConfig)> {
    let mut out = zoo::variants();
    out.extend(combinations());
    out
}

/// Tiny models that differ from [`zoo::tiny`] on more than one axis.
pub fn combinations() -> Vec<(String, ModelConfig)> {
    let tiny = zoo::tiny;
    let alibi = || PositionConfig::Alibi(Default::default());
    let xl_memory = || MemoryConfig::Xl(XlMemoryConfig { length: 12 });
    let masked = || ObjectiveConfig::Masked(MaskedConfig::default());
    let universal = |block: BlockConfig| ModelConfig {
        n_layers: 3,
        position: PositionConfig::UniversalTimestep(Default::default()),
        depth: DepthConfig::Universal(UniversalConfig { act: true, halting_bias: -1.0, ..Default::default() }),
        block,
        ..tiny()
    };
    let sepconv = FeedForwardConfig { kind: FeedForwardKind::SeparableConv, d_ff: Some(48), ..Default::default() };
    vec![
        ("untied head".into(), ModelConfig { tie_embeddings: false, ..tiny() }),
        (
            "scaled embeddings + sinusoidal".into(),
            ModelConfig {
                scale_embeddings: true,
                position: PositionConfig::Sinusoidal(SinusoidalPositionConfig::default()),
                ..tiny()
            },
        ),
        (
            "attention adaptive-span + xl memory".into(),
            ModelConfig {
                seq_len: 4,
                attention: AttentionConfig::AdaptiveSpan(AdaptiveSpanConfig {
                    max_span: 8,
                    ramp: 2,
                    init_span: 0.5,
                    ..Default::default()
                }),
                memory: xl_memory(),
                position: alibi(),
                ..tiny()
            },
        ),
        // the paper's pairing: a memory long enough that token-by-token decoding across segment
        // boundaries still sees every earlier token, under relative positions
        (
            "memory xl + transformer-xl".into(),
            ModelConfig {
                seq_len: 4,
                memory: xl_memory(),
                position: PositionConfig::TransformerXl(XlRelativeConfig::default()),
                ..tiny()
            },
        ),
        (
            "block reversible + alibi + sliding-window".into(),
            ModelConfig {
                block: BlockConfig::Reversible(ReversibleConfig::default()),
                position: alibi(),
                attention: AttentionConfig::SlidingWindow(SlidingWindowConfig { window: 4, ..Default::default() }),
                ..tiny()
            },
        ),
        (
            "block gtrxl + xl memory".into(),
            ModelConfig {
                seq_len: 4,
                block: BlockConfig::Gtrxl(GtrxlConfig::default()),
                memory: xl_memory(),
                position: PositionConfig::Rope(RotaryConfig::default()),
                ..tiny()
            },
        ),
        ("depth universal + act, post-ln".into(), universal(BlockConfig::PostLn(PostLnConfig::default()))),
        (
            "depth universal + act, separable-conv transition".into(),
            ModelConfig { feed_forward: sepconv, ..universal(BlockConfig::default()) },
        ),
        // "attend at most N back" on full attention (a band computed by blocks, a trimmed
        // cache) and on a sparse kind
        (
            "max_back 3, attention full + position alibi".into(),
            ModelConfig { max_back: Some(3), position: alibi(), ..tiny() },
        ),
        (
            "max_back 5, attention strided".into(),
            ModelConfig {
                max_back: Some(5),
                attention: AttentionConfig::Strided(StridedConfig { stride: 4, ..Default::default() }),
                ..tiny()
            },
        ),
        (
            "masked lm + position sinusoidal".into(),
            ModelConfig {
                objective: masked(),
                position: PositionConfig::Sinusoidal(SinusoidalPositionConfig::default()),
                ..tiny()
            },
        ),
        (
            "masked lm + reversible".into(),
            ModelConfig { objective: masked(), block: BlockConfig::Reversible(ReversibleConfig::default()), ..tiny() },
        ),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_combination_is_valid_and_named_once() {
        variorum_model::zoo::assert_valid_and_named_once(&super::variants());
    }
}
