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

/// What transformers computed with an export (its class and files are read by `export_again`).
#[derive(Deserialize)]
struct Expected {
    text: String,
    ids: Vec<u32>,
    logprobs: Vec<f64>,
    prompt_ids: Vec<u32>,
    greedy: Vec<u32>,
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

/// Exports fixture `name` into a temporary directory (returned, with the export's path in it)
/// and checks that it writes the files transformers was given: expected.json's `class` and the
/// sha256 of every file in `exported`, no file more or less.
fn export_again(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = fixture(name);
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("hf");
    let done = hf::export(&dir, &out, &Device::flex()).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    assert_eq!(done.class, expected["class"], "{name}: the class");
    let hashes = expected["exported"].as_object().unwrap();
    let mut written: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    written.sort();
    assert_eq!(written, hashes.keys().cloned().collect::<Vec<_>>(), "{name}: the files written");
    for (file, hash) in hashes {
        assert_eq!(
            sha256(&out.join(file)),
            hash.as_str().unwrap(),
            "{name}: {file} is not the file transformers was given"
        );
    }
    (tmp, out)
}

/// Exports fixture `name` and checks it against its expected.json; then imports the export
/// and checks it scores as the run does. Returns max |Δ log-prob| against transformers.
fn exported_as_transformers_scored_it(name: &str) -> f64 {
    let dir = fixture(name);
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let device = Device::flex();
    let (tmp, out) = export_again(name);

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
    let (tmp, out) = export_again(name);
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
fn masked_nystrom_recipe_exports_as_nystromformer() {
    masked_exported_as_transformers_scored_it("nystromformer", "NystromformerForMaskedLM");
}

/// The DeBERTa round trip: tests/fixtures/hf/deberta_v2 (log buckets, the relative table normed
/// and read through the content projections) imported, fine-tuned here with the position
/// parameters frozen, exported with position projections of its own. A run whose layers'
/// relative tables have parted (any DeBERTa-style run trained from scratch: variorum's tables
/// are per layer) has no exact export and is refused.
#[test]
fn an_imported_deberta_fine_tuned_here_exports_as_deberta_again() {
    masked_exported_as_transformers_scored_it("deberta", "DebertaV2ForMaskedLM");
    let device = Device::flex();
    let (tmp, run) = run_copy("deberta");
    use burn::module::Module as _;
    let mut model = Run::load(&run, &device).unwrap().model;
    match &mut model.blocks[1].attn {
        variorum_attention::Attention::Full(a) => {
            let Some(variorum_position::RelativePosition::Deberta(p)) = &mut a.position else {
                panic!("DeBERTa's terms")
            };
            p.relative = burn::module::Param::from_tensor(p.relative.val().add_scalar(0.5));
        }
        _ => panic!("full attention"),
    }
    model.save_file(run.join("model.bpk")).unwrap();
    let e = format!("{:#}", hf::export(&run, &tmp.path().join("parted"), &device).unwrap_err());
    assert!(e.contains("rel_embeddings") && e.contains("copies differ"), "{e}");
    assert!(!tmp.path().join("parted").exists());
}

/// The BigBird round trip: tests/fixtures/hf/big_bird (block-sparse attention in blocks of 2
/// with 2 random blocks, the embeddings rescaled) imported, fine-tuned here, exported; scored
/// on 31 tokens, where transformers attends block-sparsely. The same run with a seeded draw is
/// refused: transformers draws random blocks only in training, anew every step.
#[test]
fn an_imported_big_bird_fine_tuned_here_exports_as_big_bird_again() {
    masked_exported_as_transformers_scored_it("big_bird", "BigBirdForMaskedLM");
    let seeded = |c: &str| {
        assert!(c.contains("random_draw = \"first-block\""), "{c}");
        c.replace("random_draw = \"first-block\"", "random_draw = \"seeded\"")
    };
    refused("big_bird", seeded, "random_draw");
}

/// The Reformer round trip: tests/fixtures/hf/reformer (local and LSH layers in turn, axial
/// positions, reversible blocks whose streams are concatenated) imported, fine-tuned 100 steps,
/// exported as ReformerForMaskedLM; transformers scored it with rotations drawn from a
/// `hash_seed`, which the test hands to the run's LSH layers (and to the export imported back).
#[test]
fn an_imported_reformer_fine_tuned_here_exports_as_reformer_again() {
    let name = "reformer";
    let dir = fixture(name);
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let expected: crate::hf_import::MaskedExpected = serde_json::from_str(&text).unwrap();
    assert_eq!(json["class"], "ReformerForMaskedLM");
    let device = Device::flex();
    let (tmp, out) = export_again(name);
    let back = tmp.path().join("back");
    hf::import(&out, &back, &device).unwrap_or_else(|e| panic!("importing the export: {e:#}"));
    for (what, path) in [("the run", &dir), ("the export imported", &back)] {
        let mut run = Run::load(path, &device).unwrap();
        assert_eq!(run.encode_prompt(&expected.text).unwrap(), expected.ids, "{what}: token ids of the text");
        assert_eq!(crate::hf_import::draw_as_transformers(&mut run, &json), 2);
        let (worst, hidden) = crate::hf_import::mlm_deltas(&run, &expected);
        assert!(
            worst < 1e-4 && hidden < 1e-4,
            "reformer, {what}: max |Δ log-prob| = {worst:e}, |Δ hidden| = {hidden:e}"
        );
        eprintln!("reformer, {what}: max |Δ log-prob| = {worst:.2e}, |Δ hidden| = {hidden:.2e} against transformers");
    }
}

/// The Longformer round trip: tests/fixtures/hf/longformer (windows of 4 and 8 keys each way,
/// global projections of its own) imported, fine-tuned here, exported with its positions
/// numbered from the padding token's id again. A run whose tokenizer names no padding token
/// has no place to number them from and is refused.
#[test]
fn an_imported_longformer_fine_tuned_here_exports_as_longformer_again() {
    masked_exported_as_transformers_scored_it("longformer", "LongformerForMaskedLM");
    let (tmp, run) = run_copy("longformer");
    // the same tokenizer with `<pad>` an ordinary token
    let tokenizer = run.join("tokenizer.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&tokenizer).unwrap()).unwrap();
    let added = json["added_tokens"].as_array_mut().unwrap();
    let pad = added.iter_mut().find(|t| t["content"] == "<pad>").expect("RoBERTa's <pad>");
    pad["special"] = false.into();
    std::fs::write(&tokenizer, json.to_string()).unwrap();
    let e = format!("{:#}", hf::export(&run, &tmp.path().join("hf"), &Device::flex()).unwrap_err());
    assert!(e.contains("as longformer (it numbers positions from the padding token's id"), "{e}");
    assert!(!tmp.path().join("hf").exists());
}

#[test]
fn masked_fourier_recipe_exports_as_fnet() {
    masked_exported_as_transformers_scored_it("fnet", "FNetForMaskedLM");
}

/// What transformers computed with an exported encoder–decoder (the import fixtures'
/// `seq2seq_expectations`).
#[derive(Deserialize)]
struct Seq2SeqExpected {
    source_ids: Vec<u32>,
    target_ids: Vec<u32>,
    logprobs: Vec<f64>,
    greedy: Vec<u32>,
}

/// Exports encoder–decoder fixture `name` and checks it against its expected.json — the very
/// files transformers' `AutoModelForSeq2SeqLM` scored: the run scores each target token and the
/// end token as transformers did within 1e-4, decodes the source greedily to the same tokens (up
/// to the end token), and the export imported again is the run. Returns max |Δ log-prob|.
fn seq2seq_exported_as_transformers_scored_it(name: &str) -> f64 {
    let dir = fixture(name);
    let expected: Seq2SeqExpected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let device = Device::flex();
    let (tmp, out) = export_again(name);
    let run = Run::load(&dir, &device).unwrap();
    let scores: Vec<f64> =
        run.score_from(&expected.source_ids, &expected.target_ids).unwrap().tokens.iter().map(|t| t.logprob).collect();
    let worst = max_delta(&scores, &expected.logprobs);
    assert!(worst < 1e-4, "{name}: max |Δ log-prob| = {worst:e} against transformers");
    let cfg = SampleConfig::greedy(expected.greedy.len());
    let written = variorum_train::seq2seq::generate_from(&run.model, &expected.source_ids, &cfg, &device, |_| {});
    let end = run.model.end_token.unwrap() as u32;
    let until_end: Vec<u32> = expected.greedy.iter().copied().take_while(|&t| t != end).collect();
    assert_eq!(written, until_end, "{name}: greedy decode (KV cache) against transformers' generate");

    let back = tmp.path().join("back");
    hf::import(&out, &back, &device).unwrap_or_else(|e| panic!("{name}: importing the export: {e:#}"));
    let again = Run::load(&back, &device).unwrap();
    let rescored: Vec<f64> = again
        .score_from(&expected.source_ids, &expected.target_ids)
        .unwrap()
        .tokens
        .iter()
        .map(|t| t.logprob)
        .collect();
    let back_delta = max_delta(&rescored, &scores);
    assert!(back_delta < 1e-5, "{name}: export then import moved log-probs by {back_delta:e}");
    eprintln!("{name}: max |Δ log-prob| = {worst:.2e} against transformers, {back_delta:.2e} after import");
    worst
}

/// The T5 round trip: tests/fixtures/hf/t5_v1_1 imported, fine-tuned here on pairs (each
/// stack's one relative bias table trained as one, `shared = true`), exported as T5.
#[test]
fn an_imported_t5_fine_tuned_here_exports_as_t5_again() {
    seq2seq_exported_as_transformers_scored_it("t5");
}

/// T5's recipe trained here from scratch, one relative bias table per stack
/// (`shared = true`), its `</s>` an extra embedding row: exported as T5 with `</s>` a token of
/// the exported vocabulary (the row's id), which ends the targets and starts the decoder.
#[test]
fn the_t5_recipe_trained_from_scratch_exports_as_t5() {
    seq2seq_exported_as_transformers_scored_it("t5_scratch");
    let (_tmp, out) = export_again("t5_scratch");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    let tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer.json")).unwrap()).unwrap();
    let run = Run::load(&fixture("t5_scratch"), &Device::flex()).unwrap();
    let end = run.tokenizer.vocab_size();
    assert_eq!(config["vocab_size"], end + 1);
    for key in ["eos_token_id", "decoder_start_token_id", "pad_token_id"] {
        assert_eq!(config[key], end, "{key}");
    }
    let added = tokenizer["added_tokens"].as_array().unwrap();
    assert!(added.iter().any(|t| t["content"] == "</s>" && t["id"] == end), "{added:?}");
}

/// T5 v1.0 (a tied head read at 1/√d_model) imported and exported at once: every tensor
/// transformers' checkpoint had comes back with its values (bf16 widened exactly to f32), and
/// `config.json` says what the original's does; a run whose layers' relative bias tables have
/// parted is refused, as is a tied head without the factor.
#[test]
fn an_imported_t5_v1_0_exports_its_own_tensors_and_parted_tables_are_refused() {
    let device = Device::flex();
    let tmp = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/t5");
    let run = tmp.path().join("run");
    hf::import(&src, &run, &device).unwrap();
    let out = tmp.path().join("hf");
    hf::export(&run, &out, &device).unwrap();
    let original = std::fs::read(src.join("model.safetensors")).unwrap();
    let original = safetensors::SafeTensors::deserialize(&original).unwrap();
    let exported = std::fs::read(out.join("model.safetensors")).unwrap();
    let exported = safetensors::SafeTensors::deserialize(&exported).unwrap();
    let mut names: Vec<String> = original.names().into_iter().map(String::from).collect();
    let mut written: Vec<String> = exported.names().into_iter().map(String::from).collect();
    names.sort();
    written.sort();
    assert_eq!(written, names, "the export's tensors are the checkpoint's");
    for name in &names {
        let bf16: Vec<f32> = original
            .tensor(name)
            .unwrap()
            .data()
            .chunks(2)
            .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
            .collect();
        let f32s: Vec<f32> = exported
            .tensor(name)
            .unwrap()
            .data()
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(f32s, bf16, "{name}");
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    for key in ["d_kv", "num_layers", "num_decoder_layers", "feed_forward_proj", "relative_attention_num_buckets"] {
        assert_eq!(config[key], want[key], "{key}");
    }
    assert_eq!(
        (config["tie_word_embeddings"].clone(), config["scale_decoder_outputs"].clone()),
        (true.into(), true.into())
    );
    assert_eq!((config["eos_token_id"].clone(), config["decoder_start_token_id"].clone()), (1.into(), 0.into()));

    // one layer's table moved: no T5 computes that
    use burn::module::Module as _;
    let mut model = Run::load(&run, &device).unwrap().model;
    match &mut model.blocks[1].attn {
        variorum_attention::Attention::Full(a) => {
            let Some(variorum_position::RelativePosition::T5(t)) = &mut a.position else { panic!("a T5 table") };
            t.table = burn::module::Param::from_tensor(t.table.val().add_scalar(0.5));
        }
        _ => panic!("full attention"),
    }
    model.save_file(run.join("model.bpk")).unwrap();
    let e = format!("{:#}", hf::export(&run, &tmp.path().join("parted"), &device).unwrap_err());
    assert!(e.contains("relative_attention_bias") && e.contains("copies differ"), "{e}");
    assert!(!tmp.path().join("parted").exists());
}

/// A copy of the run of fixture `name`: `run` in a temporary directory.
fn run_copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), run.join(entry.file_name())).unwrap();
    }
    (tmp, run)
}

/// A copy of fixture `name` whose config.toml is changed by `edit`; its export must fail with a
/// message containing `says`, in one line, and leave nothing behind.
fn refused(name: &str, edit: impl FnOnce(&str) -> String, says: &str) {
    let (tmp, run) = run_copy(name);
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
    // T5: a head read at 1/√d_model is T5's tied one; this run's is its own
    refused(
        "t5",
        |c| c.replace("scale_head = false", "scale_head = true"),
        "model.tie_embeddings = false here, but T5ForConditionalGeneration computes model.tie_embeddings = true",
    );
    // T5's scores are unscaled in every attention, the cross-attention's included
    refused(
        "t5",
        |c| c.replacen("scaled = false", "scaled = true", 3).replacen("scaled = true", "scaled = false", 2),
        "model.cross_attention.scaled = (unset) here, but T5ForConditionalGeneration computes model.cross_attention.scaled = false",
    );
    // DeBERTa's position→content read at the paper's δ(j, i) (the default, unset): transformers reads δ(i, j)
    refused(
        "deberta",
        |c| c.replace("p2c_distance = \"query-minus-key\"\n", ""),
        "model.position.p2c_distance = (unset) here, but DebertaV2ForMaskedLM computes model.position.p2c_distance = \"query-minus-key\"",
    );
    // an out directory that exists is left alone
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("mine.txt"), "keep").unwrap();
    let e = hf::export(&fixture("gpt"), tmp.path(), &Device::flex()).unwrap_err().to_string();
    assert!(e.contains("exists"), "{e}");
    assert_eq!(std::fs::read_to_string(tmp.path().join("mine.txt")).unwrap(), "keep");
}
