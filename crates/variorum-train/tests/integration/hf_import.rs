//! `variorum import` against transformers: tiny random Hugging Face models
//! (tests/fixtures/hf/, made by scripts/reference/make_hf_fixtures.py with transformers 5.24.0)
//! imported into run directories must tokenize the fixture's text to the same ids, give every
//! token the log-probability transformers gave it (fp32, eager attention) within 1e-4, and
//! continue a prompt greedily, on the cached decoding path, with the tokens transformers'
//! `generate` chose.

use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use serde::Deserialize;
use variorum_attention::Attention;
use variorum_train::generate::SampleConfig;
use variorum_train::hf;
use variorum_train::run::Run;

#[derive(Deserialize)]
struct Expected {
    text: String,
    ids: Vec<u32>,
    logprobs: Vec<f64>,
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy: Vec<u32>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(name)
}

/// Imports fixture `name` and checks it against its expected.json; returns max |Δ log-prob|.
fn equal_to_transformers(name: &str, class: &str) -> f64 {
    let src = fixture(name);
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(src.join("expected.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let device = Device::flex();
    let imported = hf::import(&src, &out, &device).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    assert_eq!(imported.class, class);
    let run = Run::load(&out, &device).unwrap();

    assert_eq!(run.encode_prompt(&expected.text).unwrap(), expected.ids, "{name}: token ids of the text");
    assert_eq!(run.encode_prompt(&expected.prompt).unwrap(), expected.prompt_ids, "{name}: token ids of the prompt");

    let scores = run.score(&expected.ids).unwrap();
    assert_eq!(scores.tokens.len(), expected.logprobs.len());
    let worst =
        scores.tokens.iter().zip(&expected.logprobs).map(|(t, want)| (t.logprob - want).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-4, "{name}: max |Δ log-prob| = {worst:e} against transformers");

    let cfg = SampleConfig::greedy(expected.greedy.len());
    let continued = run.generate(&expected.prompt_ids, &cfg, |_| {});
    assert_eq!(continued, expected.greedy, "{name}: greedy continuation (KV cache) against transformers' generate");
    eprintln!("{name}: max |Δ log-prob| = {worst:.2e} over {} tokens", expected.logprobs.len());
    worst
}

#[test]
fn gpt2_sharded_f32_equals_transformers() {
    equal_to_transformers("gpt2", "GPT2LMHeadModel");
}

#[test]
fn llama_bf16_untied_grouped_heads_equals_transformers() {
    equal_to_transformers("llama", "LlamaForCausalLM");
}

#[test]
fn opt_with_its_offset_position_table_equals_transformers() {
    equal_to_transformers("opt", "OPTForCausalLM");
}

#[test]
fn qwen2_with_qkv_biases_equals_transformers() {
    equal_to_transformers("qwen2", "Qwen2ForCausalLM");
}

#[test]
fn gpt_neox_parallel_partial_rotary_equals_transformers() {
    equal_to_transformers("gpt_neox", "GPTNeoXForCausalLM");
}

#[test]
fn mistral_f16_one_kv_head_equals_transformers() {
    equal_to_transformers("mistral", "MistralForCausalLM");
}

#[test]
fn phi_shared_norm_head_bias_equals_transformers() {
    equal_to_transformers("phi", "PhiForCausalLM");
}

#[test]
fn gptj_interleaved_partial_rotary_equals_transformers() {
    equal_to_transformers("gptj", "GPTJForCausalLM");
}

#[test]
fn bloom_alibi_six_heads_embedding_norm_equals_transformers() {
    equal_to_transformers("bloom", "BloomForCausalLM");
}

/// What transformers computed with a masked LM (make_hf_fixtures.py's `masked_expectations`).
#[derive(Deserialize)]
pub(crate) struct MaskedExpected {
    pub(crate) text: String,
    pub(crate) ids: Vec<u32>,
    pub(crate) masked_ids: Vec<u32>,
    pub(crate) mask_id: usize,
    pub(crate) logprobs: Vec<f64>,
    pub(crate) hidden: Vec<Vec<f64>>,
}

/// With `expected.masked_ids` as input: max |Δ| between the log-probability `run` gives each
/// position's own token and transformers', and between the encoder outputs.
pub(crate) fn mlm_deltas(run: &Run, expected: &MaskedExpected) -> (f64, f64) {
    let device = Device::flex();
    let len = expected.masked_ids.len();
    let ids: Vec<i64> = expected.masked_ids.iter().map(|&t| t as i64).collect();
    let out = run.model.forward(Tensor::<2, Int>::from_data(TensorData::new(ids, [1, len]), &device));
    let logprobs = log_softmax(out.logits, 2).into_data().convert::<f64>().try_to_vec::<f64>().unwrap();
    let vocab = logprobs.len() / len;
    let worst = (0..len)
        .map(|i| (logprobs[i * vocab + expected.ids[i] as usize] - expected.logprobs[i]).abs())
        .fold(0.0, f64::max);
    let hidden = out.features.into_data().convert::<f64>().try_to_vec::<f64>().unwrap();
    let want: Vec<f64> = expected.hidden.concat();
    assert_eq!(hidden.len(), want.len());
    (worst, hidden.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max))
}

/// Imports masked-LM fixture `name` and checks it against its expected.json: the text's ids,
/// the mask token, and, with every fourth token hidden, the log-probability each position gives
/// its own token and the encoder's output at every position. Returns the two max |Δ|.
fn masked_equal_to_transformers(name: &str, class: &str) -> (f64, f64) {
    let src = fixture(name);
    let expected: MaskedExpected =
        serde_json::from_str(&std::fs::read_to_string(src.join("expected.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let device = Device::flex();
    let imported = hf::import(&src, &out, &device).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    assert_eq!(imported.class, class);
    let run = Run::load(&out, &device).unwrap();
    assert_eq!(run.encode_prompt(&expected.text).unwrap(), expected.ids, "{name}: token ids of the text");
    assert_eq!(run.model.mask_token, Some(expected.mask_id), "{name}: the tokenizer's mask token");
    assert!(expected.masked_ids.contains(&(expected.mask_id as u32)));
    let (worst, hidden_worst) = mlm_deltas(&run, &expected);
    assert!(worst < 1e-4, "{name}: max |Δ log-prob| = {worst:e} against transformers' MLM logits");
    assert!(hidden_worst < 1e-4, "{name}: max |Δ hidden| = {hidden_worst:e} against transformers' last hidden state");
    let len = expected.ids.len();
    eprintln!("{name}: max |Δ log-prob| = {worst:.2e}, max |Δ hidden| = {hidden_worst:.2e} over {len} positions");
    (worst, hidden_worst)
}

#[test]
fn bert_masked_lm_equals_transformers() {
    masked_equal_to_transformers("bert", "BertForMaskedLM");
}

#[test]
fn roberta_with_its_offset_positions_equals_transformers() {
    masked_equal_to_transformers("roberta", "RobertaForMaskedLM");
}

/// Nyströmformer's approximation (4 landmarks over the text's 24 tokens, the authors'
/// pseudo-inverse start, a depthwise conv on V), not softmax attention: the mapping of every
/// setting shows.
#[test]
fn nystromformer_landmarks_pinv_and_conv_equal_transformers() {
    masked_equal_to_transformers("nystromformer", "NystromformerForMaskedLM");
}

/// DeBERTa v3's settings: disentangled attention (c2p and p2c) over logarithmic buckets that
/// the text reaches past, the relative table normed and read through the content projections
/// (`share_att_key`), no absolute positions, the original MLM head. Hub configs write
/// `pos_att_type` as one string (`"p2c|c2p"`): the same model.
#[test]
fn deberta_v2_disentangled_log_buckets_equal_transformers() {
    masked_equal_to_transformers("deberta_v2", "DebertaV2ForMaskedLM");
    let (tmp, src) = fixture_copy("deberta_v2");
    edit_config(&src, |c| _ = c.insert("pos_att_type".into(), "P2C| c2p".into()));
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    hf::import(&src, &a, &Device::flex()).unwrap();
    hf::import(&fixture("deberta_v2"), &b, &Device::flex()).unwrap();
    // the [model] table: from its header to [data]
    let model = |run: &Path| {
        let text = std::fs::read_to_string(run.join("config.toml")).unwrap();
        let start = text.find("[model]").unwrap();
        text[start..text.find("\n[data]").unwrap()].to_string()
    };
    assert_eq!(model(&a), model(&b));
}

/// What transformers computed with Longformer's global attention on some positions (the
/// fixture's `global_*` entries).
#[derive(Deserialize)]
struct GlobalExpected {
    global_positions: Vec<usize>,
    global_logprobs: Vec<f64>,
    global_hidden: Vec<Vec<f64>>,
}

/// Longformer: windows of 4 keys each way in the first layer and 8 in the second over a text
/// of 59 tokens, as transformers' masked LM computes it (no global attention); then, with
/// `model.attention.global = [0]` in the run's config, as transformers computes it with a
/// `global_attention_mask` on `<s>`: the checkpoint's global projections at work.
#[test]
fn longformer_windows_and_global_projections_equal_transformers() {
    masked_equal_to_transformers("longformer", "LongformerForMaskedLM");
    let src = fixture("longformer");
    let text = std::fs::read_to_string(src.join("expected.json")).unwrap();
    let mut expected: MaskedExpected = serde_json::from_str(&text).unwrap();
    let global: GlobalExpected = serde_json::from_str(&text).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let device = Device::flex();
    hf::import(&src, &out, &device).unwrap();
    let config = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(
        config.contains("layer_windows = [5, 9]") && config.contains("global_projections = \"separate\""),
        "{config}"
    );
    let positions = format!("{:?}", global.global_positions);
    let with_global = config.replace("[model.attention]\n", &format!("[model.attention]\nglobal = {positions}\n"));
    std::fs::write(out.join("config.toml"), with_global).unwrap();
    let run = Run::load(&out, &device).unwrap();
    (expected.logprobs, expected.hidden) = (global.global_logprobs, global.global_hidden);
    let (worst, hidden) = mlm_deltas(&run, &expected);
    assert!(
        worst < 1e-4 && hidden < 1e-4,
        "longformer, global {positions}: |Δ log-prob| = {worst:e}, |Δ hidden| = {hidden:e}"
    );
    eprintln!(
        "longformer with global attention on {positions}: max |Δ log-prob| = {worst:.2e}, max |Δ hidden| = {hidden:.2e}"
    );
}

/// BigBird's block-sparse attention as transformers computes it in eval mode: blocks of 2, one
/// each side, the first and last blocks global, 2 random blocks that are block 0 (its keys
/// counted three times), over a text of 31 tokens (the last block half padding in transformers);
/// and a text of 6 tokens, which transformers (and the import) attends to in full. A seeded
/// draw, or block 0 counted once, is another model.
#[test]
fn big_bird_block_sparse_attention_equals_transformers() {
    masked_equal_to_transformers("big_bird", "BigBirdForMaskedLM");
    let src = fixture("big_bird");
    let text = std::fs::read_to_string(src.join("expected.json")).unwrap();
    let expected: MaskedExpected = serde_json::from_str(&text).unwrap();
    let short: MaskedExpected =
        serde_json::from_value(serde_json::from_str::<serde_json::Value>(&text).unwrap()["short"].clone()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let device = Device::flex();
    hf::import(&src, &out, &device).unwrap();
    let config = std::fs::read_to_string(out.join("config.toml")).unwrap();
    for setting in
        ["kind = \"bigbird\"", "random_draw = \"first-block\"", "global_last_block = true", "full_up_to = 18"]
    {
        assert!(config.contains(setting), "{setting}: {config}");
    }
    let run = Run::load(&out, &device).unwrap();
    let (worst, hidden) = mlm_deltas(&run, &short);
    assert!(worst < 1e-4 && hidden < 1e-4, "big_bird, 6 tokens: |Δ log-prob| = {worst:e}, |Δ hidden| = {hidden:e}");
    eprintln!("big_bird, 6 tokens (full attention): max |Δ log-prob| = {worst:.2e}, max |Δ hidden| = {hidden:.2e}");
    // the settings matter: without them the text's log-probabilities move
    for (from, to) in [("random_draw = \"first-block\"", "random_draw = \"seeded\""), ("global_last_block = true", "")]
    {
        std::fs::write(out.join("config.toml"), config.replace(from, to)).unwrap();
        let other = Run::load(&out, &device).unwrap();
        let (worst, _) = mlm_deltas(&other, &expected);
        assert!(worst > 1e-3, "{from} → {to:?}: |Δ log-prob| = {worst:e}");
    }
}

/// Hands every LSH layer of `run` the rotations transformers drew (`json["rotations"]`,
/// `[heads, head_dim, rounds, buckets / 2]`, the same for every layer: transformers seeds its
/// draw with `hash_seed`). Returns how many layers took them.
pub(crate) fn draw_as_transformers(run: &mut Run, json: &serde_json::Value) -> usize {
    let values: Vec<f32> = json["rotations"]
        .as_array()
        .expect("expected.json records the rotations")
        .iter()
        .flat_map(|h| h.as_array().unwrap().iter())
        .flat_map(|d| d.as_array().unwrap().iter())
        .flat_map(|r| r.as_array().unwrap().iter())
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let mut layers = 0;
    for block in run.model.blocks.iter_mut() {
        if let Attention::Lsh(lsh) = &mut block.attn {
            let shape = [lsh.n_heads, lsh.head_dim, lsh.rounds, lsh.buckets / 2];
            let drawn = Tensor::<4>::from_data(TensorData::new(values.clone(), shape), &Device::flex());
            lsh.rotations = Some(Param::from_tensor(drawn).set_require_grad(false));
            layers += 1;
        }
    }
    layers
}

/// transformers' Reformer: local layers (chunks of 4 seeing one chunk each way, wrapping
/// around) and LSH layers (4 buckets, 2 rounds, chunks of 8 over both rounds' orders) in turn,
/// axial positions, reversible blocks whose streams are concatenated; the text's 59 tokens
/// padded to 64 inside each layer as transformers pads the input, the padding hashed apart. The
/// LSH layers get the rotations transformers drew (from `hash_seed`); with variorum's own draw
/// the log-probabilities move. A 6-token text: local chunks over a padded 8, LSH in full.
#[test]
fn reformer_local_and_lsh_layers_equal_transformers_with_its_rotations() {
    let src = fixture("reformer");
    let text = std::fs::read_to_string(src.join("expected.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let expected: MaskedExpected = serde_json::from_value(json.clone()).unwrap();
    let short: MaskedExpected = serde_json::from_value(json["short"].clone()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let device = Device::flex();
    let imported = hf::import(&src, &out, &device).unwrap_or_else(|e| panic!("reformer: {e:#}"));
    assert_eq!(imported.class, "ReformerForMaskedLM");
    let config = std::fs::read_to_string(out.join("config.toml")).unwrap();
    for setting in
        ["kind = \"interleaved\"", "wrap = true", "layout = \"transformers\"", "merge = \"concat\"", "pad_to = 8"]
    {
        assert!(config.contains(setting), "{setting}: {config}");
    }
    let mut run = Run::load(&out, &device).unwrap();
    assert_eq!(run.encode_prompt(&expected.text).unwrap(), expected.ids, "reformer: token ids of the text");
    let seeded = mlm_deltas(&run, &expected).0;
    assert_eq!(draw_as_transformers(&mut run, &json), 2, "LSH layers");
    for (what, expected) in [("59 tokens", &expected), ("6 tokens", &short)] {
        let (worst, hidden) = mlm_deltas(&run, expected);
        assert!(worst < 1e-4 && hidden < 1e-4, "reformer, {what}: |Δ log-prob| = {worst:e}, |Δ hidden| = {hidden:e}");
        eprintln!("reformer, {what}: max |Δ log-prob| = {worst:.2e}, max |Δ hidden| = {hidden:.2e}");
    }
    // the rotations matter: variorum's own draw hashes differently
    assert!(seeded > 1e-3, "variorum's seeded rotations: |Δ log-prob| = {seeded:e}");
    eprintln!("reformer with variorum's own rotations: max |Δ log-prob| = {seeded:.2e}");
}

#[test]
fn fnet_fourier_mixing_with_its_embedding_projection_equals_transformers() {
    masked_equal_to_transformers("fnet", "FNetForMaskedLM");
}

/// What transformers computed with an encoder–decoder (make_hf_fixtures.py's
/// `seq2seq_expectations`).
#[derive(Deserialize)]
struct Seq2SeqExpected {
    source: String,
    source_ids: Vec<u32>,
    target: String,
    target_ids: Vec<u32>,
    logprobs: Vec<f64>,
    greedy: Vec<u32>,
}

/// Imports encoder–decoder fixture `name` and checks it against its expected.json: the ids of
/// the source (with the `</s>` T5's tokenizer appends) and the target (without), the
/// log-probability of every target token and of the end token after it given the source (as
/// `variorum score --source` computes them), and the greedy decode of the source through the
/// KV cache, up to the first end token, where variorum's stops. Returns max |Δ log-prob|.
fn seq2seq_equal_to_transformers(name: &str) -> f64 {
    let src = fixture(name);
    let expected: Seq2SeqExpected =
        serde_json::from_str(&std::fs::read_to_string(src.join("expected.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let device = Device::flex();
    let imported = hf::import(&src, &out, &device).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    assert_eq!(imported.class, "T5ForConditionalGeneration");
    let run = Run::load(&out, &device).unwrap();
    assert_eq!((run.model.start_token, run.model.end_token), (Some(0), Some(1)), "{name}: <pad> starts, </s> ends");

    assert_eq!(run.tokenizer.encode_prompt(&expected.source).unwrap(), expected.source_ids, "{name}: source ids");
    assert_eq!(run.tokenizer.encode(&expected.target).unwrap(), expected.target_ids, "{name}: target ids");
    let scores = run.score_from(&expected.source_ids, &expected.target_ids).unwrap();
    assert_eq!(scores.tokens.len(), expected.logprobs.len());
    assert_eq!(scores.tokens.last().unwrap().token, 1, "{name}: the end token is scored last");
    let worst =
        scores.tokens.iter().zip(&expected.logprobs).map(|(t, want)| (t.logprob - want).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-4, "{name}: max |Δ log-prob| = {worst:e} against transformers");

    let cfg = SampleConfig::greedy(expected.greedy.len());
    let written = variorum_train::seq2seq::generate_from(&run.model, &expected.source_ids, &cfg, &device, |_| {});
    let until_end: Vec<u32> = expected.greedy.iter().copied().take_while(|&t| t != 1).collect();
    assert!(until_end.len() >= 16, "{name}: the fixture's greedy decode ends early ({until_end:?})");
    assert_eq!(written, until_end, "{name}: greedy decode (KV cache) against transformers' generate");
    eprintln!("{name}: max |Δ log-prob| = {worst:.2e} over {} tokens", expected.logprobs.len());
    worst
}

#[test]
fn t5_v1_0_relu_tied_scaled_head_equals_transformers() {
    seq2seq_equal_to_transformers("t5");
}

#[test]
fn t5_v1_1_gated_gelu_own_head_equals_transformers() {
    seq2seq_equal_to_transformers("t5_v1_1");
}

/// The keys Google's T5 configs on the Hub carry from older transformers (`output_past`,
/// `gradient_checkpointing`, `task_specific_params`, `n_positions`, no `feed_forward_proj`)
/// change nothing: the import reads them, the context from `n_positions`.
#[test]
fn t5_configs_of_older_transformers_import() {
    let (tmp, src) = fixture_copy("t5");
    edit_config(&src, |c| {
        c.remove("feed_forward_proj");
        c.remove("scale_decoder_outputs");
        for (k, v) in [
            ("output_past", serde_json::json!(true)),
            ("gradient_checkpointing", serde_json::json!(false)),
            ("n_positions", serde_json::json!(96)),
            ("task_specific_params", serde_json::json!({"summarization": {"prefix": "summarize: "}})),
        ] {
            c.insert(k.into(), v);
        }
    });
    let out = tmp.path().join("run");
    hf::import(&src, &out, &Device::flex()).unwrap_or_else(|e| panic!("{e:#}"));
    let run = Run::load(&out, &Device::flex()).unwrap();
    let m = &run.config.model;
    assert_eq!((m.seq_len, m.scale_head, m.feed_forward.kind.name()), (96, true, "relu"));
}

#[test]
fn an_existing_out_directory_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("mine.txt"), "keep").unwrap();
    let e = hf::import(&fixture("gpt2"), tmp.path(), &Device::flex()).unwrap_err().to_string();
    assert!(e.contains("exists"), "{e}");
    assert_eq!(std::fs::read_to_string(tmp.path().join("mine.txt")).unwrap(), "keep");
}

/// A copy of fixture `name` in `src` of a temporary directory (returned with it).
fn fixture_copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), src.join(entry.file_name())).unwrap();
    }
    (tmp, src)
}

/// A copy of fixture `name` in a temporary directory, changed by `edit`; the import of it must
/// fail with a message containing `says`, and leave no run behind.
fn refused(name: &str, edit: impl FnOnce(&Path), says: &str) {
    let (tmp, src) = fixture_copy(name);
    edit(&src);
    let out = tmp.path().join("run");
    let e = format!("{:#}", hf::import(&src, &out, &Device::flex()).unwrap_err());
    assert!(e.contains(says), "expected {says:?} in: {e}");
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(!out.exists(), "a refused import left {}", out.display());
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["src"], "nothing half-written beside the run");
}

fn edit_config(src: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = src.join("config.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(json.as_object_mut().unwrap());
    std::fs::write(&path, json.to_string()).unwrap();
}

#[test]
fn bad_model_directories_are_refused_in_one_line() {
    refused("llama", |s| std::fs::write(s.join("config.json"), "{ not json").unwrap(), "is not JSON");
    refused(
        "llama",
        |s| edit_config(s, |c| _ = c.insert("model_type".into(), "mamba".into())),
        "model_type = \"mamba\" is not supported",
    );
    refused(
        "llama",
        |s| {
            edit_config(s, |c| {
                _ = c.insert("rope_scaling".into(), serde_json::json!({"type": "linear", "factor": 2.0}))
            })
        },
        "rope_scaling",
    );
    refused("llama", |s| edit_config(s, |c| _ = c.insert("some_new_switch".into(), true.into())), "some_new_switch");
    refused("llama", |s| edit_config(s, |c| _ = c.insert("hidden_size".into(), 64.into())), "shape");
    refused("llama", |s| edit_config(s, |c| _ = c.insert("vocab_size".into(), 100.into())), "do not belong together");
    refused(
        "llama",
        |s| {
            let f = s.join("model.safetensors");
            let bytes = std::fs::read(&f).unwrap();
            std::fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
        },
        "truncated",
    );
    refused(
        "gpt2",
        |s| std::fs::remove_file(s.join("model-00002-of-00003.safetensors")).unwrap(),
        "listed in the index but absent",
    );
    refused("gpt2", |s| std::fs::remove_file(s.join("tokenizer.json")).unwrap(), "tokenizer.json not found");
    // integers where weights belong
    refused(
        "opt",
        |s| {
            let f = s.join("model.safetensors");
            let bytes = std::fs::read(&f).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let int = "model.decoder.layers.0.fc1.bias";
            let owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
                .tensors()
                .into_iter()
                .map(|(n, v)| {
                    let data = match n == int {
                        true => (0..v.shape().iter().product::<usize>()).flat_map(|_| 7i64.to_le_bytes()).collect(),
                        false => v.data().to_vec(),
                    };
                    let dtype = if n == int { safetensors::Dtype::I64 } else { v.dtype() };
                    (n, dtype, v.shape().to_vec(), data)
                })
                .collect();
            let views: Vec<(&str, safetensors::tensor::TensorView)> = owned
                .iter()
                .map(|(n, d, sh, b)| (n.as_str(), safetensors::tensor::TensorView::new(*d, sh.clone(), b).unwrap()))
                .collect();
            safetensors::serialize_to_file(views, None, &f).unwrap();
        },
        "model.safetensors is I64: expected f32, bf16, f16 or f64",
    );
    // settings of the newer architectures that variorum cannot compute
    refused("phi", |s| edit_config(s, |c| _ = c.insert("qk_layernorm".into(), true.into())), "qk_layernorm = true");
    refused(
        "bloom",
        |s| edit_config(s, |c| _ = c.insert("apply_residual_connection_post_layernorm".into(), true.into())),
        "apply_residual_connection_post_layernorm = true",
    );
    refused("gptj", |s| edit_config(s, |c| _ = c.insert("rotary_dim".into(), 5.into())), "rotary_dim = 5");
    refused("bert", |s| edit_config(s, |c| _ = c.insert("is_decoder".into(), true.into())), "is_decoder = true");
    refused(
        "bert",
        |s| edit_config(s, |c| _ = c.insert("position_embedding_type".into(), "relative_key".into())),
        "position_embedding_type = \"relative_key\"",
    );
    for (key, value, says) in [
        ("position_biased_input", serde_json::json!(true), "position_biased_input = true"),
        ("conv_kernel_size", serde_json::json!(3), "conv_kernel_size = 3"),
        ("pos_att_type", serde_json::json!(["c2p"]), "pos_att_type = [\"c2p\"]"),
        ("norm_rel_ebd", serde_json::json!("layer_norm|other"), "norm_rel_ebd"),
        ("type_vocab_size", serde_json::json!(2), "type_vocab_size = 2"),
    ] {
        refused("deberta_v2", |s| edit_config(s, |c| _ = c.insert(key.into(), value)), says);
    }
    refused(
        "longformer",
        |s| edit_config(s, |c| _ = c.insert("attention_window".into(), 7.into())),
        "attention_window = 7",
    );
    refused(
        "longformer",
        |s| edit_config(s, |c| _ = c.insert("attention_window".into(), serde_json::json!([8]))),
        "lists 1 widths for 2 layers",
    );
    for (key, value, says) in [
        ("attention_type", serde_json::json!("sliding"), "attention_type = \"sliding\" is not supported"),
        ("use_bias", serde_json::json!(false), "use_bias = false"),
        ("block_size", serde_json::json!(0), "block_size = 0"),
    ] {
        refused("big_bird", |s| edit_config(s, |c| _ = c.insert(key.into(), value)), says);
    }
    refused(
        "fnet",
        |s| edit_config(s, |c| _ = c.insert("use_tpu_fourier_optimizations".into(), true.into())),
        "use_tpu_fourier_optimizations = true",
    );
    refused(
        "t5",
        |s| edit_config(s, |c| _ = c.insert("feed_forward_proj".into(), "gated-relu".into())),
        "feed_forward_proj = \"gated-relu\" is not supported",
    );
    refused(
        "t5",
        |s| edit_config(s, |c| _ = c.insert("is_encoder_decoder".into(), false.into())),
        "is_encoder_decoder",
    );
    // an end token past the vocabulary
    refused("t5", |s| edit_config(s, |c| _ = c.insert("eos_token_id".into(), 500.into())), "model.end_token = 500");
    // a masked model whose tokenizer has no mask token
    refused(
        "roberta",
        |s| {
            let f = s.join("tokenizer_config.json");
            let text = std::fs::read_to_string(&f).unwrap().replace("<mask>", "<hidden>");
            std::fs::write(&f, text).unwrap();
        },
        "no mask token \"<hidden>\"",
    );
    // a head bias the mapping expects and the file lacks
    refused(
        "phi",
        |s| {
            let f = s.join("model.safetensors");
            let bytes = std::fs::read(&f).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let views: Vec<(String, safetensors::tensor::TensorView)> =
                st.tensors().into_iter().filter(|(n, _)| n != "lm_head.bias").collect();
            safetensors::serialize_to_file(views, None, &f).unwrap();
        },
        "lm_head.bias",
    );
    // 30 wide in 4 heads: the user's config, not the mapping, is what fails
    refused(
        "gpt2",
        |s| edit_config(s, |c| _ = c.insert("n_embd".into(), 30.into())),
        "describes a model variorum refuses",
    );
}
