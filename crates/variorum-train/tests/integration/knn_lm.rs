//! kNN-LM end to end (`variorum_train::retrieval::knn_lm`): a datastore built from a trained run over its
//! training split and over a text; λ = 0 reproducing the LM's loss to the bit; a datastore over
//! the scored text that never hands a position its own continuation; an interrupted build that
//! resumes to the same datastore; generation that recites the datastore's text with λ = 1.

use std::path::{Path, PathBuf};

use crate::common;

use burn::prelude::*;
use common::{corpus, seeded, tiny_config};
use variorum_retrieval::search::HnswParams;
use variorum_retrieval::{Datastore, KnnConfig, SearchMode};
use variorum_train::generate::{Retrieval, SampleConfig, generate_with};
use variorum_train::retrieval::knn_lm::{self, BuildSettings, Built, KnnEval, Retriever};
use variorum_train::run::Run;
use variorum_train::{Outcome, TrainOptions, train};

/// The tiny model of `common` trained 60 steps on the tests' corpus.
fn trained_run(dir: &Path) -> PathBuf {
    let cfg = tiny_config(&corpus(dir), 0.0).with_settings(&["train.steps=60".to_string()]).unwrap();
    let run = dir.join("run");
    let mut opts = TrainOptions::new(&run, Device::flex(), "flex");
    opts.max_steps = Some(60);
    assert!(matches!(train(cfg, &opts).unwrap(), Outcome::Finished(_)));
    run
}

fn settings(run: &Run) -> BuildSettings {
    BuildSettings { window: run.model.seq_len, stride: run.model.seq_len, index: HnswParams::default() }
}

fn build(run: &Run, ids: &[u32], text: &str, out: &Path) -> Datastore {
    let built = knn_lm::build_datastore(run, ids, text, out, &settings(run), |_, _, _| {}, &|| false).unwrap();
    assert_eq!(built, Built::Complete);
    Datastore::open(out).unwrap()
}

/// Tokens of the corpus's alphabet in random order: no context predicts its continuation.
fn random_ids(run: &Run, n: usize) -> Vec<u32> {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    let vocab = run.model.vocab_size as u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab) as u32
        })
        .collect()
}

fn eval(run: &Run, ks: &[usize], lambdas: &[f64], mode: SearchMode) -> KnnEval {
    KnnEval {
        window: run.model.seq_len,
        stride: run.model.seq_len / 2,
        ks: ks.to_vec(),
        lambdas: lambdas.to_vec(),
        temperature: 1.0,
        mode,
        recall_queries: 0,
    }
}

/// Over the training split's datastore, the validation loss with λ = 0 is the LM's loss exactly
/// (and the sliding-window evaluation's, to the bit); retrieval from the training text changes
/// it; exact and approximate search agree on this small datastore.
#[test]
fn lambda_zero_reproduces_the_lm_loss_exactly() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let run = Run::load(&trained_run(tmp.path()), &Device::flex()).unwrap();
    let corpus = variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone())).unwrap();
    let store = build(&run, &corpus.train, "train split", &tmp.path().join("store"));
    assert_eq!(store.len() as u64, knn_lm::planned_entries(corpus.train.len(), &settings(&run)));
    assert_eq!(store.len(), corpus.train.len() - 1, "one entry per predicted position");
    assert_eq!(store.values(), &corpus.train[1..], "entry i holds token i + 1");
    for mode in [SearchMode::Exact, SearchMode::Approximate { ef: 64 }] {
        let s = knn_lm::knn_loss(&run, &store, &corpus.val, &eval(&run, &[4, 16], &[0.0, 0.25], mode), None).unwrap();
        assert!(!s.causal, "the validation split is not the datastore's text");
        let (lm, n) = variorum_train::eval::sliding_loss(
            &run.model,
            &corpus.val,
            None,
            run.model.seq_len,
            run.model.seq_len / 2,
            &Device::flex(),
            None,
        );
        assert_eq!((s.lm, s.tokens), (lm, n), "the LM alone is the sliding-window evaluation");
        for &(k, lambda, loss) in &s.mixed {
            if lambda == 0.0 {
                assert_eq!(loss, s.lm, "λ = 0 with k = {k}");
            } else {
                assert!((loss - s.lm).abs() > 1e-4, "retrieval changes the loss (k = {k}: {loss} vs {})", s.lm);
            }
        }
    }
}

/// A datastore over the very text being scored holds each position's own continuation. Scored
/// causally (the default when the text is the datastore's), no position retrieves it, and the
/// loss stays where retrieval from a random text's past can put it; a copy of the text with one
/// token changed at its end is not recognised as the datastore's, so every position retrieves
/// its own entry and the loss collapses — the leak the causal bound prevents.
#[test]
fn a_datastore_over_the_scored_text_never_hands_a_position_its_continuation() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let run = Run::load(&trained_run(tmp.path()), &Device::flex()).unwrap();
    let ids = random_ids(&run, 1200);
    let store = build(&run, &ids, "random text", &tmp.path().join("store"));
    for mode in [SearchMode::Exact, SearchMode::Approximate { ef: 64 }] {
        // the datastore's windows: each position's own entry has exactly its key
        let settings = KnnEval { stride: run.model.seq_len, ..eval(&run, &[1, 4], &[0.5, 0.9], mode) };
        let causal = knn_lm::knn_loss(&run, &store, &ids, &settings, None).unwrap();
        assert!(causal.causal);
        // a prefix of the datastore's text is recognised too
        assert!(knn_lm::knn_loss(&run, &store, &ids[..600], &settings, None).unwrap().causal);
        let mut other = ids.clone();
        *other.last_mut().unwrap() = (other[other.len() - 1] + 1) % run.model.vocab_size as u32;
        let leaky = knn_lm::knn_loss(&run, &store, &other, &settings, None).unwrap();
        assert!(!leaky.causal);
        for (c, l) in causal.mixed.iter().zip(&leaky.mixed) {
            // measured: LM 3.53; λ = 0.5: causal 4.07 / 3.83 (k = 1 / 4), leaky 0.82 / 1.60
            let what = format!("k = {} λ = {}: causal {:.3}, leaky {:.3}, LM {:.3}", c.0, c.1, c.2, l.2, causal.lm);
            // its own entry at distance 0 gives p_kNN(target) ≈ 1: the loss falls to about −ln λ
            assert!(l.2 < causal.lm - 1.0, "{what}");
            // the past of a random text predicts nothing: retrieval from it can only cost
            assert!(c.2 > causal.lm, "{what}");
        }
    }
    // the past does help when it holds the context: a random text read twice (its length a
    // multiple of the window, so the second reading's windows repeat the first's) retrieves, in
    // its second half, the entries of the first
    let twice: Vec<u32> = ids[..640].iter().chain(&ids[..640]).copied().collect();
    let store = build(&run, &twice, "random text twice", &tmp.path().join("twice"));
    let settings = KnnEval { stride: run.model.seq_len, ..eval(&run, &[1], &[0.9], SearchMode::Exact) };
    let first = knn_lm::knn_loss(&run, &store, &twice[..641], &settings, None).unwrap();
    let both = knn_lm::knn_loss(&run, &store, &twice, &settings, None).unwrap();
    assert!(first.causal && both.causal);
    // mean over the second half alone, from the two means
    let second = (both.mixed[0].2 * both.tokens as f64 - first.mixed[0].2 * first.tokens as f64)
        / (both.tokens - first.tokens) as f64;
    assert!(second < first.mixed[0].2 - 2.0, "second reading {second:.3}, first {:.3}", first.mixed[0].2);
}

/// A build stopped after its first group of windows resumes to the
/// datastore an uninterrupted build writes; a datastore is refused for another model's weights.
#[test]
fn an_interrupted_build_resumes_to_the_same_datastore() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let mut run = Run::load(&trained_run(tmp.path()), &Device::flex()).unwrap();
    let ids = random_ids(&run, 3000);
    let whole = build(&run, &ids, "random text", &tmp.path().join("whole"));
    let out = tmp.path().join("resumed");
    let asked = std::cell::Cell::new(0);
    let stop_second = || {
        asked.set(asked.get() + 1);
        asked.get() > 1
    };
    let first = knn_lm::build_datastore(&run, &ids, "random text", &out, &settings(&run), |_, _, _| {}, &stop_second);
    let Built::Interrupted { entries, .. } = first.unwrap() else { panic!("the build was stopped") };
    assert_eq!(entries, 16 * 16, "one group of 16 windows of 16 tokens committed");
    assert!(Datastore::open(&out).err().unwrap().to_string().contains("unfinished datastore"));
    let again = knn_lm::build_datastore(&run, &ids, "random text", &out, &settings(&run), |_, _, _| {}, &|| false);
    assert_eq!(again.unwrap(), Built::Complete);
    let resumed = Datastore::open(&out).unwrap();
    assert_eq!(resumed.keys(), whole.keys());
    assert_eq!(resumed.values(), whole.values());
    // another text into the same directory is refused by name
    let err = knn_lm::build_datastore(&run, &ids[1..], "other text", &out, &settings(&run), |_, _, _| {}, &|| false);
    assert!(err.unwrap_err().to_string().contains("holds a datastore of random text"));
    // the keys belong to the weights they were computed with
    let earliest = std::fs::read_dir(run.dir.join("checkpoints"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("step-"))
        .min();
    run.weights = earliest.unwrap().join("model.bpk");
    assert!(run.weights.is_file(), "{}", run.weights.display());
    let err = knn_lm::check_datastore(&run, &resumed).unwrap_err().to_string();
    assert!(err.contains("build the datastore again"), "{err}");
}

/// With λ = 1 and k = 1 the next token is the value of the nearest key: prompted with the
/// start of a (random, so unpredictable) text, greedy generation with the cache recites the
/// rest of its first window from the datastore; without retrieval it does not.
#[test]
fn generation_with_lambda_one_recites_the_datastore() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let run = Run::load(&trained_run(tmp.path()), &Device::flex()).unwrap();
    let ids = random_ids(&run, 800);
    let store = build(&run, &ids, "random text", &tmp.path().join("store"));
    let retriever = Retriever {
        store: &store,
        knn: KnnConfig { k: 1, lambda: 1.0, temperature: 1.0 },
        mode: SearchMode::Approximate { ef: 64 },
    };
    let cfg = SampleConfig::greedy(12);
    let recited = generate_with(
        &run.model,
        &ids[..4],
        &cfg,
        Retrieval { knn: Some(&retriever), neighbours: None },
        &Device::flex(),
        |_| {},
    )
    .unwrap();
    assert_eq!(recited, &ids[4..16]);
    let alone = generate_with(&run.model, &ids[..4], &cfg, Retrieval::default(), &Device::flex(), |_| {}).unwrap();
    assert_ne!(alone, &ids[4..16]);
}
