//! Encoder–decoder models, across the kinds they compose: every cross-attention kind, every
//! bidirectional attention kind as the encoder's (and the decoder's where it decodes), every
//! position scheme and block kind an encoder–decoder takes — each checked for its defining
//! properties (`harness::check_encoder_decoder`): a causal decoder, every source token read,
//! source padding hidden, cached decoding equal to the full forward. The base model also learns
//! to reverse its sources.

use burn::prelude::*;
use variorum_model::harness::{check_encoder_decoder, check_encoder_decoder_overfit};
use variorum_model::zoo::{encoder_decoder_variants, tiny_encoder_decoder};

#[test]
fn every_encoder_decoder_variant_keeps_its_properties() {
    let device = Device::flex();
    let variants = encoder_decoder_variants();
    let failures: Vec<String> =
        variants.iter().filter_map(|(name, cfg)| check_encoder_decoder(name, cfg, &device).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // the kinds that must take part
    for part in [
        "cross attention full",
        "cross attention linear",
        "cross attention performer",
        "self attention full",
        "self attention linear",
        "position rope",
        "position t5",
        "block post-ln",
        "t5 recipe",
    ] {
        assert!(
            variants.iter().any(|(n, _)| n.starts_with(&format!("encoder-decoder {part}"))),
            "no variant {part}: {:?}",
            variants.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()
        );
    }
}

/// `model.end_token` and `model.start_token` (T5's `</s>` and `<pad>`): tokens of the
/// vocabulary, so no row is added for them; without them the one extra row `</s>` both starts
/// and ends. Out of the vocabulary, on a decoder-only model or beside span corruption's own
/// rows they are refused by name.
#[test]
fn vocabulary_start_and_end_tokens_add_no_row_and_are_checked() {
    use variorum_model::ModelConfig;
    use variorum_model::zoo::{t5_recipe, tiny};
    let (base, t5) = (tiny_encoder_decoder(), t5_recipe());
    let text = base.vocab_size.unwrap();
    assert_eq!((base.end_token(), base.start_token(), base.vocab()), (Some(text), Some(text), text + 1));
    assert_eq!((t5.end_token(), t5.start_token(), t5.vocab()), (Some(1), Some(0), text));
    let model = t5.init(&Device::flex());
    assert_eq!((model.end_token, model.start_token, model.text_vocab), (Some(1), Some(0), text));
    let err = |c: ModelConfig| {
        let mut c = c;
        c.validate().and_then(|_| c.resolve(text)).unwrap_err().to_string()
    };
    let e = err(ModelConfig { end_token: Some(text), ..t5_recipe() });
    assert!(e.contains(&format!("model.end_token = {text} is not a token of the vocabulary")), "{e}");
    let e = err(ModelConfig { start_token: Some(text + 5), ..t5_recipe() });
    assert!(e.contains("model.start_token"), "{e}");
    let e = err(ModelConfig { end_token: Some(1), ..tiny() });
    assert!(e.contains("are an encoder–decoder's"), "{e}");
    let span = variorum_model::ObjectiveConfig::SpanCorruption(Default::default());
    let e = err(ModelConfig { objective: span, ..t5_recipe() });
    assert!(e.contains("model.end_token cannot be used with model.objective.kind = \"span-corruption\""), "{e}");
}

#[test]
fn an_encoder_decoder_memorises_reversed_sources() {
    let device = Device::flex().autodiff();
    check_encoder_decoder_overfit("encoder-decoder base", &tiny_encoder_decoder(), &device).unwrap();
}

/// The mechanisms' own updates between optimizer steps reach every attention module: a
/// Performer cross-attention and a Performer encoder redraw their random features, so the
/// outputs move.
#[test]
fn updates_between_steps_reach_the_encoder_and_the_cross_attention() {
    let device = Device::flex();
    let performer: variorum_attention::AttentionConfig =
        toml::from_str("kind = \"performer\"\nn_heads = 4\nredraw_interval = 1").unwrap();
    for (part, cfg) in [
        ("cross", variorum_model::ModelConfig { cross_attention: Some(performer.clone()), ..tiny_encoder_decoder() }),
        (
            "encoder",
            variorum_model::ModelConfig {
                encoder: variorum_model::EncoderConfig { attention: Some(performer.clone()), ..Default::default() },
                ..tiny_encoder_decoder()
            },
        ),
    ] {
        cfg.validate().unwrap();
        device.seed(4);
        let model = cfg.init(&device);
        let src = variorum_model::harness::tokens(1, 2, 7, 11, &device);
        let tgt = variorum_model::harness::tokens(2, 2, 5, 11, &device);
        let run = |m: &variorum_model::DecoderLm| {
            let source = variorum_model::Source { tokens: src.clone(), padding: None };
            m.forward_tagged(tgt.clone(), source, None).logits
        };
        let before = run(&model);
        let after = run(&model.after_optimizer_step(1));
        let moved = (before - after).abs().max().into_scalar::<f32>();
        assert!(moved > 1e-6, "{part}: redrawing the features changed nothing");
    }
}
