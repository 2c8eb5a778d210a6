//! Generation and scoring: cached = uncached, seeded sampling reproducible, score = eval × tokens,
//! and bad inputs are clear errors.

use std::path::{Path, PathBuf};

use crate::common;

use burn::prelude::*;
use common::seeded;
use variorum_model::zoo;
use variorum_train::eval::evaluate;
use variorum_train::generate::{SampleConfig, generate};
use variorum_train::run::Run;
use variorum_train::{ExperimentConfig, TrainOptions, train};

fn sample_cfg(temperature: f64, seed: u64, no_cache: bool) -> SampleConfig {
    SampleConfig { max_new_tokens: 40, temperature, top_k: 0, top_p: 1.0, seed, no_cache, tag: None }
}

#[test]
fn cached_generation_equals_uncached_for_every_variant() {
    let _guard = seeded();
    let dev = Device::flex();
    for (name, cfg) in variorum_testkit::variants() {
        // a masked LM does not generate
        if !cfg.attention.capabilities().incremental || !cfg.objective.is_causal() {
            continue;
        }
        dev.seed(21);
        let model = cfg.init(&dev);
        let prompt = [1u32, 2, 3, 4, 5];
        // 45 tokens through a context of 16: the window moves several times
        for (temperature, seed) in [(0.0, 0), (1.0, 7)] {
            let cached = generate(&model, &prompt, &sample_cfg(temperature, seed, false), &dev, |_| {});
            let fresh = generate(&model, &prompt, &sample_cfg(temperature, seed, true), &dev, |_| {});
            assert_eq!(cached, fresh, "{name}: cached and uncached generation differ (temperature {temperature})");
            assert_eq!(cached.len(), 40);
        }
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    let _guard = seeded();
    let dev = Device::flex();
    dev.seed(3);
    let model = zoo::tiny().init(&dev);
    let a = generate(&model, &[1], &sample_cfg(1.0, 5, false), &dev, |_| {});
    let b = generate(&model, &[1], &sample_cfg(1.0, 5, false), &dev, |_| {});
    let c = generate(&model, &[1], &sample_cfg(1.0, 6, false), &dev, |_| {});
    assert_eq!(a, b);
    assert_ne!(a, c, "another seed should give another sample");
}

fn trained_run(dir: &Path) -> PathBuf {
    let text: String = (0..400).map(|i| ["the cat ", "sat on ", "a mat\n"][i % 3]).collect();
    std::fs::write(dir.join("text.txt"), text).unwrap();
    let cfg = format!(
        "[model]\nd_model = 32\nn_layers = 1\nseq_len = 16\n[model.attention]\nkind = \"full\"\nn_heads = 2\n[data]\npath = \"{}\"\n[train]\nsteps = 10\nbatch_size = 4\neval_batches = 1\nsample_tokens = 5\n",
        dir.join("text.txt").display()
    );
    let run = dir.join("run");
    let opts = TrainOptions::new(&run, Device::flex(), "flex");
    train(ExperimentConfig::parse(&cfg, false).unwrap(), &opts).unwrap();
    run
}

#[test]
fn score_total_equals_eval_loss_times_tokens() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let run = Run::load(&trained_run(tmp.path()), &Device::flex()).unwrap();
    let ids = run.encode_prompt(&"the cat sat on a mat\n".repeat(10)).unwrap();
    let ids = &ids[..3 * 16 + 1]; // three whole windows
    let scores = run.score(ids).unwrap();
    assert_eq!(scores.tokens.len(), 48);
    let batches = variorum_data::eval_batches(ids, 16, 2, None, None).unwrap();
    let mean = evaluate(&run.model, &batches, &run.device);
    let total = -scores.total_logprob;
    assert!((total - mean * 48.0).abs() < 1e-3 * total, "score total {total} vs eval {}", mean * 48.0);
    assert!(scores.tokens.iter().all(|t| t.logprob <= 0.0));
    // disjoint sliding windows are the same windows
    let (sliding, n) = variorum_train::eval::sliding_loss(&run.model, ids, None, 16, 16, &run.device, None);
    assert_eq!(n, 48);
    assert!((sliding * 48.0 - total).abs() < 1e-3 * total);
}

#[test]
fn bad_inputs_are_clear_errors() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let dev = Device::flex();
    let e = Run::load(&tmp.path().join("missing"), &dev).err().unwrap().to_string();
    assert!(e.contains("does not exist"), "{e}");
    let e = Run::load(tmp.path(), &dev).err().unwrap().to_string();
    assert!(e.contains("not a run directory"), "{e}");

    let dir = trained_run(tmp.path());
    let run = Run::load(&dir, &dev).unwrap();
    let e = run.encode_prompt("").err().unwrap().to_string();
    assert!(e.contains("empty"), "{e}");
    let e = format!("{:#}", run.encode_prompt("cat ☃").err().unwrap());
    assert!(e.contains('☃'), "{e}");

    std::fs::write(dir.join("model.bpk"), b"garbage").unwrap();
    let e = format!("{:#}", Run::load(&dir, &dev).err().unwrap());
    assert!(e.contains("cannot be loaded") && e.contains("model.bpk"), "{e}");
}
