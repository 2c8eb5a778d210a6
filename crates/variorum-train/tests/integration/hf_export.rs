//! `variorum export --format hf` against transformers: runs trained here (tests/fixtures/hf/export/,
//! made by scripts/reference/make_hf_export_fixtures.py with transformers 5.24.0), exported, were
//! loaded by `AutoModelForCausalLM` / `AutoTokenizer`; the fixture records what transformers
//! computed and the sha256 of every file the export wrote. Exporting the same run again here
//! must write those very files, and the run must give every token the log-probability
//! transformers gave it within 1e-4 and the same greedy continuation. The `roundtrip` run is a
//! transformers model imported, fine-tuned 100 steps and exported.

use std::path::{Path, PathBuf};

use burn::prelude::Device;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use variorum_train::generate::SampleConfig;
use variorum_train::hf;
use variorum_train::run::Run;

#[derive(Deserialize)]
struct Expected {
    class: String,
    text: String,
    ids: Vec<u32>,
    logprobs: Vec<f64>,
    prompt_ids: Vec<u32>,
    greedy: Vec<u32>,
    exported: std::collections::BTreeMap<String, String>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/export").join(name)
}

fn sha256(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap()).iter().map(|b| format!("{b:02x}")).collect()
}

fn max_delta(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// Exports fixture `name` and checks it against its expected.json; then imports the export
/// and checks it scores as the run does. Returns max |Δ log-prob| against transformers.
fn exported_as_transformers_scored_it(name: &str) -> f64 {
    let dir = fixture(name);
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let device = Device::flex();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("hf");
    let done = hf::export(&dir, &out, &device).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    assert_eq!(done.class, expected.class);
    let written: Vec<String> = {
        let mut v: Vec<String> =
            std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(written, expected.exported.keys().cloned().collect::<Vec<_>>(), "{name}: the files written");
    for (file, hash) in &expected.exported {
        assert_eq!(&sha256(&out.join(file)), hash, "{name}: {file} is not the file transformers was given");
    }

    let run = Run::load(&dir, &device).unwrap();
    assert_eq!(run.encode_prompt(&expected.text).unwrap(), expected.ids, "{name}: token ids of the text");
    let scores: Vec<f64> = run.score(&expected.ids).unwrap().tokens.iter().map(|t| t.logprob).collect();
    let worst = max_delta(&scores, &expected.logprobs);
    assert!(worst < 1e-4, "{name}: max |Δ log-prob| = {worst:e} against transformers");
    let continued = run.generate(&expected.prompt_ids, &SampleConfig::greedy(expected.greedy.len()), |_| {});
    assert_eq!(continued, expected.greedy, "{name}: greedy continuation (KV cache) against transformers' generate");

    // and back: the export imported is the run again
    let back = tmp.path().join("back");
    hf::import(&out, &back, &device).unwrap_or_else(|e| panic!("{name}: importing the export: {e:#}"));
    let again = Run::load(&back, &device).unwrap();
    assert_eq!(again.encode_prompt(&expected.text).unwrap(), expected.ids, "{name}: the export's tokenizer");
    let rescored: Vec<f64> = again.score(&expected.ids).unwrap().tokens.iter().map(|t| t.logprob).collect();
    let back_delta = max_delta(&rescored, &scores);
    assert!(back_delta < 1e-5, "{name}: export then import moved log-probs by {back_delta:e}");
    eprintln!("{name}: max |Δ log-prob| = {worst:.2e} against transformers, {back_delta:.2e} after import");
    worst
}

#[test]
fn gpt_recipe_exports_as_gpt2_with_its_char_tokenizer() {
    exported_as_transformers_scored_it("gpt");
}

#[test]
fn llama_recipe_with_interleaved_rotary_pairs_exports_as_llama() {
    exported_as_transformers_scored_it("llama");
}

#[test]
fn parallel_partial_rotary_recipe_exports_as_gpt_neox() {
    exported_as_transformers_scored_it("neox");
}

#[test]
fn an_imported_model_fine_tuned_here_exports_as_llama_again() {
    exported_as_transformers_scored_it("roundtrip");
}

#[test]
fn shared_norm_recipe_with_a_head_bias_exports_as_phi() {
    exported_as_transformers_scored_it("phi");
}

#[test]
fn shared_norm_recipe_with_interleaved_pairs_exports_as_gptj_unpermuted() {
    exported_as_transformers_scored_it("gptj");
}

#[test]
fn alibi_recipe_with_an_embedding_norm_exports_as_bloom() {
    exported_as_transformers_scored_it("bloom");
}

/// Exports masked fixture `name` and checks it against its expected.json (what transformers'
/// `AutoModelForMaskedLM` computed with the export); then imports the export and checks again.
fn masked_exported_as_transformers_scored_it(name: &str, class: &str) -> f64 {
    let dir = fixture(name);
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let expected: crate::hf_import::MaskedExpected = serde_json::from_str(&text).unwrap();
    let files: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(files["class"], class);
    let device = Device::flex();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("hf");
    let done = hf::export(&dir, &out, &device).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    assert_eq!(done.class, class);
    for (file, hash) in files["exported"].as_object().unwrap() {
        assert_eq!(&sha256(&out.join(file)), hash, "{name}: {file} is not the file transformers was given");
    }
    let run = Run::load(&dir, &device).unwrap();
    assert_eq!(run.encode_prompt(&expected.text).unwrap(), expected.ids, "{name}: token ids of the text");
    // the run's extra mask row is the exported vocabulary's [MASK]
    assert_eq!(run.model.mask_token, Some(expected.mask_id));
    let (worst, hidden) = crate::hf_import::mlm_deltas(&run, &expected);
    assert!(worst < 1e-4 && hidden < 1e-4, "{name}: max |Δ log-prob| = {worst:e}, |Δ hidden| = {hidden:e}");

    // and back: the export imported is the run again, its mask token the tokenizer's
    let back = tmp.path().join("back");
    hf::import(&out, &back, &device).unwrap_or_else(|e| panic!("{name}: importing the export: {e:#}"));
    let again = Run::load(&back, &device).unwrap();
    assert_eq!(again.model.mask_token, Some(expected.mask_id));
    let (again_worst, again_hidden) = crate::hf_import::mlm_deltas(&again, &expected);
    assert!(
        again_worst < 1e-4 && again_hidden < 1e-4,
        "{name}: the export imported is off transformers by {again_worst:e}"
    );
    eprintln!("{name}: max |Δ log-prob| = {worst:.2e}, |Δ hidden| = {hidden:.2e} against transformers");
    worst
}

#[test]
fn masked_recipe_exports_as_bert_with_its_mask_row_as_a_token() {
    masked_exported_as_transformers_scored_it("bert", "BertForMaskedLM");
}

#[test]
fn masked_fourier_recipe_exports_as_fnet() {
    masked_exported_as_transformers_scored_it("fnet", "FNetForMaskedLM");
}

/// A copy of fixture `name` whose config.toml is changed by `edit`; its export must fail with a
/// message containing `says`, in one line, and leave nothing behind.
fn refused(name: &str, edit: impl FnOnce(&str) -> String, says: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), run.join(entry.file_name())).unwrap();
    }
    let config = run.join("config.toml");
    std::fs::write(&config, edit(&std::fs::read_to_string(&config).unwrap())).unwrap();
    let out = tmp.path().join("hf");
    let e = format!("{:#}", hf::export(&run, &out, &Device::flex()).unwrap_err());
    assert!(e.contains(says), "expected {says:?} in: {e}");
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(!out.exists(), "a refused export left {}", out.display());
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["run"], "nothing half-written beside the export");
}

#[test]
fn recipes_transformers_cannot_compute_are_refused_naming_the_setting() {
    // another normaliser: the weights load, but GPT-2 computes softmax
    refused(
        "gpt",
        |c| c.replace("normaliser = \"softmax\"", "normaliser = \"sparsemax\""),
        "model.attention.normaliser = \"sparsemax\" here, but GPT2LMHeadModel computes model.attention.normaliser = \"softmax\"",
    );
    // a limit on how far back attention reaches, which GPT-2 does not have
    refused(
        "gpt",
        |c| c.replace("init_std = 0.02\n", "init_std = 0.02\nmax_back = 16\n"),
        "model.max_back = 16 here, but GPT2LMHeadModel computes model.max_back = (unset)",
    );
    // rotary positions: neither architecture that has them computes sparsemax
    refused(
        "llama",
        |c| c.replace("normaliser = \"softmax\"", "normaliser = \"sparsemax\""),
        "cannot be exported as LlamaForCausalLM (model.attention.normaliser = \"sparsemax\" here, but LlamaForCausalLM computes model.attention.normaliser = \"softmax\"), nor as GPTNeoXForCausalLM (",
    );
    // GPT-J's rotary base is fixed; Phi's pairs would do, but Phi has attention biases
    refused(
        "gptj",
        |c| c.replace("base = 10000.0", "base = 500.0"),
        "as GPTJForCausalLM (model.position.base = 500.0 here, but GPTJForCausalLM computes model.position.base = 10000.0), nor as PhiForCausalLM (model.attention.bias = false here",
    );
    // a position scheme no exported architecture has
    refused(
        "llama",
        |c| c.replace("kind = \"rope\"\nbase = 10000.0\nlayout = \"interleaved\"", "kind = \"none\""),
        "no Hugging Face architecture variorum exports to has it",
    );
    // an out directory that exists is left alone
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("mine.txt"), "keep").unwrap();
    let e = hf::export(&fixture("gpt"), tmp.path(), &Device::flex()).unwrap_err().to_string();
    assert!(e.contains("exists"), "{e}");
    assert_eq!(std::fs::read_to_string(tmp.path().join("mine.txt")).unwrap(), "keep");
}
