//! Hugging Face models in: [`import`] reads a model directory as transformers'
//! `save_pretrained` writes it (`config.json`, `model.safetensors` or its shards and index,
//! `tokenizer.json`) and writes an ordinary run directory (`config.toml`, `tokenizer.json`,
//! `model.bpk`), on which every command works.
//!
//! One file per architecture says what its `config.json` is in variorum's kinds (a `[model]`
//! table a config file could hold, so the same recipe trains from scratch) and where each of
//! variorum's tensors comes from (`recipe.rs`). Keys of `config.json` no mapping reads
//! and tensors no mapping uses stop the import, naming them: nothing is silently dropped.

mod bert;
mod big_bird;
mod bloom;
mod checkpoint;
mod config;
mod deberta_v2;
mod decision_transformer;
mod export;
mod gpt2;
mod gpt_neox;
mod gptj;
mod llama;
mod opt;
mod peft;
mod phi;
mod recipe;
mod reformer;
mod t5;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use burn::prelude::*;
use burn::store::ModuleSnapshot;
use burn::store::burn_pack::Error as PackError;
use variorum_data::Tokenizer;

use crate::config::ExperimentConfig;
use checkpoint::Checkpoint;
use config::HfConfig;
use recipe::Recipe;

pub use decision_transformer::import_decision_transformer;
pub use export::{Exported, export, export_with};
pub use peft::{ImportedAdapters, import as import_adapters};

/// An architecture's reading of a model directory.
pub(crate) struct Mapping {
    /// The transformers class the mapping reproduces (`GPT2LMHeadModel`).
    class: &'static str,
    /// The `[model]` table.
    model: toml::Value,
    /// Every tensor of the variorum model and how it is made.
    tensors: Vec<(String, Recipe)>,
    /// Checkpoint tensors that are not weights of their own (stored buffers, a tied head): not
    /// used, and not an error.
    derived: fn(&str) -> bool,
}

/// The `model_type`s [`import`] reads and the file that maps each.
const ARCHITECTURES: &[(&str, fn(&mut HfConfig, &Checkpoint) -> Result<Mapping>)] = &[
    ("gpt2", gpt2::map),
    ("llama", llama::map),
    ("mistral", llama::map),
    ("qwen2", llama::map),
    ("opt", opt::map),
    ("gpt_neox", gpt_neox::map),
    ("gptj", gptj::map),
    ("phi", phi::map),
    ("bloom", bloom::map),
    ("bert", bert::map),
    ("roberta", bert::map),
    ("fnet", bert::map),
    ("nystromformer", bert::map),
    ("longformer", bert::map),
    ("big_bird", bert::map),
    ("deberta-v2", deberta_v2::map),
    ("reformer", reformer::map),
    ("t5", t5::map),
];

/// What [`import`] wrote.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The run directory.
    pub out: PathBuf,
    /// The transformers class reproduced (`LlamaForCausalLM`).
    pub class: &'static str,
    /// Tensors written.
    pub tensors: usize,
    /// Parameters.
    pub params: usize,
}

/// Reads the Hugging Face model directory `src` and writes the run directory `out`, which must
/// not exist. The run is written beside `out` under a temporary name and renamed into place
/// when complete, so a failed import leaves nothing behind. The weights are converted on
/// `device` (any: they are only copied).
pub fn import(src: &Path, out: &Path, device: &Device) -> Result<Imported> {
    if out.exists() {
        bail!("{} exists: give --out a directory that does not exist yet", out.display());
    }
    if !src.is_dir() {
        bail!(
            "{} is not a directory: give a Hugging Face model directory (config.json, model.safetensors, tokenizer.json)",
            src.display()
        );
    }
    let mut hf = HfConfig::load(src)?;
    let model_type = hf.model_type()?;
    let Some((_, map)) = ARCHITECTURES.iter().find(|(t, _)| *t == model_type) else {
        let known: Vec<&str> = ARCHITECTURES.iter().map(|(t, _)| *t).collect();
        bail!(
            "{}: model_type = {model_type:?} is not supported; variorum imports {}",
            hf.path().display(),
            known.join(", ")
        );
    };
    let ckpt = std::sync::Arc::new(Checkpoint::open(src)?);
    let mapping = map(&mut hf, &ckpt)?;
    hf.finish(mapping.class)?;

    let tokenizer_path = src.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        bail!(
            "{} not found: variorum reads the tokenizers-format file that transformers' fast tokenizers save",
            tokenizer_path.display()
        );
    }
    let tokenizer = Tokenizer::load(&tokenizer_path)?;

    let config_text = config_toml(src, out, &mapping, tokenizer.vocab_size())?;
    let staging = staging_dir(out, "importing")?;
    let result = write_run(&staging, &config_text, &tokenizer_path, src, &ckpt, &mapping, device);
    match result {
        Ok((tensors, params)) => {
            std::fs::rename(&staging, out)
                .with_context(|| format!("cannot move {} to {}", staging.display(), out.display()))?;
            Ok(Imported { out: out.to_path_buf(), class: mapping.class, tensors, params })
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// `out`'s sibling `.out.{what}`, created empty (one left over from a killed import or export
/// is removed).
fn staging_dir(out: &Path, what: &str) -> Result<PathBuf> {
    let name = out.file_name().ok_or_else(|| anyhow!("--out {} names no directory", out.display()))?;
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let staging = parent.join(format!(".{}.{what}", name.to_string_lossy()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| format!("cannot remove {}", staging.display()))?;
    }
    std::fs::create_dir(&staging).with_context(|| format!("cannot create {}", staging.display()))?;
    Ok(staging)
}

/// The run's `config.toml`: where it came from, the `[model]` table, and a `[data]` section
/// whose tokenizer is the run's `tokenizer.json` (`out` as given, so relative to the current
/// directory as `data.path` is).
fn config_toml(src: &Path, out: &Path, mapping: &Mapping, tokenizer_vocab: usize) -> Result<String> {
    // under a root table, so that its sub-tables (and arrays of tables) come out as [model.…]
    let model = toml::to_string(&table([("model", mapping.model.clone())]))?;
    let vocab = mapping.model.get("vocab_size").and_then(toml::Value::as_integer).unwrap_or(0);
    if (vocab as usize) < tokenizer_vocab {
        bail!(
            "{}: the tokenizer has {tokenizer_vocab} tokens but the embedding {vocab} rows: they do not belong together",
            src.join("tokenizer.json").display()
        );
    }
    // an encoder–decoder reads pairs: a file the user names (a decoder reads a plain text)
    let encoder_decoder = mapping.model.get("kind").and_then(toml::Value::as_str) == Some("encoder-decoder");
    let data = match encoder_decoder {
        true => {
            "# an encoder–decoder reads source<TAB>target lines: data.path = \"your-pairs.tsv\"\n\
                 path = \"pairs.tsv\"\npairs = {}\n"
        }
        false => "dataset = \"shakespeare\"\n",
    };
    Ok(format!(
        "# Imported from {} ({}) by `variorum import`.\n\
         # The run's tokenizer.json is the model's own; [data] is what eval and fine-tuning read\n\
         # (a file of your own: data.path = \"…\").\n\n\
         {model}\n\
         [data]\n{data}tokenizer = {{ kind = \"file\", path = {tokenizer} }}\n",
        src.display(),
        mapping.class,
        tokenizer = toml::Value::String(out.join("tokenizer.json").display().to_string()),
    ))
}

/// Writes the run into `dir`: config, tokenizer, weights. Returns tensors and parameters.
fn write_run(
    dir: &Path,
    config_text: &str,
    tokenizer: &Path,
    src: &Path,
    ckpt: &std::sync::Arc<Checkpoint>,
    mapping: &Mapping,
    device: &Device,
) -> Result<(usize, usize)> {
    let config_path = dir.join("config.toml");
    std::fs::write(&config_path, config_text)?;
    let config = ExperimentConfig::load(&config_path)
        .map_err(|e| anyhow!("{} describes a model variorum refuses: {e}", src.join("config.json").display()))?;
    std::fs::copy(tokenizer, dir.join("tokenizer.json"))?;
    for extra in ["tokenizer_config.json", "special_tokens_map.json", "generation_config.json"] {
        if src.join(extra).is_file() {
            std::fs::copy(src.join(extra), dir.join(extra))?;
        }
    }

    // The model's tensors: names without enum variants (as the mappings write them) and with
    // them (as its burnpack file names them; one traversal, so the two lists are in the same
    // order), shapes and parameter ids. The model itself is not kept: the file is written
    // straight from the checkpoint, one tensor at a time, so an import holds about one copy of
    // the weights at most (docs/interop.md measures it).
    let (wanted, params) = {
        let model = config.model.init(device);
        let short = model.collect(None, None, true);
        let full = model.collect(None, None, false);
        if short.len() != full.len() {
            bail!("the model lists {} tensors by one naming and {} by the other (a bug)", short.len(), full.len());
        }
        let wanted: Vec<(String, String, Vec<usize>, Option<u64>)> = short
            .into_iter()
            .zip(full)
            .map(|(s, f)| (s.name.clone(), f.name.clone(), s.shape.to_vec(), s.param_id))
            .collect();
        (wanted, model.num_params())
    };
    let mut pack = Vec::with_capacity(wanted.len());
    for (name, file_name, shape, id) in &wanted {
        let recipe = mapping.tensors.iter().find(|(n, _)| n == name).map(|(_, r)| r).ok_or_else(|| {
            anyhow!("the {} mapping gives no tensor for {name} (a bug of the mapping)", mapping.class)
        })?;
        let got = recipe.shape(ckpt).map_err(|e| anyhow!("{}: {e}", src.display()))?;
        if &got != shape {
            bail!("{}: {recipe:?} has the shape {got:?}, but config.json implies {shape:?} for {name}", src.display());
        }
        // made when the writer reaches it: one tensor's values held at a time
        let (recipe, from, dims) = (recipe.clone(), std::sync::Arc::clone(ckpt), shape.clone());
        pack.push(burn::store::bridge::deferred(
            file_name.clone(),
            burn::tensor::DType::F32,
            Shape::from(shape.clone()),
            *id,
            move || {
                let values = recipe.values(&from).map_err(|e| PackError::ValidationError(format!("{e:#}")))?;
                Ok(TensorData::new(values, dims.clone()))
            },
        ));
    }
    let unused: Vec<String> = ckpt.unused().into_iter().filter(|n| !(mapping.derived)(n)).collect();
    if let Some(first) = unused.first() {
        bail!(
            "{}: {} tensor(s) of the checkpoint have no place in a {} (first: {first})",
            src.display(),
            unused.len(),
            mapping.class
        );
    }
    let weights = dir.join("model.bpk");
    burn::store::burn_pack::Writer::new(pack)
        .write_to_file(&weights)
        .map_err(|e| anyhow!("cannot write {}: {e}", weights.display()))?;
    // the file loads into the model as any run's does (names, shapes, nothing missing or left)
    crate::weights::load_weights(config.model.init(device), &weights, "imported weights")?;
    Ok((wanted.len(), params))
}

/// The `[model]` keys every architecture sets.
struct Sizes {
    vocab: usize,
    d: usize,
    layers: usize,
    seq_len: usize,
    dropout: f64,
    tied: bool,
}

impl Sizes {
    /// The `[model]` table: these keys, then `rest` (position, attention, block, …).
    fn model<'a>(self, rest: impl IntoIterator<Item = (&'a str, toml::Value)>) -> toml::Value {
        let mut pairs = vec![
            ("vocab_size", int(self.vocab)),
            ("d_model", int(self.d)),
            ("n_layers", int(self.layers)),
            ("seq_len", int(self.seq_len)),
            ("dropout", self.dropout.into()),
            ("tie_embeddings", self.tied.into()),
        ];
        pairs.extend(rest);
        table(pairs)
    }
}

/// `model.position` for rotary positions of base `theta` and pairing `layout`, on the first
/// `rotary_dim` of each head's `head_dim` dimensions.
fn rotary(theta: f64, layout: &str, rotary_dim: usize, head_dim: usize) -> toml::Value {
    let mut position = vec![("kind", "rope".into()), ("base", theta.into()), ("layout", layout.into())];
    if rotary_dim < head_dim {
        position.push(("rotary_dim", int(rotary_dim)));
    }
    table(position)
}

/// transformers' name of a two-layer FFN's activation for variorum's feed-forward `kind`
/// (`own`, the architecture's default, for any other: the export's check then tells it apart).
fn hf_activation(kind: Option<&str>, own: &'static str) -> &'static str {
    match kind {
        Some("gelu-tanh") => "gelu_new",
        Some("gelu") => "gelu",
        Some("relu") => "relu",
        _ => own,
    }
}

/// `[(key, value), …]` as a TOML table.
fn table<'a>(pairs: impl IntoIterator<Item = (&'a str, toml::Value)>) -> toml::Value {
    toml::Value::Table(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// An integer for a TOML table.
fn int(n: usize) -> toml::Value {
    toml::Value::Integer(n as i64)
}
