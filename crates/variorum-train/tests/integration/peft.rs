//! LoRA adapters in Hugging Face PEFT's files, against PEFT 0.21.2 (tests/fixtures/peft/, made
//! by scripts/reference/make_peft_fixtures.py): adapters PEFT made on the transformers models of
//! tests/fixtures/hf, imported onto those models imported (`hf::import_adapters`), must compute
//! PEFT's logits; LoRA runs trained here, exported without `--merge`, must write the files PEFT
//! loaded, and compute the logits PEFT computed with them.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use variorum_train::hf;
use variorum_train::run::Run;

#[derive(Deserialize)]
struct Expected {
    ids: Vec<u32>,
    vocab: usize,
    logits: Vec<f32>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/peft").join(name)
}

fn expected(name: &str) -> Expected {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("expected.json")).unwrap()).unwrap()
}

/// `model` (a transformers model of tests/fixtures/hf) imported into `dir/base`.
fn base(model: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(model);
    let out = dir.join("base");
    hf::import(&src, &out, &Device::flex()).unwrap_or_else(|e| panic!("importing {model}: {e:#}"));
    out
}

/// The run's logits over `ids`, `[len, vocab]` row-major.
fn logits(run: &Path, ids: &[u32]) -> Vec<f32> {
    let device = Device::flex();
    let run = Run::load(run, &device).unwrap_or_else(|e| panic!("{}: {e:#}", run.display()));
    let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    let n = ids.len();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), &device);
    run.model.forward(tokens).logits.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn max_delta(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn sha256(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The adapter PEFT made on `model`, imported onto `model` imported: PEFT's logits within
/// 1e-4, and a moved model (the adapter is not a no-op). Returns the temporary directory, the
/// base and the LoRA run.
fn imported_computes_what_peft_computed(model: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let name = format!("{model}_from_peft");
    let want = expected(&name);
    let tmp = tempfile::tempdir().unwrap();
    let base = base(model, tmp.path());
    let run = tmp.path().join("lora");
    hf::import_adapters(&fixture(&name), &base, &run, &Device::flex()).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let got = logits(&run, &want.ids);
    assert_eq!(got.len(), want.ids.len() * want.vocab);
    let delta = max_delta(&got, &want.logits);
    assert!(delta < 1e-4, "{name}: max |Δ logit| = {delta:e} against PEFT");
    let moved = max_delta(&logits(&base, &want.ids), &want.logits);
    assert!(moved > 1e-2, "{name}: the adapter moves the logits by {moved} only");
    eprintln!("{name}: max |Δ logit| = {delta:.2e} against PEFT (the adapter moves them by {moved:.2})");
    (tmp, base, run)
}

/// Every projection of a LLaMA (q, k, v, o; gate, up, down) adapted by PEFT: read onto the
/// imported model, and written back as the same tensors (one module per projection here too).
#[test]
fn a_peft_adapter_on_llama_imports_computes_its_logits_and_exports_back_the_same() {
    let (tmp, base, run) = imported_computes_what_peft_computed("llama");
    let out = tmp.path().join("again");
    let done = hf::export_with(&run, &out, &Device::flex(), false).unwrap();
    assert!(done.adapters && done.class == "LlamaForCausalLM", "{done:?}");
    let read = |p: &Path| {
        let bytes = std::fs::read(p.join("adapter_model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut all: Vec<(String, Vec<usize>, Vec<u8>)> =
            st.tensors().into_iter().map(|(n, v)| (n, v.shape().to_vec(), v.data().to_vec())).collect();
        all.sort();
        all
    };
    let (theirs, ours) = (read(&fixture("llama_from_peft")), read(&out));
    let names = |t: &[(String, Vec<usize>, Vec<u8>)]| t.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&ours), names(&theirs), "the modules written");
    assert!(ours == theirs, "the factors written differ from PEFT's");
    let _ = base;
}

/// GPT-2: Conv1D layers (`fan_in_fan_out`), one `c_attn` for q | k | v, `c_proj` matching both
/// attention's output and the MLP's, and an `alpha_pattern` for `c_fc`. Written back, `c_attn`
/// becomes a rank-3r pair (q, k and v each with its own rank-r pair here) computing the same.
#[test]
fn a_peft_adapter_on_gpt2_imports_computes_its_logits_and_exports_back_what_computes_them() {
    let (tmp, base, run) = imported_computes_what_peft_computed("gpt2");
    let want = expected("gpt2_from_peft");
    let out = tmp.path().join("again");
    hf::export_with(&run, &out, &Device::flex(), false).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(config["fan_in_fan_out"], true);
    assert_eq!(config["rank_pattern"]["transformer.h.0.attn.c_attn"], 12, "{config}");
    let back = tmp.path().join("back");
    hf::import_adapters(&out, &base, &back, &Device::flex()).unwrap();
    let delta = max_delta(&logits(&back, &want.ids), &want.logits);
    assert!(delta < 1e-4, "exported and imported again: max |Δ logit| = {delta:e} against PEFT");
}

/// A LoRA run trained here, exported without --merge: the files PEFT was given, and PEFT's
/// logits within 1e-4.
fn exported_as_peft_loaded_it(model: &str) {
    let name = format!("{model}_export");
    let want = expected(&name);
    let all: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(&name).join("expected.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let base = base(model, tmp.path());
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    for f in ["config.toml", "tokenizer.json", "model.bpk"] {
        std::fs::copy(fixture(&name).join(f), run.join(f)).unwrap();
    }
    variorum_train::lora::record_base(&run, &base.join("model.bpk")).unwrap();
    let delta = max_delta(&logits(&run, &want.ids), &want.logits);
    assert!(delta < 1e-4, "{name}: max |Δ logit| = {delta:e} against PEFT");

    let out = tmp.path().join("adapter");
    hf::export_with(&run, &out, &Device::flex(), false).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    for (file, hash) in all["exported"].as_object().unwrap() {
        assert_eq!(sha256(&out.join(file)), hash.as_str().unwrap(), "{name}: {file} is not the file PEFT was given");
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json")).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("base_model_name_or_path");
    assert_eq!(config, all["adapter_config"], "{name}: adapter_config.json");
    eprintln!("{name}: max |Δ logit| = {delta:.2e} against PEFT");
}

/// LLaMA with every projection adapted: q, k, v as three modules, the rotary features of q and
/// k permuted to transformers' order in B's rows as in the weights.
#[test]
fn a_lora_run_on_llama_exports_as_the_adapter_peft_loads() {
    exported_as_peft_loaded_it("llama");
}

/// GPT-2 with q and v adapted: `c_attn` holds both, as one rank-2r pair with k's columns zero.
#[test]
fn a_lora_run_on_gpt2_exports_as_the_adapter_peft_loads() {
    exported_as_peft_loaded_it("gpt2");
}

/// What cannot be read is refused in one line naming it: an adapter for another model, one
/// computing what variorum's LoRA does not (DoRA), a directory without the factors, factors of
/// a shape no rank-r pair has.
#[test]
fn adapters_that_do_not_fit_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let base = base("llama", tmp.path());
    let device = Device::flex();
    let e = hf::import_adapters(&fixture("gpt2_from_peft"), &base, &tmp.path().join("a"), &device).unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("transformer.h.0.attn.c_attn") && e.contains("no projection"), "{e}");

    let dora = tmp.path().join("dora");
    std::fs::create_dir(&dora).unwrap();
    let config = std::fs::read_to_string(fixture("llama_from_peft").join("adapter_config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&config).unwrap();
    json["use_dora"] = true.into();
    std::fs::write(dora.join("adapter_config.json"), json.to_string()).unwrap();
    let e = format!("{:#}", hf::import_adapters(&dora, &base, &tmp.path().join("b"), &device).unwrap_err());
    assert!(e.contains("use_dora") && !e.contains('\n'), "{e}");

    json["use_dora"] = false.into();
    std::fs::write(dora.join("adapter_config.json"), json.to_string()).unwrap();
    let e = format!("{:#}", hf::import_adapters(&dora, &base, &tmp.path().join("c"), &device).unwrap_err());
    assert!(e.contains("adapter_model.safetensors") && !e.contains('\n'), "{e}");
    assert!(!tmp.path().join("c").exists() && !tmp.path().join("b").exists());

    // factors of a corrupt shape: a scalar A, and rank 0
    let q = "base_model.model.model.layers.0.self_attn.q_proj";
    for (a_shape, b_shape) in [(vec![], vec![16, 4]), (vec![0, 16], vec![16, 0])] {
        let bytes = |shape: &Vec<usize>| vec![0u8; 4 * shape.iter().product::<usize>()];
        let (a, b) = (bytes(&a_shape), bytes(&b_shape));
        let views = [
            (
                format!("{q}.lora_A.weight"),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, a_shape.clone(), &a).unwrap(),
            ),
            (
                format!("{q}.lora_B.weight"),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, b_shape.clone(), &b).unwrap(),
            ),
        ];
        safetensors::serialize_to_file(views, None, &dora.join("adapter_model.safetensors")).unwrap();
        let e = format!("{:#}", hf::import_adapters(&dora, &base, &tmp.path().join("d"), &device).unwrap_err());
        assert!(e.contains("q_proj's factors are") && !e.contains('\n'), "{a_shape:?}: {e}");
    }
}
