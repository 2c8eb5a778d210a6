//! Every kind on every axis: the rows of `variorum zoo`, and the tiny model variants the generic
//! tests run. An attention kind declares its variants beside itself (`AttentionKind::test_variants`);
//! the other axes' kinds and the model-level combinations are listed here.

use variorum_attention::{
    AdaptiveSpanConfig, AttentionConfig, MultiHeadAttentionConfig, SlidingWindowConfig, StridedConfig, TestVariant,
};
use variorum_block::{
    BlockConfig, CompressionKind, CompressiveMemoryConfig, DepthConfig, FeedForwardConfig, FeedForwardKind,
    GtrxlConfig, MemoryConfig, NormKind, UniversalConfig, XlMemoryConfig, block::ResidualConfig,
};
use variorum_core::KindInfo;
use variorum_position::{
    DebertaConfig, LearnedPositionConfig, MultiplicativeConfig, PositionConfig, RopeLayout, RotaryConfig, ShawConfig,
    SinusoidalPositionConfig, T5BiasConfig, UntiedConfig, XlRelativeConfig,
};

use crate::ModelConfig;
use crate::exit_predictor::{Oracle, PredictorKind};
use crate::exits::{EveryLayerConfig, ExitConfig};
use crate::objective::{MaskedConfig, ObjectiveConfig};

/// All declared kinds, axis by axis.
pub fn kinds() -> Vec<KindInfo> {
    let mut all = PositionConfig::zoo();
    all.extend(AttentionConfig::zoo());
    all.extend(BlockConfig::zoo());
    all.extend(FeedForwardConfig::zoo());
    all.extend(MemoryConfig::zoo());
    all.extend(DepthConfig::zoo());
    all.extend(ExitConfig::zoo());
    all
}

/// A tiny base model for tests: 2 layers, d_model 32, 4 heads, context 16, 11 symbols.
pub fn tiny() -> ModelConfig {
    ModelConfig {
        vocab_size: Some(11),
        d_model: 32,
        n_layers: 2,
        seq_len: 16,
        attention: AttentionConfig::Full(MultiHeadAttentionConfig { n_heads: 4, ..Default::default() }),
        feed_forward: FeedForwardConfig { d_ff: Some(64), ..Default::default() },
        ..Default::default()
    }
}

/// One tiny model per kind on every axis (each differs from [`tiny`] on one axis), named.
/// The tiny model of one attention test variant: [`tiny`] with the variant's attention, its
/// position scheme if it names one, and the masked objective if it asks for it.
pub fn attention_variant(v: TestVariant<AttentionConfig>) -> (String, ModelConfig) {
    let mut cfg = ModelConfig { attention: v.config, ..tiny() };
    if let Some(position) = v.position {
        cfg.position = position;
    }
    if v.masked {
        cfg.objective = ObjectiveConfig::Masked(MaskedConfig::default());
    }
    (v.name, cfg)
}

/// The tiny models of one attention kind's test variants (a built-in kind, or one registered
/// from another crate): what [`crate::harness::check_all`] runs for a user's kind.
pub fn attention_variants_of(kind: &str) -> Vec<(String, ModelConfig)> {
    AttentionConfig::test_variants().into_iter().filter(|v| v.config.kind() == kind).map(attention_variant).collect()
}

pub fn variants() -> Vec<(String, ModelConfig)> {
    let mut out = vec![("base (learned, full, pre-ln, gelu)".to_string(), tiny())];
    // relative schemes use small clipping distances so that a context of 16 reaches past them
    let positions = [
        PositionConfig::Sinusoidal(SinusoidalPositionConfig::default()),
        PositionConfig::Sinusoidal(SinusoidalPositionConfig { learnable: true, ..Default::default() }),
        PositionConfig::Learned(LearnedPositionConfig { max_len: Some(32), per_layer: false }),
        PositionConfig::Learned(LearnedPositionConfig { max_len: None, per_layer: true }),
        PositionConfig::None(Default::default()),
        PositionConfig::Shaw(ShawConfig { max_distance: 4, values: true }),
        PositionConfig::Shaw(ShawConfig { max_distance: 4, values: false }),
        PositionConfig::TransformerXl(XlRelativeConfig::default()),
        PositionConfig::T5(T5BiasConfig { num_buckets: 8, max_distance: 12 }),
        PositionConfig::Alibi(Default::default()),
        PositionConfig::Rope(RotaryConfig::default()),
        PositionConfig::Rope(RotaryConfig { layout: RopeLayout::Interleaved, rotary_dim: Some(4), base: 500.0 }),
        PositionConfig::Da(Default::default()),
        PositionConfig::Multiplicative(MultiplicativeConfig { max_distance: 6 }),
        PositionConfig::Untied(UntiedConfig::default()),
        PositionConfig::Deberta(DebertaConfig { max_distance: 4 }),
        PositionConfig::UniversalTimestep(Default::default()),
    ];
    for p in positions {
        out.push((format!("position {p:?}"), ModelConfig { position: p, ..tiny() }));
    }
    for norm in [NormKind::LayerNorm, NormKind::RmsNorm] {
        let r = ResidualConfig { norm, ..Default::default() };
        out.push((format!("block post-ln {norm:?}"), ModelConfig { block: BlockConfig::PostLn(r.clone()), ..tiny() }));
        out.push((format!("block pre-ln {norm:?}"), ModelConfig { block: BlockConfig::PreLn(r), ..tiny() }));
    }
    for kind in FeedForwardKind::ALL {
        out.push((
            format!("feed_forward {}", kind.name()),
            ModelConfig { feed_forward: FeedForwardConfig { kind, d_ff: Some(48), ..Default::default() }, ..tiny() },
        ));
    }
    out.push(("untied head".into(), ModelConfig { tie_embeddings: false, ..tiny() }));
    out.push((
        "scaled embeddings + sinusoidal".into(),
        ModelConfig {
            scale_embeddings: true,
            position: PositionConfig::Sinusoidal(SinusoidalPositionConfig::default()),
            ..tiny()
        },
    ));
    out.push((
        "attention adaptive-span + xl memory".into(),
        ModelConfig {
            seq_len: 4,
            attention: AttentionConfig::AdaptiveSpan(AdaptiveSpanConfig {
                max_span: 8,
                ramp: 2,
                init_span: 0.5,
                ..Default::default()
            }),
            memory: MemoryConfig::Xl(XlMemoryConfig { length: 12 }),
            position: PositionConfig::Alibi(Default::default()),
            ..tiny()
        },
    ));
    // memories: XL over segments of 4 with a memory long enough that token-by-token decoding
    // across segment boundaries still sees every earlier token; compressive with each function
    let xl = PositionConfig::TransformerXl(XlRelativeConfig::default());
    out.push((
        "memory xl".into(),
        ModelConfig {
            seq_len: 4,
            memory: MemoryConfig::Xl(XlMemoryConfig { length: 12 }),
            position: xl.clone(),
            ..tiny()
        },
    ));
    for compression in
        [CompressionKind::Conv, CompressionKind::MaxPool, CompressionKind::DilatedConv, CompressionKind::MostUsed]
    {
        let memory = MemoryConfig::Compressive(CompressiveMemoryConfig {
            length: 4,
            compressed_length: 4,
            rate: 2,
            compression,
            autoencoding_weight: 0.5,
            ..Default::default()
        });
        out.push((
            format!("memory compressive {}", compression.name()),
            ModelConfig { memory, position: PositionConfig::Alibi(Default::default()), ..tiny() },
        ));
    }
    let reversible = BlockConfig::Reversible(Default::default());
    out.push(("block reversible".into(), ModelConfig { block: reversible.clone(), n_layers: 3, ..tiny() }));
    out.push((
        "block reversible + alibi + sliding-window".into(),
        ModelConfig {
            block: reversible,
            position: PositionConfig::Alibi(Default::default()),
            attention: AttentionConfig::SlidingWindow(SlidingWindowConfig { window: 4, ..Default::default() }),
            ..tiny()
        },
    ));
    out.push(("block gtrxl".into(), ModelConfig { block: BlockConfig::Gtrxl(GtrxlConfig::default()), ..tiny() }));
    out.push((
        "block gtrxl + xl memory".into(),
        ModelConfig {
            seq_len: 4,
            block: BlockConfig::Gtrxl(GtrxlConfig::default()),
            memory: MemoryConfig::Xl(XlMemoryConfig { length: 12 }),
            position: PositionConfig::Rope(RotaryConfig::default()),
            ..tiny()
        },
    ));
    // Universal Transformer: 3 steps of one block, with and without ACT, pre- and post-LN
    let ut = |act: bool, block: BlockConfig| ModelConfig {
        n_layers: 3,
        position: PositionConfig::UniversalTimestep(Default::default()),
        depth: DepthConfig::Universal(UniversalConfig { act, halting_bias: -1.0, ..Default::default() }),
        block,
        ..tiny()
    };
    out.push(("depth universal".into(), ut(false, BlockConfig::default())));
    out.push(("depth universal + act".into(), ut(true, BlockConfig::default())));
    out.push(("depth universal + act, post-ln".into(), ut(true, BlockConfig::PostLn(ResidualConfig::default()))));
    let sepconv = FeedForwardConfig { kind: FeedForwardKind::SeparableConv, d_ff: Some(48), ..Default::default() };
    out.push((
        "depth universal + act, separable-conv transition".into(),
        ModelConfig { feed_forward: sepconv, ..ut(true, BlockConfig::default()) },
    ));
    // early exits: shared head, and one classifier per block
    for shared in [true, false] {
        let exits = ExitConfig::EveryLayer(EveryLayerConfig { shared, classifier: shared, ..Default::default() });
        out.push((format!("exits every-layer shared={shared}"), ModelConfig { n_layers: 3, exits, ..tiny() }));
    }
    // the Depth-Adaptive Transformer's exit predictors, with both oracles
    for (predictor, oracle) in [
        (PredictorKind::Sequence, Oracle::Likelihood),
        (PredictorKind::TokenMultinomial, Oracle::Correctness),
        (PredictorKind::TokenGeometric, Oracle::Likelihood),
    ] {
        let exits = ExitConfig::EveryLayer(EveryLayerConfig { predictor, oracle, ..Default::default() });
        out.push((
            format!("exits predictor {} ({oracle:?})", predictor.name()),
            ModelConfig { n_layers: 3, exits, ..tiny() },
        ));
    }
    // "attend at most N back" on full attention (a band computed by blocks, a trimmed cache) and
    // on a sparse kind
    out.push((
        "max_back 3, attention full + position alibi".into(),
        ModelConfig { max_back: Some(3), position: PositionConfig::Alibi(Default::default()), ..tiny() },
    ));
    let attention = AttentionConfig::Strided(StridedConfig { stride: 4, ..Default::default() });
    out.push(("max_back 5, attention strided".into(), ModelConfig { max_back: Some(5), attention, ..tiny() }));
    // every attention kind's own variants (declared beside the kind)
    out.extend(AttentionConfig::test_variants().into_iter().map(attention_variant));
    // the masked objective (bidirectional attention): full attention, a reversible stack
    let masked = || ObjectiveConfig::Masked(MaskedConfig::default());
    for (name, cfg) in [
        ("masked lm", ModelConfig { objective: masked(), ..tiny() }),
        (
            "masked lm + position sinusoidal",
            ModelConfig {
                objective: masked(),
                position: PositionConfig::Sinusoidal(SinusoidalPositionConfig::default()),
                ..tiny()
            },
        ),
        (
            "masked lm + reversible",
            ModelConfig { objective: masked(), block: BlockConfig::Reversible(Default::default()), ..tiny() },
        ),
    ] {
        out.push((name.into(), cfg));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind a model config selects on `axis`.
    fn kind_on(axis: &str, m: &ModelConfig) -> &'static str {
        match axis {
            "model.position" => m.position.kind(),
            "model.attention" => m.attention.kind(),
            "model.block" => m.block.kind(),
            "model.feed_forward" => m.feed_forward.kind.name(),
            "model.memory" => m.memory.kind(),
            "model.depth" => m.depth.kind(),
            "model.exits" => m.exits.kind(),
            other => panic!("an axis the harness does not know: {other}"),
        }
    }

    #[test]
    fn every_zoo_row_has_a_test_variant_and_every_variant_is_valid() {
        let variants = variants();
        for row in kinds() {
            assert!(
                variants.iter().any(|(_, m)| kind_on(row.axis, m) == row.kind),
                "{} = \"{}\" is in the zoo but no generic-test variant selects it: declare one beside the kind",
                row.axis,
                row.kind
            );
        }
        for (name, m) in &variants {
            m.validate().unwrap_or_else(|e| panic!("variant {name}: {e}"));
        }
        let mut names: Vec<_> = variants.iter().map(|(n, _)| n.as_str()).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "two variants share a name");
    }
}
