//! Every kind on every axis: the rows of `variorum zoo`, and the tiny model variants the generic
//! tests run. Each kind declares its variants beside itself (`AttentionKind::test_variants`,
//! `PositionKind::test_variants`, `Declared::test_variants`); this file only composes them into
//! models. Combinations of several axes live in the test kit (`crates/variorum-testkit`).

use variorum_attention::{AttentionConfig, MultiHeadAttentionConfig, TestVariant};
use variorum_block::{BlockConfig, DepthConfig, FeedForwardConfig, FeedForwardKind, MemoryConfig};
use variorum_core::KindInfo;
use variorum_position::PositionConfig;

use crate::ModelConfig;
use crate::encoder::ModelKind;
use crate::exits::ExitConfig;
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

/// One tiny model per declared test variant of every kind on every axis, each differing from
/// [`tiny`] on that axis, with what the axis needs around it: memories run under ALiBi,
/// universal depth with 3 steps of the timestep signal, exits and blocks with 3 layers. (A
/// lossy memory cannot match the full forward once it compresses or drops states, so memories
/// run on tiny's context here; the test kit's combinations cross segment boundaries with a
/// memory that keeps everything.) Every row comes from a kind's own declaration; combinations of several axes are the
/// test kit's (`variorum-testkit`).
pub fn variants() -> Vec<(String, ModelConfig)> {
    let named = |axis: &str, name: String| format!("{axis} {name}").trim_end().to_string();
    let mut out = vec![("base (learned, full, pre-ln, gelu)".to_string(), tiny())];
    for (name, position) in PositionConfig::test_variants() {
        out.push((named("position", name), ModelConfig { position, ..tiny() }));
    }
    out.extend(AttentionConfig::test_variants().into_iter().map(attention_variant));
    for (name, block) in BlockConfig::test_variants() {
        // a block whose stack is wider than the model reads it with a head of its own
        let tie_embeddings = block.output_width(tiny().d_model) == tiny().d_model;
        out.push((named("block", name), ModelConfig { block, n_layers: 3, tie_embeddings, ..tiny() }));
    }
    for &kind in FeedForwardKind::ALL {
        let feed_forward = FeedForwardConfig { kind, d_ff: Some(48), ..Default::default() };
        out.push((named("feed_forward", kind.name().into()), ModelConfig { feed_forward, ..tiny() }));
    }
    for (name, memory) in MemoryConfig::test_variants().into_iter().filter(|(_, m)| !m.is_none()) {
        let position = PositionConfig::Alibi(Default::default());
        out.push((named("memory", name), ModelConfig { memory, position, ..tiny() }));
    }
    for (name, depth) in DepthConfig::test_variants() {
        let position = PositionConfig::UniversalTimestep(Default::default());
        out.push((name, ModelConfig { n_layers: 3, depth, position, ..tiny() }));
    }
    for (name, exits) in ExitConfig::test_variants() {
        out.push((name, ModelConfig { n_layers: 3, exits, ..tiny() }));
    }
    let masked = ObjectiveConfig::Masked(MaskedConfig::default());
    out.push(("masked lm".into(), ModelConfig { objective: masked, ..tiny() }));
    out
}

/// [`tiny`] as an encoder–decoder: two encoder blocks, two decoder blocks with full
/// cross-attention.
pub fn tiny_encoder_decoder() -> ModelConfig {
    ModelConfig { kind: ModelKind::EncoderDecoder, ..tiny() }
}

/// The tiny encoder–decoders the workspace checks (`harness::check_encoder_decoder`): every test
/// variant of every kind that declares `cross` as the cross-attention; every bidirectional
/// attention variant as the encoder's attention (and, where it is also causal and decodes
/// incrementally, as the decoder's); every position scheme that is not per-layer; every block
/// kind an encoder–decoder takes.
pub fn encoder_decoder_variants() -> Vec<(String, ModelConfig)> {
    let base = tiny_encoder_decoder();
    let mut out = vec![("encoder-decoder base".to_string(), base.clone())];
    for v in AttentionConfig::test_variants() {
        let caps = v.config.capabilities();
        let on = |c: ModelConfig| c.validate().is_ok().then_some(c);
        if caps.cross
            && let Some(c) = on(ModelConfig { cross_attention: Some(v.config.clone()), ..base.clone() })
        {
            out.push((format!("encoder-decoder cross {}", v.name), c));
        }
        if caps.bidirectional {
            let encoder = crate::EncoderConfig { attention: Some(v.config.clone()), ..Default::default() };
            let decoder = (caps.causal && caps.incremental).then(|| v.config.clone());
            let position = v.position.clone().unwrap_or_else(|| base.position.clone());
            let c =
                ModelConfig { encoder, attention: decoder.unwrap_or(base.attention.clone()), position, ..base.clone() };
            if let Some(c) = on(c) {
                out.push((format!("encoder-decoder self {}", v.name), c));
            }
        }
    }
    for (name, position) in PositionConfig::test_variants() {
        let c = ModelConfig { position, ..base.clone() };
        if c.validate().is_ok() {
            out.push((format!("encoder-decoder position {name}").trim_end().to_string(), c));
        }
    }
    for (name, block) in BlockConfig::test_variants() {
        let c = ModelConfig { block, ..base.clone() };
        if c.validate().is_ok() {
            out.push((format!("encoder-decoder block {name}").trim_end().to_string(), c));
        }
    }
    out.push(("encoder-decoder t5 recipe".to_string(), t5_recipe()));
    out
}

/// T5's recipe on the tiny encoder–decoder, as `variorum import` writes it for a T5 v1.1
/// checkpoint: the vocabulary's own start and end tokens (`<pad>` = 0, `</s>` = 1), full
/// attention without biases or the 1/√d_h, T5's bucketed bias, pre-LN blocks with RMS norms,
/// a tanh-GEGLU FFN without biases, and the head reading the stream times 1/√d_model.
pub fn t5_recipe() -> ModelConfig {
    let attention = AttentionConfig::Full(MultiHeadAttentionConfig {
        n_heads: 4,
        bias: false,
        scaled: false,
        ..Default::default()
    });
    let block = BlockConfig::PreLn(variorum_block::PreLnConfig {
        norm: variorum_block::NormKind::RmsNorm,
        norm_eps: 1e-6,
        ..Default::default()
    });
    let feed_forward = FeedForwardConfig { kind: FeedForwardKind::GegluTanh, bias: false, ..Default::default() };
    ModelConfig {
        end_token: Some(1),
        start_token: Some(0),
        scale_head: true,
        // one table per stack, as T5 has
        position: PositionConfig::T5(variorum_position::T5BiasConfig { shared: true, ..Default::default() }),
        cross_attention: Some(attention.clone()),
        attention,
        block,
        feed_forward,
        ..tiny_encoder_decoder()
    }
}

/// Panics unless every test variant validates and no two share a name (the zoo's own variants,
/// and the cross-axis combinations of `variorum-testkit`).
pub fn assert_valid_and_named_once(variants: &[(String, ModelConfig)]) {
    for (name, m) in variants {
        m.validate().unwrap_or_else(|e| panic!("variant {name}: {e}"));
    }
    let mut names: Vec<_> = variants.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "two variants share a name");
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
        assert_valid_and_named_once(&variants);
    }

    /// Every registered kind of the axes written by registries round-trips through a TOML
    /// `[model]` table unchanged, and an unknown key in its table is refused by name.
    #[test]
    fn every_kind_round_trips_and_refuses_unknown_keys() {
        let mut models: Vec<ModelConfig> = Vec::new();
        models.extend(PositionConfig::every_kind().into_iter().map(|position| ModelConfig { position, ..tiny() }));
        models.extend(BlockConfig::every_kind().into_iter().map(|block| ModelConfig { block, ..tiny() }));
        models.extend(MemoryConfig::every_kind().into_iter().map(|memory| ModelConfig { memory, ..tiny() }));
        models.extend(
            FeedForwardKind::ALL
                .iter()
                .map(|&kind| ModelConfig { feed_forward: FeedForwardConfig { kind, ..Default::default() }, ..tiny() }),
        );
        for m in models {
            let text = toml::to_string(&m).unwrap();
            assert_eq!(toml::from_str::<ModelConfig>(&text).unwrap(), m, "{text}");
            for table in ["[position]", "[block]", "[memory]", "[feed_forward]"] {
                let bad = text.replace(table, &format!("{table}\nnonsense = 1"));
                let err = toml::from_str::<ModelConfig>(&bad).err().map(|e| e.to_string()).unwrap_or_default();
                assert!(err.contains("nonsense"), "{table} of {text} accepted an unknown key: {err}");
            }
        }
    }
}
