//! End-to-end training: every shipped config trains a step; resume replays the uninterrupted
//! run exactly; a diverging run stops with its last good checkpoint intact; user mistakes are
//! clear errors.

use std::path::{Path, PathBuf};

use crate::common;

use burn::prelude::*;
use common::{corpus, seeded, tiny_config};
use variorum_train::{ExperimentConfig, Outcome, TrainOptions, metrics, train};

fn options(run: &Path) -> TrainOptions {
    TrainOptions::new(run, Device::flex(), "flex")
}

#[test]
fn every_shipped_config_parses_builds_and_trains_a_step() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let text = corpus(tmp.path());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let mut n = 0;
    let datastore = std::sync::OnceLock::new();
    let trajectories = std::sync::OnceLock::new();
    // configs/ and its subdirectories (families of variants such as configs/positions/)
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    let subdirs: Vec<_> = files.iter().filter(|p| p.is_dir()).cloned().collect();
    for d in subdirs {
        files.extend(std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()));
    }
    for path in files {
        if !matches!(path.extension().and_then(|e| e.to_str()), Some("toml" | "json")) {
            continue;
        }
        let mut cfg = ExperimentConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
        cfg.data.dataset = None;
        // a prepared corpus's config (its sources fetched by a recipe): the test corpus instead
        cfg.data.sources.clear();
        cfg.data.prepared = None;
        if cfg.train.batching == variorum_train::config::Batching::Documents && cfg.data.tags.is_none() {
            // its documents were the prepared corpus's: the test text read as ordered streams
            cfg.train.batching = variorum_train::config::Batching::Ordered;
        }
        // graph data and paired text are examples, not text: their example files themselves
        let shipped = |file: &str| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs").join(file);
        if cfg.data.trajectories.is_some() {
            // a Decision Transformer's episodes: a few recorded here
            cfg.data.trajectories = Some(trajectories.get_or_init(|| tiny_trajectories(tmp.path())).clone());
        } else {
            cfg.data.path = Some(match (&cfg.data.graph, &cfg.data.pairs) {
                (Some(_), _) => shipped("graph/min-trees.jsonl"),
                (None, Some(_)) => shipped("seq2seq/reverse.tsv"),
                (None, None) => text.clone(),
            });
        }
        cfg.train.eval_batches = 1;
        cfg.train.sample_tokens = 4;
        cfg.train.batch_size = cfg.train.batch_size.min(4);
        // tagged configs: two tags this corpus has, instead of the titles of Shakespeare's works
        if let Some(tags) = &mut cfg.data.tags {
            tags.section = "(whether|in the mind)".into();
        }
        // retrieving configs: a datastore and neighbour tables over this corpus
        if cfg.data.neighbours.is_some() {
            cfg.data.neighbours = Some(datastore.get_or_init(|| tiny_datastore(tmp.path())).clone());
        }
        let run = tmp.path().join(path.strip_prefix(&dir).unwrap()).with_extension("");
        let mut opts = options(&run);
        opts.max_steps = Some(1);
        match train(cfg, &opts).unwrap_or_else(|e| panic!("{}: {e:#}", path.display())) {
            Outcome::Finished(s) => assert!(s.final_val_loss.unwrap().is_finite(), "{}", path.display()),
            Outcome::Interrupted { .. } => panic!("not interrupted"),
        }
        n += 1;
    }
    assert!(n >= 20, "found only {n} configs in {}", dir.display());
}

/// Twenty key-to-door episodes of mixed behaviour, for the Decision Transformer's configs.
fn tiny_trajectories(dir: &Path) -> PathBuf {
    use variorum_data::decision::{GenerateConfig, generate};
    let set = generate(&GenerateConfig { env: Default::default(), episodes: 20, epsilons: vec![0.0, 1.0], seed: 0 });
    let path = dir.join("trajectories.jsonl");
    set.save(&path).unwrap();
    path
}

/// A datastore over the training split of `dir`'s corpus, keyed by the tiny model trained 5
/// steps, with both neighbour tables: what a SPALM config reads.
fn tiny_datastore(dir: &Path) -> PathBuf {
    let cfg = tiny_config(&corpus(dir), 0.0);
    let encoder = dir.join("encoder");
    let mut opts = options(&encoder);
    opts.max_steps = Some(5);
    train(cfg, &opts).unwrap();
    let run = variorum_train::run::Run::load(&encoder, &Device::flex()).unwrap();
    let corpus = variorum_data::Corpus::load(&run.config.data, Some(run.tokenizer.clone())).unwrap();
    let store = dir.join("datastore");
    let settings =
        variorum_train::retrieval::knn_lm::BuildSettings { window: 16, stride: 16, index: Default::default() };
    variorum_train::retrieval::knn_lm::build_datastore(
        &run,
        &corpus.train,
        "train",
        &store,
        &settings,
        |_, _, _| {},
        &|| false,
    )
    .unwrap();
    let ds = variorum_retrieval::Datastore::open(&store).unwrap();
    let search = variorum_train::retrieval::spalm::SearchSettings { k: 8, exclude_radius: 64, ef: 32, chunk: 16_384 };
    for (split, ids) in [("train", &corpus.train), ("val", &corpus.val)] {
        let out = variorum_train::retrieval::spalm::table_dir(&store, split);
        variorum_train::retrieval::spalm::search_table(&ds, &run, ids, split, &out, search, |_, _| {}, &|| false)
            .unwrap();
    }
    store
}

#[test]
fn a_run_writes_its_artefacts_and_learns() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_config(&corpus(tmp.path()), 0.0);
    let run = tmp.path().join("run");
    let Outcome::Finished(s) = train(cfg, &options(&run)).unwrap() else { panic!("interrupted") };
    for f in [
        "config.toml",
        "tokenizer.json",
        "metrics.csv",
        "model.bpk",
        "sample.txt",
        "summary.json",
        "checkpoints/latest",
    ] {
        assert!(run.join(f).exists(), "{f} missing");
    }
    let rows = metrics::read(&run.join("metrics.csv")).unwrap();
    assert_eq!(rows.iter().map(|r| r.step).collect::<Vec<_>>(), vec![5, 10, 15, 20]);
    let first = rows[0].train_loss.unwrap();
    let last = rows[3].train_loss.unwrap();
    assert!(last < first - 0.3, "loss fell only from {first} to {last}");
    assert!(s.final_val_loss.unwrap() < first);
    // the expanded config parses back, with the vocabulary filled in
    let saved = ExperimentConfig::load(&run.join("config.toml")).unwrap();
    assert!(saved.model.vocab_size.is_some());
    let sample = std::fs::read_to_string(run.join("sample.txt")).unwrap();
    assert!(sample.chars().count() >= 20);
}

#[test]
fn a_masked_language_model_learns_to_fill_in_and_does_not_generate() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny_config(&corpus(tmp.path()), 0.0);
    cfg.model.objective = toml::from_str("kind = \"masked\"\nmask_prob = 0.3").unwrap();
    // ALiBi's distance penalty points attention at the neighbours from the start, which is what a
    // hidden token is guessed from (learned positions first sit on the unigram plateau)
    cfg.model.position = toml::from_str("kind = \"alibi\"").unwrap();
    cfg.train.steps = 150;
    cfg.train.batch_size = 16;
    cfg.train.lr = 1e-2;
    cfg.train.eval_interval = 25;
    cfg.train.log_interval = 25;
    let run = tmp.path().join("masked");
    let Outcome::Finished(s) = train(cfg, &options(&run)).unwrap() else { panic!("interrupted") };
    let rows = metrics::read(&run.join("metrics.csv")).unwrap();
    let (first, last) = (rows[0].val_loss.unwrap(), s.final_val_loss.unwrap());
    assert!(last < first - 0.25, "masked validation loss fell only from {first} to {last}");
    // the embedding has one row more than the text vocabulary: the mask token
    let saved = ExperimentConfig::load(&run.join("config.toml")).unwrap();
    let loaded = variorum_train::run::Run::load(&run, &Device::flex()).unwrap();
    assert_eq!(loaded.model.vocab_size, saved.model.vocab_size.unwrap() + 1);
    assert_eq!(loaded.model.mask_token, saved.model.vocab_size);
    let sample = std::fs::read_to_string(run.join("sample.txt")).unwrap();
    assert!(sample.contains("\nfilled:") && sample.contains('_'), "{sample}");
    let err = loaded.score(&[1, 2, 3]).unwrap_err().to_string();
    assert!(err.contains("masked language model"), "{err}");
}

#[test]
fn resume_replays_the_uninterrupted_run_exactly() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let text = corpus(tmp.path());
    let plain = tiny_config(&text, 0.1); // dropout on: its masks must replay too
    // a Performer redrawing its random features every 3 steps: the draws must replay too
    let mut performer = plain.clone();
    performer.model.attention =
        toml::from_str("kind = \"performer\"\nn_heads = 4\nfeatures = 8\nredraw_interval = 3").unwrap();

    // reversible blocks (replayed branch dropout) with routing attention (EMA centroids, saved
    // with the model) and Sinkhorn (Gumbel noise) in a plain stack
    let mut reversible = plain.clone();
    reversible.model.block = toml::from_str("kind = \"reversible\"").unwrap();
    reversible.model.attention =
        toml::from_str("kind = \"routing\"\nn_heads = 4\nclusters = 2\nwindow = 4\ndecay = 0.5").unwrap();
    let mut sinkhorn = plain.clone();
    sinkhorn.model.attention = toml::from_str("kind = \"sinkhorn\"\nn_heads = 4\nblock = 4").unwrap();

    // a masked LM: the hidden tokens of every step are drawn from (seed, step) and replay too
    let mut masked = plain.clone();
    masked.model.objective = toml::from_str("kind = \"masked\"").unwrap();

    for (name, cfg) in [
        ("full", plain),
        ("performer", performer),
        ("reversible routing", reversible),
        ("sinkhorn", sinkhorn),
        ("masked", masked),
    ] {
        let straight = tmp.path().join(format!("{name}-straight"));
        train(cfg.clone(), &options(&straight)).unwrap();

        let split = tmp.path().join(format!("{name}-split"));
        let mut opts = options(&split);
        opts.stop_at = Some(8); // mid-interval: the partial loss average must survive too
        match train(cfg.clone(), &opts).unwrap() {
            Outcome::Interrupted { step, .. } => assert_eq!(step, 8),
            Outcome::Finished(_) => panic!("should have stopped at step 8"),
        }
        let mut opts = options(&split);
        opts.resume = true;
        assert!(matches!(train(cfg, &opts).unwrap(), Outcome::Finished(_)));

        let a = metrics::read(&straight.join("metrics.csv")).unwrap();
        let b = metrics::read(&split.join("metrics.csv")).unwrap();
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.step, x.val_loss), (y.step, y.val_loss), "{name}: curves differ");
            // an interval's mean training loss is summed partly before the interruption and
            // partly after, so its last bit may round differently
            let (p, q) = (x.train_loss.unwrap_or(0.0), y.train_loss.unwrap_or(0.0));
            assert!((p - q).abs() <= 1e-6 * p.abs(), "{name}: step {} training loss {p} vs {q}", x.step);
        }
        // the weights and the sample, byte for byte
        for file in ["model.bpk", "sample.txt"] {
            let (x, y) = (std::fs::read(straight.join(file)).unwrap(), std::fs::read(split.join(file)).unwrap());
            assert!(x == y, "{name}: the resumed run's {file} differs from the uninterrupted one's");
        }
    }
}

#[test]
fn a_memory_model_resumes_exactly_with_its_memory() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let text = corpus(tmp.path());
    use variorum_block::{CompressionKind, CompressiveMemoryConfig, MemoryConfig, XlMemoryConfig};
    let compressive = |compression, rate| {
        MemoryConfig::Compressive(CompressiveMemoryConfig {
            length: 16,
            compressed_length: 8,
            rate,
            compression,
            ..Default::default()
        })
    };
    let memories = [
        MemoryConfig::Xl(XlMemoryConfig { length: 16 }),
        compressive(CompressionKind::MostUsed, 2),
        compressive(CompressionKind::Conv, 4),
    ];
    for (i, memory) in memories.iter().enumerate() {
        let mut cfg = tiny_config(&text, 0.0);
        cfg.train.batching = variorum_train::config::Batching::Ordered;
        cfg.model.memory = memory.clone();
        cfg.model.position = variorum_position::PositionConfig::TransformerXl(Default::default());
        cfg.validate().unwrap_or_else(|e| panic!("{e}"));

        let straight = tmp.path().join(format!("straight{i}"));
        train(cfg.clone(), &options(&straight)).unwrap();
        let split = tmp.path().join(format!("split{i}"));
        let mut opts = options(&split);
        opts.stop_at = Some(10);
        assert!(matches!(train(cfg.clone(), &opts).unwrap(), Outcome::Interrupted { .. }));
        assert!(split.join("checkpoints/step-00000010/memory.bpk").exists(), "the memory is checkpointed");
        let mut opts = options(&split);
        opts.resume = true;
        assert!(matches!(train(cfg, &opts).unwrap(), Outcome::Finished(_)));
        let a = metrics::read(&straight.join("metrics.csv")).unwrap();
        let b = metrics::read(&split.join("metrics.csv")).unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (x.step, x.train_loss, x.val_loss),
                (y.step, y.train_loss, y.val_loss),
                "{memory:?}: curves differ"
            );
            assert_eq!(x.aux, y.aux, "{memory:?}: auxiliary losses differ");
        }
    }
}

#[test]
fn starting_over_an_existing_run_or_resuming_nothing_is_refused() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_config(&corpus(tmp.path()), 0.0);
    let run = tmp.path().join("run");
    let mut opts = options(&run);
    opts.resume = true;
    let e = format!("{:#}", train(cfg.clone(), &opts).err().unwrap());
    assert!(e.contains("nothing to resume"), "{e}");
    let mut opts = options(&run);
    opts.max_steps = Some(5);
    train(cfg.clone(), &opts).unwrap();
    let e = format!("{:#}", train(cfg, &opts).err().unwrap());
    assert!(e.contains("already holds a run") && e.contains("--resume"), "{e}");
}

#[test]
fn a_diverging_run_stops_and_keeps_its_last_good_checkpoint() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny_config(&corpus(tmp.path()), 0.0);
    cfg.train.lr = 1e30;
    cfg.train.min_lr = 1e30;
    cfg.train.warmup_steps = 0;
    cfg.train.grad_clip = 0.0;
    cfg.train.log_interval = 1;
    cfg.train.checkpoint_interval = 1;
    let run = tmp.path().join("run");
    let e = format!("{:#}", train(cfg, &options(&run)).err().expect("a diverging run must fail"));
    assert!(e.contains("training loss became"), "{e}");
    assert!(e.contains("last good checkpoint"), "{e}");
    let (_, st) = variorum_train::checkpoint::latest(&run).unwrap().unwrap();
    assert!(st.step >= 1);
}

/// A tiny run trained to `stop_at` and stopped there (checkpoints every 5 steps): the temporary
/// directory holding it, its config and its run directory.
fn stopped_run(stop_at: u64) -> (tempfile::TempDir, ExperimentConfig, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_config(&corpus(tmp.path()), 0.0);
    let run = tmp.path().join("run");
    let mut opts = options(&run);
    opts.stop_at = Some(stop_at);
    train(cfg.clone(), &opts).unwrap();
    (tmp, cfg, run)
}

#[test]
fn a_corrupt_checkpoint_is_a_clear_error() {
    let _guard = seeded();
    let (_tmp, cfg, run) = stopped_run(5);
    let (dir, _) = variorum_train::checkpoint::latest(&run).unwrap().unwrap();
    std::fs::write(dir.join("model.bpk"), b"this is not a burnpack file").unwrap();
    let mut opts = options(&run);
    opts.resume = true;
    let e = format!("{:#}", train(cfg, &opts).err().unwrap());
    assert!(e.contains("cannot be loaded") && e.contains("model.bpk"), "{e}");
}

/// A damaged newest checkpoint (weights, state, or the `latest` pointer) does not stop
/// `--resume`: it continues from the newest checkpoint that loads completely and says so.
#[test]
fn resume_falls_back_to_the_newest_checkpoint_that_loads() {
    let _guard = seeded();
    let (_tmp, cfg, run) = stopped_run(15);
    let all = variorum_train::checkpoint::all(&run).unwrap();
    let steps: Vec<u64> = all.iter().map(|(_, s)| s.as_ref().unwrap().step).collect();
    assert_eq!(steps, vec![15, 10], "newest first, two kept");
    // the newest: garbage weights; the pointer to it gone
    std::fs::write(all[0].0.join("model.bpk"), b"this is not a burnpack file").unwrap();
    std::fs::remove_file(variorum_train::checkpoint::checkpoints_dir(&run).join("latest")).unwrap();
    // loading the unfinished run for generation or evaluation skips it too
    let loaded = variorum_train::run::Run::load(&run, &Device::flex()).unwrap();
    assert!(loaded.weights.ends_with("step-00000010/model.bpk"), "{}", loaded.weights.display());
    let mut opts = options(&run);
    opts.resume = true;
    let Outcome::Finished(s) = train(cfg.clone(), &opts).unwrap() else { panic!("interrupted") };
    assert_eq!(s.steps, 20);
    let rows = metrics::read(&run.join("metrics.csv")).unwrap();
    assert!(rows.iter().any(|r| r.step == 15), "steps 11–15 trained again from step 10");
    // a truncated state.json of the newest is skipped too
    let all = variorum_train::checkpoint::all(&run).unwrap();
    let newest = &all[0].0;
    std::fs::write(newest.join("state.json"), b"{\"step\": 2").unwrap();
    assert!(variorum_train::checkpoint::all(&run).unwrap()[0].1.is_err());
    let mut opts = options(&run);
    opts.resume = true;
    opts.max_steps = Some(22);
    assert!(train(cfg, &opts).is_ok());
}

/// Failed writes, injected: a checkpoint whose directory cannot be made, and final weights that
/// cannot be written, stop the run with a clear error and leave the previous checkpoint intact,
/// from which `--resume` continues once the obstacle is gone.
#[test]
fn failed_writes_stop_the_run_and_keep_the_previous_checkpoint() {
    let _guard = seeded();
    let (_tmp, cfg, run) = stopped_run(5);
    let dir = variorum_train::checkpoint::checkpoints_dir(&run);
    let resume = || {
        let mut o = options(&run);
        o.resume = true;
        train(cfg.clone(), &o)
    };
    // the metrics log cannot be written: a directory where it goes (an unreadable log alone
    // would not stop the resume: it starts afresh)
    std::fs::remove_file(run.join("metrics.csv")).unwrap();
    std::fs::create_dir_all(run.join("metrics.csv").join("in-the-way")).unwrap();
    let e = format!("{:#}", resume().err().expect("the metrics write must fail"));
    assert!(e.contains("cannot write") && e.contains("metrics.csv") && !e.contains('\n'), "{e}");
    let (_, st) = variorum_train::checkpoint::latest(&run).unwrap().unwrap();
    assert_eq!(st.step, 5, "the previous checkpoint stays the latest");
    std::fs::remove_dir_all(run.join("metrics.csv")).unwrap();
    // the checkpoint at step 10 cannot be staged: a file where its temporary directory goes
    let blocker = dir.join(".step-00000010.tmp");
    std::fs::write(&blocker, b"in the way").unwrap();
    let e = format!("{:#}", resume().err().expect("the checkpoint write must fail"));
    assert!(e.contains(".step-00000010.tmp"), "{e}");
    let (_, st) = variorum_train::checkpoint::latest(&run).unwrap().unwrap();
    assert_eq!(st.step, 5, "the previous checkpoint stays the latest");
    std::fs::remove_file(&blocker).unwrap();
    // the final weights cannot be written: a directory where they are staged
    let staged = run.join(".model.tmp.bpk");
    std::fs::create_dir(&staged).unwrap();
    let e = format!("{:#}", resume().err().expect("the final write must fail"));
    assert!(e.contains("cannot write") && e.contains("checkpoints are intact"), "{e}");
    assert!(!run.join("model.bpk").exists(), "no half-written weights");
    let (_, st) = variorum_train::checkpoint::latest(&run).unwrap().unwrap();
    assert_eq!(st.step, 20);
    std::fs::remove_dir(&staged).unwrap();
    assert!(resume().is_ok(), "with the obstacle gone the run finishes");
    assert!(run.join("model.bpk").exists());
}

#[test]
fn a_missing_corpus_is_a_clear_error() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_config(&tmp.path().join("nope.txt"), 0.0);
    let e = format!("{:#}", train(cfg, &options(&tmp.path().join("run"))).err().unwrap());
    assert!(e.contains("nope.txt"), "{e}");
}

#[test]
fn gradient_accumulation_equals_one_large_batch() {
    use variorum_data::TokenBatch;
    use variorum_train::step::{optimizer, train_step};
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_config(&corpus(tmp.path()), 0.0);
    let mut model_cfg = cfg.model.clone();
    model_cfg.vocab_size = Some(40);
    let dev = Device::flex().autodiff();
    let rows = |seed: i64, n: usize| {
        let ids: Vec<i64> = (0..n * 17).map(|i| (i as i64 * 7 + seed * 13) % 40).collect();
        let mut b = TokenBatch {
            inputs: vec![],
            targets: vec![],
            batch_size: n,
            seq_len: 16,
            reset: vec![true; n],
            tags: vec![],
            graphs: vec![],
            sources: vec![],
            starts: vec![],
            neighbours: vec![],
            hidden: vec![],
        };
        for r in 0..n {
            b.inputs.extend_from_slice(&ids[r * 17..r * 17 + 16]);
            b.targets.extend_from_slice(&ids[r * 17 + 1..r * 17 + 17]);
        }
        b
    };
    let (a, b) = (rows(1, 2), rows(2, 2));
    let both = TokenBatch {
        inputs: [a.inputs.clone(), b.inputs.clone()].concat(),
        targets: [a.targets.clone(), b.targets.clone()].concat(),
        batch_size: 4,
        seq_len: 16,
        reset: vec![true; 4],
        tags: vec![],
        graphs: vec![],
        sources: vec![],
        starts: vec![],
        neighbours: vec![],
        hidden: vec![],
    };
    let mut tc = cfg.train.clone();
    tc.grad_clip = 0.5; // clipping must act on the accumulated gradient
    dev.seed(5);
    let m1 = model_cfg.init(&dev);
    let m2 = m1.clone();
    let (m1, r1) = train_step(m1, &mut optimizer(&tc), &tc, &[a, b], 1e-2, &dev, None);
    let (m2, r2) = train_step(m2, &mut optimizer(&tc), &tc, &[both.clone()], 1e-2, &dev, None);
    let n1 = r1.grad_norm.unwrap().into_scalar::<f32>();
    let n2 = r2.grad_norm.unwrap().into_scalar::<f32>();
    assert!((n1 - n2).abs() < 1e-4 * n2, "gradient norms {n1} vs {n2}");
    let (x, _) = variorum_train::step::batch_tensors(&both, &dev);
    let diff = (m1.forward(x.clone()).logits - m2.forward(x).logits).abs().max().into_scalar::<f32>();
    assert!(diff < 1e-4, "accumulated and single-batch updates differ by {diff}");
    assert!(n1 > 0.5, "the test must exercise clipping (norm {n1})");
}

#[test]
fn evaluations_off_the_logging_grid_still_happen() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny_config(&corpus(tmp.path()), 0.0);
    cfg.train.steps = 12;
    cfg.train.eval_interval = 6;
    cfg.train.log_interval = 5;
    let run = tmp.path().join("run");
    train(cfg, &options(&run)).unwrap();
    let rows = metrics::read(&run.join("metrics.csv")).unwrap();
    let evals: Vec<u64> = rows.iter().filter(|r| r.val_loss.is_some()).map(|r| r.step).collect();
    assert_eq!(evals, vec![6, 12]);
    assert_eq!(rows.iter().map(|r| r.step).collect::<Vec<_>>(), vec![5, 6, 10, 12]);
}

#[test]
fn fine_tuning_into_a_longer_context_continues_from_the_old_loss() {
    use variorum_position::{PositionConfig, SinusoidalPositionConfig};
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let mut base = tiny_config(&corpus(tmp.path()), 0.0);
    base.model.position = PositionConfig::Sinusoidal(SinusoidalPositionConfig::default());
    base.train.steps = 40;
    let old = tmp.path().join("old");
    let Outcome::Finished(s) = train(base.clone(), &options(&old)).unwrap() else { panic!() };
    let old_loss = s.final_train_loss.unwrap();

    let mut longer = base.clone();
    longer.model.seq_len = 32;
    longer.train.steps = 5;
    let scratch = tmp.path().join("scratch");
    train(longer.clone(), &options(&scratch)).unwrap();
    let tuned = tmp.path().join("tuned");
    let mut opts = options(&tuned);
    opts.init_from = Some(old.clone());
    train(longer.clone(), &opts).unwrap();
    let first = |run: &Path| metrics::read(&run.join("metrics.csv")).unwrap()[0].train_loss.unwrap();
    let (from_scratch, fine_tuned) = (first(&scratch), first(&tuned));
    assert!(fine_tuned < old_loss + 0.25, "fine-tuning started at {fine_tuned}, the old run ended at {old_loss}");
    assert!(fine_tuned < from_scratch - 0.25, "fine-tuned {fine_tuned} vs from scratch {from_scratch}");

    // the same weights through safetensors: everything loads, outputs are identical
    let run = variorum_train::run::Run::load(&old, &Device::flex()).unwrap();
    let file = tmp.path().join("w.safetensors");
    let names = variorum_train::transfer::export_safetensors(&run.model, &file).unwrap();
    assert!(names.contains(&"blocks.0.attn.qkv.qkv.weight".to_string()), "{names:?}");
    let mut fresh = run.config.model.init(&Device::flex());
    let report = variorum_train::transfer::init_from(&mut fresh, &file).unwrap();
    assert_eq!(report.loaded.len(), names.len(), "{}", report.summary());
    assert!(report.new.is_empty() && report.unused.is_empty() && report.skipped_shape.is_empty());
    let x = Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 2, 3, 4], [1, 4]), &Device::flex());
    assert_eq!(fresh.forward(x.clone()).logits.into_data(), run.model.forward(x).logits.into_data());

    // a learned table of another length is reported as skipped for shape
    let mut learned = run.config.model.clone();
    learned.position = PositionConfig::Learned(Default::default());
    learned.seq_len = 32;
    let mut m = learned.init(&Device::flex());
    let report = variorum_train::transfer::init_from(&mut m, &old).unwrap();
    assert!(report.new.iter().any(|n| n.contains("table")), "{}", report.summary());
}

#[test]
fn frozen_groups_do_not_move() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny_config(&corpus(tmp.path()), 0.0);
    cfg.train.freeze.embeddings = true;
    cfg.train.freeze.first_blocks = 1;
    // one run stopped after 1 step, one after 6: frozen weights are the same in both
    let models: Vec<variorum_model::DecoderLm> = [1u64, 6]
        .iter()
        .map(|&steps| {
            let mut c = cfg.clone();
            c.train.steps = steps;
            let run = tmp.path().join(format!("run{steps}"));
            train(c, &options(&run)).unwrap();
            variorum_train::run::Run::load(&run, &Device::flex()).unwrap().model
        })
        .collect();
    let same = |a: Tensor<2>, b: Tensor<2>| (a - b).abs().max().into_scalar::<f32>() == 0.0;
    let qkv = |m: &variorum_model::DecoderLm, i: usize| match &m.blocks[i].attn {
        variorum_attention::Attention::Full(a) => a.qkv.qkv.weight.val(),
        variorum_attention::Attention::AdaptiveSpan(a) => a.attention.qkv.qkv.weight.val(),
        _ => unreachable!("this test trains full attention"),
    };
    let (a, b) = (&models[0], &models[1]);
    assert!(same(a.token_embedding.weight.val(), b.token_embedding.weight.val()), "frozen embedding moved");
    assert!(same(qkv(a, 0), qkv(b, 0)), "frozen block 0 moved");
    assert!(!same(qkv(a, 1), qkv(b, 1)), "block 1 is not frozen and must train");
}

/// A softmax model initialises a kernelised one (Performer's backward compatibility): the
/// Performer's q/k/v and output projections (`attn.proj.…`) take the softmax attention's
/// (`attn.qkv`, `attn.out`), from a run's `.bpk` and from safetensors alike.
#[test]
fn a_softmax_model_initialises_a_performer() {
    use variorum_attention::{Attention, AttentionConfig, PerformerConfig};
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let dev = Device::flex();
    let full = tiny_config(&corpus(tmp.path()), 0.0);
    let mut soft_cfg = full.model.clone();
    soft_cfg.resolve(40).unwrap();
    let soft = soft_cfg.init(&dev);
    let bpk = tmp.path().join("soft.bpk");
    soft.clone().save_file(&bpk).unwrap();
    let st = tmp.path().join("soft.safetensors");
    variorum_train::transfer::export_safetensors(&soft, &st).unwrap();
    let mut perf_cfg = soft_cfg.clone();
    perf_cfg.attention = AttentionConfig::Performer(PerformerConfig { n_heads: 4, ..Default::default() });
    perf_cfg.position = variorum_position::PositionConfig::Learned(Default::default());
    for file in [&bpk, &st] {
        let mut perf = perf_cfg.init(&dev);
        let report = variorum_train::transfer::init_from(&mut perf, file).unwrap();
        for i in 0..2 {
            let (Attention::Full(a), Attention::Performer(p)) = (&soft.blocks[i].attn, &perf.blocks[i].attn) else {
                panic!("kinds")
            };
            let same = |x: Tensor<2>, y: Tensor<2>| (x - y).abs().max().into_scalar::<f32>() == 0.0;
            assert!(same(a.qkv.qkv.weight.val(), p.proj.qkv.qkv.weight.val()), "{}", report.summary());
            assert!(same(a.out.weight.val(), p.proj.out.weight.val()), "{}", report.summary());
        }
        assert!(report.new.iter().all(|n| !n.contains("qkv") && !n.contains("out")), "{}", report.summary());
        assert!(report.unused.iter().all(|n| !n.contains("qkv")), "{}", report.summary());
    }
}

/// Longformer's global projections start as copies of the window's (the paper's code): when a
/// model is initialised from another run that has no global projections, they are copied from
/// the window's *loaded* projections, not left at a copy of the random ones.
#[test]
fn init_from_starts_longformer_global_projections_from_the_loaded_window() {
    use variorum_attention::{Attention, AttentionConfig, LongformerConfig};
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let dev = Device::flex();
    let mut soft_cfg = tiny_config(&corpus(tmp.path()), 0.0).model;
    soft_cfg.resolve(40).unwrap();
    let soft = soft_cfg.init(&dev);
    let bpk = tmp.path().join("soft.bpk");
    soft.clone().save_file(&bpk).unwrap();
    let mut long_cfg = soft_cfg.clone();
    long_cfg.attention =
        AttentionConfig::Longformer(LongformerConfig { n_heads: 4, window: 4, global: vec![0], ..Default::default() });
    let mut long = long_cfg.init(&dev);
    let report = variorum_train::transfer::init_from(&mut long, &bpk).unwrap();
    let (Attention::Full(a), Attention::Longformer(l)) = (&soft.blocks[0].attn, &long.blocks[0].attn) else {
        panic!("kinds")
    };
    let same = |x: Tensor<2>, y: Tensor<2>| (x - y).abs().max().into_scalar::<f32>() == 0.0;
    assert!(same(a.qkv.qkv.weight.val(), l.attention.qkv.qkv.weight.val()), "{}", report.summary());
    let global = l.global_qkv.as_ref().expect("global projections");
    assert!(same(a.qkv.qkv.weight.val(), global.qkv.weight.val()), "{}", report.summary());
    assert_ne!(global.qkv.weight.id, l.attention.qkv.qkv.weight.id, "trained apart");
}

#[test]
fn a_model_conditioned_on_tags_needs_tagged_data_and_keeps_its_tag_names() {
    let _guard = seeded();
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny_config(&corpus(tmp.path()), 0.0);
    cfg.model.attention = toml::from_str("kind = \"task-prior\"\nn_heads = 4\ntasks = 2").unwrap();
    let mut opts = options(&tmp.path().join("untagged"));
    opts.max_steps = Some(2);
    let msg = format!("{:#}", train(cfg.clone(), &opts).err().expect("untagged data is refused"));
    assert!(msg.contains("task-prior") && msg.contains("data.tags.section"), "{msg}");

    // two named sections and the untagged text before the first: three tags, more than 2 rows
    cfg.data.tags = Some(toml::from_str("section = \"(whether|in the mind)\"").unwrap());
    let mut opts = options(&tmp.path().join("too-many"));
    opts.max_steps = Some(2);
    let msg = format!("{:#}", train(cfg.clone(), &opts).err().expect("too many tags are refused"));
    assert!(msg.contains("model.attention.tasks = 2") && msg.contains("at least 3"), "{msg}");

    cfg.model.attention = toml::from_str("kind = \"task-prior\"\nn_heads = 4\ntasks = 3").unwrap();
    let run = tmp.path().join("tagged");
    let mut opts = options(&run);
    opts.max_steps = Some(2);
    let Outcome::Finished(s) = train(cfg, &opts).unwrap() else { panic!("interrupted") };
    assert!(s.final_val_loss.unwrap().is_finite());
    let names: Vec<String> = serde_json::from_str(&std::fs::read_to_string(run.join("tags.json")).unwrap()).unwrap();
    assert_eq!(names.len(), 3, "{names:?}");
    let loaded = variorum_train::run::Run::load(&run, &Device::flex()).unwrap();
    let whether = loaded.tag_id("whether").unwrap();
    assert!(whether == 1 || whether == 2, "{names:?}");
    let msg = loaded.tag_id("nope").unwrap_err().to_string();
    assert!(msg.contains("no tag \"nope\""), "{msg}");
    use variorum_train::generate::SampleConfig;
    let cfg = SampleConfig {
        max_new_tokens: 5,
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
        no_cache: false,
        tag: Some(whether),
    };
    let prompt = loaded.encode_prompt("to be").unwrap();
    let cached = loaded.generate(&prompt, &cfg, |_| {});
    assert_eq!(cached.len(), 5);
    // the tag reaches the cached path as it does the full forward
    let uncached = SampleConfig { no_cache: true, ..cfg.clone() };
    assert_eq!(loaded.generate(&prompt, &uncached, |_| {}), cached, "cached and uncached tagged decoding differ");
    // and it conditions the scores
    let (a, b) = (loaded.score_tagged(&prompt, Some(1)).unwrap(), loaded.score_tagged(&prompt, Some(2)).unwrap());
    assert!((a.total_logprob - b.total_logprob).abs() > 1e-6, "two tags score the prompt alike");
    // a corpus whose sections changed since training is refused: its ids would name other ones
    std::fs::write(tmp.path().join("corpus.txt"), "to be or not to be in the mind that is the question\n".repeat(200))
        .unwrap();
    let msg = loaded.validation_split().unwrap_err().to_string();
    assert!(msg.contains("changed since training") && msg.contains("tags.json"), "{msg}");
}
