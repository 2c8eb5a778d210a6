//! SPALM end to end (`variorum_train::retrieval::spalm`, `variorum_model::long_term_memory`): neighbour
//! tables searched with a trained run's datastore — the training split leaving out each
//! position's own entry (or a band around it), the validation split searching it whole — and a
//! Transformer-XL model with
//! a long-term memory trained on them, scored with and without retrieval, and generating with
//! neighbours searched as the text grows, the same ones the validation table holds.

use std::path::{Path, PathBuf};

use crate::common;

use burn::prelude::*;
use common::{corpus, seeded, tiny_config};
use variorum_retrieval::neighbours::NONE;
use variorum_retrieval::search::HnswParams;
use variorum_retrieval::{Datastore, NeighbourTable, SearchMode};
use variorum_train::eval::stream_loss;
use variorum_train::generate::{Retrieval, SampleConfig, generate_with};
use variorum_train::retrieval::knn_lm::{self, BuildSettings};
use variorum_train::retrieval::spalm::{self, OnlineNeighbours, Retrieved, SearchSettings};
use variorum_train::run::Run;
use variorum_train::{ExperimentConfig, Outcome, TrainOptions, train};

fn train_run(cfg: ExperimentConfig, run: &Path) {
    let mut opts = TrainOptions::new(run, Device::flex(), "flex");
    opts.max_steps = Some(cfg.train.steps);
    assert!(matches!(train(cfg, &opts).unwrap(), Outcome::Finished(_)));
}

/// A trained run, its datastore over the training split, and both neighbour tables (k = 4).
fn datastore(dir: &Path) -> (Run, PathBuf) {
    let cfg = tiny_config(&corpus(dir), 0.0).with_settings(&["train.steps=40".to_string()]).unwrap();
    train_run(cfg, &dir.join("encoder"));
    let run = Run::load(&dir.join("encoder"), &Device::flex()).unwrap();
    let corpus = variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone())).unwrap();
    let store_dir = dir.join("store");
    let settings = BuildSettings { window: 16, stride: 16, index: HnswParams::default() };
    knn_lm::build_datastore(&run, &corpus.train, "train split", &store_dir, &settings, |_, _, _| {}, &|| false)
        .unwrap();
    let store = Datastore::open(&store_dir).unwrap();
    let search = SearchSettings { k: 4, exclude_radius: 64, ef: 64, chunk: 1000 };
    for (split, ids) in [("train", &corpus.train), ("val", &corpus.val)] {
        let out = spalm::table_dir(&store_dir, split);
        assert!(spalm::search_table(&store, &run, ids, split, &out, search, |_, _| {}, &|| false).unwrap());
    }
    (run, store_dir)
}

/// Searching the datastore's own text, a radius as long as the text leaves nothing to retrieve;
/// the validation split, another text, retrieves k everywhere; and a stopped search resumes.
#[test]
fn the_training_table_leaves_out_each_positions_own_entries() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let (run, store_dir) = datastore(tmp.path());
    let store = Datastore::open(&store_dir).unwrap();
    let corpus = variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone())).unwrap();
    let vocab = run.model.vocab_size;
    let val = NeighbourTable::open(&spalm::table_dir(&store_dir, "val"), vocab).unwrap();
    assert_eq!(val.positions(), corpus.val.len() - 1);
    assert_eq!(val.meta.origin.exclude_radius, None);
    assert!(val.rows(0, val.positions()).iter().all(|&v| v != NONE));
    let train = NeighbourTable::open(&spalm::table_dir(&store_dir, "train"), vocab).unwrap();
    assert_eq!(train.meta.origin.exclude_radius, Some(64));
    // row p is what position p's own key retrieves outside p ± r: with r = 0 its own entry
    // alone is left out, with r = 64 the band
    let dim = store.dim();
    let own_dir = tmp.path().join("own");
    let settings = SearchSettings { k: 4, exclude_radius: 0, ef: 64, chunk: 4096 };
    assert!(
        spalm::search_table(&store, &run, &corpus.train, "train", &own_dir, settings, |_, _| {}, &|| false).unwrap()
    );
    let own = NeighbourTable::open(&own_dir, vocab).unwrap();
    for (table, r) in [(&own, 0u64), (&train, 64)] {
        for p in (0..table.positions()).step_by(97) {
            let band = (p as u64).saturating_sub(r)..p as u64 + r + 1;
            let q = &store.keys()[p * dim..(p + 1) * dim];
            let found = store.search_excluding(q, 4, SearchMode::Approximate { ef: 64 }, &[band]).unwrap();
            let values: Vec<u32> = found[0].iter().map(|n| store.values()[n.id as usize]).collect();
            assert_eq!(table.rows(p, 1), &values[..], "row {p}, radius {r}");
            assert!(found[0].iter().all(|n| n.id.abs_diff(p as u64) > r), "row {p}, radius {r}");
        }
    }
    // a search stopped after its first chunk resumes to the same table, on both paths (the
    // datastore's own text and another, whose keys the encoder computes)
    for (split, ids, radius) in [("train", &corpus.train, 64), ("val", &corpus.val, 0)] {
        let out = tmp.path().join(format!("stopped-{split}"));
        let settings = SearchSettings { k: 4, exclude_radius: radius, ef: 64, chunk: 1000 };
        let asked = std::cell::Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            asked.get() > 1
        };
        assert!(!spalm::search_table(&store, &run, ids, split, &out, settings, |_, _| {}, &stop).unwrap());
        let part = std::fs::metadata(out.join("neighbours.u32")).unwrap().len();
        assert!(part > 0 && part < (ids.len() as u64 - 1) * 16, "{split}: {part} bytes after one chunk");
        assert!(spalm::search_table(&store, &run, ids, split, &out, settings, |_, _| {}, &|| false).unwrap());
        let whole = spalm::table_dir(&store_dir, split);
        let read = |d: &Path| std::fs::read(d.join("neighbours.u32")).unwrap();
        assert_eq!(read(&out), read(&whole), "{split}: resumed ≠ searched at once");
    }
    // a radius that leaves out most of the text is refused; a text that begins like the
    // datastore's (its own continuations inside) is refused
    let wide = SearchSettings { k: 2, exclude_radius: corpus.train.len() as u64 / 4, ef: 16, chunk: 1000 };
    let e =
        spalm::search_table(&store, &run, &corpus.train, "train", &tmp.path().join("w"), wide, |_, _| {}, &|| false)
            .unwrap_err()
            .to_string();
    assert!(e.contains("leaves out more than half"), "{e}");
    let prefix = &corpus.train[..corpus.train.len() / 2];
    let e = spalm::search_table(&store, &run, prefix, "half", &tmp.path().join("p"), wide, |_, _| {}, &|| false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("begin alike: a position would retrieve its own continuation"), "{e}");
}

/// A Transformer-XL model with a long-term memory trains on the tables; its loss with retrieval
/// differs from the same segments without; generation's neighbours, searched as the text grows, are the validation table's.
#[test]
fn a_long_term_memory_trains_scores_and_generates_with_its_neighbours() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let (_, store_dir) = datastore(tmp.path());
    let text = std::fs::read_to_string(tmp.path().join("corpus.txt")).unwrap();
    // the tiny model of `common` with a Transformer-XL memory and a long-term memory reading 3
    let toml = format!(
        r#"
[model]
d_model = 32
n_layers = 2
seq_len = 16
[model.attention]
kind = "full"
n_heads = 4
[model.position]
kind = "transformer-xl"
[model.memory]
kind = "xl"
length = 16
[model.long_term_memory]
k = 3
[data]
path = "{}"
neighbours = "{}"
[train]
batching = "ordered"
steps = 30
batch_size = 4
warmup_steps = 4
lr = 3e-3
eval_interval = 10
eval_batches = 2
log_interval = 5
checkpoint_interval = 10
sample_tokens = 20
"#,
        tmp.path().join("corpus.txt").display(),
        store_dir.display()
    );
    let cfg = ExperimentConfig::parse(&toml, false).unwrap();
    train_run(cfg, &tmp.path().join("spalm"));
    let run = Run::load(&tmp.path().join("spalm"), &Device::flex()).unwrap();
    assert!(run.model.long_term_memory.is_some() && run.model.has_memory());
    let corpus = variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone())).unwrap();
    let (_, val) = spalm::open_tables(&store_dir, &corpus, run.model.vocab_size, 3).unwrap();
    let dev = Device::flex();
    let (with, n) = stream_loss(&run.model, &corpus.val, 16, 4, true, Some(&val), &dev, None);
    let (without, m) = stream_loss(&run.model, &corpus.val, 16, 4, true, None, &dev, None);
    assert!(n > 0 && n == m && with.is_finite() && without.is_finite());
    assert!((with - without).abs() > 1e-4, "retrieval changed nothing: {with} vs {without}");
    // the gate's weights start at 0 and only positions with neighbours train them: training read
    // the table
    let gate = run.model.long_term_memory.as_ref().unwrap().gate.weight.val().abs().sum().into_scalar::<f32>();
    assert!(gate > 0.0, "the gate never trained");
    // a resumed run must read the tables it started with
    let recorded = tmp.path().join("spalm").join(spalm::RUN_TABLES_FILE);
    let saved = std::fs::read_to_string(&recorded).unwrap();
    assert!(saved.contains("\"exclude_radius\": 64"), "{saved}");
    std::fs::write(&recorded, saved.replace("\"exclude_radius\": 64", "\"exclude_radius\": 0")).unwrap();
    let mut opts = TrainOptions::new(tmp.path().join("spalm"), Device::flex(), "flex");
    (opts.resume, opts.max_steps) = (true, Some(40));
    let e = train(run.config.clone(), &opts).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("are not the ones the run started with"), "{e}");
    // generation searches each position's neighbours as the text grows: those of the
    // validation split's first segments are the table's
    let online = OnlineNeighbours::open(&run.config, run.model.vocab_size, &dev, 64).unwrap();
    let positions = 40.min(corpus.val.len() - 1);
    let got = online
        .tensor(&corpus.val, 0..positions, &dev)
        .unwrap()
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .unwrap();
    let want = Retrieved { table: NeighbourTable::open(&val.table.dir, run.model.vocab_size).unwrap(), k: 3 }
        .ids(&[0], positions);
    let same = got.iter().zip(&want).filter(|(a, b)| a == b).count();
    // the same queries up to the order of float sums in a batched forward: near-ties may swap
    assert!(same * 10 >= want.len() * 9, "{same} of {} neighbours agree", want.len());
    let retrieval = Retrieval { knn: None, neighbours: Some(&online) };
    let prompt = run.tokenizer.encode(&text[..20]).unwrap();
    // sampled: this tiny model's greedy choice is one character over and over
    let cfg = SampleConfig { temperature: 1.0, seed: 5, ..SampleConfig::greedy(24) };
    let out = generate_with(&run.model, &prompt, &cfg, retrieval, &dev, |_| {}).unwrap();
    let alone = generate_with(&run.model, &prompt, &cfg, Retrieval::default(), &dev, |_| {}).unwrap();
    assert_eq!(out.len(), 24);
    assert_ne!(out, alone, "generation read no neighbours");
    // the trainer's closing sample retrieved too (it ran to the end)
    assert!(std::fs::read_to_string(tmp.path().join("spalm/sample.txt")).unwrap().len() > 20);
}
