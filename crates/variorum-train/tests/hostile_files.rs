//! Files from elsewhere are input too: arbitrary, truncated and bit-flipped bytes given to the
//! loaders of configs, tokenizers, weights (`.bpk`) and checkpoint state give an error — never a
//! panic, an abort or a hang. Property tests (proptest) with fixed seeds: 512 cases for each
//! text loader, 256 for weights files; a failing case prints its minimal input, which then
//! belongs here as a regression test.

use std::path::Path;

use burn::nn::LinearConfig;
use burn::prelude::*;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use variorum_train::ExperimentConfig;

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
    fn damaged_configs_are_errors_not_panics(cut in 0.0f64..1.0, flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..4)) {
        let text = String::from_utf8_lossy(&damaged(real_config().as_bytes(), cut, &flips)).into_owned();
        let _ = ExperimentConfig::parse(&text, false).map(|c| c.validate());
    }

    #[test]
    fn damaged_tokenizers_are_errors_not_panics(cut in 0.0f64..1.0, flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..4)) {
        let dir = tempfile::tempdir().unwrap();
        let real = br#"{"kind":"char","vocab":["\n"," ","a","b","c"]}"#;
        let p = write(dir.path(), "tokenizer.json", &damaged(real, cut, &flips));
        let _ = variorum_data::Tokenizer::load(&p);
    }

    #[test]
    fn damaged_state_files_are_errors_not_panics(cut in 0.0f64..1.0, flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..4)) {
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
    fn damaged_weights_are_errors_not_panics(cut in 0.0f64..1.0, flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..4)) {
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
