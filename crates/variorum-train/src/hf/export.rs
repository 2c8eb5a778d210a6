//! Variorum runs out: [`export`] writes a run as a Hugging Face model directory that
//! transformers' `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load
//! (`config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`).
//!
//! No mapping is written twice. Each architecture says how a run's model is described in its
//! `config.json` (`config_json` in its file); that description is then read back by the very
//! mapping the import uses, and the run is exported only if what comes back is the run's own
//! `[model]`: any setting the architecture cannot express (another attention kind, post-LN, a
//! memory, …) is refused naming it. The weights are the import's recipes run backwards
//! (`Recipe::invert`).
//!
//! Two differences are bridged exactly rather than refused: rotary embeddings that pair
//! dimensions `(2k, 2k+1)` (`layout = "interleaved"`) are written for transformers' rotate-half
//! pairs `(k, k + d/2)` by permuting the query and key projections' output features within each
//! head (the same permutation on q and k leaves every score as it was), and dropout rates the
//! architecture has no place for are left out (they do not change what the model computes).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use burn::prelude::*;
use burn::store::ModuleSnapshot;
use serde_json::{Map, Value};
use variorum_model::{ModelConfig, ObjectiveConfig};
use variorum_position::PositionConfig;

use super::checkpoint::Checkpoint;
use super::config::HfConfig;
use super::{Mapping, bert, bloom, deberta_v2, gpt_neox, gpt2, gptj, llama, phi, reformer, t5};
use crate::run::Run;

/// What [`export`] wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    /// The model directory.
    pub out: PathBuf,
    /// The transformers class it loads as (`GPT2LMHeadModel`).
    pub class: &'static str,
    /// Tensors written.
    pub tensors: usize,
    /// Parameters.
    pub params: usize,
    /// Whether what was written is a LoRA run's adapters alone, in PEFT's files
    /// (`adapter_config.json`, `adapter_model.safetensors`), for the base exported as `class`.
    pub adapters: bool,
}

/// An architecture runs are exported as: the `config.json` describing a run's model, for the
/// runs of its family (told apart by the position scheme), and the mapping that reads it.
struct Target {
    model_type: &'static str,
    position: &'static str,
    /// A masked language model (BERT), for runs of the masked objective.
    masked: bool,
    config_json: fn(&Value) -> Map<String, Value>,
    map: fn(&mut HfConfig, &Checkpoint) -> Result<Mapping>,
    /// Numbers positions from the padding token's id (RoBERTa's embeddings): the run's
    /// tokenizer must name one, which `config_json` reads as `pad_token_id`.
    pads: bool,
}

const TARGETS: &[Target] = &[
    Target {
        model_type: "gpt2",
        position: "learned",
        masked: false,
        config_json: gpt2::config_json,
        map: gpt2::map,
        pads: false,
    },
    Target {
        model_type: "bert",
        position: "learned",
        masked: true,
        config_json: bert::config_json,
        map: bert::map,
        pads: false,
    },
    Target {
        model_type: "fnet",
        position: "learned",
        masked: true,
        config_json: bert::fnet_config_json,
        map: bert::map,
        pads: false,
    },
    Target {
        model_type: "nystromformer",
        position: "learned",
        masked: true,
        config_json: bert::nystromformer_config_json,
        map: bert::map,
        pads: false,
    },
    // after BERT: full attention exports as BigBird only with its rescaled embeddings
    Target {
        model_type: "big_bird",
        position: "learned",
        masked: true,
        config_json: bert::big_bird_config_json,
        map: bert::map,
        pads: false,
    },
    Target {
        model_type: "longformer",
        position: "learned",
        masked: true,
        config_json: bert::longformer_config_json,
        map: bert::map,
        pads: true,
    },
    Target {
        model_type: "deberta-v2",
        position: "deberta",
        masked: true,
        config_json: deberta_v2::config_json,
        map: deberta_v2::map,
        pads: false,
    },
    Target {
        model_type: "llama",
        position: "rope",
        masked: false,
        config_json: llama::config_json,
        map: llama::map,
        pads: false,
    },
    Target {
        model_type: "gpt_neox",
        position: "rope",
        masked: false,
        config_json: gpt_neox::config_json,
        map: gpt_neox::map,
        pads: false,
    },
    Target {
        model_type: "gptj",
        position: "rope",
        masked: false,
        config_json: gptj::config_json,
        map: gptj::map,
        pads: false,
    },
    Target {
        model_type: "phi",
        position: "rope",
        masked: false,
        config_json: phi::config_json,
        map: phi::map,
        pads: false,
    },
    Target {
        model_type: "bloom",
        position: "alibi",
        masked: false,
        config_json: bloom::config_json,
        map: bloom::map,
        pads: false,
    },
    Target { model_type: "t5", position: "t5", masked: false, config_json: t5::config_json, map: t5::map, pads: false },
    Target {
        model_type: "reformer",
        position: "axial",
        masked: true,
        config_json: reformer::config_json,
        map: reformer::map,
        pads: false,
    },
];

/// How a run is written: the architecture's `config.json`, the mapping of its tensors, the
/// rotary features to reorder, the special tokens added to its vocabulary, and its mask token.
struct Chosen {
    json: Map<String, Value>,
    mapping: Mapping,
    rotary: Option<RotaryPairs>,
    added: Vec<(usize, &'static str)>,
    mask_token: Option<usize>,
}

/// The first architecture `run` (read from `run_dir`) reads back as, and how it is written
/// there (`out`: where `config.json` will be, for messages); a refusal naming every candidate's
/// first difference when none does.
fn choose(run: &Run, run_dir: &Path, out: &Path) -> Result<Chosen> {
    let mut ours = run.config.model.clone();
    ours.resolve(run.tokenizer.vocab_size())?;
    // special tokens that are extra rows here become tokens of the exported vocabulary: a
    // masked model's mask row `[MASK]`, an encoder–decoder's end row `</s>` (which also starts
    // the decoder unless model.start_token names another)
    let mut added: Vec<(usize, &'static str)> = Vec::new();
    let text_vocab = ours.vocab_size.unwrap_or_default();
    let end_row = ours.is_encoder_decoder() && ours.end_token.is_none();
    match &mut ours.objective {
        ObjectiveConfig::Masked(m) if m.mask_token.is_none() => {
            m.mask_token = Some(text_vocab);
            added.push((text_vocab, MASK));
        }
        ObjectiveConfig::Causal if end_row => {
            ours.end_token = Some(text_vocab);
            ours.start_token = ours.start_token.or(Some(text_vocab));
            added.push((text_vocab, END));
        }
        _ => {}
    }
    ours.vocab_size = Some(text_vocab + added.len());
    // T5's one relative table per stack: a run with a table per layer is described as sharing
    // them, and written if its layers' tables agree (an imported T5 fine-tuned with its tables
    // frozen; `one_per_name` refuses it otherwise)
    if let PositionConfig::T5(t) = &mut ours.position {
        t.shared = true;
    }
    let mask_token = ours.mask_token();
    let ours = ours.expanded();
    let described = serde_json::to_value(&ours)?;
    let position = described["position"]["kind"].as_str().unwrap_or_default();
    let masked = mask_token.is_some();
    let candidates: Vec<&Target> = TARGETS.iter().filter(|t| t.position == position && t.masked == masked).collect();
    if candidates.is_empty() {
        let known: Vec<String> = TARGETS
            .iter()
            .map(|t| format!("{} ({} positions{})", t.model_type, t.position, if t.masked { ", masked" } else { "" }))
            .collect();
        let objective = if masked { " under the masked objective" } else { "" };
        bail!(
            "{}: model.position.kind = {position:?}{objective}: no Hugging Face architecture variorum exports to has it ({})",
            run_dir.display(),
            known.join(", ")
        );
    }
    // the first architecture that reads back as the run; else every one's first difference
    let mut refusals = Vec::new();
    let mut found = None;
    let pad = padding_token(&run.dir);
    for target in candidates {
        let mut described = described.clone();
        if target.pads {
            let Some(pad) = pad else {
                refusals.push(format!(
                    "as {} (it numbers positions from the padding token's id, and this run's tokenizer names none among its added tokens)",
                    target.model_type
                ));
                continue;
            };
            described["pad_token_id"] = pad.into();
        }
        let mut json = (target.config_json)(&described);
        json.insert("model_type".into(), target.model_type.into());
        let mut hf = HfConfig::from_map(out.join("config.json"), json.clone(), mask_token);
        // a description the mapping cannot read (a key the run has no value for) is a refusal
        // of this architecture, not of the run
        let mapping = match (target.map)(&mut hf, &Checkpoint::empty()) {
            Ok(mapping) => mapping,
            Err(e) => {
                refusals.push(format!("as {} ({e})", target.model_type));
                continue;
            }
        };
        hf.finish(mapping.class)?;
        match same_model(&ours, &mapping)? {
            Ok(rotary) => {
                found = Some((json, mapping, rotary));
                break;
            }
            Err(difference) => refusals.push(format!("as {} {difference}", mapping.class)),
        }
    }
    let Some((mut json, mapping, rotary)) = found else {
        bail!("{}: cannot be exported {}", run_dir.display(), refusals.join(", nor "));
    };
    json.insert("architectures".into(), Value::Array(vec![mapping.class.into()]));
    json.insert("dtype".into(), "float32".into());
    // transformers' defaults (GPT-2's 50256) would name tokens the vocabulary may not have: the
    // ids an imported run brought (generation_config.json), or none
    let generation = std::fs::read_to_string(run_dir.join("generation_config.json")).ok();
    let generation: Map<String, Value> = generation.and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        // an architecture that computes with an id (T5's end token) has written it already
        if json.get(key).is_none_or(Value::is_null) {
            json.insert(key.into(), generation.get(key).cloned().unwrap_or(Value::Null));
        }
    }
    // Reformer pads a text to a multiple of its chunks with this id (any: a padded position is
    // hidden from every real one), and fails without one
    if mapping.class == "ReformerForMaskedLM" && json["pad_token_id"].is_null() {
        json.insert("pad_token_id".into(), 0.into());
    }

    Ok(Chosen { json, mapping, rotary, added, mask_token })
}

/// The mapping `run` (read from `run_dir`) is exported by, and its rotary features to reorder:
/// how its tensors are named in the Hugging Face architecture it reads back as.
pub(super) fn mapping_of(run: &Run, run_dir: &Path) -> Result<(Mapping, Option<RotaryPairs>)> {
    let chosen = choose(run, run_dir, &run_dir.join("hf"))?;
    Ok((chosen.mapping, chosen.rotary))
}

/// Writes the run `run_dir` as the Hugging Face model directory `out`, which must not exist;
/// like [`super::import`], the directory is written under a temporary name and renamed into
/// place when complete. Loads the run on `device`.
pub fn export(run_dir: &Path, out: &Path, device: &Device) -> Result<Exported> {
    export_with(run_dir, out, device, false)
}

/// [`export`], with a LoRA run's adapters merged into its base when `merge`
/// ([`crate::lora::for_export`]).
pub fn export_with(run_dir: &Path, out: &Path, device: &Device, merge: bool) -> Result<Exported> {
    if out.exists() {
        bail!("{} exists: give --out a directory that does not exist yet", out.display());
    }
    let run = Run::load(run_dir, device)?;
    // a LoRA run without --merge is written as its adapters in PEFT's files
    let adapters_only = run.config.train.lora.is_some() && !merge;
    let run = if adapters_only { run } else { crate::lora::for_export(run, merge)? };
    let Chosen { json, mapping, rotary, added, mask_token } = choose(&run, run_dir, out)?;
    let staging = super::staging_dir(out, "exporting")?;
    let result = match adapters_only {
        true => super::peft::write(&staging, &run, &mapping, rotary.as_ref()),
        false => write_model(&staging, &run, &json, &mapping, rotary.as_ref(), &added, mask_token),
    };
    match result {
        Ok((tensors, params)) => {
            std::fs::rename(&staging, out)
                .with_context(|| format!("cannot move {} to {}", staging.display(), out.display()))?;
            Ok(Exported { out: out.to_path_buf(), class: mapping.class, tensors, params, adapters: adapters_only })
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// The id of the padding token `run_dir`'s tokenizer has, if any: the `pad_token` an imported
/// run's `tokenizer_config.json` or `special_tokens_map.json` names, else the one
/// `tokenizer.json`'s padding settings name, else a special added token called `<pad>` or
/// `[PAD]` (a run fine-tuned from an import keeps only its `tokenizer.json`) — always one of
/// `tokenizer.json`'s added tokens, which no text encodes to.
fn padding_token(run_dir: &Path) -> Option<usize> {
    let read =
        |name: &str| -> Option<Value> { serde_json::from_str(&std::fs::read_to_string(run_dir.join(name)).ok()?).ok() };
    let tokenizer = read("tokenizer.json")?;
    let named = ["tokenizer_config.json", "special_tokens_map.json"]
        .iter()
        .find_map(|f| {
            let pad = read(f)?.get("pad_token")?.clone();
            pad.as_str().map(String::from).or_else(|| pad["content"].as_str().map(String::from))
        })
        .or_else(|| tokenizer["padding"]["pad_token"].as_str().map(String::from));
    let added = tokenizer["added_tokens"].as_array()?;
    let token = match named {
        Some(name) => added.iter().find(|t| t["content"].as_str() == Some(&name))?,
        None => added.iter().find(|t| {
            t["special"].as_bool() == Some(true) && matches!(t["content"].as_str(), Some("<pad>" | "[PAD]"))
        })?,
    };
    token["id"].as_u64().map(|id| id as usize)
}

/// The name an exported masked model's mask token is given when the run's was an extra row.
const MASK: &str = "[MASK]";

/// The name an exported encoder–decoder's end token is given when the run's was an extra row
/// (T5's).
const END: &str = "</s>";

/// Rotary features stored in interleaved pairs, to be written in rotate-half order.
pub(super) struct RotaryPairs {
    head_dim: usize,
    /// The rotated part of each head (its first features).
    rotary_dim: usize,
    /// Query and key features of the fused projection (all heads): the first ones of its output.
    qk_features: usize,
    /// All its output features (q, k, v).
    width: usize,
}

/// Whether the mapping reads the exported `config.json` back as the run's own model, with the
/// differences export bridges: `Ok` with the rotary features to reorder, if any, or `Err` with
/// the first setting that differs.
fn same_model(ours: &ModelConfig, mapping: &Mapping) -> Result<std::result::Result<Option<RotaryPairs>, String>> {
    let mut theirs: ModelConfig = mapping
        .model
        .clone()
        .try_into()
        .map_err(|e| anyhow!("the {} mapping writes a [model] variorum refuses (a bug): {e}", mapping.class))?;
    theirs.resolve(ours.vocab_size.unwrap_or_default())?;
    let mut theirs = toml::Value::try_from(theirs.expanded())?;
    let mut ours_toml = toml::Value::try_from(ours)?;
    for key in ["init_std", "dropout"] {
        if let (Some(t), Some(o)) = (theirs.as_table_mut(), ours_toml.get(key)) {
            t.insert(key.into(), o.clone());
        }
    }
    let refusal = |(key, here, there): (String, String, String)| {
        Ok(Err(format!("({key} = {here} here, but {} computes {key} = {there})", mapping.class)))
    };
    // the same layout as the architecture's (GPT-J pairs (2k, 2k+1) as variorum's interleaved)
    let Some(difference) = first_difference("model", &ours_toml, &theirs) else { return Ok(Ok(None)) };
    let interleaved =
        ours_toml.get("position").and_then(|p| p.get("layout")).and_then(toml::Value::as_str) == Some("interleaved");
    if !interleaved {
        return refusal(difference);
    }
    ours_toml["position"]["layout"] = "rotate-half".into();
    if let Some(difference) = first_difference("model", &ours_toml, &theirs) {
        return refusal(difference);
    }
    let rotary = {
        let int = |v: Option<&toml::Value>| v.and_then(toml::Value::as_integer).unwrap_or(0) as usize;
        let attention = ours_toml.get("attention");
        let field = |k: &str| int(attention.and_then(|a| a.get(k)));
        let (heads, kv, head_dim) = (field("n_heads"), field("n_kv_heads"), field("head_dim"));
        let rotary_dim = ours_toml.get("position").and_then(|p| p.get("rotary_dim")).map_or(head_dim, |v| int(Some(v)));
        RotaryPairs { head_dim, rotary_dim, qk_features: (heads + kv) * head_dim, width: (heads + 2 * kv) * head_dim }
    };
    Ok(Ok(Some(rotary)))
}

/// The first key whose values differ between two TOML trees: (path, ours, theirs).
fn first_difference(path: &str, a: &toml::Value, b: &toml::Value) -> Option<(String, String, String)> {
    match (a, b) {
        (toml::Value::Table(ta), toml::Value::Table(tb)) => {
            let keys: std::collections::BTreeSet<&String> = ta.keys().chain(tb.keys()).collect();
            keys.into_iter().find_map(|k| match (ta.get(k), tb.get(k)) {
                (Some(x), Some(y)) => first_difference(&format!("{path}.{k}"), x, y),
                (x, y) => {
                    let show = |v: Option<&toml::Value>| v.map_or("(unset)".to_string(), |v| v.to_string());
                    Some((format!("{path}.{k}"), show(x), show(y)))
                }
            })
        }
        _ if a == b => None,
        _ => Some((path.to_string(), a.to_string(), b.to_string())),
    }
}

/// Writes `config.json`, `model.safetensors` and the tokenizer files into `dir`.
fn write_model(
    dir: &Path,
    run: &Run,
    json: &Map<String, Value>,
    mapping: &Mapping,
    rotary: Option<&RotaryPairs>,
    added: &[(usize, &str)],
    mask_token: Option<usize>,
) -> Result<(usize, usize)> {
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(json)? + "\n")?;
    // the model's tensors by name
    let mut ours: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    for tensor in run.model.collect(None, None, true) {
        let data = burn::store::bridge::to_data(&tensor).map_err(|e| anyhow!("cannot read {}: {e:?}", tensor.name))?;
        let values = data.convert::<f32>().try_to_vec::<f32>().map_err(|e| anyhow!("{}: {e:?}", tensor.name))?;
        ours.insert(tensor.name.clone(), (tensor.shape.to_vec(), values));
    }
    let mut tensors = Vec::new();
    for (name, recipe) in &mapping.tensors {
        let (shape, mut values) =
            ours.remove(name).ok_or_else(|| anyhow!("the model has no tensor {name} (a bug of the mapping)"))?;
        let fused = name.ends_with(".attn.qkv.qkv.weight") || name.ends_with(".attn.qkv.qkv.bias");
        if let Some(r) = rotary.filter(|_| fused) {
            values = rotate_half_order(&values, r)?;
        }
        recipe.invert(values, &shape, &mut tensors)?;
    }
    if let Some(left) = ours.keys().next() {
        bail!("the {} mapping has no place for {left} (a bug of the mapping)", mapping.class);
    }
    let tensors = one_per_name(tensors)?;
    let params: usize = tensors.iter().map(|(_, _, v)| v.len()).sum();
    let count = tensors.len();
    write_safetensors(&dir.join("model.safetensors"), tensors)?;

    let mut tokenizer = run.tokenizer.to_hf_json()?;
    if !added.is_empty() {
        let mut json: Value = serde_json::from_str(&tokenizer)?;
        for &(id, content) in added {
            let token = serde_json::json!({
                "id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": true
            });
            match json["added_tokens"].as_array_mut() {
                Some(tokens) => tokens.push(token),
                None => json["added_tokens"] = Value::Array(vec![token]),
            }
        }
        tokenizer = serde_json::to_string_pretty(&json)?;
    }
    std::fs::write(dir.join("tokenizer.json"), &tokenizer)?;
    // an imported run's own files; for a tokenizer made here, the class that reads tokenizer.json
    let mut copied_config = false;
    for extra in ["tokenizer_config.json", "special_tokens_map.json", "generation_config.json"] {
        if run.dir.join(extra).is_file() {
            std::fs::copy(run.dir.join(extra), dir.join(extra))?;
            copied_config |= extra == "tokenizer_config.json";
        }
    }
    if !copied_config {
        let mut config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": run.config.model.seq_len,
            "clean_up_tokenization_spaces": false,
        });
        // the mask token by name (`tokenizer.mask_token_id` reads it): the added row's, or the
        // vocabulary's own (a tokenizer imported and fine-tuned here)
        let named = |id: usize| -> Option<Value> {
            let json: Value = serde_json::from_str(&tokenizer).ok()?;
            let added = json["added_tokens"].as_array()?.iter().find(|t| t["id"].as_u64() == Some(id as u64))?;
            Some(added["content"].clone())
        };
        // the end token (`tokenizer.eos_token_id`), which T5 also pads with
        if added.iter().any(|&(_, t)| t == END) {
            config["eos_token"] = END.into();
            config["pad_token"] = END.into();
        }
        let added_mask = added.iter().any(|&(_, t)| t == MASK);
        match (added_mask, mask_token) {
            (true, _) => config["mask_token"] = MASK.into(),
            (false, Some(id)) => {
                config["mask_token"] = named(id).ok_or_else(|| {
                    anyhow!(
                        "the mask token {id} is not among the tokenizer's added tokens: transformers could not name it"
                    )
                })?
            }
            (false, None) => {}
        }
        std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&config)? + "\n")?;
    }
    Ok((count, params))
}

/// `tensors` (name, shape, values) as an f32 safetensors file, with the metadata transformers
/// reads (`format = pt`).
pub(super) fn write_safetensors(path: &Path, tensors: Vec<(String, Vec<usize>, Vec<f32>)>) -> Result<()> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.into_iter().map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let views = bytes
        .iter()
        .map(|(n, s, b)| Ok((n.as_str(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)?)))
        .collect::<Result<Vec<_>>>()?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path)
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))
}

/// The checkpoint's tensors with each name once: a tensor several of the run's are made from
/// (T5's relative bias table, which every layer of a stack reads) is written once, if they
/// agree; if they have parted (fine-tuning moves each layer's copy), the run is refused.
fn one_per_name(tensors: Vec<(String, Vec<usize>, Vec<f32>)>) -> Result<Vec<(String, Vec<usize>, Vec<f32>)>> {
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::with_capacity(tensors.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (name, shape, values) in tensors {
        match seen.get(&name) {
            None => {
                seen.insert(name.clone(), out.len());
                out.push((name, shape, values));
            }
            Some(&i) if out[i].1 == shape && out[i].2 == values => {}
            Some(_) => bail!(
                "{name} is one tensor in the exported architecture, read by several layers, but this run's copies differ (each layer's trained apart): it has no exact export (train with model.position.shared = true, or fine-tune with train.freeze.positions = true)"
            ),
        }
    }
    Ok(out)
}

/// A fused q | k | v projection (weight `[d, w]` row-major, or bias `[w]`) with the rotated
/// query and key features of every head reordered from interleaved pairs `(2k, 2k+1)` to
/// rotate-half pairs `(k, k + r/2)`, `r` the rotated part: feature `k` of the result is feature
/// `2k` of the input and feature `k + r/2` is `2k + 1`. Values are left alone.
pub(super) fn rotate_half_order(values: &[f32], r: &RotaryPairs) -> Result<Vec<f32>> {
    let (hd, rot) = (r.head_dim, r.rotary_dim);
    if hd == 0 || rot % 2 != 0 || rot > hd || r.qk_features % hd != 0 || r.width == 0 || values.len() % r.width != 0 {
        bail!("rotary features ({rot} of each head's {hd}) cannot be paired in a projection {} wide", r.width);
    }
    let half = rot / 2;
    let mut out = values.to_vec();
    for (dst, src) in out.chunks_mut(r.width).zip(values.chunks(r.width)) {
        for head in 0..r.qk_features / hd {
            let base = head * hd;
            for j in 0..half {
                dst[base + j] = src[base + 2 * j];
                dst[base + half + j] = src[base + 2 * j + 1];
            }
        }
    }
    Ok(out)
}
