//! Graph data end to end (`data.graph`, configs/graph/): the edges reach the attention, a row
//! reads nothing of the other rows or of its padding, the structure is learned where the text
//! alone cannot give it, and kinds that cannot read a graph are refused by name with the config.

use std::path::{Path, PathBuf};

use crate::common;

use burn::prelude::*;
use common::seeded;
use variorum_data::{Corpus, graph_eval_batches};
use variorum_train::step::{batch_rows, batch_tensors};
use variorum_train::{ExperimentConfig, Outcome, TrainOptions, train};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// A shipped graph config, smaller and shorter, reading the example file wherever the tests run.
fn config(file: &str, settings: &[&str]) -> ExperimentConfig {
    try_config(file, settings).unwrap()
}

/// [`config`], or why the settings are refused.
fn try_config(file: &str, settings: &[&str]) -> Result<ExperimentConfig, variorum_core::ConfigError> {
    let cfg = ExperimentConfig::load(&repo("configs/graph").join(file)).unwrap();
    let mut all: Vec<String> = ["model.d_model=32", "model.n_layers=2", "train.batch_size=16", "train.eval_batches=4"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    all.push(format!("data.path={}", repo("configs/graph/min-trees.jsonl").display()));
    all.extend(settings.iter().map(|s| s.to_string()));
    cfg.with_settings(&all)
}

fn final_val_loss(cfg: ExperimentConfig, steps: u64, dir: &Path) -> f64 {
    let mut opts = TrainOptions::new(dir, Device::flex(), "flex");
    opts.max_steps = Some(steps);
    match train(cfg, &opts).unwrap() {
        Outcome::Finished(s) => s.final_val_loss.unwrap(),
        Outcome::Interrupted { .. } => panic!("not interrupted"),
    }
}

/// The example's digits are fixed by the tree (an inner node is the smallest of its children),
/// which the shuffled node order hides: the same model that reads the edges learns what the
/// one reading every node of the example cannot.
#[test]
fn the_edges_teach_what_the_nodes_alone_cannot() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let steps = ["train.steps=300", "train.eval_interval=300", "train.checkpoint_interval=300"];
    let with_edges = final_val_loss(config("base.toml", &steps), 300, &tmp.path().join("edges"));
    let without = final_val_loss(config("full-no-edges.toml", &steps), 300, &tmp.path().join("none"));
    assert!(with_edges < without - 0.1, "with the edges {with_edges:.4}, without {without:.4}");
}

/// A row's predictions depend on its own example alone: scored in a batch beside other examples
/// (other lengths, other graphs, padded to seq_len) or alone without any padding, a row's logits
/// agree over its positions.
#[test]
fn rows_read_their_own_example_only() {
    let _guard = seeded();
    let cases = [
        ("base.toml", false),
        ("additive.toml", false),
        ("full.toml", false),
        ("base.toml", true),
        ("full.toml", true),
    ];
    for (file, causal) in cases {
        let cfg = config(file, if causal { &["model.objective.kind=causal"] } else { &[] });
        let corpus = Corpus::load(&cfg.data, None).unwrap();
        let mut model_cfg = cfg.model.clone();
        model_cfg.resolve(corpus.tokenizer.vocab_size()).unwrap();
        let device = Device::flex();
        let model = model_cfg.init(&device);
        let val = &corpus.graphs.as_ref().unwrap().val;
        let path = &corpus.path;
        let batch = graph_eval_batches(val, path, model_cfg.seq_len, 4, 4).unwrap().remove(0);
        let n = val[2].tokens.len();
        assert!(n < model_cfg.seq_len, "the example fills its row: no padding to read");
        let alone = graph_eval_batches(&val[2..3], path, n, 1, 1).unwrap().remove(0);
        let logits = |b: &variorum_data::TokenBatch| {
            let (x, _) = batch_tensors(b, &device);
            model.forward_tagged(x, batch_rows(b, &device), None).logits
        };
        let together = logits(&batch).narrow(0, 2, 1).narrow(1, 0, n);
        let single = logits(&alone).narrow(1, 0, n);
        let d = (together - single).abs().max().into_scalar::<f32>();
        assert!(d < 1e-4, "{file} (causal {causal}): row 2 moved by {d} beside other examples");
    }
}

/// Kinds that would ignore the graph, and model features that split an example, are refused
/// before training, by name.
#[test]
fn what_cannot_read_a_graph_is_refused() {
    // (a memory needs ordered batching, refused above)
    let cases: [(&str, &[&str], &str); 3] = [
        ("full-no-edges.toml", &["model.attention.kind=talking-heads"], "kind = \"talking-heads\" does not read one"),
        ("base.toml", &["train.batching=ordered"], "train.batching = \"ordered\""),
        ("base.toml", &["model.feed_forward.kind=separable-conv"], "a feed-forward that reads earlier positions"),
    ];
    for (file, settings, want) in cases {
        // refused with the config, before any data is read
        let setting = settings.join(" ");
        let err = try_config(file, settings).err().unwrap_or_else(|| panic!("{setting} accepted")).to_string();
        assert!(err.contains(want), "{setting}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
}
