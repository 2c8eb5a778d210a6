//! CALM early exit: the thresholds' defining limits, state propagation, and calibration.

use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use variorum_model::{EveryLayerConfig, ExitConfig, ModelConfig, Oracle, PredictorKind, zoo};
use variorum_train::early_exit::{self, Confidence, ExitPolicy};
use variorum_train::generate::{SampleConfig, generate};

fn model(dev: &Device) -> variorum_model::DecoderLm {
    with_predictor(PredictorKind::None, dev)
}

fn with_predictor(predictor: PredictorKind, dev: &Device) -> variorum_model::DecoderLm {
    let cfg = ModelConfig {
        n_layers: 3,
        exits: ExitConfig::EveryLayer(EveryLayerConfig { classifier: true, predictor, ..Default::default() }),
        init_std: 0.2,
        ..zoo::tiny()
    };
    cfg.validate().unwrap();
    dev.seed(21);
    cfg.init(dev)
}

#[test]
fn threshold_one_is_the_full_model_and_zero_exits_at_the_first_block() {
    let dev = Device::flex();
    let m = model(&dev);
    let prompt = [1u32, 4, 2];
    let sample = SampleConfig::greedy(20);
    let full = generate(&m, &prompt, &sample, &dev, |_| {});
    // (this model has no exit predictor: see the predictors' own test)
    for confidence in Confidence::ALL.into_iter().filter(|c| *c != Confidence::Predictor) {
        let (never, used) = early_exit::generate(&m, &prompt, 20, ExitPolicy { confidence, threshold: 1.0 }, &dev);
        assert_eq!(never, full, "{}: threshold 1 must generate what the full model does", confidence.name());
        assert!(used.iter().all(|&n| n == 3));
        let (_, used) = early_exit::generate(&m, &prompt, 20, ExitPolicy { confidence, threshold: 0.0 }, &dev);
        assert!(used.iter().all(|&n| n == 1), "{}: threshold 0 exits at the first block: {used:?}", confidence.name());
    }
}

#[test]
fn exit_predictors_at_threshold_one_are_the_full_model_and_at_zero_exit_first() {
    let dev = Device::flex();
    let prompt = [3u32, 1, 4, 1, 5];
    let sample = SampleConfig {
        max_new_tokens: 12,
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        no_cache: false,
        seed: 0,
        tag: None,
    };
    for kind in [PredictorKind::Sequence, PredictorKind::TokenMultinomial, PredictorKind::TokenGeometric] {
        let m = with_predictor(kind, &dev);
        let full = generate(&m, &prompt, &sample, &dev, |_| {});
        let policy = |threshold| ExitPolicy { confidence: Confidence::Predictor, threshold };
        let (never, used) = early_exit::generate(&m, &prompt, 12, policy(1.0), &dev);
        assert_eq!(never, full, "{}", kind.name());
        assert!(used.iter().all(|&n| n == 3));
        let (_, used) = early_exit::generate(&m, &prompt, 12, policy(0.0), &dev);
        assert!(used.iter().all(|&n| n == 1), "{}: {used:?}", kind.name());
    }
    // a model without a predictor is never confident by it
    let (_, used) = early_exit::generate(
        &model(&dev),
        &prompt,
        5,
        ExitPolicy { confidence: Confidence::Predictor, threshold: 0.0 },
        &dev,
    );
    assert!(used.iter().all(|&n| n == 3));
}

#[test]
fn exit_predictors_learn_their_oracle_and_only_it() {
    let dev = Device::flex().autodiff();
    let ids: Vec<i64> = (0..96).map(|i| (i * 7 % 11) as i64).collect();
    let x = Tensor::<2, Int>::from_data(TensorData::new(ids[..48].to_vec(), [3, 16]), &dev);
    let y = Tensor::<2, Int>::from_data(TensorData::new(ids[48..].to_vec(), [3, 16]), &dev);
    let predictor_loss = |m: &variorum_model::DecoderLm| {
        let (_, aux) = m.loss(x.clone(), y.clone());
        aux.into_iter().find(|(n, _)| n == "exit_predictor").expect("the predictor is trained").1
    };
    for kind in [PredictorKind::Sequence, PredictorKind::TokenMultinomial, PredictorKind::TokenGeometric] {
        let mut m = with_predictor(kind, &dev);
        let loss = predictor_loss(&m);
        let before = loss.clone().into_scalar::<f32>();
        let grads = loss.backward();
        // the predictor reads detached states: the model gets no gradient from it
        assert!(m.token_embedding.weight.grad(&grads).is_none(), "{}", kind.name());
        let p = m.exits.as_ref().unwrap().predictor.as_ref().unwrap();
        assert_eq!(p.oracle, Oracle::Likelihood);
        for layer in &p.layers {
            assert!(layer.weight.grad(&grads).unwrap().abs().sum().into_scalar::<f32>() > 0.0, "{}", kind.name());
        }
        // descending this loss alone moves q towards the (fixed) oracle
        let mut opt = AdamWConfig::new().with_weight_decay(0.0).init();
        for _ in 0..40 {
            let grads = GradientsParams::from_grads(predictor_loss(&m).backward(), &m);
            m = opt.step(0.05, m, grads);
        }
        let after = predictor_loss(&m).into_scalar::<f32>();
        assert!(after < 0.5 * before, "{}: predictor loss {before} -> {after}", kind.name());
    }
}

#[test]
fn skipped_blocks_get_the_propagated_keys_and_the_full_pass_matches_the_forward() {
    let dev = Device::flex();
    let m = model(&dev);
    let ids: Vec<u32> = (0..33).map(|i| (i * 7 % 11) as u32).collect();
    // every token exits at block 1, yet every block's cache holds every position
    let mut state = variorum_model::DecoderState::default();
    for &t in &ids[..10] {
        early_exit::step(
            &m,
            t,
            &mut state,
            ExitPolicy { confidence: Confidence::SoftmaxResponse, threshold: 0.0 },
            &dev,
        );
    }
    for layer in &state.layers {
        let Some(kv) = layer.attention.get::<variorum_attention::KvCache>() else { panic!("no cache") };
        assert_eq!(kv.len(), 10);
    }
    // at threshold 1 the teacher-forced loss equals the plain forward's on the same windows
    let full = ExitPolicy { confidence: Confidence::Saturation, threshold: 1.0 };
    let (loss, blocks) = early_exit::exit_loss(&m, &ids, full, &dev);
    let (reference, _) = variorum_train::eval::sliding_loss(&m, &ids[..33], None, 16, 16, &dev, None);
    assert!((loss - reference).abs() < 1e-4, "{loss} vs {reference}");
    assert_eq!(blocks, 3.0);
    // calibration with an infinite tolerance picks the smallest threshold, with fewer blocks;
    // with none, only a threshold that changes nothing passes
    let points = early_exit::sweep(&m, &ids, Confidence::SoftmaxResponse, &[0.0, 0.5], &dev);
    assert_eq!(points.iter().map(|p| p.threshold).collect::<Vec<_>>(), vec![1.0, 0.5, 0.0]);
    let p = early_exit::calibrate(&points, f64::INFINITY).unwrap();
    assert_eq!((p.threshold, p.blocks()), (0.0, 1.0));
    if let Some(p) = early_exit::calibrate(&points, 0.0) {
        assert!(p.loss() <= points[0].loss());
    }
    // LTT: at δ ≈ 1 every threshold is shown safe
    let first = points.last().unwrap();
    assert!(first.changed(&points[0]) > 0.0, "exiting at block 1 changes some prediction");
    assert_eq!(early_exit::calibrate_ltt(&points, 0.999, 0.5).map(|p| p.threshold), Some(0.0));
    // δ = 1 % cannot be shown with 32 tokens (p ≥ exp(−2·32·0.01²) ≈ 0.99), whatever the risk
    assert!(early_exit::calibrate_ltt(&points, 0.01, 0.05).is_none());
}

#[test]
fn the_exit_classifier_learns_from_the_consistency_oracle_only() {
    let dev = Device::flex().autodiff();
    let m = model(&dev);
    let ids: Vec<i64> = (0..32).map(|i| (i * 7 % 11) as i64).collect();
    let x = Tensor::<2, Int>::from_data(TensorData::new(ids[..16].to_vec(), [2, 8]), &dev);
    let y = Tensor::<2, Int>::from_data(TensorData::new(ids[16..].to_vec(), [2, 8]), &dev);
    let (_, aux) = m.loss(x, y);
    let (_, bce) = aux.iter().find(|(n, _)| n == "exit_classifier").expect("the classifier is trained");
    let grads = bce.backward();
    let exits = m.exits.as_ref().unwrap();
    assert_eq!(exits.classifiers.len(), 2);
    for c in &exits.classifiers {
        assert!(c.weight.grad(&grads).unwrap().abs().sum().into_scalar::<f32>() > 0.0);
    }
    // the states are read detached: the model itself gets nothing from this loss
    assert!(m.token_embedding.weight.grad(&grads).is_none());
}

#[test]
fn hoeffding_p_values() {
    // R̂ ≥ δ is never rejected; the p-value falls with n and with the margin
    assert_eq!(early_exit::hoeffding_p_value(0.2, 0.1, 1e6), 1.0);
    let p = |r, n| early_exit::hoeffding_p_value(r, 0.1, n);
    assert!((p(0.05, 1000.0) - (-2.0f64 * 1000.0 * 0.0025).exp()).abs() < 1e-12);
    assert!(p(0.05, 2000.0) < p(0.05, 1000.0) && p(0.0, 1000.0) < p(0.05, 1000.0));
}
