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

/// `model.position.shared` (T5's one bias table per stack): every layer reads the first layer's
/// table, the same tensor, so back-propagation gives it the sum of what every layer's use
/// contributes — the gradient of one shared table — and the later layers' copies get none.
/// Computed against the same model with every table a tensor of its own.
#[test]
fn a_shared_position_table_is_one_tensor_whose_gradient_sums_the_layers() {
    use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
    use variorum_model::Source;
    use variorum_model::zoo::t5_recipe;

    /// `(path, id)` of every position parameter.
    #[derive(Default)]
    struct Tables {
        path: Vec<String>,
        found: Vec<(String, ParamId)>,
    }
    impl ModuleVisitor for Tables {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.into());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if self.path.iter().any(|m| m == "position") {
                self.found.push((self.path.join("."), param.id));
            }
        }
    }
    /// Every parameter a leaf of its own, its id and value kept.
    struct Untie;
    impl ModuleMapper for Untie {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            param.map(|t| Tensor::from_data(t.to_data(), &t.device()).require_grad())
        }
    }

    let dev = Device::flex().autodiff();
    dev.seed(11);
    let cfg = t5_recipe();
    cfg.validate().unwrap();
    let tied = cfg.init(&dev);
    let mut tables = Tables::default();
    tied.visit(&mut tables);
    let tables = tables.found;
    // 2 encoder and 2 decoder layers, one table each
    assert_eq!(tables.len(), 4, "{tables:?}");
    let first = |stack: &str| tables.iter().find(|(p, _)| p.starts_with(&format!("{stack}.0."))).unwrap().1;
    let value = |m: &variorum_model::DecoderLm, id: ParamId| -> Tensor<2> {
        let mut v = None;
        struct Find<'a>(ParamId, &'a mut Option<TensorData>);
        impl ModuleVisitor for Find<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                if p.id == self.0 {
                    *self.1 = Some(p.val().to_data());
                }
            }
        }
        m.visit(&mut Find(id, &mut v));
        Tensor::from_data(v.unwrap(), &Device::flex())
    };
    for (path, id) in &tables {
        let stack = if path.starts_with("encoder.") { "encoder.blocks" } else { "blocks" };
        let diff = (value(&tied, *id) - value(&tied, first(stack))).abs().max().into_scalar::<f32>();
        assert_eq!(diff, 0.0, "{path} is not its stack's first table");
    }

    let vocab = cfg.vocab();
    let ids = |n: usize, seed: u64| -> Tensor<2, Int> {
        let v: Vec<i64> = (0..n as u64).map(|i| ((i * 7 + seed * 3) % (vocab as u64 - 2) + 2) as i64).collect();
        Tensor::from_data(TensorData::new(v, [1, n]), &dev)
    };
    let source = Source { tokens: ids(9, 1), padding: None };
    let (tokens, targets) = (ids(7, 2), ids(7, 3));
    let grads_of =
        |m: &variorum_model::DecoderLm| m.loss_and_grads(tokens.clone(), targets.clone(), source.clone(), None, 1).2;
    let shared = grads_of(&tied);
    let apart = grads_of(&tied.clone().map(&mut Untie));
    for stack in ["encoder.blocks", "blocks"] {
        let layers: Vec<ParamId> =
            tables.iter().filter(|(p, _)| p.starts_with(&format!("{stack}."))).map(|(_, id)| *id).collect();
        let own = |i: usize| apart.get::<2>(layers[i]).expect("each table's own gradient");
        let sum = own(0) + own(1);
        let size = sum.clone().abs().max().into_scalar::<f32>();
        // the later layer's own share is not nothing, or the sum would be the first's alone
        let later = own(1).abs().max().into_scalar::<f32>();
        assert!(later > 0.05 * size, "{stack}: layer 1's table has next to no gradient ({later} of {size})");
        let got = shared.get::<2>(layers[0]).expect("the shared table's gradient");
        let diff = (got - sum).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-4 * size, "{stack}: the shared gradient differs from the layers' sum by {diff} (of {size})");
        for id in &layers[1..] {
            assert!(shared.get::<2>(*id).is_none(), "{stack}: a later layer's copy has a gradient of its own");
        }
    }
}
