//! SAC's edge predictor learns by REINFORCE from the task's loss: on text where the next
//! character is the one three back, a one-edge layer whose predictor is trained reaches a far
//! lower loss than the same layer with its predictor left at its initialisation.

use std::path::Path;

use crate::common;

use burn::prelude::*;
use common::seeded;
use variorum_train::{ExperimentConfig, Outcome, TrainOptions, train};

/// Lines of a random triple of letters repeated: after the first three characters of a line, the
/// next character is the one three back.
fn triples(dir: &Path) -> std::path::PathBuf {
    let mut s: u64 = 12345;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    let letters: Vec<char> = "abcdefghijklmnopqrst".chars().collect();
    let mut text = String::new();
    for _ in 0..1500 {
        let t: Vec<char> = (0..3).map(|_| letters[next() % letters.len()]).collect();
        for _ in 0..5 {
            text.extend(&t);
        }
        text.push('\n');
    }
    let path = dir.join("triples.txt");
    std::fs::write(&path, text).unwrap();
    path
}

fn val_loss(corpus: &Path, policy_weight: f64, run: &Path) -> f64 {
    let text = format!(
        r#"
[model]
d_model = 32
n_layers = 1
seq_len = 16
[model.position]
kind = "learned"
[model.attention]
kind = "sac"
n_heads = 2
edges = 1
policy_weight = {policy_weight}
[data]
path = "{}"
[train]
steps = 400
batch_size = 16
warmup_steps = 20
lr = 5e-3
eval_interval = 400
eval_batches = 8
checkpoint_interval = 400
sample_tokens = 4
"#,
        corpus.display()
    );
    let cfg = ExperimentConfig::parse(&text, false).unwrap();
    match train(cfg, &TrainOptions::new(run, Device::flex(), "flex")).unwrap() {
        Outcome::Finished(s) => s.final_val_loss.unwrap(),
        Outcome::Interrupted { .. } => panic!("not interrupted"),
    }
}

#[test]
fn the_predictor_learns_its_edges_from_the_loss() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let corpus = triples(tmp.path());
    let learned = val_loss(&corpus, 1.0, &tmp.path().join("learned"));
    let frozen = val_loss(&corpus, 0.0, &tmp.path().join("frozen"));
    eprintln!("trained predictor {learned:.4}, predictor left at its initialisation {frozen:.4}");
    assert!(learned < frozen - 0.2, "trained predictor {learned:.4}, untrained {frozen:.4}");
}

/// One row has no other rows to be its baseline: refused before training, by name.
#[test]
fn one_row_batches_are_refused() {
    let cfg = ExperimentConfig::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/attention/sac.toml"))
        .unwrap();
    let err = cfg.with_settings(&["train.batch_size=1".to_string()]).err().expect("batch_size 1 refused").to_string();
    assert!(err.contains("train.batch_size = 1") && err.contains("sac"), "{err}");
    let frozen = ["train.batch_size=1".to_string(), "model.attention.policy_weight=0.0".to_string()];
    assert!(cfg.with_settings(&frozen).is_ok(), "a frozen predictor needs no baseline");
}
