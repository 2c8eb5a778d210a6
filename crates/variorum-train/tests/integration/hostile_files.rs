//! Files from elsewhere are input too: arbitrary, truncated and bit-flipped bytes given to the
//! loaders of configs, tokenizers, weights (`.bpk`, `.safetensors`), checkpoint state, whole run
//! directories (loaded, and resumed) and corpora give an error — never a panic, an abort or a
//! hang. Property tests (proptest) with fixed seeds; the cases per loader are in
//! docs/reliability.md. A failing case prints its minimal input, which then belongs beside the
//! code it found wrong as a regression test (the damaged `metrics.csv`: `metrics.rs`).

use std::path::Path;

use burn::nn::LinearConfig;
use burn::prelude::*;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use variorum_train::ExperimentConfig;

/// Where a real file is cut: in half the cases not at all (only bytes flipped), so damage
/// inside a complete file is tried as often as truncation.
fn cut() -> impl Strategy<Value = f64> {
    prop_oneof![Just(1.0), 0.0f64..1.0]
}

/// Bytes of a corpus from elsewhere: arbitrary (mostly not UTF-8), or arbitrary Unicode text.
fn corpus_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..300), any::<String>().prop_map(String::into_bytes)]
}

/// A real file's bytes, cut at `cut` (a fraction of its length) with `flips` bytes XOR-ed.
fn damaged(real: &[u8], cut: f64, flips: &[(f64, u8)]) -> Vec<u8> {
    let mut b = real[..((real.len() as f64 * cut) as usize).min(real.len())].to_vec();
    for &(at, x) in flips {
        if !b.is_empty() {
            let i = ((b.len() as f64 * at) as usize).min(b.len() - 1);
            b[i] ^= x.max(1);
        }
    }
    b
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn real_config() -> String {
    "[model]\nd_model = 32\nn_layers = 2\nseq_len = 16\n[model.attention]\nkind = \"full\"\nn_heads = 4\n[data]\npath = \"x.txt\"\n[train]\nsteps = 10\n".into()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, rng_seed: RngSeed::Fixed(22), ..ProptestConfig::default() })]

    #[test]
    fn configs_of_any_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = ExperimentConfig::parse(&text, false).map(|c| c.validate());
        let _ = ExperimentConfig::parse(&text, true).map(|c| c.validate());
    }

    #[test]
    fn damaged_configs_are_errors_not_panics(cut in cut(), flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..5)) {
        let text = String::from_utf8_lossy(&damaged(real_config().as_bytes(), cut, &flips)).into_owned();
        let _ = ExperimentConfig::parse(&text, false).map(|c| c.validate());
    }

    #[test]
    fn damaged_graph_data_are_errors_not_panics(cut in cut(), flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..5)) {
        // the first lines of the shipped example, damaged
        let real: String = include_str!("../../../../configs/graph/min-trees.jsonl").lines().take(6).collect::<Vec<_>>().join("\n");
        let bytes = damaged(real.as_bytes(), cut, &flips);
        let text = String::from_utf8_lossy(&bytes);
        let cfg = variorum_data::DataConfig {
            dataset: None,
            path: Some("g.jsonl".into()),
            graph: Some(Default::default()),
            ..Default::default()
        };
        match variorum_data::Corpus::from_text(&text, &cfg, None, "g.jsonl".into()) {
            Err(e) => prop_assert!(!e.to_string().contains('\n'), "{e}"),
            Ok(c) => {
                // whatever loaded batches: drawn, padded, or refused as too long, never a panic
                let g = c.graphs.expect("graph data");
                if let Ok(b) = variorum_data::GraphBatches::new(g.train, std::path::Path::new("g.jsonl"), 24, 3, 0) {
                    let batch = b.batch(1);
                    prop_assert_eq!(batch.graphs.len(), 3);
                }
            }
        }
    }

    #[test]
    fn damaged_tokenizers_are_errors_not_panics(cut in cut(), flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..5)) {
        let dir = tempfile::tempdir().unwrap();
        let real = br#"{"kind":"char","vocab":["\n"," ","a","b","c"]}"#;
        let p = write(dir.path(), "tokenizer.json", &damaged(real, cut, &flips));
        let _ = variorum_data::Tokenizer::load(&p);
    }

    #[test]
    fn damaged_state_files_are_errors_not_panics(cut in cut(), flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..5)) {
        let run = tempfile::tempdir().unwrap();
        let st = variorum_train::checkpoint::TrainState { step: 7, ..Default::default() };
        let dir = variorum_train::checkpoint::save(run.path(), &st, 2, |_| Ok(())).unwrap();
        let real = std::fs::read(dir.join("state.json")).unwrap();
        std::fs::write(dir.join("state.json"), damaged(&real, cut, &flips)).unwrap();
        let _ = variorum_train::checkpoint::latest(run.path());
        let _ = variorum_train::checkpoint::all(run.path());
    }
}

proptest! {
    // each case writes and reads a weights file: fewer cases
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, rng_seed: RngSeed::Fixed(28), ..ProptestConfig::default() })]

    #[test]
    fn damaged_weights_are_errors_not_panics(cut in cut(), flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..5)) {
        let dev = Device::flex();
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.bpk");
        LinearConfig::new(4, 3).init(&dev).save_file(&good).unwrap();
        let real = std::fs::read(&good).unwrap();
        let bytes = damaged(&real, cut, &flips);
        let p = write(dir.path(), "w.bpk", &bytes);
        let loaded = variorum_train::weights::load_weights(LinearConfig::new(4, 3).init(&dev), &p, "weights");
        // a file cut short can never load
        if bytes.len() < real.len() {
            prop_assert!(loaded.is_err());
        }
    }
}

/// A tiny decoder's weights as a safetensors file (the export format), written once.
fn exported_safetensors() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.safetensors");
        variorum_train::transfer::export_safetensors(&variorum_model::zoo::tiny().init(&Device::flex()), &p).unwrap();
        std::fs::read(p).unwrap()
    })
}

/// A tiny model's config reading `text`, trained for `steps`.
fn tiny_run_config(text: &Path, steps: u64) -> ExperimentConfig {
    let cfg = format!(
        "[model]\nd_model = 16\nn_layers = 1\nseq_len = 8\n[model.attention]\nkind = \"full\"\nn_heads = 2\n\
         [data]\npath = \"{}\"\n[train]\nsteps = {steps}\nbatch_size = 2\neval_batches = 1\nsample_tokens = 3\n",
        text.display()
    );
    ExperimentConfig::parse(&cfg, false).unwrap()
}

/// A real run directory in `<dir>/run` (a tiny model trained for 10 steps, or stopped at 5 of
/// them with its checkpoint), its corpus in `<dir>/text.txt`.
fn tiny_run(stop_at: Option<u64>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (0..300).map(|i| ["the cat ", "sat on ", "a mat\n"][i % 3]).collect();
    std::fs::write(dir.path().join("text.txt"), text).unwrap();
    let mut opts = variorum_train::TrainOptions::new(&dir.path().join("run"), Device::flex(), "flex");
    opts.stop_at = stop_at;
    variorum_train::train(tiny_run_config(&dir.path().join("text.txt"), 10), &opts).unwrap();
    dir
}

/// A finished run, made once.
fn real_run() -> &'static Path {
    static RUN: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    RUN.get_or_init(|| tiny_run(None)).path()
}

/// A run stopped at step 5 of 10, made once.
fn stopped_run() -> &'static Path {
    static RUN: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    RUN.get_or_init(|| tiny_run(Some(5))).path()
}

/// Every file under `dir`, relative to it, in a fixed order.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() { stack.push(p) } else { out.push(p.strip_prefix(dir).unwrap().to_path_buf()) }
        }
    }
    out.sort();
    out
}

fn copy_tree(from: &Path, to: &Path) {
    for f in files_under(from) {
        std::fs::create_dir_all(to.join(&f).parent().unwrap()).unwrap();
        std::fs::copy(from.join(&f), to.join(&f)).unwrap();
    }
}

proptest! {
    // each case loads a model: fewer cases
    #![proptest_config(ProptestConfig { cases: 192, failure_persistence: None, rng_seed: RngSeed::Fixed(28), ..ProptestConfig::default() })]

    /// `--init-from FILE.safetensors`: a damaged file is an error, never a panic; one cut short
    /// never loads.
    #[test]
    fn damaged_safetensors_imports_are_errors_not_panics(cut in cut(), flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..5)) {
        let real = exported_safetensors();
        let bytes = damaged(real, cut, &flips);
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "w.safetensors", &bytes);
        let mut model = variorum_model::zoo::tiny().init(&Device::flex());
        let loaded = variorum_train::transfer::init_from(&mut model, &p);
        if bytes.len() < real.len() {
            prop_assert!(loaded.is_err(), "a file cut to {} of {} bytes loaded", bytes.len(), real.len());
        }
    }

    /// A whole run directory from elsewhere: one of its files damaged (and, in half the cases,
    /// the final weights removed so the checkpoints are read), then loaded, asked to generate
    /// and to score. An error, never a panic.
    #[test]
    fn damaged_run_directories_are_errors_not_panics(which in 0usize..64, drop_final in any::<bool>(), cut in cut(), flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..5)) {
        let src = real_run().join("run");
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        copy_tree(&src, &run);
        if drop_final {
            std::fs::remove_file(run.join("model.bpk")).unwrap();
        }
        let files = files_under(&run);
        let victim = run.join(&files[which % files.len()]);
        let real = std::fs::read(&victim).unwrap();
        std::fs::write(&victim, damaged(&real, cut, &flips)).unwrap();
        let dev = Device::flex();
        if let Ok(r) = variorum_train::run::Run::load(&run, &dev) {
            if let Ok(ids) = r.encode_prompt("the cat") {
                let cfg = variorum_train::generate::SampleConfig { max_new_tokens: 3, temperature: 1.0, top_k: 0, top_p: 1.0, seed: 1, no_cache: false, tag: None };
                let _ = r.generate(&ids, &cfg, |_| {});
                let _ = r.score(&ids);
            }
        }
    }
}

proptest! {
    // each case trains five steps: fewer cases
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, rng_seed: RngSeed::Fixed(28), ..ProptestConfig::default() })]

    /// `--resume` of a stopped run with one file damaged: an error or a resumed run, never a
    /// panic; and a damaged file training does not need (the metrics log, the plot where a font
    /// drew one, the lock file, the `latest` pointer) never stops it.
    #[test]
    fn a_stopped_run_with_a_damaged_file_resumes_or_is_an_error(which in 0usize..64, cut in cut(), flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..5)) {
        let src = stopped_run();
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        copy_tree(&src.join("run"), &run);
        let files = files_under(&run);
        let name = &files[which % files.len()];
        let victim = run.join(name);
        let real = std::fs::read(&victim).unwrap();
        std::fs::write(&victim, damaged(&real, cut, &flips)).unwrap();
        let mut opts = variorum_train::TrainOptions::new(&run, Device::flex(), "flex");
        opts.resume = true;
        let resumed = variorum_train::train(tiny_run_config(&src.join("text.txt"), 10), &opts);
        let file = name.file_name().unwrap().to_str().unwrap();
        if matches!(file, "metrics.csv" | "loss.png" | ".lock" | "latest") {
            prop_assert!(resumed.is_ok(), "a damaged {} stopped --resume: {:#}", name.display(), resumed.err().unwrap());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, rng_seed: RngSeed::Fixed(28), ..ProptestConfig::default() })]

    /// A corpus of any bytes (`data.path`): read, split, tokenized by char and byte tokenizers,
    /// and cut into training and evaluation batches — or an error, never a panic.
    #[test]
    fn corpora_of_any_bytes_are_errors_not_panics(bytes in corpus_bytes(), seq_len in 1usize..12, val_fraction in 0.0f64..1.0, byte_level in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "corpus.txt", &bytes);
        let tokenizer = if byte_level { variorum_data::TokenizerConfig::Byte } else { variorum_data::TokenizerConfig::Char };
        let cfg = variorum_data::DataConfig { dataset: None, path: Some(p), tokenizer, val_fraction, tags: None, graph: None, pairs: None, neighbours: None, ..Default::default() };
        if let Ok(corpus) = variorum_data::Corpus::load(&cfg, None) {
            if let Ok(w) = variorum_data::RandomWindows::new(std::sync::Arc::new(corpus.train.clone()), seq_len, 2, 7) {
                let _ = w.batch(3);
            }
            let _ = variorum_data::eval_batches(&corpus.val, seq_len, 2, Some(2), None);
            let _ = corpus.tokenizer.decode(&corpus.val);
        }
    }
}

proptest! {
    // BPE training per case: fewer cases
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, rng_seed: RngSeed::Fixed(28), ..ProptestConfig::default() })]

    #[test]
    fn corpora_of_any_bytes_train_bpe_or_are_errors(bytes in corpus_bytes()) {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "corpus.txt", &bytes);
        let tokenizer = variorum_data::TokenizerConfig::Bpe { vocab_size: 280, min_frequency: 2 };
        let cfg = variorum_data::DataConfig { dataset: None, path: Some(p), tokenizer, ..Default::default() };
        if let Ok(corpus) = variorum_data::Corpus::load(&cfg, None) {
            let saved = dir.path().join("tokenizer.json");
            corpus.tokenizer.save(&saved).unwrap();
            let back = variorum_data::Tokenizer::load(&saved).unwrap();
            prop_assert_eq!(back.encode("abc").ok(), corpus.tokenizer.encode("abc").ok());
        }
    }
}

/// Replaces the only occurrence of `from` in `bytes` by `to` (of the same length).
fn patch_once(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    let at: Vec<usize> = (0..=bytes.len() - from.len()).filter(|&i| bytes[i..].starts_with(from)).collect();
    assert_eq!(at.len(), 1, "{from:?} occurs {} times", at.len());
    bytes[at[0]..at[0] + to.len()].copy_from_slice(to);
}

/// A tensor whose declared shape does not match its bytes is refused, in both weights formats —
/// even where the module expects exactly the declared shape (so nothing but the byte count is
/// wrong).
#[test]
fn a_declared_shape_that_does_not_match_the_bytes_is_refused() {
    let dev = Device::flex();
    let dir = tempfile::tempdir().unwrap();

    // burnpack: a 4×3 weight (48 bytes) re-declared as 4×2, loaded into a 4×2 layer
    let good = dir.path().join("good.bpk");
    LinearConfig::new(4, 3).with_bias(false).init(&dev).save_file(&good).unwrap();
    let mut bytes = std::fs::read(&good).unwrap();
    patch_once(&mut bytes, &[0x82, 0x04, 0x03], &[0x82, 0x04, 0x02]); // CBOR [4, 3] → [4, 2]
    let p = write(dir.path(), "bad.bpk", &bytes);
    let e = variorum_train::weights::load_weights(LinearConfig::new(4, 2).with_bias(false).init(&dev), &p, "weights")
        .err()
        .expect("a 4×2 tensor with 48 bytes loaded");
    let e = e.to_string();
    assert!(e.contains("bad.bpk") && e.contains("need 32") && !e.contains('\n'), "{e}");

    // safetensors: one tensor re-declared with half its columns (JSON header, same byte count)
    let real = exported_safetensors();
    let n = u64::from_le_bytes(real[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&real[8..8 + n]).unwrap();
    let (name, t) = header
        .as_object_mut()
        .unwrap()
        .iter_mut()
        .find(|(_, t)| t["shape"].as_array().is_some_and(|s| s.len() == 2 && s[1].as_u64().unwrap() % 2 == 0))
        .unwrap();
    let name = name.clone();
    let cols = t["shape"][1].as_u64().unwrap();
    t["shape"][1] = (cols / 2).into();
    let json = serde_json::to_vec(&header).unwrap();
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    bytes.extend_from_slice(&real[8 + n..]);
    let p = write(dir.path(), "bad.safetensors", &bytes);
    let mut model = variorum_model::zoo::tiny().init(&dev);
    let e = variorum_train::transfer::init_from(&mut model, &p).err().unwrap_or_else(|| panic!("{name} loaded"));
    let e = format!("{e:#}");
    assert!(e.contains("bad.safetensors") && e.contains("invalid shape") && !e.contains('\n'), "{e}");
}
